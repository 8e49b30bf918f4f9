"""The facade exports exactly the public API; pure modules stay pure."""

from __future__ import annotations

import importlib

import monarch.actor
import monarch.config

EXPECTED = {
    "attach",
    "start_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "returns_future",
    "enable_transport",
    "Uid",
    "ChannelTransport",
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorId",
    "ActorMesh",
    "BootstrapCommand",
    "ChainLink",
    "Channel",
    "Context",
    "Endpoint",
    "ErrorCategory",
    "Extent",
    "FailureEvent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "MeshTrait",
    "Point",
    "Port",
    "PortClosedError",
    "PortOverflowError",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "Region",
    "Shape",
    "Slice",
    "SupervisionError",
    "SupervisionRecord",
    "ValueMesh",
    "add_supervision_listener",
    "as_endpoint",
    "attach_to_workers",
    "chrome_trace",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "disable_telemetry",
    "enable_telemetry",
    "endpoint",
    "finished_spans",
    "get_meter",
    "get_or_spawn_controller",
    "metrics_snapshot",
    "run_worker_loop_forever",
    "send",
    "shutdown_context",
    "span",
    "supervision_events",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
}


def test_all_is_exactly_the_expected_set_and_sorted() -> None:
    assert set(monarch.actor.__all__) == EXPECTED
    assert monarch.actor.__all__ == sorted(monarch.actor.__all__)
    for name in monarch.actor.__all__:
        assert getattr(monarch.actor, name) is not None, name


def test_public_classes_claim_the_facade() -> None:
    for name in EXPECTED:
        value = getattr(monarch.actor, name)
        if isinstance(value, type):
            assert value.__module__ == "monarch.actor", name


def test_errors_have_the_reference_bases() -> None:
    assert issubclass(monarch.actor.SupervisionError, RuntimeError)
    assert issubclass(monarch.actor.ActorError, Exception)


def test_the_in_process_helper_is_reachable_but_private() -> None:
    assert callable(monarch.actor._local_proc_mesh)
    assert "_local_proc_mesh" not in monarch.actor.__all__


def test_testing_module_exports_the_supervision_barrier() -> None:
    import monarch.actor.testing
    from monarch.actor._hosts import settle

    assert monarch.actor.testing.__all__ == ["flush_supervision"]
    assert monarch.actor.testing.flush_supervision is settle.flush_supervision
    assert "flush_supervision" not in monarch.actor.__all__


def test_config_module_has_the_log_prefix_flag() -> None:
    assert monarch.actor.config.prefix_python_logs_with_actor is True


def test_sans_io_modules_import_no_io_loops_or_clocks() -> None:
    for module in ("shape", "value_mesh", "codec", "envelope", "errors", "ids"):
        loaded = importlib.import_module(f"monarch.actor._base.{module}")
        for forbidden in ("socket", "asyncio", "trio", "time", "threading"):
            assert forbidden not in vars(loaded), (module, forbidden)


def test_importing_the_package_does_not_import_torch_or_numpy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, monarch.actor, monarch.config\n"
        "print(sorted(m for m in ('torch', 'numpy', 'cloudpickle') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_monarch_config_exports() -> None:
    assert set(monarch.config.__all__) == {
        "Encoding",
        "Setting",
        "clear_runtime_config",
        "configure",
        "configured",
        "get_global_config",
        "get_runtime_config",
        "settings",
    }
