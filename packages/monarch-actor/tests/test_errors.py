"""Errors and supervision without process death (behaviour catalogue 5.3, in process)."""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from monarch.actor import (
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    ErrorCategory,
    MeshFailure,
    Port,
    ProcMesh,
    SupervisionError,
    concurrent_endpoint,
    context,
    current_rank,
    endpoint,
    this_proc,
)
from monarch.actor._base.errors import FailureEvent

Procs = Callable[..., ProcMesh]
T = 5.0


class Fatal(BaseException):
    pass


class Faulty(Actor):
    def __init__(self, fail_init: bool = False) -> None:
        if fail_init:
            raise ValueError("init went wrong")

    @endpoint
    def ok(self) -> str:
        return "ok"

    @endpoint
    def boom(self, message: str = "boom") -> None:
        raise ValueError(message)

    @endpoint
    def chained(self) -> None:
        try:
            raise KeyError("inner problem")
        except KeyError as exc:
            raise ValueError("outer problem") from exc

    @endpoint
    def during(self) -> None:
        try:
            raise KeyError("first problem")
        except KeyError:
            raise ValueError("second problem")  # noqa: B904 (the chaining is the point)

    @endpoint
    def fatal(self) -> None:
        raise Fatal("fatal problem")

    @endpoint(explicit_response_port=True)
    def explicit_boom(self, port: Port[int]) -> None:
        raise ValueError("explicit boom")

    @endpoint
    def abort_me(self, reason: str | None) -> None:
        context().actor_instance.abort(reason)

    @endpoint
    def fail_on(self, rank: int) -> None:
        if current_rank()["gpus"] == rank:
            raise ValueError(f"rank {rank} fails")

    @endpoint
    def unpicklable_result(self) -> Any:
        return threading_lock()

    @endpoint
    def send_to(self, mesh: Any) -> None:
        mesh.ok.broadcast()


def threading_lock() -> Any:
    import threading

    return threading.Lock()


class AsyncFaulty(Actor):
    @endpoint
    async def boom(self) -> None:
        await asyncio.sleep(0)
        raise ValueError("async boom")

    @endpoint
    async def ok(self) -> str:
        return "ok"


class ConcurrentFaulty(Actor):
    @concurrent_endpoint
    async def fail(self) -> None:
        raise ValueError("concurrent boom")

    @concurrent_endpoint(explicit_response_port=True)
    async def fail_explicit(self, port: Port[None]) -> None:
        raise ValueError("explicit concurrent boom")

    @endpoint
    async def ping(self) -> str:
        return "pong"


class Watched:
    """An actor mixin: ``watch(port)`` makes :meth:`_tell` send on that port, so that a test
    waits on the port's receiver for what the actor saw instead of polling an endpoint."""

    watcher: Port[str] | None = None

    @endpoint
    def watch(self, watcher: Port[str]) -> None:
        self.watcher = watcher

    def _tell(self, what: str) -> None:
        if self.watcher is not None:
            self.watcher.send(what)


class Swallower(Watched, Faulty):
    def __init__(self) -> None:
        super().__init__()
        self.bounced: list[tuple[str, str, str]] = []

    def _handle_undeliverable_message(self, envelope: Any) -> bool:
        self.bounced.append((envelope.sender(), envelope.dest(), envelope.error_msg()))
        self._tell("bounced")
        return True

    @endpoint
    def bounces(self) -> list[tuple[str, str, str]]:
        return self.bounced


class Supervisor(Watched, Actor):
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.failures: list[MeshFailure] = []
        self.child: Any = None

    @endpoint
    def spawn_child(self, ranks: int = 1) -> str:
        pm = context().actor_instance.proc_mesh
        assert pm is not None
        self.child = pm.spawn("child", Faulty)
        return str(self.child._name.get(timeout=T))

    @endpoint
    def kill_child(self) -> None:
        self.child.boom.broadcast("child failure")

    @endpoint
    def seen(self) -> list[tuple[str, str, list[int], str]]:
        return [(str(f), f.mesh_name, f.crashed_ranks, f.report()) for f in self.failures]

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure)
        self._tell("supervised")
        if self.mode == "raise":
            raise RuntimeError("supervise raised on purpose")
        return self.mode == "handle"


