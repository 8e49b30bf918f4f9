"""The QUIC engines behind the endpoint's engine seam (``base``): aioquic (``aioquic``, with its
fast paths in ``aioquic_fast``) and qh3 (``qh3``, with its client proof in ``client_proof``).

``DEFAULT_ENGINE`` is the engine an endpoint gets when none is given (``EndpointSettings``
names it; the sans-IO ``QuicEndpoint`` only falls back to it).
"""

from __future__ import annotations

from typing import Final

# First: ``aioquic.tls`` with its verification-only imports deferred (every engine imports it).
from chrysalis.quic._engines import _aioquic_tls  # noqa: F401
from chrysalis.quic._engines.aioquic import AioquicEngine
from chrysalis.quic._engines.base import EngineFactory

__all__ = ["DEFAULT_ENGINE"]

DEFAULT_ENGINE: Final[EngineFactory] = AioquicEngine
"""aioquic: always installed (qh3 is an optional extra)."""
