"""Carrier addresses: ``DatagramAddr``.

Why opaque: Chrysalis routes by PID; a carrier address is only the next hop and never part of
an identity. Each carrier (UDP, Unix datagram, in-process, switch) needs its own coordinates,
and addresses travel inside nameserver records, so the type is a plain pair ``(scheme,
opaque bytes)`` with a fixed binary encoding per known scheme:

=========  ==========================================================================  =====
scheme     opaque bytes                                                                total
=========  ==========================================================================  =====
udp (v4)   ``0x04``, IPv4 (4), port u16 BE                                             7
udp (v6)   ``0x06``, IPv6 (16), port u16 BE, flowinfo u32 BE, scope id u32 BE          27
unixgram   the socket path bytes, no terminator (abstract names start with NUL)        var
inproc     network id u64 BE, endpoint id u64 BE                                       16
switch     switch id u64 BE, destination PID (16)                                      24
=========  ==========================================================================  =====

Unknown schemes are carried verbatim, so a process can store and forward addresses of carriers
it does not implement. Known-scheme encodings are validated at construction, so the accessors
of a well-typed address never fail.

Text form (``str`` and ``DatagramAddr.parse``, inverse of each other for every address)::

    udp://127.0.0.1:4433   udp://[::1]:4433   udp://[fe80::1%3]:4433?flowinfo=5
    unixgram:///run/x.sock   unixgram://@abstract   (``unix://`` accepted as an alias)
    inproc://<network>/<endpoint>   switch://<switch id>/<32 hex pid>   other://<hex>

Path bytes are percent-encoded outside ``[A-Za-z0-9_.~/:+,=-]``; a leading ``@`` stands for the
NUL of an abstract name. Because ``unix://`` parses as ``unixgram``, ``unix`` is not accepted as a
scheme of its own. Text is printable ASCII without spaces and bounded in length. This module is
pure: it never resolves names or touches sockets (IP literals only).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Any, ClassVar, NoReturn, final
from urllib.parse import quote, unquote_to_bytes

from chrysalis.core._errors import AddressError, quote_input
from chrysalis.core._pid import PID_LEN, Pid

__all__ = [
    "INPROC_SCHEME",
    "SWITCH_SCHEME",
    "UDP_SCHEME",
    "UNIXGRAM_SCHEME",
    "DatagramAddr",
]

UDP_SCHEME = "udp"
"""Scheme of UDP carrier addresses."""
UNIXGRAM_SCHEME = "unixgram"
"""Scheme of Unix datagram socket addresses."""
INPROC_SCHEME = "inproc"
"""Scheme of in-process carrier addresses."""
SWITCH_SCHEME = "switch"
"""Scheme of datagram-switch binding addresses."""

_UNIX_ALIAS = "unix"
_MAX_SCHEME_LEN = 32
_MAX_OPAQUE_LEN = 4096
# Worst case text: every opaque byte percent-encoded (3 chars each) plus scheme and punctuation.
_MAX_TEXT_LEN = _MAX_SCHEME_LEN + 3 + 3 * _MAX_OPAQUE_LEN + 1

_UDP4_TAG = 0x04
_UDP6_TAG = 0x06
_UDP4_LEN = 7
_UDP6_LEN = 27
_INPROC_LEN = 16
_SWITCH_LEN = 8 + PID_LEN
_U16 = 1 << 16
_U32 = 1 << 32
_U64 = 1 << 64

_SCHEME_RE = re.compile(r"[a-z][a-z0-9+.\-]*")
_PRINTABLE_RE = re.compile(r"[!-~]*")
_UDP4_TEXT_RE = re.compile(r"([0-9.]{7,15}):([0-9]{1,5})")
_UDP6_TEXT_RE = re.compile(
    r"\[([0-9A-Fa-f:.]{2,45})(?:%([0-9]{1,10}))?\]:([0-9]{1,5})(?:\?flowinfo=([0-9]{1,10}))?"
)
_INPROC_TEXT_RE = re.compile(r"([0-9]{1,20})/([0-9]{1,20})")
_SWITCH_TEXT_RE = re.compile(r"([0-9]{1,20})/([0-9A-Fa-f]{32})")
_HEX_TEXT_RE = re.compile(r"(?:[0-9A-Fa-f]{2})*")
_PATH_TEXT_RE = re.compile(r"(?:[!-$&-~]|%[0-9A-Fa-f]{2})*")
_PATH_SAFE = "/:+,="

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _uint(value: object, limit: int, what: str) -> int:
    """Check ``value`` is an int in ``0 .. limit - 1`` (``TypeError`` / ``AddressError``)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value < limit:
        raise AddressError(f"{what} must be in 0..{limit - 1}, got {value}")
    return value


