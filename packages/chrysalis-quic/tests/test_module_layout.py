"""The old private module paths stay importable after the split of ``_driver`` and the move of
the engines into ``_engines`` (code merged from older branches still imports them)."""

from __future__ import annotations

import importlib

import pytest

from chrysalis.quic import _driver, _endpoint_core, _errors, _stream_core
from chrysalis.quic._engines import DEFAULT_ENGINE
from chrysalis.quic._engines.aioquic import AioquicEngine
from chrysalis.quic._engines.base import AUTHENTICATION_FAILED_CODE


def test_the_driver_module_re_exports_what_moved_out_of_it() -> None:
    for module in (_errors, _stream_core, _endpoint_core):
        for name in module.__all__:
            assert getattr(_driver, name) is getattr(module, name), name


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("_engine", "base"),
        ("_aioquic_engine", "aioquic"),
        ("_aioquic_fast", "aioquic_fast"),
        ("_qh3_engine", "qh3"),
        ("_client_proof", "client_proof"),
    ],
)
def test_old_engine_paths_are_the_moved_modules(old: str, new: str) -> None:
    if new == "qh3":
        pytest.importorskip("qh3")
    moved = importlib.import_module(f"chrysalis.quic._engines.{new}")
    assert importlib.import_module(f"chrysalis.quic.{old}") is moved


def test_the_default_engine_and_the_authentication_code() -> None:
    endpoint = importlib.import_module("chrysalis.quic._endpoint")
    assert DEFAULT_ENGINE is AioquicEngine
    assert endpoint.AUTHENTICATION_FAILED_CODE == AUTHENTICATION_FAILED_CODE == 1
