"""Warm sessions of ``chrysalis agent``: one joined client node per token and settings, which
answers ``ls``, ``resolve`` and ``ping`` without a fork, an identity, a handshake or a join
per command (issue 22, item 5).

Why: forking a warm process per command still left every command its protocol work (a fresh
identity, the QUIC handshake and join, the enumeration, the leave: about 25 ms of CPU, most of
it the handshake). A node that stays joined answers an ``ls`` with one request to the root.

How: the agent (``chrysalis.node._agent``) forks one *session* process per key
(``session_key``: the token, the identity options, the QUIC idle timeout, the labels and the
environment variables a node reads) before any event loop runs, so the fork is as clean as a
command's. The session joins the tree at the token as a client node labelled
``client=chrysalis,command=agent,role=leaf`` (plus any ``--label``), and takes commands from
the agent over a ``SOCK_SEQPACKET`` pair: the command's arguments and the caller's connection
(``SCM_RIGHTS``). It answers on that connection with the command's output and exit status
(``chrysalis.node._agent_client``'s reply), and the caller prints them.

Fresh answers: every command asks the tree (``Consistency.REFRESH``: the root's namespace,
never the session's cache), as the command run alone would.

The root going away: each command's first exchange with the root (the enumeration, the PID
expansion) is bounded by ``WARM_ATTEMPT`` seconds (or ``--timeout`` if lower). If it does
not finish, or the parent link failed for good, the session answers ``REFUSED``: the caller
runs the command in its own process, exactly as without an agent (so an unreachable root is
reported as before: ``no parent answered at ...``), and the session leaves and exits; the
agent forks a new one for the next command, which joins the root again when it is back.
With ``--timeout`` below ``WARM_ATTEMPT`` the session reports the timeout itself
(``ls did not finish within T s``) and exits too.

Bounds: ``MAX_IN_FLIGHT`` commands at once (more are refused: they run in their own
process); a hand-off message is at most ``MAX_HANDOFF`` bytes; a session exits after
``SESSION_IDLE_EXIT`` seconds without a command, when the agent goes away (its end of the pair
closes) or on ``SIGTERM``/``SIGINT``, leaving the tree cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import socket
import struct
from collections.abc import Mapping
from typing import Final

from chrysalis.nameserver import ParentStatusKind
from chrysalis.node import _cli_commands as commands
from chrysalis.node._agent_client import DONE, REFUSED, encode_reply
from chrysalis.node._cli import _EXPECTED, CliError, build_parser, error_line
from chrysalis.node._node import Node
from chrysalis.quic import QuicTransportError

__all__ = [
    "MAX_HANDOFF",
    "MAX_IN_FLIGHT",
    "SESSION_IDLE_EXIT",
    "WARM_ATTEMPT",
    "WARM_COMMANDS",
    "run_session",
    "session_key",
]

WARM_COMMANDS: Final = frozenset({"ls", "resolve", "ping"})
"""Commands a session answers (``pipe`` is forked: it streams standard input)."""
WARM_ATTEMPT: Final = 2.0
"""Seconds a command's first exchange with the root may take in a session before the
command is handed back to its caller (see the module's documentation)."""
MAX_IN_FLIGHT: Final = 32
"""Commands one session runs at once."""
MAX_HANDOFF: Final = 64 * 1024
"""Bytes of one hand-off message from the agent (the command's arguments as JSON)."""
SESSION_IDLE_EXIT: Final = 120.0
"""Seconds a session waits for a command before it leaves the tree and exits."""
ENV_KEYS: Final = ("TMPDIR", "TEMP", "TMP", "HOME")
"""Environment variables (besides every ``CHRYSALIS_*``) that are part of a session's key:
those a node reads (the development CA's default place, temporary directories)."""
_log = logging.getLogger("chrysalis.agent")


class _Lost(Exception):
    """The session's node cannot reach its root: hand the command back to its caller."""


def session_key(args: argparse.Namespace, cwd: str, env: Mapping[str, str]) -> str | None:
    """The key of the session that may answer the parsed command ``args`` (sent from ``cwd``
    with ``env``), or ``None`` when it must run in a fork of its own: another command, a
    cluster URL naming several members, or a ``--log-level`` other than the default (its log
    belongs on the caller's stderr)."""
    if args.command not in WARM_COMMANDS or args.log_level != "warning":
        return None
    token = args.token
    if len(token.members) > 1:
        return None

    def where(path: object) -> str | None:
        return None if path is None else os.path.normpath(os.path.join(cwd, str(path)))

    record = {
        "token": str(token),
        "ca_dir": where(args.ca_dir),
        "identity_dir": where(args.identity_dir),
        "idle_timeout": args.idle_timeout,
        "labels": sorted(args.label),
        "env": sorted(
            (k, v) for k, v in env.items() if k.startswith("CHRYSALIS_") or k in ENV_KEYS
        ),
    }
    return json.dumps(record, sort_keys=True)


def run_session(ctrl: socket.socket, args: argparse.Namespace) -> int:
    """In the forked session process: join at ``args.token`` and answer the commands the
    agent hands over ``ctrl`` until idle, told to stop, or lost. Returns the exit status."""
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(name)s %(levelname)s %(message)s",
        force=True,  # not the level of the command that started the agent
    )
    return asyncio.run(_Session(ctrl, args).run())