def _check_scheme(scheme: object) -> str:
    if not isinstance(scheme, str):
        raise TypeError(f"DatagramAddr scheme must be a str, not {type(scheme).__name__}")
    if len(scheme) > _MAX_SCHEME_LEN or _SCHEME_RE.fullmatch(scheme) is None:
        raise AddressError(
            f"invalid address scheme {quote_input(scheme)}: expected lowercase "
            f"[a-z][a-z0-9+.-]*, at most {_MAX_SCHEME_LEN} characters"
        )
    return scheme


def _check_opaque(scheme: str, opaque: bytes) -> None:
    """Validate the encoding of a known scheme (unknown schemes carry any bytes)."""
    n = len(opaque)
    if n > _MAX_OPAQUE_LEN:
        raise AddressError(f"{scheme} address is {n} bytes, at most {_MAX_OPAQUE_LEN} allowed")
    if scheme == UDP_SCHEME:
        tag = opaque[0] if n else None
        if not ((tag == _UDP4_TAG and n == _UDP4_LEN) or (tag == _UDP6_TAG and n == _UDP6_LEN)):
            raise AddressError(
                f"invalid udp address encoding (tag {tag}, {n} bytes): expected tag 4 with "
                f"{_UDP4_LEN} bytes or tag 6 with {_UDP6_LEN} bytes"
            )
    elif scheme == INPROC_SCHEME:
        if n != _INPROC_LEN:
            raise AddressError(f"inproc address needs {_INPROC_LEN} bytes, got {n}")
    elif scheme == SWITCH_SCHEME and n != _SWITCH_LEN:
        raise AddressError(f"switch address needs {_SWITCH_LEN} bytes, got {n}")


@functools.lru_cache(maxsize=1024, typed=True)
def _udp_opaque(host: str | _IPAddress, port: int, flowinfo: int, scope_id: int) -> bytes:
    """Encode a UDP endpoint (cached: carriers convert the same peer addresses repeatedly)."""
    port = _uint(port, _U16, "udp port")
    flowinfo = _uint(flowinfo, _U32, "udp flowinfo")
    scope_id = _uint(scope_id, _U32, "udp scope id")
    if isinstance(host, ipaddress.IPv4Address | ipaddress.IPv6Address):
        host = str(host)  # an IPv6Address may carry a zone; handle it like text
    if isinstance(host, str):
        literal, percent, zone = host.partition("%")
        if percent:
            if not (zone.isascii() and zone.isdigit()):
                raise AddressError(
                    f"udp host {quote_input(host)}: only numeric IPv6 zones are supported"
                )
            zone_id = _uint(int(zone), _U32, "udp scope id")
            if scope_id not in (0, zone_id):
                raise AddressError(f"udp host zone %{zone} conflicts with scope_id {scope_id}")
            scope_id = zone_id
        try:
            ip: _IPAddress = ipaddress.ip_address(literal)
        except ValueError:
            raise AddressError(
                f"udp host {quote_input(host)} is not an IPv4 or IPv6 literal "
                "(chrysalis.core does not resolve names)"
            ) from None
        if percent and ip.version != 6:
            raise AddressError(f"udp host {quote_input(host)}: a zone needs an IPv6 address")
    else:
        raise TypeError(f"udp host must be a str or ip address, not {type(host).__name__}")
    port_bytes = port.to_bytes(2, "big")
    if ip.version == 4:
        if flowinfo or scope_id:
            raise AddressError("IPv4 udp addresses have no flowinfo or scope id")
        return bytes((_UDP4_TAG,)) + ip.packed + port_bytes
    return (
        bytes((_UDP6_TAG,))
        + ip.packed
        + port_bytes
        + flowinfo.to_bytes(4, "big")
        + scope_id.to_bytes(4, "big")
    )


