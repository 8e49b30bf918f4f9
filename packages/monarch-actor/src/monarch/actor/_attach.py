"""Split into ``_hosts.attach_protocol``, ``_hosts.attach_session``,
``_hosts.attach_daemon`` and ``_hosts.host_mesh``: this path stays importable for one release.

It re-exports the names the old module had from their new homes (a patch of one of them here
does not reach the code that uses it: patch the new home).

``python -m monarch.actor._attach --address udp://IP:PORT`` stays the worker daemon's documented
entry point (``attach_daemon.main``)."""

import sys

from monarch.actor._hosts.attach_daemon import (
    START_TIMEOUT as START_TIMEOUT,
)
from monarch.actor._hosts.attach_daemon import (
    WorkerDaemon as WorkerDaemon,
)
from monarch.actor._hosts.attach_daemon import (
    _DaemonProc as _DaemonProc,
)
from monarch.actor._hosts.attach_daemon import (
    _kill as _kill,
)
from monarch.actor._hosts.attach_daemon import (
    _kill_all_of as _kill_all_of,
)
from monarch.actor._hosts.attach_daemon import (
    _kill_started as _kill_started,
)
from monarch.actor._hosts.attach_daemon import (
    main as main,
)
from monarch.actor._hosts.attach_daemon import (
    run_worker_loop_forever as run_worker_loop_forever,
)
from monarch.actor._hosts.attach_daemon import (
    run_worker_loop_until_shutdown as run_worker_loop_until_shutdown,
)
from monarch.actor._hosts.attach_daemon import (
    start_worker_loop_forever as start_worker_loop_forever,
)
from monarch.actor._hosts.attach_protocol import (
    _DECODER as _DECODER,
)
from monarch.actor._hosts.attach_protocol import (
    _ENCODER as _ENCODER,
)
from monarch.actor._hosts.attach_protocol import (
    _MAX_LABELS as _MAX_LABELS,
)
from monarch.actor._hosts.attach_protocol import (
    _NUMACTL_OPTION as _NUMACTL_OPTION,
)
from monarch.actor._hosts.attach_protocol import (
    _TRUST_ALL as _TRUST_ALL,
)
from monarch.actor._hosts.attach_protocol import (
    ATTACH_PROTOCOL as ATTACH_PROTOCOL,
)
from monarch.actor._hosts.attach_protocol import (
    ATTACH_TIMEOUT as ATTACH_TIMEOUT,
)
from monarch.actor._hosts.attach_protocol import (
    MAX_COMMAND_ARGS as MAX_COMMAND_ARGS,
)
from monarch.actor._hosts.attach_protocol import (
    MAX_COMMAND_BYTES as MAX_COMMAND_BYTES,
)
from monarch.actor._hosts.attach_protocol import (
    MAX_COMMAND_ENV as MAX_COMMAND_ENV,
)
from monarch.actor._hosts.attach_protocol import (
    MAX_HOST_PROCS as MAX_HOST_PROCS,
)
from monarch.actor._hosts.attach_protocol import (
    MAX_HOSTS as MAX_HOSTS,
)
from monarch.actor._hosts.attach_protocol import (
    MAX_SESSION_FRAME as MAX_SESSION_FRAME,
)
from monarch.actor._hosts.attach_protocol import (
    PROTOCOL_VERSION as PROTOCOL_VERSION,
)
from monarch.actor._hosts.attach_protocol import (
    Detach as Detach,
)
from monarch.actor._hosts.attach_protocol import (
    Exited as Exited,
)
from monarch.actor._hosts.attach_protocol import (
    Heartbeat as Heartbeat,
)
from monarch.actor._hosts.attach_protocol import (
    Hello as Hello,
)
from monarch.actor._hosts.attach_protocol import (
    Kill as Kill,
)
from monarch.actor._hosts.attach_protocol import (
    KillProcs as KillProcs,
)
from monarch.actor._hosts.attach_protocol import (
    Message as Message,
)
from monarch.actor._hosts.attach_protocol import (
    Refused as Refused,
)
from monarch.actor._hosts.attach_protocol import (
    SessionDecoder as SessionDecoder,
)
from monarch.actor._hosts.attach_protocol import (
    SessionProtocolError as SessionProtocolError,
)
from monarch.actor._hosts.attach_protocol import (
    Shutdown as Shutdown,
)
from monarch.actor._hosts.attach_protocol import (
    Spawn as Spawn,
)
from monarch.actor._hosts.attach_protocol import (
    Spawned as Spawned,
)
from monarch.actor._hosts.attach_protocol import (
    SpawnFailed as SpawnFailed,
)
from monarch.actor._hosts.attach_protocol import (
    Welcome as Welcome,
)
from monarch.actor._hosts.attach_protocol import (
    WorkerCommand as WorkerCommand,
)
from monarch.actor._hosts.attach_protocol import (
    _bad_text as _bad_text,
)
from monarch.actor._hosts.attach_protocol import (
    _ca_directory as _ca_directory,
)
from monarch.actor._hosts.attach_protocol import (
    _Channel as _Channel,
)
from monarch.actor._hosts.attach_protocol import (
    _command_problem as _command_problem,
)
from monarch.actor._hosts.attach_protocol import (
    _heartbeats as _heartbeats,
)
from monarch.actor._hosts.attach_protocol import (
    _udp_address as _udp_address,
)
from monarch.actor._hosts.attach_protocol import (
    encode_message as encode_message,
)
from monarch.actor._hosts.attach_protocol import (
    spawn_problem as spawn_problem,
)
from monarch.actor._hosts.attach_session import (
    HostSession as HostSession,
)
from monarch.actor._hosts.attach_session import (
    RemoteWorkerGroup as RemoteWorkerGroup,
)
from monarch.actor._hosts.attach_session import (
    _call as _call,
)
from monarch.actor._hosts.attach_session import (
    spawn_on_hosts as spawn_on_hosts,
)
from monarch.actor._hosts.host_mesh import (
    _check_client_ca as _check_client_ca,
)
from monarch.actor._hosts.host_mesh import (
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
