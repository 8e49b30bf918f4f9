"""``monarch._src.actor.endpoint`` as Monarch's documentation and examples import it: the
public names the reference's module has, re-exported from ``monarch.actor`` (``Selection`` and
``Propagator`` are the types of ``send``'s selection and ``@endpoint(propagate=...)``)."""

from __future__ import annotations

from typing import Literal

from monarch.actor import Endpoint, Extent, Future, endpoint
from monarch.actor._base.endpoint import EndpointProperty, Propagator
from monarch.actor._mesh.adverbs import NotAnEndpoint

__all__ = [
    "Endpoint",
    "EndpointProperty",
    "Extent",
    "Future",
    "NotAnEndpoint",
    "Propagator",
    "Selection",
    "endpoint",
]

Selection = Literal["all", "choose"]