class Cleaner(Actor):
    def __init__(self, log: Any, child: bool = False) -> None:
        self.log = log
        self.kid: Any = None
        if not child:
            self.kid = this_proc().spawn("kid", Cleaner, log, True)

    @endpoint
    def ok(self) -> str:
        return "ok"

    def __cleanup__(self, exc: BaseException | None) -> None:
        name = "child" if self.kid is None else "parent"
        self.log.record.broadcast(f"{name} cleanup {exc is None}")


class Recorder(Actor):
    def __init__(self) -> None:
        self.items: list[str] = []

    @endpoint
    def record(self, item: str) -> None:
        self.items.append(item)

    @endpoint
    def recorded(self) -> list[str]:
        return self.items


class AsyncCleaner(Actor):
    def __init__(self, log: Any) -> None:
        self.log = log

    @endpoint
    async def ok(self) -> str:
        return "ok"

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await asyncio.sleep(0)
        self.log.record.broadcast("async cleanup")


class BadCleanup(Actor):
    @endpoint
    def ok(self) -> str:
        return "ok"

    def __cleanup__(self, exc: BaseException | None) -> None:
        raise RuntimeError("cleanup exploded")


# -- spawn-time validation ------------------------------------------------------------------------
class Mixed(Actor):
    @endpoint
    def a(self) -> None: ...

    @endpoint
    async def b(self) -> None: ...


class SyncWithAsyncCleanup(Actor):
    @endpoint
    def a(self) -> None: ...

    async def __cleanup__(self, exc: BaseException | None) -> None: ...


class SyncWithAsyncSupervise(Actor):
    @endpoint
    def a(self) -> None: ...

    async def __supervise__(self, failure: MeshFailure) -> bool:
        return True


class AsyncWithSyncSupervise(Actor):
    @endpoint
    async def a(self) -> None: ...

    def __supervise__(self, failure: MeshFailure) -> bool:
        return True


class Reserved(Actor):
    @endpoint
    def slice(self) -> None: ...  # type: ignore[override]


def test_mixing_sync_and_async_endpoints_is_rejected_at_spawn(procs: Procs) -> None:
    pm = procs(gpus=1)
    with pytest.raises(ValueError, match="mixes both async and sync"):
        pm.spawn("mixed", Mixed)
    with pytest.raises(ValueError, match="mixes both async and sync"):
        pm.spawn("cleanup", SyncWithAsyncCleanup)
    with pytest.raises(ValueError, match="mixes both async and sync"):
        pm.spawn("supervise", SyncWithAsyncSupervise)
    pm.spawn("allowed", AsyncWithSyncSupervise).initialized.get(timeout=T)


def test_reserved_endpoint_names_and_non_actors_are_rejected(procs: Procs) -> None:
    pm = procs(gpus=1)
    with pytest.raises(ValueError, match="collides with an endpoint name"):
        pm.spawn("reserved", Reserved)
    with pytest.raises(ValueError, match="not a subclass"):
        pm.spawn("plain", dict)


def test_concurrent_endpoint_decorator_checks() -> None:
    assert ConcurrentFaulty.fail._explicit_response_port
    assert ConcurrentFaulty.fail_explicit._explicit_response_port
    assert not ConcurrentFaulty.ping._explicit_response_port
    with pytest.raises(ValueError, match="does not wrap @endpoint"):
        concurrent_endpoint(cast(Any, endpoint(AsyncFaulty.ok._method)))
    with pytest.raises(ValueError, match="can only wrap async endpoints"):

        class SyncConcurrent(Actor):
            @concurrent_endpoint  # type: ignore[arg-type]
            def ping(self) -> str:
                return "pong"


# -- ActorError: reply port present, the actor survives --------------------------------------------
def test_endpoint_exception_reaches_the_caller_as_actor_error(procs: Procs, faults: Any) -> None:
    mesh = procs(gpus=2).spawn("faulty", Faulty)
    with pytest.raises(ActorError, match="boom") as info:
        mesh.slice(gpus=0).boom.call_one().get(timeout=T)
    assert isinstance(info.value.exception, ValueError)
    assert info.value.message == "Actor call faulty.boom failed."
    assert info.value.category == ErrorCategory.USER
    with pytest.raises(ActorError, match="boom"):
        mesh.boom.call().get(timeout=T)
    assert mesh.ok.call().get(timeout=T).values() == ["ok", "ok"]
    assert faults.failures == []


