"""The settings registry behind ``monarch.config``.

Why: Monarch exposes its runtime knobs as one flat namespace (``configure(cleanup_timeout=5)``,
or environment variables such as ``HYPERACTOR_CLEANUP_TIMEOUT``). Each known setting has a type,
a default and optionally an environment variable; the effective value is, in order of
precedence, the runtime override (``configure``), the environment, the default. Values are read
when they are used (not cached at import), so ``configured(...)`` blocks take effect at once.
Unknown names raise ``ValueError`` and values of the wrong type ``TypeError``: a typo never
silently does nothing.

Every key Monarch 0.7.0 accepts is known here (``Setting.applied`` says whether it changes
anything in this implementation). Duration settings (``kind`` ``Duration``) take Monarch's
humantime strings (``"1m 30s"``, ``"500ms"``; also int/float seconds) and read back in Monarch's
canonical form from ``get_global_config``/``get_runtime_config``; inside the runtime ``get``
returns them as float seconds.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from monarch.config._duration import MAX_NANOS, DurationError, format_duration, parse_duration

__all__ = [
    "ChannelTransport",
    "Duration",
    "Encoding",
    "Setting",
    "clear_runtime_config",
    "configure",
    "configured",
    "get",
    "get_global_config",
    "get_runtime_config",
    "parse_transport",
    "settings",
]


class Encoding(enum.Enum):
    """Wire encodings of Monarch messages (``default_encoding``)."""

    Multipart = "multipart"
    Bincode = "bincode"
    Json = "json"


class ChannelTransport(enum.Enum):
    """Monarch's channel transports (``default_transport``, ``monarch.actor.enable_transport``).

    Which ones this implementation supports, and what each selects here, is
    ``monarch.actor.enable_transport``'s business; the setting itself accepts them all."""

    TcpWithLocalhost = "tcp(localhost)"
    TcpWithHostname = "tcp(hostname)"
    MetaTlsWithHostname = "metatls(hostname)"
    MetaTlsWithIpV6 = "metatls(ipv6)"
    Tls = "tls"
    Quic = "quic"
    MetaQuicWithHostname = "metaquic(hostname)"
    MetaQuicWithIpV6 = "metaquic(ipv6)"
    Local = "local"
    Unix = "unix"


#: ``default_transport`` string shortcuts (Monarch's ``enable_transport`` table).
TRANSPORT_SHORTCUTS: dict[str, ChannelTransport] = {
    "tcp": ChannelTransport.TcpWithHostname,
    "ipc": ChannelTransport.Unix,
    "unix": ChannelTransport.Unix,
    "quic": ChannelTransport.Quic,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
    "tls": ChannelTransport.Tls,
    "local": ChannelTransport.Local,
}
_URL_SCHEMES = ("tcp://", "ipc://", "unix://", "metatls://", "tls://", "quic://", "udp://")


class Duration:
    """The ``kind`` of duration settings (never instantiated): configured as a humantime string
    or int/float seconds, read back as Monarch's string, used as float seconds."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One known setting: name, type, default, environment variable and meaning.

    ``default`` of a ``Duration`` is in seconds. ``applied`` is False for keys accepted for
    compatibility with Monarch that change nothing here. ``optional``: ``None`` is a value;
    ``nonzero``: 0 is refused (``ValueError``, as Monarch does). ``aliases``: more environment
    variables read when ``env`` is unset."""

    name: str
    kind: type
    default: Any
    env: str | None
    doc: str
    applied: bool = True
    optional: bool = False
    nonzero: bool = False
    aliases: tuple[str, ...] = ()


