"""A job host (``python -m monarch.job._host``, what ``ProcessJob`` execs where it cannot
fork, and ``python -m monarch.job._host_worker``, the worker loop ``SlurmJob``'s and
``KubernetesJob``'s hosts run) listens without importing what it does not need before a
client's first message (README, "Benchmark notes: SlurmJob"): ``monarch.actor``'s facade and
what starting workers needs come with the first ``Spawn``. It makes the stack's dataclasses and
regular expressions through the caches of ``chrysalis._startup``."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

#: Modules a worker loop does not import before it listens (each comes with its first use),
#: with why; the test below fails when one of them is back on the start-up path.
NOT_BEFORE_LISTENING = {
    "importlib.metadata": "entry points: only PluginRegistry.load_entry_points",
    "qh3": "the optional QUIC engine: only when chosen",
    "torch": "the program's",
    "numpy": "the program's",
    "cloudpickle": "the codec's fallback: on the first value that needs it",
    "opentelemetry": "the OpenTelemetry bridge: only when enabled",
    "http.server": "the admin endpoint: only when started",
    "chrysalis.node._cli": "the `chrysalis` CLI",
    "chrysalis.node._scale": "the scale tool",
    "chrysalis.sqlite": "replicated SQLite",
    "sqlite3": "replicated SQLite",
    "trio": "the trio adapters",
    "monarch.rdma": "a package of its own",
    "monarch.tensor": "a package of its own",
    "monarch.job._slurm": "the client's engines: not a host's",
    "monarch.job._kubernetes": "the client's engines: not a host's",
    "service_identity": "aioquic.tls's host name checks: deferred (chrysalis.quic._engines)",
    "OpenSSL": "aioquic.tls's chain checks: deferred, Chrysalis checks peers itself",
    "attr": "service_identity's",
    "idna": "service_identity's",
    "certifi": "aioquic.tls's default trust roots: never used by Chrysalis",
    "chrysalis.node.netns": "namespaces: only a host started with --netns",
    "kubernetes": "monarch.job's Kubernetes engine",
    "encodings.idna": "non-ASCII host names only: ASCII ones are resolved as bytes",
    "monarch.actor._runtime": "the actor runtime: the facade's, on the first Spawn",
    "monarch.actor._mesh": "meshes: the facade's, on the first Spawn",
    "monarch.actor._transport": "actor message transports: the facade's, on the first Spawn",
    "monarch.actor._hosts.attach_procs": "starting workers: on the first Spawn",
    "monarch.actor._hosts.groups": "worker groups: attach_procs', on the first Spawn",
    "monarch.actor._hosts.zygote": "the zygote: attach_procs', on the first Spawn",
    "monarch.actor._hosts.host_mesh": "a client's host meshes: the facade's",
    "monarch.actor._hosts.worker": "a worker's entry point: the facade's, for the zygote",
}

#: How each host entry point is started so that it prints its address on stdout once it listens
#: (``PORT``: a free UDP port; the Slurm worker loop takes a fixed one).
ENTRY_POINTS = {
    "monarch.job._host": ["--listen", "udp://127.0.0.1:0", "--ready-stdout"],
    "monarch.job._host_worker": [
        "--host",
        "127.0.0.1",
        "--port",
        "PORT",
        "--ready-file",
        "/dev/stdout",
    ],
}


def _free_udp_port() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _imported_before_listening(argv: list[str], env: dict[str, str]) -> tuple[str, set[str]]:
    """Run ``python -X importtime ARGV`` until it prints its address on stdout: (address, the
    modules it imported until then, from the import-time log on stderr)."""
    popen = subprocess.Popen(
        [sys.executable, "-X", "importtime", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert popen.stdout is not None
        ready = threading.Event()
        line: list[str] = []

        def read() -> None:
            assert popen.stdout is not None
            line.append(popen.stdout.readline())
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        assert ready.wait(120), "the worker loop did not report its address within 120 s"
    finally:
        popen.kill()
        _, err = popen.communicate(timeout=60)
    modules = {m.group(1) for m in re.finditer(r"\|\s*(\S+)\s*$", err, re.MULTILINE)}
    return line[0].strip(), modules


def _eager(modules: set[str], lazy: dict[str, str]) -> dict[str, str]:
    return {
        name: why
        for name, why in lazy.items()
        if name in modules or any(m.startswith(name + ".") for m in modules)
    }


@pytest.mark.parametrize("entry_point", sorted(ENTRY_POINTS))
def test_a_job_host_listens_without_the_lazy_modules_and_caches_compiled_code(
    tmp_path: Path, entry_point: str
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "CHRYSALIS_DEV_CA_DIR": str(tmp_path / "ca"),
        "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc"),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    options = [_free_udp_port() if o == "PORT" else o for o in ENTRY_POINTS[entry_point]]
    argv = ["-m", entry_point, *options]
    address, modules = _imported_before_listening(argv, env)
    assert address.startswith("udp://127.0.0.1:")
    assert {"monarch.actor._hosts.attach_daemon", "aioquic.tls"} <= modules  # the probe works
    assert _eager(modules, NOT_BEFORE_LISTENING) == {}
    cached = list((tmp_path / "pyc" / "chrysalis").glob("dataclass-code.*.bin"))
    assert len(cached) == 1
    assert cached[0].stat().st_size > 100_000
    cached = list((tmp_path / "pyc" / "chrysalis").glob("regex-code.*.bin"))
    assert len(cached) == 1
    assert cached[0].stat().st_size > 10_000
