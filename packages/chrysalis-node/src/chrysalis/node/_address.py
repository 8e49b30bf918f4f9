"""Text forms the ``chrysalis`` command reads and prints (upper spec 6.4).

Why a module of its own: join tokens are what people copy between terminals and scripts, so
their grammar must be strict (one accepted spelling per meaning, a clear one-line error for
everything else) and testable without starting a process. Everything here is pure: it parses
and formats text, never resolves a host name and never touches a socket.

Grammar::

    carrier   = "udp://" IP ":" PORT | "udp://[" IPV6 "]:" PORT | "unix://" PATH
    listen    = carrier | "unix://*"            (a fresh socket in a private temp directory)
    token     = carrier [ "?authority=" 32 hex digits, not all zero ]
    reference = 1..32 hex digits                 (a PID or a unique PID prefix)

A bare ``host:port`` without a scheme, ``PID@address``, and any other query are rejected.
``unixgram://`` is accepted as a synonym of ``unix://``; addresses are printed as
``udp://ip:port`` and ``unix://path``.

The module also contributes the ``udp`` and ``unix`` address resolvers to
``chrysalis.core``'s plugin registry (the ``chrysalis_address_resolvers`` hook), so any program
can turn a join token into ``chrysalis.core.JoinSettings`` through the registry.

Cluster URLs (``slurm://JOBID``, ``k8s://NAMESPACE/SERVICE``, ...): any other scheme is handed to
the registry's resolver for it (``resolve_join_token``), which may name several *members* (the
nodes of a job): ``JoinSettings.address`` is the first one (the job's root, which ``join`` and
``ping`` use) and the ``members.N`` options list all of them as ``NAME=ADDRESS`` entries, comma
separated, in chunks of at most ``MAX_OPTION_VALUE_LENGTH`` characters (``member_options`` writes
them, ``join_members`` reads them back).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, final

from chrysalis.core import (
    UDP_SCHEME,
    UNIXGRAM_SCHEME,
    AddressError,
    AddressResolverSpec,
    DatagramAddr,
    JoinSettings,
    Pid,
    PidPrefix,
    PidPrefixError,
    hookimpl,
)
from chrysalis.core._plugin_types import MAX_JOIN_OPTIONS, MAX_OPTION_VALUE_LENGTH

__all__ = [
    "AUTO_UNIX",
    "MAX_TOKEN_LENGTH",
    "AddressSyntaxError",
    "JoinToken",
    "chrysalis_address_resolvers",
    "format_address",
    "join_members",
    "member_options",
    "parse_carrier",
    "parse_join_token",
    "parse_listen",
    "parse_pid_reference",
    "resolve_join_token",
]

MAX_TOKEN_LENGTH: Final = 4096
"""Longest accepted token, carrier or reference text (characters)."""
AUTO_UNIX: Final = "unix://*"
"""The ``--listen`` value asking for a fresh Unix socket in a private temporary directory."""

_AUTHORITY: Final = "authority="
_PID_HEX_LEN: Final = 32
_CARRIER_SCHEMES: Final = ("udp", "unix", "unixgram")


class AddressSyntaxError(ValueError):
    """A token, carrier address or PID reference is malformed; ``str`` says how, in one line."""


@final
@dataclass(frozen=True, slots=True)
class JoinToken:
    """A parsed join token: the parent's carrier ``address`` and, when pinned, the
    ``authority`` PID expected to answer there (``None``: discover, pin the first
    authenticated parent)."""

    address: DatagramAddr
    authority: Pid | None = None
    #: Every node a cluster URL resolved to, ``(name, address)``, the root first; empty for a
    #: plain join token.
    members: tuple[tuple[str, DatagramAddr], ...] = ()

    def __str__(self) -> str:
        text = format_address(self.address)
        return text if self.authority is None else f"{text}?{_AUTHORITY}{self.authority.hex()}"


def _shown(text: str) -> str:
    """``text`` quoted for an error message, cut to a readable length."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _check_text(text: object, what: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, not {type(text).__name__}")
    if not text:
        raise AddressSyntaxError(f"empty {what}")
    if len(text) > MAX_TOKEN_LENGTH:
        raise AddressSyntaxError(f"{what} is longer than {MAX_TOKEN_LENGTH} characters")
    return text