def test_async_endpoint_exception_is_an_actor_error_too(procs: Procs) -> None:
    mesh = procs(gpus=1).spawn("async_faulty", AsyncFaulty)
    with pytest.raises(ActorError, match="async boom"):
        mesh.boom.call_one().get(timeout=T)
    assert mesh.ok.call_one().get(timeout=T) == "ok"


def test_call_fails_with_the_lowest_failing_rank(procs: Procs) -> None:
    mesh = procs(gpus=4).spawn("faulty", Faulty)
    with pytest.raises(ActorError, match="rank 2 fails"):
        mesh.fail_on.call(2).get(timeout=T)


@pytest.mark.parametrize(
    ("endpoint_name", "phrase", "inner", "outer"),
    [
        ("chained", "direct cause", "inner problem", "outer problem"),
        ("during", "During handling", "first problem", "second problem"),
    ],
)
def test_actor_error_message_carries_chaining(
    procs: Procs, endpoint_name: str, phrase: str, inner: str, outer: str
) -> None:
    mesh = procs(gpus=1).spawn("faulty", Faulty)
    with pytest.raises(ActorError) as info:
        getattr(mesh, endpoint_name).call_one().get(timeout=T)
    text = str(info.value)
    assert inner in text
    assert outer in text
    assert phrase in text
    assert "Traceback of where the remote call failed" in text


def test_unpicklable_result_is_reported_as_actor_error(procs: Procs) -> None:
    mesh = procs(gpus=1).spawn("faulty", Faulty)
    with pytest.raises(ActorError, match="could not be pickled"):
        mesh.unpicklable_result.call_one().get(timeout=T)
    assert mesh.ok.call_one().get(timeout=T) == "ok"


def test_actor_error_pickles() -> None:
    error = ActorError(ValueError("x"), "Actor call a.b failed.")
    back = pickle.loads(pickle.dumps(error))
    assert str(back) == str(error)
    assert isinstance(back.exception, ValueError)


# -- failures: the actor dies ---------------------------------------------------------------------
def test_init_failure_resolves_initialized_and_reports_every_rank(
    procs: Procs, faults: Any
) -> None:
    mesh = procs(gpus=2).spawn("bad_init", Faulty, True)
    assert mesh.initialized.get(timeout=T) is None
    failures = faults.wait_for(2)
    path = mesh._name.get()
    assert sorted(f.crashed_ranks[0] for f in failures) == [0, 1]
    for failure in failures:
        assert failure.mesh_name == path
        assert "init went wrong" in failure.report()
    with pytest.raises(SupervisionError, match="init went wrong"):
        mesh.ok.call().get(timeout=T)


def test_broadcast_exception_kills_the_actor(procs: Procs, faults: Any) -> None:
    mesh = procs(gpus=1).spawn("faulty", Faulty)
    mesh.boom.broadcast("nobody was listening")
    (failure,) = faults.wait_for(1)
    assert "nobody was listening" in failure.report()
    assert "faulty" in failure.report()
    assert failure.category == ErrorCategory.USER
    with pytest.raises(SupervisionError, match="unhealthy") as info:
        mesh.ok.call_one().get(timeout=T)
    assert "nobody was listening" in str(info.value)
    assert str(info.value).startswith("Endpoint call faulty.ok() failed, ")


def test_explicit_response_port_exception_kills_the_actor(procs: Procs, faults: Any) -> None:
    mesh = procs(gpus=1).spawn("faulty", Faulty)
    with pytest.raises(SupervisionError, match="explicit boom"):
        mesh.explicit_boom.call_one().get(timeout=T)
    faults.wait_for(1)


def test_base_exception_is_a_supervision_error_and_later_calls_fail_fast(
    procs: Procs, faults: Any
) -> None:
    mesh = procs(gpus=1).spawn("faulty", Faulty)
    with pytest.raises(SupervisionError, match="and all its descendants have failed"):
        mesh.fatal.call_one().get(timeout=T)
    with pytest.raises(SupervisionError, match="unhealthy"):
        mesh.ok.call_one().get(timeout=T)
    faults.wait_for(1)


def test_concurrent_endpoint_exception_is_an_actor_error(procs: Procs) -> None:
    mesh = procs(gpus=1).spawn("concurrent_faulty", ConcurrentFaulty)
    with pytest.raises(ActorError, match=r"Actor call concurrent_faulty\.fail failed"):
        mesh.fail.call_one().get(timeout=T)
    assert mesh.ping.call_one().get(timeout=T) == "pong"


