"""A FAKE Kubernetes API server for the tests: no real cluster or container engine can run here.

It serves, over HTTP on loopback, only what ``KubernetesJob`` uses through the official client:
create/get/list/watch/delete of pods and create/delete of services in a namespace, with label
selectors of the ``k=v,k2=v2`` form, 404/409 ``Status`` errors, and watch streams (chunked,
one JSON event a line, ``timeoutSeconds`` honoured). Every request is recorded
(``requests``).

Its "kubelet" runs a pod's ``worker`` container as a LOCAL PROCESS: the container's command
(``python`` becomes this interpreter), this process's environment plus the container's
(downward-API ``status.podIP`` and ``metadata.name`` resolved), with the pod's IP a loopback
address of its own (``127.0.0.20`` and up), so several pods listen on the same port as real pods
do. A pod turns Running once its process started, Ready once its exec readiness probe passes
(run every 0.1 s; no probe: at once), and Failed when the process exits. Its pods share this
machine's file system, so each gets its own ``$MONARCH_READY_FILE`` (the path is rewritten in
the probe too).
Two images misbehave on purpose: ``fake/never-ready`` stays Pending, ``fake/crash`` exits 3 at
once. Deleting a pod SIGTERMs its process (SIGKILL after 5 s) and reaps it.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import itertools
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

MAX_REQUESTS = 10_000
MAX_EVENTS = 10_000
#: Seconds between the fake kubelet's readiness probes.
PROBE_PERIOD = 0.1


@dataclass
class FakePod:
    body: dict[str, Any]
    process: subprocess.Popen[bytes] | None = None
    deleted: bool = False

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


@dataclass
class FakeKube:
    """The fake API server and kubelet; ``url`` is its address, ``kubeconfig(path)`` writes a
    kubeconfig file for it."""

    server: ThreadingHTTPServer = field(init=False)
    pods: dict[tuple[str, str], FakePod] = field(default_factory=dict)
    services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    events: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    version: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    event_seq: Iterator[int] = field(default_factory=itertools.count)
    next_ip: Iterator[int] = field(default_factory=lambda: itertools.count(20))
    stopping: bool = False
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fake-kube-")))
    #: Serve HTTPS with this (certificate, key) pair (``self_signed``), as a real API server
    #: does for in-cluster clients; None: plain HTTP.
    tls: tuple[Path, Path] | None = None
    #: The ``Authorization`` header of every request (bounded like ``requests``).
    authorizations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        fake = self

        class Handler(_Handler):
            kube = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, name="fake-kube", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(  # JSON is YAML
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def pod_pids(self) -> list[int]:
        with self.changed:
            return [p.process.pid for p in self.pods.values() if p.process is not None]

    def close(self) -> None:
        with self.changed:
            self.stopping = True
            pods = list(self.pods.values())
            self.changed.notify_all()
        for pod in pods:
            _stop(pod)
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- state changes (hold ``changed``) ----------------------------------------------------------
    def _emit(self, namespace: str, kind: str, body: dict[str, Any]) -> None:
        body["metadata"]["resourceVersion"] = str(next(self.version))
        seq = next(self.event_seq)
        self.events.append((seq, namespace, kind, json.loads(json.dumps(body))))
        del self.events[: max(0, len(self.events) - MAX_EVENTS)]
        self.changed.notify_all()

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        ip = f"127.0.0.{next(self.next_ip)}"
        body["metadata"].update(namespace=namespace, uid=f"uid-{name}")
        body["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
        pod = FakePod(body)
        self.pods[(namespace, name)] = pod
        self._emit(namespace, "ADDED", body)
        container = body["spec"]["containers"][0]
        if container.get("image") != "fake/never-ready":
            threading.Thread(
                target=self._kubelet, args=(namespace, pod, ip, container), daemon=True
            ).start()
        return body

    def _kubelet(self, namespace: str, pod: FakePod, ip: str, container: dict[str, Any]) -> None:
        command = list(container.get("command") or []) + list(container.get("args") or [])
        if container.get("image") == "fake/crash":
            command = ["python", "-c", "import sys; sys.exit(3)"]
        if command and command[0] == "python":
            command[0] = sys.executable
        env = dict(os.environ)
        for var in container.get("env") or []:
            source = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            value = {"status.podIP": ip, "metadata.name": pod.name}.get(
                source or "", var.get("value")
            )
            env[var["name"]] = str(value or "")
        probe = list(
            ((container.get("readinessProbe") or {}).get("exec") or {}).get("command") or []
        )
        private = env.get("MONARCH_READY_FILE")
        if private:  # the fake's pods share one file system: give each its own readiness file
            own = str(self.root / f"{namespace}.{pod.name}.{ip}.ready")
            probe = [own if arg == private else arg for arg in probe]
            env["MONARCH_READY_FILE"] = own
        with self.changed:
            if pod.deleted or self.stopping:
                return
            pod.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
            self._set_running(namespace, pod, ip, container, ready=not probe)
        process = pod.process
        if probe:  # the kubelet runs the exec probe until it passes (or the container exits)
            while process.poll() is None and not pod.deleted:
                if subprocess.run(probe, env=env, check=False).returncode == 0:
                    with self.changed:
                        if not pod.deleted:
                            self._set_running(namespace, pod, ip, container, ready=True)
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(PROBE_PERIOD)
        code = process.wait()
        with self.changed:
            if _gone(pod):  # deleted while it ran: the DELETED event says it all
                return
            pod.body["status"] = {
                "phase": "Failed" if code else "Succeeded",
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": container.get("name", "worker"), "ready": False,
                                       "state": {"terminated": {"exitCode": code,
                                                                "reason": "Error"}},
                                       "restartCount": 0, "image": container.get("image", ""),
                                       "imageID": ""}],
            }  # fmt: skip
            self._emit(namespace, "MODIFIED", pod.body)

    def _set_running(
        self, namespace: str, pod: FakePod, ip: str, container: dict[str, Any], ready: bool
    ) -> None:
        flag = "True" if ready else "False"
        pod.body["status"] = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": flag}],
            "containerStatuses": [{"name": container.get("name", "worker"), "ready": ready,
                                   "state": {"running": {}}, "restartCount": 0,
                                   "image": container.get("image", ""), "imageID": ""}],
        }  # fmt: skip
        self._emit(namespace, "MODIFIED", pod.body)

    def delete_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.changed:
            pod = self.pods.pop((namespace, name), None)
            if pod is None:
                return None
            pod.deleted = True
        _stop(pod)
        with self.changed:
            self._emit(namespace, "DELETED", pod.body)
        return pod.body


def _gone(pod: FakePod) -> bool:
    return pod.deleted


def _stop(pod: FakePod) -> None:
    process = pod.process
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def _matches(body: dict[str, Any], selector: str | None) -> bool:
    labels = body["metadata"].get("labels") or {}
    for term in (selector or "").split(","):
        if not term:
            continue
        key, eq, value = term.partition("=")
        if not eq:
            if key not in labels:
                return False
        elif labels.get(key) != value:
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    kube: FakeKube
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "message": message, "reason": reason, "code": code})  # fmt: skip

    def _route(self) -> tuple[str, str | None, str | None, dict[str, list[str]]]:
        url = urlparse(self.path)
        with self.kube.changed:
            if len(self.kube.requests) < MAX_REQUESTS:
                self.kube.requests.append((self.command, url.path))
                self.kube.authorizations.append(self.headers.get("Authorization") or "")
        parts = url.path.strip("/").split("/")
        # api/v1/namespaces/NS/KIND[/NAME]
        if len(parts) < 5 or parts[:3] != ["api", "v1", "namespaces"]:
            return "", None, None, {}
        return parts[3], parts[4], (parts[5] if len(parts) > 5 else None), parse_qs(url.query)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        body: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
        return body

    def do_POST(self) -> None:
        namespace, kind, _, _ = self._route()
        body = self._body()
        key = (namespace, body.get("metadata", {}).get("name", ""))
        with self.kube.changed:
            if kind == "pods":
                if key in self.kube.pods:
                    return self._status(409, "AlreadyExists", f'pods "{key[1]}" already exists')
                return self._send(201, self.kube.create_pod(namespace, body))
            if kind == "services":
                if key in self.kube.services:
                    return self._status(409, "AlreadyExists", f'services "{key[1]}" already exists')
                body["metadata"]["namespace"] = namespace
                self.kube.services[key] = body
                return self._send(201, body)
        return self._status(404, "NotFound", f"the fake has no {self.path}")

    def do_DELETE(self) -> None:
        namespace, kind, name, _ = self._route()
        if kind == "pods" and name:
            body = self.kube.delete_pod(namespace, name)
            if body is None:
                return self._status(404, "NotFound", f'pods "{name}" not found')
            return self._send(200, body)
        if kind == "services" and name:
            with self.kube.changed:
                service = self.kube.services.pop((namespace, name), None)
            if service is None:
                return self._status(404, "NotFound", f'services "{name}" not found')
            return self._send(200, service)
        return self._status(404, "NotFound", f"the fake has no {self.path}")

    def do_GET(self) -> None:
        namespace, kind, name, query = self._route()
        if kind == "services" and name:
            with self.kube.changed:
                service = self.kube.services.get((namespace, name))
            if service is None:
                return self._status(404, "NotFound", f'services "{name}" not found')
            return self._send(200, service)
        if kind != "pods":
            return self._status(404, "NotFound", f"the fake has no {self.path}")
        if name:
            with self.kube.changed:
                pod = self.kube.pods.get((namespace, name))
            if pod is None:
                return self._status(404, "NotFound", f'pods "{name}" not found')
            return self._send(200, pod.body)
        selector = query.get("labelSelector", [None])[0]
        if query.get("watch", ["false"])[0] in ("true", "1"):
            return self._watch(namespace, selector, query.get("timeoutSeconds", [None])[0])
        with self.kube.changed:
            items = [p.body for (ns, _), p in self.kube.pods.items()
                     if ns == namespace and _matches(p.body, selector)]  # fmt: skip
            version = str(self.kube.events[-1][0] + 1 if self.kube.events else 0)
        return self._send(200, {"kind": "PodList", "apiVersion": "v1",
                         "metadata": {"resourceVersion": version}, "items": items})  # fmt: skip

    def _watch(self, namespace: str, selector: str | None, timeout: str | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + (float(timeout) if timeout else 3600.0)

        def chunk(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        with self.kube.changed:
            pending = [{"type": "ADDED", "object": p.body} for (ns, _), p in self.kube.pods.items()
                       if ns == namespace and _matches(p.body, selector)]  # fmt: skip
            pending = json.loads(json.dumps(pending))
            seen = self.kube.events[-1][0] + 1 if self.kube.events else 0
        with contextlib.suppress(OSError):
            while True:
                for event in pending:
                    chunk(json.dumps(event).encode() + b"\n")
                with self.kube.changed:
                    while True:
                        fresh = [e for e in self.kube.events if e[0] >= seen]
                        left = deadline - time.monotonic()
                        if fresh or left <= 0 or self.kube.stopping:
                            break
                        self.kube.changed.wait(left)
                    if not fresh:
                        break
                    seen = fresh[-1][0] + 1
                    pending = [{"type": kind, "object": body} for _, ns, kind, body in fresh
                               if ns == namespace and _matches(body, selector)]  # fmt: skip
            chunk(b"")


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``127.0.0.1`` and its key, written into ``folder``: the
    HTTPS fake's certificate and, for its clients, the CA file to trust."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kube")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "server.crt", folder / "server.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
