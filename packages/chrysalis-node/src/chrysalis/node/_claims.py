"""The claim protocol of persistent scale experiments (issue 22), as a sans-IO state machine.

Theory of operation. An *experiment* names work (kind ``echo``: ``count`` round trips of
``payload`` bytes to each destination, after ``warmup`` untimed ones; ``stream-transfer``:
``count`` one-way transfers of ``payload`` bytes) and two target lists:
the *sources* that run it and the *destinations* they measure against. The unit of work is
one ``(experiment, source)`` pair; its *claim* is the record the source writes when it takes
the work. The ledger below holds every record of the five tables (nodes, experiments,
targets, claims, results) and decides every change; ``chrysalis.node._experiment_store``
applies each decision as one SQLite transaction of a replicated ``chrysalis.sqlite``
replica, so the records travel the node tree and any process can inspect them.

The rules, each enforced here and checked by ``tests/test_claims.py``'s model:

- **Exactly once.** A node claims only work addressed to its own PID, and a pair has at most
  one claim record ever: claiming again (a duplicate poll, a replayed command) returns the
  claim the node already holds and writes nothing.
- **A claim survives a restart.** A node that registers again with the same PID gets a new
  *incarnation*; its next poll *resumes* its open claim (same claim, ``attempt + 1``, the
  new incarnation) instead of making another. Results are accepted only from the claim's
  current ``(incarnation, attempt)`` (``StaleClaimError`` otherwise), so an older
  incarnation cannot overwrite what the newer one reports.
- **Never silently lost.** When a node is declared lost (``node_lost``: the supervisor saw
  its process exit, or it left the namespace), every open pair it is the source of becomes
  ``failed`` with the reason, claimed or not, recorded as a ``LossVerdict``: final, kept
  apart from the claim row, so that what the node wrote before it learnt of its loss (a
  hung process that resumes and finishes its run, a healed partition) cannot replace it
  when the replicas merge by last writer. Every pair thus ends ``done``, ``failed`` or
  ``cancelled``, or is still owned by a live node.
- **A lost node can return.** Being declared lost is a judgement from outside (an exit
  status, or an absence from the namespace longer than a grace) and can be wrong: a leaf
  whose head restarted, a process hung and resumed (``SIGSTOP``/``SIGCONT``), a healed
  partition. A lost node seen again comes back ``live`` by one of the two signals the ledger
  and its supervisor have: it *registers* again (a new process with the same PID: a new
  incarnation, as for any restart), or its supervisor sees it back in view
  (``node_returned``: the *same* incarnation, since it is the same process). Either way the
  node row records when and why (``returned_at``, ``returned_reason``) next to the last loss
  (``lost_at``, ``lost_reason``) and how many times it was lost (``losses``). The same
  incarnation on a return is enough for fencing: the work it held ended ``failed`` when it
  was lost, and that failure is never retracted: the transition table has no way out of
  ``failed``, so the old claim's late ``start``, results or failure are ``StaleClaimError``
  whatever the incarnation (a new incarnation would misreport a process restart), and what
  the node wrote before it learnt of the loss yields to the ``LossVerdict``. Work
  addressed to it afterwards is claimed as usual, and it can be declared lost again.
- **Sources are live when submitted.** Work for a node that is lost (or stopped) is refused
  at ``submit`` with an error that says so, not kept pending: most losses are real (killed,
  given up after its restarts), and a pair pending for a node that never returns would
  never end (``submit --wait`` would wait for ever). Resubmit once ``admin nodes`` shows it
  live again. A lost node may still be a *destination*; its pairs then report failures.
- **Cancel.** ``cancel`` marks the experiment cancelled and every open pair ``cancelled``; a
  node that had already claimed it sees the experiment cancelled at its next poll, and its
  late results are refused.

The ledger takes the time as an argument (``now``, seconds since the epoch) and never reads
a clock, a socket or a loop. Operations return the records they changed (``Decision``), in
the order a store should write them; an operation that changes nothing returns an empty
decision. Every collection is bounded (``MAX_*``); bad input raises ``LedgerError`` with a
sentence that says what was wrong.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final, final

__all__ = [
    "CLAIM_TRANSITIONS",
    "KINDS",
    "MAX_EXPERIMENTS",
    "MAX_NODES",
    "MAX_PAYLOAD",
    "MAX_TARGETS",
    "MAX_TRANSFER",
    "TERMINAL",
    "ClaimEvent",
    "ClaimRecord",
    "ClaimState",
    "Decision",
    "ExperimentLedger",
    "ExperimentRecord",
    "ExperimentSpec",
    "LedgerError",
    "Liveness",
    "LossVerdict",
    "NodeRecord",
    "NodeState",
    "Record",
    "ResultRecord",
    "StaleClaimError",
    "TargetRecord",
    "Work",
    "check_pid",
    "experiment_status",
    "select_nodes",
]

MAX_NODES: Final = 4096
"""Most node records a ledger holds (one per PID)."""
MAX_EXPERIMENTS: Final = 1024
"""Most experiments a ledger holds, finished ones included."""
MAX_TARGETS: Final = 4096
"""Most sources, and most destinations, of one experiment."""
MAX_PAYLOAD: Final = 1024 * 1024
"""Largest echo payload (the scale worker's ``MAX_ECHO_PAYLOAD``)."""
MAX_TRANSFER: Final = 1024 * 1024 * 1024
"""Largest stream-transfer payload (bytes sent on one stream)."""
MAX_COUNT: Final = 100_000
MAX_WARMUP: Final = 1000
MAX_CONCURRENCY: Final = 1024
MAX_ERROR: Final = 500
"""Error texts are cut to this many characters."""
KINDS: Final = ("echo", "stream-transfer")
"""Experiment kinds a node runs: ``echo`` (round trips of ``payload`` bytes on a fresh
stream) and ``stream-transfer`` (``payload`` bytes sent on a fresh stream, the receiver
answers how many it got)."""
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_PID: Final = re.compile(r"[0-9a-f]{32}")


class LedgerError(ValueError):
    """An operation was refused: bad input, an unknown name or PID, a full ledger."""


class StaleClaimError(LedgerError):
    """A report from a claim's former holder (another incarnation or attempt), or for work
    that already ended (lost, cancelled): the ledger keeps what it has."""


class NodeState(StrEnum):
    LIVE = "live"
    STOPPED = "stopped"
    LOST = "lost"


class ClaimState(StrEnum):
    """Where one ``(experiment, source)`` pair is. No record at all means *pending*."""

    CLAIMED = "claimed"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ClaimEvent(StrEnum):
    CLAIM = "claim"
    RESUME = "resume"
    START = "start"
    FINISH = "finish"
    FAIL = "fail"
    LOSE = "lose"
    CANCEL = "cancel"


TERMINAL: Final = frozenset({ClaimState.DONE, ClaimState.FAILED, ClaimState.CANCELLED})

_C, _R = ClaimState.CLAIMED, ClaimState.RUNNING
CLAIM_TRANSITIONS: Final[Mapping[tuple[ClaimState | None, ClaimEvent], ClaimState]] = {
    (None, ClaimEvent.CLAIM): _C,
    (_C, ClaimEvent.RESUME): _C,
    (_R, ClaimEvent.RESUME): _C,
    (_C, ClaimEvent.START): _R,
    (_R, ClaimEvent.FINISH): ClaimState.DONE,
    (_C, ClaimEvent.FAIL): ClaimState.FAILED,
    (_R, ClaimEvent.FAIL): ClaimState.FAILED,
    (None, ClaimEvent.LOSE): ClaimState.FAILED,
    (_C, ClaimEvent.LOSE): ClaimState.FAILED,
    (_R, ClaimEvent.LOSE): ClaimState.FAILED,
    (None, ClaimEvent.CANCEL): ClaimState.CANCELLED,
    (_C, ClaimEvent.CANCEL): ClaimState.CANCELLED,
    (_R, ClaimEvent.CANCEL): ClaimState.CANCELLED,
}
"""Every transition of a pair's claim, in one table (``None``: no claim yet). Anything not
listed is refused."""


def check_pid(pid: str) -> str:
    """``pid`` if it is 32 lowercase hex digits (``LedgerError`` otherwise)."""
    if not isinstance(pid, str) or not _PID.fullmatch(pid):
        raise LedgerError(f"{pid!r} is not a PID (32 lowercase hex digits)")
    return pid


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


def _time(now: float) -> float:
    if not math.isfinite(now) or now < 0:
        raise LedgerError(f"time {now!r} is not a finite, non-negative number of seconds")
    return now


# -- records (one per table row) -------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One scale process: its PID, ``incarnation`` (1, then one more per restart with the
    same PID), lineage (``parent`` PID, ``''`` for the root; ``level``; ``rank``), ``task``,
    ``role``, ``carrier`` (``udp``/``unixgram``), the ``address`` it advertises, its labels
    as ``k=v,...``, when it started and its ``state``; then its losses and returns (the
    ledger keeps them: whatever a caller passes to ``register`` is replaced)."""

    pid: str
    incarnation: int
    rank: int
    parent: str
    level: int
    task: int
    role: str
    carrier: str
    address: str
    labels: str
    started_at: float
    state: NodeState = NodeState.LIVE
    losses: int = 0
    """How many times the node was declared lost."""
    lost_at: float = 0.0
    """When it was last declared lost (0: never)."""
    lost_reason: str = ""
    returned_at: float = 0.0
    """When it last came back from ``lost`` (0: never): seen again or registered again."""
    returned_reason: str = ""


@final
@dataclass(frozen=True, slots=True)
class ExperimentSpec:
    """What to run: ``kind`` (``KINDS``), ``payload`` bytes, ``count`` measured operations per
    destination after ``warmup`` untimed ones, at most ``concurrency`` in flight, the whole
    run bounded by ``timeout`` seconds; ``baselines``: each measured pair's direct network
    baselines after the Chrysalis figures (``chrysalis.node._baselines``; ``False``: none,
    about a quarter of an echo experiment's time). Checked on construction (``LedgerError``)."""

    name: str
    kind: str = "echo"
    payload: int = 1
    count: int = 10
    warmup: int = 1
    concurrency: int = 1
    timeout: float = 60.0
    baselines: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise LedgerError(
                f"experiment name {self.name!r} must be 1 to 64 of A-Z a-z 0-9 . _ - "
                "(starting with a letter or digit)"
            )
        if self.kind not in KINDS:
            raise LedgerError(f"unknown experiment kind {self.kind!r} (built: {', '.join(KINDS)})")
        for what, value, low, high in (
            ("payload", self.payload, 0, MAX_PAYLOAD if self.kind == "echo" else MAX_TRANSFER),
            ("count", self.count, 1, MAX_COUNT),
            ("warmup", self.warmup, 0, MAX_WARMUP),
            ("concurrency", self.concurrency, 1, MAX_CONCURRENCY),
        ):
            if not isinstance(value, int) or not low <= value <= high:
                raise LedgerError(f"{what} must be an integer in {low}..{high}, got {value!r}")
        if not (isinstance(self.timeout, int | float) and 0.1 <= self.timeout <= 86_400):
            raise LedgerError(f"timeout must be in 0.1..86400 seconds, got {self.timeout!r}")
        if not isinstance(self.baselines, bool):
            raise LedgerError(f"baselines must be true or false, got {self.baselines!r}")


@final
@dataclass(frozen=True, slots=True)
class ExperimentRecord:
    """A submitted experiment: its spec, who submitted it and when, and whether it was
    cancelled (``cancelled_at`` > 0)."""

    spec: ExperimentSpec
    submitted_by: str
    submitted_at: float
    cancelled_at: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def cancelled(self) -> bool:
        return self.cancelled_at > 0


@final
@dataclass(frozen=True, slots=True)
class TargetRecord:
    """One of an experiment's ``source`` or ``destination`` PIDs, at ``position``."""

    experiment: str
    role: str
    position: int
    pid: str


@final
@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """The claim of one ``(experiment, source)`` pair: the holder's ``incarnation``, the
    ``attempt`` (1, one more per resume), the ``state``, when it was first claimed and last
    changed, and why it failed or ended (``error``)."""

    experiment: str
    source: str
    incarnation: int
    attempt: int
    state: ClaimState
    claimed_at: float
    updated_at: float
    error: str = ""


@final
@dataclass(frozen=True, slots=True)
class ResultRecord:
    """What ``source`` measured against ``destination``: ``status`` ``ok`` or ``failed``,
    ``completed`` of ``count`` operations in ``seconds`` (this pair's), latency percentiles in
    ms (0 when nothing completed), payload throughput in MiB/s (both directions for an
    echo), the first ``error`` and the pair's ``baselines``."""

    experiment: str
    source: str
    destination: str
    status: str
    count: int
    completed: int
    seconds: float
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    max_ms: float = 0.0
    mib_per_second: float = 0.0
    error: str = ""
    baselines: str = ""
    """The direct network baselines measured for this pair in the same run, as JSON
    (``chrysalis.node._baselines.encode_baselines``; empty when none were measured)."""


@final
@dataclass(frozen=True, slots=True)
class LossVerdict:
    """The failure ``node_lost`` decided for one pair of a lost source (``claim``, state
    ``failed``): final. A store keeps it apart from the claim row, which the source itself
    also writes, so that a write the source made before it learnt of its loss (a resumed
    process finishing its run, a partition healing) cannot replace it when the replicas
    merge: the ledger reads the pair as this verdict, whatever its claim row says, and
    ignores the pair's result rows."""

    claim: ClaimRecord


Record = NodeRecord | ExperimentRecord | TargetRecord | ClaimRecord | ResultRecord | LossVerdict


@final
@dataclass(frozen=True, slots=True)
class Decision:
    """The records one operation wrote (to be stored in one transaction, in this order)."""

    records: tuple[Record, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.records)


@final
@dataclass(frozen=True, slots=True)
class Work:
    """A node's claimed work: the experiment, its destinations, the claim to report with."""

    experiment: ExperimentRecord
    destinations: tuple[str, ...]
    claim: ClaimRecord
    resumed: bool


def experiment_status(claims: Sequence[ClaimRecord | None], cancelled: bool) -> str:
    """An experiment's status from its pairs' claims (``None``: not claimed yet):
    ``cancelled``; ``pending`` (nothing claimed); ``running``; ``done`` (every pair done);
    ``failed`` (every pair ended, at least one failed)."""
    if cancelled:
        return "cancelled"
    states = [None if c is None else c.state for c in claims]
    if all(s is None for s in states):
        return "pending"
    if any(s is None or s not in TERMINAL for s in states):
        return "running"
    if all(s is ClaimState.DONE for s in states):
        return "done"
    return "failed"


# -- the ledger --------------------------------------------------------------------------------


@final
@dataclass(slots=True)
class ExperimentLedger:
    """Every record of the five tables, and the only code that changes them."""

    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    experiments: dict[str, ExperimentRecord] = field(default_factory=dict)
    targets: dict[tuple[str, str, int], TargetRecord] = field(default_factory=dict)
    claims: dict[tuple[str, str], ClaimRecord] = field(default_factory=dict)
    results: dict[tuple[str, str, str], ResultRecord] = field(default_factory=dict)
    verdicts: dict[tuple[str, str], ClaimRecord] = field(default_factory=dict)
    """The pairs failed by a loss (``LossVerdict``): final, over any claim or result row."""

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> ExperimentLedger:
        """A ledger holding ``records`` (as a store loads them)."""
        ledger = cls()
        ledger.absorb(records)
        return ledger

    def absorb(self, records: Iterable[Record]) -> None:
        """Take records as they are (a store's rows, a replica's delivery; replaying one is
        a no-op), except that a pair with a ``LossVerdict`` stays that verdict: its claim
        rows and result rows, before or after it, are ignored (results already taken are
        dropped by the experiment's destinations: a store loads targets first)."""
        for record in records:
            if isinstance(record, NodeRecord):
                self.nodes[record.pid] = record
            elif isinstance(record, ExperimentRecord):
                self.experiments[record.name] = record
            elif isinstance(record, TargetRecord):
                self.targets[(record.experiment, record.role, record.position)] = record
            elif isinstance(record, ClaimRecord):
                key = (record.experiment, record.source)
                self.claims[key] = self.verdicts.get(key, record)
            elif isinstance(record, LossVerdict):
                claim = record.claim
                key = (claim.experiment, claim.source)
                self.verdicts[key] = self.claims[key] = claim
                for destination in self.role_pids(claim.experiment, "destination"):
                    self.results.pop((*key, destination), None)
            elif (record.experiment, record.source) not in self.verdicts:
                self.results[(record.experiment, record.source, record.destination)] = record

    def _decide(self, *records: Record) -> Decision:
        self.absorb(records)
        return Decision(records)

    # -- queries --------------------------------------------------------------------------

    def role_pids(self, experiment: str, role: str) -> tuple[str, ...]:
        """An experiment's ``source`` or ``destination`` PIDs in position order."""
        found = sorted(
            (t.position, t.pid) for k, t in self.targets.items() if k[:2] == (experiment, role)
        )
        return tuple(pid for _, pid in found)

    def status(self, experiment: str) -> str:
        """``experiment_status`` of one experiment (``LedgerError`` if unknown)."""
        record = self._experiment(experiment)
        pairs = [self.claims.get((experiment, s)) for s in self.role_pids(experiment, "source")]
        return experiment_status(pairs, record.cancelled)

    def open_pairs(self) -> list[tuple[str, str]]:
        """Every ``(experiment, source)`` that has not ended."""
        pairs = []
        for name in self.experiments:
            for source in self.role_pids(name, "source"):
                claim = self.claims.get((name, source))
                if claim is None or claim.state not in TERMINAL:
                    pairs.append((name, source))
        return pairs

    def _experiment(self, name: str) -> ExperimentRecord:
        record = self.experiments.get(name)
        if record is None:
            raise LedgerError(f"no experiment named {name!r}")
        return record

    def _claim(self, experiment: str, source: str) -> ClaimRecord:
        claim = self.claims.get((experiment, source))
        if claim is None:
            raise StaleClaimError(f"{source[:8]} holds no claim on {experiment!r}")
        return claim

    @staticmethod
    def _move(claim: ClaimRecord | None, event: ClaimEvent) -> ClaimState:
        state = None if claim is None else claim.state
        target = CLAIM_TRANSITIONS.get((state, event))
        if target is None:
            raise StaleClaimError(f"cannot {event.value} a claim that is {state or 'pending'}")
        return target

    # -- nodes ----------------------------------------------------------------------------

    def register(self, node: NodeRecord, now: float) -> Decision:
        """A node started (or restarted with the same PID: ``incarnation`` goes up by one,
        whatever the caller passed). Returns the stored record's decision."""
        _time(now)
        check_pid(node.pid)
        if node.parent:
            check_pid(node.parent)
        old = self.nodes.get(node.pid)
        if old is None and len(self.nodes) >= MAX_NODES:
            raise LedgerError(f"the ledger holds {MAX_NODES} nodes already")
        incarnation = 1 if old is None else old.incarnation + 1
        record = replace(
            node,
            incarnation=incarnation,
            state=NodeState.LIVE,
            losses=0 if old is None else old.losses,
            lost_at=0.0 if old is None else old.lost_at,
            lost_reason="" if old is None else old.lost_reason,
            returned_at=0.0 if old is None else old.returned_at,
            returned_reason="" if old is None else old.returned_reason,
        )
        if old is not None and old.state is NodeState.LOST:
            why = f"registered again as incarnation {incarnation}"
            record = replace(record, returned_at=now, returned_reason=why)
        return self._decide(record)

    def node_returned(self, pid: str, now: float, reason: str = "it is in view again") -> Decision:
        """A node declared lost is seen again (its supervisor resolves it once more): it is
        ``live`` again, the same incarnation, with ``returned_at`` and ``reason`` recorded.
        The work that failed when it was lost stays failed. A live node: a no-op (a
        duplicate report). A stopped node left cleanly and comes back only by registering
        (``LedgerError``), as does an unknown PID."""
        _time(now)
        old = self.nodes.get(check_pid(pid))
        if old is None:
            raise LedgerError(f"node {pid[:8]} is not registered")
        if old.state is NodeState.LIVE:
            return Decision()
        if old.state is not NodeState.LOST:
            raise LedgerError(
                f"node {pid[:8]} is {old.state.value}, not lost: it comes back by registering"
            )
        return self._decide(
            replace(old, state=NodeState.LIVE, returned_at=now, returned_reason=_cut(reason))
        )

    def node_stopped(self, pid: str, now: float) -> Decision:
        """A node left cleanly: like ``node_lost`` for its open work (``failed``, "stopped"),
        and the node is marked ``stopped``."""
        return self._down(pid, now, NodeState.STOPPED, "its node stopped before finishing")

    def node_lost(self, pid: str, now: float, reason: str = "its node was lost") -> Decision:
        """A node died (or is taken for dead): every open pair it is the source of fails with
        ``reason``, and a live node row becomes ``lost`` (``losses`` + 1, ``lost_at``,
        ``lost_reason``). It may come back: ``node_returned``, ``register``."""
        return self._down(pid, now, NodeState.LOST, reason)

    def _down(self, pid: str, now: float, state: NodeState, reason: str) -> Decision:
        _time(now)
        check_pid(pid)
        old = self.nodes.get(pid)
        records: list[Record] = []
        if old is not None and old.state is NodeState.LIVE:
            if state is NodeState.LOST:
                old = replace(old, losses=old.losses + 1, lost_at=now, lost_reason=_cut(reason))
            records.append(replace(old, state=state))
        for name, source in self.open_pairs():
            if source != pid:
                continue
            claim = self.claims.get((name, source))
            self._move(claim, ClaimEvent.LOSE)
            if claim is None:
                claim = ClaimRecord(name, source, 0, 0, ClaimState.FAILED, now, now, _cut(reason))
            else:
                claim = replace(claim, state=ClaimState.FAILED, updated_at=now, error=_cut(reason))
            # a clean stop is the node's own word; a loss is decided elsewhere, so its
            # verdict must outlast the node's concurrent writes (``LossVerdict``)
            records.append(LossVerdict(claim) if state is NodeState.LOST else claim)
        return self._decide(*records)

    # -- experiments ----------------------------------------------------------------------

    def submit(
        self,
        spec: ExperimentSpec,
        sources: Sequence[str],
        destinations: Sequence[str],
        *,
        submitted_by: str,
        now: float,
    ) -> Decision:
        """A new experiment. Sources and destinations must be known, distinct within each
        list, at most ``MAX_TARGETS`` each, sources live, and a source is never measured
        against itself (it skips itself). Submitting the same experiment again is a no-op;
        a different one under a taken name is refused."""
        _time(now)
        check_pid(submitted_by)
        for role, pids in (("source", sources), ("destination", destinations)):
            if not pids:
                raise LedgerError(f"an experiment needs at least one {role}")
            if len(pids) > MAX_TARGETS:
                raise LedgerError(f"{len(pids)} {role}s; at most {MAX_TARGETS}")
            if len(set(pids)) != len(pids):
                raise LedgerError(f"the {role}s list a PID twice")
            for pid in pids:
                if check_pid(pid) not in self.nodes:
                    raise LedgerError(f"{role} {pid} is not a registered node")
        for pid in sources:  # work for a node that is down would never be claimed
            if self.nodes[pid].state is not NodeState.LIVE:
                raise LedgerError(f"source {pid} is {self.nodes[pid].state.value}, not live")
        if set(sources) == set(destinations) and len(sources) == 1:
            raise LedgerError("the only source is the only destination: nothing to measure")
        old = self.experiments.get(spec.name)
        if old is not None:
            same = (
                old.spec == spec
                and self.role_pids(spec.name, "source") == tuple(sources)
                and self.role_pids(spec.name, "destination") == tuple(destinations)
            )
            if same:
                return Decision()
            raise LedgerError(f"an experiment named {spec.name!r} exists already")
        if len(self.experiments) >= MAX_EXPERIMENTS:
            raise LedgerError(f"the ledger holds {MAX_EXPERIMENTS} experiments already")
        records: list[Record] = [ExperimentRecord(spec, submitted_by, now)]
        for role, pids in (("source", sources), ("destination", destinations)):
            records.extend(TargetRecord(spec.name, role, i, pid) for i, pid in enumerate(pids))
        return self._decide(*records)

    def cancel(self, name: str, now: float) -> Decision:
        """Cancel an experiment: every open pair becomes ``cancelled``. Cancelling again is a
        no-op; an experiment whose every pair ended (done or failed) is refused: its results
        stand."""
        _time(now)
        record = self._experiment(name)
        if record.cancelled:
            return Decision()
        status = self.status(name)
        if status in ("done", "failed"):
            raise LedgerError(f"experiment {name!r} already ended ({status}); nothing to cancel")
        records: list[Record] = [replace(record, cancelled_at=max(now, 1e-9))]
        for experiment, source in self.open_pairs():
            if experiment != name:
                continue
            claim = self.claims.get((experiment, source))
            self._move(claim, ClaimEvent.CANCEL)
            if claim is None:
                claim = ClaimRecord(name, source, 0, 0, ClaimState.CANCELLED, now, now, "cancelled")
            else:
                claim = replace(
                    claim, state=ClaimState.CANCELLED, updated_at=now, error="cancelled"
                )
            records.append(claim)
        return self._decide(*records)

    # -- a node's side --------------------------------------------------------------------

    def next_work(self, pid: str, now: float) -> tuple[Work | None, Decision]:
        """The first open work addressed to ``pid`` (in submission order, then name), claimed
        for the node's current incarnation: a new claim, the node's own claim again (a
        duplicate poll: nothing written) or an older incarnation's claim resumed. A claim
        whose experiment was cancelled meanwhile (replication raced the claim) is moved to
        ``cancelled`` and skipped."""
        _time(now)
        node = self.nodes.get(check_pid(pid))
        if node is None or node.state is not NodeState.LIVE:
            raise LedgerError(f"node {pid[:8]} is not registered as live")
        order = sorted(self.experiments.values(), key=lambda e: (e.submitted_at, e.name))
        written: list[Record] = []
        for experiment in order:
            name = experiment.name
            if pid not in self.role_pids(name, "source"):
                continue
            claim = self.claims.get((name, pid))
            if claim is not None and claim.state in TERMINAL:
                continue
            if experiment.cancelled:
                self._move(claim, ClaimEvent.CANCEL)
                base = claim or ClaimRecord(name, pid, 0, 0, ClaimState.CANCELLED, now, now)
                written.append(
                    replace(base, state=ClaimState.CANCELLED, updated_at=now, error="cancelled")
                )
                continue
            resumed = False
            if claim is None:
                self._move(claim, ClaimEvent.CLAIM)
                claim = ClaimRecord(name, pid, node.incarnation, 1, ClaimState.CLAIMED, now, now)
                written.append(claim)
            elif claim.incarnation != node.incarnation:
                self._move(claim, ClaimEvent.RESUME)
                claim = replace(
                    claim,
                    incarnation=node.incarnation,
                    attempt=claim.attempt + 1,
                    state=ClaimState.CLAIMED,
                    updated_at=now,
                )
                written.append(claim)
                resumed = True
            destinations = tuple(d for d in self.role_pids(name, "destination") if d != pid)
            return Work(experiment, destinations, claim, resumed), self._decide(*written)
        return None, self._decide(*written)

    def _held(self, work: ClaimRecord) -> ClaimRecord:
        claim = self._claim(work.experiment, work.source)
        if self._experiment(work.experiment).cancelled:  # even if the claim row raced it
            raise StaleClaimError(f"experiment {work.experiment!r} was cancelled")
        if (claim.incarnation, claim.attempt) != (work.incarnation, work.attempt):
            raise StaleClaimError(
                f"the claim on {work.experiment!r} by {work.source[:8]} is now attempt "
                f"{claim.attempt} of incarnation {claim.incarnation}, not attempt "
                f"{work.attempt} of incarnation {work.incarnation}"
            )
        return claim

    def start(self, work: ClaimRecord, now: float) -> Decision:
        """The warm-up is over and the measured run starts (``StaleClaimError`` if the claim
        is no longer this one's, or ended)."""
        _time(now)
        claim = self._held(work)
        state = self._move(claim, ClaimEvent.START)
        return self._decide(replace(claim, state=state, updated_at=now))

    def finish(self, work: ClaimRecord, results: Sequence[ResultRecord], now: float) -> Decision:
        """The run ended: one result per destination, then the claim ``done``. Reporting the
        same results again for a claim already done is a no-op; anything else from a former
        holder, or for ended work, is ``StaleClaimError``."""
        _time(now)
        claim = self._claim(work.experiment, work.source)
        if claim.state is ClaimState.DONE and (claim.incarnation, claim.attempt) == (
            work.incarnation,
            work.attempt,
        ):
            stored = [self.results.get((r.experiment, r.source, r.destination)) for r in results]
            if stored == list(results):
                return Decision()
        claim = self._held(work)
        state = self._move(claim, ClaimEvent.FINISH)
        expected = set(self.role_pids(work.experiment, "destination")) - {work.source}
        got = [r.destination for r in results]
        if len(set(got)) != len(got) or set(got) != expected:
            raise LedgerError(
                f"results name {len(set(got))} destinations; the experiment has {len(expected)}"
            )
        for r in results:
            if (r.experiment, r.source) != (work.experiment, work.source):
                raise LedgerError("a result belongs to another experiment or source")
            if r.status not in ("ok", "failed"):
                raise LedgerError(f"result status {r.status!r} is not ok or failed")
        records: list[Record] = [replace(r, error=_cut(r.error)) for r in results]
        records.append(replace(claim, state=state, updated_at=now))
        return self._decide(*records)

    def fail(self, work: ClaimRecord, error: str, now: float) -> Decision:
        """The node could not run the work at all (``error`` says why)."""
        _time(now)
        claim = self._held(work)
        state = self._move(claim, ClaimEvent.FAIL)
        return self._decide(replace(claim, state=state, updated_at=now, error=_cut(error)))


# -- liveness ------------------------------------------------------------------------------------


@final
class Liveness:
    """Which live nodes to declare lost because they stayed out of view for ``grace``
    seconds, and which lost nodes are back in view (sans-IO: the caller says, at ``now``,
    which node PIDs the ledger holds live or lost and which PIDs it can resolve). A
    supervisor feeds it its namespace, so a node that was killed or hung (fenced by the QUIC
    idle timeout) and left the namespace is declared lost even where no exit status is seen,
    and one that joins again (resumed, its partition healed, its head back) is reported
    returned. Holds one timestamp per live node missing now and one PID per lost node seen
    out of view since it was lost (both bounded by the PIDs the caller passes)."""

    __slots__ = ("_away", "_grace", "_missing_since")

    def __init__(self, grace: float) -> None:
        if not math.isfinite(grace) or grace <= 0:
            raise LedgerError(f"grace must be a positive number of seconds, got {grace!r}")
        self._grace = grace
        self._missing_since: dict[str, float] = {}
        self._away: set[str] = set()

    def observe(self, live: Iterable[str], visible: Collection[str], now: float) -> list[str]:
        """The live nodes missing from ``visible`` for at least ``grace`` seconds, in PID
        order; each is reported once per absence (``math.inf`` until it is seen again or is
        no longer passed as live: once the ledger holds it lost, it is forgotten here, so
        after a return a later absence starts a fresh grace and is reported again)."""
        _time(now)
        live_set = set(live)
        for pid in list(self._missing_since):
            if pid not in live_set or pid in visible:
                del self._missing_since[pid]
        lost = []
        for pid in sorted(live_set - set(visible)):
            since = self._missing_since.setdefault(pid, now)
            if now - since >= self._grace:
                lost.append(pid)
        for pid in lost:
            self._missing_since[pid] = math.inf  # reported: not again while it stays away
            self._away.add(pid)  # out of view when reported: its next sighting is a return
        return lost

    def returned(self, lost: Iterable[str], visible: Collection[str]) -> list[str]:
        """The lost nodes back in ``visible``, in PID order, each reported once per return.
        Only a node seen *out* of view since it was lost counts (every node this object
        reported lost was): a node declared lost for its exit status stays resolvable
        until its parent's link to it idles out, and that stale entry is no return."""
        lost_set = set(lost)
        self._away &= lost_set  # forget nodes no longer lost (returned, registered again)
        back = sorted(pid for pid in self._away if pid in visible)
        self._away.difference_update(back)
        self._away.update(pid for pid in lost_set if pid not in visible)
        return back


# -- choosing targets ----------------------------------------------------------------------------

MAX_SELECTOR: Final = 4096
"""Longest selector text."""


def select_nodes(
    nodes: Iterable[NodeRecord],
    selector: str,
    *,
    seed: int | None = None,
    live_only: bool = True,
) -> tuple[str, ...]:
    """The live nodes ``selector`` names (every node, without ``live_only``: how ``admin
    nodes`` filters), in rank order (then PID).

    A selector is terms separated by commas; the result is the union of what they match:
    ``all``; a PID or PID prefix (hex, also ``pid:HEX``: every node whose PID starts with
    it); ``label:K=V`` (the node's labels hold ``K=V``); ``task:N``, ``rank:N``,
    ``level:N``; ``role:R``. A term ``sample:N`` then keeps ``N`` of the union chosen at
    random (``seed`` makes the choice repeatable). ``LedgerError`` for an unknown or
    malformed term, a term that matches no live node, or a sample larger than the union.
    """
    if not selector or len(selector) > MAX_SELECTOR:
        raise LedgerError(f"a selector has 1 to {MAX_SELECTOR} characters")
    live = sorted(
        (n for n in nodes if n.state is NodeState.LIVE or not live_only),
        key=lambda n: (n.rank, n.pid),
    )
    chosen: set[str] = set()
    sample: int | None = None
    for term in (t.strip() for t in selector.split(",")):
        kind, sep, value = term.partition(":")
        if not sep:
            kind, value = ("all", "") if term == "all" else ("pid", term)
        if kind == "sample":
            if not value.isdigit() or int(value) < 1:
                raise LedgerError(f"{term!r}: sample takes a positive count")
            sample = int(value)
            continue
        matched = _match(live, kind, value, term)
        if not matched:
            raise LedgerError(f"{term!r} matches no live node")
        chosen.update(matched)
    if not chosen and sample is not None:
        chosen = {n.pid for n in live}
    ordered = [n.pid for n in live if n.pid in chosen]
    if sample is not None:
        if sample > len(ordered):
            raise LedgerError(f"sample:{sample} of {len(ordered)} selected nodes")
        keep = set(random.Random(seed).sample(ordered, sample))
        ordered = [pid for pid in ordered if pid in keep]
    return tuple(ordered)


def _match(live: Sequence[NodeRecord], kind: str, value: str, term: str) -> list[str]:
    if kind == "all":
        return [n.pid for n in live]
    if kind == "pid":
        prefix = value.lower()
        if not prefix or len(prefix) > 32 or any(c not in "0123456789abcdef" for c in prefix):
            raise LedgerError(f"{term!r} is not a PID prefix or a selector term")
        return [n.pid for n in live if n.pid.startswith(prefix)]
    if kind == "label":
        if "=" not in value:
            raise LedgerError(f"{term!r}: label takes K=V")
        return [n.pid for n in live if value in n.labels.split(",")]
    if kind == "role":
        return [n.pid for n in live if n.role == value]
    if kind in ("task", "rank", "level"):
        if not value.isdigit():
            raise LedgerError(f"{term!r}: {kind} takes a number")
        return [n.pid for n in live if getattr(n, kind) == int(value)]
    raise LedgerError(
        f"unknown selector term {term!r} (all, PID prefix, label:K=V, task:N, rank:N, "
        "level:N, role:R, sample:N)"
    )
