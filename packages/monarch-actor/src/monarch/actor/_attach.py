"""Hosts started separately: ``run_worker_loop_forever`` (the worker daemon of a host) and
``attach_to_workers`` (the client's side), so one program spans machines.

Why this shape (design "Monarch on Chrysalis": a worker host is a node that the attaching
client adopts):

- A worker daemon is a Chrysalis root node listening on the UDP address it was given. It
  serves one link-local protocol, ``monarch.host.v1``: a *session* with one client at a time.
  It runs no actors itself; on the client's request it starts worker processes
  (``python -m monarch.actor._worker``) that join **under the client's node**, exactly like the
  client's local workers, so the namespace tree stays the supervision tree: the client is every
  worker's parent, and a worker whose parent link is gone exits.
- Trust: both ends authenticate with TLS leaves of the same *cluster CA*, the development CA
  directory (``ca="trust_all_connections"``, the default: ``$CHRYSALIS_DEV_CA_DIR`` else the
  per-user ``<tmp>/chrysalis-dev-ca-<uid>``), or an explicit CA directory (``ca=PATH``, holding
  ``ca.pem`` and ``ca.key``). The daemon issues its own leaf and its workers' leaves from it;
  the client's leaf was issued from it at bootstrap. A peer that does not chain to those roots
  cannot complete the QUIC handshake, so it can neither attach nor join.
- The session is a bidirectional stream of length-prefixed msgpack messages (``Hello``,
  ``Spawn``, ``Exited``, ...; at most ``MAX_SESSION_FRAME`` bytes each), with a heartbeat every
  ``idle/4`` seconds in both directions so that only a dead peer lets the QUIC idle timeout
  (``mesh_orphan_timeout``) close it. The codec (``encode_message``, ``SessionDecoder``) is
  pure; ``_Channel`` is the asyncio adapter.
- Process death on a remote host: the daemon reaps its workers and sends ``Exited``; the
  client turns it into the same process-death handling as for local workers
  (``WorkerGroup.on_exit``). A lost session (the daemon or its host died, or the network is
  cut) counts as the death of every worker of that host. The daemon, in turn, SIGKILLs the
  workers of a lost client at once, and the workers watch the daemon through a stdin pipe
  (``--exit-with-stdin``): no worker outlives its host daemon or its client.
- ``spawn_procs`` options: ``Spawn`` may carry each worker's ``bootstrap_command``
  (``WorkerCommand``) and numactl options; the daemon starts the worker with them exactly as the
  client starts local ones (``_host.exec_spec``), resolving ``numactl`` on its own host. Running
  a client's command grants the client nothing new: it is authenticated (mutual TLS, same
  cluster CA) and can already run any code in the workers the daemon starts for it. The daemon
  still checks their bounds and shape (``spawn_problem``) and answers ``SpawnFailed``.
- Lifecycle (release notes 0.2.0): ``HostMesh.stop()`` stops the procs and keeps the session
  (the handle stays usable); ``shutdown()`` stops the procs, then the daemon ends its loop;
  ``kill()`` makes the daemon SIGKILL its workers and return from its loop at once. A client
  that exits (``shutdown_context``) *detaches*: the daemon kills leftovers and waits for the
  next client, so persistent hosts are reusable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from monarch.actor._base.future import Future, _Cell
from monarch.actor._base.shape import Extent, Shape
from monarch.actor._host import (
    SPAWN_TIMEOUT,
    BootstrapCommand,
    ClientNodeLayer,
    HostMesh,
    WorkerGroup,
    _describe_exit,
    exec_spec,
    forward_output,
    read_worker_pids,
    source_ip_toward,
    spawn_timeout,
    worker_command,
)
from monarch.actor._main_module import main_reference
from monarch.actor._runtime.client import client
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from chrysalis.core import Pid

__all__ = [
    "ATTACH_PROTOCOL",
    "MAX_COMMAND_ARGS",
    "MAX_COMMAND_BYTES",
    "MAX_COMMAND_ENV",
    "MAX_HOST_PROCS",
    "MAX_SESSION_FRAME",
    "PROTOCOL_VERSION",
    "Detach",
    "Exited",
    "Heartbeat",
    "Hello",
    "HostSession",
    "Kill",
    "KillProcs",
    "Refused",
    "RemoteWorkerGroup",
    "SessionDecoder",
    "SessionProtocolError",
    "Shutdown",
    "Spawn",
    "SpawnFailed",
    "Spawned",
    "Welcome",
    "WorkerCommand",
    "WorkerDaemon",
    "attach_to_workers",
    "encode_message",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "spawn_on_hosts",
    "spawn_problem",
    "start_worker_loop_forever",
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
_log = logging.getLogger("monarch.actor.attach")


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


class SessionDecoder:
    """Sans-IO frame decoder: ``feed(bytes)``, then ``next()`` until it returns ``None``.

    Checks the length prefix against ``MAX_SESSION_FRAME`` before buffering the body and keeps
    at most one frame plus one read chunk; raises ``SessionProtocolError`` for an oversize or
    malformed frame or for more labels than a spawn may carry.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next(self) -> Message | None:
        if len(self._buffer) < 4:
            return None
        size = int.from_bytes(self._buffer[:4], "big")
        if size > MAX_SESSION_FRAME:
            raise SessionProtocolError(f"a session frame of {size} bytes is over the bound")
        if len(self._buffer) < 4 + size:
            return None
        body = bytes(self._buffer[4 : 4 + size])
        del self._buffer[: 4 + size]
        try:
            message = _DECODER.decode(body)
        except msgspec.DecodeError as exc:
            raise SessionProtocolError(f"malformed session message: {exc}") from None
        if isinstance(message, Spawn) and len(message.labels) > _MAX_LABELS:
            raise SessionProtocolError(
                f"a spawn of {len(message.labels)} workers is over the bound"
            )
        return message


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
            data = await self._stream.read(64 * 1024)
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
    from chrysalis.quic import default_dev_ca_directory

    if ca == _TRUST_ALL:
        return default_dev_ca_directory()
    if isinstance(ca, str | os.PathLike):
        path = Path(ca)
        if path.is_dir():
            return path
        raise ValueError(f"ca={str(ca)!r} is not a CA directory (holding ca.pem and ca.key)")
    raise ValueError(f"ca must be {_TRUST_ALL!r} or a CA directory, not {ca!r}")


