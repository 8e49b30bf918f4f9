"""What ``import monarch.actor`` must leave unimported, and the start-up of the worker entry
points (README, "Start-up cost").

A worker process or a host's worker loop started fresh spends most of its start-up importing;
the modules below are on none of their paths (each is imported where it is first needed), so
an import of one of them at module level would put its cost back into every worker's start.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import monarch.actor

#: Modules no process pays for just by importing ``monarch.actor``, with where they belong.
LAZY = {
    "importlib.metadata": "entry points: only PluginRegistry.load_entry_points",
    "qh3": "the optional QUIC engine: only when chosen",
    "torch": "the program's: tensors are handled once it imports torch",
    "numpy": "the program's",
    "cloudpickle": "the codec's fallback: on the first value that needs it",
    "opentelemetry": "the OpenTelemetry bridge: only when enabled",
    "monarch.actor._mesh.otel_metrics": "the OpenTelemetry meter bridge",
    "monarch.actor._runtime.telemetry.top": "the `monarch top` CLI",
    "monarch.actor._runtime.telemetry.command": "the `monarch` CLI",
    "http.server": "the admin endpoint: only when started",
    "chrysalis.node._cli": "the `chrysalis` CLI",
    "chrysalis.node._agent": "the `chrysalis agent` CLI",
    "chrysalis.node._scale": "the scale tool",
    "chrysalis.node._forkserver": "the scale tool's fork server",
    "chrysalis.sqlite": "replicated SQLite",
    "sqlite3": "replicated SQLite",
    "trio": "the trio adapters",
    "monarch.rdma": "a package of its own",
    "monarch.job": "a package of its own",
    "monarch.tensor": "a package of its own",
}


#: Modules a worker loop does not import before it listens (each comes with its first use),
#: with why; the test below fails when one of them is back on the start-up path.
NOT_BEFORE_LISTENING = {
    **LAZY,
    "service_identity": "aioquic.tls's host name checks: deferred (chrysalis.quic._engines)",
    "OpenSSL": "aioquic.tls's chain checks: deferred, Chrysalis checks peers itself",
    "attr": "service_identity's",
    "idna": "service_identity's",
    "certifi": "aioquic.tls's default trust roots: never used by Chrysalis",
    "chrysalis.node.netns": "namespaces: only a host started with --netns",
    "kubernetes": "monarch.job's Kubernetes engine",
    "encodings.idna": "non-ASCII host names only: ASCII ones are resolved as bytes",
}


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


def _imported_by(code: str) -> set[str]:
    """``sys.modules`` of a fresh interpreter after running ``code``."""
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_importing_monarch_actor_leaves_the_lazy_modules_unimported() -> None:
    modules = _imported_by("import monarch.actor")
    assert "monarch.actor._hosts.attach_daemon" in modules  # the probe does import the stack
    eager = {
        name: why
        for name, why in LAZY.items()
        if name in modules or any(m.startswith(name + ".") for m in modules)
    }
    assert eager == {}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "-m", "monarch.actor._worker", "--label", "x"], "monarch.actor._worker"),
        (
            ["python", "-X", "importtime", "-u", "-m", "monarch.actor._attach"],
            "monarch.actor._attach",
        ),
        (["python", "-mmonarch.actor._attach"], "monarch.actor._attach"),
        (["python", "-c", "pass", "-m", "monarch.actor._worker"], None),
        (["python", "script.py", "-m", "monarch.actor._worker"], None),
        (["python", "-m"], None),
        (["python"], None),
    ],
)
def test_the_entry_point_is_read_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: str | None
) -> None:
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert monarch.actor._dash_m_module() == expected


def _collector_after_import(orig_argv: list[str] | None) -> tuple[bool, int]:
    """(collector enabled, objects frozen) in a fresh interpreter after ``import monarch.actor``
    under the command line ``orig_argv`` (None: its own, ``python -c``)."""
    set_argv = "" if orig_argv is None else f"sys.orig_argv[:] = {orig_argv!r}\n"
    report = "print(gc.isenabled(), gc.get_freeze_count())"
    code = f"import gc, sys\n{set_argv}import monarch.actor\n{report}"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    enabled, frozen = result.stdout.split()
    return enabled == "True", int(frozen)


def test_a_worker_entry_point_imports_with_the_collector_paused_then_frozen() -> None:
    enabled, frozen = _collector_after_import(["python", "-m", "monarch.actor._worker"])
    assert enabled
    assert frozen > 10_000  # the stack's modules, classes and functions
    enabled, frozen = _collector_after_import(["python", "-m", "monarch.actor._attach"])
    assert enabled
    assert frozen > 10_000


def test_any_other_program_keeps_its_collector_as_it_was() -> None:
    assert _collector_after_import(None) == (True, 0)
    assert _collector_after_import(["python", "-m", "my_program"]) == (True, 0)


def test_the_worker_loop_listens_without_the_lazy_modules_and_caches_dataclass_code(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "CHRYSALIS_DEV_CA_DIR": str(tmp_path / "ca"),
        "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc"),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = ["-m", "monarch.actor._attach", "--address", "udp://127.0.0.1:0"]
    address, modules = _imported_before_listening(argv, env)
    assert address.startswith("udp://127.0.0.1:")
    assert {"monarch.actor._hosts.attach_daemon", "aioquic.tls"} <= modules  # the probe works
    assert _eager(modules, NOT_BEFORE_LISTENING) == {}
    # the entry point made the stack's dataclasses through the code cache (chrysalis._startup)
    cached = list((tmp_path / "pyc" / "chrysalis").glob("dataclass-code.*.bin"))
    assert len(cached) == 1
    assert cached[0].stat().st_size > 100_000
