"""Issue 15, item 6: an entry that cannot be encoded cannot be built, and the namespace is
bounded by accounted bytes as well as by entries."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr, Pid
from chrysalis.nameserver import (
    MAX_LABELS,
    MAX_LOCATORS_PER_ENTRY,
    MAX_SERVER_NAME_LEN,
    FieldTooLarge,
    InvalidUtf8,
    LabelError,
    LabelErrorKind,
    Labels,
    Locator,
    NsCodec,
    ProcEntry,
    SnapshotChunk,
    TooManyItems,
)

A = Pid(b"\x0a" * 16)


def test_more_than_256_labels_are_refused_where_they_are_given() -> None:
    Labels({f"k{i}": "v" for i in range(MAX_LABELS)})
    with pytest.raises(LabelError, match="too many labels") as info:
        Labels({f"k{i}": "v" for i in range(MAX_LABELS + 1)})
    assert info.value.kind is LabelErrorKind.TOO_MANY_LABELS
    assert "256" in str(info.value)
    with pytest.raises(LabelError):
        Labels((f"k{i}", "") for i in range(10_000))  # an iterable is not read to its end


def test_entry_fields_that_cannot_be_encoded_are_refused_at_construction() -> None:
    ProcEntry(A, "n" * MAX_SERVER_NAME_LEN)
    with pytest.raises(FieldTooLarge, match="tls server name"):
        ProcEntry(A, "n" * (MAX_SERVER_NAME_LEN + 1))
    with pytest.raises(FieldTooLarge):
        ProcEntry(A, "é" * 128)  # 256 UTF-8 bytes
    locators = tuple(Locator(DatagramAddr.inproc(1, i)) for i in range(MAX_LOCATORS_PER_ENTRY + 1))
    ProcEntry(A, "", Labels(), locators[:MAX_LOCATORS_PER_ENTRY])
    with pytest.raises(TooManyItems, match="locators"):
        ProcEntry(A, "", Labels(), locators)
    entry = ProcEntry(A, "x")
    with pytest.raises(TooManyItems):
        entry.with_locators(locators)


label_sets = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True),
    st.from_regex(r"([a-z0-9]{1,8})?", fullmatch=True),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    label_sets,
    st.text(max_size=300),
    st.integers(0, MAX_LOCATORS_PER_ENTRY + 2),
)
def test_every_entry_that_can_be_built_can_be_encoded(
    labels: dict[str, str], name: str, locators: int
) -> None:
    try:
        entry = ProcEntry(
            A,
            name,
            Labels(labels),
            tuple(Locator(DatagramAddr.inproc(1, i)) for i in range(locators)),
        )
    except (FieldTooLarge, TooManyItems):
        assert len(name.encode("utf-8", "surrogatepass")) > MAX_SERVER_NAME_LEN or (
            locators > MAX_LOCATORS_PER_ENTRY
        )
        return
    with contextlib.suppress(InvalidUtf8):  # lone surrogates are not text
        NsCodec.encode(SnapshotChunk(1, 0, (entry,)))