def _udp_address(text: str, *, any_port: bool = False) -> str:
    """Normalise a worker address to ``udp://IP:PORT`` (host names are resolved; port 0
    only with ``any_port``)."""
    if not isinstance(text, str):
        raise TypeError(f"a worker address is a str, not {type(text).__name__}")
    rest = text[len("udp://") :] if text.startswith("udp://") else text
    if "://" in rest:
        raise ValueError(f"worker address {text!r}: only udp://HOST:PORT addresses are supported")
    host, sep, port = rest.rpartition(":")
    lowest = 0 if any_port else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ValueError(f"worker address {text!r} is not udp://HOST:PORT")
    try:
        ip = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except OSError as exc:
        raise ValueError(f"worker address {text!r}: cannot resolve {host!r}: {exc}") from None
    return f"udp://{ip}:{port}"


# ---------------------------------------------------------------------------------------------
# The worker daemon (one per host)
# ---------------------------------------------------------------------------------------------
class _DaemonProc:
    __slots__ = ("label", "os_pid", "pid", "popen")

    def __init__(self, label: str, popen: subprocess.Popen[bytes], pid: str) -> None:
        self.label = label
        self.popen = popen
        self.pid = pid
        self.os_pid = popen.pid


class WorkerDaemon:
    """The worker loop of one host (see the module docstring): ``await serve()`` runs it
    until a client asks it to end; ``ready(address)`` is called once it listens."""

    def __init__(self, address: str, ca_dir: Path, *, idle_timeout: float | None = None) -> None:
        self.address = address
        self.ca_dir = ca_dir
        self.idle = float(
            idle_timeout if idle_timeout is not None else _config.get("mesh_orphan_timeout")
        )
        self._done: asyncio.Event | None = None
        self._session: asyncio.Task[None] | None = None
        self._session_client: Pid | None = None
        self._procs: dict[str, _DaemonProc] = {}
        self._killed = False

    async def serve(self, ready: Callable[[str], None] | None = None) -> None:
        from chrysalis.node import Node
        from chrysalis.quic import DevelopmentIdentityProvider, QuicConfig

        identity = DevelopmentIdentityProvider(self.ca_dir).issue_identity()
        self._done = asyncio.Event()
        node = Node.serve(
            identity,
            self.address,
            quic_config=QuicConfig(idle_timeout=self.idle, keepalive_interval=self.idle / 4),
        )
        node.register_link_protocol(ATTACH_PROTOCOL, self._on_stream)
        async with node:
            self.address = str(node.local_addr)
            _log.info("monarch worker loop %s listening on %s", identity.pid.hex(), self.address)
            if ready is not None:
                ready(self.address)
            try:
                await self._done.wait()
            finally:
                self._kill_all()
                if self._session is not None and not self._killed:
                    with contextlib.suppress(BaseException):
                        await asyncio.wait_for(asyncio.shield(self._session), 2.0)

    def _finish(self) -> None:
        if self._done is not None:
            self._done.set()

    async def _on_stream(self, peer: Pid, stream: Any) -> None:
        channel = _Channel(stream)
        try:
            hello = await asyncio.wait_for(channel.recv(), ATTACH_TIMEOUT)
        except Exception as exc:
            _log.warning("an attach from %s failed before its hello: %s", peer.hex(), exc)
            return
        refusal = None
        if not isinstance(hello, Hello):
            refusal = f"expected a Hello, got {type(hello).__name__}"
        elif hello.version != PROTOCOL_VERSION:
            refusal = f"protocol version {hello.version} is not {PROTOCOL_VERSION}"
        elif self._session is not None and not self._session.done():
            if self._session_client == peer:  # the same client attaches again: replace
                self._session.cancel()
                with contextlib.suppress(BaseException):
                    await self._session
            else:
                assert self._session_client is not None
                refusal = f"this host is attached to client {self._session_client.hex()}"
        if refusal is not None or not isinstance(hello, Hello):
            with contextlib.suppress(Exception):
                await channel.send(Refused(refusal or "bad hello"))
            return
        self._session_client = peer
        self._session = asyncio.current_task()
        try:
            await self._run_session(peer, channel, hello)
        finally:
            if not self._killed:
                self._kill_all()

    async def _run_session(self, peer: Pid, channel: _Channel, hello: Hello) -> None:
        await channel.send(Welcome(socket.gethostname(), os.getpid(), self.address))
        _log.info("attached to client %s at %s", peer.hex(), hello.address)
        beat = asyncio.create_task(_heartbeats(channel, min(self.idle, hello.idle_timeout) / 4))
        spawns: set[asyncio.Task[None]] = set()
        try:
            while True:
                message = await channel.recv()
                if isinstance(message, Spawn):
                    task = asyncio.create_task(self._spawn(channel, peer, hello, message))
                    spawns.add(task)
                    task.add_done_callback(spawns.discard)
                elif isinstance(message, KillProcs):
                    for pid in message.pids:
                        proc = self._procs.get(pid)
                        if proc is not None:
                            _kill(proc.popen)
                elif isinstance(message, Detach):
                    break
                elif isinstance(message, Shutdown):
                    self._finish()
                    break
                elif isinstance(message, Kill):
                    self._killed = True
                    self._kill_all()
                    self._finish()
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _log.warning("the session with client %s ended: %s", peer.hex(), exc)
        finally:
            beat.cancel()
            for task in spawns:
                task.cancel()
            channel.close()

    async def _spawn(self, channel: _Channel, peer: Pid, hello: Hello, request: Spawn) -> None:
        loop = asyncio.get_running_loop()
        if len(self._procs) + len(request.labels) > MAX_HOST_PROCS:
            reason = (
                f"this host already runs {len(self._procs)} of at most {MAX_HOST_PROCS} workers"
            )
            await channel.send(SpawnFailed(request.request, reason))
            return
        problem = spawn_problem(request)
        if problem is not None:
            await channel.send(SpawnFailed(request.request, f"refused spawn: {problem}"))
            return
        starting = loop.run_in_executor(None, self._start_procs, peer, hello, request)
        try:
            procs = await asyncio.shield(starting)
        except asyncio.CancelledError:  # the session ended while they started: none survives
            starting.add_done_callback(_kill_started)
            raise
        except Exception as exc:
            await channel.send(SpawnFailed(request.request, str(exc)))
            return
        for proc in procs:
            self._procs[proc.pid] = proc
            threading.Thread(
                target=self._reap, args=(loop, channel, proc), name="monarch-reaper", daemon=True
            ).start()
        await channel.send(
            Spawned(request.request, [p.pid for p in procs], [p.os_pid for p in procs])
        )

    def _start_procs(self, peer: Pid, hello: Hello, request: Spawn) -> list[_DaemonProc]:
        """Start the workers of a checked ``request`` (``spawn_problem``) as the client starts
        local ones: a custom command runs with the worker's options in
        ``MONARCH_WORKER_ARGV``, numactl (found on this host) prefixes it."""
        labels = list(request.labels)
        client_ip = hello.address.removeprefix("udp://").rpartition(":")[0]
        listen = f"udp://{source_ip_toward(client_ip)}:0"
        popens: list[subprocess.Popen[bytes]] = []
        env = dict(os.environ)
        if hello.force_quic:  # every process of the program takes the same path
            env["MONARCH_FORCE_QUIC"] = "1"
        prefixes: list[list[str]] = [[] for _ in labels]
        if request.numactl is not None and any(request.numactl):
            numactl = shutil.which("numactl")
            if numactl is None:
                keys = sorted({o.split("=")[0][2:] for opts in request.numactl for o in opts})
                raise RuntimeError(
                    f"proc_bind {', '.join(keys)} needs numactl, which is not installed on "
                    f"host {socket.gethostname()} (a 'cpus' binding needs no tool)"
                )
            prefixes = [[numactl, *options] if options else [] for options in request.numactl]
        for rank, label in enumerate(labels):
            command = worker_command(
                parent=hello.address, authority=peer.hex(), ca_dir=self.ca_dir, label=label,
                idle=hello.idle_timeout, main=hello.main, listen=listen, exit_with_stdin=True,
            )  # fmt: skip
            wire = request.commands[rank] if request.commands is not None else None
            custom = wire.bootstrap_command() if wire is not None else None
            argv, executable, environment = exec_spec(command, custom, prefixes[rank], env)
            try:
                popen = subprocess.Popen(
                    argv,
                    executable=executable,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=environment,
                )
            except (OSError, ValueError) as exc:
                _kill_all_of(popens)
                raise RuntimeError(
                    f"worker process {label} could not be started on host "
                    f"{socket.gethostname()}: {exc}"
                ) from None
            popens.append(popen)
        pids = read_worker_pids(popens, labels, spawn_timeout())
        if isinstance(pids, str):
            _kill_all_of(popens)
            raise RuntimeError(pids)
        for popen in popens:
            forward_output(popen.stdout)
        return [
            _DaemonProc(label, popen, pid.hex())
            for label, popen, pid in zip(labels, popens, pids, strict=True)
        ]

    def _reap(self, loop: asyncio.AbstractEventLoop, channel: _Channel, proc: _DaemonProc) -> None:
        status = proc.popen.wait()  # forward_output closes stdout at its end of file
        if proc.popen.stdin is not None:
            with contextlib.suppress(Exception):
                proc.popen.stdin.close()

        def report() -> None:
            if self._procs.pop(proc.pid, None) is None:
                return
            task = loop.create_task(channel.send(Exited(proc.pid, proc.label, proc.os_pid, status)))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody to tell
            loop.call_soon_threadsafe(report)

    def _kill_all(self) -> None:
        procs, self._procs = list(self._procs.values()), {}
        for proc in procs:
            _kill(proc.popen)


