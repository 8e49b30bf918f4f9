"""Split into the ``_hosts`` layer (``commands``, ``groups``, ``client_node``, ``spawn``,
``host_mesh``): this path stays importable for one release.

It re-exports the names the old module had from their new homes (a patch of one of them here
does not reach the code that uses it: patch the new home)."""

from monarch.actor._hosts.client_node import (
    _DEFAULT_LISTEN as _DEFAULT_LISTEN,
)
from monarch.actor._hosts.client_node import (
    CLIENT_LISTEN_ENV as CLIENT_LISTEN_ENV,
)
from monarch.actor._hosts.client_node import (
    ClientNodeLayer as ClientNodeLayer,
)
from monarch.actor._hosts.commands import (
    _MAX_CPU as _MAX_CPU,
)
from monarch.actor._hosts.commands import (
    _NUMACTL_KEYS as _NUMACTL_KEYS,
)
from monarch.actor._hosts.commands import (
    _PROC_BIND_KEYS as _PROC_BIND_KEYS,
)
from monarch.actor._hosts.commands import (
    _WORKER_ARGS as _WORKER_ARGS,
)
from monarch.actor._hosts.commands import (
    EXIT_TIMEOUT as EXIT_TIMEOUT,
)
from monarch.actor._hosts.commands import (
    SETUP_TIMEOUT as SETUP_TIMEOUT,
)
from monarch.actor._hosts.commands import (
    SPAWN_TIMEOUT as SPAWN_TIMEOUT,
)
from monarch.actor._hosts.commands import (
    BootstrapCommand as BootstrapCommand,
)
from monarch.actor._hosts.commands import (
    ProcBinding as ProcBinding,
)
from monarch.actor._hosts.commands import (
    _describe_exit as _describe_exit,
)
from monarch.actor._hosts.commands import (
    _SpawnOptions as _SpawnOptions,
)
from monarch.actor._hosts.commands import (
    bootstrap_commands as bootstrap_commands,
)
from monarch.actor._hosts.commands import (
    check_proc_bind as check_proc_bind,
)
from monarch.actor._hosts.commands import (
    default_bootstrap_cmd as default_bootstrap_cmd,
)
from monarch.actor._hosts.commands import (
    exec_spec as exec_spec,
)
from monarch.actor._hosts.commands import (
    exit_timeout as exit_timeout,
)
from monarch.actor._hosts.commands import (
    parse_cpus as parse_cpus,
)
from monarch.actor._hosts.commands import (
    source_ip_toward as source_ip_toward,
)
from monarch.actor._hosts.commands import (
    spawn_timeout as spawn_timeout,
)
from monarch.actor._hosts.commands import (
    worker_command as worker_command,
)
from monarch.actor._hosts.groups import (
    _MARKER as _MARKER,
)
from monarch.actor._hosts.groups import (
    _MAX_STARTUP_VALUE as _MAX_STARTUP_VALUE,
)
from monarch.actor._hosts.groups import (
    FORKED_WORKER as FORKED_WORKER,
)
from monarch.actor._hosts.groups import (
    LocalWorkerGroup as LocalWorkerGroup,
)
from monarch.actor._hosts.groups import (
    WorkerGroup as WorkerGroup,
)
from monarch.actor._hosts.groups import (
    WorkerProcess as WorkerProcess,
)
from monarch.actor._hosts.groups import (
    _await_startup as _await_startup,
)
from monarch.actor._hosts.groups import (
    _copy_to_stdout as _copy_to_stdout,
)
from monarch.actor._hosts.groups import (
    _in_worker_process as _in_worker_process,
)
from monarch.actor._hosts.groups import (
    _zygote as _zygote,
)
from monarch.actor._hosts.groups import (
    check_spawn_method as check_spawn_method,
)
from monarch.actor._hosts.groups import (
    forward_output as forward_output,
)
from monarch.actor._hosts.groups import (
    mark_worker_process as mark_worker_process,
)
from monarch.actor._hosts.groups import (
    read_worker_pids as read_worker_pids,
)
from monarch.actor._hosts.groups import (
    register_worker as register_worker,
)
from monarch.actor._hosts.host_mesh import (
    _MAX_PROCS as _MAX_PROCS,
)
from monarch.actor._hosts.host_mesh import (
    HostMesh as HostMesh,
)
from monarch.actor._hosts.host_mesh import (
    _end_hosts as _end_hosts,
)
from monarch.actor._hosts.host_mesh import (
    _host_of as _host_of,
)
from monarch.actor._hosts.host_mesh import (
    _rebuild_host_mesh as _rebuild_host_mesh,
)
from monarch.actor._hosts.host_mesh import (
    this_host as this_host,
)
from monarch.actor._hosts.spawn import (
    bring_up as bring_up,
)
from monarch.actor._hosts.spawn import (
    run_setup as run_setup,
)
from monarch.actor._hosts.spawn import (
    start_group as _start_group,  # noqa: F401 (the old private name)
)

__all__ = [
    "CLIENT_LISTEN_ENV",
    "BootstrapCommand",
    "ClientNodeLayer",
    "HostMesh",
    "LocalWorkerGroup",
    "WorkerGroup",
    "default_bootstrap_cmd",
    "this_host",
    "exit_timeout",
    "spawn_timeout",
    "worker_command",
]
