"""``Uid``: Monarch's actor-system identifier (``monarch.actor.Uid``).

Why: Monarch programs name procs and actors with ``Uid`` values (``Uid.instance("worker")``,
``Uid.from_string("service")``) and print or parse their canonical text, so the class follows the
reference's value semantics exactly. Pure: no I/O; fresh values come from ``secrets``.

- A *singleton* is a label alone (``"service"``); two singletons are equal when their labels are.
- An *instance* is a 64-bit value with an optional display label (``"worker<J>"``, ``"<J>"``;
  the value in Flickr base58). Equality and hash use the value only: the label is a hint.
- Labels are 1 to 63 characters of ``[a-z0-9_-]``, starting with a lowercase letter and ending
  with a lowercase letter or digit; anything else is ``ValueError``.
"""

from __future__ import annotations

import secrets
from typing import Final

__all__ = ["Uid"]

_ALPHABET: Final = "123456789abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
_INDEX: Final = {c: i for i, c in enumerate(_ALPHABET)}
_U64: Final = 2**64 - 1
_MAX_LABEL: Final = 63
_LABEL_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


def _label_problem(label: str) -> str | None:
    if not label:
        return "label must not be empty"
    if not ("a" <= label[0] <= "z"):
        return "label must start with a lowercase letter"
    if len(label) > _MAX_LABEL:
        return f"label exceeds {_MAX_LABEL} characters"
    if not ("a" <= label[-1] <= "z" or "0" <= label[-1] <= "9"):
        return "label must end with a lowercase letter or digit"
    for char in label:
        if char not in _LABEL_CHARS:
            return f"label contains invalid character {char!r}"
    return None


def _encode(value: int) -> str:
    if value == 0:
        return _ALPHABET[0]
    out = []
    while value:
        value, digit = divmod(value, 58)
        out.append(_ALPHABET[digit])
    return "".join(reversed(out))


def _decode(text: str) -> int:
    value = 0
    for char in text:
        digit = _INDEX.get(char)
        if digit is None:
            raise ValueError(f"invalid uid: invalid uid syntax: invalid base58 uid: {text}")
        value = value * 58 + digit
        if value > _U64:
            raise ValueError(f"invalid uid: invalid uid syntax: invalid base58 uid: {text}")
    return value


def _check_value(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"a Uid value is an int, got {type(value).__name__}")
    if value < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if value > _U64:
        raise OverflowError("int too big to convert")
    return value


class Uid:
    """A unique actor-system identifier: a singleton label, or an instance value (64 bits)
    with an optional label. Immutable, hashable, picklable; ``str`` is the canonical text that
    ``from_string`` parses back."""

    __slots__ = ("_label", "_value")

    _label: str | None
    _value: int | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            "cannot create 'monarch.actor.Uid' instances directly: use Uid.instance(), "
            "Uid.anonymous(), Uid.instance_from_value() or Uid.from_string()"
        )

    @classmethod
    def _make(cls, label: str | None, value: int | None) -> Uid:
        self = object.__new__(cls)
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_value", value)
        return self

    @staticmethod
    def anonymous() -> Uid:
        """A fresh unlabeled instance."""
        return Uid._make(None, secrets.randbits(64))

    @staticmethod
    def instance(label: str | None = None) -> Uid:
        """A fresh instance with an optional display label (``ValueError`` for a bad label)."""
        if label is not None:
            problem = _label_problem(label)
            if problem is not None:
                raise ValueError(f"invalid uid label: {problem}")
        return Uid._make(label, secrets.randbits(64))

    @staticmethod
    def instance_from_value(value: int, label: str | None = None) -> Uid:
        """The instance with this 64-bit ``value`` (``OverflowError`` outside 0..2**64-1)."""
        checked = _check_value(value)
        if label is not None:
            problem = _label_problem(label)
            if problem is not None:
                raise ValueError(f"invalid uid label: {problem}")
        return Uid._make(label, checked)

    @staticmethod
    def from_string(uid: str) -> Uid:
        """Parse the canonical text: ``"label"``, ``"label<base58>"`` or ``"<base58>"``."""
        if not isinstance(uid, str):
            raise TypeError(f"Uid.from_string takes a str, got {type(uid).__name__}")
        syntax = "invalid uid: invalid uid syntax"
        if not uid:
            raise ValueError(f'{syntax}: expected "label" or "<", found end of input')
        label_end = uid.find("<")
        label_text = uid if label_end < 0 else uid[:label_end]
        label: str | None = None
        if label_end < 0 and "." in label_text:  # a label ends where a path would begin
            label_text = label_text.split(".", 1)[0]
            if _label_problem(label_text) is None:
                raise ValueError(f'{syntax}: expected end of input, found "."')
            if not label_text:
                raise ValueError(f'{syntax}: expected "label" or "<", found "."')
        if label_text:
            problem = _label_problem(label_text)
            if problem is not None:
                raise ValueError(f"{syntax}: invalid label: {problem}")
            label = label_text
        if label_end < 0:
            return Uid._make(label, None)
        close = uid.find(">", label_end)
        if close < 0:
            raise ValueError(f'{syntax}: expected ">", found end of input')
        body = uid[label_end + 1 : close]
        if not body:
            raise ValueError(f'{syntax}: expected uid text, found ">"')
        if close != len(uid) - 1:
            raise ValueError(f'{syntax}: expected end of input, found "{uid[close + 1]}"')
        return Uid._make(label, _decode(body))

    @property
    def label(self) -> str | None:
        """The label (of a singleton: its name; of an instance: its display hint), or None."""
        return self._label

    @property
    def is_instance(self) -> bool:
        """True for an instance (a value), False for a singleton."""
        return self._value is not None

    @property
    def is_singleton(self) -> bool:
        """True for a singleton (a label alone)."""
        return self._value is None

    @property
    def instance_value(self) -> int | None:
        """The 64-bit value of an instance; None for a singleton."""
        return self._value

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Uid is immutable")

    def __str__(self) -> str:
        if self._value is None:
            return self._label or ""
        return f"{self._label or ''}<{_encode(self._value)}>"

    def __repr__(self) -> str:
        return f"Uid({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Uid):
            return NotImplemented
        if self._value is None or other._value is None:
            return self._value is None and other._value is None and self._label == other._label
        return self._value == other._value

    def __hash__(self) -> int:
        if self._value is not None:
            return hash(("instance", self._value))
        return hash(("singleton", self._label))

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Uid.from_string, (str(self),))
