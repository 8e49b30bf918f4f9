"""The client's admin endpoint: a tiny HTTP server on loopback that serves the program's
mesh-wide metrics to Prometheus and its hosts, processes and actors to ``monarch top``.

Why: metrics and actor states live in every process (``_runtime.telemetry``); a Prometheus
server, or ``monarch top`` in another terminal, needs them from one place while the program
runs. The client already collects them on demand (``_mesh.telemetry.collect_telemetry``, which
every process answers on its runtime loop); this module serves what it collects:

- ``GET /metrics``: the metrics of the client's process and of every live proc mesh of the
  program (the client's, and those actors spawned inside workers), summed series by series
  (each OS process once; ``report.merge_reports``), in the Prometheus text format
  (``_runtime.telemetry.exposition``). No token (loopback only).
- ``GET /status`` (``Authorization: Bearer SECRET`` or ``?token=SECRET``): JSON of the hosts,
  processes and actors (``ActorStatus``: state, mailbox depth, messages received), the recent
  failures and the metrics totals, for ``monarch top`` (``_runtime.telemetry.top``).

Start it with ``start_admin(port=0)`` (returns the ``AdminServer``: ``url``, ``token``), or set
``admin_port`` (``MONARCH_ADMIN_PORT``; ``configure(admin_port=...)``) before the client starts:
the client then starts it, writes its token to ``MONARCH_ADMIN_TOKEN_FILE`` if set, and writes
``monarch top --token TOKEN`` on stderr. A token reads ``HOST:PORT:SECRET``.
Metrics are recorded only while they are on (``enable_telemetry(metrics=True)``); actor
states and failures always are. Proc meshes that actors spawned inside workers are listed too
(each process with its mesh and ``owner``: the label of the worker whose actor owns it;
``client`` for the client's own meshes): the client starts those processes for the workers
(``_hosts.nested``, which lists them through ``set_nested_meshes``). Every collection is
bounded by ``timeout`` (a mesh that does not answer is listed under ``unreachable``);
requests are served one at a time.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from monarch.actor._mesh.meshes import ProcMesh, _is_finished
from monarch.actor._mesh.telemetry import collect_telemetry
from monarch.actor._runtime import telemetry as _telemetry
from monarch.actor._runtime.client import add_start_hook, current_client
from monarch.actor._runtime.telemetry import exposition as _exposition
from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import report as _report
from monarch.actor._runtime.telemetry.report import TelemetryReport, TelemetryRequest
from monarch.config import _registry as _config

if TYPE_CHECKING:
    import http.server

__all__ = [
    "AdminServer",
    "admin_server",
    "collect_reports",
    "collect_status",
    "metrics_text",
    "set_nested_meshes",
    "start_admin",
    "stop_admin",
]

_log = logging.getLogger("monarch.actor.admin")

#: Version of the ``/status`` JSON schema.
STATUS_VERSION = 1
#: Proc meshes ``/status`` and ``/metrics`` ask at most (the newest).
MAX_MESHES = 256


#: What lists the proc meshes actors spawned inside workers, with their owner's label (the
#: hosts layer starts those processes for them and sets it: ``_hosts.nested``), or ``None``.
_nested_meshes: Callable[[], Sequence[tuple[ProcMesh, str]]] | None = None


def set_nested_meshes(source: Callable[[], Sequence[tuple[ProcMesh, str]]] | None) -> None:
    """Hook: ``source()`` lists the live proc meshes that actors spawned in worker processes
    (each with the label of the process that owns it), so ``/status``, ``/metrics`` and
    ``monarch top`` show them too; the hosts layer sets it (this layer cannot import it)."""
    global _nested_meshes
    _nested_meshes = source


def _live_proc_meshes() -> list[tuple[ProcMesh, str]]:
    """The live proc meshes to ask: those the client owns, then those actors spawned inside
    workers (at most ``MAX_MESHES``, the newest), each with its owner's label."""
    current = current_client()
    if current is None:
        return []
    meshes = [(m, "client") for m in list(current.root.owned) if isinstance(m, ProcMesh)]
    source = _nested_meshes
    if source is not None:
        try:
            meshes.extend(source())
        except Exception:  # a listing that failed leaves those meshes out of one poll
            _log.exception("could not list the proc meshes spawned inside workers")
    return [(m, owner) for m, owner in meshes if not _is_finished(m)][-MAX_MESHES:]


def _client_report(request: TelemetryRequest) -> TelemetryReport:
    current = current_client()
    runtime = current.runtime if current is not None else None
    label = runtime.label if runtime is not None else "client"
    actors = (
        [cell.status() for cell in list(runtime.cells.values())]
        if runtime is not None and request.actors
        else []
    )
    return _report.local_report(label, request, actors)


def _collect(
    timeout: float, actors: bool
) -> tuple[list[tuple[str, str, TelemetryReport]], list[str]]:
    """The client's report and every live proc mesh's (``_live_proc_meshes``), each tagged
    with its mesh name and its owner's label; the names of meshes none of whose processes
    answered."""
    request = TelemetryRequest(spans=False, metrics=True, actors=actors)
    reports = [("<client>", "", _client_report(request))]
    unreachable: list[str] = []
    deadline = time.monotonic() + timeout
    for mesh, owner in _live_proc_meshes():
        left = deadline - time.monotonic()
        try:
            got = collect_telemetry(mesh, max(0.05, left), spans=False, metrics=True, actors=actors)
        except Exception as exc:  # stopped meanwhile, not started, no answer
            _log.debug("mesh %s did not report: %s", mesh._name, exc)
            unreachable.append(mesh._name)
            continue
        reports.extend((mesh._name, owner, r) for r in got)
    return reports, unreachable