class _Session:
    def __init__(self, ctrl: socket.socket, args: argparse.Namespace) -> None:
        self._ctrl = ctrl
        self._args = args
        self._parser = build_parser()
        self._stop = asyncio.Event()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._last = 0.0
        self._broken = False
        self._expected = (*_EXPECTED, *commands.EXPECTED_ERRORS)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stop.set)
        self._ctrl.setblocking(False)
        self._last = loop.time()
        node, carriers = commands.build_node(self._args, "agent", self._args.token, [None])
        try:
            async with node:
                loop.add_reader(self._ctrl.fileno(), self._take, node)
                try:
                    while not self._stop.is_set():
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stop.wait(), 1.0)
                        idle = loop.time() - self._last
                        if not self._in_flight and idle > SESSION_IDLE_EXIT:
                            _log.info("session idle for %.0f s: leaving", idle)
                            break
                finally:
                    loop.remove_reader(self._ctrl.fileno())
                    self._refuse_queued()
                    if self._in_flight:
                        await asyncio.gather(*self._in_flight, return_exceptions=True)
        finally:
            carriers.cleanup()
            self._ctrl.close()
        return 0

    def _receive(self) -> tuple[bytes, list[int]] | None:
        """One hand-off (its bytes and descriptors); ``None`` when none is queued. The
        agent gone (end of file) stops the session."""
        try:
            data, ancillary, _flags, _addr = self._ctrl.recvmsg(
                MAX_HANDOFF, socket.CMSG_SPACE(struct.calcsize("i"))
            )
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            data, ancillary = b"", []
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
        if not data:
            for fd in fds:
                os.close(fd)
            self._stop.set()  # the agent went away
            return None
        return data, fds

    def _take(self, node: Node) -> None:
        """The reader callback: start each queued command (or refuse it)."""
        while (handoff := self._receive()) is not None:
            data, fds = handoff
            conn = socket.socket(fileno=fds[0]) if len(fds) == 1 else None
            if conn is None:
                for fd in fds:
                    os.close(fd)
                continue
            self._last = asyncio.get_running_loop().time()
            if self._broken or self._stop.is_set() or len(self._in_flight) >= MAX_IN_FLIGHT:
                _refuse(conn)
                continue
            task = asyncio.create_task(self._answer(node, data, conn))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    def _refuse_queued(self) -> None:
        """Hand back every command still queued (their callers run them themselves)."""
        while (handoff := self._receive()) is not None:
            _data, fds = handoff
            for fd in fds:
                _refuse(socket.socket(fileno=fd))

    async def _answer(self, node: Node, data: bytes, conn: socket.socket) -> None:
        out, err = io.StringIO(), io.StringIO()
        kind, status = DONE, 0
        try:
            argv = json.loads(data)["argv"]
            with contextlib.redirect_stderr(err):
                args = self._parser.parse_args([str(word) for word in argv])
            status = await self._command(node, args, out)
        except _Lost as exc:
            _log.warning("handing a command back to its caller: %s", exc)
            kind = REFUSED
        except SystemExit:  # the agent parsed it before: not expected
            kind = REFUSED
        except Exception as exc:
            status = 1
            err.write(error_line(exc, self._expected) + "\n")
        try:
            reply = encode_reply(kind, status, out.getvalue().encode(), err.getvalue().encode())
        except ValueError as exc:  # over MAX_REPLY
            reply = encode_reply(DONE, 1, b"", f"chrysalis: error: {exc}\n".encode())
        try:
            conn.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(conn, reply), 30.0)
        except (OSError, TimeoutError):
            pass  # the caller went away
        finally:
            conn.close()

    async def _command(self, node: Node, args: argparse.Namespace, out: io.StringIO) -> int:
        """Run ``args`` on the warm node; ``_Lost`` when its first exchange with the root
        does not finish within ``WARM_ATTEMPT`` seconds (the session then ends)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + args.timeout
        manager = node.parent_manager
        if manager is not None and manager.status.kind in (
            ParentStatusKind.FAILED,
            ParentStatusKind.STOPPED,
        ):
            self._lose()
            raise _Lost(f"the parent link {manager.status.kind.value}")
        bound = min(args.timeout, WARM_ATTEMPT)
        try:
            async with asyncio.timeout(bound):
                await node.wait_connected()
                if args.command == "ping":
                    targets = await commands.ping_targets(node, args)
                else:
                    return await commands._client_command(node, args, out)
        except TimeoutError:
            self._lose()
            if args.timeout <= WARM_ATTEMPT:
                raise CliError(f"{args.command} did not finish within {args.timeout:g} s") from None
            raise _Lost(f"the root did not answer within {bound:g} s") from None
        except (QuicTransportError, ConnectionError) as exc:
            self._lose()
            raise _Lost(f"the root link failed: {exc}") from None
        return await commands.ping_report(node, args, out, targets, deadline)

    def _lose(self) -> None:
        """The node lost its root: refuse what comes, answer what runs, then leave."""
        self._broken = True
        self._stop.set()


def _refuse(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.settimeout(1.0)
        conn.sendall(encode_reply(REFUSED, 0))
    conn.close()
