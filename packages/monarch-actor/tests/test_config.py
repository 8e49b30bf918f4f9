"""``monarch.config``: overrides, environment, validation."""

from __future__ import annotations

import ast
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.config import (
    ChannelTransport,
    Encoding,
    _registry,
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
    settings,
)
from monarch.config._duration import (
    MAX_NANOS,
    DurationError,
    format_duration,
    parse_duration,
)


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    saved = get_runtime_config()
    clear_runtime_config()
    yield
    clear_runtime_config()
    configure(**saved)


def test_defaults_match_monarch() -> None:
    config = get_global_config()
    assert config["cleanup_timeout"] == "3s"
    assert config["codec_max_frame_length"] == 10 * 1024**3
    assert config["default_encoding"] is Encoding.Multipart
    assert config["rdma_allow_tcp_fallback"] is True
    assert set(config) == set(settings())


def test_configure_overrides_and_clear_restores() -> None:
    configure(cleanup_timeout=5)
    assert _registry.get("cleanup_timeout") == 5.0
    assert get_runtime_config() == {"cleanup_timeout": "5s"}
    clear_runtime_config()
    assert _registry.get("cleanup_timeout") == 3.0


def test_configured_is_scoped() -> None:
    configure(port_queue_capacity=10)
    with configured(port_queue_capacity=20, enable_log_forwarding=True) as effective:
        assert effective["port_queue_capacity"] == 20
        assert _registry.get("enable_log_forwarding") is True
    assert get_runtime_config() == {"port_queue_capacity": 10}


def test_unknown_keys_and_bad_types_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown monarch config key"):
        configure(no_such_key=1)
    with pytest.raises(TypeError, match="Invalid duration format"):
        configure(cleanup_timeout="soon")
    with pytest.raises(TypeError):
        configure(actor_mailbox_capacity=-1)
    with pytest.raises(TypeError):
        configure(enable_log_forwarding=1)


def test_environment_sits_between_overrides_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERACTOR_CLEANUP_TIMEOUT", "250ms")
    assert _registry.get("cleanup_timeout") == pytest.approx(0.25)
    monkeypatch.setenv("MONARCH_RDMA_ALLOW_TCP_FALLBACK", "false")
    assert _registry.get("rdma_allow_tcp_fallback") is False
    configure(cleanup_timeout=1)
    assert _registry.get("cleanup_timeout") == 1.0
    monkeypatch.setenv("MONARCH_ACTOR_MAILBOX_CAPACITY", "lots")
    with pytest.raises(ValueError, match="MONARCH_ACTOR_MAILBOX_CAPACITY"):
        _registry.get("actor_mailbox_capacity")