def test_concurrent_explicit_port_exception_kills_the_actor(procs: Procs, faults: Any) -> None:
    mesh = procs(gpus=1).spawn("concurrent_faulty", ConcurrentFaulty)
    with pytest.raises(SupervisionError, match="explicit concurrent boom"):
        mesh.fail_explicit.call_one().get(timeout=T)
    faults.wait_for(1)


def test_abort_reports_its_reason(procs: Procs, faults: Any) -> None:
    pm = procs(gpus=1)
    pm.spawn("a", Faulty).abort_me.call_one("enough").get(timeout=T)
    pm.spawn("b", Faulty).abort_me.call_one(None).get(timeout=T)
    reports = [f.report() for f in faults.wait_for(2)]
    assert any("enough" in r for r in reports)
    assert any("no reason provided" in r for r in reports)


def test_failed_rank_poisons_every_slice_that_contains_it(procs: Procs, faults: Any) -> None:
    mesh = procs(gpus=4).spawn("faulty", Faulty)
    sibling = mesh.slice(gpus=slice(0, 2))
    mesh.fail_on.broadcast(3)
    faults.wait_for(1)
    with pytest.raises(SupervisionError):
        mesh.ok.call().get(timeout=T)
    later_slice = mesh.slice(gpus=slice(2, 4))
    with pytest.raises(SupervisionError):
        later_slice.ok.call().get(timeout=T)
    assert sibling.ok.call().get(timeout=T).values() == ["ok", "ok"]
    assert mesh.slice(gpus=2).ok.call_one().get(timeout=T) == "ok"


def test_other_meshes_on_the_same_procs_keep_working(procs: Procs, faults: Any) -> None:
    pm = procs(gpus=1)
    bad = pm.spawn("bad", Faulty)
    good = pm.spawn("good", Faulty)
    bad.boom.broadcast()
    faults.wait_for(1)
    assert good.ok.call_one().get(timeout=T) == "ok"


# -- supervision at the owner ------------------------------------------------------------------
def test_supervise_receives_mesh_failures_and_can_contain_them(procs: Procs, faults: Any) -> None:
    sup = procs(gpus=1).spawn("sup", Supervisor, "handle")
    child_name = sup.spawn_child.call_one().get(timeout=T)
    watcher, told = Channel[str].open()
    sup.watch.call_one(watcher).get(timeout=T)
    sup.kill_child.call_one().get(timeout=T)
    assert told.recv().get(timeout=T) == "supervised"
    ((text, mesh_name, ranks, report),) = sup.seen.call_one().get(timeout=T)
    assert "MeshFailure" in text
    assert child_name in text
    assert mesh_name == child_name
    assert ranks == [0]
    assert "child failure" in report
    assert sup.seen.call_one().get(timeout=T)  # the supervisor is alive
    assert faults.failures == []


def test_unhandled_supervision_fails_the_owner_with_a_chain(procs: Procs, faults: Any) -> None:
    sup = procs(gpus=1).spawn("sup", Supervisor, "ignore")
    sup.spawn_child.call_one().get(timeout=T)
    sup.kill_child.call_one().get(timeout=T)
    (failure,) = faults.wait_for(1)
    chain = failure.event.chain()
    assert len(chain) == 2
    assert failure.event.root_cause().reason.startswith("endpoint boom() raised")
    assert failure.event.root_cause().category == "user"
    assert "child failure" in failure.report()
    with pytest.raises(SupervisionError) as info:
        sup.seen.call_one().get(timeout=T)
    assert "child" in str(info.value)
    assert info.value.root_cause is not None


def test_raising_supervise_fails_the_owner_with_that_message(procs: Procs, faults: Any) -> None:
    sup = procs(gpus=1).spawn("sup", Supervisor, "raise")
    sup.spawn_child.call_one().get(timeout=T)
    sup.kill_child.call_one().get(timeout=T)
    faults.wait_for(1)
    with pytest.raises(SupervisionError, match="supervise raised on purpose"):
        sup.seen.call_one().get(timeout=T)