_GIB = 1024**3
_SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "default_encoding",
            Encoding,
            Encoding.Multipart,
            "HYPERACTOR_DEFAULT_ENCODING",
            "message encoding (messages here always use this implementation's own codec)",
            applied=False,
        ),
        Setting(
            "codec_max_frame_length",
            int,
            10 * _GIB,
            "HYPERACTOR_CODEC_MAX_FRAME_LENGTH",
            "largest message (header plus buffers) in bytes",
        ),
        Setting(
            "message_delivery_timeout",
            Duration,
            30.0,
            "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",
            "time before an unacknowledged message counts as undeliverable (here delivery "
            "failures come from the transport and from supervision instead)",
            applied=False,
        ),
        Setting(
            "mesh_orphan_timeout",
            Duration,
            3.0,
            "MONARCH_MESH_ORPHAN_TIMEOUT",
            "silence before a worker's parent link fails (QUIC idle timeout); a worker whose "
            "parent link stays down that long again exits (Monarch's default: 1m)",
            aliases=("HYPERACTOR_MESH_ORPHAN_TIMEOUT",),
        ),
        Setting(
            "cleanup_timeout",
            Duration,
            3.0,
            "HYPERACTOR_CLEANUP_TIMEOUT",
            "time an async __cleanup__ may run before it is cancelled",
        ),
        Setting(
            "stop_actor_timeout",
            Duration,
            10.0,
            "HYPERACTOR_STOP_ACTOR_TIMEOUT",
            "time a stop waits for the actors it stops",
        ),
        Setting(
            "actor_mailbox_capacity",
            int,
            100_000,
            "MONARCH_ACTOR_MAILBOX_CAPACITY",
            "messages queued per actor before new ones bounce",
        ),
        Setting(
            "port_queue_capacity",
            int,
            100_000,
            "MONARCH_PORT_QUEUE_CAPACITY",
            "values queued per port receiver before it overflows",
        ),
        Setting(
            "max_open_ports",
            int,
            262_144,
            "MONARCH_MAX_OPEN_PORTS",
            "open ports per process (reply ports included)",
        ),
        Setting(
            "max_actors_per_proc",
            int,
            10_000,
            "MONARCH_MAX_ACTORS_PER_PROC",
            "live actors per process",
        ),
        Setting(
            "max_cast_dimension_size",
            int,
            16,
            "HYPERACTOR_MESH_MAX_CAST_DIMENSION_SIZE",
            "fan-out of the multicast tree (casts here go to each process directly)",
            applied=False,
        ),
        Setting(
            "enable_log_forwarding",
            bool,
            False,
            "HYPERACTOR_MESH_ENABLE_LOG_FORWARDING",
            "ProcMesh.logging_option(stream_to_client=True) warns without it (worker "
            "stdout reaches the client here in any case, rank-prefixed)",
        ),
        Setting(
            "admin_port",
            int,
            -1,
            "MONARCH_ADMIN_PORT",
            "start the client's admin endpoint (Prometheus /metrics, monarch top's /status) "
            "on this loopback port when the client starts; 0: any free port; -1: off",
        ),
        Setting(
            "force_quic",
            bool,
            False,
            "MONARCH_FORCE_QUIC",
            "send every message over the Chrysalis QUIC path (no direct Unix/TCP lanes, no "
            "shared memory)",
        ),
        Setting(
            "lane_lend_bytes",
            bool,
            True,
            "MONARCH_LANE_LEND_BYTES",
            "Unix lanes: lend a large immutable bytes payload to a receiver that can read this "
            "process's memory (process_vm_readv: one copy instead of two); a lent message not "
            "yet read when its sender crashes is lost; off: shared-memory slots (either side "
            "off: slots)",
        ),
        Setting(
            "worker_spawn_method",
            str,
            "zygote",
            "MONARCH_WORKER_SPAWN_METHOD",
            "how local worker processes start: 'zygote' (forked from a warm copy of the "
            "client, fast) or 'exec' (a fresh interpreter)",
        ),
        Setting(
            "rdma_allow_tcp_fallback",
            bool,
            True,
            "MONARCH_RDMA_ALLOW_TCP_FALLBACK",
            "monarch-rdma: buffers use the net provider (messages) when no RDMA device exists",
        ),
        Setting(
            "rdma_disable_ibverbs",
            bool,
            False,
            "MONARCH_RDMA_DISABLE_IBVERBS",
            "monarch-rdma: never use ibverbs, even where a device exists",
        ),
        Setting(
            "rdma_max_chunk_size_mb",
            int,
            64,
            "MONARCH_RDMA_MAX_CHUNK_SIZE_MB",
            "monarch-rdma: largest chunk of a net-provider (TCP-fallback) transfer, MiB",
        ),
        Setting(
            "rdma_tcp_fallback_parallelism",
            int,
            1,
            "MONARCH_RDMA_TCP_FALLBACK_PARALLELISM",
            "parallel channels of TCP-fallback transfers (monarch-rdma: RDMA managers of the "
            "owner's process a net-provider transfer spreads its chunks over; below 1 counts as 1)",
        ),
        # -- mailbox bytes (issue 15 item 6) --
        Setting(
            "actor_mailbox_max_bytes",
            int,
            1 * _GIB,
            "MONARCH_ACTOR_MAILBOX_MAX_BYTES",
            "bytes of messages queued per actor before new calls bounce (one larger message is "
            "still accepted into an empty mailbox)",
        ),
        # -- the caller's wait (issue 23) --
        Setting(
            "future_spin_wait",
            Duration,
            0.0,
            "MONARCH_FUTURE_SPIN_WAIT",
            "a thread blocking on a pending monarch Future (get, result, exception) first polls "
            "it for this long, yielding the CPU and the GIL between polls (os.sched_yield), "
            "before it sleeps; 0 (the default): sleep at once (measured, issue 23: no gain on "
            "this 2-core machine, worse under load)",
        ),
        # -- monarch-rdma (issue 17) --
        Setting(
            "rdma_net_chunks_in_flight",
            int,
            4,
            "MONARCH_RDMA_NET_CHUNKS_IN_FLIGHT",
            "chunks of one transfer of monarch-rdma's net provider outstanding at once (each "
            "at most rdma_max_chunk_size_mb)",
            nonzero=True,
        ),
        Setting(
            "rdma_disable_shm",
            bool,
            False,
            "MONARCH_RDMA_DISABLE_SHM",
            "monarch-rdma: never use the shm provider (shared memory between processes of one "
            "host); the net provider serves them instead",
        ),
    )
}


