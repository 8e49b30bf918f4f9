"""``grad_generator``: the gradients of roots with respect to tensors, one at a time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias

import torch
from torch.autograd.graph import GradientEdge

__all__ = ["grad_generator"]

TensorOrEdge: TypeAlias = torch.Tensor | GradientEdge


def grad_generator(
    roots: torch.Tensor | Sequence[TensorOrEdge] = (),
    with_respect_to: Sequence[TensorOrEdge] = (),
    grad_roots: Sequence[torch.Tensor | None] = (),
) -> Iterator[torch.Tensor | None]:
    """The gradient of ``roots`` (seeded with ``grad_roots``, default ones) with respect to each
    of ``with_respect_to``, in that order (``None`` for one the roots do not depend on).

    The backward operations are issued when this is called, on the active mesh and stream (the
    client never waits for them), and the iterator hands the gradients out in order; a
    program can start reducing the first one while it takes the next. Unlike the reference,
    which runs the autograd graph step by step, all the backward work is issued at once."""
    root_list: list[TensorOrEdge] = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    wrt = list(with_respect_to)
    if not root_list:
        raise ValueError("grad_generator needs at least one root")
    if grad_roots and len(grad_roots) != len(root_list):
        raise ValueError(f"grad_generator: {len(grad_roots)} grad_roots for {len(root_list)} roots")
    if not wrt:
        return iter(())
    grads = torch.autograd.grad(
        root_list,
        wrt,
        grad_outputs=list(grad_roots) if grad_roots else None,
        allow_unused=True,
    )
    return iter(list(grads))