#: Every key ``monarch.config.get_global_config()`` of Monarch 0.7.0 (torchmonarch 0.7.0) lists.
MONARCH_0_7_KEYS = [
    "actor_spawn_max_idle",
    "channel_net_rx_buffer_full_check_interval",
    "channel_reconnect_timeout",
    "channel_tcp_congestion",
    "channel_tcp_keepalive_idle",
    "cleanup_timeout",
    "codec_max_frame_length",
    "default_encoding",
    "default_transport",
    "enable_dest_actor_reordering_buffer",
    "enable_file_capture",
    "enable_log_forwarding",
    "enable_otel_metrics",
    "enable_otel_tracing",
    "enable_recorder_tracing",
    "enable_sqlite_tracing",
    "enable_unawaited_python_task_traceback",
    "file_log_level",
    "force_file_log",
    "forwarder_flush_timeout",
    "get_actor_state_max_idle",
    "get_proc_state_max_idle",
    "host_spawn_ready_timeout",
    "max_cast_dimension_size",
    "max_cast_fanout",
    "mesh_admin_addr",
    "mesh_admin_config_dump_bridge_timeout",
    "mesh_admin_max_concurrent_resolves",
    "mesh_admin_pyspy_bridge_timeout",
    "mesh_admin_pyspy_client_timeout",
    "mesh_admin_pyspy_max_profile_duration",
    "mesh_admin_pyspy_timeout",
    "mesh_admin_query_child_timeout",
    "mesh_admin_resolve_actor_timeout",
    "mesh_admin_single_host_timeout",
    "mesh_admin_tree_timeout",
    "mesh_attach_config_timeout",
    "mesh_bootstrap_enable_pdeathsig",
    "mesh_orphan_timeout",
    "mesh_proc_spawn_max_idle",
    "mesh_terminate_concurrency",
    "mesh_terminate_timeout",
    "message_ack_every_n_messages",
    "message_ack_time_interval",
    "message_delivery_timeout",
    "message_latency_sampling_rate",
    "message_ttl_default",
    "monarch_log_suffix",
    "otel_metric_export_interval",
    "pending_actor_delivery_timeout",
    "prefix_with_rank",
    "proc_launcher_kind",
    "proc_stop_max_idle",
    "process_exit_timeout",
    "process_memory_metric_interval",
    "pyspy_bin",
    "rdma_allow_tcp_fallback",
    "rdma_cq_poller_per_device",
    "rdma_disable_ibverbs",
    "rdma_host_odp",
    "rdma_ibverbs_target",
    "rdma_max_chunk_size_mb",
    "rdma_max_nics_per_buffer",
    "rdma_min_stripe_size_kb",
    "rdma_peer_device_affinity",
    "rdma_qp_init_timeout",
    "rdma_qps_per_cq",
    "rdma_qps_per_peer",
    "rdma_runtime_worker_threads",
    "rdma_tcp_fallback_parallelism",
    "read_log_buffer",
    "scuba_log_enter_exit",
    "sequencer_max_locked_keys",
    "server_heartbeat_interval",
    "small_write_threshold",
    "split_max_buffer_age",
    "split_max_buffer_size",
    "stop_actor_timeout",
    "stop_grace_period",
    "supervision_watchdog_timeout",
    "tail_log_lines",
    "terminated_snapshot_retention",
    "tokio_worker_threads",
    "use_direct_spawn",
]


def _other_value(name: str, value: Any) -> Any:
    """A valid value of setting ``name`` different from ``value`` (its current one)."""
    kind = settings()[name].kind
    if kind is bool:
        return not value
    if kind is int:
        return (value or 0) + 7
    if kind is float:
        return 0.5 if value != 0.5 else 0.25
    if kind is str:
        return value + "x"
    if kind is Encoding:
        return Encoding.Json
    if kind is ChannelTransport:
        return ChannelTransport.TcpWithHostname
    if kind is slice:
        return slice(1000, 2000)
    return "1m 30s" if value != "1m 30s" else "7s"  # Duration


def test_every_monarch_0_7_key_is_accepted_and_round_trips() -> None:
    assert len(MONARCH_0_7_KEYS) == 84
    config = get_global_config()
    assert set(MONARCH_0_7_KEYS) <= set(config)
    for name in MONARCH_0_7_KEYS:
        default = config[name]
        configure(**{name: default})  # what get_global_config shows is accepted back
        assert get_global_config()[name] == default, name
        new = _other_value(name, default)
        configure(**{name: new})
        assert get_global_config()[name] == new, name
        assert get_runtime_config()[name] == new, name
    snapshot = get_runtime_config()
    clear_runtime_config()
    assert get_global_config() == config
    configure(**snapshot)  # a runtime snapshot restores exactly
    assert get_runtime_config() == snapshot


def test_the_keys_of_the_issue_take_monarch_values() -> None:
    with configured(
        process_exit_timeout="1m 30s",
        host_spawn_ready_timeout="90s",
        codec_max_frame_length=1 << 20,
    ) as config:
        assert config["process_exit_timeout"] == "1m 30s"
        assert config["host_spawn_ready_timeout"] == "1m 30s"
        assert config["codec_max_frame_length"] == 1 << 20
        assert _registry.get("process_exit_timeout") == 90.0
    assert get_global_config()["host_spawn_ready_timeout"] == "30s"


