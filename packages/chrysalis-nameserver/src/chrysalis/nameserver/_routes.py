"""Route projection with gates: directory changes become PID routes (spec 3.4).

Why: a node forwards datagrams for its subtree by PID, so every entry a child link publishes
must become a route toward that child, and every revoked entry must stop being routed. Two
layers:

* ``LinkRoutePlan`` is pure: per link it remembers the PIDs it installed and turns each
  ``DirectoryChange`` of that link into ``InstallRoute`` / ``WithdrawRoute`` actions. A
  removal withdraws a route this link installed; an upsert installs the entry's *preferred*
  locator (lowest priority, first on ties); an upsert without locators withdraws an existing
  route.
* ``RouteProjector`` applies plans to a ``chrysalis.datagram.Router``. Each link gets a
  ``RouteSession`` with its own ``RouteGate``: every route of the link is
  ``Route.gated(address, gate)``, so the whole subtree is fenced in O(1).

Teardown order, which keeps the invariant "once a link is reported inactive, no packet is
forwarded into that subtree": ``fence()`` closes the gate (waiting for admitted sends), the
driver commits ``RemoveLink``, then ``finish()`` deletes the link's routes (only routes that
still carry this link's gate: a PID re-published by another link in the meantime keeps its new
route). ``finish()`` fences first if needed, and leaving a ``with`` block does both.
Nothing here performs I/O; ``RouteGate.close`` may wait for in-flight sends of other threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Final, final

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.datagram import Route, RouteGate, Router
from chrysalis.nameserver._errors import RouteProjectionError
from chrysalis.nameserver._state import DEFAULT_MAX_ENTRIES, DirectoryChange

__all__ = [
    "InstallRoute",
    "LinkRoutePlan",
    "RouteAction",
    "RouteProjector",
    "RouteSession",
    "WithdrawRoute",
]

_DEFAULT_MAX_ROUTES: Final = DEFAULT_MAX_ENTRIES


@final
@dataclass(frozen=True, slots=True)
class InstallRoute:
    """Route ``pid`` toward ``address`` (replacing any route of the same link)."""

    pid: Pid
    address: DatagramAddr


@final
@dataclass(frozen=True, slots=True)
class WithdrawRoute:
    """Stop routing ``pid`` through this link."""

    pid: Pid


RouteAction = InstallRoute | WithdrawRoute
"""One step of a route projection."""


@final
class LinkRoutePlan:
    """The pure route projection of one link (see the module docstring).

    ``project(change)`` raises ``RouteProjectionError`` for a change of another link, or when
    more than ``max_routes`` routes would be installed (nothing is then recorded).
    """

    __slots__ = ("_installed", "_link", "_max_routes")

    def __init__(self, link: LinkId, *, max_routes: int = _DEFAULT_MAX_ROUTES) -> None:
        if not isinstance(link, LinkId):
            raise TypeError(f"link must be a LinkId, not {type(link).__name__}")
        if not isinstance(max_routes, int) or max_routes < 1:
            raise ValueError(f"max_routes must be a positive int, got {max_routes!r}")
        self._link = link
        self._max_routes = max_routes
        self._installed: set[Pid] = set()

    @property
    def link(self) -> LinkId:
        """The link this plan projects."""
        return self._link

    @property
    def installed(self) -> frozenset[Pid]:
        """The PIDs currently routed through this link."""
        return frozenset(self._installed)

    def __len__(self) -> int:
        return len(self._installed)

    def project(self, change: DirectoryChange) -> tuple[RouteAction, ...]:
        """The route actions for ``change``, in order (removals, then upserts)."""
        if change.link != self._link:
            raise RouteProjectionError(f"change of link {change.link} for plan of {self._link}")
        installed = set(self._installed)
        actions: list[RouteAction] = []
        for pid in change.removals:
            if pid in installed:
                installed.discard(pid)
                actions.append(WithdrawRoute(pid))
        for entry in change.upserts:
            locator = entry.preferred_locator()
            if locator is None:
                if entry.pid in installed:
                    installed.discard(entry.pid)
                    actions.append(WithdrawRoute(entry.pid))
            else:
                installed.add(entry.pid)
                actions.append(InstallRoute(entry.pid, locator.address))
        if len(installed) > self._max_routes:
            raise RouteProjectionError(f"link would route more than {self._max_routes} PIDs")
        self._installed = installed
        return tuple(actions)

    def withdraw_all(self) -> tuple[WithdrawRoute, ...]:
        """Withdraw every installed route (PID order) and forget them."""
        actions = tuple(WithdrawRoute(pid) for pid in sorted(self._installed))
        self._installed.clear()
        return actions


@final
class RouteSession:
    """The routes of one link in a ``Router``, fenced by one ``RouteGate``.

    Made by ``RouteProjector.open``. ``apply(change)`` projects a directory change into the
    router; ``fence()`` closes the gate; ``finish()`` fences (if not yet) and removes every
    route the link installed. ``apply`` after ``finish`` raises ``RouteProjectionError``.
    Usable as a context manager: leaving the block finishes the session.
    """

    __slots__ = ("_finished", "_gate", "_plan", "_projector")

    def __init__(self, projector: RouteProjector, plan: LinkRoutePlan) -> None:
        self._projector = projector
        self._plan = plan
        self._gate = RouteGate()
        self._finished = False

    @property
    def link(self) -> LinkId:
        """The link whose routes this session owns."""
        return self._plan.link

    @property
    def gate(self) -> RouteGate:
        """The gate shared by every route of the link."""
        return self._gate

    @property
    def fenced(self) -> bool:
        """True once the gate is closed."""
        return not self._gate.is_active

    @property
    def finished(self) -> bool:
        """True once the link's routes were removed."""
        return self._finished

    @property
    def installed(self) -> frozenset[Pid]:
        """PIDs this link currently routes."""
        return self._plan.installed

    def apply(self, change: DirectoryChange) -> tuple[RouteAction, ...]:
        """Project ``change`` into the router; returns the actions performed."""
        if self._finished:
            raise RouteProjectionError(f"route session of link {self.link} is finished")
        actions = self._plan.project(change)
        router = self._projector.router
        for action in actions:
            if isinstance(action, InstallRoute):
                router.insert(action.pid, Route.gated(action.address, self._gate))
            else:
                self._remove_own(router, action.pid)
        return actions

    def fence(self, timeout: float | None = None) -> None:
        """Close the gate: no new send through any route of the link; waits for admitted
        sends (``TimeoutError`` after ``timeout`` seconds; the gate stays closed)."""
        self._gate.close(timeout)

    def finish(self, timeout: float | None = None) -> None:
        """Fence if needed, then remove every route the link installed (idempotent)."""
        if self._finished:
            return
        self.fence(timeout)
        router = self._projector.router
        for action in self._plan.withdraw_all():
            self._remove_own(router, action.pid)
        self._finished = True
        self._projector._closed(self)

    def _remove_own(self, router: Router, pid: Pid) -> None:
        route = router.get(pid)
        if route is not None and route.gate is self._gate:
            router.remove(pid)

    def __enter__(self) -> RouteSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish()


