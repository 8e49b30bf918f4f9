"""RDMA throughput: ``RDMABuffer.read_into`` / ``write_from`` between two processes, this
project's ``monarch.rdma`` (``shm`` and ``net`` providers) against the reference Monarch's.

Two roles in one file:

* ``--side``: runs under *any* implementation of ``monarch.actor`` + ``monarch.rdma`` (public API
  only, so it runs unchanged under the reference ``torchmonarch``): spawns one worker process
  whose actor owns CPU tensors of 1 MiB and 64 MiB and hands out ``RDMABuffer``s over them; the
  client reads each buffer into, and writes it from, a tensor of its own, and prints one JSON
  line of MB/s (size / median time of one operation) plus a plain single-threaded memcpy
  (``ctypes.memmove``) of the same size in the client, which the ``shm`` provider is compared
  with; and ``register_*_ms``: one call that makes a tensor in the owner and an ``RDMABuffer``
  over it (the registration, which moves a tensor into shared memory where ``shm`` serves).
  Sizes 1, 64 and 256 MiB; and ``action32_1MiB_MBps``: one ``RDMAAction`` of 32 reads of the
  1 MiB buffer, each into a tensor of its own, built once and submitted again and again (32 MiB
  per submission, the operations run in parallel).
* the driver (default): runs the sides ``ref`` (the reference interpreter, its TCP fallback here:
  no RDMA device), ``shm`` and the ``net`` provider (this project, with
  ``MONARCH_RDMA_DISABLE_SHM=1``) on each of its lanes: ``net`` (its choice between two
  processes of one host: the Unix data lane), ``net-tls`` (``MONARCH_RDMA_NET_LANE=tls``: the
  TLS data lane that serves across hosts, here over loopback) and ``net-msg``
  (``MONARCH_RDMA_NET_LANE=messages``: chunks as actor messages, the path under ``force_quic``),
  one after the other, ``--rounds`` times (``ref shm net net-tls net-msg ref ...``), plus the
  *floors* of the data lanes in each round: a raw Unix stream socket, a raw TLS 1.3 socket
  (Python's ``ssl``: what the TLS lane was before its sealed records) and a plain TCP loopback
  socket without encryption (what the TLS lane cannot beat) moving the same bytes between two
  processes (a ``recv_into`` loop into one buffer). It reports per figure the median MB/s of
  each side and the ratios ours / reference: the median of the per-round ratios (sides of one
  round ran back to back, on about the same load) and their min-max (the noise).

    python benchmarks/rdma_throughput.py                    # 3 rounds, Markdown table
    python benchmarks/rdma_throughput.py --rounds 5 --json out.json
    python benchmarks/rdma_throughput.py --side shm         # one side, one JSON line
    python benchmarks/rdma_throughput.py --sides ref,net     # only some sides (and the floors)

The driver needs the reference interpreter (``--ref``, default ``/work/ref/bin/python``) and
runs this project from the repository's ``packages/*/src`` (``--ours`` interpreter, default the
one running the driver). Every child has a timeout.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

SIZES = {"1MiB": 1 << 20, "64MiB": 64 << 20, "256MiB": 256 << 20}
REPEATS = {"1MiB": 40, "64MiB": 6, "256MiB": 3}
ACTION_OPS = 32  # reads of the 1 MiB buffer in one RDMAAction, each into its own tensor
ACTION_REPEATS = 10
WARMUP = 2
MAKES = 3
ROOT = Path(__file__).resolve().parent.parent
_memmove = ctypes.memmove  # the baseline: one plain single-threaded memcpy in the client
SIDES = ("ref", "shm", "net", "net-tls", "net-msg")
#: ``MONARCH_RDMA_NET_LANE`` of each side of the net provider.
NET_LANES = {"net": "auto", "net-tls": "tls", "net-msg": "messages"}
FLOOR_SIZES = {"1MiB": 1 << 20, "64MiB": 64 << 20}
FLOOR_REPEATS = {"1MiB": 40, "64MiB": 6}


try:  # the sides need these; the driver does not
    torch: Any = importlib.import_module("torch")  # untyped here: the lint env has no torch

    from monarch.actor import Actor, endpoint, this_host
    from monarch.rdma import RDMAAction, RDMABuffer
except ImportError:  # pragma: no cover (a driver without them on its path)
    _HAVE_MONARCH = False
else:
    _HAVE_MONARCH = True

    class Owner(Actor):
        """Owns the tensors and hands out buffers over them."""

        def __init__(self) -> None:
            self.keep: list[Any] = []

        @endpoint
        def make(self, nbytes: int) -> Any:
            tensor = torch.full((nbytes,), 7, dtype=torch.uint8)
            buffer = RDMABuffer(tensor)
            self.keep.append((tensor, buffer))
            return buffer


def _side() -> dict[str, Any]:
    if not _HAVE_MONARCH:
        raise RuntimeError("--side needs torch, monarch.actor and monarch.rdma importable")
    warnings.simplefilter("ignore")
    out: dict[str, Any] = {}
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        owner = procs.spawn("owner", Owner)
        small = None
        for label, nbytes in SIZES.items():
            made = []
            for _ in range(MAKES):  # the owner keeps them all (at most 3 x 256 MiB)
                started = time.perf_counter()
                buffer = owner.make.call_one(nbytes).get(timeout=120)
                made.append(time.perf_counter() - started)
            out[f"register_{label}_ms"] = statistics.median(made) * 1e3
            out["transport"] = getattr(buffer, "transport", buffer.backend)
            dst = torch.zeros(nbytes, dtype=torch.uint8)
            src = torch.full((nbytes,), 3, dtype=torch.uint8)
            for name, op in (
                ("read", lambda b=buffer, d=dst: b.read_into(d, timeout=120).get(timeout=120)),
                ("write", lambda b=buffer, s=src: b.write_from(s, timeout=120).get(timeout=120)),
                ("memcpy", lambda d=dst, s=src, n=nbytes: _memmove(d.data_ptr(), s.data_ptr(), n)),
            ):
                times = []
                for i in range(WARMUP + REPEATS[label]):
                    started = time.perf_counter()
                    op()
                    if i >= WARMUP:
                        times.append(time.perf_counter() - started)
                out[f"{name}_{label}_MBps"] = nbytes / statistics.median(times) / 1e6
            buffer.read_into(dst, timeout=120).get(timeout=120)
            if int(dst[0]) != 3 or int(dst[-1]) != 3:  # the writes landed, the read saw them
                raise RuntimeError(f"wrong data read back: {int(dst[0])}, {int(dst[-1])}")
            if small is None:
                small = buffer
            del dst, src
        assert small is not None
        out.update(_action(small))
    finally:
        procs.stop().get(timeout=120)
    return out


def _action(buffer: Any) -> dict[str, Any]:
    """MB/s of one ``RDMAAction`` of ``ACTION_OPS`` reads of ``buffer`` (1 MiB)."""
    nbytes = buffer.size()
    dsts = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(ACTION_OPS)]
    action = RDMAAction()
    for dst in dsts:
        action.read_remote(dst, buffer)
    times = []
    for i in range(WARMUP + ACTION_REPEATS):
        started = time.perf_counter()
        action.submit(timeout=120).get(timeout=120)
        if i >= WARMUP:
            times.append(time.perf_counter() - started)
    if any(int(dst[0]) != 3 for dst in dsts):
        raise RuntimeError("the action read wrong data")
    return {f"action{ACTION_OPS}_1MiB_MBps": ACTION_OPS * nbytes / statistics.median(times) / 1e6}


def _run_side(python: str, side: str, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("MONARCH_RDMA_DISABLE_SHM", None)
    env.pop("MONARCH_RDMA_NET_LANE", None)
    if side == "ref":
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = os.pathsep.join(
            str(p) for p in sorted((ROOT / "packages").glob("*/src"))
        )
        if side in NET_LANES:
            env["MONARCH_RDMA_DISABLE_SHM"] = "1"
            env["MONARCH_RDMA_NET_LANE"] = NET_LANES[side]
    result = subprocess.run(
        [python, str(Path(__file__).resolve()), "--side", side],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"side {side} failed ({result.returncode}): {result.stderr[-2000:]}")
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def _certificate(directory: str) -> str:
    """A throw-away self-signed certificate and key (PEM) for the raw TLS floor."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "floor")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    )  # fmt: skip
    path = os.path.join(directory, "floor.pem")
    Path(path).write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _floor(kind: str, nbytes: int, repeats: int) -> float:
    """MB/s of a raw ``kind`` (``unix``, ``tls``, ``tcp``: TCP loopback without encryption)
    stream socket moving ``nbytes`` from a forked process into one buffer of this one
    (``recv_into``), one request byte per transfer."""
    if kind == "unix":
        mine, theirs = socket.socketpair()
    else:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            mine = socket.create_connection(listener.getsockname())
            theirs, _ = listener.accept()
    with tempfile.TemporaryDirectory() as directory:
        pem = _certificate(directory) if kind == "tls" else ""
        pid = os.fork()
        if pid == 0:  # the sender
            try:
                mine.close()
                peer: socket.socket = theirs
                if kind == "tls":
                    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                    server.load_cert_chain(pem)
                    peer = server.wrap_socket(theirs, server_side=True)
                source = memoryview(bytearray(b"\x07" * nbytes))
                while peer.recv(1):
                    peer.sendall(source)
            finally:
                os._exit(0)
        theirs.close()
        conn: socket.socket = mine
        try:
            if kind == "tls":
                client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                client.check_hostname = False
                client.verify_mode = ssl.CERT_NONE
                conn = client.wrap_socket(mine)
            conn.settimeout(60)
            target = memoryview(bytearray(nbytes))
            times = []
            for i in range(WARMUP + repeats):
                started = time.perf_counter()
                conn.sendall(b"r")
                got = 0
                while got < nbytes:
                    got += conn.recv_into(target[got:], nbytes - got)
                if i >= WARMUP:
                    times.append(time.perf_counter() - started)
        finally:
            conn.close()
            os.waitpid(pid, 0)
    return nbytes / statistics.median(times) / 1e6


