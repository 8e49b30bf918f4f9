"""Fault plans and the pure, seeded fault schedule.

Why a separate pure core: a fault-injection carrier is only useful as a test tool if a failure
it provokes can be reproduced and shrunk. So every *decision* (is this datagram lost,
duplicated, held back, by how much is it delayed) comes from :class:`FaultSchedule`, a plain
object seeded from :class:`FaultPlan`. It never reads a clock, never touches a socket and never
starts a thread: the caller passes ``now`` in, as with aioquic's ``QuicConnection``. The same
seed and the same sequence of calls give the same decisions and the same release order on any
machine, and hypothesis can drive it directly.

Theory of operation:

* ``decide()`` consumes exactly :data:`DRAWS_PER_DECISION` numbers from the schedule's private
  ``random.Random``, whatever the plan, so the decision for the *n*-th datagram depends only on
  the seed and *n* (not on time, not on earlier outcomes).
* A datagram that survives loss is delivered once, or twice when duplicated. Each copy gets a
  delay of ``delay + jitter * u`` (``u`` uniform in ``[0, 1)``). Independent jitter per copy
  reorders datagrams the way a real path does.
* A datagram chosen for reordering is *held back* until ``hold_behind`` (1 to
  ``reorder_window``) later datagrams have arrived, or until ``reorder_timeout`` seconds have
  passed, whichever comes first; it is then released after the datagrams that overtook it.
* Copies with no delay and no hold-back are *immediate*: the caller delivers them itself (this
  is what makes a zero-fault plan transparent, including the inner carrier's backpressure).
  Every other copy is *held* in a bounded queue ordered by ``(release time, eligibility
  order)``; ``poll(now)`` returns the copies that are due. At most ``max_held`` copies are held;
  a copy that does not fit is refused and the caller counts it as an overflow drop.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import math
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Final, Generic, NamedTuple, TypeVar

__all__ = [
    "DRAWS_PER_DECISION",
    "MAX_FAULT_SECONDS",
    "MAX_HELD_LIMIT",
    "MAX_REORDER_WINDOW",
    "Admission",
    "FaultDecision",
    "FaultDirection",
    "FaultPlan",
    "FaultSchedule",
    "derive_seed",
]

#: Random numbers ``FaultSchedule.decide`` draws per datagram, whatever the plan.
DRAWS_PER_DECISION: Final = 6
#: Upper bound of ``delay``, ``jitter`` and ``reorder_timeout``, in seconds.
MAX_FAULT_SECONDS: Final = 60.0
#: Upper bound of ``reorder_window``.
MAX_REORDER_WINDOW: Final = 64
#: Upper bound of ``max_held``.
MAX_HELD_LIMIT: Final = 65536
_SEED_LIMIT: Final = 1 << 64

T = TypeVar("T")


class FaultDirection(enum.StrEnum):
    """Which traffic of a socket a :class:`FaultPlan` applies to.

    ``SEND`` (the default) faults what the socket sends, so a network where every socket is
    wrapped faults each hop exactly once. ``RECEIVE`` faults what the socket reads from its
    inner carrier (useful to wrap only one end, for instance a server socket whose peers are
    not under the test's control). ``BOTH`` applies the plan twice, once each way.
    """

    SEND = "send"
    RECEIVE = "receive"
    BOTH = "both"


def derive_seed(seed: int, label: str | int) -> int:
    """Return a seed in ``0 .. 2**64 - 1`` derived deterministically from ``seed`` and
    ``label`` (stable across processes and Python versions: BLAKE2b, not ``hash``)."""
    digest = hashlib.blake2b(f"{seed}\x00{label}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _probability(name: str, value: object) -> float:
    number = _number(name, value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"FaultPlan.{name} is a probability and must be in [0, 1], got {number}")
    return number


def _seconds(name: str, value: object, *, positive: bool = False) -> float:
    number = _number(name, value)
    if positive and number <= 0.0:
        raise ValueError(f"FaultPlan.{name} must be > 0 seconds, got {number}")
    if not 0.0 <= number <= MAX_FAULT_SECONDS:
        raise ValueError(
            f"FaultPlan.{name} must be in [0, {MAX_FAULT_SECONDS}] seconds, got {number}"
        )
    return number


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"FaultPlan.{name} must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"FaultPlan.{name} must be finite, got {number}")
    return number


def _integer(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"FaultPlan.{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"FaultPlan.{name} must be in {low}..{high}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What a faulty network does to datagrams; immutable and validated on construction.

    Fields (all optional; the defaults describe a perfect network):

    * ``seed``: seeds every decision (``0 .. 2**64 - 1``); equal plans decide identically.
    * ``loss``: probability that a datagram is dropped.
    * ``duplicate``: probability that a surviving datagram is delivered twice.
    * ``reorder``: probability that a datagram is held back until 1 to ``reorder_window``
      later datagrams have passed it, or ``reorder_timeout`` seconds have passed.
    * ``delay``: base one-way delay in seconds; ``jitter``: extra delay, uniform in
      ``[0, jitter)``, drawn per copy (so jitter alone reorders too).
    * ``max_held``: most datagram copies held at once for delay or reordering, per direction;
      beyond it copies are dropped and counted as ``dropped_overflow``.
    * ``direction``: which traffic the plan applies to (:class:`FaultDirection`).

    Raises ``TypeError`` for a value of the wrong type and ``ValueError`` for one out of range
    (probabilities in ``[0, 1]``, times in ``[0, MAX_FAULT_SECONDS]``, ``reorder_timeout > 0``,
    ``reorder_window`` in ``1 .. MAX_REORDER_WINDOW``, ``max_held`` in
    ``0 .. MAX_HELD_LIMIT``). Number fields accept ints and are stored as floats.
    """

    seed: int = 0
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_window: int = 3
    reorder_timeout: float = 0.05
    delay: float = 0.0
    jitter: float = 0.0
    max_held: int = 1024
    direction: FaultDirection = FaultDirection.SEND

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "seed", _integer("seed", self.seed, 0, _SEED_LIMIT - 1))
        for name in ("loss", "duplicate", "reorder"):
            set_(self, name, _probability(name, getattr(self, name)))
        set_(
            self,
            "reorder_window",
            _integer("reorder_window", self.reorder_window, 1, MAX_REORDER_WINDOW),
        )
        set_(
            self,
            "reorder_timeout",
            _seconds("reorder_timeout", self.reorder_timeout, positive=True),
        )
        set_(self, "delay", _seconds("delay", self.delay))
        set_(self, "jitter", _seconds("jitter", self.jitter))
        set_(self, "max_held", _integer("max_held", self.max_held, 0, MAX_HELD_LIMIT))
        direction: object = self.direction
        if not isinstance(direction, str):
            raise TypeError(
                f"FaultPlan.direction must be a FaultDirection, not {type(direction).__name__}"
            )
        try:
            set_(self, "direction", FaultDirection(direction))
        except ValueError:
            choices = ", ".join(repr(d.value) for d in FaultDirection)
            raise ValueError(
                f"FaultPlan.direction must be one of {choices}, got {direction[:32]!r}"
            ) from None

    @property
    def is_transparent(self) -> bool:
        """Whether the plan changes nothing (no loss, duplication, reordering or delay)."""
        return not (self.loss or self.duplicate or self.reorder or self.delay or self.jitter)

    @property
    def faults_send(self) -> bool:
        """Whether the plan faults sent datagrams."""
        return not self.is_transparent and self.direction is not FaultDirection.RECEIVE

    @property
    def faults_receive(self) -> bool:
        """Whether the plan faults received datagrams."""
        return not self.is_transparent and self.direction is not FaultDirection.SEND

    def derive(self, label: str | int) -> FaultPlan:
        """The same plan with the seed :func:`derive_seed` ``(seed, label)``: one plan gives
        independent but reproducible decisions to each socket or direction."""
        return replace(self, seed=derive_seed(self.seed, label))

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> FaultPlan:
        """Build a plan from keyword options whose values may be text (``"0.1"``), as they
        arrive from configuration or a carrier factory.

        Keys are the field names. Raises ``TypeError`` naming an unknown key and listing the
        known ones, ``ValueError`` for text that does not parse or a value out of range.
        """
        known = {f.name: f for f in fields(cls)}
        values: dict[str, object] = {}
        for key, raw in options.items():
            spec = known.get(key)
            if spec is None:
                listing = ", ".join(sorted(known))
                raise TypeError(f"unknown fault plan option {key[:64]!r}; known: {listing}")
            values[key] = _parse_option(key, raw, spec.type)
        return cls(**values)  # type: ignore[arg-type]


