"""``chrysalis admin TOKEN ACTION`` (and ``chrysalis scale admin ...``): a client node joined at
TOKEN hands the parsed arguments to ``chrysalis.node._admin``, which needs chrysalis-sqlite
(above chrysalis-node): ``chrysalis.node._cli`` imports this module only for ``admin`` and
reports a missing chrysalis-sqlite as one line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Final, TextIO

from chrysalis.node._address import JoinToken
from chrysalis.node._admin import AdminError, run_admin
from chrysalis.node._cli import CliError
from chrysalis.node._cli_commands import EXPECTED_ERRORS as _NODE_ERRORS
from chrysalis.node._cli_commands import build_node, wait_connected

__all__ = ["EXPECTED_ERRORS", "admin"]

EXPECTED_ERRORS: Final = _NODE_ERRORS
"""Failures printed as one line: the node commands' (``AdminError`` becomes a ``CliError``)."""


def admin(args: argparse.Namespace, out: TextIO) -> int:
    """Run one ``admin`` action; its exit code."""
    return asyncio.run(_admin(args, out))


async def _admin(args: argparse.Namespace, out: TextIO) -> int:
    token: JoinToken = args.token
    node, carriers = build_node(args, "admin", token, [None])
    try:
        return await run_admin(
            args,
            out,
            sys.stderr,
            node,
            lambda: wait_connected(node, args.timeout, token.address),
        )
    except AdminError as exc:
        raise CliError(str(exc)) from exc
    finally:
        carriers.cleanup()
