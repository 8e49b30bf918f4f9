"""Candidate data paths for the ``net`` provider's TLS data lane, side by side in one run.

Each moves ``nbytes`` from a forked sender process into one buffer of this process over TCP
loopback, on request (one small request per transfer, as the lane does), authenticated the
lane's way (the sender's throw-away certificate pinned by its SHA-256 on the receiving side):

* ``ssl``: today's lane: an ``SSLSocket``, ``sendall`` of the source and a ``recv_into`` loop
  (one 16 KiB TLS record per call);
* ``bio``: still TLS 1.3, driven through ``ssl.MemoryBIO`` and ``SSLObject``: the receiver
  ``recv_into``s up to 4 MiB of the socket at once, feeds it to the incoming BIO and
  ``SSLObject.read``s into the destination in a loop; the sender ``SSLObject.write``s 4 MiB at a
  time and ``sendall``s the outgoing BIO's bytes;
* ``tcp``: no encryption at all, a plain TCP socket (what no secure path can beat here);
* ``seal``: TLS 1.3 for the handshake and one fresh AES-256-GCM key per direction, then
  sealed records of 256 KiB over the same TCP connection
  (``monarch.rdma._netseal``: ``encrypt_into`` / ``decrypt_into``, a record verified before it
  is copied into the destination).

Modes run interleaved (``ssl bio seal tcp ssl ...``) for ``--rounds`` rounds; the table
gives per mode the median MB/s (size / median time of one transfer) and the median ratio to
``ssl`` of the same round (min-max).

    python benchmarks/tls_datapath.py --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _src in sorted((ROOT / "packages").glob("*/src")):
    if str(_src) not in sys.path:
        sys.path.insert(0, str(_src))

from monarch.rdma._netlane import _make_certificate  # noqa: E402
from monarch.rdma._netseal import (  # noqa: E402
    client_handshake,
    server_handshake,
)

SIZES = {"1MiB": 1 << 20, "64MiB": 64 << 20}
REPEATS = {"1MiB": 40, "64MiB": 6}
WARMUP = 2
MODES = ("ssl", "bio", "seal", "tcp")
BIO_READ = 4 << 20


def _certificate(directory: str) -> tuple[str, bytes]:
    """The lane's own self-signed certificate and key, written as PEM: (path, SHA-256 of DER)."""
    pem, der = _make_certificate()
    path = os.path.join(directory, "candidate.pem")
    Path(path).write_bytes(pem)
    return path, hashlib.sha256(der).digest()