def _parse_option(key: str, raw: object, annotation: object) -> object:
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if len(text) > 64:
        raise ValueError(f"fault plan option {key!r} is longer than 64 characters")
    try:
        if annotation == "int":
            return int(text, 0)
        if annotation == "float":
            return float(text)
    except ValueError:
        raise ValueError(f"fault plan option {key!r}: cannot parse {text!r}") from None
    return text  # direction: validated by FaultPlan


@dataclass(frozen=True, slots=True)
class FaultDecision:
    """The fate of one datagram, as :meth:`FaultSchedule.decide` draws it.

    ``lost``: dropped (then ``delays`` is empty). ``delays``: one delay in seconds per copy to
    deliver (two copies when duplicated). ``hold_behind``: ``0`` for in-order delivery, else the
    number of later datagrams the copies are held behind.
    """

    lost: bool
    delays: tuple[float, ...]
    hold_behind: int

    @property
    def copies(self) -> int:
        """Copies to deliver: 0 (lost), 1, or 2 (duplicated)."""
        return len(self.delays)

    @property
    def duplicated(self) -> bool:
        """Whether the datagram is delivered twice."""
        return len(self.delays) > 1

    @property
    def reordered(self) -> bool:
        """Whether the datagram is held back behind later ones."""
        return self.hold_behind > 0

    @property
    def immediate_copies(self) -> int:
        """Copies to deliver at once (no delay, not held back); the rest must be held."""
        if self.hold_behind:
            return 0
        return sum(1 for delay in self.delays if delay <= 0.0)


