"""The client's admin endpoint (issue 21, item 3): Prometheus text of the mesh-wide metrics over
HTTP, ``/status`` for ``monarch top``, and the OpenTelemetry metrics exporter.

Worker processes are real (``this_host().spawn_procs``), shared by the module; counts scraped
from ``/metrics`` or read through an OpenTelemetry reader equal the calls made.
"""

from __future__ import annotations

import json
import math
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import this_host
from monarch.actor._mesh import admin
from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.telemetry import top
from monarch.actor._runtime.telemetry.exposition import (
    CONTENT_TYPE,
    metric_name,
    parse_text,
    prometheus_text,
)
from monarch.actor._runtime.telemetry.metrics import MetricPoint

sys.path.insert(0, str(Path(__file__).parent))  # workers import admin_actors by name
from admin_actors import Spawner, Ticker

T = 30.0
CALLS = 7


# -- the text format (sans-IO) ----------------------------------------------------------------
def test_counters_histograms_and_gauges_in_the_text_format() -> None:
    metrics = {
        "a.sent": [MetricPoint("a.sent", "counter", "", {"kind": "call"}, value=3.0)],
        "a.depth": [MetricPoint("a.depth", "up_down_counter", "", {}, value=-2.0)],
        "a.lat": [
            MetricPoint(
                "a.lat",
                "histogram",
                "s",
                {"endpoint": "x"},
                count=3,
                sum=0.75,
                min=0.1,
                max=0.5,
                buckets=((0.25, 1), (0.5, 2), (math.inf, 0)),
            )
        ],
    }
    text = prometheus_text(metrics, {"a.sent": "sent\nenvelopes"})
    assert "# HELP a_sent_total sent\\nenvelopes\n" in text
    assert "# TYPE a_sent_total counter\n" in text
    assert 'a_sent_total{kind="call"} 3\n' in text
    assert "# TYPE a_depth gauge\na_depth -2\n" in text
    assert 'a_lat_bucket{endpoint="x",le="0.25"} 1\n' in text
    assert 'a_lat_bucket{endpoint="x",le="0.5"} 3\n' in text  # cumulative
    assert 'a_lat_bucket{endpoint="x",le="+Inf"} 3\n' in text
    assert 'a_lat_sum{endpoint="x"} 0.75\n' in text
    assert 'a_lat_count{endpoint="x"} 3\n' in text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s for s in parse_text(text)}
    assert samples[("a_lat_count", (("endpoint", "x"),))].type == "histogram"
    assert samples[("a_sent_total", (("kind", "call"),))].value == 3


def test_names_are_made_valid() -> None:
    assert metric_name("monarch.messages.sent") == "monarch_messages_sent"
    assert metric_name("9lives-x") == "_9lives_x"
    assert prometheus_text({}) == ""


def test_malformed_lines_are_refused() -> None:
    with pytest.raises(ValueError, match="malformed"):
        parse_text("metric{a=b} 1\n")
    with pytest.raises(ValueError, match="malformed"):
        parse_text("metric one\n")


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: k != "le"),
        st.text(max_size=12),
        max_size=4,
    ),
    st.floats(min_value=0, max_value=1e12, allow_nan=False),
)
def test_label_values_and_numbers_read_back(labels: dict[str, str], value: float) -> None:
    text = prometheus_text({"x.y": [MetricPoint("x.y", "counter", "", labels, value=value)]})
    (sample,) = parse_text(text)
    assert sample.name == "x_y_total"
    assert sample.labels == labels
    assert sample.value == value


# -- the endpoint, with real worker processes ---------------------------------------------------
@pytest.fixture(scope="module")
def tickers() -> Iterator[tuple[Any, Any, admin.AdminServer]]:
    saved = os.environ.get("MONARCH_TELEMETRY")
    tm.enable_telemetry(metrics=True, tracing=False)
    tm.reset_metrics()
    try:
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        tickers: Any = procs.spawn("tickers", Ticker)
        for _ in range(CALLS):
            assert sorted(tickers.tick.call().get(timeout=T).values()) == [_ + 1, _ + 1]
        server = admin.start_admin()
        try:
            yield procs, tickers, server
        finally:
            admin.stop_admin()
            procs.stop().get(timeout=T)
    finally:
        tm.disable_telemetry()
        if saved is not None:
            os.environ["MONARCH_TELEMETRY"] = saved


def _get(url: str, token: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=T) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, "", error.read().decode()


def test_scraped_counts_equal_the_calls_made(tickers: tuple[Any, Any, admin.AdminServer]) -> None:
    _, _, server = tickers
    assert server.url.startswith("http://127.0.0.1:")
    status, content_type, text = _get(f"{server.url}/metrics")
    assert status == 200
    assert content_type == CONTENT_TYPE
    samples = parse_text(text)

    def value(name: str, **labels: str) -> float:
        found = [s.value for s in samples if s.name == name and s.labels == labels]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    # Server side, summed over the two worker processes: each handled every call.
    assert value("monarch_endpoint_latency_count", endpoint="tick") == 2 * CALLS
    assert value("monarch_endpoint_latency_bucket", endpoint="tick", le="+Inf") == 2 * CALLS
    # Client side: one call latency per call.
    assert value("monarch_client_call_latency_count", endpoint="tick") == CALLS
    assert value("monarch_messages_received_total", kind="call") >= 2 * CALLS
    assert any(s.type == "counter" for s in samples)


