"""A real, throwaway Slurm cluster on this machine for the tests: one ``slurmctld`` and two
``slurmd`` (node names ``n1`` and ``n2``, addresses ``127.0.0.2`` and ``127.0.0.3``), with a
private ``munged`` for authentication. Everything lives in one temporary directory; nothing
under ``/etc`` is read or written (the daemons and the Slurm clients find the configuration
through ``$SLURM_CONF``, munge through ``AuthInfo=socket=...``).

Why this shape:

- Debian's ``slurm-wlm`` is built with multiple-slurmd support, so one machine runs several
  ``slurmd -N NAME``, each with its own ``Port``; each node gets its own loopback address
  (``NodeAddr``), so programs started on the nodes can listen on the same port per node as on a
  real cluster.
- The packages come from Debian (``apt-get install --no-install-recommends slurmd slurmctld
  slurm-client munge``: eight packages, about 10 s with the package lists present) when the
  binaries are missing and we are root; ``SlurmUnavailable`` says why a cluster cannot start
  (not root, no ``apt-get``, no network, a daemon that did not come up) so tests skip with
  that reason.
- The daemons run in the foreground as our children (``-D``/``-F``): ``stop`` terminates and
  reaps them, then removes the directory. Waits are bounded and event-driven where possible
  (``sinfo`` is polled with a short interval only while the nodes register: Slurm has no
  notification for that).

Run by hand: ``python _slurm_cluster.py`` starts a cluster, prints its ``SLURM_CONF`` and the
timings, and stops it on Enter.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

#: The Debian packages that provide the daemons and the client commands (nothing else).
PACKAGES: Final = ("slurmd", "slurmctld", "slurm-client", "munge")
#: The binaries the cluster needs.
BINARIES: Final = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo")
#: The node names and their loopback addresses.
NODES: Final = (("n1", "127.0.0.2"), ("n2", "127.0.0.3"))
INSTALL_TIMEOUT: Final = 300.0
START_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 10.0


class SlurmUnavailable(RuntimeError):
    """A Slurm cluster cannot run here; the message says why (a test skips with it)."""


@dataclass
class SlurmCluster:
    """A running cluster: ``env`` holds ``SLURM_CONF`` for the client commands."""

    directory: Path
    conf: Path
    nodes: tuple[tuple[str, str], ...]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30.0) -> str:
        """Run a Slurm client command against this cluster; its stdout (``CalledProcessError``
        with stderr on failure)."""
        done = subprocess.run(
            argv,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
        return done.stdout

    def logs(self) -> str:
        """The tail of every daemon log (for a failure's message)."""
        parts = []
        for log in sorted(self.directory.glob("log/*.log")):
            text = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """Terminate the daemons (SIGKILL after ``STOP_TIMEOUT``), reap them, and remove the
        directory."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT)
        self.procs.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


def _missing() -> list[str]:
    return [b for b in BINARIES if shutil.which(b, path=_path()) is None]


def _path() -> str:
    return os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"


def ensure_installed() -> float:
    """Install the Debian packages when a binary is missing; the seconds it took (0 if
    nothing was needed). ``SlurmUnavailable`` when it cannot."""
    if not _missing():
        return 0.0
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            f"Slurm is not installed ({', '.join(_missing())}) and we are not root"
        )
    apt = shutil.which("apt-get")
    if apt is None:
        raise SlurmUnavailable("Slurm is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    started = time.monotonic()
    install = [apt, "install", "-y", "-q", "--no-install-recommends", *PACKAGES]

    def attempt() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            install, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
        )

    try:
        done = attempt()
        if done.returncode != 0:  # the package lists may be missing or stale: refresh once
            update = subprocess.run(
                [apt, "update", "-q"],
                env=env,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT,
                check=False,
            )
            if update.returncode != 0:
                raise SlurmUnavailable(
                    f"apt-get update failed (no network?): {update.stderr.strip()[-500:]}"
                )
            done = attempt()
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"installing {PACKAGES} took over {INSTALL_TIMEOUT:g} s") from None
    if done.returncode != 0 or _missing():
        raise SlurmUnavailable(
            f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-500:]}"
        )
    return time.monotonic() - started


def slurm_conf(
    directory: Path,
    nodes: tuple[tuple[str, str], ...],
    base_port: int,
    own_hostnames: bool = False,
) -> str:
    """The ``slurm.conf`` of a cluster in ``directory`` (pure). ``own_hostnames``: each node's
    ``NodeHostname`` is its name (its ``slurmd`` runs in a UTS namespace of that name)."""
    host = socket.gethostname().split(".")[0]  # slurmctld checks that it runs on SlurmctldHost
    lines = [
        "ClusterName=monarchtest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={base_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={directory}/munge/munge.sock",
        f"StateSaveLocation={directory}/state",
        f"SlurmdSpoolDir={directory}/spool/%n",
        f"SlurmctldPidFile={directory}/run/slurmctld.pid",
        f"SlurmdPidFile={directory}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={directory}/log/slurmctld.log",
        f"SlurmdLogFile={directory}/log/slurmd-%n.log",
        # no cgroups (containers and sandboxes rarely allow them): track processes by parentage
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "MinJobAge=2",
        "KillWait=2",
        "Waittime=0",
        "EnforcePartLimits=ALL",  # refuse at submission what the partition can never run
    ]
    for index, (name, addr) in enumerate(nodes):
        hostname = name if own_hostnames else host
        lines.append(
            f"NodeName={name} NodeAddr={addr} NodeHostname={hostname} Port={base_port + 1 + index} "
            "CPUs=1 RealMemory=1000 State=UNKNOWN"
        )
    names = ",".join(name for name, _ in nodes)
    lines.append(f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _free_port_block(size: int) -> int:
    """A base port with ``size`` consecutive TCP ports free on loopback (best effort)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + size >= 65000:
            continue
        try:
            held = []
            for port in range(base, base + size):
                s = socket.socket()
                held.append(s)
                s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise SlurmUnavailable("no block of free ports for the Slurm daemons")


def start(nodes: tuple[tuple[str, str], ...] = NODES, own_hostnames: bool = False) -> SlurmCluster:
    """Install if needed, then start munged, slurmctld and one slurmd per node, and wait until
    every node is idle (``START_TIMEOUT``). ``SlurmUnavailable`` with the daemons' logs when it
    cannot; nothing is left running then.

    ``own_hostnames``: every ``slurmd`` (and so every task it starts) runs in a UTS namespace
    whose host name is the node's name, as on a real cluster where ``socket.gethostname()`` on
    a node is its name (the reference's ``SlurmJob`` listens there); the caller makes the names
    resolve to the nodes' addresses (an ``/etc/hosts`` of a private mount namespace)."""
    timings = {"install_s": ensure_installed()}
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="monarch-slurm-"))
    for sub in ("munge", "state", "spool", "log", "run"):
        (directory / sub).mkdir(mode=0o755)
    key = directory / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = directory / "slurm.conf"
    conf.write_text(slurm_conf(directory, nodes, _free_port_block(len(nodes) + 1), own_hostnames))
    cluster = SlurmCluster(directory, conf, nodes, timings=timings)
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": _path()}
    log = (directory / "log" / "stdio.log").open("ab")

    def daemon(*argv: str) -> None:
        cluster.procs.append(
            subprocess.Popen(argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        )

    try:
        munge = directory / "munge"
        daemon(
            "munged", "-F", "--force", f"--key-file={key}", f"--socket={munge}/munge.sock",
            f"--pid-file={munge}/munged.pid", f"--log-file={directory}/log/munged.log",
            f"--seed-file={munge}/seed",
        )  # fmt: skip
        _wait_for(lambda: (munge / "munge.sock").exists(), "munged's socket", cluster)
        daemon("slurmctld", "-D", "-i", "-f", str(conf))
        for name, _ in nodes:
            uts = ("unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name)
            daemon(*(uts if own_hostnames else ()), "slurmd", "-D", "-N", name, "-f", str(conf))
        _wait_for(lambda: _all_idle(cluster), "every node idle in sinfo", cluster)
    except BaseException:
        cluster.stop()
        raise
    finally:
        log.close()
    timings["start_s"] = time.monotonic() - started
    return cluster


def _all_idle(cluster: SlurmCluster) -> bool:
    try:
        out = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=5)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return False
    states = dict(line.split() for line in out.splitlines() if line.strip())
    return all(states.get(name) == "idle" for name, _ in cluster.nodes)


def _wait_for(condition: Callable[[], bool], what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    interval = 0.05
    while not condition():
        dead = [p.args for p in cluster.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"exited: {dead[0]!r}" if dead else f"not within {START_TIMEOUT:g} s"
            raise SlurmUnavailable(
                f"the Slurm test cluster did not start ({what} {why})\n{cluster.logs()}"
            )
        time.sleep(interval)  # Slurm has no readiness notification: a short, bounded poll
        interval = min(interval * 2, 0.5)


@contextmanager
def running_cluster() -> Iterator[SlurmCluster]:
    """A started cluster, stopped at exit."""
    cluster = start()
    try:
        yield cluster
    finally:
        cluster.stop()


if __name__ == "__main__":
    with running_cluster() as c:
        print(f"SLURM_CONF={c.conf}  timings={c.timings}")
        input("Enter stops the cluster ")