# Monarch 0.7.0's other keys (its get_global_config() lists 84): accepted, typed, shown by
# get_global_config(); ``applied=False`` ones change nothing here (README: Configuration).
_MONARCH_KEYS: tuple[Setting, ...] = (
    Setting(
        "default_transport",
        ChannelTransport,
        ChannelTransport.Unix,
        "HYPERACTOR_MESH_DEFAULT_TRANSPORT",
        "channel transport (a ChannelTransport, a shortcut such as 'tcp', or an address "
        "URL); set through monarch.actor.enable_transport, which says what each selects here",
    ),
    Setting(
        "enable_file_capture",
        bool,
        False,
        "HYPERACTOR_MESH_ENABLE_FILE_CAPTURE",
        "persist child stdout/stderr to per-host files",
        applied=False,
    ),
    Setting(
        "tail_log_lines",
        int,
        0,
        "HYPERACTOR_MESH_TAIL_LOG_LINES",
        "log lines kept in memory per child",
        applied=False,
    ),
    Setting(
        "host_spawn_ready_timeout",
        Duration,
        30.0,
        "HYPERACTOR_HOST_SPAWN_READY_TIMEOUT",
        "time spawn_procs waits for a worker process to start and report in",
    ),
    Setting(
        "mesh_proc_spawn_max_idle",
        Duration,
        30.0,
        "HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE",
        "idle time while spawning procs",
        applied=False,
    ),
    Setting(
        "process_exit_timeout",
        Duration,
        5.0,
        "HYPERACTOR_PROCESS_EXIT_TIMEOUT",
        "time a stopped worker process may take to exit before it is killed "
        "(Monarch's default: 10s)",
    ),
    Setting(
        "message_ack_time_interval",
        Duration,
        0.5,
        "HYPERACTOR_MESSAGE_ACK_TIME_INTERVAL",
        "interval of message acknowledgements",
        applied=False,
    ),
    Setting(
        "message_ack_every_n_messages",
        int,
        1000,
        "HYPERACTOR_MESSAGE_ACK_EVERY_N_MESSAGES",
        "acknowledge every N messages",
        applied=False,
    ),
    Setting(
        "message_ttl_default",
        int,
        64,
        "HYPERACTOR_MESSAGE_TTL_DEFAULT",
        "default message time-to-live (hops)",
        applied=False,
    ),
    Setting(
        "split_max_buffer_size",
        int,
        5,
        "HYPERACTOR_SPLIT_MAX_BUFFER_SIZE",
        "buffers per split message",
        applied=False,
    ),
    Setting(
        "split_max_buffer_age",
        Duration,
        0.05,
        "HYPERACTOR_SPLIT_MAX_BUFFER_AGE",
        "age of split message buffers",
        applied=False,
    ),
    Setting(
        "channel_net_rx_buffer_full_check_interval",
        Duration,
        5.0,
        "HYPERACTOR_CHANNEL_NET_RX_BUFFER_FULL_CHECK_INTERVAL",
        "receive buffer check interval",
        applied=False,
    ),
    Setting(
        "channel_tcp_congestion",
        str,
        "",
        "HYPERACTOR_CHANNEL_TCP_CONGESTION",
        "TCP congestion control algorithm",
        applied=False,
    ),
    Setting(
        "channel_reconnect_timeout",
        Duration,
        60.0,
        "HYPERACTOR_CHANNEL_RECONNECT_TIMEOUT",
        "time a channel keeps reconnecting",
        applied=False,
    ),
    Setting(
        "channel_tcp_keepalive_idle",
        Duration,
        60.0,
        "HYPERACTOR_CHANNEL_TCP_KEEPALIVE_IDLE",
        "TCP keepalive idle time",
        applied=False,
    ),
    Setting(
        "message_latency_sampling_rate",
        float,
        0.01,
        "HYPERACTOR_MESSAGE_LATENCY_SAMPLING_RATE",
        "share of messages whose latency is sampled",
        applied=False,
    ),
    Setting(
        "enable_dest_actor_reordering_buffer",
        bool,
        True,
        "HYPERACTOR_ENABLE_DEST_ACTOR_REORDERING_BUFFER",
        "reorder messages at the destination actor (ordering per sender holds here anyway)",
        applied=False,
    ),
    Setting(
        "mesh_bootstrap_enable_pdeathsig",
        bool,
        True,
        "HYPERACTOR_MESH_BOOTSTRAP_ENABLE_PDEATHSIG",
        "parent-death signal for spawned processes (workers here exit when their parent "
        "link is gone)",
        applied=False,
    ),
    Setting(
        "mesh_terminate_concurrency",
        int,
        16,
        "HYPERACTOR_MESH_TERMINATE_CONCURRENCY",
        "concurrent terminations during shutdown",
        applied=False,
    ),
    Setting(
        "mesh_terminate_timeout",
        Duration,
        10.0,
        "HYPERACTOR_MESH_TERMINATE_TIMEOUT",
        "time per child during graceful termination",
        applied=False,
    ),
    Setting(
        "small_write_threshold",
        int,
        256,
        "MONARCH_HYPERACTOR_SMALL_WRITE_THRESHOLD",
        "writes below this many bytes are copied",
        applied=False,
    ),
    Setting(
        "read_log_buffer",
        int,
        100,
        "HYPERACTOR_READ_LOG_BUFFER",
        "buffer size for reading logs",
        applied=False,
    ),
    Setting(
        "force_file_log",
        bool,
        False,
        "HYPERACTOR_FORCE_FILE_LOG",
        "force file-based logging",
        applied=False,
    ),
    Setting(
        "prefix_with_rank",
        bool,
        True,
        "HYPERACTOR_PREFIX_WITH_RANK",
        "prefix each line of a worker's stdout copied to the client with its rank ('[1] '); "
        "read as the workers start",
    ),
    Setting(
        "actor_spawn_max_idle",
        Duration,
        30.0,
        "HYPERACTOR_MESH_ACTOR_SPAWN_MAX_IDLE",
        "idle time while spawning actors",
        applied=False,
    ),
    Setting(
        "get_actor_state_max_idle",
        Duration,
        30.0,
        "HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE",
        "idle time of actor state queries",
        applied=False,
    ),
    Setting(
        "supervision_watchdog_timeout",
        Duration,
        120.0,
        "HYPERACTOR_MESH_SUPERVISION_WATCHDOG_TIMEOUT",
        "time a worker process may leave the client's heartbeats unanswered before it is "
        "declared dead and fenced (0 turns the check off)",
    ),
    Setting(
        "proc_stop_max_idle",
        Duration,
        30.0,
        "HYPERACTOR_MESH_PROC_STOP_MAX_IDLE",
        "idle time while stopping procs",
        applied=False,
    ),
    Setting(
        "get_proc_state_max_idle",
        Duration,
        60.0,
        "HYPERACTOR_MESH_GET_PROC_STATE_MAX_IDLE",
        "idle time of proc state queries",
        applied=False,
    ),
    Setting(
        "mesh_admin_addr",
        str,
        "[::]:1729",
        "HYPERACTOR_MESH_ADMIN_ADDR",
        "address of the mesh admin HTTP server (none here)",
        applied=False,
    ),
    Setting(
        "mesh_admin_max_concurrent_resolves",
        int,
        2,
        "HYPERACTOR_MESH_ADMIN_MAX_CONCURRENT_RESOLVES",
        "mesh admin concurrency",
        applied=False,
    ),
    Setting(
        "mesh_admin_config_dump_bridge_timeout",
        Duration,
        5.0,
        "HYPERACTOR_MESH_ADMIN_CONFIG_DUMP_BRIDGE_TIMEOUT",
        "mesh admin timeout",
        applied=False,
    ),
    Setting(
        "mesh_admin_pyspy_timeout",
        Duration,
        10.0,
        "HYPERACTOR_MESH_ADMIN_PYSPY_TIMEOUT",
        "mesh admin py-spy timeout",
        applied=False,
    ),
    Setting(
        "mesh_admin_pyspy_bridge_timeout",
        Duration,
        13.0,
        "HYPERACTOR_MESH_ADMIN_PYSPY_BRIDGE_TIMEOUT",
        "mesh admin py-spy timeout",
        applied=False,
    ),
    Setting(
        "mesh_admin_pyspy_client_timeout",
        Duration,
        20.0,
        "HYPERACTOR_MESH_ADMIN_PYSPY_CLIENT_TIMEOUT",
        "mesh admin py-spy timeout",
        applied=False,
    ),
    Setting(
        "mesh_admin_pyspy_max_profile_duration",
        Duration,
        300.0,
        "HYPERACTOR_MESH_ADMIN_PYSPY_MAX_PROFILE_DURATION",
        "longest mesh admin py-spy profile",
        applied=False,
    ),
    Setting(
        "mesh_admin_query_child_timeout",
        Duration,
        0.1,
        "HYPERACTOR_MESH_ADMIN_QUERY_CHILD_TIMEOUT",
        "mesh admin timeout",
        applied=False,
    ),
    Setting(
        "mesh_admin_resolve_actor_timeout",
        Duration,
        0.2,
        "HYPERACTOR_MESH_ADMIN_RESOLVE_ACTOR_TIMEOUT",
        "mesh admin timeout",
        applied=False,
    ),
    Setting(
        "mesh_admin_single_host_timeout",
        Duration,
        3.0,
        "HYPERACTOR_MESH_ADMIN_SINGLE_HOST_TIMEOUT",
        "mesh admin timeout",
        applied=False,
    ),
    Setting(
        "mesh_admin_tree_timeout",
        Duration,
        10.0,
        "HYPERACTOR_MESH_ADMIN_TREE_TIMEOUT",
        "mesh admin timeout",
        applied=False,
    ),
    Setting(
        "mesh_attach_config_timeout",
        Duration,
        60.0,
        "HYPERACTOR_MESH_ATTACH_CONFIG_TIMEOUT",
        "config-push barrier of attach_to_workers (configuration is not pushed to attached "
        "hosts here)",
        applied=False,
    ),
    Setting("pyspy_bin", str, "", "PYSPY_BIN", "py-spy binary of the mesh admin", applied=False),
    Setting(
        "forwarder_flush_timeout",
        Duration,
        5.0,
        "HYPERACTOR_FORWARDER_FLUSH_TIMEOUT",
        "time a forwarder flush may take",
        applied=False,
    ),
    Setting(
        "pending_actor_delivery_timeout",
        Duration,
        30.0,
        "HYPERACTOR_PENDING_ACTOR_DELIVERY_TIMEOUT",
        "time a message waits for an actor that is not spawned yet",
        applied=False,
    ),
    Setting(
        "process_memory_metric_interval",
        Duration,
        300.0,
        "HYPERACTOR_PROCESS_MEMORY_METRIC_INTERVAL",
        "interval of process memory metrics",
        applied=False,
    ),
    Setting(
        "server_heartbeat_interval",
        Duration,
        1.0,
        "HYPERACTOR_SERVER_HEARTBEAT_INTERVAL",
        "channel server heartbeat (QUIC keepalives here: mesh_orphan_timeout / 4)",
        applied=False,
    ),
    Setting(
        "stop_grace_period",
        Duration,
        10.0,
        "HYPERACTOR_REMOTE_STOP_GRACE_PERIOD",
        "grace period of a remote stop",
        applied=False,
    ),
    Setting(
        "sequencer_max_locked_keys",
        int,
        128,
        "HYPERACTOR_SEQUENCER_MAX_LOCKED_KEYS",
        "sequencer bound",
        applied=False,
    ),
    Setting(
        "terminated_snapshot_retention",
        int,
        100,
        "HYPERACTOR_TERMINATED_SNAPSHOT_RETENTION",
        "terminated actor snapshots kept",
        applied=False,
    ),
    Setting(
        "use_direct_spawn",
        bool,
        False,
        "HYPERACTOR_MESH_USE_DIRECT_SPAWN",
        "spawn procs directly (see worker_spawn_method here)",
        applied=False,
    ),
    Setting(
        "proc_launcher_kind",
        str,
        "",
        "HYPERACTOR_MESH_PROC_LAUNCHER_KIND",
        "proc launcher",
        applied=False,
    ),
    Setting(
        "max_cast_fanout",
        int,
        16,
        "HYPERACTOR_MESH_MAX_CAST_FANOUT",
        "fan-out of casts",
        applied=False,
    ),
    Setting(
        "file_log_level",
        str,
        "",
        "MONARCH_FILE_LOG",
        "framework file log level (the MONARCH_FILE_LOG variable itself is read by this "
        "implementation's system logging)",
        applied=False,
    ),
    Setting(
        "monarch_log_suffix",
        str,
        "",
        "MONARCH_LOG_SUFFIX",
        "suffix of framework log file names",
        applied=False,
    ),
    Setting(
        "enable_otel_metrics",
        bool,
        True,
        "ENABLE_OTEL_METRICS",
        "OpenTelemetry metrics (see enable_telemetry here)",
        applied=False,
    ),
    Setting(
        "enable_otel_tracing",
        bool,
        True,
        "ENABLE_OTEL_TRACING",
        "OpenTelemetry tracing (see enable_telemetry here)",
        applied=False,
    ),
    Setting(
        "enable_recorder_tracing",
        bool,
        True,
        "ENABLE_RECORDER_TRACING",
        "in-memory trace recorder",
        applied=False,
    ),
    Setting(
        "enable_sqlite_tracing",
        bool,
        False,
        "ENABLE_SQLITE_TRACING",
        "SQLite trace sink",
        applied=False,
    ),
    Setting(
        "otel_metric_export_interval",
        Duration,
        1.0,
        "OTEL_METRIC_EXPORT_INTERVAL",
        "OpenTelemetry metric export interval",
        applied=False,
    ),
    Setting(
        "scuba_log_enter_exit",
        bool,
        False,
        "SCUBA_LOG_ENTER_EXIT",
        "Meta-internal logging",
        applied=False,
    ),
    Setting(
        "enable_unawaited_python_task_traceback",
        bool,
        False,
        "MONARCH_HYPERACTOR_ENABLE_UNAWAITED_PYTHON_TASK_TRACEBACK",
        "tracebacks of unawaited Python tasks",
        applied=False,
    ),
    Setting(
        "tokio_worker_threads",
        int,
        None,
        "MONARCH_TOKIO_WORKER_THREADS",
        "Tokio runtime threads (no Tokio here)",
        applied=False,
        optional=True,
        nonzero=True,
    ),
    Setting(
        "rdma_ibverbs_target",
        str,
        "",
        "MONARCH_RDMA_IBVERBS_TARGET",
        "default ibverbs device target",
        applied=False,
    ),
    Setting(
        "rdma_peer_device_affinity",
        str,
        "",
        "MONARCH_RDMA_PEER_DEVICE_AFFINITY",
        "which peer NICs a local NIC pairs with",
        applied=False,
    ),
    Setting(
        "rdma_max_nics_per_buffer",
        int,
        None,
        "MONARCH_RDMA_MAX_NICS_PER_BUFFER",
        "NICs a buffer is registered on, at most",
        applied=False,
        optional=True,
        nonzero=True,
    ),
    Setting(
        "rdma_min_stripe_size_kb",
        int,
        512,
        "MONARCH_RDMA_MIN_STRIPE_SIZE_KB",
        "smallest RDMA stripe, KiB",
        applied=False,
    ),
    Setting(
        "rdma_qps_per_cq",
        int,
        64,
        "MONARCH_RDMA_QPS_PER_CQ",
        "queue pairs per completion queue",
        applied=False,
    ),
    Setting(
        "rdma_qps_per_peer",
        int,
        4,
        "MONARCH_RDMA_QPS_PER_PEER",
        "queue pairs per peer",
        applied=False,
    ),
    Setting(
        "rdma_cq_poller_per_device",
        bool,
        True,
        "MONARCH_RDMA_CQ_POLLER_PER_DEVICE",
        "a completion-queue poller per device",
        applied=False,
    ),
    Setting(
        "rdma_runtime_worker_threads",
        int,
        4,
        "MONARCH_RDMA_RUNTIME_WORKER_THREADS",
        "RDMA runtime threads",
        applied=False,
    ),
    Setting(
        "rdma_host_odp",
        bool,
        False,
        "MONARCH_RDMA_HOST_ODP",
        "on-demand paging of host memory",
        applied=False,
    ),
    Setting(
        "rdma_qp_init_timeout",
        Duration,
        30.0,
        "MONARCH_RDMA_QP_INIT_TIMEOUT",
        "queue pair initialisation timeout",
        applied=False,
    ),
    Setting(
        "remote_alloc_bind_to_inaddr_any",
        bool,
        False,
        None,
        "bind remote allocators to INADDR_ANY (documented by Monarch, refused by 0.7.0 itself)",
        applied=False,
    ),
    Setting(
        "remote_alloc_bootstrap_addr",
        str,
        "",
        None,
        "bootstrap address of remote allocators (documented by Monarch, refused by 0.7.0 itself)",
        applied=False,
    ),
    Setting(
        "remote_alloc_allowed_port_range",
        slice,
        None,
        None,
        "ports remote allocators may use, slice(start, stop) (documented by Monarch, refused "
        "by 0.7.0 itself)",
        applied=False,
        optional=True,
    ),
)
_SETTINGS.update((s.name, s) for s in _MONARCH_KEYS)

