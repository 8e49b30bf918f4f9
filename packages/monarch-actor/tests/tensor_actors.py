"""Actor classes for the tensor tests (importable by the workers by module name)."""

from __future__ import annotations

from typing import Any

from monarch.actor import Actor, endpoint


class TensorEcho(Actor):
    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def describe(self, tensor: Any) -> tuple[str, tuple[int, ...], tuple[int, ...], bool, float]:
        """What the worker received: dtype, shape, strides, requires_grad, sum as float64."""
        return (
            str(tensor.dtype),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            bool(tensor.requires_grad),
            float(tensor.detach().double().sum()) if tensor.dtype.is_complex is False else 0.0,
        )

    @endpoint
    def aliasing(self, values: list[Any]) -> tuple[bool, bool]:
        """``values`` is [t, t, a view of t]: (the first two are one object, the view shares
        the first one's storage)."""
        a, b, view = values
        return a is b, view.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