def parse_carrier(text: str) -> DatagramAddr:
    """A carrier address: ``udp://IP:PORT``, ``udp://[IPV6]:PORT`` or ``unix://PATH``.

    Host names are not resolved (IP literals only). ``AddressSyntaxError`` otherwise.
    """
    text = _check_text(text, "carrier address")
    scheme, sep, rest = text.partition("://")
    if not sep:
        if "@" in text:
            raise AddressSyntaxError(
                f"{_shown(text)}: 'PID@address' is not an address; use "
                "'udp://HOST:PORT?authority=PID'"
            )
        raise AddressSyntaxError(
            f"{_shown(text)} has no scheme: expected udp://HOST:PORT or unix:///PATH"
        )
    if scheme not in _CARRIER_SCHEMES:
        raise AddressSyntaxError(
            f"{_shown(text)}: unsupported carrier scheme {scheme!r} (expected udp or unix)"
        )
    if not rest:
        raise AddressSyntaxError(
            f"{_shown(text)}: missing {'host:port' if scheme == 'udp' else 'path'}"
        )
    if "?" in rest or "#" in rest:
        raise AddressSyntaxError(f"{_shown(text)}: a carrier address takes no query")
    try:
        return DatagramAddr.parse(text)
    except AddressError as exc:
        raise AddressSyntaxError(f"{_shown(text)}: {exc}") from exc


def parse_listen(text: str) -> DatagramAddr | None:
    """A ``--listen`` value: a carrier address, or ``None`` for ``unix://*`` (the caller
    creates a fresh socket in a private temporary directory)."""
    if text == AUTO_UNIX:
        return None
    return parse_carrier(text)


def parse_join_token(text: str) -> JoinToken:
    """``<carrier>[?authority=<32 hex digits>]`` as a :class:`JoinToken`.

    The query, when present, must be exactly one ``authority=`` with a full, non-zero PID.
    ``AddressSyntaxError`` for anything else (including ``host:port`` and ``PID@address``).
    """
    text = _check_text(text, "join token")
    carrier, sep, query = text.partition("?")
    address = parse_carrier(carrier)
    if not sep:
        return JoinToken(address)
    if not query.startswith(_AUTHORITY) or "&" in query:
        raise AddressSyntaxError(
            f"{_shown(text)}: the only query a join token takes is '?authority=<32 hex digit PID>'"
        )
    digits = query[len(_AUTHORITY) :]
    if len(digits) != _PID_HEX_LEN or not digits.isascii():
        raise AddressSyntaxError(
            f"{_shown(text)}: the authority must be exactly {_PID_HEX_LEN} hex digits, "
            f"got {len(digits)} characters"
        )
    try:
        authority = Pid.parse(digits)
    except ValueError as exc:
        raise AddressSyntaxError(f"{_shown(text)}: invalid authority PID: {exc}") from exc
    if authority == Pid.LINK_LOCAL:
        raise AddressSyntaxError(
            f"{_shown(text)}: the authority PID 0 is reserved (link-local), not a process"
        )
    return JoinToken(address, authority)


def parse_pid_reference(text: str) -> PidPrefix:
    """A PID or PID prefix: 1 to 32 hex digits (``AddressSyntaxError`` otherwise)."""
    text = _check_text(text, "PID or PID prefix")
    if "@" in text:
        raise AddressSyntaxError(
            f"{_shown(text)}: 'PID@address' references are not supported; pass the join token "
            "as its own argument"
        )
    try:
        return PidPrefix.parse(text)
    except (PidPrefixError, ValueError) as exc:
        raise AddressSyntaxError(f"{_shown(text)}: not a PID or PID prefix: {exc}") from exc


