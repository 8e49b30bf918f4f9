"""``monarch.config``: overrides, environment, validation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from monarch.config import (
    Encoding,
    _registry,
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
    settings,
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
    assert config["cleanup_timeout"] == 3.0
    assert config["codec_max_frame_length"] == 10 * 1024**3
    assert config["default_encoding"] is Encoding.Multipart
    assert config["rdma_allow_tcp_fallback"] is True
    assert set(config) == set(settings())


def test_configure_overrides_and_clear_restores() -> None:
    configure(cleanup_timeout=5)
    assert _registry.get("cleanup_timeout") == 5.0
    assert get_runtime_config() == {"cleanup_timeout": 5.0}
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
    with pytest.raises(TypeError, match="expects"):
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
