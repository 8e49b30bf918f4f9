"""``ProcessJob``: every host of the job is a local worker-loop process (optionally each in a
network namespace of its own, so tests get hosts with their own addresses).

Why this shape: a host is ``monarch.job._host`` (the worker daemon of
``run_worker_loop_forever``) in a session of its own, forked from a zygote of the client (the
client's zygote mechanism of ``spawn_procs``: the host starts with every module imported, in
milliseconds; ``python -m monarch.job._host`` with exec where forking is impossible or another
interpreter is asked for); it listens on ``udp://127.0.0.1:0`` (in
a namespace: on the wildcard, advertising the namespace's routable address) and reports the
bound address on an inherited pipe, so ``apply()`` starts every host at once and waits (bounded)
on the pipes. The job records, per host, the pid, its start time and the address: plain data
that pickles, so a later client process (``job_load``/``state()``) checks the hosts still run
and attaches to the same worker loops with ``attach_to_workers``. ``kill()`` ends every host's
session (the worker processes too, whoever started them) and verifies they are gone. A job
that was never saved (``dump``/``dumps``, or ``state()`` with a ``cached_path``) is ended when
the client process that applied it exits, even by an unhandled fault: nobody could reconnect.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Final

from monarch.actor import HostMesh, attach_to_workers
from monarch.config import _registry as _config
from monarch.job._job import JobState, JobTrait
from monarch.job._procs import (
    READY_TIMEOUT,
    HostProcess,
    end_sessions,
    is_alive,
    process_start_time,
    start_host,
    wait_ready,
)
from monarch.job._spec import MeshSpec, host_keys, normalize_meshes

__all__ = ["ProcessJob"]

_log = logging.getLogger("monarch.job.process")

_HOST_MODULE: Final = "monarch.job._host"
#: The message of a worker loop still attached to a client that has just exited.
_BUSY: Final = "is attached to client"


class ProcessJob(JobTrait):
    """A job whose hosts are local worker-loop processes::

        job = ProcessJob({"trainers": 2, "dataloaders": 1})
        state = job.state(cached_path=None)
        state.trainers      # HostMesh of 2 hosts
        state.dataloaders   # HostMesh of 1 host

    Args:
        meshes: mesh name -> number of hosts, or ``MeshSpec(hosts, per_host)`` to give the
            mesh a per-host process layout (``JobState.layout(name)``).
        env: extra environment variables of the host processes (and their workers).
        namespaces: network namespaces (``ip netns``) to run the hosts in, host ``i`` in
            ``namespaces[i % len(namespaces)]``; each host then listens on the wildcard and
            reports its namespace's routable address. The caller creates and deletes them.
        listen: the ``udp://IP:0`` each host listens on (default ``udp://127.0.0.1:0``, or
            ``udp://0.0.0.0:0`` in namespaces).
        ca: the cluster CA (as ``run_worker_loop_forever``'s ``ca``).
        python_exe: the interpreter of the host processes (default: this one).
        start_timeout: seconds every host has to report its address.
    """

    def __init__(
        self,
        meshes: Mapping[str, int | MeshSpec],
        env: Mapping[str, str] | None = None,
        *,
        namespaces: Sequence[str] | None = None,
        listen: str | None = None,
        ca: str = "trust_all_connections",
        python_exe: str | None = None,
        start_timeout: float = READY_TIMEOUT,
    ) -> None:
        super().__init__()
        self._meshes = normalize_meshes(meshes)
        self._env = dict(env or {})
        if namespaces is not None:
            if isinstance(namespaces, str) or not namespaces:
                raise ValueError("namespaces is a non-empty sequence of namespace names")
            for name in namespaces:
                if not isinstance(name, str) or not name or "/" in name or name.startswith("-"):
                    raise ValueError(f"namespace name {name!r} is not usable with ip netns")
        self._namespaces = tuple(namespaces) if namespaces is not None else None
        self._listen = listen or ("udp://0.0.0.0:0" if namespaces else "udp://127.0.0.1:0")
        self._ca = ca
        self._python = python_exe or sys.executable
        if not start_timeout > 0:
            raise ValueError(f"start_timeout must be > 0, not {start_timeout!r}")
        self._start_timeout = float(start_timeout)
        self._hosts: list[HostProcess] = []
        self._tmpdir: str | None = None
        self._popens: list[subprocess.Popen[bytes]] = []  # not pickled: reaped by their waits
        self._saved = False  # dumped: a later client process may reconnect, so hosts outlive us

    # -- pickling: the allocation is plain data -------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_popens"] = []
        return state

    def dumps(self) -> bytes:
        self._saved = True
        return super().dumps()

    @property
    def hosts(self) -> list[HostProcess]:
        """The running hosts (key, pid, start time, address, namespace, log), in mesh order."""
        return list(self._hosts)

    # -- engine hooks ---------------------------------------------------------------------------
    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise RuntimeError("ProcessJob cannot run batch-mode scripts")
        self._tmpdir = tempfile.mkdtemp(prefix="monarch_process_job_")
        env = self._host_env()
        started: dict[str, tuple[Any, int]] = {}
        logs: dict[str, str] = {}
        zygote = self._start_zygote()
        try:
            for index, (_mesh, _rank, key) in enumerate(host_keys(self._meshes)):
                netns = (
                    self._namespaces[index % len(self._namespaces)] if self._namespaces else None
                )
                logs[key] = log = os.path.join(self._tmpdir, f"{key}.log")
                host_env = {**env, "MONARCH_JOB_HOST": key}
                options = ["--listen", self._listen, "--ca", self._ca]
                if zygote is not None:  # forked warm: no interpreter start, no imports
                    options += ["--forked", "--ready-stdout", "--log", log]
                    options += ["--netns", netns] if netns is not None else []
                    forked = zygote.spawn(options, target=f"{_HOST_MODULE}:main", env=host_env)
                    assert forked.stdout is not None
                    ready_fd = os.dup(forked.stdout.fileno())
                    forked.stdout.close()
                    forked.stdout = None
                    process: Any = forked
                else:
                    argv = [self._python, "-m", _HOST_MODULE, *options]
                    if netns is not None:
                        argv = ["ip", "netns", "exec", netns, *argv]
                    process, ready_fd = start_host(key, argv, host_env, log)
                    self._popens.append(process)
                started[key] = (process, ready_fd)
                # Recorded at once, so a failure below still ends what was started.
                start_time = process_start_time(process.pid) or 0
                self._hosts.append(HostProcess(key, process.pid, start_time, "", netns, log))
            addresses = wait_ready(started, self._start_timeout, logs)
        except BaseException:
            self._end_hosts()  # Ctrl-C during start-up too: nothing started may outlive it
            raise
        finally:
            if zygote is not None:  # it exits; the hosts (sessions of their own) live on
                zygote.close()
        self._hosts = [
            HostProcess(h.key, h.pid, h.start_time, addresses[h.key], h.netns, h.log)
            for h in self._hosts
        ]
        for host in self._hosts:
            _log.info("ProcessJob host %s: pid %d at %s", host.key, host.pid, host.address)
        atexit.register(_end_unsaved, weakref.ref(self))

    def _start_zygote(self) -> Any:
        """A zygote forked from this client with the host module imported, so every host is a
        fork that starts at once (None where forking is impossible or another interpreter is
        asked for: hosts are then started with exec)."""
        if self._python != sys.executable:
            return None
        try:
            import monarch.job._host  # noqa: F401  (warm in the zygote)
            from monarch.actor._hosts.zygote import Zygote, ZygoteUnavailableError
        except ImportError:
            return None
        try:
            return Zygote.start()
        except (ZygoteUnavailableError, OSError) as exc:
            _log.info("no zygote for the job's hosts (%s): starting them with exec", exc)
            return None

    def _host_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Actor classes travel by reference: the hosts' workers import them from the client's
        # path, as local workers do.
        paths = [p for p in sys.path if p]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.update(self._env)
        return env

    def _state(self) -> JobState:
        dead = [h.key for h in self._hosts if not is_alive(h.pid, h.start_time)]
        if dead:
            raise RuntimeError(f"lost the worker processes of hosts {', '.join(dead)}")
        workers: dict[str, list[str]] = {name: [] for name in self._meshes}
        for (name, _rank, _key), host in zip(host_keys(self._meshes), self._hosts, strict=True):
            workers[name].append(host.address)
        meshes = {name: self._attach(name, addresses) for name, addresses in workers.items()}
        return JobState(meshes, {name: dict(spec.per_host) for name, spec in self._meshes.items()})

    def _attach(self, name: str, workers: list[str]) -> HostMesh:
        """``attach_to_workers``, waiting (bounded) for worker loops still attached to a client
        process that has just exited (they notice within the orphan timeout)."""
        deadline = time.monotonic() + 3 * float(_config.get("mesh_orphan_timeout")) + 5
        while True:
            try:
                return attach_to_workers(workers=workers, ca=self._ca, name=name)
            except RuntimeError as exc:
                if _BUSY not in str(exc) or time.monotonic() > deadline:
                    raise
                _log.info("hosts of %s still serve the previous client: retrying", name)
                time.sleep(0.5)

    def can_run(self, spec: JobTrait) -> bool:
        return (
            isinstance(spec, ProcessJob)
            and spec._meshes == self._meshes
            and spec._namespaces == self._namespaces
            and bool(self._hosts)
            and all(is_alive(h.pid, h.start_time) for h in self._hosts)
        )

    def _kill(self) -> None:
        left = self._end_hosts()
        if left:
            raise RuntimeError(f"ProcessJob.kill(): processes {left} did not exit after SIGKILL")

    def _end_hosts(self) -> list[int]:
        hosts, self._hosts = self._hosts, []
        left = end_sessions(hosts) if hosts else []
        for popen in self._popens:  # our own children: reap them
            try:
                popen.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                _log.warning("host process %d is still running", popen.pid)
        self._popens = []
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        return left


def _end_unsaved(ref: weakref.ref[ProcessJob]) -> None:
    """At the exit of the client process that applied it: end a job nobody saved (no later
    process can reconnect to it, so its hosts would only leak). A saved job's hosts live on
    until some client kills it."""
    job = ref()
    if job is not None and not job._saved and job._hosts:
        _log.info("ending the unsaved ProcessJob's %d hosts at exit", len(job._hosts))
        job._end_hosts()
