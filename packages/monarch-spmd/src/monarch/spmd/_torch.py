"""torch, imported only where it is used, with a clear error where it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["TORCH_REQUIREMENT", "require_torch"]

#: What to install (the version this package is tested with).
TORCH_REQUIREMENT = "torch>=2.13,<2.14"


def require_torch(feature: str) -> ModuleType:
    """``torch.distributed`` (which imports ``torch``), or ``ImportError`` saying that ``feature``
    needs torch and how to get it."""
    try:
        return importlib.import_module("torch.distributed")
    except ImportError as error:
        raise ImportError(
            f"{feature} needs torch, which cannot be imported here ({error});"
            f" install it with: pip install '{TORCH_REQUIREMENT}'"
        ) from error