_runtime: dict[str, Any] = {}
# Exact nanoseconds of the duration overrides in ``_runtime`` (which holds float seconds, what
# the runtime reads), so that ``get_runtime_config`` shows "1s 1ns" back, not "1s".
_nanos: dict[str, int] = {}
_lock = threading.Lock()

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_ENCODINGS = {
    "multipart": Encoding.Multipart,
    "bincode": Encoding.Bincode,
    "json": Encoding.Json,
    "serde_json": Encoding.Json,
}


def settings() -> dict[str, Setting]:
    """Every known setting by name."""
    return dict(_SETTINGS)


def _setting(name: str) -> Setting:
    try:
        return _SETTINGS[name]
    except KeyError:
        known = ", ".join(sorted(_SETTINGS))
        raise ValueError(f"unknown monarch config key {name!r}; known keys: {known}") from None


MAX_SECONDS = MAX_NANOS / 1e9


def _seconds_to_nanos(seconds: float) -> int:
    return round(seconds * 1e9)


def parse_transport(setting: Setting, value: str) -> ChannelTransport | str:
    """``value`` as a transport: a shortcut (``'tcp'``), a ``ChannelTransport`` value, or an
    address URL kept as text; ``ValueError`` otherwise."""
    shortcut = TRANSPORT_SHORTCUTS.get(value)
    if shortcut is not None:
        return shortcut
    for member in ChannelTransport:
        if value == member.value:
            return member
    scheme, sep, rest = value.partition("://")
    if sep and f"{scheme}://" in _URL_SCHEMES and rest:
        return value
    raise ValueError(
        f"monarch config {setting.name!r}: {value!r} is neither a transport "
        f"({', '.join(sorted(TRANSPORT_SHORTCUTS))}) nor an address such as 'tcp://HOST:PORT'"
    )


