"""Test helpers: an in-memory network of replicas driven by a seeded scheduler.

Why: convergence is a property of *all* interleavings, so tests need a transport whose
interleavings are random but reproducible. ``ReplicaNetwork`` joins ``ReplicaSession`` objects
of several replicas with in-memory byte pipes (one reliable, ordered stream per link, exactly
what a Chrysalis link-local stream gives) and a scheduler seeded by the test:

- **random delivery order**: each step picks a random pending direction of a random link and
  delivers a random-length prefix of its bytes (so frames arrive fragmented), or services a
  replica that reported a commit (the local-change notification that makes sessions relay);
- **partitions**: a link can be cut (both sessions end, bytes in transit are lost) and healed
  (new sessions start from the durable frontiers), explicitly or at random (``partition_rate``,
  ``heal_rate``);
- **duplication**: a *lost acknowledgement* delivers one direction fully, drops the other, and
  reconnects, so the sender resends batches the receiver already applied (explicitly with
  ``lose_acks`` or at random with ``duplicate_rate``). On an ordered stream this is how
  duplicates really happen.

Links are tree links by default: the parent side advertises the complement scope, the child
side the subtree scope built by the child's ``SubtreeScopeAggregator`` (what the Node topology
adapter does). ``connect(..., topology=False)`` makes a mesh link where both sides advertise
only their own site. ``crash`` / ``restart`` simulate a process dying and coming back with a
replica reopened from its database file. Every loop is bounded; ``settle`` raises
``NotSettledError`` rather than spinning forever.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from chrysalis.core import Pid
from chrysalis.sqlite._replica import Replica
from chrysalis.sqlite._scope import SitePublisher, SubtreeScopeAggregator
from chrysalis.sqlite._session import CHUNK_TARGET_BYTES, ReplicaSession

__all__ = ["NetworkLink", "NotSettledError", "ReplicaNetwork"]


class NotSettledError(AssertionError):
    """``ReplicaNetwork.settle`` ran out of steps before the network went quiet."""


@dataclass(eq=False)
class _Node:
    name: str
    pid: Pid
    replica: Replica | None
    scopes: SubtreeScopeAggregator | None = None
    remove_listener: Callable[[], None] | None = None
    woken: bool = False
    links: list[NetworkLink] = field(default_factory=list)


@dataclass(eq=False)
class NetworkLink:
    """One link of a ``ReplicaNetwork`` between ``parent`` and ``child`` (node names).

    ``up`` says whether sessions run on it; ``at_parent`` / ``at_child`` are the sessions at
    each end while it is up. ``sessions_started`` counts session pairs (reconnects included).
    """

    parent: str
    child: str
    topology: bool
    up: bool = False
    at_parent: ReplicaSession | None = None
    at_child: ReplicaSession | None = None
    to_parent: bytearray = field(default_factory=bytearray)
    to_child: bytearray = field(default_factory=bytearray)
    sessions_started: int = 0

    @property
    def pending(self) -> int:
        """Bytes in transit in both directions."""
        return len(self.to_parent) + len(self.to_child)


class ReplicaNetwork:
    """Replicas joined by in-memory links and a seeded scheduler (see the module docstring).

    ``seed`` fixes every random choice. ``max_fragment`` bounds how many bytes one delivery
    step moves; ``max_link_bytes`` bounds the bytes in transit per direction (exceeding it is
    a bug in a session: ``AssertionError``). ``partition_rate``, ``heal_rate`` and
    ``duplicate_rate`` are per-step probabilities of the random faults of ``step()``.
    ``chunk_target_bytes`` is passed to every session (small values force multi-chunk batches).
    Session errors propagate out of ``step``/``settle``.
    """

    def __init__(
        self,
        seed: int,
        *,
        max_fragment: int = 65_536,
        max_link_bytes: int = 64 * 1024 * 1024,
        partition_rate: float = 0.0,
        heal_rate: float = 0.0,
        duplicate_rate: float = 0.0,
        chunk_target_bytes: int = CHUNK_TARGET_BYTES,
    ) -> None:
        if max_fragment < 1:
            raise ValueError("max_fragment must be positive")
        self._rng = random.Random(seed)
        self._max_fragment = max_fragment
        self._max_link_bytes = max_link_bytes
        self.partition_rate = partition_rate
        self.heal_rate = heal_rate
        self.duplicate_rate = duplicate_rate
        self._chunk_target = chunk_target_bytes
        self._nodes: dict[str, _Node] = {}
        self._links: list[NetworkLink] = []
        self.steps = 0

    # ----------------------------------------------------------------------------------------
    # Building the network

    def add(self, name: str, replica: Replica) -> Pid:
        """Add a node running ``replica``; returns its (deterministic) PID."""
        if name in self._nodes:
            raise ValueError(f"node {name!r} already exists")
        pid = Pid(hashlib.sha256(name.encode()).digest()[:16])
        node = _Node(name, pid, None)
        self._nodes[name] = node
        self._install(node, replica)
        return pid

    def replica(self, name: str) -> Replica:
        """The replica of node ``name`` (``KeyError`` if unknown, ``RuntimeError`` if crashed)."""
        replica = self._nodes[name].replica
        if replica is None:
            raise RuntimeError(f"node {name!r} is crashed")
        return replica

    def pid(self, name: str) -> Pid:
        """The PID of node ``name``."""
        return self._nodes[name].pid

    @property
    def links(self) -> tuple[NetworkLink, ...]:
        """Every link, in creation order."""
        return tuple(self._links)

    def link(self, a: str, b: str) -> NetworkLink:
        """The link between nodes ``a`` and ``b`` (either order)."""
        for link in self._links:
            if {link.parent, link.child} == {a, b}:
                return link
        raise KeyError(f"no link between {a!r} and {b!r}")

    def connect(self, parent: str, child: str, *, topology: bool = True) -> NetworkLink:
        """Link ``parent`` and ``child`` and start a session pair on it.

        With ``topology`` (the default) the child advertises its subtree upward and the parent
        the complement downward; a node may then have at most one parent. Without it both
        sides advertise only their own site (a mesh link).
        """
        if parent == child or parent not in self._nodes or child not in self._nodes:
            raise ValueError(f"cannot link {parent!r} and {child!r}")
        if any({link.parent, link.child} == {parent, child} for link in self._links):
            raise ValueError(f"{parent!r} and {child!r} are already linked")
        if topology and any(link.topology and link.child == child for link in self._links):
            raise ValueError(f"{child!r} already has a parent")
        link = NetworkLink(parent, child, topology)
        self._links.append(link)
        self._nodes[parent].links.append(link)
        self._nodes[child].links.append(link)
        self._start(link)
        return link

    # ----------------------------------------------------------------------------------------
    # Faults

    def cut(self, a: str, b: str) -> None:
        """Partition the link between ``a`` and ``b``: sessions end, bytes in transit are lost."""
        self._stop(self.link(a, b))

    def heal(self, a: str, b: str) -> None:
        """Reconnect a cut link (a no-op if it is up or an end is crashed)."""
        link = self.link(a, b)
        if not link.up:
            self._start(link)

    def heal_all(self) -> None:
        """Reconnect every cut link whose ends are both running."""
        for link in self._links:
            if not link.up:
                self._start(link)

    def lose_acks(self, a: str, b: str) -> None:
        """Deliver everything in transit from ``a`` to ``b``, lose what travels from ``b`` to
        ``a`` (acknowledgements among it), then reconnect: ``a`` resends what ``b`` already
        applied, so ``b`` receives duplicates."""
        link = self.link(a, b)
        if not link.up:
            return
        toward_b = link.to_child if link.child == b else link.to_parent
        if toward_b:
            data = bytes(toward_b)
            toward_b.clear()
            self._deliver(link, to_child=link.child == b, data=data)
        if link.up:
            self._stop(link)
            self._start(link)

    def crash(self, name: str) -> Replica:
        """Crash node ``name``: its sessions end and bytes in transit on its links are lost.

        Returns its replica, which the test then closes (and, for a file, reopens and passes to
        ``restart``). An open replica transaction is the test's to abandon.
        """
        node = self._nodes[name]
        replica = node.replica
        if replica is None:
            raise RuntimeError(f"node {name!r} is already crashed")
        for link in node.links:
            self._stop(link)
        if node.remove_listener is not None:
            node.remove_listener()
        node.replica = None
        node.scopes = None
        node.woken = False
        return replica

    def restart(self, name: str, replica: Replica) -> None:
        """Bring a crashed node back with ``replica`` and reconnect its links."""
        node = self._nodes[name]
        if node.replica is not None:
            raise RuntimeError(f"node {name!r} is running")
        self._install(node, replica)
        for link in node.links:
            self._start(link)

    # ----------------------------------------------------------------------------------------
    # Scheduling

    def step(self) -> bool:
        """Take one scheduling decision (a fault, a delivery, or a wake-up); returns whether
        anything happened."""
        self.steps += 1
        rng = self._rng
        up = [link for link in self._links if link.up]
        down = [link for link in self._links if not link.up and self._can_start(link)]
        if up and self.partition_rate and rng.random() < self.partition_rate:
            self._stop(rng.choice(up))
            return True
        if down and self.heal_rate and rng.random() < self.heal_rate:
            self._start(rng.choice(down))
            return True
        if up and self.duplicate_rate and rng.random() < self.duplicate_rate:
            link = rng.choice(up)
            first, second = (
                (link.parent, link.child) if rng.random() < 0.5 else (link.child, link.parent)
            )
            self.lose_acks(first, second)
            return True
        return self._step_quietly()

    def run(self, steps: int) -> int:
        """Take up to ``steps`` steps (stopping early when nothing is left to do); returns how
        many did something."""
        done = 0
        for _ in range(steps):
            if not self.step():
                break
            done += 1
        return done

    def settle(self, max_steps: int = 100_000) -> int:
        """Without faults, deliver everything and service every wake-up until the network is
        quiet: nothing in transit, nothing woken, and a poll of every session sends nothing.
        Returns the steps taken; raises ``NotSettledError`` after ``max_steps``."""
        for taken in range(max_steps):
            if self._step_quietly():
                continue
            produced = False
            for link in self._links:
                for session in (link.at_parent, link.at_child):
                    if session is not None and session.is_live:
                        session.poll()
                if link.up:
                    self._collect(link)
                    produced = produced or bool(link.pending)
            if not produced and not any(n.woken for n in self._nodes.values()):
                return taken
        raise NotSettledError(f"the network did not settle within {max_steps} steps")

    def _step_quietly(self) -> bool:
        rng = self._rng
        choices: list[tuple[NetworkLink, bool] | _Node] = []
        for link in self._links:
            if link.to_child:
                choices.append((link, True))
            if link.to_parent:
                choices.append((link, False))
        choices.extend(node for node in self._nodes.values() if node.woken)
        if not choices:
            return False
        choice = rng.choice(choices)
        if isinstance(choice, _Node):
            self._wake(choice)
            return True
        link, to_child = choice
        buffer = link.to_child if to_child else link.to_parent
        count = rng.randint(1, min(len(buffer), self._max_fragment))
        data = bytes(buffer[:count])
        del buffer[:count]
        self._deliver(link, to_child=to_child, data=data)
        return True

    # ----------------------------------------------------------------------------------------
    # Internals

    def _install(self, node: _Node, replica: Replica) -> None:
        node.replica = replica
        node.scopes = SubtreeScopeAggregator(replica.site_id)

        def woken() -> None:
            node.woken = True

        node.remove_listener = replica.add_change_listener(woken)

    def _can_start(self, link: NetworkLink) -> bool:
        return (
            self._nodes[link.parent].replica is not None
            and self._nodes[link.child].replica is not None
        )

    def _start(self, link: NetworkLink) -> None:
        if link.up or not self._can_start(link):
            return
        parent, child = self._nodes[link.parent], self._nodes[link.child]
        assert parent.replica is not None
        assert child.replica is not None
        assert child.scopes is not None
        if link.topology:
            down = SitePublisher.complement(parent.replica.site_id)
            upward = child.scopes.upstream
        else:
            down = SitePublisher.local(parent.replica.site_id)
            upward = SitePublisher.local(child.replica.site_id)
        link.to_child.clear()
        link.to_parent.clear()
        link.at_parent = ReplicaSession(
            parent.replica, child.pid, down, chunk_target_bytes=self._chunk_target
        )
        try:
            link.at_child = ReplicaSession(
                child.replica, parent.pid, upward, chunk_target_bytes=self._chunk_target
            )
        except BaseException:
            link.at_parent.close()
            link.at_parent = None
            raise
        link.up = True
        link.sessions_started += 1
        self._collect(link)

    def _stop(self, link: NetworkLink) -> None:
        for session in (link.at_parent, link.at_child):
            if session is not None:
                session.close()
        link.at_parent = link.at_child = None
        link.to_child.clear()
        link.to_parent.clear()
        if link.up:
            link.up = False
            parent = self._nodes[link.parent]
            scopes = parent.scopes
            if link.topology and scopes is not None and scopes.remove_child(id(link)):
                parent.woken = True

    def _deliver(self, link: NetworkLink, *, to_child: bool, data: bytes) -> None:
        session = link.at_child if to_child else link.at_parent
        if session is None or not session.is_live:
            return
        try:
            session.receive_data(data)
        finally:
            self._collect(link)
        if not to_child and link.topology:
            self._child_scope_changed(link)

    def _child_scope_changed(self, link: NetworkLink) -> None:
        parent = self._nodes[link.parent]
        if parent.scopes is None or link.at_parent is None:
            return
        if parent.scopes.update_child(id(link), link.at_parent.peer_scope):
            parent.woken = True

    def _wake(self, node: _Node) -> None:
        node.woken = False
        for link in node.links:
            session = link.at_parent if link.parent == node.name else link.at_child
            if session is not None and session.is_live:
                session.poll()
                self._collect(link)

    def _collect(self, link: NetworkLink) -> None:
        if link.at_parent is not None:
            link.to_child += link.at_parent.data_to_send()
        if link.at_child is not None:
            link.to_parent += link.at_child.data_to_send()
        if max(len(link.to_child), len(link.to_parent)) > self._max_link_bytes:
            raise AssertionError(f"more than {self._max_link_bytes} bytes in transit on {link}")
