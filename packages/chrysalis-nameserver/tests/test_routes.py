"""Route projection with gates (spec 3.4; inventory routes.rs and the route part of
service.rs)."""

from __future__ import annotations

import pytest

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.datagram import Router
from chrysalis.nameserver import (
    DirectoryChange,
    InstallRoute,
    LinkRoutePlan,
    Locator,
    NsCodec,
    ProcEntry,
    PublicationAck,
    PublicationAcked,
    Revision,
    RouteProjectionError,
    RouteProjector,
    WithdrawRoute,
)
from chrysalis.nameserver.testing import SessionPair

AUTH = Pid(b"\xaa" * 16)
CHILD = Pid(b"\xc1" * 16)
L1 = LinkId(b"\x01" * 16)
L2 = LinkId(b"\x02" * 16)
NEAR = DatagramAddr.inproc(1, 1)
FAR = DatagramAddr.inproc(1, 2)
PID = Pid(b"\x05" * 16)


def change(
    link: LinkId, upserts: tuple[ProcEntry, ...] = (), removals: tuple[Pid, ...] = ()
) -> DirectoryChange:
    return DirectoryChange(link, Revision(AUTH, 1), upserts, removals)


def test_projects_preferred_locator_and_removes_withdrawal() -> None:
    router = Router()
    projector = RouteProjector(router)
    session = projector.open(L1)
    located = ProcEntry(PID, "p", locators=(Locator(FAR, 5), Locator(NEAR, 1), Locator(FAR, 1)))
    assert session.apply(change(L1, (located,))) == (InstallRoute(PID, NEAR),)
    route = router.get(PID)
    assert route is not None
    assert route.destination == NEAR
    assert route.gate is session.gate
    assert session.apply(change(L1, (), (PID,))) == (WithdrawRoute(PID),)
    assert router.get(PID) is None
    assert session.installed == frozenset()


def test_entry_without_locator_withdraws_existing_route() -> None:
    router = Router()
    session = RouteProjector(router).open(L1)
    session.apply(change(L1, (ProcEntry(PID, "p", locators=(Locator(NEAR),)),)))
    assert session.apply(change(L1, (ProcEntry(PID, "p"),))) == (WithdrawRoute(PID),)
    assert PID not in router
    assert session.apply(change(L1, (ProcEntry(PID, "p"),))) == ()


def test_fencing_precedes_route_cleanup() -> None:
    router = Router()
    session = RouteProjector(router).open(L1)
    session.apply(change(L1, (ProcEntry(PID, "p", locators=(Locator(NEAR),)),)))
    session.fence()
    route = router.get(PID)
    assert route is not None
    assert not route.is_active
    assert (session.fenced, session.finished) == (True, False)
    session.finish()
    assert router.get(PID) is None
    assert (session.fenced, session.finished) == (True, True)
    session.finish()  # idempotent
    with pytest.raises(RouteProjectionError):
        session.apply(change(L1))


def test_dropping_session_fences_and_cleans_routes() -> None:
    router = Router()
    projector = RouteProjector(router)
    with projector.open(L1) as session:
        session.apply(change(L1, (ProcEntry(PID, "p", locators=(Locator(NEAR),)),)))
        gate = session.gate
    assert not gate.is_active
    assert len(router) == 0
    assert projector.session(L1) is None
    projector.open(L1).finish()  # the finished link id may be opened again


def test_opening_a_link_twice_is_refused() -> None:
    projector = RouteProjector(Router())
    projector.open(L1)
    with pytest.raises(RouteProjectionError):
        projector.open(L1)


def test_finish_keeps_routes_another_link_installed_since() -> None:
    router = Router()
    projector = RouteProjector(router)
    old = projector.open(L1)
    old.apply(change(L1, (ProcEntry(PID, "p", locators=(Locator(NEAR),)),)))
    old.fence()
    new = projector.open(L2)
    projector.apply(change(L2, (ProcEntry(PID, "p", locators=(Locator(FAR),)),)))
    old.finish()
    route = router.get(PID)
    assert route is not None
    assert route.destination == FAR
    assert route.gate is new.gate


def test_changes_of_other_links_are_refused() -> None:
    plan = LinkRoutePlan(L1, max_routes=1)
    with pytest.raises(RouteProjectionError):
        plan.project(change(L2))
    plan.project(change(L1, (ProcEntry(PID, "p", locators=(Locator(NEAR),)),)))
    other = ProcEntry(Pid(b"\x06" * 16), "q", locators=(Locator(NEAR),))
    with pytest.raises(RouteProjectionError):
        plan.project(change(L1, (other,)))
    assert plan.installed == {PID}
    assert plan.withdraw_all() == (WithdrawRoute(PID),)
    with pytest.raises(RouteProjectionError):
        RouteProjector(Router()).apply(change(L1))


def test_projects_route_before_ack_and_removes_it_on_close() -> None:
    router = Router()
    routes = RouteProjector(router).open(L1)
    pair = SessionPair(parent_pid=AUTH, child_pid=CHILD, link=L1, routes=routes)
    pair.connect()
    pair.publish([ProcEntry(CHILD, "child", locators=(Locator(NEAR),))])
    acks = 0
    while pair.step_parent() or pair.step_child():
        queued = [NsCodec.decode(frame) for frame in pair.to_child]
        if any(isinstance(message, PublicationAck) for message in queued):
            acks += 1
            assert router.get(CHILD) is not None  # committed and routed before the ack leaves
    assert acks
    assert isinstance(pair.child.events[-1], PublicationAcked)
    assert router.get(CHILD) is not None  # installed at acknowledgement time
    pair.parent.close()
    assert router.get(CHILD) is None
    assert not routes.gate.is_active
    assert pair.parent.nameserver.snapshot() == ()
