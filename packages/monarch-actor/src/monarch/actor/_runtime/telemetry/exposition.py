"""Metrics in the Prometheus text exposition format (version 0.0.4), written and read.

Why: a Prometheus server scrapes ``GET /metrics`` of the client's admin endpoint
(``_mesh.admin``); this module turns a snapshot (``metrics_snapshot()`` or a mesh's summed one,
``_mesh.telemetry.mesh_metrics``) into that text, without a dependency. Sans-IO: strings in,
strings out.

Names: dots and other characters Prometheus does not allow become ``_``
(``monarch.messages.sent`` -> ``monarch_messages_sent``); counters get the ``_total`` suffix;
histograms give ``_bucket{le="..."}`` lines (cumulative, the last ``le="+Inf"``), ``_sum`` and
``_count``; up-down counters are gauges. Label values are escaped (backslash, double quote,
newline). ``parse_text`` reads the format back (samples only: ``# HELP``/``# TYPE`` lines give
each family's type), for tests and ``monarch top``; malformed lines raise ``ValueError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from monarch.actor._runtime.telemetry.metrics import MetricPoint

__all__ = ["CONTENT_TYPE", "Sample", "metric_name", "parse_text", "prometheus_text"]

#: The ``Content-Type`` of the text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")
_TYPES = {"counter": "counter", "up_down_counter": "gauge", "histogram": "histogram"}


def metric_name(name: str) -> str:
    """A Prometheus metric name for instrument ``name`` (``[a-zA-Z_:][a-zA-Z0-9_:]*``)."""
    out = _BAD.sub("_", name)
    return out if out and not out[0].isdigit() else f"_{out}"


def _label_name(name: str) -> str:
    out = _LABEL_BAD.sub("_", name)
    if not out or out[0].isdigit():
        out = f"_{out}"
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _labels(attributes: Mapping[str, str], extra: tuple[tuple[str, str], ...] = ()) -> str:
    pairs = [(_label_name(k), str(v)) for k, v in sorted(attributes.items())] + list(extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def prometheus_text(
    metrics: Mapping[str, Sequence[MetricPoint]], descriptions: Mapping[str, str] | None = None
) -> str:
    """``metrics`` (instrument name -> its series, as ``metrics_snapshot()`` returns them) in
    the text exposition format; ``descriptions`` (instrument name -> text) become ``# HELP``."""
    lines: list[str] = []
    for name in sorted(metrics):
        points = metrics[name]
        if not points:
            continue
        kind = points[0].kind
        base = metric_name(name)
        family = f"{base}_total" if kind == "counter" else base
        help_text = (descriptions or {}).get(name, "")
        if help_text:
            lines.append(f"# HELP {family} {_help_escape(help_text)}")
        lines.append(f"# TYPE {family} {_TYPES.get(kind, 'untyped')}")
        for p in sorted(points, key=lambda p: sorted(p.attributes.items())):
            if kind != "histogram":
                lines.append(f"{family}{_labels(p.attributes)} {_number(p.value)}")
                continue
            cumulative = 0
            for upper, count in p.buckets:
                cumulative += count
                le = (("le", _number(upper)),)
                lines.append(f"{base}_bucket{_labels(p.attributes, le)} {cumulative}")
            lines.append(f"{base}_sum{_labels(p.attributes)} {_number(p.sum)}")
            lines.append(f"{base}_count{_labels(p.attributes)} {p.count}")
    return "\n".join(lines) + "\n" if lines else ""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: metric name, labels, value; ``type`` from the family's ``# TYPE``."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0
    type: str = "untyped"


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_UNESCAPE = re.compile(r"\\(.)")
#: Lines ``parse_text`` accepts (a scrape is bounded).
MAX_LINES = 1_000_000


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _parse_labels(text: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"malformed labels in line {line!r}")
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels


def _parse_value(text: str, line: str) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"malformed value in line {line!r}") from None


def parse_text(text: str) -> list[Sample]:
    """The samples of a text-format scrape, in order (``ValueError`` on a malformed line)."""
    types: dict[str, str] = {}
    samples: list[Sample] = []
    lines = text.split("\n")  # the format separates lines by \n only (\r may be in a value)
    if len(lines) > MAX_LINES:
        raise ValueError(f"scrape has {len(lines)} lines (limit {MAX_LINES})")
    for line in lines:
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"malformed sample line {line!r}")
        name = m.group(1)
        labels = _parse_labels(m.group(3) or "", line)
        family = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in types:
                family = name[: -len(suffix)]
        samples.append(
            Sample(name, labels, _parse_value(m.group(4), line), types.get(family, "untyped"))
        )
    return samples
