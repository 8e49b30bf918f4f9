"""The liveness state machines (``_runtime.liveness``): time is passed in, so every case is
exact."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor._runtime.liveness import PINGS_PER_TIMEOUT, HeartbeatMonitor, Lease

T = 4.0
INTERVAL = T / PINGS_PER_TIMEOUT


def test_a_watched_process_is_pinged_at_once_then_every_interval() -> None:
    monitor: HeartbeatMonitor[str] = HeartbeatMonitor()
    monitor.watch("a", 0.0)
    assert monitor.poll(0.0, T).pings == ("a",)
    assert monitor.next_poll(0.0, T) == INTERVAL
    assert monitor.poll(INTERVAL / 2, T).pings == ()
    monitor.heard("a", INTERVAL / 2)
    assert monitor.poll(INTERVAL, T).pings == ("a",)


def test_a_silent_process_is_declared_once_exactly_a_timeout_after_its_last_answer() -> None:
    monitor: HeartbeatMonitor[str] = HeartbeatMonitor()
    monitor.watch("a", 0.0)
    now = 0.0
    monitor.poll(now, T)
    monitor.heard("a", 0.5)  # the last answer
    declared: list[tuple[str, float]] = []
    while (when := monitor.next_poll(now, T)) is not None:
        now = when
        due = monitor.poll(now, T)
        declared += due.dead
    assert declared == [("a", T)]
    assert now == 0.5 + T
    assert "a" not in monitor
    assert monitor.poll(now + 10 * T, T).dead == ()


def test_a_process_answering_every_ping_is_never_declared() -> None:
    monitor: HeartbeatMonitor[str] = HeartbeatMonitor()
    monitor.watch("a", 0.0)
    now = 0.0
    while now < 50 * T:
        due = monitor.poll(now, T)
        assert due.dead == ()
        for key in due.pings:
            monitor.heard(key, now + 0.7 * INTERVAL)  # answered a bit later
        when = monitor.next_poll(now, T)
        assert when is not None
        now = when


def test_a_stalled_monitor_gives_everyone_a_fresh_window_instead_of_declaring() -> None:
    monitor: HeartbeatMonitor[str] = HeartbeatMonitor()
    monitor.watch("a", 0.0)
    monitor.poll(0.0, T)
    # The monitor's own process did not run for 3 timeouts: answers may wait unread.
    due = monitor.poll(3 * T, T)
    assert due.dead == ()
    assert due.pings == ("a",)
    now = 3 * T
    dead: tuple[tuple[str, float], ...] = ()
    while not dead:  # polled on time again: declared once silent a whole timeout after that
        when = monitor.next_poll(now, T)
        assert when is not None
        now = when
        dead = monitor.poll(now, T).dead
    assert dead == (("a", T),)
    assert now == 4 * T


def test_a_shorter_timeout_does_not_declare_at_once_what_answered_at_the_old_pace() -> None:
    monitor: HeartbeatMonitor[str] = HeartbeatMonitor()
    monitor.watch("a", 0.0)
    monitor.poll(0.0, 120.0)
    monitor.heard("a", 0.1)
    due = monitor.poll(20.0, 1.0)  # 20 s of silence is normal at a 30 s ping interval
    assert due.dead == ()
    assert due.pings == ("a",)
    assert monitor.poll(20.25, 1.0).pings == ("a",)
    assert monitor.poll(20.5, 1.0).pings == ("a",)
    assert monitor.poll(20.75, 1.0).pings == ("a",)
    assert monitor.poll(21.0, 1.0).dead == (("a", 1.0),)


def test_turning_the_check_off_pings_each_process_once_to_carry_the_zero() -> None:
    monitor: HeartbeatMonitor[str] = HeartbeatMonitor()
    monitor.watch("a", 0.0)
    monitor.watch("b", 0.0)
    monitor.poll(0.0, T)
    due = monitor.poll(1.0, 0.0)
    assert due.pings == ("a", "b")
    assert due.dead == ()
    assert monitor.poll(100 * T, 0.0).pings == ()  # told once; nothing declared meanwhile
    assert monitor.next_poll(100 * T, 0.0) is None
    due = monitor.poll(100 * T + 1, T)  # on again: a fresh window
    assert due.dead == ()
    assert set(due.pings) == {"a", "b"}


def test_forgotten_processes_are_neither_pinged_nor_declared() -> None:
    monitor: HeartbeatMonitor[str] = HeartbeatMonitor()
    monitor.watch("a", 0.0)
    monitor.forget("a")
    monitor.forget("a")  # idempotent
    assert monitor.poll(10 * T, T).pings == ()
    assert monitor.next_poll(10 * T, T) is None


def test_the_watched_set_is_bounded() -> None:
    monitor: HeartbeatMonitor[int] = HeartbeatMonitor(max_watched=2)
    monitor.watch(1, 0.0)
    monitor.watch(2, 0.0)
    monitor.watch(2, 0.0)  # already watched: fine
    with pytest.raises(OverflowError, match="at most 2"):
        monitor.watch(3, 0.0)


def test_a_lease_is_unarmed_until_the_first_heartbeat_then_runs_out_for_good() -> None:
    lease = Lease()
    assert not lease.armed
    assert not lease.expired(1e9)
    assert lease.renew(10.0, T)
    assert lease.expiry == 10.0 + T
    assert not lease.expired(10.0 + T)
    assert lease.renew(10.0 + T, T)  # just in time
    assert lease.expired(10.0 + 2 * T + 0.001)
    assert not lease.renew(10.0 + 2 * T + 0.002, T)  # too late: it stays expired
    assert lease.expired(0.0)


def test_a_heartbeat_that_arrives_after_the_lease_ran_out_does_not_revive_it() -> None:
    lease = Lease()
    lease.renew(0.0, T)
    # Stopped for a while: the buffered heartbeat is read before any timer fires.
    assert not lease.renew(T + 5.0, T)
    assert lease.expired(T + 5.0)


def test_a_zero_timeout_disarms_the_lease() -> None:
    lease = Lease()
    lease.renew(0.0, T)
    assert lease.renew(1.0, 0.0)
    assert not lease.armed
    assert not lease.expired(1e9)


# -- properties ---------------------------------------------------------------------------------
@given(
    delays=st.lists(st.floats(0.0, 0.74 * T), min_size=1, max_size=60),
    stop_after=st.integers(0, 60),
)
def test_a_process_is_declared_iff_it_stops_answering_and_then_exactly_on_time(
    delays: list[float], stop_after: int
) -> None:
    """Driven the way the client drives it (poll at ``next_poll``): a process that answers each
    ping within three quarters of a timeout is never declared; once it stops answering it is
    declared exactly ``T`` after its last answer, once."""
    monitor: HeartbeatMonitor[str] = HeartbeatMonitor()
    monitor.watch("p", 0.0)
    now = 0.0
    answered = 0
    pending: list[float] = []  # times answers will arrive
    last_answer = 0.0
    declared: list[tuple[str, float]] = []
    while not declared and now < 1000 * T:
        due = monitor.poll(now, T)
        declared += due.dead
        for _ in due.pings:
            if answered < min(stop_after, len(delays)):
                pending.append(now + delays[answered])
                answered += 1
        when = monitor.next_poll(now, T)
        if when is None:
            break
        upcoming = [t for t in pending if t <= when]
        if upcoming:  # an answer arrives before the next poll: deliver it, then poll then
            at = min(upcoming)
            pending.remove(at)
            monitor.heard("p", at)
            last_answer = max(last_answer, at)
            now = max(now, at)
            continue
        now = when
    assert answered == min(stop_after, len(delays))
    assert len(declared) == 1
    assert declared[0][0] == "p"
    assert declared[0][1] == pytest.approx(T)
    assert now == pytest.approx(last_answer + T)


@given(gaps=st.lists(st.integers(0, 2 * int(T)), min_size=1, max_size=50))
def test_a_lease_expires_exactly_when_one_gap_between_heartbeats_exceeded_the_timeout(
    gaps: list[int],
) -> None:
    """Whole seconds, so that the arithmetic is exact: a gap of exactly ``T`` is in time."""
    lease = Lease()
    now = 0.0
    lease.renew(now, T)
    late = False
    for gap in gaps:
        now += gap
        late = late or gap > T
        assert lease.renew(now, T) is not late
        assert lease.expired(now) is late


def test_a_released_lease_stays_disarmed_and_an_expired_one_stays_expired() -> None:
    lease = Lease()
    lease.renew(0.0, T)
    lease.release()  # the owner stops this process
    assert lease.renew(1.0, T)  # a heartbeat sent before the stop: no deadline again
    assert not lease.armed
    assert not lease.expired(1e9)
    late = Lease()
    late.renew(0.0, T)
    assert late.expired(2 * T)
    late.release()  # too late: it stays expired
    assert late.expired(2 * T)