def test_status_needs_the_token_and_lists_the_actors(
    tickers: tuple[Any, Any, admin.AdminServer],
) -> None:
    _, _, server = tickers
    host, port, secret = server.token.rsplit(":", 2)
    assert (host, int(port)) == (server.host, server.port)
    assert _get(f"{server.url}/status")[0] == 403
    assert _get(f"{server.url}/status", token="wrong")[0] == 403
    assert _get(f"{server.url}/nothing")[0] == 404
    status, content_type, body = _get(f"{server.url}/status", token=secret)
    assert status == 200
    assert content_type == "application/json"
    doc = json.loads(body)
    assert doc["version"] == 1
    assert doc["client_os_pid"] == os.getpid()
    procs = [p for h in doc["hosts"] for p in h["procs"]]
    actors = [a for p in procs for a in p["actors"] if a["cls"] == "admin_actors.Ticker"]
    assert sorted(a["rank"] for a in actors) == [0, 1]
    assert {a["state"] for a in actors} == {"running"}
    assert all(a["received"] == CALLS and a["mailbox"] == 0 for a in actors)
    assert len({p["os_pid"] for p in procs}) == 3  # the client and two workers
    assert doc["metrics"]["monarch.endpoint.latency"] >= 2 * CALLS


def test_status_lists_the_proc_meshes_actors_spawned_in_workers(
    tickers: tuple[Any, Any, admin.AdminServer],
) -> None:
    """A proc mesh an actor spawned inside a worker is listed with its processes, its actors
    and its owner (the worker's label), and leaves the listing once stopped."""
    procs, _, _ = tickers
    spawner: Any = procs.slice(gpus=1).spawn("spawner", Spawner)
    try:
        assert spawner.spawn.call_one("innerprocs").get(timeout=T) == 1
        doc = admin.collect_status(timeout=T)
        inner = [p for h in doc["hosts"] for p in h["procs"] if p["mesh"] == "innerprocs"]
        assert len(inner) == 1, doc["hosts"]
        assert inner[0]["owner"] == "procs{'gpus': 1/2}"
        (ticker,) = inner[0]["actors"]
        assert ticker["cls"] == "admin_actors.Ticker"
        assert ticker["state"] == "running"
        assert ticker["received"] == 1
        assert inner[0]["os_pid"] not in {
            p["os_pid"] for h in doc["hosts"] for p in h["procs"] if p["mesh"] != "innerprocs"
        }
        owners = {p["owner"] for h in doc["hosts"] for p in h["procs"] if p["mesh"] == "procs"}
        assert owners == {"client"}
        rows = top.actor_rows(doc)
        assert [r.proc for r in rows if r.mesh == "innerprocs"] == [inner[0]["proc"]]
        spawner.stop_inner.call_one().get(timeout=T)
        after = admin.collect_status(timeout=T)
        assert not [p for h in after["hosts"] for p in h["procs"] if p["mesh"] == "innerprocs"]
    finally:
        spawner.stop_inner.call_one().get(timeout=T)
        spawner.stop().get(timeout=T)


def test_status_lists_recent_failures(
    tickers: tuple[Any, Any, admin.AdminServer], faults: Any
) -> None:
    procs, _, _ = tickers
    doomed: Any = procs.slice(gpus=1).spawn("doomed", Ticker)
    doomed.die.broadcast()
    faults.wait_for(1, timeout=T)
    doc = admin.collect_status(timeout=T)
    ours = [f for f in doc["failures"] if "ticker died on purpose" in f["reason"]]
    # Where it died (the worker) and where it reached as an unhandled fault (the client).
    (failed,) = [f for f in ours if f["event"] == "actor_failed"]
    assert failed["category"] == "user"
    assert failed["proc"] == "procs{'gpus': 1/2}"
    assert [f["proc"] for f in ours if f["event"] == "unhandled_fault"] == ["client"]
    states = {a["name"]: a["state"] for h in doc["hosts"] for p in h["procs"] for a in p["actors"]}
    assert [s for n, s in states.items() if "doomed" in n] in ([], ["failed"])
    assert doc["unreachable"] == []


def test_otel_exporter_reports_the_mesh_wide_counts(
    tickers: tuple[Any, Any, admin.AdminServer],
) -> None:
    sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
    export = pytest.importorskip("opentelemetry.sdk.metrics.export")
    from monarch.actor._mesh.otel_metrics import METER_NAME, export_mesh_metrics

    reader = export.InMemoryMetricReader()
    provider = sdk_metrics.MeterProvider(metric_readers=[reader])
    try:
        exported = export_mesh_metrics(meter_provider=provider, timeout=T)
        assert exported.instruments["monarch.endpoint.latency.count"] == "counter"

        def points() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
            data = reader.get_metrics_data()
            out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
            for rm in data.resource_metrics:
                for sm in rm.scope_metrics:
                    if sm.scope.name != METER_NAME:
                        continue
                    for metric in sm.metrics:
                        for dp in metric.data.data_points:
                            key = tuple(sorted((k, str(v)) for k, v in dp.attributes.items()))
                            out.setdefault(metric.name, {})[key] = dp.value
            return out

        first = points()
        base = first["monarch.endpoint.latency.count"][(("endpoint", "tick"),)]
        assert base >= 2 * CALLS
        assert first["monarch.client.call_latency.count"][(("endpoint", "tick"),)] >= CALLS
        _, tickers_mesh, _ = tickers
        tickers_mesh.tick.call().get(timeout=T)
        second = points()  # the next collection pulls again
        assert second["monarch.endpoint.latency.count"][(("endpoint", "tick"),)] == base + 2
    finally:
        provider.shutdown()