@pytest.mark.parametrize(
    ("given_text", "shown"),
    [
        ("30s", "30s"),
        ("5m", "5m"),
        ("2h", "2h"),
        ("90s", "1m 30s"),
        ("1h 30m", "1h 30m"),
        ("1h30m", "1h 30m"),
        ("300s", "5m"),
        ("500ms", "500ms"),
        ("1.5s", "1s 500ms"),
        ("1500ms", "1s 500ms"),
        ("0", "0s"),
        ("1d", "1day"),
        ("1w", "7days"),
        ("2 min", "2m"),
        ("1000us", "1ms"),
        ("5µs", "5us"),
        ("0.5months", "15days 5h 16m 48s"),
        ("86399s", "23h 59m 59s"),
        ("31557600s", "1year"),
        ("1.123456789s", "1s 123ms 456us 789ns"),
        ("  5s ", "5s"),
        ("5ms5s", "5s 5ms"),
    ],
)
def test_duration_strings_read_back_as_monarch_shows_them(given_text: str, shown: str) -> None:
    with configured(host_spawn_ready_timeout=given_text) as config:
        assert config["host_spawn_ready_timeout"] == shown
        assert get_runtime_config()["host_spawn_ready_timeout"] == shown


@pytest.mark.parametrize(
    "bad", ["invalid", "30", "abc123", "", "-5s", "5S", "1.5ns", "1e3s", "5m30", "1h, 30m"]
)
def test_malformed_durations_raise_type_error(bad: str) -> None:
    with pytest.raises(TypeError, match="Invalid duration format"):
        configure(message_delivery_timeout=bad)
    assert get_runtime_config() == {}


def test_durations_still_take_seconds_and_refuse_other_types() -> None:
    configure(cleanup_timeout=2.5, stop_actor_timeout=0)
    assert _registry.get("cleanup_timeout") == 2.5
    assert get_runtime_config() == {"cleanup_timeout": "2s 500ms", "stop_actor_timeout": "0s"}
    for bad in (True, -1, math.nan, math.inf, [1], None):
        with pytest.raises(TypeError):
            configure(process_exit_timeout=bad)


def test_wrong_types_and_unknown_keys_of_the_new_settings() -> None:
    with pytest.raises(TypeError):
        configure(message_ack_every_n_messages="100")
    with pytest.raises(TypeError):
        configure(enable_dest_actor_reordering_buffer="true")
    with pytest.raises(TypeError):
        configure(message_latency_sampling_rate="0.5")
    with pytest.raises(TypeError):
        configure(default_encoding="bincode")
    with pytest.raises(TypeError):
        configure(default_transport=42)
    with pytest.raises(ValueError):
        configure(default_transport="random_string")
    with pytest.raises(ValueError, match="must not be 0"):
        configure(rdma_max_nics_per_buffer=0)
    with pytest.raises(ValueError, match="unknown monarch config key"):
        configure(process_exit_timeout_typo="1s")
    configure(rdma_max_nics_per_buffer=None, default_transport="tcp")
    assert get_global_config()["default_transport"] is ChannelTransport.TcpWithHostname
    configure(default_transport="tcp://127.0.0.1:8080")
    assert get_global_config()["default_transport"] == "tcp://127.0.0.1:8080"


def test_monarch_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERACTOR_PROCESS_EXIT_TIMEOUT", "1m 30s")
    monkeypatch.setenv("HYPERACTOR_MESH_ORPHAN_TIMEOUT", "2s")  # Monarch's name, an alias here
    monkeypatch.setenv("HYPERACTOR_DEFAULT_ENCODING", "serde_json")
    monkeypatch.setenv("PYSPY_BIN", "/opt/Py-Spy")
    config = get_global_config()
    assert config["process_exit_timeout"] == "1m 30s"
    assert _registry.get("process_exit_timeout") == 90.0
    assert config["mesh_orphan_timeout"] == "2s"
    assert config["default_encoding"] is Encoding.Json
    assert config["pyspy_bin"] == "/opt/Py-Spy"
    monkeypatch.setenv("MONARCH_MESH_ORPHAN_TIMEOUT", "1.5")  # bare seconds, as before
    assert _registry.get("mesh_orphan_timeout") == 1.5
    monkeypatch.setenv("HYPERACTOR_SPLIT_MAX_BUFFER_AGE", "soon")
    with pytest.raises(ValueError, match="HYPERACTOR_SPLIT_MAX_BUFFER_AGE"):
        get_global_config()


nanos = st.integers(0, MAX_NANOS)