def _coerce_duration(setting: Setting, value: Any) -> tuple[float, int]:
    if isinstance(value, str):
        try:
            nanos = parse_duration(value)
        except DurationError as exc:
            raise TypeError(
                f"invalid value {value!r} for monarch config {setting.name!r}: {exc}"
            ) from None
        return nanos / 1e9, nanos
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MAX_SECONDS:
        return float(value), _seconds_to_nanos(value)
    raise TypeError(
        f"monarch config {setting.name!r} expects a duration such as '30s' or '1m 30s' (or "
        f"non-negative seconds), got {value!r}"
    )


def _coerce(setting: Setting, value: Any) -> Any:
    kind = setting.kind
    if value is None and setting.optional:
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            if value == 0 and setting.nonzero:
                raise ValueError(f"monarch config {setting.name!r} must not be 0")
            return value
    elif kind is float:
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and value >= 0
            and value != float("inf")
        ):
            return float(value)
    elif kind is Duration:
        return _coerce_duration(setting, value)[0]
    elif kind is ChannelTransport:
        if isinstance(value, ChannelTransport):
            return value
        if isinstance(value, str):
            return parse_transport(setting, value)
    elif isinstance(value, kind):
        return value
    raise TypeError(
        f"monarch config {setting.name!r} expects a non-negative {kind.__name__}, got {value!r}"
    )