def test_mesh_failure_is_not_picklable() -> None:
    event = FailureEvent(
        category="user", kind="failed", actor="<a>", mesh_name="m", rank=0, reason="r"
    )
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(MeshFailure(event))
    assert str(MeshFailure(event)).startswith("MeshFailure(mesh_name=m, crashed_ranks=[0]")


def test_failure_chains_are_bounded() -> None:
    event = FailureEvent(
        category="user", kind="failed", actor="<a>", mesh_name="m", rank=0, reason="root"
    )
    for i in range(100):
        event = FailureEvent(
            category="system", kind="failed", actor=f"<{i}>", mesh_name="m", rank=0, reason=str(i)
        ).with_cause(event)
    assert len(event.chain()) <= 16


def test_supervision_error_pickles_with_its_event() -> None:
    event = FailureEvent(
        category="user", kind="failed", actor="<a>", mesh_name="m", rank=0, reason="r"
    )
    error = SupervisionError(event=event, endpoint="m.ep")
    back = pickle.loads(pickle.dumps(error))
    assert str(back) == str(error)
    assert back.event == event
    assert isinstance(back, RuntimeError)


# -- stop ---------------------------------------------------------------------------------------
def test_stopped_mesh_refuses_calls_and_siblings_keep_working(procs: Procs) -> None:
    pm = procs(gpus=1)
    first = pm.spawn("first", Faulty)
    second = pm.spawn("second", Faulty)
    assert first.stop().get(timeout=T) is None
    with pytest.raises(SupervisionError, match="stopped"):
        first.ok.call_one().get(timeout=T)
    assert second.ok.call_one().get(timeout=T) == "ok"


def test_cleanup_runs_on_stop_and_can_message_other_actors(procs: Procs) -> None:
    pm = procs(gpus=1)
    log = pm.spawn("log", Recorder)
    parent = pm.spawn("cleaner", Cleaner, log)
    parent.ok.call_one().get(timeout=T)
    parent.stop().get(timeout=T)
    assert log.recorded.call_one().get(timeout=T) == ["child cleanup True", "parent cleanup True"]


def test_async_cleanup_runs_on_stop(procs: Procs) -> None:
    pm = procs(gpus=1)
    log = pm.spawn("log", Recorder)
    mesh = pm.spawn("async_cleaner", AsyncCleaner, log)
    mesh.ok.call_one().get(timeout=T)
    mesh.stop().get(timeout=T)
    assert log.recorded.call_one().get(timeout=T) == ["async cleanup"]


def test_raising_cleanup_becomes_a_supervision_event(procs: Procs, faults: Any) -> None:
    mesh = procs(gpus=1).spawn("bad_cleanup", BadCleanup)
    mesh.stop().get(timeout=T)
    (failure,) = faults.wait_for(1)
    assert "cleanup exploded" in failure.report()


def test_proc_mesh_stop_stops_its_actors(procs: Procs) -> None:
    pm = procs(gpus=2)
    mesh = pm.spawn("faulty", Faulty)
    assert pm.stop().get(timeout=T) is None
    with pytest.raises(SupervisionError):
        mesh.ok.call().get(timeout=T)
    late = pm.spawn("late", Faulty)
    with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
        late.initialized.get(timeout=T)


def test_only_the_owner_may_stop_a_proc_mesh(procs: Procs) -> None:
    pm = procs(gpus=2)
    with pytest.raises(ValueError, match="ProcMesh is not owned"):
        pm.slice(gpus=0).stop()
    with pytest.raises(ValueError, match="ProcMesh is not owned"):
        pickle.loads(pickle.dumps(pm)).stop()


# -- undeliverable messages ---------------------------------------------------------------------
def test_message_to_a_stopped_actor_bounces_to_the_client_hook(procs: Procs, faults: Any) -> None:
    mesh = procs(gpus=1).spawn("gone", Faulty)
    mesh.stop().get(timeout=T)
    mesh.ok.broadcast()
    (failure,) = faults.wait_for(1)
    assert "could not be delivered" in failure.report()


def test_actor_can_swallow_its_bounced_messages(procs: Procs, faults: Any) -> None:
    pm = procs(gpus=1)
    gone = pm.spawn("gone", Faulty)
    gone.stop().get(timeout=T)
    swallower = pm.spawn("swallower", Swallower)
    watcher, told = Channel[str].open()
    swallower.watch.call_one(watcher).get(timeout=T)
    swallower.send_to.call_one(gone).get(timeout=T)
    assert told.recv().get(timeout=T) == "bounced"
    ((sender, dest, error),) = swallower.bounces.call_one().get(timeout=T)
    assert "swallower" in sender
    assert "gone" in dest
    assert error
    assert faults.failures == []