def format_address(address: DatagramAddr) -> str:
    """``udp://ip:port``, ``unix://path`` (the spelling tokens use), else the core text
    form."""
    text = str(address)
    if address.scheme == UNIXGRAM_SCHEME:
        return "unix://" + text[len(UNIXGRAM_SCHEME) + 3 :]
    return text


_MEMBERS: Final = "members."
_MEMBER_NAME: Final = re.compile(r"[A-Za-z0-9._:\-]{1,253}")


def member_options(members: Sequence[tuple[str, DatagramAddr]]) -> dict[str, str]:
    """The ``members.N`` join options listing ``members`` (``(name, address)``, root first).

    Names are 1 to 253 characters of ``[A-Za-z0-9._:-]``; ``ValueError`` for a bad name, an
    address holding a comma, or more members than ``JoinSettings`` options can hold.
    """
    entries = []
    for name, address in members:
        if _MEMBER_NAME.fullmatch(name) is None:
            raise ValueError(f"member name {_shown(name)} is not 1-253 of [A-Za-z0-9._:-]")
        text = format_address(address)
        if "," in text:
            raise ValueError(f"member address {_shown(text)} holds a comma")
        entries.append(f"{name}={text}")
    chunks: list[str] = []
    for entry in entries:
        if chunks and len(chunks[-1]) + 1 + len(entry) <= MAX_OPTION_VALUE_LENGTH:
            chunks[-1] += "," + entry
        else:
            chunks.append(entry)
    if len(chunks) > MAX_JOIN_OPTIONS:
        raise ValueError(f"{len(entries)} members do not fit in {MAX_JOIN_OPTIONS} join options")
    return {f"{_MEMBERS}{index}": chunk for index, chunk in enumerate(chunks)}


def join_members(settings: JoinSettings) -> tuple[tuple[str, DatagramAddr], ...]:
    """The members a resolver listed in ``settings`` (see ``member_options``), or the one
    address it names (``("", address)``) when it listed none. ``AddressSyntaxError`` for a
    malformed entry."""
    members: list[tuple[str, DatagramAddr]] = []
    for index in range(MAX_JOIN_OPTIONS):
        chunk = settings.options.get(f"{_MEMBERS}{index}")
        if chunk is None:
            break
        for entry in chunk.split(","):
            name, sep, text = entry.partition("=")
            if not sep or _MEMBER_NAME.fullmatch(name) is None:
                raise AddressSyntaxError(f"malformed member entry {_shown(entry)}")
            members.append((name, parse_carrier(text)))
    return tuple(members) if members else (("", settings.address),)


def resolve_join_token(text: str) -> JoinToken:
    """A join token (``parse_join_token``), or a URL of another scheme resolved by the plugin
    registry's resolver for it (``slurm://JOBID``, ...): the token joins the first member and
    lists all of them. ``AddressSyntaxError`` (one line) when no resolver serves the scheme or
    the resolver fails."""
    text = _check_text(text, "join token")
    scheme, sep, _ = text.partition("://")
    if not sep or scheme in _CARRIER_SCHEMES:
        return parse_join_token(text)
    from chrysalis.core import default_registry

    try:
        settings = default_registry().resolve_address(text)
    except (LookupError, ValueError, RuntimeError, OSError) as exc:
        raise AddressSyntaxError(f"{_shown(text)}: {exc}") from exc
    return JoinToken(settings.address, settings.authority, join_members(settings))


def _resolve(url: str) -> JoinSettings:
    token = parse_join_token(url)
    return JoinSettings(token.address, token.authority)


_RESOLVERS: Final = (
    AddressResolverSpec(UDP_SCHEME, _resolve, "udp://IP:PORT[?authority=PID] join tokens"),
    AddressResolverSpec("unix", _resolve, "unix:///PATH[?authority=PID] join tokens"),
)


@hookimpl
def chrysalis_address_resolvers() -> Sequence[AddressResolverSpec]:
    """The ``udp`` and ``unix`` join-token resolvers (``AddressSyntaxError``, a
    ``ValueError``, for a malformed token)."""
    return _RESOLVERS