class Admission(NamedTuple):
    """What :meth:`FaultSchedule.hold` did with a datagram's held copies: ``held`` copies were
    queued (``delayed`` of them with a positive delay) and ``dropped`` were refused because
    ``max_held`` copies were already held."""

    held: int
    delayed: int
    dropped: int


class _Waiting(Generic[T]):
    """A reordered datagram waiting for later arrivals (or for its deadline)."""

    __slots__ = ("arrival", "deadline", "delays", "item", "remaining")

    def __init__(
        self, item: T, arrival: float, deadline: float, delays: tuple[float, ...], behind: int
    ) -> None:
        self.item = item
        self.arrival = arrival
        self.deadline = deadline
        self.delays = delays
        self.remaining = behind


class FaultSchedule(Generic[T]):
    """Seeded fault decisions and the bounded queue of held datagram copies (pure, no I/O).

    The caller owns time: every method that needs it takes ``now`` (any monotonic clock, in
    seconds). Typical use per arriving datagram ``item``::

        decision = schedule.decide()
        if not decision.lost:
            deliver(item) for each of decision.immediate_copies
            schedule.note_arrival(now)
            schedule.hold(item, decision, now)   # when copies remain to be held
        for due in schedule.poll(now): deliver(due)

    and ``poll(now)`` again when ``now`` reaches ``next_due()``. :meth:`offer` does the first
    part in one call. Items are opaque to the schedule and never copied.

    Not thread-safe: the caller serialises access.
    """

    __slots__ = ("_heap", "_held", "_plan", "_rng", "_seq", "_waiting")

    def __init__(self, plan: FaultPlan) -> None:
        if not isinstance(plan, FaultPlan):
            raise TypeError(f"FaultSchedule needs a FaultPlan, not {type(plan).__name__}")
        self._plan = plan
        self._rng = random.Random(plan.seed)
        # (release time, eligibility order, item): the order makes keys unique, so items are
        # never compared.
        self._heap: list[tuple[float, int, T]] = []
        self._waiting: deque[_Waiting[T]] = deque()
        self._held = 0
        self._seq = 0

    @property
    def plan(self) -> FaultPlan:
        """The plan this schedule follows."""
        return self._plan

    @property
    def held(self) -> int:
        """Copies currently held (at most ``plan.max_held``)."""
        return self._held

    def decide(self) -> FaultDecision:
        """Draw the fate of the next datagram (consumes :data:`DRAWS_PER_DECISION` numbers)."""
        plan = self._plan
        draw = self._rng.random
        u_loss, u_dup, u_reorder, u_behind, u_jitter1, u_jitter2 = (
            draw(),
            draw(),
            draw(),
            draw(),
            draw(),
            draw(),
        )
        if u_loss < plan.loss:
            return FaultDecision(True, (), 0)
        first = plan.delay + plan.jitter * u_jitter1
        if u_dup < plan.duplicate:
            delays: tuple[float, ...] = (first, plan.delay + plan.jitter * u_jitter2)
        else:
            delays = (first,)
        behind = 0
        if u_reorder < plan.reorder:
            behind = 1 + min(int(u_behind * plan.reorder_window), plan.reorder_window - 1)
        return FaultDecision(False, delays, behind)

    def note_arrival(self, now: float) -> None:
        """Record that one more datagram arrived (was not lost) at ``now``: datagrams held back
        behind enough later arrivals become eligible, ordered after the arrival."""
        if not self._waiting:
            return
        kept: deque[_Waiting[T]] = deque()
        for entry in self._waiting:
            entry.remaining -= 1
            if entry.remaining <= 0:
                self._release_waiting(entry, now)
            else:
                kept.append(entry)
        self._waiting = kept

    def hold(self, item: T, decision: FaultDecision, now: float) -> Admission:
        """Queue the copies of ``item`` that ``decision`` does not deliver at once.

        Call after :meth:`note_arrival` for the same datagram. Copies beyond ``max_held`` are
        refused and reported in :attr:`Admission.dropped`.
        """
        if decision.lost:
            return Admission(0, 0, 0)
        limit = self._plan.max_held
        if decision.hold_behind:
            room = max(0, limit - self._held)
            delays = decision.delays[:room]
            dropped = len(decision.delays) - len(delays)
            if delays:
                deadline = now + self._plan.reorder_timeout
                self._waiting.append(_Waiting(item, now, deadline, delays, decision.hold_behind))
                self._held += len(delays)
            return Admission(len(delays), sum(1 for d in delays if d > 0.0), dropped)
        held = delayed = dropped = 0
        for delay in decision.delays:
            if delay <= 0.0:
                continue  # immediate: the caller delivers it
            if self._held >= limit:
                dropped += 1
                continue
            self._push(now + delay, item)
            self._held += 1
            held += 1
            delayed += 1
        return Admission(held, delayed, dropped)

    def offer(self, item: T, now: float) -> tuple[FaultDecision, Admission, list[T]]:
        """Decide the fate of ``item`` arriving at ``now`` and queue what must be held.

        Returns the decision, the admission of its held copies, and the copies to deliver
        immediately (``item`` zero, one or two times). Poll afterwards for copies that became
        due, including those released by this arrival.
        """
        decision = self.decide()
        if decision.lost:
            return decision, Admission(0, 0, 0), []
        self.note_arrival(now)
        admission = self.hold(item, decision, now)
        return decision, admission, [item] * decision.immediate_copies

    def next_due(self) -> float | None:
        """The earliest time at which :meth:`poll` will return something (possibly in the
        past: then something is due now), or ``None`` when nothing is held."""
        due = self._heap[0][0] if self._heap else None
        if self._waiting:
            deadline = min(entry.deadline for entry in self._waiting)
            due = deadline if due is None else min(due, deadline)
        return due

    def poll(self, now: float, limit: int | None = None) -> list[T]:
        """Remove and return the held copies due at ``now`` (at most ``limit``), in release
        order: by release time, then by the order in which they became eligible."""
        if self._waiting and any(entry.deadline <= now for entry in self._waiting):
            self._expire_waiting(now)
        out: list[T] = []
        heap = self._heap
        while heap and heap[0][0] <= now and (limit is None or len(out) < limit):
            out.append(heapq.heappop(heap)[2])
        self._held -= len(out)
        return out

    def clear(self) -> int:
        """Drop every held copy; return how many were dropped."""
        dropped = self._held
        self._heap.clear()
        self._waiting.clear()
        self._held = 0
        return dropped

    # -- internals --------------------------------------------------------------------------

    def _push(self, when: float, item: T) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, item))

    def _release_waiting(self, entry: _Waiting[T], eligible: float) -> None:
        for delay in entry.delays:
            self._push(max(entry.arrival + delay, eligible), entry.item)

    def _expire_waiting(self, now: float) -> None:
        kept: deque[_Waiting[T]] = deque()
        for entry in self._waiting:
            if entry.deadline <= now:
                self._release_waiting(entry, entry.deadline)
            else:
                kept.append(entry)
        self._waiting = kept
