"""The host-session protocol ``monarch.host.v1`` between a client and a host's worker daemon.

Why sans-IO: both ends (``attach_session`` on the client, ``attach_daemon`` on the host) speak
it, and its bounds are what keeps a peer from costing the other unbounded memory or starting
arbitrary work; kept pure they are tested without a network. The session is a bidirectional
stream of length-prefixed msgpack messages (``Hello``, ``Spawn``, ``Exited``, ...; at most
``MAX_SESSION_FRAME`` bytes each). ``encode_message`` frames one; ``SessionDecoder`` reads them
back with the shared bounded decoder (``chrysalis.core.framing.LengthPrefixDecoder``: the
length prefix is refused before its body is buffered, and after any error the decoder stays
poisoned). ``spawn_problem`` checks a ``Spawn``'s options against their bounds.

Also here, shared by both ends: ``_Channel`` (the asyncio adapter over one stream), the
heartbeats, the ``ca=`` argument (``_ca_directory``) and worker addresses (``_udp_address``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
from pathlib import Path
from typing import Any, Final, NoReturn

import msgspec

from chrysalis.core.framing import FrameBufferFull, LengthPrefixDecoder
from chrysalis.quic import default_dev_ca_directory
from monarch.actor._hosts.commands import BootstrapCommand

__all__ = [
    "ATTACH_PROTOCOL",
    "ATTACH_TIMEOUT",
    "MAX_COMMAND_ARGS",
    "MAX_COMMAND_BYTES",
    "MAX_COMMAND_ENV",
    "MAX_HOSTS",
    "MAX_HOST_PROCS",
    "MAX_SESSION_FRAME",
    "PROTOCOL_VERSION",
    "Detach",
    "Exited",
    "Heartbeat",
    "Hello",
    "Kill",
    "KillProcs",
    "Message",
    "Refused",
    "SessionDecoder",
    "SessionProtocolError",
    "Shutdown",
    "Spawn",
    "SpawnFailed",
    "Spawned",
    "Welcome",
    "WorkerCommand",
    "encode_message",
    "spawn_problem",
]

#: The link-local protocol id of a host session (16 bytes).
ATTACH_PROTOCOL: Final = b"monarch.host.v1\0"
#: Version carried in ``Hello``; a daemon refuses any other.
PROTOCOL_VERSION: Final = 1
#: Largest encoded session message, in bytes.
MAX_SESSION_FRAME: Final = 1 << 20
#: Most hosts one ``attach_to_workers`` call attaches.
MAX_HOSTS: Final = 1024
#: Most workers one worker loop runs at once.
MAX_HOST_PROCS: Final = 4096
#: Most arguments of one worker's ``bootstrap_command``.
MAX_COMMAND_ARGS: Final = 256
#: Most environment changes of one worker's ``bootstrap_command``.
MAX_COMMAND_ENV: Final = 256
#: Most bytes (UTF-8) of one worker's ``bootstrap_command``: program, arg0, args, env.
MAX_COMMAND_BYTES: Final = 64 * 1024
#: The numactl options a ``Spawn`` may carry (``--KEY=VALUE``, one per ``proc_bind`` key).
_NUMACTL_OPTION: Final = re.compile(
    r"--(cpunodebind|membind|physcpubind)=[0-9A-Za-z,.\-+!:]{1,256}"
)
#: Seconds to wait for a daemon's answer to ``Hello``.
ATTACH_TIMEOUT: Final = 30.0
_TRUST_ALL: Final = "trust_all_connections"


# ---------------------------------------------------------------------------------------------
# Session messages and their codec (pure)
# ---------------------------------------------------------------------------------------------
class Hello(msgspec.Struct, tag=True, frozen=True):
    """Client to daemon, first: protocol version, the address the daemon's workers join
    (the client's node as seen from that host), the orphan bound, the client's main module,
    and the settings its workers must share with the client (``force_quic``)."""

    version: int
    address: str
    idle_timeout: float
    main: tuple[str, str] | None = None
    label: str = ""
    force_quic: bool = False


class Welcome(msgspec.Struct, tag=True, frozen=True):
    """Daemon to client: the attach is accepted."""

    hostname: str
    os_pid: int
    address: str


class Refused(msgspec.Struct, tag=True, frozen=True):
    """Daemon to client: the attach is refused (busy with another client, wrong version)."""

    reason: str


class WorkerCommand(msgspec.Struct, frozen=True):
    """A ``BootstrapCommand`` on the wire (its fields; ``None`` env values remove one)."""

    program: str
    arg0: str | None
    args: list[str]
    env: dict[str, str | None]
    inherit_env: bool = True

    @classmethod
    def of(cls, command: BootstrapCommand) -> WorkerCommand:
        return cls(command.program, command.arg0, command.args, command.env, command.inherit_env)

    def bootstrap_command(self) -> BootstrapCommand:
        return BootstrapCommand(self.program, self.arg0, self.args, self.env, self.inherit_env)


class Spawn(msgspec.Struct, tag=True, frozen=True):
    """Client to daemon: start one worker per label; ``commands`` and ``numactl`` (one entry
    per label when given): its ``bootstrap_command`` and its numactl options (``[]``: none)."""

    request: int
    labels: list[str]
    commands: list[WorkerCommand | None] | None = None
    numactl: list[list[str]] | None = None


class Spawned(msgspec.Struct, tag=True, frozen=True):
    """Daemon to client: the workers of ``request`` joined; their PIDs (hex) and OS pids."""

    request: int
    pids: list[str]
    os_pids: list[int]


class SpawnFailed(msgspec.Struct, tag=True, frozen=True):
    """Daemon to client: the workers of ``request`` could not be started (none is left)."""

    request: int
    reason: str


class Exited(msgspec.Struct, tag=True, frozen=True):
    """Daemon to client: a worker exited with ``status`` (negative: killed by that signal)."""

    pid: str
    label: str
    os_pid: int
    status: int


class KillProcs(msgspec.Struct, tag=True, frozen=True):
    """Client to daemon: SIGKILL these workers (stragglers of a stop)."""

    pids: list[str]


class Heartbeat(msgspec.Struct, tag=True, frozen=True):
    """Either way: keeps the session's connection busy."""


class Detach(msgspec.Struct, tag=True, frozen=True):
    """Client to daemon: the client leaves; kill leftovers and wait for the next client."""


class Shutdown(msgspec.Struct, tag=True, frozen=True):
    """Client to daemon: kill leftovers and end the worker loop."""


class Kill(msgspec.Struct, tag=True, frozen=True):
    """Client to daemon: SIGKILL every worker and end the worker loop at once."""


Message = (
    Hello | Welcome | Refused | Spawn | Spawned | SpawnFailed | Exited | KillProcs | Heartbeat
    | Detach | Shutdown | Kill
)  # fmt: skip
_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(Message)
_MAX_LABELS: Final = 1024


class SessionProtocolError(Exception):
    """A session peer sent something malformed or over a bound."""


def _bad_text(text: str) -> bool:
    return "\0" in text


def _command_problem(command: WorkerCommand) -> str | None:
    if len(command.args) > MAX_COMMAND_ARGS:
        return f"{len(command.args)} arguments (at most {MAX_COMMAND_ARGS})"
    if len(command.env) > MAX_COMMAND_ENV:
        return f"{len(command.env)} environment entries (at most {MAX_COMMAND_ENV})"
    texts = [command.program, command.arg0 or "", *command.args]
    for key, value in command.env.items():
        if not key or "=" in key:
            return f"the environment name {key[:64]!r} is not valid"
        texts += [key, value or ""]
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if size > MAX_COMMAND_BYTES:
        return f"{size} bytes (at most {MAX_COMMAND_BYTES})"
    if not command.program:
        return "an empty program"
    if any(_bad_text(t) for t in texts):
        return "a NUL character"
    return None


def spawn_problem(request: Spawn) -> str | None:
    """Why a daemon refuses ``request`` (``None``: it may start it): per-label options of the
    wrong count, a command over its bounds or malformed, numactl options that are not
    ``--cpunodebind``/``--membind``/``--physcpubind`` values."""
    count = len(request.labels)
    if request.commands is not None:
        if len(request.commands) != count:
            return f"{len(request.commands)} bootstrap commands for {count} workers"
        for index, command in enumerate(request.commands):
            problem = None if command is None else _command_problem(command)
            if problem is not None:
                return f"the bootstrap command of worker {index} has {problem}"
    if request.numactl is not None:
        if len(request.numactl) != count:
            return f"{len(request.numactl)} numactl bindings for {count} workers"
        for index, options in enumerate(request.numactl):
            if len(options) > 3 or not all(_NUMACTL_OPTION.fullmatch(o) for o in options):
                return (
                    f"the numactl binding of worker {index} is not a list of --cpunodebind, "
                    "--membind or --physcpubind options"
                )
    return None


def encode_message(message: Message) -> bytes:
    """``message`` as one frame: a 4-byte big-endian length, then msgpack."""
    body = _ENCODER.encode(message)
    if len(body) > MAX_SESSION_FRAME:
        raise SessionProtocolError(f"a session message of {len(body)} bytes is over the bound")
    return len(body).to_bytes(4, "big") + body


#: Bytes one read of a session stream asks for (``_Channel``).
_READ_CHUNK: Final = 64 * 1024


def _frame_too_large(size: int, bound: int) -> SessionProtocolError:
    return SessionProtocolError(f"a session frame of {size} bytes is over the bound")


class SessionDecoder:
    """Sans-IO frame decoder: ``feed(bytes)``, then ``next()`` until it returns ``None``.

    The framing is ``chrysalis.core.framing``'s ``LengthPrefixDecoder`` (a 4-byte big-endian
    length): the length prefix is checked against ``MAX_SESSION_FRAME`` before the body is
    buffered, and at most one frame plus one read chunk is kept. Raises
    ``SessionProtocolError`` for an oversize or malformed frame or for more labels than a
    spawn may carry; after that the decoder is poisoned: every later call raises it again.
    """

    __slots__ = ("_frames",)

    def __init__(self) -> None:
        self._frames = LengthPrefixDecoder(
            MAX_SESSION_FRAME,
            buffer_limit=4 + MAX_SESSION_FRAME + _READ_CHUNK,
            too_large=_frame_too_large,
        )

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as messages."""
        return self._frames.buffered

    def feed(self, data: bytes) -> None:
        try:
            self._frames.feed(data)
        except FrameBufferFull as exc:  # a peer that sends while its last frame is unread
            self._poison(f"a session peer sent more than it may buffer: {exc}")

    def next(self) -> Message | None:
        body = self._frames.next_frame()
        if body is None:
            return None
        try:
            message = _DECODER.decode(body)
        except msgspec.DecodeError as exc:
            self._poison(f"malformed session message: {exc}")
        if isinstance(message, Spawn) and len(message.labels) > _MAX_LABELS:
            self._poison(f"a spawn of {len(message.labels)} workers is over the bound")
        return message

    def _poison(self, why: str) -> NoReturn:
        self._frames.poison(SessionProtocolError(why))


class _Channel:
    """The asyncio adapter: one session stream, whole messages in and out."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._decoder = SessionDecoder()
        self._lock = asyncio.Lock()

    async def send(self, message: Message) -> None:
        async with self._lock:
            self._stream.write(encode_message(message))
            await self._stream.drain()

    async def recv(self) -> Message:
        while True:
            message = self._decoder.next()
            if message is not None:
                return message
            data = await self._stream.read(_READ_CHUNK)
            if not data:
                raise EOFError("the session stream ended")
            self._decoder.feed(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.write_eof()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.abort()


async def _heartbeats(channel: _Channel, interval: float) -> None:
    with contextlib.suppress(Exception):
        while True:
            await asyncio.sleep(interval)
            await asyncio.wait_for(channel.send(Heartbeat()), interval * 2)


def _ca_directory(ca: object) -> Path:
    """The CA directory meant by a ``ca`` argument (``ValueError`` for anything else)."""
    if ca == _TRUST_ALL:
        return default_dev_ca_directory()
    if isinstance(ca, str | os.PathLike):
        path = Path(ca)
        if path.is_dir():
            return path
        raise ValueError(f"ca={str(ca)!r} is not a CA directory (holding ca.pem and ca.key)")
    raise ValueError(f"ca must be {_TRUST_ALL!r} or a CA directory, not {ca!r}")


#: Schemes a worker address may use: ours, and Monarch's ``tcp://`` mapped onto it.
WORKER_SCHEMES: Final = ("udp://", "tcp://")


def _udp_address(text: str, *, any_port: bool = False) -> str:
    """Normalise a worker address to ``udp://IP:PORT`` (host names are resolved; port 0
    only with ``any_port``).

    Monarch programs name worker loops ``tcp://HOST:PORT``; here every process speaks QUIC over
    UDP, so ``tcp://HOST:PORT`` means the same host and port number over UDP
    (``udp://HOST:PORT``): a program passing the same ``tcp://`` string to
    ``run_worker_loop_forever`` and to ``attach_to_workers`` runs unchanged. A bare
    ``HOST:PORT`` is UDP too; other schemes (``ipc://``, ``metatls://``) raise ``ValueError``.
    """
    if not isinstance(text, str):
        raise TypeError(f"a worker address is a str, not {type(text).__name__}")
    rest = text
    for scheme in WORKER_SCHEMES:
        if text.startswith(scheme):
            rest = text[len(scheme) :]
            break
    if "://" in rest:
        raise ValueError(
            f"worker address {text!r}: only udp://HOST:PORT and tcp://HOST:PORT addresses are "
            "supported"
        )
    host, sep, port = rest.rpartition(":")
    lowest = 0 if any_port else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ValueError(f"worker address {text!r} is not udp://HOST:PORT or tcp://HOST:PORT")
    # An ASCII name goes to the resolver as bytes: a str would load the IDNA codec first
    # (``encodings.idna``, with stringprep and unicodedata: several ms of a worker loop's start)
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    try:
        ip = socket.getaddrinfo(name, int(port), socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except OSError as exc:
        raise ValueError(f"worker address {text!r}: cannot resolve {host!r}: {exc}") from None
    return f"udp://{ip}:{port}"


# ---------------------------------------------------------------------------------------------