def _contexts(pem: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_3
    server.num_tickets = 0
    server.load_cert_chain(pem)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.minimum_version = ssl.TLSVersion.TLSv1_3
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    return server, client


def _pinned(der: bytes | None, fingerprint: bytes) -> None:
    if hashlib.sha256(der or b"").digest() != fingerprint:
        raise ssl.SSLError("not the pinned certificate")


class _Bio:
    """TLS 1.3 through memory BIOs over a blocking socket, with large socket reads."""

    def __init__(self, raw: socket.socket, context: ssl.SSLContext, server: bool) -> None:
        self.raw = raw
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=server)
        self.scratch = bytearray(BIO_READ)
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._feed()
        self._flush()

    def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.raw.sendall(data)

    def _feed(self) -> None:
        k = self.raw.recv_into(self.scratch)
        if k == 0:
            raise ConnectionResetError("closed")
        self.incoming.write(memoryview(self.scratch)[:k])

    def close(self) -> None:
        self.raw.close()

    def sendall(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        for start in range(0, view.nbytes, BIO_READ):
            self.obj.write(view[start : start + BIO_READ])
            self._flush()

    def recv_into(self, view: memoryview, n: int) -> int:
        while True:
            try:
                got: int = self.obj.read(n, view)  # type: ignore[assignment]
                return got
            except ssl.SSLWantReadError:
                self._feed()

    def recv_all(self, view: memoryview) -> None:
        got, n = 0, view.nbytes
        while got < n:
            try:
                while got < n:
                    got += self.obj.read(n - got, view[got:])  # type: ignore[operator]
            except ssl.SSLWantReadError:
                self._feed()


def _sender(mode: str, sock: socket.socket, server: ssl.SSLContext, nbytes: int) -> None:
    source = memoryview(bytearray(b"\x07" * nbytes))
    request = memoryview(bytearray(1))
    if mode == "tcp":
        peer: Any = sock
    elif mode == "ssl":
        peer = server.wrap_socket(sock, server_side=True)
    elif mode == "bio":
        peer = _Bio(sock, server, True)
    else:
        peer = server_handshake(sock, server)
    while peer.recv_into(request, 1):
        peer.sendall(source)


def _receiver(mode: str, sock: socket.socket, client: ssl.SSLContext, fingerprint: bytes,
              nbytes: int, repeats: int) -> float:  # fmt: skip
    conn: Any
    if mode == "tcp":
        conn = sock
    elif mode == "ssl":
        conn = client.wrap_socket(sock)
        _pinned(conn.getpeercert(binary_form=True), fingerprint)
    elif mode == "bio":
        conn = _Bio(sock, client, False)
        _pinned(conn.obj.getpeercert(binary_form=True), fingerprint)
    else:
        conn = client_handshake(sock, client, fingerprint)
    target = memoryview(bytearray(nbytes))
    times = []
    for i in range(WARMUP + repeats):
        started = time.perf_counter()
        conn.sendall(b"r")
        if mode == "bio":
            conn.recv_all(target)
        else:
            got = 0
            while got < nbytes:
                got += conn.recv_into(target[got:], nbytes - got)
        if i >= WARMUP:
            times.append(time.perf_counter() - started)
    if target[0] != 7 or target[-1] != 7:
        raise RuntimeError(f"{mode}: wrong bytes")
    conn.close()
    return nbytes / statistics.median(times) / 1e6


def _one(mode: str, nbytes: int, repeats: int, pem: str, fingerprint: bytes) -> float:
    server, client = _contexts(pem)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        mine = socket.create_connection(listener.getsockname())
        theirs, _ = listener.accept()
    for s in (mine, theirs):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(60)
    pid = os.fork()
    if pid == 0:
        try:
            mine.close()
            _sender(mode, theirs, server, nbytes)
        finally:
            os._exit(0)
    theirs.close()
    try:
        return _receiver(mode, mine, client, fingerprint, nbytes, repeats)
    finally:
        mine.close()
        os.waitpid(pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or modes[0] != "ssl" or not set(modes) <= set(MODES):
        parser.error(f"--modes: 'ssl' first, then some of {MODES[1:]}")
    start_load = os.getloadavg()[0]
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as directory:
        pem, fingerprint = _certificate(directory)
        for number in range(args.rounds):
            record: dict[str, dict[str, float]] = {}
            for label, nbytes in SIZES.items():
                for mode in modes:
                    print(f"round {number + 1}: {mode} {label}", file=sys.stderr, flush=True)
                    rate = _one(mode, nbytes, REPEATS[label], pem, fingerprint)
                    record.setdefault(label, {})[mode] = rate
            rounds.append(record)
    print(
        f"load average {start_load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
        f"{args.rounds} rounds, {os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )
    print("| size | " + " | ".join(f"{m} (MB/s)" for m in modes) + " | "
          + " | ".join(f"{m} / ssl" for m in modes[1:]) + " |")  # fmt: skip
    print("|---|" + "---|" * (2 * len(modes) - 1))
    for label in SIZES:
        cells = [label]
        cells += [f"{statistics.median(r[label][m] for r in rounds):,.0f}" for m in modes]
        for mode in modes[1:]:
            ratios = [r[label][mode] / r[label]["ssl"] for r in rounds]
            cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
