"""Label grammar and the immutable ``Labels`` mapping (spec 1.8; inventory labels.rs)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.nameserver import (
    LabelError,
    LabelErrorKind,
    Labels,
    validate_label_key,
    validate_label_value,
)

SETTINGS = settings(max_examples=200, deadline=None)
_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?"
_DNS = r"[a-z0-9]([a-z0-9\-]{0,20}[a-z0-9])?"


def test_accepts_kubernetes_label_examples() -> None:
    for key in (
        "app",
        "a",
        "app.kubernetes.io/name",
        "example.com/rank",
        "my-domain/x_y.z",
        "a-b.c-d/Name",
        "1/2",
        "x" * 63,
        ".".join(["a" * 63] * 3) + "." + "b" * 61 + "/n",
    ):
        validate_label_key(key)
    for value in ("", "v", "worker", "v1.2_3-x", "A" * 63, "0"):
        validate_label_value("k", value)
    labels = Labels({"role": "worker", "example.com/rank": "7", "empty": ""})
    assert labels["empty"] == ""
    assert list(labels) == ["empty", "example.com/rank", "role"]


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("", LabelErrorKind.EMPTY_NAME),
        ("prefix/", LabelErrorKind.EMPTY_NAME),
        ("/name", LabelErrorKind.EMPTY_PREFIX),
        ("UPPER.example/name", LabelErrorKind.INVALID_PREFIX),
        ("a..b/name", LabelErrorKind.INVALID_PREFIX),
        ("-a.b/name", LabelErrorKind.INVALID_PREFIX),
        ("a_b/name", LabelErrorKind.INVALID_PREFIX),
        ("a//b", LabelErrorKind.INVALID_NAME),
        ("-leading", LabelErrorKind.INVALID_NAME),
        ("trailing_", LabelErrorKind.INVALID_NAME),
        ("white space", LabelErrorKind.INVALID_NAME),
        ("naïve", LabelErrorKind.INVALID_NAME),
        ("x" * 64, LabelErrorKind.NAME_TOO_LONG),
        ("p" * 254 + "/n", LabelErrorKind.PREFIX_TOO_LONG),
        ("a" * 64 + ".b/n", LabelErrorKind.INVALID_PREFIX),
    ],
)
def test_rejects_invalid_keys(key: str, kind: LabelErrorKind) -> None:
    with pytest.raises(LabelError) as info:
        validate_label_key(key)
    assert info.value.kind is kind
    with pytest.raises(LabelError):
        Labels({key: "v"})


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("-value", LabelErrorKind.INVALID_VALUE),
        ("value_", LabelErrorKind.INVALID_VALUE),
        ("white space", LabelErrorKind.INVALID_VALUE),
        ("a/b", LabelErrorKind.INVALID_VALUE),
        ("v" * 64, LabelErrorKind.VALUE_TOO_LONG),
    ],
)
def test_rejects_invalid_values(value: str, kind: LabelErrorKind) -> None:
    with pytest.raises(LabelError) as info:
        validate_label_value("key", value)
    assert info.value.kind is kind
    assert info.value.key == "key"


def test_rejects_limits_and_duplicate_keys() -> None:
    validate_label_key("n" * 63)
    validate_label_value("k", "v" * 63)
    with pytest.raises(LabelError) as info:
        Labels([("k", "a"), ("k", "b")])
    assert info.value.kind is LabelErrorKind.DUPLICATE_KEY


def test_label_errors_quote_bounded_input_and_pickle() -> None:
    with pytest.raises(LabelError) as info:
        validate_label_key("-" * 10_000)
    assert len(str(info.value)) < 200
    again = pickle.loads(pickle.dumps(info.value))
    assert again.kind is info.value.kind
    assert str(again) == str(info.value)


def test_labels_are_immutable_hashable_and_compare_as_mappings() -> None:
    labels = Labels([("b", "2"), ("a", "1")])
    assert labels == Labels({"a": "1", "b": "2"})
    assert labels == {"a": "1", "b": "2"}
    assert labels != Labels({"a": "1"})
    assert hash(labels) == hash(Labels({"b": "2", "a": "1"}))
    assert labels.sorted_items() == (("a", "1"), ("b", "2"))
    assert pickle.loads(pickle.dumps(labels)) == labels
    with pytest.raises(AttributeError):
        labels.x = 1
    assert Labels.EMPTY == Labels()
    assert len(Labels.EMPTY) == 0


def test_labels_reject_non_string_keys_and_values() -> None:
    with pytest.raises(TypeError):
        Labels({"k": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Labels({1: "v"})  # type: ignore[arg-type]


@SETTINGS
@given(
    st.one_of(
        st.from_regex(_NAME, fullmatch=True),
        st.tuples(
            st.lists(st.from_regex(_DNS, fullmatch=True), min_size=1, max_size=4).map(".".join),
            st.from_regex(_NAME, fullmatch=True),
        ).map("/".join),
    )
)
def test_generated_grammar_keys_are_accepted(key: str) -> None:
    if len(key.partition("/")[0]) > 253 and "/" in key:
        return
    validate_label_key(key)


@SETTINGS
@given(st.text(max_size=80))
def test_arbitrary_text_is_accepted_or_rejected_with_label_error(text: str) -> None:
    key_error: LabelError | None = None
    value_error: LabelError | None = None
    try:
        validate_label_key(text)
    except LabelError as exc:
        key_error = exc
    try:
        validate_label_value("k", text)
    except LabelError as exc:
        value_error = exc
    if key_error is None:
        assert text.isascii()
        assert 0 < len(text) <= 317
    if value_error is None:
        assert text == "" or (len(text) <= 63 and text.isascii())
    else:
        assert value_error.kind in (LabelErrorKind.VALUE_TOO_LONG, LabelErrorKind.INVALID_VALUE)