def _parse_env(setting: Setting, text: str, variable: str | None = None) -> Any:
    raw = text.strip().lower()
    try:
        if setting.optional and raw in ("", "none"):
            return None
        if setting.kind is bool:
            if raw in _TRUE:
                return True
            if raw in _FALSE:
                return False
            raise ValueError(text)
        if setting.kind is int:
            return _coerce(setting, int(raw))
        if setting.kind is float:
            return _coerce(setting, float(raw))
        if setting.kind is Duration:
            try:
                return _coerce_duration(setting, text.strip())[0]
            except TypeError:  # bare seconds ("1.5"), as earlier versions took
                return _coerce(setting, float(raw))
        if setting.kind is Encoding:
            return _ENCODINGS[raw]
        if setting.kind is ChannelTransport:
            return parse_transport(setting, text.strip())
        if setting.kind is str:
            return text
        return setting.kind(raw)
    except (ValueError, TypeError, KeyError):
        raise ValueError(
            f"environment variable {variable or setting.env}={text!r} is not a valid "
            f"{setting.kind.__name__}"
        ) from None


_MISSING: Any = object()
# The environment is read on every ``get`` (so a variable set later takes effect), and that is
# on the message hot path: ``os.environ.get`` encodes the key and raises and catches a KeyError
# for an unset variable, about 11% of a pipelining client's CPU. ``os.environ._data`` is the
# mapping ``os.environ`` itself reads and writes (keys encoded once here), and parsed values are
# cached by their raw text, so a lookup is two dict probes and stays exact.
_env_data: Any = getattr(os.environ, "_data", None)
_encodekey: Any = getattr(os.environ, "encodekey", None)
_env_keys: dict[str, Any] = {}
_parsed: dict[str, tuple[Any, Any]] = {}


