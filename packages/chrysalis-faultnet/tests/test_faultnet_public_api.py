"""The public API of chrysalis.faultnet is exactly what the facade declares."""

from __future__ import annotations

import importlib
from pathlib import Path

import chrysalis.faultnet

EXPECTED = {
    "DRAWS_PER_DECISION",
    "FAULTNET_SCHEME",
    "INPROC_INNER",
    "MAX_FAULT_SECONDS",
    "MAX_HELD_LIMIT",
    "MAX_NETWORK_SOCKETS",
    "MAX_PARTITIONED_PEERS",
    "MAX_REORDER_WINDOW",
    "TIMER_MAX_WAIT",
    "Admission",
    "BindableNetwork",
    "FaultDecision",
    "FaultDirection",
    "FaultPlan",
    "FaultSchedule",
    "FaultStatistics",
    "FaultyNetwork",
    "FaultySocket",
    "derive_seed",
    "faultnet_address",
    "new_inproc_network",
    "open_faultnet",
}


def test_all_is_exactly_the_public_api() -> None:
    assert set(chrysalis.faultnet.__all__) == EXPECTED
    assert len(chrysalis.faultnet.__all__) == len(EXPECTED)
    public = {n for n in vars(chrysalis.faultnet) if not n.startswith("_")}
    modules = {"annotations"} | {
        n for n in public if type(getattr(chrysalis.faultnet, n)).__name__ == "module"
    }
    assert public - modules == EXPECTED


def test_every_name_is_importable() -> None:
    for name in EXPECTED:
        assert getattr(chrysalis.faultnet, name) is not None


def test_chrysalis_stays_a_namespace_package() -> None:
    namespace = importlib.import_module("chrysalis")
    assert getattr(namespace, "__file__", None) is None
    src = Path(chrysalis.faultnet.__file__).parent.parent
    assert not (src / "__init__.py").exists()


def test_pure_core_imports_no_io_modules() -> None:
    source = Path(chrysalis.faultnet.__file__).with_name("_plan.py").read_text()
    for banned in ("import socket", "import asyncio", "import trio", "import time", "threading"):
        assert banned not in source, banned
