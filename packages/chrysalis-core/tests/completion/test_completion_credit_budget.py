"""Completion credits (spec 4.3) and byte budgets with RetainedBytes / PostedBuffer (spec 4.4)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chrysalis.core.completion import (
    BufferCapacityError,
    ByteBudget,
    ByteReservation,
    CompletionCredits,
    CompletionModelError,
    CreditPermit,
    RetainedBytes,
)


class CountingNotifier:
    def __init__(self) -> None:
        self.count = 0

    def notify(self) -> None:
        self.count += 1


def test_permits_bound_and_release_completion_ownership() -> None:
    notifier = CountingNotifier()
    credits = CompletionCredits(2, notifier)
    first = credits.try_acquire()
    second = credits.try_acquire()
    assert first is not None
    assert second is not None
    assert credits.try_acquire() is None
    assert credits.in_use == 2
    assert first.release() is True
    assert notifier.count == 1
    assert credits.available == 1
    assert first.release() is False  # a permit releases exactly once
    assert notifier.count == 1
    assert credits.in_use == 1
    third = credits.try_acquire()
    assert third is not None
    assert credits.try_acquire() is None


def test_permit_context_manager_releases() -> None:
    credits = CompletionCredits(1)
    permit = credits.try_acquire()
    assert permit is not None
    with permit:
        assert credits.in_use == 1
    assert permit.released
    assert credits.in_use == 0


def test_credit_release_advances_the_released_wakeup() -> None:
    credits = CompletionCredits(1)
    seen = credits.released.epoch()
    permit = credits.try_acquire()
    assert permit is not None
    assert credits.released.epoch() == seen
    permit.release()
    assert credits.released.wait(seen, timeout=0)


@pytest.mark.parametrize("capacity", [0, -3])
def test_credit_capacity_must_be_positive(capacity: int) -> None:
    with pytest.raises(ValueError):
        CompletionCredits(capacity)


def test_concurrent_double_release_frees_one_credit() -> None:
    credits = CompletionCredits(1)
    for _ in range(50):
        permit = credits.try_acquire()
        assert permit is not None
        results: list[bool] = []

        def release(target: CreditPermit = permit, out: list[bool] = results) -> None:
            out.append(target.release())

        threads = [threading.Thread(target=release) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=5)
        assert sorted(results) == [False, False, True]
        assert credits.in_use == 0


def test_budget_never_exceeds_capacity() -> None:
    budget = ByteBudget(10)
    a = budget.try_reserve(6)
    assert a is not None
    assert budget.try_reserve(5) is None
    b = budget.try_reserve(4)
    assert b is not None
    assert budget.used == 10
    zero = budget.try_reserve(0)
    assert zero is not None
    assert a.release() is True
    assert a.release() is False
    assert budget.used == 4
    with pytest.raises(ValueError):
        budget.try_reserve(-1)


def test_retained_send_budget_lasts_until_every_view_is_dropped() -> None:
    budget = ByteBudget(4)
    retained = budget.try_retain(b"abcd")
    assert retained is not None
    head = retained.split_to(1)
    assert bytes(head) == b"a"
    assert bytes(retained) == b"bcd"
    assert budget.used == 4
    assert head.release() is True
    assert budget.used == 4  # the other view still holds the whole reservation
    assert retained.release() is True
    assert budget.used == 0
    assert retained.release() is False
    assert budget.used == 0


def test_retained_bytes_are_read_only_and_unusable_after_release() -> None:
    budget = ByteBudget(8)
    source = bytearray(b"xyz")
    retained = budget.try_retain(source)
    assert retained is not None
    with pytest.raises(TypeError):
        retained.data[0] = 0
    retained.release()
    with pytest.raises(CompletionModelError):
        _ = retained.data
    with pytest.raises(CompletionModelError):
        retained.split_to(0)


def test_released_retained_bytes_let_the_caller_resize_its_bytearray() -> None:
    budget = ByteBudget(64)
    source = bytearray(b"abcdef")
    retained = budget.try_retain(source)
    assert retained is not None
    head = retained.split_to(2)
    with pytest.raises(BufferError):
        source.extend(b"!")  # exported while the driver holds the bytes
    head.release()
    with pytest.raises(BufferError):
        source.extend(b"!")  # the other view still holds it
    retained.release()
    source.extend(b"!")  # no garbage collection needed
    assert source == bytearray(b"abcdef!")
    del retained, head  # keep the views alive until here


def test_retained_split_rejects_out_of_range_points() -> None:
    budget = ByteBudget(8)
    retained = budget.try_retain(b"abc")
    assert retained is not None
    with pytest.raises(ValueError):
        retained.split_to(4)
    with pytest.raises(ValueError):
        retained.split_to(-1)


def test_retain_accepts_multibyte_memoryviews_and_rejects_non_bytes() -> None:
    import array

    budget = ByteBudget(64)
    retained = budget.try_retain(memoryview(array.array("I", [1, 2])))
    assert retained is not None
    assert len(retained) == 8
    assert budget.used == 8
    with pytest.raises(TypeError):
        budget.try_retain("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RetainedBytes()


def test_posted_buffer_reserves_capacity_and_appends_within_it() -> None:
    budget = ByteBudget(16)
    buffer = bytearray(b"pre")
    posted = budget.try_post(buffer, 8)
    assert posted is not None
    assert budget.used == 8
    assert posted.buffer is buffer
    assert posted.spare == 5
    posted.append(b"abc")
    assert buffer == bytearray(b"preabc")
    assert posted.appended == 3
    with pytest.raises(BufferCapacityError):
        posted.append(b"xyz")
    assert buffer == bytearray(b"preabc")
    assert posted.release() is True
    assert posted.release() is False
    assert budget.used == 0


def test_posted_buffer_rejects_bad_arguments_without_reserving() -> None:
    budget = ByteBudget(16)
    with pytest.raises(ValueError):
        budget.try_post(bytearray(b"abcd"), 3)
    with pytest.raises(TypeError):
        budget.try_post(b"immutable", 16)  # type: ignore[arg-type]
    assert budget.try_post(bytearray(), 17) is None
    assert budget.used == 0


class BudgetMachine(RuleBasedStateMachine):
    """Reservations, retained views and posted buffers against one budget: ``used`` always
    equals the sum of live reservations, never exceeds capacity, and each reservation is
    freed exactly once, when its last view goes."""

    def __init__(self) -> None:
        super().__init__()
        self.notifier = CountingNotifier()
        self.budget = ByteBudget(32, self.notifier)
        self.plain: list[ByteReservation] = []
        self.views: list[RetainedBytes] = []
        self.reservation_of: dict[int, ByteReservation] = {}
        self.live_views: dict[int, int] = {}
        self.releases = 0
        self.credits = CompletionCredits(3)
        self.permits: list[CreditPermit] = []

    def _expected_used(self) -> int:
        live = {id(r): r for r in self.plain if not r.released}
        for view in self.views:
            if not view.released:
                live[id(view.reservation)] = view.reservation
        return sum(r.nbytes for r in live.values())

    @rule(nbytes=st.integers(0, 40))
    def reserve(self, nbytes: int) -> None:
        before = self.budget.used
        reservation = self.budget.try_reserve(nbytes)
        if reservation is None:
            assert before + nbytes > 32
        else:
            assert before + nbytes <= 32
            self.plain.append(reservation)

    @rule(payload=st.binary(max_size=40))
    def retain(self, payload: bytes) -> None:
        before = self.budget.used
        view = self.budget.try_retain(payload)
        if view is None:
            assert before + len(payload) > 32
            return
        assert bytes(view) == payload
        self.views.append(view)
        self.live_views[id(view.reservation)] = 1

    @precondition(lambda self: any(not v.released for v in self.views))
    @rule(index=st.integers(0, 100), at=st.integers(0, 40))
    def split(self, index: int, at: int) -> None:
        live = [v for v in self.views if not v.released]
        view = live[index % len(live)]
        before = bytes(view)
        at = min(at, len(view))
        head = view.split_to(at)
        assert bytes(head) + bytes(view) == before
        assert head.reservation is view.reservation
        self.views.append(head)
        self.live_views[id(view.reservation)] += 1

    @precondition(lambda self: any(not v.released for v in self.views))
    @rule(index=st.integers(0, 100))
    def release_view(self, index: int) -> None:
        live = [v for v in self.views if not v.released]
        view = live[index % len(live)]
        key = id(view.reservation)
        notifies = self.notifier.count
        assert view.release() is True
        assert view.release() is False
        self.live_views[key] -= 1
        if self.live_views[key] == 0:
            assert view.reservation.released
            assert self.notifier.count == notifies + 1
        else:
            assert not view.reservation.released
            assert self.notifier.count == notifies

    @precondition(lambda self: any(not r.released for r in self.plain))
    @rule(index=st.integers(0, 100))
    def release_plain(self, index: int) -> None:
        live = [r for r in self.plain if not r.released]
        reservation = live[index % len(live)]
        assert reservation.release() is True
        assert reservation.release() is False

    @rule()
    def acquire_credit(self) -> None:
        held = sum(1 for p in self.permits if not p.released)
        permit = self.credits.try_acquire()
        assert (permit is None) == (held == 3)
        if permit is not None:
            self.permits.append(permit)

    @precondition(lambda self: any(not p.released for p in self.permits))
    @rule(index=st.integers(0, 100))
    def release_credit(self, index: int) -> None:
        live = [p for p in self.permits if not p.released]
        assert live[index % len(live)].release() is True

    @invariant()
    def accounting_matches(self) -> None:
        used = self.budget.used
        assert 0 <= used <= self.budget.capacity
        assert used == self._expected_used()
        held = sum(1 for p in self.permits if not p.released)
        assert self.credits.in_use == held <= self.credits.capacity


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def _unset_slots(obj: object) -> list[str]:
    """The ``__slots__`` of ``obj``'s class that were never assigned."""
    missing = []
    for name in type(obj).__slots__:  # type: ignore[attr-defined]
        try:
            getattr(obj, name)
        except AttributeError:
            missing.append(name)
    return missing


@pytest.mark.parametrize("threadsafe", [True, False])
def test_hot_path_objects_are_built_with_every_slot_set(threadsafe: bool) -> None:
    """``try_acquire``, ``try_retain`` and ``try_post`` build their objects slot by slot
    (no constructor frames): a slot added to a class but not to its builder fails here."""
    permit = CompletionCredits(4, threadsafe=threadsafe).try_acquire()
    budget = ByteBudget(1024, threadsafe=threadsafe)
    retained = budget.try_retain(b"abcd")
    posted = budget.try_post(bytearray(), 64)
    assert permit is not None
    assert retained is not None
    assert posted is not None
    share = retained._share
    objects = [permit, retained, share, share.reservation, posted, posted._reservation]
    assert {type(o).__name__: _unset_slots(o) for o in objects} == {
        type(o).__name__: [] for o in objects
    }
    assert budget.used == 68
    retained.release()
    posted.release()
    assert permit.release() is True
    assert budget.used == 0
