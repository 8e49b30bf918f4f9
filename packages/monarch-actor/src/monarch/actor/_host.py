"""Split into the ``_hosts`` layer (``commands``, ``groups``, ``client_node``, ``spawn``,
``host_mesh``): this path stays importable for one release.

It re-exports the names the old module had from their new homes (a patch of one of them here
does not reach the code that uses it: patch the new home)."""

# ruff: noqa: I001  (one import block per new home; ``name as name`` marks a re-export)

from monarch.actor._hosts.client_node import (
    _DEFAULT_LISTEN as _DEFAULT_LISTEN,
    CLIENT_LISTEN_ENV as CLIENT_LISTEN_ENV,
    ClientNodeLayer as ClientNodeLayer,
)
from monarch.actor._hosts.commands import (
    _describe_exit as _describe_exit,
    _MAX_CPU as _MAX_CPU,
    _NUMACTL_KEYS as _NUMACTL_KEYS,
    _PROC_BIND_KEYS as _PROC_BIND_KEYS,
    _SpawnOptions as _SpawnOptions,
    _WORKER_ARGS as _WORKER_ARGS,
    bootstrap_commands as bootstrap_commands,
    BootstrapCommand as BootstrapCommand,
    check_proc_bind as check_proc_bind,
    default_bootstrap_cmd as default_bootstrap_cmd,
    exec_spec as exec_spec,
    EXIT_TIMEOUT as EXIT_TIMEOUT,
    exit_timeout as exit_timeout,
    parse_cpus as parse_cpus,
    ProcBinding as ProcBinding,
    SETUP_TIMEOUT as SETUP_TIMEOUT,
    source_ip_toward as source_ip_toward,
    SPAWN_TIMEOUT as SPAWN_TIMEOUT,
    spawn_timeout as spawn_timeout,
    worker_command as worker_command,
)
from monarch.actor._hosts.groups import (
    _await_startup as _await_startup,
    _copy_to_stdout as _copy_to_stdout,
    _in_worker_process as _in_worker_process,
    _MARKER as _MARKER,
    _MAX_STARTUP_VALUE as _MAX_STARTUP_VALUE,
    _zygote as _zygote,
    check_spawn_method as check_spawn_method,
    FORKED_WORKER as FORKED_WORKER,
    forward_output as forward_output,
    LocalWorkerGroup as LocalWorkerGroup,
    mark_worker_process as mark_worker_process,
    read_worker_pids as read_worker_pids,
    register_worker as register_worker,
    WorkerGroup as WorkerGroup,
    WorkerProcess as WorkerProcess,
)
from monarch.actor._hosts.host_mesh import (
    _end_hosts as _end_hosts,
    _host_of as _host_of,
    _MAX_PROCS as _MAX_PROCS,
    _rebuild_host_mesh as _rebuild_host_mesh,
    HostMesh as HostMesh,
    this_host as this_host,
)
from monarch.actor._hosts.spawn import (
    bring_up as bring_up,
    run_setup as run_setup,
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