def _env_text(variable: str) -> Any:
    if _env_data is None or _encodekey is None:
        return os.environ.get(variable)
    key = _env_keys.get(variable)
    if key is None:
        key = _env_keys[variable] = _encodekey(variable)
    return _env_data.get(key)


def get(name: str) -> Any:
    """Effective value of setting ``name`` (runtime override, else environment, else default);
    durations in float seconds."""
    value = _runtime.get(name, _MISSING)  # one dict probe: atomic, no lock needed
    if value is not _MISSING:
        return value
    setting = _SETTINGS.get(name) or _setting(name)
    if setting.env is not None:
        variable = setting.env
        key = _env_keys.get(variable)  # known once read: ``_env_text`` inlined (every message)
        raw = _env_data.get(key) if key is not None else _env_text(variable)
        for alias in setting.aliases:
            if raw is not None:
                break
            variable, raw = alias, _env_text(alias)
        if raw is not None:
            cached = _parsed.get(name)
            if cached is not None and cached[0] == raw:
                return cached[1]
            text = (
                raw.decode(sys.getfilesystemencoding(), "surrogateescape")
                if isinstance(raw, bytes)
                else raw
            )
            value = _parse_env(setting, text, variable)
            _parsed[name] = (raw, value)
            return value
    return setting.default


