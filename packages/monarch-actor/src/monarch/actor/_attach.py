"""Split into ``_hosts.attach_protocol``, ``_hosts.attach_session``,
``_hosts.attach_daemon`` and ``_hosts.host_mesh``: this path stays importable for one release.

It re-exports the names the old module had from their new homes (a patch of one of them here
does not reach the code that uses it: patch the new home).

``python -m monarch.actor._attach --address udp://IP:PORT`` stays the worker daemon's documented
entry point (``attach_daemon.main``)."""

import sys

# ruff: noqa: I001  (one import block per new home; ``name as name`` marks a re-export)

from monarch.actor._hosts.attach_daemon import (
    _DaemonProc as _DaemonProc,
    _kill as _kill,
    _kill_all_of as _kill_all_of,
    _kill_started as _kill_started,
    main as main,
    run_worker_loop_forever as run_worker_loop_forever,
    run_worker_loop_until_shutdown as run_worker_loop_until_shutdown,
    START_TIMEOUT as START_TIMEOUT,
    start_worker_loop_forever as start_worker_loop_forever,
    WorkerDaemon as WorkerDaemon,
)
from monarch.actor._hosts.attach_protocol import (
    _bad_text as _bad_text,
    _ca_directory as _ca_directory,
    _Channel as _Channel,
    _command_problem as _command_problem,
    _DECODER as _DECODER,
    _ENCODER as _ENCODER,
    _heartbeats as _heartbeats,
    _MAX_LABELS as _MAX_LABELS,
    _NUMACTL_OPTION as _NUMACTL_OPTION,
    _TRUST_ALL as _TRUST_ALL,
    _udp_address as _udp_address,
    ATTACH_PROTOCOL as ATTACH_PROTOCOL,
    ATTACH_TIMEOUT as ATTACH_TIMEOUT,
    Detach as Detach,
    encode_message as encode_message,
    Exited as Exited,
    Heartbeat as Heartbeat,
    Hello as Hello,
    Kill as Kill,
    KillProcs as KillProcs,
    MAX_COMMAND_ARGS as MAX_COMMAND_ARGS,
    MAX_COMMAND_BYTES as MAX_COMMAND_BYTES,
    MAX_COMMAND_ENV as MAX_COMMAND_ENV,
    MAX_HOST_PROCS as MAX_HOST_PROCS,
    MAX_HOSTS as MAX_HOSTS,
    MAX_SESSION_FRAME as MAX_SESSION_FRAME,
    Message as Message,
    PROTOCOL_VERSION as PROTOCOL_VERSION,
    Refused as Refused,
    SessionDecoder as SessionDecoder,
    SessionProtocolError as SessionProtocolError,
    Shutdown as Shutdown,
    Spawn as Spawn,
    spawn_problem as spawn_problem,
    Spawned as Spawned,
    SpawnFailed as SpawnFailed,
    Welcome as Welcome,
    WorkerCommand as WorkerCommand,
)
from monarch.actor._hosts.attach_session import (
    _call as _call,
    HostSession as HostSession,
    RemoteWorkerGroup as RemoteWorkerGroup,
    spawn_on_hosts as spawn_on_hosts,
)
from monarch.actor._hosts.host_mesh import (
    _check_client_ca as _check_client_ca,
    attach_to_workers as attach_to_workers,
)

__all__ = [
    "ATTACH_PROTOCOL",
    "MAX_COMMAND_ARGS",
    "MAX_COMMAND_BYTES",
    "MAX_COMMAND_ENV",
    "MAX_HOST_PROCS",
    "MAX_SESSION_FRAME",
    "PROTOCOL_VERSION",
    "Detach",
    "Exited",
    "Heartbeat",
    "Hello",
    "HostSession",
    "Kill",
    "KillProcs",
    "Refused",
    "RemoteWorkerGroup",
    "SessionDecoder",
    "SessionProtocolError",
    "Shutdown",
    "Spawn",
    "SpawnFailed",
    "Spawned",
    "Welcome",
    "WorkerCommand",
    "WorkerDaemon",
    "attach_to_workers",
    "encode_message",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "spawn_on_hosts",
    "spawn_problem",
    "start_worker_loop_forever",
]

if __name__ == "__main__":
    sys.exit(main())
