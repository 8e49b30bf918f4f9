"""Kubernetes-style labels on nameserver entries (spec 1.8).

Why a grammar at all: labels travel in every published entry and are shown by tools, so they
are held to the same rules as Kubernetes labels: small, ASCII, unambiguous. A key is an
optional DNS-subdomain prefix and a ``/`` followed by a name; values are empty or follow the
name grammar. Labels never affect identity or routing.

``Labels`` is an immutable mapping sorted by key, so equal label sets have one canonical wire
encoding. Validation is exact and bounded: every check first measures length, so hostile input
costs at most a regular-expression match over a few hundred bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import ClassVar, Final, NoReturn, final

from chrysalis.nameserver._errors import LabelError, LabelErrorKind

__all__ = [
    "MAX_LABELS",
    "MAX_LABEL_KEY_LEN",
    "MAX_LABEL_NAME_LEN",
    "MAX_LABEL_PREFIX_LEN",
    "MAX_LABEL_VALUE_LEN",
    "Labels",
    "validate_label_key",
    "validate_label_value",
]

MAX_LABEL_NAME_LEN: Final = 63
"""Longest label name (the part after ``/``), in bytes."""
MAX_LABEL_PREFIX_LEN: Final = 253
"""Longest label key prefix (a DNS subdomain), in bytes."""
MAX_LABEL_KEY_LEN: Final = MAX_LABEL_PREFIX_LEN + 1 + MAX_LABEL_NAME_LEN
"""Longest label key, in bytes (317)."""
MAX_LABEL_VALUE_LEN: Final = 63
"""Longest label value, in bytes."""
MAX_LABELS: Final = 256
"""Most labels in one set: the wire carries at most 256 labels per entry, so a larger set
could never be published (``LabelError`` kind ``TOO_MANY_LABELS``)."""

_NAME_RE: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?")
_DNS_LABEL_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?")
_DNS_LABEL_MAX: Final = 63


def _byte_len(text: str) -> int:
    # Every valid character is ASCII, so len(text) equals the UTF-8 length of valid input; for
    # non-ASCII input the UTF-8 length is at least len(text), and the grammar rejects it anyway.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def validate_label_key(key: str) -> None:
    """Check ``key`` against the label-key grammar; raise ``LabelError`` if it breaks it.

    A key is ``[prefix "/"] name``, split at the first ``/``. The prefix is 1..253 bytes of
    dot-separated DNS labels (each 1..63 of ``a-z``, ``0-9``, ``-``, starting and ending
    alphanumeric); the name is 1..63 bytes of ``A-Za-z0-9``, ``-``, ``_``, ``.``, starting and
    ending alphanumeric. The prefix is checked before the name.
    """
    if not isinstance(key, str):
        raise TypeError(f"label key must be a str, not {type(key).__name__}")
    prefix, slash, name = key.partition("/")
    if not slash:
        name = prefix
    else:
        if not prefix:
            raise LabelError(LabelErrorKind.EMPTY_PREFIX, key)
        if _byte_len(prefix) > MAX_LABEL_PREFIX_LEN:
            raise LabelError(LabelErrorKind.PREFIX_TOO_LONG, key)
        for part in prefix.split("."):
            if len(part) > _DNS_LABEL_MAX or _DNS_LABEL_RE.fullmatch(part) is None:
                raise LabelError(LabelErrorKind.INVALID_PREFIX, key)
    _check_name(name, key, None)


def validate_label_value(key: str, value: str) -> None:
    """Check a label value (for ``key``, named in the error); raise ``LabelError`` if invalid.

    The empty value is valid; otherwise at most 63 bytes following the name grammar.
    """
    if not isinstance(value, str):
        raise TypeError(f"label value must be a str, not {type(value).__name__}")
    if not value:
        return
    if _byte_len(value) > MAX_LABEL_VALUE_LEN:
        raise LabelError(LabelErrorKind.VALUE_TOO_LONG, key, value)
    if _NAME_RE.fullmatch(value) is None:
        raise LabelError(LabelErrorKind.INVALID_VALUE, key, value)


def _check_name(name: str, key: str, value: str | None) -> None:
    if not name:
        raise LabelError(LabelErrorKind.EMPTY_NAME, key, value)
    if _byte_len(name) > MAX_LABEL_NAME_LEN:
        raise LabelError(LabelErrorKind.NAME_TOO_LONG, key, value)
    if _NAME_RE.fullmatch(name) is None:
        raise LabelError(LabelErrorKind.INVALID_NAME, key, value)


@final
class Labels(Mapping[str, str]):
    """An immutable, validated label set sorted by key.

    ``Labels(source)`` takes a mapping or an iterable of ``(key, value)`` pairs; every key and
    value is validated (``LabelError``), a key given twice in an iterable raises
    ``LabelError`` with kind ``DUPLICATE_KEY`` and more than ``MAX_LABELS`` (256) labels raise
    kind ``TOO_MANY_LABELS``, so every label set can be encoded. Iteration is in key order
    (code-point order, which equals the byte order of the ASCII keys). Hashable; equal to
    another ``Labels`` or any mapping with the same items. ``Labels.EMPTY`` is the empty set.
    """

    __slots__ = ("_hash", "_items", "_map")
    _items: tuple[tuple[str, str], ...]
    _map: dict[str, str]
    _hash: int | None

    EMPTY: ClassVar[Labels]

    def __init__(self, source: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        pairs: Iterable[tuple[str, str]]
        pairs = source.items() if isinstance(source, Mapping) else source
        built: dict[str, str] = {}
        for pair in pairs:
            key, value = pair
            if len(built) >= MAX_LABELS:
                raise LabelError(
                    LabelErrorKind.TOO_MANY_LABELS,
                    f"more than {MAX_LABELS} labels (the wire carries at most {MAX_LABELS})",
                )
            validate_label_key(key)
            validate_label_value(key, value)
            if key in built:
                raise LabelError(LabelErrorKind.DUPLICATE_KEY, key)
            built[key] = value
        items = tuple(sorted(built.items()))
        object.__setattr__(self, "_items", items)
        object.__setattr__(self, "_map", dict(items))
        object.__setattr__(self, "_hash", None)

    @classmethod
    def _from_sorted(cls, items: tuple[tuple[str, str], ...]) -> Labels:
        """Wrap already validated, key-sorted, duplicate-free items (codec fast path)."""
        self = object.__new__(cls)
        object.__setattr__(self, "_items", items)
        object.__setattr__(self, "_map", dict(items))
        object.__setattr__(self, "_hash", None)
        return self

    def __getitem__(self, key: str) -> str:
        return self._map[key]

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def sorted_items(self) -> tuple[tuple[str, str], ...]:
        """The ``(key, value)`` pairs in key order, as a tuple."""
        return self._items

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Labels):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._map == dict(other.items())
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        cached = self._hash
        if cached is None:
            cached = hash(self._items)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __repr__(self) -> str:
        return f"Labels({dict(self._items)!r})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Labels is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Labels is immutable")

    def __reduce__(self) -> tuple[object, ...]:
        return (Labels, (self._items,))

    def __copy__(self) -> Labels:
        return self

    def __deepcopy__(self, memo: object) -> Labels:
        return self


Labels.EMPTY = Labels()
