"""The caller's side of ``chrysalis agent``: hand ``ls``, ``resolve``, ``ping`` or ``pipe`` to a
running agent and print what it answers. The thin path of the ``chrysalis`` command.

Why a module of its own: with an agent running, a command's time is interpreter start plus what
this module imports plus one request (issue 22, item 5: ``chrysalis ls`` within 3x of
``python -c pass``). So it imports only what the interpreter has already loaded (``os``,
``sys``) and two C modules (``_socket``, ``_struct``): no ``socket`` (it imports
``enum``), no ``array`` (``collections``), no ``json`` (``re``), no ``typing``,
``argparse``, ``logging`` or ``pathlib``.
``tests/test_cli_start.py`` checks that list.

Wire (one Unix stream connection per command; every frame is a 4-byte big-endian length and
that many bytes, at most ``MAX_REQUEST``):

- request: ``REQUEST_MAGIC``, then NUL-separated fields: the number of arguments, the
  arguments, the working directory, then the environment as ``KEY=VALUE`` (none of them can
  hold a NUL byte); standard input, output and error ride along as descriptors
  (``SCM_RIGHTS``) for a command the agent forks;
- reply: ``!BiI`` (``kind``, exit status, length of the standard output that follows) then
  the standard output and the standard error. ``DONE``: the command ran, print the two and
  exit with the status (a forked command wrote to the descriptors itself: both are empty);
  ``REFUSED``: the agent did not run it (busy, or its warm node lost its root): run it here.

Before sending anything the caller checks that the socket's listener runs as its own user
(``SO_PEERCRED``; else a warning and the command runs alone), as the agent checks its callers.

Control requests (``agent status``/``stop``) are JSON frames (``chrysalis.node._agent``).
"""

from __future__ import annotations

import _socket
import _struct
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Final

__all__ = [
    "AUTOSTART_ENV",
    "DONE",
    "MAX_REQUEST",
    "REFUSED",
    "REQUEST_MAGIC",
    "autostart_enabled",
    "decode_reply",
    "decode_request",
    "default_directory",
    "default_socket",
    "encode_reply",
    "encode_request",
    "installation_tag",
    "peer_uid",
    "run_via_agent",
]

MAX_REQUEST: Final = 1 << 20
"""Bytes of one request frame (arguments, directory, environment)."""
MAX_REPLY: Final = 64 << 20
"""Bytes of one reply frame (a warm command's whole output)."""
REQUEST_MAGIC: Final = b"chrysalis-agent-1\0"
DONE: Final = 0
REFUSED: Final = 1
_REPLY_HEAD: Final = "!BiI"
_REPLY_HEAD_SIZE: Final = _struct.calcsize(_REPLY_HEAD)
_NO_AGENT_ENV: Final = "CHRYSALIS_NO_AGENT"
AUTOSTART_ENV: Final = "CHRYSALIS_AGENT_AUTOSTART"
"""``0``: a command that found no agent does not start one (``CHRYSALIS_NO_AGENT=1``: nor uses
one)."""
_SOCKET_ENV: Final = "CHRYSALIS_AGENT_SOCKET"
_in_child = False
"""Set in a command the agent forked: it runs there, never handed to the agent again."""


def autostart_enabled(environ: Mapping[str, str]) -> bool:
    """Whether a command that found no agent starts one: not with ``CHRYSALIS_NO_AGENT=1``
    (no agent is used at all) nor ``CHRYSALIS_AGENT_AUTOSTART=0``. Here, not in
    ``chrysalis.node._agent`` (which re-exports it): a lone command decides without importing
    the agent (issue 22, item 5)."""
    return environ.get(_NO_AGENT_ENV) != "1" and environ.get(AUTOSTART_ENV) != "0"


def installation_tag() -> str:
    """8 hex digits naming this installation of chrysalis-node (FNV-1a of this package's
    directory): the default socket's name carries it, so a command is only ever answered by an
    agent running the same code (two virtual environments or checkouts of one user each get
    their own agent). Pure Python: the thin path imports no hashing module for it."""
    value = 0xCBF29CE484222325
    for byte in os.fsencode(os.path.dirname(os.path.abspath(__file__))):
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{(value ^ (value >> 32)) & 0xFFFFFFFF:08x}"


def default_directory() -> str:
    """The per-user directory of the default socket: ``$XDG_RUNTIME_DIR/chrysalis-agent``,
    else ``/tmp/chrysalis-agent-UID`` (the one directory an agent creates on its own, mode
    0700; ``CHRYSALIS_AGENT_SOCKET`` is not consulted)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "chrysalis-agent")
    return f"/tmp/chrysalis-agent-{os.getuid()}"


def default_socket() -> str:
    """``CHRYSALIS_AGENT_SOCKET``, else ``agent-TAG.sock`` (``installation_tag``) in the
    per-user directory (``default_directory``)."""
    named = os.environ.get(_SOCKET_ENV)
    if named:
        return named
    return os.path.join(default_directory(), f"agent-{installation_tag()}.sock")


# -- wire ---------------------------------------------------------------------------------------


def encode_request(argv: Sequence[str], cwd: str, env: dict[str, str]) -> bytes:
    """The request frame's payload (``ValueError`` for a NUL byte, which no OS string holds)."""
    fields = [str(len(argv)), *argv, cwd, *(f"{k}={v}" for k, v in env.items())]
    encoded = [os.fsencode(field) for field in fields]
    if any(b"\0" in field for field in encoded):
        raise ValueError("a field holds a NUL byte")
    return REQUEST_MAGIC + b"\0".join(encoded)


