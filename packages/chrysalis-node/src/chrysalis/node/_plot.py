"""``chrysalis admin TOKEN show NAME... --plot FILE.png``: a picture of several experiments'
latency percentiles and throughput against payload size, Chrysalis beside its baselines.

``plot_series`` turns ``show``'s reports (``chrysalis.node._admin.experiment_report``) into the
series the picture draws, and needs nothing; ``write_plot`` draws them with matplotlib, the
optional extra ``chrysalis-node[plot]`` (imported only here, only when ``--plot`` is given: a
plotting library is large and most nodes never draw). Why matplotlib rather than a PNG written
by hand: a readable plot needs axes, logarithmic ticks, a legend and text, which is a plotting
library's whole job.

One point per experiment and series, at the experiment's payload size: the median over its ok
pairs of each pair's own figure (raw samples are not stored). Series (``Series.label``):
``chrysalis p50``/``chrysalis p99`` and ``<method> p50`` (echo latency, ms) in the first panel;
``chrysalis <kind>`` and ``<method> <kind>`` (MiB/s per pair) in the second.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["MAX_EXPERIMENTS", "PlotError", "Series", "plot_series", "write_plot"]

MAX_EXPERIMENTS: Final = 64
"""Most experiments one picture draws."""


class PlotError(Exception):
    """The picture cannot be drawn (no data, too many experiments, matplotlib missing)."""


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of the picture: ``panel`` ``"latency"`` (ms) or ``"throughput"`` (MiB/s),
    ``points`` as ``(payload bytes, value)`` sorted by payload."""

    panel: str
    label: str
    points: tuple[tuple[int, float], ...]


def _ok(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [r for r in report.get("results", ()) if r.get("status") == "ok" and r.get("completed")]


def plot_series(reports: Sequence[Mapping[str, Any]]) -> list[Series]:
    """The series of ``reports`` (``show``'s, one per experiment); ``PlotError`` when there are
    more than ``MAX_EXPERIMENTS`` or none has an ok pair."""
    if len(reports) > MAX_EXPERIMENTS:
        raise PlotError(f"at most {MAX_EXPERIMENTS} experiments in one plot, not {len(reports)}")
    points: dict[tuple[str, str], list[tuple[int, float]]] = {}

    def add(panel: str, label: str, payload: int, values: Sequence[float]) -> None:
        finite = [v for v in values if v is not None and v >= 0]
        if finite:
            points.setdefault((panel, label), []).append((payload, statistics.median(finite)))

    for report in reports:
        results = _ok(report)
        if not results:
            continue
        payload, kind = int(report["payload"]), str(report["kind"])
        if kind == "echo":
            add("latency", "chrysalis p50", payload, [float(r["p50_ms"]) for r in results])
            add("latency", "chrysalis p99", payload, [float(r["p99_ms"]) for r in results])
        add("throughput", f"chrysalis {kind}", payload, [r["mib_per_second"] for r in results])
        methods = sorted({m for r in results for m in r.get("baselines", {})})
        for method in methods:
            found = [
                r["baselines"][method]
                for r in results
                if method in r.get("baselines", {}) and not r["baselines"][method].get("error")
            ]
            if kind == "echo":
                add("latency", f"{method} p50", payload, [float(b["p50_ms"]) for b in found])
            add("throughput", f"{method} {kind}", payload, [b["mib_per_second"] for b in found])
    if not points:
        raise PlotError("nothing to plot: none of the experiments has a pair that completed")
    return [
        Series(panel, label, tuple(sorted(values)))
        for (panel, label), values in sorted(points.items())
    ]


def write_plot(reports: Sequence[Mapping[str, Any]], path: str) -> list[Series]:
    """Draw ``reports`` into the PNG file ``path`` (two panels, logarithmic axes); the series
    drawn. ``PlotError`` without matplotlib (``pip install 'chrysalis-node[plot]'``)."""
    series = plot_series(reports)
    try:
        import matplotlib  # the optional extra: loaded only to draw (module docstring)

        matplotlib.use("Agg")  # a file, never a window
        from matplotlib import pyplot
    except ImportError as exc:
        raise PlotError(
            f"--plot needs matplotlib ({exc}): pip install 'chrysalis-node[plot]'"
        ) from None
    names = ", ".join(str(r["name"]) for r in reports)
    figure, (latency, throughput) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    try:
        for axes, panel, unit in (
            (latency, "latency", "echo round trip (ms)"),
            (throughput, "throughput", "per pair (MiB/s)"),
        ):
            drawn = [s for s in series if s.panel == panel]
            for s in drawn:
                xs, ys = zip(*s.points, strict=True)
                style = "-" if s.label.startswith("chrysalis") else "--"
                axes.plot(xs, ys, style, marker="o", label=s.label)
            axes.set_xscale("log", base=2)
            axes.set_yscale("log")
            axes.set_xlabel("payload (bytes)")
            axes.set_ylabel(unit)
            axes.grid(True, which="both", alpha=0.3)
            if drawn:
                axes.legend(fontsize="small")
            else:
                axes.text(0.5, 0.5, "no echo experiment", ha="center", transform=axes.transAxes)
        figure.suptitle(f"chrysalis experiments: {names}"[:200])
        figure.tight_layout()
        figure.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise PlotError(f"cannot write {path}: {exc}") from exc
    finally:
        pyplot.close(figure)
    return series
