"""The plumbing every benchmark script shares (``benchmarks/_common.py``): options, run mode,
machine facts, JSON and README writers; and the actor telemetry script's smoke run. Nothing
here asserts anything about speed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402


def _parser(**kwargs: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench", exit_on_error=False)
    common.add_run_arguments(parser, quick="q", smoke="s", **kwargs)  # type: ignore[arg-type]
    return parser


def test_run_mode_prefers_smoke_then_quick() -> None:
    parser = _parser()
    assert common.run_mode(parser.parse_args([])) == "full"
    assert common.run_mode(parser.parse_args(["--quick"])) == "quick"
    assert common.run_mode(parser.parse_args(["--smoke", "--quick"])) == "smoke"


def test_optional_options_are_added_only_when_asked_for(tmp_path: Path) -> None:
    bare = _parser().parse_args(["--json", str(tmp_path / "x.json")])
    assert bare.json == tmp_path / "x.json"
    assert not hasattr(bare, "case")
    assert not hasattr(bare, "write_readme")
    full = _parser(cases=["a", "b"], readme="r").parse_args(
        ["--case", "a", "--case", "b", "--write-readme"]
    )
    assert full.case == ["a", "b"]
    assert full.write_readme is True


def test_unknown_case_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser(cases=["a", "b"])
    common.check_cases(parser, ["a"], ["a", "b"])  # known: nothing happens
    with pytest.raises(SystemExit) as exit_info:
        common.check_cases(parser, ["a", "zz", "yy"], ["a", "b"])
    assert exit_info.value.code == 2
    assert "unknown case(s): yy, zz" in capsys.readouterr().err


def test_machine_facts_name_the_command_that_reproduces_the_run() -> None:
    facts = common.machine_facts("benchmarks/x.py", ["--smoke", "--case", "a"])
    assert facts["command"] == "python benchmarks/x.py --smoke --case a"
    assert set(facts) == {"date", "machine", "python", "kernel", "command"}
    assert "command" not in common.machine_facts()
    line = common.machine_line(facts)
    assert line == f"{facts['date']}, {facts['machine']}, Python {facts['python']}"


def test_partial_runs_carry_a_warning_and_full_runs_none() -> None:
    assert common.partial_run_warning("full") == []
    for mode in ("quick", "smoke"):
        warning = common.partial_run_warning(mode)
        assert warning[0].startswith(f"**{mode} run:")
        assert warning[-1] == ""


def test_a_failing_smoke_run_is_reported_with_its_stderr(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("import sys\nsys.exit('no smoke today')\n")
    failed = r"broken\.py --smoke exited with 1:\n(.|\n)*no smoke today"
    with pytest.raises(common.BenchmarkError, match=failed):
        common.run_smoke(script, tmp_path / "out.json", cwd=tmp_path, timeout=30)


def test_filesystem_of_names_a_type_for_any_folder(tmp_path: Path) -> None:
    assert common.filesystem_of(str(tmp_path)) not in ("", None)
    assert common.filesystem_of("/") != ""


def test_json_writer_accepts_paths(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    common.write_json(out, {"where": tmp_path, "n": 1})
    assert json.loads(out.read_text()) == {"where": str(tmp_path), "n": 1}
    assert out.read_text().endswith("}\n")


def test_readme_section_replaces_only_the_named_heading(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\n## Speed\n\nold\n\n## Benchmark\n\nkept\n")
    common.write_readme_section(readme, "## Speed\n\nnew\n", heading="## Speed")
    assert readme.read_text() == "# pkg\n\n## Speed\n\nnew\n\n## Benchmark\n\nkept\n"
    readme.chmod(0o640)
    common.write_readme_section(readme, "## Benchmark\n\nlast\n")
    assert readme.read_text() == "# pkg\n\n## Speed\n\nnew\n\n## Benchmark\n\nlast\n"
    assert readme.stat().st_mode & 0o777 == 0o640  # the atomic replace keeps the mode
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]


def test_readme_subsection_of_another_section(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\n## Benchmark\n\n### A\n\nbench\n\n## Numbers\n\n### A\n\nold\n")
    common.write_readme_subsection(readme, "### A", "### A\n\nnew\n", section="## Numbers")
    assert readme.read_text() == (
        "# pkg\n\n## Benchmark\n\n### A\n\nbench\n\n## Numbers\n\n### A\n\nnew\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]


def test_actor_telemetry_smoke_run_measures_every_case(tmp_path: Path) -> None:
    out = tmp_path / "telemetry.json"
    proc = common.run_smoke(ROOT / "benchmarks" / "actor_telemetry.py", out, cwd=tmp_path)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    assert document["command"].startswith("python benchmarks/actor_telemetry.py --smoke")
    cases = {case["case"]: case for case in document["cases"]}
    assert set(cases) == {
        "disabled-checks",
        *(
            f"{p}{name}"
            for p in ("", "pipelined ")
            for name in ("metrics", "tracing", "metrics+tracing")
        ),
    }
    for name, case in cases.items():
        assert case["measured"], name
        assert case["ratio"] > 0, name
        assert f"| {name} |" in proc.stdout


def test_actor_telemetry_only_runs_the_call_cases_of_one_mode(tmp_path: Path) -> None:
    out = tmp_path / "telemetry.json"
    common.run_smoke(
        ROOT / "benchmarks" / "actor_telemetry.py", out, "--only", "metrics", cwd=tmp_path
    )
    cases = {case["case"] for case in json.loads(out.read_text())["cases"]}
    assert cases == {"disabled-checks", "metrics", "pipelined metrics"}


def test_actor_telemetry_profile_hooks_times_every_hook_in_situ(tmp_path: Path) -> None:
    """``--profile-hooks`` finds every hook on the call path: each wrapped hook fires on every
    round trip (the counts per round trip are what one ``call_one`` makes)."""
    out = tmp_path / "profile.json"
    proc = common.run_smoke(
        ROOT / "benchmarks" / "actor_telemetry.py", out, "--profile-hooks", cwd=tmp_path
    )
    profile = json.loads(out.read_text())["profile"]
    per_trip = {
        mode: {
            hook: row["calls"] / rows["(an empty function, wrapped)"]["calls"]
            for hook, row in rows.items()
        }
        for mode, rows in profile.items()
    }
    # The call and its reply, plus any runtime message of the same seconds (rare): at least 2.
    for mode, hook in (
        ("metrics", "on_sent"),
        ("metrics", "on_received"),
    ):
        assert 2 <= per_trip[mode].pop(hook) < 2.2, (mode, hook)
    assert per_trip["metrics"] == {
        "(an empty function, wrapped)": 1,
        "on_enqueued": 1,
        "call_opened": 1,
        "call_completed": 1,
        "run_endpoint (+ body)": 1,
    }
    # A sync call's spans: no wrapper, no ``outgoing_trace`` per envelope, no span object.
    assert per_trip["tracing"] == {
        "(an empty function, wrapped)": 1,
        "send_call_traced (+ the posts)": 1,
        "run_endpoint (+ body)": 1,
    }
    assert set(per_trip["off"]) == {"(an empty function, wrapped)", "endpoint body alone"}
    assert "| tracing | send_call_traced (+ the posts) |" in proc.stdout


def test_actor_telemetry_instructions_per_call_arithmetic() -> None:
    """``--instructions``' counting (without valgrind): each mode's window, less an empty
    window's cost, per call, the lowest round; the table's overhead and ratio."""
    from benchmarks import actor_telemetry as bench
    from monarch.actor._runtime import telemetry

    cost = {"off": 100, "metrics": 110, "tracing": 120, "metrics+tracing": 130}
    total = [0]

    class _Future:
        def get(self, timeout: float) -> None:
            return None

    class _Ping:
        def call_one(self, x: int) -> _Future:
            state = telemetry.telemetry_state()
            mode = {(False, False): "off", (True, False): "metrics", (False, True): "tracing"}
            total[0] += cost[mode.get((state["metrics"], state["tracing"]), "metrics+tracing")]
            return _Future()

    class _Actor:
        ping = _Ping()

    def read() -> int:
        total[0] += 7  # reading costs something: the empty window's 7 is taken off
        return total[0]

    try:
        counts = bench.instructions_per_call(_Actor(), 64, read)
    finally:
        telemetry.disable_telemetry()
    assert counts == {mode: float(c) for mode, c in cost.items()}
    table = bench.instructions_table(counts)
    assert "| tracing | 120 | +20 | 0.833x |" in table
    assert "| metrics+tracing | 130 | +30 | 0.769x |" in table
