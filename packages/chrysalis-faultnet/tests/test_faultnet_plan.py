"""The pure core: FaultPlan validation and the seeded FaultSchedule."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.faultnet import (
    MAX_FAULT_SECONDS,
    MAX_HELD_LIMIT,
    MAX_REORDER_WINDOW,
    FaultDecision,
    FaultDirection,
    FaultPlan,
    FaultSchedule,
    derive_seed,
)

SETTINGS = settings(max_examples=150, deadline=None)

probabilities = st.floats(min_value=0.0, max_value=1.0)
plans = st.builds(
    FaultPlan,
    seed=st.integers(min_value=0, max_value=2**64 - 1),
    loss=probabilities,
    duplicate=probabilities,
    reorder=probabilities,
    reorder_window=st.integers(min_value=1, max_value=MAX_REORDER_WINDOW),
    reorder_timeout=st.floats(min_value=0.001, max_value=1.0),
    delay=st.floats(min_value=0.0, max_value=0.5),
    jitter=st.floats(min_value=0.0, max_value=0.5),
    max_held=st.integers(min_value=0, max_value=64),
)
# Arrival gaps in seconds (time only moves forward).
gaps = st.lists(st.floats(min_value=0.0, max_value=0.2), min_size=0, max_size=120)


def simulate(plan: FaultPlan, arrival_gaps: list[float]) -> list[tuple[float, int]]:
    """Offer datagrams 0, 1, 2, ... at the given gaps, then drain; return (time, datagram) for
    every delivery, in delivery order."""
    schedule: FaultSchedule[int] = FaultSchedule(plan)
    out: list[tuple[float, int]] = []
    now = 0.0
    for index, gap in enumerate(arrival_gaps):
        now += gap
        out.extend((now, item) for item in schedule.poll(now))
        _, _, immediate = schedule.offer(index, now)
        out.extend((now, item) for item in immediate)
        out.extend((now, item) for item in schedule.poll(now))
    for _ in range(10_000):
        due = schedule.next_due()
        if due is None:
            break
        now = max(now, due)
        out.extend((now, item) for item in schedule.poll(now))
    assert schedule.held == 0
    return out


# -- FaultPlan ------------------------------------------------------------------------------


def test_default_plan_is_transparent_and_faults_nothing() -> None:
    plan = FaultPlan()
    assert plan.is_transparent
    assert not plan.faults_send
    assert not plan.faults_receive


@pytest.mark.parametrize(
    ("direction", "send", "receive"),
    [
        (FaultDirection.SEND, True, False),
        (FaultDirection.RECEIVE, False, True),
        (FaultDirection.BOTH, True, True),
    ],
)
def test_direction_selects_the_faulted_traffic(
    direction: FaultDirection, send: bool, receive: bool
) -> None:
    plan = FaultPlan(loss=0.5, direction=direction)
    assert (plan.faults_send, plan.faults_receive) == (send, receive)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("loss", 1.5, "probability"),
        ("duplicate", -0.1, "probability"),
        ("reorder", math.nan, "finite"),
        ("delay", -1.0, "seconds"),
        ("jitter", MAX_FAULT_SECONDS + 1, "seconds"),
        ("delay", math.inf, "finite"),
        ("reorder_timeout", 0.0, "> 0"),
        ("reorder_window", 0, "reorder_window"),
        ("reorder_window", MAX_REORDER_WINDOW + 1, "reorder_window"),
        ("max_held", -1, "max_held"),
        ("max_held", MAX_HELD_LIMIT + 1, "max_held"),
        ("seed", -1, "seed"),
        ("seed", 2**64, "seed"),
        ("direction", "sideways", "direction"),
    ],
)
def test_plan_rejects_out_of_range_values_with_a_clear_error(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        FaultPlan(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("loss", "0.1"), ("loss", True), ("max_held", 1.5), ("seed", 1.0), ("direction", 3)],
)
def test_plan_rejects_wrong_types(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=field):
        FaultPlan(**{field: value})  # type: ignore[arg-type]


def test_plan_is_frozen_and_stores_ints_as_floats() -> None:
    plan = FaultPlan(loss=1, delay=2)
    assert isinstance(plan.loss, float)
    assert isinstance(plan.delay, float)
    with pytest.raises(AttributeError):
        plan.loss = 0.5  # type: ignore[misc]


def test_from_options_parses_text_and_numbers() -> None:
    plan = FaultPlan.from_options(
        {"seed": "7", "loss": "0.25", "delay": 0.01, "max_held": "16", "direction": "both"}
    )
    assert plan == FaultPlan(
        seed=7, loss=0.25, delay=0.01, max_held=16, direction=FaultDirection.BOTH
    )


def test_from_options_names_an_unknown_option() -> None:
    with pytest.raises(TypeError, match=r"unknown fault plan option 'lose'.*loss"):
        FaultPlan.from_options({"lose": "0.1"})


def test_from_options_rejects_unparsable_text() -> None:
    with pytest.raises(ValueError, match="cannot parse"):
        FaultPlan.from_options({"loss": "lots"})


def test_derive_gives_distinct_reproducible_seeds() -> None:
    plan = FaultPlan(seed=42, loss=0.1)
    assert plan.derive(0) == plan.derive(0)
    assert plan.derive(0).seed != plan.derive(1).seed
    assert plan.derive("send").seed == derive_seed(42, "send")
    assert plan.derive(3).loss == plan.loss
    assert 0 <= derive_seed(2**64 - 1, "x") < 2**64


# -- FaultSchedule: determinism -------------------------------------------------------------


@SETTINGS
@given(plan=plans, count=st.integers(min_value=0, max_value=200))
def test_same_seed_gives_the_same_decisions(plan: FaultPlan, count: int) -> None:
    first: FaultSchedule[int] = FaultSchedule(plan)
    second: FaultSchedule[int] = FaultSchedule(plan)
    assert [first.decide() for _ in range(count)] == [second.decide() for _ in range(count)]


@SETTINGS
@given(plan=plans, arrival_gaps=gaps)
def test_same_seed_and_arrivals_give_the_same_deliveries(
    plan: FaultPlan, arrival_gaps: list[float]
) -> None:
    assert simulate(plan, arrival_gaps) == simulate(plan, arrival_gaps)


def test_different_seeds_give_different_decisions() -> None:
    a: FaultSchedule[int] = FaultSchedule(FaultPlan(seed=1, loss=0.5))
    b: FaultSchedule[int] = FaultSchedule(FaultPlan(seed=2, loss=0.5))
    assert [a.decide().lost for _ in range(64)] != [b.decide().lost for _ in range(64)]


@SETTINGS
@given(plan=plans)
def test_decisions_respect_the_plan(plan: FaultPlan) -> None:
    schedule: FaultSchedule[int] = FaultSchedule(plan)
    for _ in range(50):
        decision = schedule.decide()
        if decision.lost:
            assert decision == FaultDecision(True, (), 0)
            continue
        assert decision.copies in (1, 2)
        for delay in decision.delays:
            assert plan.delay <= delay <= plan.delay + plan.jitter
        assert 0 <= decision.hold_behind <= plan.reorder_window
        if plan.reorder == 0.0:
            assert decision.hold_behind == 0


# -- FaultSchedule: rates and delivery ------------------------------------------------------


def test_loss_rate_is_close_to_the_plan() -> None:
    schedule: FaultSchedule[int] = FaultSchedule(FaultPlan(seed=2024, loss=0.1))
    n = 20_000
    lost = sum(schedule.decide().lost for _ in range(n))
    # 4.5 standard deviations of a binomial(20000, 0.1) is about 0.0095.
    assert abs(lost / n - 0.1) < 0.0095


def test_duplicate_rate_is_close_to_the_plan() -> None:
    schedule: FaultSchedule[int] = FaultSchedule(FaultPlan(seed=5, duplicate=0.3))
    n = 20_000
    duplicated = sum(schedule.decide().duplicated for _ in range(n))
    assert abs(duplicated / n - 0.3) < 0.015


def test_certain_loss_loses_everything_and_no_loss_loses_nothing() -> None:
    assert simulate(FaultPlan(loss=1.0), [0.0] * 50) == []
    assert [item for _, item in simulate(FaultPlan(), [0.0] * 50)] == list(range(50))


@SETTINGS
@given(plan=plans, arrival_gaps=gaps)
def test_reordering_and_delay_lose_nothing_without_loss_or_overflow(
    plan: FaultPlan, arrival_gaps: list[float]
) -> None:
    lossless = FaultPlan(
        seed=plan.seed,
        duplicate=plan.duplicate,
        reorder=plan.reorder,
        reorder_window=plan.reorder_window,
        reorder_timeout=plan.reorder_timeout,
        delay=plan.delay,
        jitter=plan.jitter,
        max_held=MAX_HELD_LIMIT,
    )
    delivered = Counter(item for _, item in simulate(lossless, arrival_gaps))
    # Every datagram arrives once or twice; duplicates are counted in the schedule's decisions.
    assert set(delivered) == set(range(len(arrival_gaps)))
    assert all(count in (1, 2) for count in delivered.values())
    if lossless.duplicate == 0.0:
        assert all(count == 1 for count in delivered.values())


def test_reordering_reorders() -> None:
    out = [item for _, item in simulate(FaultPlan(seed=3, reorder=0.3), [0.001] * 200)]
    assert sorted(out) == list(range(200))
    assert out != sorted(out)


@SETTINGS
@given(plan=plans, arrival_gaps=gaps)
def test_no_copy_is_released_before_its_delay(plan: FaultPlan, arrival_gaps: list[float]) -> None:
    arrivals: list[float] = []
    now = 0.0
    for gap in arrival_gaps:
        now += gap
        arrivals.append(now)
    for released_at, item in simulate(plan, arrival_gaps):
        assert released_at >= arrivals[item] + plan.delay - 1e-9


@SETTINGS
@given(plan=plans, arrival_gaps=gaps)
def test_held_copies_never_exceed_max_held(plan: FaultPlan, arrival_gaps: list[float]) -> None:
    schedule: FaultSchedule[int] = FaultSchedule(plan)
    now = 0.0
    for index, gap in enumerate(arrival_gaps):
        now += gap
        schedule.poll(now)
        decision, admission, immediate = schedule.offer(index, now)
        assert admission.held + admission.dropped + len(immediate) == decision.copies
        assert schedule.held <= plan.max_held


def test_overflowing_copies_are_refused_and_reported() -> None:
    schedule: FaultSchedule[int] = FaultSchedule(FaultPlan(delay=1.0, max_held=3))
    admissions = [schedule.offer(i, 0.0)[1] for i in range(5)]
    assert [a.held for a in admissions] == [1, 1, 1, 0, 0]
    assert [a.dropped for a in admissions] == [0, 0, 0, 1, 1]
    assert schedule.held == 3
    assert schedule.poll(0.999) == []
    assert schedule.poll(1.0) == [0, 1, 2]


def test_reordered_datagram_follows_the_datagrams_that_passed_it() -> None:
    schedule: FaultSchedule[str] = FaultSchedule(FaultPlan(reorder=0.5, reorder_timeout=10.0))
    decision = FaultDecision(False, (0.0,), 2)
    schedule.note_arrival(0.0)
    schedule.hold("a", decision, 0.0)
    assert schedule.poll(0.0) == []
    schedule.note_arrival(0.1)  # "b" passes
    assert schedule.poll(0.1) == []
    schedule.note_arrival(0.2)  # "c" passes: "a" is now eligible
    assert schedule.poll(0.2) == ["a"]


def test_reordered_datagram_is_released_by_its_timeout() -> None:
    schedule: FaultSchedule[str] = FaultSchedule(FaultPlan(reorder=0.5, reorder_timeout=0.5))
    schedule.note_arrival(1.0)
    schedule.hold("a", FaultDecision(False, (0.0,), 3), 1.0)
    assert schedule.next_due() == 1.5
    assert schedule.poll(1.49) == []
    assert schedule.poll(1.5) == ["a"]
    assert schedule.next_due() is None


def test_clear_drops_everything_held() -> None:
    schedule: FaultSchedule[int] = FaultSchedule(FaultPlan(delay=1.0, reorder=1.0))
    for i in range(4):
        schedule.offer(i, 0.0)
    assert schedule.held == 4
    assert schedule.clear() == 4
    assert schedule.held == 0
    assert schedule.next_due() is None


def test_schedule_needs_a_plan() -> None:
    with pytest.raises(TypeError, match="FaultPlan"):
        FaultSchedule({"loss": 0.1})  # type: ignore[arg-type]
