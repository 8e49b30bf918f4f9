"""The settings registry behind ``monarch.config``.

Why: Monarch exposes its runtime knobs as one flat namespace (``configure(cleanup_timeout=5)``,
or environment variables such as ``HYPERACTOR_CLEANUP_TIMEOUT``). Each known setting has a type,
a default and optionally an environment variable; the effective value is, in order of
precedence, the runtime override (``configure``), the environment, the default. Values are read
when they are used (not cached at import), so ``configured(...)`` blocks take effect at once.
Unknown names raise ``ValueError`` and values of the wrong type ``TypeError``: a typo never
silently does nothing.
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

__all__ = [
    "Encoding",
    "Setting",
    "clear_runtime_config",
    "configure",
    "configured",
    "get",
    "get_global_config",
    "get_runtime_config",
    "settings",
]


class Encoding(enum.Enum):
    """Wire encodings of Monarch messages (``default_encoding``)."""

    Multipart = "multipart"
    Bincode = "bincode"
    Json = "json"


@dataclass(frozen=True, slots=True)
class Setting:
    """One known setting: name, type, default, environment variable and meaning."""

    name: str
    kind: type
    default: Any
    env: str | None
    doc: str


_GIB = 1024**3
_SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("default_encoding", Encoding, Encoding.Multipart, None, "message encoding"),
        Setting(
            "codec_max_frame_length",
            int,
            10 * _GIB,
            "HYPERACTOR_CODEC_MAX_FRAME_LENGTH",
            "largest message (header plus buffers) in bytes",
        ),
        Setting(
            "message_delivery_timeout",
            float,
            30.0,
            "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",
            "seconds before an unacknowledged message counts as undeliverable",
        ),
        Setting(
            "mesh_orphan_timeout",
            float,
            3.0,
            "MONARCH_MESH_ORPHAN_TIMEOUT",
            "seconds of silence before a worker's parent link fails (QUIC idle timeout); a "
            "worker whose parent link stays down that long again exits",
        ),
        Setting(
            "cleanup_timeout",
            float,
            3.0,
            "HYPERACTOR_CLEANUP_TIMEOUT",
            "seconds an async __cleanup__ may run before it is cancelled",
        ),
        Setting(
            "stop_actor_timeout",
            float,
            10.0,
            "HYPERACTOR_STOP_ACTOR_TIMEOUT",
            "seconds a stop waits for the actors it stops",
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
            "fan-out of the multicast tree",
        ),
        Setting(
            "enable_log_forwarding",
            bool,
            False,
            "HYPERACTOR_MESH_ENABLE_LOG_FORWARDING",
            "forward remote stdout/stderr to the client",
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
            "RDMA buffers fall back to messages when no RDMA device exists",
        ),
        Setting(
            "rdma_disable_ibverbs",
            bool,
            False,
            "MONARCH_RDMA_DISABLE_IBVERBS",
            "never use ibverbs, even where a device exists",
        ),
        Setting(
            "rdma_max_chunk_size_mb",
            int,
            64,
            "MONARCH_RDMA_MAX_CHUNK_SIZE_MB",
            "chunk size of TCP-fallback transfers, MiB",
        ),
        Setting(
            "rdma_tcp_fallback_parallelism",
            int,
            1,
            "MONARCH_RDMA_TCP_FALLBACK_PARALLELISM",
            "parallel channels of TCP-fallback transfers",
        ),
        # -- mailbox bytes and liveness (issue 15 items 6 and 2) --
        Setting(
            "supervision_watchdog_timeout",
            float,
            120.0,
            "HYPERACTOR_MESH_SUPERVISION_WATCHDOG_TIMEOUT",
            "seconds a worker process may leave the client's heartbeats unanswered before it is "
            "declared dead and fenced (0 turns the check off)",
        ),
        Setting(
            "actor_mailbox_max_bytes",
            int,
            1 * _GIB,
            "MONARCH_ACTOR_MAILBOX_MAX_BYTES",
            "bytes of messages queued per actor before new calls bounce (one larger message is "
            "still accepted into an empty mailbox)",
        ),
    )
}

_runtime: dict[str, Any] = {}
_lock = threading.Lock()

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def settings() -> dict[str, Setting]:
    """Every known setting by name."""
    return dict(_SETTINGS)


def _setting(name: str) -> Setting:
    try:
        return _SETTINGS[name]
    except KeyError:
        known = ", ".join(sorted(_SETTINGS))
        raise ValueError(f"unknown monarch config key {name!r}; known keys: {known}") from None


def _coerce(setting: Setting, value: Any) -> Any:
    kind = setting.kind
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
    elif isinstance(value, kind):
        return value
    raise TypeError(
        f"monarch config {setting.name!r} expects a non-negative {kind.__name__}, got {value!r}"
    )


def _parse_env(setting: Setting, text: str) -> Any:
    raw = text.strip().lower()
    try:
        if setting.kind is bool:
            if raw in _TRUE:
                return True
            if raw in _FALSE:
                return False
            raise ValueError(text)
        if setting.kind is int:
            return _coerce(setting, int(raw))
        if setting.kind is float:
            for suffix, scale in (("ms", 1e-3), ("s", 1.0), ("m", 60.0)):
                if raw.endswith(suffix):
                    return _coerce(setting, float(raw[: -len(suffix)]) * scale)
            return _coerce(setting, float(raw))
        return setting.kind(raw)
    except (ValueError, TypeError):
        raise ValueError(
            f"environment variable {setting.env}={text!r} is not a valid {setting.kind.__name__}"
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


def _env_text(setting: Setting) -> Any:
    assert setting.env is not None
    if _env_data is None or _encodekey is None:
        return os.environ.get(setting.env)
    key = _env_keys.get(setting.name)
    if key is None:
        key = _env_keys[setting.name] = _encodekey(setting.env)
    return _env_data.get(key)


def get(name: str) -> Any:
    """Effective value of setting ``name`` (runtime override, else environment, else default)."""
    value = _runtime.get(name, _MISSING)  # one dict probe: atomic, no lock needed
    if value is not _MISSING:
        return value
    setting = _SETTINGS.get(name) or _setting(name)
    if setting.env is not None:
        raw = _env_text(setting)
        if raw is not None:
            cached = _parsed.get(name)
            if cached is not None and cached[0] == raw:
                return cached[1]
            text = (
                raw.decode(sys.getfilesystemencoding(), "surrogateescape")
                if isinstance(raw, bytes)
                else raw
            )
            value = _parse_env(setting, text)
            _parsed[name] = (raw, value)
            return value
    return setting.default


def configure(**kwargs: Any) -> None:
    """Override settings for this process (validated: unknown keys ``ValueError``)."""
    coerced = {name: _coerce(_setting(name), value) for name, value in kwargs.items()}
    with _lock:
        _runtime.update(coerced)


@contextlib.contextmanager
def configured(**kwargs: Any) -> Iterator[dict[str, Any]]:
    """Apply overrides for the duration of a ``with`` block, then restore the previous ones."""
    with _lock:
        saved = dict(_runtime)
    try:
        configure(**kwargs)
        yield get_global_config()
    finally:
        with _lock:
            _runtime.clear()
            _runtime.update(saved)


def get_global_config() -> dict[str, Any]:
    """Every setting's effective value."""
    return {name: get(name) for name in _SETTINGS}


def get_runtime_config() -> dict[str, Any]:
    """Only the overrides set with ``configure``."""
    with _lock:
        return dict(_runtime)


def clear_runtime_config() -> None:
    """Drop every ``configure`` override."""
    with _lock:
        _runtime.clear()