def decode_request(payload: bytes) -> tuple[list[str], str, dict[str, str]]:
    """``(argv, cwd, env)`` of a request payload; ``ValueError`` for anything malformed."""
    if not payload.startswith(REQUEST_MAGIC):
        raise ValueError("not a command request")
    fields = [os.fsdecode(field) for field in payload[len(REQUEST_MAGIC) :].split(b"\0")]
    if not fields[0].isdigit() or len(fields) < int(fields[0]) + 2:
        raise ValueError("malformed command request")
    count = int(fields[0])
    argv, cwd = fields[1 : count + 1], fields[count + 1]
    env: dict[str, str] = {}
    for item in fields[count + 2 :]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"malformed environment entry {item[:40]!r}")
        env[key] = value
    return argv, cwd, env


def encode_reply(kind: int, status: int, out: bytes = b"", err: bytes = b"") -> bytes:
    """A reply frame (with its length prefix)."""
    payload = _struct.pack(_REPLY_HEAD, kind, status, len(out)) + out + err
    if len(payload) > MAX_REPLY:
        raise ValueError(f"reply of {len(payload)} bytes is over {MAX_REPLY}")
    return _struct.pack("!I", len(payload)) + payload


def decode_reply(payload: bytes) -> tuple[int, int, bytes, bytes]:
    """``(kind, status, out, err)`` of a reply payload; ``ValueError`` when malformed."""
    if len(payload) < _REPLY_HEAD_SIZE:
        raise ValueError("short reply")
    kind, status, out_len = _struct.unpack(_REPLY_HEAD, payload[:_REPLY_HEAD_SIZE])
    body = payload[_REPLY_HEAD_SIZE:]
    if kind not in (DONE, REFUSED) or out_len > len(body):
        raise ValueError("malformed reply")
    return kind, status, body[:out_len], body[out_len:]


def _recv_exactly(sock: _socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def peer_uid(sock: _socket.socket) -> int:
    """The user ID of the process at the other end of a connected Unix socket
    (``SO_PEERCRED``): how the caller checks the agent, and the agent its callers."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _struct.calcsize("3i"))
    uid: int = _struct.unpack("3i", creds)[1]
    return uid


def _served_by_this_user(sock: _socket.socket, target: str) -> bool:
    """Whether the process listening on ``sock`` (connected to ``target``) runs as this user
    (``peer_uid``). Another user's socket at the agent's path (say one created in ``/tmp``
    before the agent's directory) must not get this command's environment and streams: a
    warning, and the command runs alone."""
    uid = peer_uid(sock)
    if uid == os.getuid():
        return True
    sys.stderr.write(
        f"chrysalis: warning: {target} is served by another user (uid {uid}), not an agent"
        " of yours: running the command alone\n"
    )
    sys.stderr.flush()
    return False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# -- the caller ---------------------------------------------------------------------------------


def run_via_agent(argv: Sequence[str], path: str | None = None) -> int | None:
    """Run ``chrysalis ARGV`` in the agent with this process's standard streams, directory and
    environment; its exit status, or ``None`` when no agent can take it (then run it here)."""
    if _in_child or os.environ.get(_NO_AGENT_ENV) == "1":
        return None
    target = path or default_socket()
    if not os.path.exists(target):
        return None
    try:
        payload = encode_request(list(argv), os.getcwd(), dict(os.environ))
    except (ValueError, OSError):
        return None
    if len(payload) > MAX_REQUEST:
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(target)
            if not _served_by_this_user(sock, target):
                return None  # nothing was sent: run it here
            frame = _struct.pack("!I", len(payload)) + payload
            fds = _struct.pack("3i", 0, 1, 2)
            sent = sock.sendmsg([frame], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            if sent < len(frame):
                sock.sendall(frame[sent:])
            (length,) = _struct.unpack("!I", _recv_exactly(sock, 4))
            if length > MAX_REPLY:
                return None
            kind, status, out, err = decode_reply(_recv_exactly(sock, length))
        except KeyboardInterrupt:
            return 130  # closing the connection interrupts the command in the agent
        except (OSError, ValueError):
            return None  # a stale socket, an agent that went away: run it here
        if kind != DONE:
            return None  # refused (busy, or its node lost its root): run it here
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            _write_all(1, out)
            _write_all(2, err)
        except BrokenPipeError:
            pass  # e.g. `chrysalis ls | head -1`: what was wanted was written
        return int(status)
    finally:
        sock.close()