def collect_reports(timeout: float = 5.0) -> list[TelemetryReport]:
    """The metric reports of the client's process and of every live proc mesh of the program
    (the client's and those actors spawned in workers)."""
    return [r for _, _, r in _collect(timeout, actors=False)[0]]


def metrics_text(timeout: float = 5.0) -> str:
    """The program's metrics (client and every live owned proc mesh, summed) as Prometheus
    text."""
    merged = _report.merge_reports(collect_reports(timeout))
    return _exposition.prometheus_text(merged, _metrics.descriptions())


def collect_status(timeout: float = 5.0) -> dict[str, Any]:
    """What ``GET /status`` returns: the program's hosts, processes and actors (see the module
    doc)."""
    reports, unreachable = _collect(timeout, actors=True)
    hosts: dict[str, list[dict[str, Any]]] = {}
    failures: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    for mesh, owner, r in reports:
        hosts.setdefault(r.host, []).append(
            {
                "proc": r.proc,
                "os_pid": r.os_pid,
                "mesh": mesh,
                "owner": owner,
                "actors": [msgspec.to_builtins(a) for a in r.actors],
            }
        )
        for f in r.failures:  # simulated processes share their process's ring: once each
            if (r.os_pid, f.seq) not in seen:
                seen.add((r.os_pid, f.seq))
                failures.append(msgspec.to_builtins(f))
    failures.sort(key=lambda f: f["timestamp"])
    merged = _report.merge_reports([r for _, _, r in reports])
    totals: dict[str, float] = {}
    for name, points in merged.items():
        totals[name] = float(sum(p.count if p.kind == "histogram" else p.value for p in points))
    return {
        "version": STATUS_VERSION,
        "time": time.time(),
        "program": " ".join(sys.argv),
        "client_os_pid": os.getpid(),
        "telemetry": _telemetry.telemetry_state(),
        "hosts": [{"host": h, "procs": procs} for h, procs in sorted(hosts.items())],
        "failures": failures[-_report.MAX_RECENT_FAILURES :],
        "metrics": totals,
        "unreachable": unreachable,
    }


def _http_server(host: str, port: int, secret: str, timeout: float) -> http.server.HTTPServer:
    """The endpoint's HTTP server, bound to ``host:port``, not yet serving. ``http.server``
    (with ``http.client``, ``email`` and ``html``: about 20 ms of CPU) is imported here, not
    with this module: every process imports this module (the client's start hook is
    registered at import), few serve, and a cluster host's worker loop, whose start-up is on
    the critical path of a job's ``apply()``, never does."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "monarch-admin/1"

        def log_message(self, format: str, *args: Any) -> None:
            _log.debug("admin: " + format, *args)

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(body)

        def _authorized(self, query: dict[str, list[str]]) -> bool:
            given = self.headers.get("Authorization", "")
            token = given[7:] if given.startswith("Bearer ") else query.get("token", [""])[0]
            return hmac.compare_digest(token.encode(), secret.encode())

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            try:
                if url.path == "/metrics":
                    body = metrics_text(timeout).encode()
                    self._send(200, body, _exposition.CONTENT_TYPE)
                elif url.path == "/status":
                    if not self._authorized(query):
                        self._send(403, b"bad or missing token\n", "text/plain")
                        return
                    body = json.dumps(collect_status(timeout)).encode()
                    self._send(200, body, "application/json")
                else:
                    self._send(404, b"not found: try /metrics or /status\n", "text/plain")
            except Exception as exc:
                _log.exception("admin request %s failed", url.path)
                self._send(500, f"{type(exc).__name__}: {exc}\n".encode(), "text/plain")

    return http.server.HTTPServer((host, port), Handler)


class AdminServer:
    """A running admin endpoint: ``url`` (``http://HOST:PORT``), ``token``
    (``HOST:PORT:SECRET``, what ``monarch top --token`` takes), ``close()``."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._secret = secrets.token_hex(16)
        self._server = _http_server(host, port, self._secret, timeout)
        address = self._server.server_address
        self.host, self.port = str(address[0]), int(address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="monarch-admin", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def token(self) -> str:
        return f"{self.host}:{self.port}:{self._secret}"

    def close(self) -> None:
        """Stop serving (idempotent)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


_server: AdminServer | None = None
_server_lock = threading.Lock()


def start_admin(port: int = 0, host: str = "127.0.0.1", timeout: float = 5.0) -> AdminServer:
    """Start this process's admin endpoint on ``host:port`` (0: any free port), or return the
    one already running. ``timeout``: how long one request waits for the processes' answers."""
    global _server
    with _server_lock:
        if _server is None:
            _server = AdminServer(host, port, timeout)
            _log.info("admin endpoint at %s", _server.url)
        return _server


def admin_server() -> AdminServer | None:
    """The running admin endpoint, if any."""
    return _server


def stop_admin() -> None:
    """Stop the admin endpoint if it runs."""
    global _server
    with _server_lock:
        server, _server = _server, None
    if server is not None:
        server.close()


def _on_client_start(_: object) -> None:
    port = int(_config.get("admin_port"))
    # Worker processes must not start their own: they would inherit the environment.
    os.environ.pop("MONARCH_ADMIN_PORT", None)
    if port < 0:
        return
    server = start_admin(port)
    path = os.environ.pop("MONARCH_ADMIN_TOKEN_FILE", None)
    if path:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(server.token + "\n")
        os.replace(tmp, path)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"monarch admin endpoint: monarch top --token {server.token}\n")
        sys.stderr.flush()


add_start_hook(_on_client_start)