def _encode_path(path: bytes) -> str:
    if path[:1] == b"\0":
        return "@" + quote(path[1:], safe=_PATH_SAFE)
    return quote(path, safe=_PATH_SAFE)


@final
class DatagramAddr:
    """A carrier address: ``(scheme, opaque bytes)``, a next hop, never an identity.

    ``DatagramAddr(scheme, opaque)`` validates: ``scheme`` matches lowercase
    ``[a-z][a-z0-9+.-]*`` with at most ``MAX_SCHEME_LEN`` characters; ``opaque`` has at most
    ``MAX_OPAQUE_LEN`` bytes; known schemes (udp, inproc, switch) have their exact encoding;
    ``unix`` is reserved (it is the text alias of ``unixgram``).
    Violations raise ``AddressError`` (``TypeError`` for wrong types). Equality and hashing
    cover both fields; ordering is by ``(scheme, opaque)``. Immutable and picklable.
    Scheme-specific accessors raise ``AddressError`` on an address of another scheme.
    """

    __slots__ = ("_hash", "_opaque", "_scheme")
    _scheme: str
    _opaque: bytes
    _hash: int

    MAX_SCHEME_LEN: ClassVar[int] = _MAX_SCHEME_LEN
    MAX_OPAQUE_LEN: ClassVar[int] = _MAX_OPAQUE_LEN

    def __new__(cls, scheme: str, opaque: bytes | bytearray | memoryview) -> DatagramAddr:
        scheme = _check_scheme(scheme)
        if scheme == _UNIX_ALIAS:
            raise AddressError(
                "scheme 'unix' is reserved as the text alias of 'unixgram'; use 'unixgram'"
            )
        if type(opaque) is not bytes:
            if not isinstance(opaque, bytes | bytearray | memoryview):
                raise TypeError(
                    f"DatagramAddr opaque must be bytes-like, not {type(opaque).__name__}"
                )
            opaque = bytes(opaque)
        _check_opaque(scheme, opaque)
        return cls._from_trusted(scheme, opaque)

    @classmethod
    def _from_trusted(cls, scheme: str, opaque: bytes) -> DatagramAddr:
        self = object.__new__(cls)
        _set_scheme(self, scheme)
        _set_opaque(self, opaque)
        _set_hash(self, hash((scheme, opaque)))
        return self

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def udp(
        cls, host: str | _IPAddress, port: int, flowinfo: int = 0, scope_id: int = 0
    ) -> DatagramAddr:
        """A UDP address from an IPv4/IPv6 literal (or ``ipaddress`` object) and a port.

        An IPv6 literal may carry a numeric zone (``fe80::1%3``), which sets ``scope_id``.
        IPv4 addresses must have zero ``flowinfo`` and ``scope_id``. Names are not resolved.
        """
        return cls._from_trusted(UDP_SCHEME, _udp_opaque(host, port, flowinfo, scope_id))

    @classmethod
    def from_sockaddr(cls, sockaddr: tuple[str, int] | tuple[str, int, int, int]) -> DatagramAddr:
        """A UDP address from a Python ``AF_INET`` ``(host, port)`` or ``AF_INET6``
        ``(host, port, flowinfo, scope_id)`` tuple (as returned by ``recvfrom``).

        A textual zone on the host (``fe80::1%eth0`` style) is dropped in favour of the
        tuple's numeric ``scope_id``.
        """
        if not isinstance(sockaddr, tuple) or len(sockaddr) not in (2, 4):
            raise AddressError(
                f"expected a (host, port) or (host, port, flowinfo, scope_id) tuple, "
                f"got {quote_input(repr(sockaddr))}"
            )
        if len(sockaddr) == 2:
            return cls.udp(sockaddr[0], sockaddr[1])
        host, port, flowinfo, scope_id = sockaddr
        if isinstance(host, str) and "%" in host:
            host = host.partition("%")[0]
        return cls.udp(host, port, flowinfo, scope_id)

    @classmethod
    def unixgram(cls, path: str | bytes) -> DatagramAddr:
        """A Unix datagram socket address. ``str`` paths are encoded as UTF-8 with
        ``surrogateescape`` (the inverse of how Python decodes them); abstract names start
        with a NUL byte (``b"\\0name"`` or ``"\\0name"``).
        """
        if isinstance(path, str):
            raw = path.encode("utf-8", "surrogateescape")
        elif isinstance(path, bytes | bytearray | memoryview):
            raw = bytes(path)
        else:
            raise TypeError(f"unixgram path must be str or bytes, not {type(path).__name__}")
        return cls(UNIXGRAM_SCHEME, raw)

    @classmethod
    def inproc(cls, network_id: int, endpoint_id: int) -> DatagramAddr:
        """An in-process carrier address: two u64 (network id, endpoint id)."""
        network_id = _uint(network_id, _U64, "inproc network id")
        endpoint_id = _uint(endpoint_id, _U64, "inproc endpoint id")
        return cls._from_trusted(
            INPROC_SCHEME, network_id.to_bytes(8, "big") + endpoint_id.to_bytes(8, "big")
        )

    @classmethod
    def switch(cls, switch_id: int, pid: Pid) -> DatagramAddr:
        """A datagram-switch binding address: u64 switch id and the bound PID."""
        switch_id = _uint(switch_id, _U64, "switch id")
        if not isinstance(pid, Pid):
            raise TypeError(f"switch address needs a Pid, not {type(pid).__name__}")
        return cls._from_trusted(SWITCH_SCHEME, switch_id.to_bytes(8, "big") + pid.raw)

    @classmethod
    def parse(cls, text: str) -> DatagramAddr:
        """Parse the text form produced by ``str(addr)`` (see the module docs).

        Also accepts ``unix://`` for ``unixgram://`` and either hex case. Raises
        ``AddressError`` for anything else, ``TypeError`` for a non-str.
        """
        if not isinstance(text, str):
            raise TypeError(f"DatagramAddr.parse needs a str, not {type(text).__name__}")
        if len(text) > _MAX_TEXT_LEN:
            raise AddressError(
                f"address text is {len(text)} characters, at most {_MAX_TEXT_LEN} allowed"
            )
        if not text.isascii() or _PRINTABLE_RE.fullmatch(text) is None:
            raise AddressError(
                f"address text {quote_input(text)} must be printable ASCII without spaces"
            )
        scheme, sep, rest = text.partition("://")
        if not sep:
            raise AddressError(f"address text {quote_input(text)} has no 'scheme://'")
        scheme = _check_scheme(scheme)
        if scheme == UDP_SCHEME:
            return cls._parse_udp(text, rest)
        if scheme in (UNIXGRAM_SCHEME, _UNIX_ALIAS):
            if _PATH_TEXT_RE.fullmatch(rest) is None:
                _bad(text, "malformed percent-escape in path")
            if rest[:1] == "@":
                return cls(UNIXGRAM_SCHEME, b"\0" + unquote_to_bytes(rest[1:]))
            return cls(UNIXGRAM_SCHEME, unquote_to_bytes(rest))
        if scheme == INPROC_SCHEME:
            m = _INPROC_TEXT_RE.fullmatch(rest)
            if m is None:
                _bad(text, "expected inproc://<network id>/<endpoint id> (decimal)")
            return cls.inproc(int(m[1]), int(m[2]))
        if scheme == SWITCH_SCHEME:
            m = _SWITCH_TEXT_RE.fullmatch(rest)
            if m is None:
                _bad(text, "expected switch://<switch id>/<32 hex digit pid>")
            return cls.switch(int(m[1]), Pid.parse(m[2]))
        if _HEX_TEXT_RE.fullmatch(rest) is None:
            _bad(text, f"expected hex digit pairs after '{scheme}://'")
        return cls(scheme, bytes.fromhex(rest))

    @classmethod
    def _parse_udp(cls, text: str, rest: str) -> DatagramAddr:
        m4 = _UDP4_TEXT_RE.fullmatch(rest)
        if m4 is not None:
            try:
                ip4 = ipaddress.IPv4Address(m4[1])
            except ValueError:
                _bad(text, "invalid IPv4 address")
            return cls.udp(ip4, int(m4[2]))
        m6 = _UDP6_TEXT_RE.fullmatch(rest)
        if m6 is None:
            _bad(text, "expected udp://<ipv4>:<port> or udp://[<ipv6>[%zone]]:<port>")
        try:
            ip6 = ipaddress.IPv6Address(m6[1])
        except ValueError:
            _bad(text, "invalid IPv6 address")
        zone = int(m6[2]) if m6[2] is not None else 0
        flowinfo = int(m6[4]) if m6[4] is not None else 0
        return cls.udp(ip6, int(m6[3]), flowinfo, zone)

    # -- generic accessors --------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        """The carrier scheme (``udp``, ``unixgram``, ``inproc``, ``switch`` or other)."""
        return self._scheme

    @property
    def opaque(self) -> bytes:
        """The scheme-specific encoded bytes."""
        return self._opaque

    # -- udp ----------------------------------------------------------------------------------

    def _require(self, scheme: str) -> bytes:
        if self._scheme != scheme:
            raise AddressError(f"{self} is not a {scheme} address")
        return self._opaque

    @property
    def ip(self) -> _IPAddress:
        """The IP address of a udp address."""
        raw = self._require(UDP_SCHEME)
        if raw[0] == _UDP4_TAG:
            return ipaddress.IPv4Address(raw[1:5])
        return ipaddress.IPv6Address(raw[1:17])

    @property
    def port(self) -> int:
        """The port of a udp address."""
        raw = self._require(UDP_SCHEME)
        offset = 5 if raw[0] == _UDP4_TAG else 17
        return int.from_bytes(raw[offset : offset + 2], "big")

    @property
    def flowinfo(self) -> int:
        """The IPv6 flow information of a udp address (0 for IPv4)."""
        raw = self._require(UDP_SCHEME)
        return int.from_bytes(raw[19:23], "big") if raw[0] == _UDP6_TAG else 0

    @property
    def scope_id(self) -> int:
        """The IPv6 scope id of a udp address (0 for IPv4)."""
        raw = self._require(UDP_SCHEME)
        return int.from_bytes(raw[23:27], "big") if raw[0] == _UDP6_TAG else 0

    def to_sockaddr(self) -> tuple[str, int] | tuple[str, int, int, int]:
        """The Python socket address tuple of a udp address: ``(host, port)`` for IPv4,
        ``(host, port, flowinfo, scope_id)`` for IPv6. ``AddressError`` for other schemes.
        """
        ip = self.ip
        if ip.version == 4:
            return (str(ip), self.port)
        return (str(ip), self.port, self.flowinfo, self.scope_id)

    # -- unixgram -----------------------------------------------------------------------------

    @property
    def is_abstract(self) -> bool:
        """True for a unixgram address in the Linux abstract namespace (leading NUL)."""
        return self._scheme == UNIXGRAM_SCHEME and self._opaque[:1] == b"\0"

    def to_unix_path(self) -> str | bytes:
        """The socket path of a unixgram address, as Python's socket module takes it.

        Abstract names are returned as ``bytes`` (leading NUL included); filesystem paths as
        ``str`` decoded with UTF-8 and ``surrogateescape`` (lossless).
        """
        raw = self._require(UNIXGRAM_SCHEME)
        if raw[:1] == b"\0":
            return raw
        return raw.decode("utf-8", "surrogateescape")

    # -- inproc -------------------------------------------------------------------------------

    @property
    def network_id(self) -> int:
        """The network id of an inproc address."""
        return int.from_bytes(self._require(INPROC_SCHEME)[:8], "big")

    @property
    def endpoint_id(self) -> int:
        """The endpoint id of an inproc address."""
        return int.from_bytes(self._require(INPROC_SCHEME)[8:], "big")

    # -- switch -------------------------------------------------------------------------------

    @property
    def switch_id(self) -> int:
        """The switch id of a switch address."""
        return int.from_bytes(self._require(SWITCH_SCHEME)[:8], "big")

    @property
    def switch_pid(self) -> Pid:
        """The bound PID of a switch address."""
        return Pid._from_trusted(self._require(SWITCH_SCHEME)[8:])

    # -- value behaviour ----------------------------------------------------------------------

    def __str__(self) -> str:
        scheme = self._scheme
        raw = self._opaque
        if scheme == UDP_SCHEME:
            if raw[0] == _UDP4_TAG:
                return f"udp://{self.ip}:{self.port}"
            scope = self.scope_id
            flowinfo = self.flowinfo
            zone = f"%{scope}" if scope else ""
            query = f"?flowinfo={flowinfo}" if flowinfo else ""
            return f"udp://[{self.ip}{zone}]:{self.port}{query}"
        if scheme == UNIXGRAM_SCHEME:
            return f"unixgram://{_encode_path(raw)}"
        if scheme == INPROC_SCHEME:
            return f"inproc://{self.network_id}/{self.endpoint_id}"
        if scheme == SWITCH_SCHEME:
            return f"switch://{self.switch_id}/{raw[8:].hex()}"
        return f"{scheme}://{raw.hex()}"

    def __repr__(self) -> str:
        return f"DatagramAddr.parse({str(self)!r})"

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other.__class__ is DatagramAddr:
            return self._opaque == other._opaque and self._scheme == other._scheme
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if other.__class__ is DatagramAddr:
            return self._opaque != other._opaque or self._scheme != other._scheme
        return NotImplemented

    def _key(self) -> tuple[str, bytes]:
        return (self._scheme, self._opaque)

    def __lt__(self, other: DatagramAddr) -> bool:
        if other.__class__ is DatagramAddr:
            return self._key() < other._key()
        return NotImplemented

    def __le__(self, other: DatagramAddr) -> bool:
        if other.__class__ is DatagramAddr:
            return self._key() <= other._key()
        return NotImplemented

    def __gt__(self, other: DatagramAddr) -> bool:
        if other.__class__ is DatagramAddr:
            return self._key() > other._key()
        return NotImplemented

    def __ge__(self, other: DatagramAddr) -> bool:
        if other.__class__ is DatagramAddr:
            return self._key() >= other._key()
        return NotImplemented

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("DatagramAddr is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("DatagramAddr is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (DatagramAddr, (self._scheme, self._opaque))

    def __copy__(self) -> DatagramAddr:
        return self

    def __deepcopy__(self, memo: object) -> DatagramAddr:
        return self


_set_scheme = DatagramAddr.__dict__["_scheme"].__set__
_set_opaque = DatagramAddr.__dict__["_opaque"].__set__
_set_hash = DatagramAddr.__dict__["_hash"].__set__


def _bad(text: str, reason: str) -> NoReturn:
    raise AddressError(f"invalid address {quote_input(text)}: {reason}")