@given(nanos)
def test_format_then_parse_is_the_identity(value: int) -> None:
    text = format_duration(value)
    assert parse_duration(text) == value
    assert format_duration(parse_duration(text)) == text


_UNIT_NS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.sampled_from(sorted(_UNIT_NS)),
            st.sampled_from(["", " ", "\t"]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_components_add_up(parts: list[tuple[int, str, str]]) -> None:
    text = " ".join(f"{n}{space}{unit}" for n, unit, space in parts)
    assert parse_duration(text) == sum(n * _UNIT_NS[unit] for n, unit, _ in parts)


@given(st.text(max_size=30))
def test_any_text_parses_or_raises_duration_error(text: str) -> None:
    try:
        value = parse_duration(text)
    except DurationError as exc:
        message = str(exc)
        value = None
    if value is None:
        assert "Invalid duration format" in message
    else:
        assert 0 <= value <= MAX_NANOS
        assert parse_duration(format_duration(value)) == value


def test_overlong_and_overflowing_durations_are_refused() -> None:
    with pytest.raises(DurationError, match="longer than"):
        parse_duration("1s " * 1000)
    with pytest.raises(DurationError, match="too large"):
        parse_duration("18446744073709551616s")
    assert parse_duration("18446744073709551615s 999999999ns") == MAX_NANOS
    with pytest.raises(DurationError, match="too large"):
        parse_duration("18446744073709551615s 1s")


@pytest.mark.slow
def test_host_spawn_ready_timeout_bounds_a_worker_that_never_starts(tmp_path: Any) -> None:
    script = tmp_path / "client.py"
    script.write_text(
        "import sys\n"
        "from monarch.actor import BootstrapCommand, this_host\n"
        "from monarch.config import configure\n"
        "if __name__ == '__main__':\n"
        "    configure(host_spawn_ready_timeout='1s')\n"
        "    sleep = ['-c', 'import time; time.sleep(60)']\n"
        "    hang = BootstrapCommand(sys.executable, None, sleep, {})\n"
        "    procs = this_host().spawn_procs({'gpus': 1}, bootstrap_command=hang)\n"
        "    try:\n"
        "        procs.initialized.get(timeout=25)\n"
        "    except Exception as exc:\n"
        "        print('FAILED', exc)\n"
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "FAILED" in done.stdout, done
    assert "did not start in time" in done.stdout, done
    assert time.monotonic() - start < 20  # not the 30 s default


def test_no_setting_is_declared_twice() -> None:
    # The registry is a dict built from Setting(...) records: a second record with a name
    # already used would silently replace the first one.
    tree = ast.parse(Path(_registry.__file__).read_text())
    names = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Setting"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    assert not duplicates
    assert len(names) == len(settings())


def test_the_rdma_keys_exist_with_their_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known = settings()
    for name, env in {
        "rdma_allow_tcp_fallback": "MONARCH_RDMA_ALLOW_TCP_FALLBACK",
        "rdma_disable_ibverbs": "MONARCH_RDMA_DISABLE_IBVERBS",
        "rdma_max_chunk_size_mb": "MONARCH_RDMA_MAX_CHUNK_SIZE_MB",
        "rdma_tcp_fallback_parallelism": "MONARCH_RDMA_TCP_FALLBACK_PARALLELISM",
        "rdma_net_chunks_in_flight": "MONARCH_RDMA_NET_CHUNKS_IN_FLIGHT",  # monarch-rdma's own
        "rdma_disable_shm": "MONARCH_RDMA_DISABLE_SHM",  # monarch-rdma's own
    }.items():
        assert known[name].env == env
    assert get_global_config()["rdma_net_chunks_in_flight"] == 4
    monkeypatch.setenv("MONARCH_RDMA_NET_CHUNKS_IN_FLIGHT", "8")
    assert get_global_config()["rdma_net_chunks_in_flight"] == 8
    with pytest.raises(ValueError, match="must not be 0"):
        configure(rdma_net_chunks_in_flight=0)
    assert get_global_config()["rdma_disable_shm"] is False
    monkeypatch.setenv("MONARCH_RDMA_DISABLE_SHM", "1")
    assert get_global_config()["rdma_disable_shm"] is True
