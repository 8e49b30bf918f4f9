"""An owner stops what it owns in ``stop_order``: actor meshes before the proc meshes they run
on, newest first within one order (``_runtime.cell._stop_meshes``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from monarch.actor import Actor, ActorMesh, Future, ProcMesh, SupervisionError, endpoint
from monarch.actor._runtime.cell import _stop_meshes


class Echo(Actor):
    @endpoint
    def echo(self, value: int) -> int:
        return value


class _Recorded:
    """Stands in for an owned mesh with the stop order of ``kind``; records when it stops."""

    def __init__(self, kind: type[Any], name: str, stopped: list[str]) -> None:
        self.stop_order: int = kind.stop_order
        self.name = name
        self._stopped = stopped

    def _stop_owned(self) -> Future[None] | None:
        self._stopped.append(self.name)
        return None


def test_actor_meshes_stop_before_proc_meshes_newest_first() -> None:
    stopped: list[str] = []
    owned = [
        _Recorded(ProcMesh, "procs-1", stopped),
        _Recorded(ActorMesh, "actors-1", stopped),
        _Recorded(ProcMesh, "procs-2", stopped),
        _Recorded(ActorMesh, "actors-2", stopped),
    ]
    _stop_meshes(owned, timeout=1.0)
    assert stopped == ["actors-2", "actors-1", "procs-2", "procs-1"]


def test_an_owner_stops_its_real_meshes_in_stop_order(
    monkeypatch: pytest.MonkeyPatch, procs: Callable[..., ProcMesh]
) -> None:
    stopped: list[object] = []
    for cls in (ActorMesh, ProcMesh):
        original = cls._stop_owned

        def record(self: Any, original: Any = original) -> Future[None] | None:
            stopped.append(self)
            return original(self)  # type: ignore[no-any-return]

        monkeypatch.setattr(cls, "_stop_owned", record)
    first = procs(gpus=1)
    on_first = first.spawn("echo-1", Echo)
    second = procs(gpus=1)
    on_second = second.spawn("echo-2", Echo)
    assert on_second.echo.call_one(2).get(timeout=10) == 2
    owned: list[Any] = [first, on_first, second, on_second]  # spawn is typed as the actor
    _stop_meshes(owned, timeout=10.0)
    mine = {id(m): m for m in owned}  # other meshes may stop meanwhile (earlier tests' owners)
    order = [id(m) for m in stopped if mine.get(id(m)) is m]
    assert order == [id(on_second), id(on_first), id(second), id(first)]
    with pytest.raises(SupervisionError):  # it stopped (its process is gone too)
        on_first.echo.call_one(1).get(timeout=10)