@final
class RouteProjector:
    """Projects the directory of one node into its ``Router``, one ``RouteSession`` per
    link. Opening a link that has an unfinished session raises ``RouteProjectionError``."""

    __slots__ = ("_max_routes", "_open", "_router")

    def __init__(self, router: Router, *, max_routes_per_link: int = _DEFAULT_MAX_ROUTES) -> None:
        if not isinstance(router, Router):
            raise TypeError(f"router must be a Router, not {type(router).__name__}")
        self._router = router
        self._max_routes = max_routes_per_link
        self._open: dict[LinkId, RouteSession] = {}

    @property
    def router(self) -> Router:
        """The routing table being maintained."""
        return self._router

    def open(self, link: LinkId) -> RouteSession:
        """Start the route session of ``link``."""
        if link in self._open:
            raise RouteProjectionError(f"link {link} already has a route session")
        session = RouteSession(self, LinkRoutePlan(link, max_routes=self._max_routes))
        self._open[link] = session
        return session

    def session(self, link: LinkId) -> RouteSession | None:
        """The unfinished session of ``link``, if any."""
        return self._open.get(link)

    def apply(self, change: DirectoryChange) -> tuple[RouteAction, ...]:
        """Project ``change`` through its link's session (``RouteProjectionError`` if the
        link has none)."""
        session = self._open.get(change.link)
        if session is None:
            raise RouteProjectionError(f"link {change.link} has no route session")
        return session.apply(change)

    def _closed(self, session: RouteSession) -> None:
        if self._open.get(session.link) is session:
            del self._open[session.link]