def _floors() -> dict[str, Any]:
    return {
        f"{kind}_{label}_MBps": _floor(kind, nbytes, FLOOR_REPEATS[label])
        for kind in ("unix", "tls", "tcp")
        for label, nbytes in FLOOR_SIZES.items()
    }


def _table(rounds: list[dict[str, dict[str, Any]]], sides: list[str]) -> str:
    ours = [side for side in sides if side != "ref"]
    figures = [k for k in rounds[0]["ref"] if k.endswith("_MBps") and not k.startswith("memcpy")]
    figures += [k for k in rounds[0]["ref"] if k.startswith("register_")]
    rows = [
        "| figure | " + " | ".join(["reference", *ours]) + " | "
        + " | ".join(f"{side} vs ref (min-max)" for side in ours) + " |",
        "|---|" + "---|" * (1 + 2 * len(ours)),
    ]  # fmt: skip
    for figure in figures:
        med = {s: statistics.median(r[s][figure] for r in rounds) for s in sides}
        unit = "MB/s" if figure.endswith("_MBps") else "ms"
        name = figure.removesuffix("_MBps").removesuffix("_ms")
        cells = [f"{name} ({unit})", *(f"{med[s]:,.1f}" for s in sides)]
        for side in ours:
            if unit == "ms":  # a time: the ratio is ref / ours, so above 1 is faster too
                ratios = [r["ref"][figure] / r[side][figure] for r in rounds]
            else:
                ratios = [r[side][figure] / r["ref"][figure] for r in rounds]
            cells.append(f"{statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f})")
        rows.append("| " + " | ".join(cells) + " |")
    blank = " |" * (2 * len(ours))

    def ratio_row(title: str, side: str, figure: str, base: str, baseline: str) -> None:
        ratios = [r[side][figure] / r[base][baseline] for r in rounds]
        rate = statistics.median(r[base][baseline] for r in rounds)
        rows.append(
            f"| {side} {title} / {baseline.removesuffix('_MBps')} ({rate:,.0f} MB/s) | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}){blank}"
        )

    if "shm" in sides:
        for label in SIZES:
            ratio_row(f"read {label}", "shm", f"read_{label}_MBps", "shm", f"memcpy_{label}_MBps")
    for side, kind in (("net", "unix"), ("net-tls", "tls"), ("net-tls", "tcp")):
        if side in sides:
            for label in FLOOR_SIZES:
                for op in ("read", "write"):
                    figure = f"{op}_{label}_MBps"
                    ratio_row(f"{op} {label}", side, figure, "floor", f"{kind}_{label}_MBps")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", help="run one side and print its JSON line")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ref", default="/work/ref/bin/python")
    parser.add_argument("--ours", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per side")
    parser.add_argument("--json", help="write every round's records here")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated, ref first")
    args = parser.parse_args()
    if args.side:
        print(json.dumps(_side()), flush=True)
        return
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    if not sides or sides[0] != "ref" or not set(sides) <= set(SIDES):
        parser.error(f"--sides: 'ref' first, then some of {SIDES[1:]}")
    rounds: list[dict[str, dict[str, Any]]] = []
    started_load = os.getloadavg()[0]
    for number in range(args.rounds):
        record = {}
        for side in sides:
            python = args.ref if side == "ref" else args.ours
            print(f"round {number + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
            record[side] = _run_side(python, side, args.timeout)
            expected = "net" if side in NET_LANES else side
            if side != "ref" and record[side]["transport"] != expected:
                raise RuntimeError(f"side {side} used {record[side]['transport']}, not {expected}")
        print(f"round {number + 1}/{args.rounds}: floors", file=sys.stderr, flush=True)
        record["floor"] = _floors()
        rounds.append(record)
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))
    print(
        f"load average {started_load:.1f} at the start; "
        f"{args.rounds} rounds ({' '.join(sides)} floors, back to back), {os.cpu_count()} CPUs, "
        f"load average "
        f"{os.getloadavg()[0]:.1f} at the end, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        "; speed-ups over the reference (above 1: ours is faster): median of the per-round "
        "ratios (min-max)\n"
    )
    print(_table(rounds, sides))


if __name__ == "__main__":
    main()