def _public(name: str, value: Any, nanos: int | None = None) -> Any:
    """``value`` as Monarch shows it (durations as humantime strings)."""
    if _SETTINGS[name].kind is Duration and value is not None:
        return format_duration(nanos if nanos is not None else _seconds_to_nanos(value))
    return value


def configure(**kwargs: Any) -> None:
    """Override settings for this process (validated: unknown keys ``ValueError``, wrong types
    ``TypeError``; durations as ``"1m 30s"`` strings or seconds)."""
    coerced: dict[str, Any] = {}
    nanos: dict[str, int] = {}
    for name, value in kwargs.items():
        setting = _setting(name)
        if setting.kind is Duration:
            coerced[name], nanos[name] = _coerce_duration(setting, value)
        else:
            coerced[name] = _coerce(setting, value)
    with _lock:
        _runtime.update(coerced)
        for name in coerced:
            _nanos.pop(name, None)
        _nanos.update(nanos)


@contextlib.contextmanager
def configured(**kwargs: Any) -> Iterator[dict[str, Any]]:
    """Apply overrides for the duration of a ``with`` block, then restore the previous ones."""
    with _lock:
        saved, saved_nanos = dict(_runtime), dict(_nanos)
    try:
        configure(**kwargs)
        yield get_global_config()
    finally:
        with _lock:
            _runtime.clear()
            _runtime.update(saved)
            _nanos.clear()
            _nanos.update(saved_nanos)


def get_global_config() -> dict[str, Any]:
    """Every setting's effective value, as Monarch shows it (durations as ``"1m 30s"``)."""
    with _lock:
        nanos = dict(_nanos)
    return {name: _public(name, get(name), nanos.get(name)) for name in _SETTINGS}


def get_runtime_config() -> dict[str, Any]:
    """Only the overrides set with ``configure``, as Monarch shows them (``configure(**it)``
    restores them exactly)."""
    with _lock:
        return {name: _public(name, value, _nanos.get(name)) for name, value in _runtime.items()}


def clear_runtime_config() -> None:
    """Drop every ``configure`` override."""
    with _lock:
        _runtime.clear()
        _nanos.clear()