def _kill_started(future: asyncio.Future[list[_DaemonProc]]) -> None:
    if not future.cancelled() and future.exception() is None:
        for proc in future.result():
            _kill(proc.popen)


def _kill_all_of(popens: Sequence[subprocess.Popen[bytes]]) -> None:
    for popen in popens:
        _kill(popen)
    for popen in popens:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(5.0)
        for pipe in (popen.stdin, popen.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _kill(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        with contextlib.suppress(OSError):
            popen.kill()


def run_worker_loop_forever(
    *, address: str, ca: str | os.PathLike[str] = _TRUST_ALL, private_key: Any = None
) -> None:
    """Run this host's worker loop on ``address`` (``udp://IP:PORT``) until a client ends it
    with ``HostMesh.shutdown()`` or ``kill()`` (or the process is interrupted).

    ``ca`` is where the cluster CA lives (``"trust_all_connections"``: the development CA
    directory, ``$CHRYSALIS_DEV_CA_DIR`` or the per-user default; else a CA directory); the
    client must have been started with the same CA. ``private_key`` (TLS material of the
    reference's TLS transports) is not supported: ``NotImplementedError``.
    """
    if private_key is not None:
        raise NotImplementedError("run_worker_loop_forever(private_key=...) is not supported")
    daemon = WorkerDaemon(_udp_address(address, any_port=True), _ca_directory(ca))
    asyncio.run(daemon.serve())


def run_worker_loop_until_shutdown(
    *, address: str, ca: str | os.PathLike[str] = _TRUST_ALL, private_key: Any = None
) -> None:
    """Run this host's worker loop on ``address`` and return once the client that owns it
    ends it with ``HostMesh.shutdown()`` (or ``kill()``): the process goes on afterwards.

    Arguments as ``run_worker_loop_forever``.
    """
    if private_key is not None:
        raise NotImplementedError(
            "run_worker_loop_until_shutdown(private_key=...) is not supported"
        )
    daemon = WorkerDaemon(_udp_address(address, any_port=True), _ca_directory(ca))
    asyncio.run(daemon.serve())


#: Seconds ``start_worker_loop_forever`` waits for its worker loop to listen.
START_TIMEOUT: Final = 30.0


def start_worker_loop_forever(
    *, address: str, ca: str | os.PathLike[str] = _TRUST_ALL, private_key: Any = None
) -> Future[None]:
    """Start this host's worker loop on ``address`` in the background and return a future of
    its lifetime: it resolves when a client ends the loop (``HostMesh.shutdown()``/``kill()``)
    and fails if the loop fails.

    The loop listens before this returns (``RuntimeError`` if it cannot start within
    ``START_TIMEOUT``, naming why); it keeps running if the future is dropped. Arguments as
    ``run_worker_loop_forever``. The loop runs on its own thread and event loop, so the
    calling program goes on (and may itself be a Monarch client of other hosts).
    """
    if private_key is not None:
        raise NotImplementedError("start_worker_loop_forever(private_key=...) is not supported")
    daemon = WorkerDaemon(_udp_address(address, any_port=True), _ca_directory(ca))
    cell: _Cell[None] = _Cell()
    listening = threading.Event()

    def run() -> None:
        try:
            asyncio.run(daemon.serve(lambda _: listening.set()))
        except BaseException as exc:
            cell.set_exception(exc)
        else:
            cell.set_result(None)
        finally:
            listening.set()

    threading.Thread(target=run, name="monarch-worker-loop", daemon=True).start()
    if not listening.wait(START_TIMEOUT):
        raise RuntimeError(f"the worker loop on {address} did not listen within {START_TIMEOUT} s")
    if cell.done():
        ok, outcome = cell.outcome()
        if not ok:
            raise RuntimeError(f"the worker loop on {address} could not start: {outcome}")
    return Future._create(cell)


# ---------------------------------------------------------------------------------------------
# The client's side
# ---------------------------------------------------------------------------------------------
class HostSession:
    """The client's session with one host's worker daemon (state lives on the client loop)."""

    def __init__(self, layer: ClientNodeLayer, address: str) -> None:
        self.layer = layer
        self.address = address
        self.hostname = ""
        self.host_pid = ""
        self.lost: str | None = None
        self._loop: Any = None
        self._channel: _Channel | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._requests: dict[int, asyncio.Future[Message]] = {}
        self._numbers = itertools.count(1)
        self._procs: dict[str, tuple[WorkerGroup, int]] = {}
        self._early_exits: dict[str, str] = {}
        self._closing = False

    def __repr__(self) -> str:
        return f"<HostSession {self.address} {self.hostname or '?'}>"

    async def connect(self, node: Any, idle: float) -> None:
        from chrysalis.core import DatagramAddr

        self._loop = asyncio.get_running_loop()
        addr = DatagramAddr.parse(self.address)
        peer, stream = await node.transport.dial_link_local_unpinned(addr, ATTACH_PROTOCOL)
        channel = _Channel(stream)
        hello = Hello(
            PROTOCOL_VERSION,
            self.layer.parent_address(str(addr.ip)),
            idle,
            main_reference(),
            socket.gethostname(),
            bool(_config.get("force_quic")),
        )
        await channel.send(hello)
        reply = await channel.recv()
        if isinstance(reply, Refused):
            channel.close()
            raise RuntimeError(f"worker {self.address} refused the attach: {reply.reason}")
        if not isinstance(reply, Welcome):
            channel.abort()
            raise RuntimeError(f"worker {self.address} answered {type(reply).__name__}")
        self.host_pid = peer.hex()
        self.hostname = reply.hostname
        self._channel = channel
        self._tasks = [
            asyncio.create_task(self._read_loop(channel)),
            asyncio.create_task(_heartbeats(channel, idle / 4)),
        ]

    async def _read_loop(self, channel: _Channel) -> None:
        why = "the session stream ended"
        try:
            while True:
                message = await channel.recv()
                if isinstance(message, Spawned | SpawnFailed):
                    waiter = self._requests.pop(message.request, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(message)
                elif isinstance(message, Exited):
                    reason = (
                        f"process {message.label} (os pid {message.os_pid} on host "
                        f"{self.hostname}) {_describe_exit(message.status)}"
                    )
                    self._exited(message.pid, reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self._on_lost(f"host {self.address} ({self.hostname}) was lost: {why}")

    def _exited(self, pid: str, reason: str, expected: bool = False) -> None:
        entry = self._procs.pop(pid, None)
        if entry is None:
            self._early_exits[pid] = reason
            while len(self._early_exits) > _MAX_LABELS:
                del self._early_exits[next(iter(self._early_exits))]
            return
        group, rank = entry
        group.on_exit(rank, reason, expected=expected)

    def _on_lost(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        for waiter in self._requests.values():
            if not waiter.done():
                waiter.set_exception(RuntimeError(reason))
        self._requests.clear()
        for pid in list(self._procs):
            self._exited(pid, reason, expected=self._closing)

    def register(self, pid: str, group: WorkerGroup, rank: int) -> None:
        """Route ``Exited`` for ``pid`` to ``group`` (call on the client loop)."""
        self._procs[pid] = (group, rank)
        early = self._early_exits.pop(pid, None)
        if early is None and self.lost is not None:
            early = self.lost
        if early is not None:
            self._exited(pid, early)

    async def spawn(
        self,
        labels: list[str],
        commands: list[WorkerCommand | None] | None = None,
        numactl: list[list[str]] | None = None,
    ) -> Spawned:
        if self.lost is not None:
            raise RuntimeError(self.lost)
        if self._closing or self._channel is None:
            raise RuntimeError(f"the session with host {self.address} is closed")
        number = next(self._numbers)
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._requests[number] = waiter
        try:
            await self._channel.send(Spawn(number, labels, commands, numactl))
            reply = await asyncio.wait_for(waiter, max(SPAWN_TIMEOUT, spawn_timeout()) + 5)
        finally:
            self._requests.pop(number, None)
        if isinstance(reply, SpawnFailed):
            raise RuntimeError(f"host {self.address} ({self.hostname}): {reply.reason}")
        assert isinstance(reply, Spawned)
        if len(reply.pids) != len(labels) or len(reply.os_pids) != len(labels):
            raise RuntimeError(f"host {self.address} answered a spawn with the wrong count")
        return reply

    def send_soon(self, message: Message) -> None:
        """Send ``message`` from any thread (dropped once the session is gone)."""

        async def send() -> None:
            if self._channel is not None and self.lost is None:
                with contextlib.suppress(Exception):
                    await self._channel.send(message)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(send(), self._loop)

    async def _close(self, last: Message) -> None:
        self._closing = True
        channel, self._channel = self._channel, None
        if channel is not None and self.lost is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.send(last), 2.0)
            channel.close()
        for task in self._tasks:
            task.cancel()
        self._on_lost(f"the client left host {self.address}")

    async def detach(self) -> None:
        """Leave the host (client shutdown): its daemon waits for the next client."""
        await self._close(Detach())

    def end(self, *, kill: bool) -> None:
        """End the host's worker loop (any thread, bounded): ``Shutdown`` or ``Kill``."""
        if self._loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(
            self._close(Kill() if kill else Shutdown()), self._loop
        )
        with contextlib.suppress(Exception):
            future.result(5.0)


class RemoteWorkerGroup(WorkerGroup):
    """The workers of one ``spawn_procs`` on attached hosts (rank order: host-major)."""

    def __init__(self, layer: ClientNodeLayer, labels: Sequence[str]) -> None:
        super().__init__(layer, labels)
        self.hosts: list[HostSession] = []
        self.os_pids: list[int] = []

    def _where(self, rank: int) -> str:
        return f" (os pid {self.os_pids[rank]} on host {self.hosts[rank].hostname})"

    def _kill_ranks(self, ranks: Sequence[int]) -> None:
        by_host: dict[int, tuple[HostSession, list[str]]] = {}
        for rank in ranks:
            session = self.hosts[rank]
            by_host.setdefault(id(session), (session, []))[1].append(self.pids[rank].hex())
        for session, pids in by_host.values():
            session.send_soon(KillProcs(pids))


def spawn_on_hosts(
    layer: ClientNodeLayer,
    hosts: Sequence[HostSession],
    extent: Extent,
    local: Extent,
    mesh_name: str,
    *,
    commands: Sequence[BootstrapCommand | None] | None = None,
    numactl: Sequence[Sequence[str]] | None = None,
) -> RemoteWorkerGroup:
    """Start ``local.nelements`` workers on every host of ``hosts`` (in parallel, bounded).
    ``commands`` and ``numactl`` (per rank, host-major; numactl as ``_host.ProcBinding``
    makes it: the program, then its options) travel in ``Spawn``; each daemon finds numactl
    on its own host."""
    from chrysalis.core import Pid

    labels = [f"{mesh_name}{point}" for point in extent.points()]
    per = local.nelements
    loop = client().loop.loop
    wire = (
        None if commands is None else [None if c is None else WorkerCommand.of(c) for c in commands]
    )
    options = None if numactl is None else [list(prefix[1:]) for prefix in numactl]

    def part(values: list[Any] | None, index: int) -> list[Any] | None:
        return None if values is None else values[index * per : (index + 1) * per]

    futures = [
        asyncio.run_coroutine_threadsafe(
            host.spawn(labels[i * per : (i + 1) * per], part(wire, i), part(options, i)), loop
        )
        for i, host in enumerate(hosts)
    ]
    group = RemoteWorkerGroup(layer, labels)
    replies: list[Spawned] = []
    errors: list[str] = []
    for host, future in zip(hosts, futures, strict=True):
        try:
            replies.append(future.result(max(SPAWN_TIMEOUT, spawn_timeout()) + 10))
        except Exception as exc:
            errors.append(f"{exc}" or f"host {host.address}: {type(exc).__name__}")
    if errors:
        for host, reply in zip(hosts, replies, strict=False):
            host.send_soon(KillProcs(list(reply.pids)))
        raise RuntimeError(f"spawn_procs failed: {'; '.join(errors)}")
    for host, reply in zip(hosts, replies, strict=True):
        for pid, os_pid in zip(reply.pids, reply.os_pids, strict=True):
            group.pids.append(Pid(bytes.fromhex(pid)))
            group.hosts.append(host)
            group.os_pids.append(os_pid)
            group.exited.append(threading.Event())
    with layer._lock:
        layer.groups.append(group)

    def register() -> None:
        for rank, (host, pid) in enumerate(zip(group.hosts, group.pids, strict=True)):
            host.register(pid.hex(), group, rank)

    asyncio.run_coroutine_threadsafe(_call(register), loop).result(SPAWN_TIMEOUT)
    group.watch_liveness()
    return group


async def _call(fn: Callable[[], None]) -> None:
    fn()


def attach_to_workers(
    *,
    workers: Sequence[str | Future[str]],
    ca: str | os.PathLike[str] = _TRUST_ALL,
    name: str | None = None,
) -> HostMesh:
    """Attach the hosts whose worker loops (``run_worker_loop_forever``) listen at
    ``workers`` (``udp://HOST:PORT``, or futures of them) and return them as an owned host
    mesh with extent ``{hosts: len(workers)}``.

    Blocks until every host accepted (bounded by ``ATTACH_TIMEOUT``); ``RuntimeError`` naming
    the worker that could not be reached or refused (busy with another client); ``ValueError``
    for a malformed address or a ``ca`` that is not the client's cluster CA.
    """
    resolved = [w.get(timeout=ATTACH_TIMEOUT) if isinstance(w, Future) else w for w in workers]
    if not resolved:
        raise ValueError("attach_to_workers needs at least one worker address")
    if len(resolved) > MAX_HOSTS:
        raise ValueError(f"at most {MAX_HOSTS} hosts per attach_to_workers call")
    addresses = [_udp_address(w) for w in resolved]
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"a worker address is listed twice in {resolved!r}")
    c = client()
    layer = c.node_layer
    _check_client_ca(layer, ca)
    layer.ensure_started(c)
    idle = float(_config.get("mesh_orphan_timeout"))
    sessions = [HostSession(layer, address) for address in addresses]

    async def connect_all() -> list[BaseException | None]:
        async def one(session: HostSession) -> None:
            await asyncio.wait_for(session.connect(layer.node, idle), ATTACH_TIMEOUT)

        return await asyncio.gather(*(one(s) for s in sessions), return_exceptions=True)

    results = asyncio.run_coroutine_threadsafe(connect_all(), c.loop.loop).result(
        ATTACH_TIMEOUT + 5
    )
    failures = [
        f"{session.address}: {result}"
        if str(result)
        else f"{session.address}: {type(result).__name__} (no answer within {ATTACH_TIMEOUT:g} s?)"
        for session, result in zip(sessions, results, strict=True)
        if result is not None
    ]
    if failures:
        for session, result in zip(sessions, results, strict=True):
            if result is None:
                asyncio.run_coroutine_threadsafe(session.detach(), c.loop.loop)
        raise RuntimeError(f"attach_to_workers could not attach {'; '.join(failures)}")
    with layer._lock:
        layer.sessions.extend(sessions)
    shape = Shape.from_extent(Extent(["hosts"], [len(sessions)]))
    return HostMesh(shape, owned=True, name=name or "hosts", hosts=sessions)


def _check_client_ca(layer: ClientNodeLayer, ca: object) -> None:
    directory = _ca_directory(ca)
    if layer.cluster_ca_dir is None:
        raise RuntimeError(f"attach_to_workers needs the cluster CA: {layer.ca_problem}")
    try:
        certificate = (directory / "ca.pem").read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the CA certificate in {directory}: {exc}") from None
    if certificate.strip() != layer.ca_certificate_pem.strip():
        raise ValueError(
            f"the client's identity was issued at start-up by the CA in {layer.cluster_ca_dir}, "
            f"not by the one in {directory}: set CHRYSALIS_DEV_CA_DIR={directory} before the "
            "client starts"
        )


# ---------------------------------------------------------------------------------------------
# ``python -m monarch.actor._attach --address udp://IP:PORT``
# ---------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run a worker loop; print its bound address as the first stdout line."""
    parser = argparse.ArgumentParser(prog="python -m monarch.actor._attach")
    parser.add_argument("--address", required=True, help="udp://IP:PORT to listen on (port 0: any)")
    parser.add_argument("--ca", default=_TRUST_ALL, help="the cluster CA directory")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level, format="[worker-loop] %(name)s: %(message)s")
    daemon = WorkerDaemon(_udp_address(args.address, any_port=True), _ca_directory(args.ca))

    def ready(address: str) -> None:
        sys.stdout.write(f"{address}\n")
        sys.stdout.flush()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(daemon.serve(ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