def test_ref_created_mesh_to_an_unknown_actor_fails_calls(procs: Procs) -> None:
    pm = procs(gpus=1)
    real = pm.spawn("real", Faulty)
    handle = cast(Any, real)
    bogus: Any = ActorMesh(Faulty, "bogus", "bogus-000", handle._procs, handle._shape)
    with pytest.raises(SupervisionError, match="no actor 'bogus-000'"):
        bogus.ok.call_one().get(timeout=T)


# -- the default fault hook (subprocess: it interrupts the main thread) -------------------------
def test_unhandled_fault_interrupts_the_main_thread_once(tmp_path: Path) -> None:
    script = tmp_path / "fault.py"
    script.write_text(
        textwrap.dedent(
            """
            import atexit, sys, time
            import monarch.actor as ma
            from monarch.actor import Actor, endpoint

            class Bad(Actor):
                @endpoint
                def boom(self) -> None:
                    raise ValueError("unhandled in the child")

            calls = []

            def hook(failure):
                calls.append(failure)
                print("hook called", flush=True)
                raise SystemExit(1)

            ma.unhandled_fault_hook = hook
            atexit.register(lambda: print("atexit ran", len(calls), flush=True))
            mesh = ma._local_proc_mesh(per_host={"gpus": 1}).spawn("bad", Bad)
            mesh.boom.broadcast()
            time.sleep(20)
            print("not interrupted", flush=True)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode != 0
    assert result.stdout.count("hook called") == 1
    assert "atexit ran 1" in result.stdout
    assert "not interrupted" not in result.stdout
    assert "unhandled in the child" in result.stderr
    assert "KeyboardInterrupt" in result.stderr


def test_error_categories_of_any_exception() -> None:
    from monarch.actor._base.errors import (
        CodecError,
        FrameError,
        MessageTooLargeError,
        PortClosedError,
        PortOverflowError,
        error_category,
    )

    event = FailureEvent(
        category="infrastructure", kind="failed", actor="<a>", mesh_name="m", rank=0, reason="r"
    )
    assert error_category(ActorError(ValueError("x"))) is ErrorCategory.USER
    assert error_category(SupervisionError(event=event)) is ErrorCategory.INFRASTRUCTURE
    assert error_category(SupervisionError("no event")) is ErrorCategory.SYSTEM
    assert error_category(MeshFailure(event)) is ErrorCategory.INFRASTRUCTURE  # type: ignore[arg-type]
    for system in (CodecError("x"), FrameError("x"), PortClosedError(), PortOverflowError()):
        assert error_category(system) is ErrorCategory.SYSTEM
    assert error_category(MessageTooLargeError("x")) is ErrorCategory.USER
    assert error_category(ConnectionResetError()) is ErrorCategory.INFRASTRUCTURE
    assert error_category(asyncio.CancelledError()) is ErrorCategory.SYSTEM
    assert error_category(KeyError("k")) is ErrorCategory.USER
    assert error_category(Fatal("f")) is ErrorCategory.USER


def test_failure_events_link_readable_names_to_internal_ids(procs: Procs, faults: Any) -> None:
    mesh = procs(gpus=2).spawn("named", Faulty)
    mesh.slice(gpus=1).fail_on.broadcast(1)
    (failure,) = faults.wait_for(1)
    event = failure.event
    assert event.actor.startswith("<root>.<")
    assert "named{'gpus': 1/2}>" in event.actor
    path, _, proc = event.actor_id.partition("@")
    assert path == event.mesh_name
    assert proc
    assert event.proc  # the label of the process where it failed
    assert event.category == "user"
    assert event.rank == 1


def test_failure_event_decodes_without_the_newer_fields() -> None:
    import msgspec

    old = msgspec.msgpack.encode(
        {
            "category": "user",
            "kind": "failed",
            "actor": "<a>",
            "mesh_name": "m",
            "rank": 0,
            "reason": "r",
        }
    )
    event = msgspec.msgpack.decode(old, type=FailureEvent)
    assert (event.actor_id, event.proc) == ("", "")
