"""User logs vs system logs, the actor prefix, and forwarded worker output: the line prefixer,
the rank prefix and the aggregation of repeated lines."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import monarch.actor
import monarch.actor._runtime.logging as logging_module
from monarch.actor import Actor, ProcMesh, endpoint
from monarch.actor._hosts import groups
from monarch.actor._runtime.logging import (
    LineAggregator,
    LinePrefixer,
    _level,
    edit_distance,
    rank_prefix,
    system_log_path,
)

Procs = Callable[..., ProcMesh]
T = 5.0
USER_LOGGER = "tests.user.logging"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def capture() -> Iterator[_Capture]:
    handler = _Capture()
    logger = logging.getLogger(USER_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class Talker(Actor):
    @endpoint
    def say(self, text: str, *args: object) -> None:
        logging.getLogger(USER_LOGGER).info(text, *args)

    @endpoint
    def say_with_own_logger(self, text: str) -> str:
        self.logger.addHandler(_FORWARD)
        try:
            self.logger.info(text)
        finally:
            self.logger.removeHandler(_FORWARD)
        return self.logger.name

    @endpoint
    def system(self, text: str) -> None:
        logging.getLogger("monarch.actor.test").warning(text)


class _Forward(logging.Handler):
    """Hands records of the actor's own logger to the user logger's handlers."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(USER_LOGGER).handle(record)


_FORWARD = _Forward()


def test_user_logs_in_actors_carry_the_actor_chain(procs: Procs, capture: _Capture) -> None:
    talkers = procs(gpus=2).spawn("talkers", Talker)
    talkers.slice(gpus=1).say.call_one("hello %s", "there").get(timeout=T)
    (record,) = capture.records
    assert record.getMessage().startswith("[actor=<root>.<")
    assert "talkers{'gpus': 1/2}>] hello there" in record.getMessage()
    assert record.actor == record.getMessage()[len("[actor=") :].split("] ")[0]  # type: ignore[attr-defined]


def test_the_actor_logger_is_prefixed_too(procs: Procs, capture: _Capture) -> None:
    talker = procs(gpus=1).spawn("own", Talker)
    name = talker.say_with_own_logger.call_one("from self.logger").get(timeout=T)
    assert name.endswith("Talker")
    assert capture.messages[-1].endswith("own{'gpus': 0/1}>] from self.logger")


def test_client_logs_carry_root_and_empty_messages_stay_empty(
    procs: Procs, capture: _Capture
) -> None:
    procs(gpus=1)  # the client runtime exists
    logging.getLogger(USER_LOGGER).info("on the client")
    logging.getLogger(USER_LOGGER).info("")
    assert capture.messages == ["[actor=<root>] on the client", ""]


def test_prefix_can_be_switched_off(
    procs: Procs, capture: _Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    talker = procs(gpus=1).spawn("quiet", Talker)
    monkeypatch.setattr(monarch.actor.config, "prefix_python_logs_with_actor", False)
    talker.say.call_one("plain").get(timeout=T)
    assert capture.messages == ["plain"]
    assert "quiet" in capture.records[0].actor  # type: ignore[attr-defined]


def test_percent_in_actor_names_does_not_break_formatting(procs: Procs, capture: _Capture) -> None:
    talker = procs(gpus=1).spawn("100%", Talker)
    talker.say.call_one("value %d", 7).get(timeout=T)
    talker.say.call_one("literal %d").get(timeout=T)
    assert capture.messages[0].endswith("100%{'gpus': 0/1}>] value 7")
    assert capture.messages[1].endswith("] literal %d")


def test_system_logs_are_not_prefixed_and_do_not_propagate(procs: Procs, capture: _Capture) -> None:
    procs(gpus=1)
    system = logging.getLogger("monarch")
    assert system.propagate is False
    assert system.handlers  # its own handlers
    root_capture = _Capture()
    logging.getLogger().addHandler(root_capture)
    own = _Capture()
    logging.getLogger("monarch.actor.test").addHandler(own)
    try:
        talker = procs(gpus=1).spawn("sys", Talker)
        talker.system.call_one("runtime trouble").get(timeout=T)
    finally:
        logging.getLogger().removeHandler(root_capture)
        logging.getLogger("monarch.actor.test").removeHandler(own)
    assert own.messages == ["runtime trouble"]  # no actor prefix on system records
    assert not any("runtime trouble" in m for m in root_capture.messages)


def test_separation_in_a_fresh_process(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import logging, sys
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="USER %(message)s")
        from monarch.actor import _local_proc_mesh
        import talker_module
        procs = _local_proc_mesh(per_host={"gpus": 1})
        t = procs.spawn("t", talker_module.T)
        t.run.call_one().get(timeout=10)
        logging.getLogger("chrysalis.quic").info("client transport info line")
        logging.getLogger("quic").info("client aioquic info line")
        procs.stop().get(timeout=10)
        """
    )
    (tmp_path / "talker_module.py").write_text(
        textwrap.dedent(
            """
            import logging
            from monarch.actor import Actor, endpoint

            class T(Actor):
                @endpoint
                def run(self) -> None:
                    logging.getLogger("user.code").info("user line")
                    print("printed line")
                    logging.getLogger("monarch.actor.runtime").warning("system line")
                    logging.getLogger("monarch.actor.runtime").info("quiet system line")
                    logging.getLogger("chrysalis.quic").info("actor transport info line")
                    logging.getLogger("quic").info("actor aioquic info line")
                    logging.getLogger("chrysalis.node").warning("transport warning line")
            """
        )
    )
    log_file = tmp_path / "system.log"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(tmp_path),
        "MONARCH_FILE_LOG": "info",
        "MONARCH_LOG_FILE": str(log_file),
    }
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "USER [actor=<root>.<talker_module.T t{'gpus': 0/1}>] user line" in out.stdout
    assert "printed line" in out.stdout
    assert "system line" not in out.stdout
    assert "[monarch client] WARNING monarch.actor.runtime: system line" in out.stderr
    assert "quiet system line" not in out.stderr
    # The transport's and aioquic's records are system logs too: never in the program's root
    # handlers (at INFO here), on the system handlers at their levels.
    for line in ("transport info line", "aioquic info line", "transport warning line"):
        assert line not in out.stdout, out.stdout
    assert "info line" not in out.stderr, out.stderr
    assert "[monarch client] WARNING chrysalis.node: transport warning line" in out.stderr
    text = log_file.read_text()
    for who in ("client", "actor"):
        assert f"INFO chrysalis.quic: {who} transport info line" in text
        assert f"INFO quic: {who} aioquic info line" in text
    assert "system line" in text
    assert "quiet system line" in text
    assert "user line" not in text


def test_level_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_STDERR_LOG", "ERROR")
    assert _level("MONARCH_STDERR_LOG", logging.WARNING) == logging.ERROR
    monkeypatch.setenv("MONARCH_STDERR_LOG", "off")
    assert _level("MONARCH_STDERR_LOG", logging.WARNING) is None
    monkeypatch.setenv("MONARCH_STDERR_LOG", "15")
    assert _level("MONARCH_STDERR_LOG", logging.WARNING) == 15
    monkeypatch.delenv("MONARCH_STDERR_LOG")
    assert _level("MONARCH_STDERR_LOG", logging.WARNING) == logging.WARNING
    monkeypatch.setenv("MONARCH_STDERR_LOG", "loud")
    with pytest.raises(ValueError, match="not a log level"):
        _level("MONARCH_STDERR_LOG", logging.WARNING)
    monkeypatch.setenv("MONARCH_LOG_FILE", "/x/y.log")
    assert system_log_path() == Path("/x/y.log")
    monkeypatch.delenv("MONARCH_LOG_FILE")
    assert system_log_path().name == "monarch_log.log"


# -- LinePrefixer -------------------------------------------------------------------------
def test_line_prefixer_basics() -> None:
    p = LinePrefixer(b"[gpus=1] ", max_line=8)
    assert p.feed(b"ab") == []
    assert p.feed(b"c\nde\n\nf") == [b"[gpus=1] abc\n", b"[gpus=1] de\n", b"[gpus=1] \n"]
    assert p.flush() == [b"[gpus=1] f\n"]
    assert p.flush() == []
    assert p.feed(b"0123456789abcdefXY") == [b"[gpus=1] 01234567\n", b"[gpus=1] 89abcdef\n"]
    assert p.feed(b"\n") == [b"[gpus=1] XY\n"]
    with pytest.raises(ValueError):
        LinePrefixer(b"", max_line=0)


@given(
    st.binary(max_size=400),
    st.lists(st.integers(min_value=1, max_value=50), max_size=20),
    st.integers(min_value=1, max_value=32),
)
def test_line_prefixer_is_independent_of_chunking(
    data: bytes, cuts: list[int], max_line: int
) -> None:
    whole = LinePrefixer(b"> ", max_line)
    expected = whole.feed(data) + whole.flush()
    chunked = LinePrefixer(b"> ", max_line)
    got: list[bytes] = []
    pos = 0
    for cut in cuts:
        got += chunked.feed(data[pos : pos + cut])
        pos += cut
    got += chunked.feed(data[pos:]) + chunked.flush()
    assert got == expected
    for line in got:
        assert line.startswith(b"> ")
        assert line.endswith(b"\n")
        assert len(line) <= 2 + max_line + 1
        assert b"\n" not in line[:-1]
    assert b"".join(line[2:-1] for line in got) == data.replace(b"\n", b"")


def test_a_forked_worker_labels_system_lines_as_its_own(tmp_path: Path) -> None:
    """Workers forked from the client's zygote inherit its logging state; their system lines
    must still name the worker, not ``client``."""
    (tmp_path / "syslog_module.py").write_text(
        textwrap.dedent(
            """
            import logging
            from monarch.actor import Actor, endpoint

            class T(Actor):
                @endpoint
                def run(self) -> None:
                    logging.getLogger("monarch.actor.runtime").warning("worker system line")
            """
        )
    )
    script = textwrap.dedent(
        """
        from monarch.actor import this_host
        import syslog_module
        if __name__ == "__main__":
            procs = this_host().spawn_procs(per_host={"gpus": 1})
            procs.spawn("t", syslog_module.T).run.call_one().get(timeout=30)
            procs.stop().get(timeout=30)
        """
    )
    (tmp_path / "main_script.py").write_text(script)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(tmp_path),
        "MONARCH_WORKER_SPAWN_METHOD": "zygote",
    }
    out = subprocess.run(
        [sys.executable, str(tmp_path / "main_script.py")],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "WARNING monarch.actor.runtime: worker system line" in out.stderr
    assert "[monarch client] WARNING monarch.actor.runtime: worker system line" not in out.stderr
    assert "[monarch procs{'gpus': 0/1}] WARNING" in out.stderr


# -- LineAggregator (time passed in) --------------------------------------------------------
def _body(block: list[bytes]) -> list[bytes]:
    """A block without its header and footer lines (which carry wall-clock times)."""
    assert block[0].startswith(b">>> Aggregated Logs (")
    assert block[0].endswith(b") >>>\n")
    assert block[-1].startswith(b"<<< Aggregated Logs (")
    assert block[-1].endswith(b") <<<\n")
    return block[1:-1]


def test_line_aggregator_merges_repeats_within_its_window() -> None:
    agg = LineAggregator(3.0)
    assert agg.deadline() is None
    assert agg.add(rank_prefix(0) + b"loss 1\n", 100.0) == []
    assert agg.deadline() == 103.0
    assert agg.add(rank_prefix(1) + b"loss 1\n", 101.0) == []  # another rank: the same line
    assert agg.add(b"[0] other\n", 102.0) == []
    assert agg.add(b"[0] loss 1\n", 102.5) == []
    assert agg.poll(102.9) == []
    block = agg.poll(103.0)
    assert _body(block) == [
        b"[3 similar log lines] [0] loss 1\n",
        b"[1 similar log lines] [0] other\n",
    ]
    assert agg.deadline() is None
    assert len(agg) == 0
    assert agg.poll(200.0) == []
    assert agg.flush(200.0) == []
    # A line after the window ended writes that window first, then opens a new one.
    agg.add(b"a\n", 300.0)
    assert _body(agg.add(b"b\n", 304.0)) == [b"[1 similar log lines] a\n"]
    assert agg.deadline() == 307.0
    assert _body(agg.flush(305.0)) == [b"[1 similar log lines] b\n"]
    with pytest.raises(ValueError):
        LineAggregator(0)


def test_line_aggregator_is_bounded() -> None:
    agg = LineAggregator(10.0, max_lines=2, max_bytes=1000)
    assert agg.add(b"one", 0.0) == []
    assert agg.add(b"two", 0.0) == []
    assert agg.add(b"one", 0.0) == []  # a repeat holds nothing more
    assert _body(agg.add(b"three", 1.0)) == [
        b"[2 similar log lines] one\n",
        b"[1 similar log lines] two\n",
    ]
    assert len(agg) == 1
    assert agg.deadline() == 11.0
    small = LineAggregator(10.0, max_lines=100, max_bytes=8)
    assert small.add(b"12345", 0.0) == []
    assert _body(small.add(b"6789", 0.0)) == [b"[1 similar log lines] 12345\n"]


@given(st.lists(st.sampled_from([b"x", b"y", b"[1] x", b"z"]), max_size=60))
def test_line_aggregator_counts_every_line_once(lines: list[bytes]) -> None:
    agg = LineAggregator(5.0, max_lines=2)
    out: list[bytes] = []
    for i, line in enumerate(lines):
        out += agg.add(line, float(i))
    out += agg.flush(float(len(lines)))
    counts = [
        int(line.split(b" ", 1)[0][1:])
        for line in out
        if line.startswith(b"[") and b"similar log lines]" in line
    ]
    assert sum(counts) == len(lines)


def _levenshtein(a: bytes, b: bytes) -> int:
    """The textbook dynamic programme, the oracle of ``edit_distance``."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
        previous = current
    return previous[-1]


@given(st.binary(max_size=40), st.binary(max_size=40))
def test_edit_distance_is_levenshtein(a: bytes, b: bytes) -> None:
    assert edit_distance(a, b) == _levenshtein(a, b) == edit_distance(b, a)


@given(st.lists(st.sampled_from(b"ab"), max_size=70), st.lists(st.sampled_from(b"ab"), max_size=70))
def test_edit_distance_beyond_one_machine_word(a: list[int], b: list[int]) -> None:
    """Lines longer than 64 bytes (the bit vectors span several machine words)."""
    assert edit_distance(bytes(a), bytes(b)) == _levenshtein(bytes(a), bytes(b))


def test_line_aggregator_merges_similar_lines_as_monarch_does() -> None:
    """A line is counted under the held line nearest it by normalized edit distance (whole
    lines, rank prefix and all), if below Monarch's 0.15; the block shows the first line of
    each group. The lines and the block are what torchmonarch 0.7.0 printed for two ranks
    (``logging_option(stream_to_client=True, aggregate_window_sec=2)``, 2026-12-04)."""
    agg = LineAggregator(10.0)
    for line in (
        b"[1] step 11 loss 0.51",
        b"[1] step 12 loss 0.49",  # 3 edits in 21 bytes: 0.143, merged
        b"[1] eval done",
        b"[0] step 10 loss 0.50",  # 3 edits: merged
        b"[0] step 12 loss 0.48",  # 4 edits from the first line: 0.19, a line of its own
        b"[0] eval done",  # 1 edit in 13: merged
    ):
        assert agg.add(line + b"\n", 0.0) == []
    assert _body(agg.flush(1.0)) == [
        b"[3 similar log lines] [1] step 11 loss 0.51\n",
        b"[2 similar log lines] [1] eval done\n",
        b"[1 similar log lines] [0] step 12 loss 0.48\n",
    ]
    agg.add(b"[0] ok", 0.0)
    agg.add(b"[1] ok", 0.0)  # 1 edit in 6: 0.167, as in Monarch not merged
    assert len(agg) == 2
    agg.flush(1.0)
    # The nearest held line wins, the first one on a tie.
    agg.add(b"abcdefghij0000000000", 0.0)
    agg.add(b"abcdefghij1111111111", 0.0)
    agg.add(b"abcdefghij0000000001", 0.0)  # 1 edit from the first, 9 from the second
    agg.add(b"abcdefghij1111111110", 0.0)  # 1 edit from the second
    assert _body(agg.flush(1.0)) == [
        b"[2 similar log lines] abcdefghij0000000000\n",
        b"[2 similar log lines] abcdefghij1111111111\n",
    ]
    agg.add(b"a" * 20, 0.0)
    agg.add(b"a" * 16 + b"bbbb", 0.0)  # 4 edits: 0.2, a line of its own
    agg.add(b"a" * 18 + b"bb", 0.0)  # 2 edits from each: the first
    assert _body(agg.flush(1.0)) == [
        b"[2 similar log lines] " + b"a" * 20 + b"\n",
        b"[1 similar log lines] " + b"a" * 16 + b"bbbb\n",
    ]
    exact = LineAggregator(10.0, similarity=0.0)
    exact.add(b"step 10 loss 0.51", 0.0)
    exact.add(b"step 11 loss 0.51", 0.0)
    assert len(exact) == 2
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="similarity"):
            LineAggregator(1.0, similarity=bad)


def test_line_aggregator_bounds_its_similarity_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines longer than ``max_compared_bytes`` merge only when equal; a line is compared with
    held lines until their lengths add up to ``compare_budget``; a similar line seen again is
    found by hash (no distance computed)."""
    long_line = b"x" * 300
    agg = LineAggregator(10.0)
    agg.add(long_line, 0.0)
    agg.add(long_line[:-1] + b"y", 0.0)  # 1 edit in 300, but too long to compare
    agg.add(long_line, 0.0)
    assert len(agg) == 2
    few = LineAggregator(10.0, compare_budget=20)
    for line in (b"aaaaaaaaaa", b"bbbbbbbbbb", b"cccccccccc", b"cccccccccd"):
        few.add(line, 0.0)
    assert len(few) == 4  # the last is near the third, past the budget of two 10-byte lines
    few.add(b"aaaaaaaaab", 0.0)
    assert len(few) == 4
    counted: list[bytes] = []

    def counting(a: bytes, b: bytes) -> int:
        counted.append(a)
        return edit_distance(a, b)

    monkeypatch.setattr(logging_module, "edit_distance", counting)
    seen = LineAggregator(10.0)
    seen.add(b"[0] the same line", 0.0)
    seen.add(b"[1] the same line", 0.0)  # merged by distance
    assert counted == [b"[1] the same line"]
    for _ in range(3):
        seen.add(b"[1] the same line", 0.0)  # by hash
    assert counted == [b"[1] the same line"]
    assert _body(seen.flush(1.0)) == [b"[5 similar log lines] [0] the same line\n"]
    seen.add(b"[1] the same line", 2.0)  # a new window forgets what the last one saw
    seen.add(b"[1] the same line", 2.0)
    assert _body(seen.flush(3.0)) == [b"[2 similar log lines] [1] the same line\n"]


def test_worker_output_carries_its_rank_and_repeats_aggregate(tmp_path: Path) -> None:
    """A line a worker prints reaches the client's stdout with its rank (``[1] ``); with
    ``logging_option(stream_to_client=True, aggregate_window_sec=...)`` the repeated lines of
    the mesh's processes come once, counted (the window's block is written at the latest when
    the processes' output ends, at their stop)."""
    (tmp_path / "printer_module.py").write_text(
        textwrap.dedent(
            """
            from monarch.actor import Actor, current_rank, endpoint

            class Printer(Actor):
                @endpoint
                def say(self, text: str) -> None:
                    print(f"{text} from {current_rank()['gpus']}", flush=True)

                @endpoint
                def same(self, times: int) -> None:
                    for _ in range(times):
                        print("the same line", flush=True)
            """
        )
    )
    script = textwrap.dedent(
        """
        import asyncio, logging
        from monarch.actor import this_host
        import printer_module
        if __name__ == "__main__":
            procs = this_host().spawn_procs(per_host={"gpus": 2})
            p = procs.spawn("p", printer_module.Printer)
            p.say.call("hello").get(timeout=30)
            procs.stop().get(timeout=30)
            procs = this_host().spawn_procs(per_host={"gpus": 2})
            asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=600))
            p = procs.spawn("p", printer_module.Printer)
            p.same.call(3).get(timeout=30)
            procs.stop().get(timeout=30)
        """
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
        HYPERACTOR_MESH_ENABLE_LOG_FORWARDING="true",
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "[0] hello from 0" in lines, out.stdout
    assert "[1] hello from 1" in lines, out.stdout
    (merged,) = [line for line in lines if "the same line" in line]
    assert merged.startswith("[6 similar log lines] ["), out.stdout
    assert any(line.startswith(">>> Aggregated Logs (") for line in lines)


@pytest.mark.parametrize("method", ["zygote", "exec"])
def test_worker_stderr_carries_its_rank_too(tmp_path: Path, method: str) -> None:
    """What a worker writes to its stderr reaches the client's stderr (not its stdout) with
    the worker's rank, forked by the zygote or exec'd; its stdout still goes to stdout."""
    (tmp_path / "stderr_module.py").write_text(
        textwrap.dedent(
            """
            import sys
            from monarch.actor import Actor, current_rank, endpoint

            class Both(Actor):
                @endpoint
                def say(self) -> None:
                    rank = current_rank()['gpus']
                    print(f"err line from {rank}", file=sys.stderr, flush=True)
                    print(f"out line from {rank}", flush=True)
            """
        )
    )
    script = textwrap.dedent(
        """
        from monarch.actor import this_host
        import stderr_module
        if __name__ == "__main__":
            procs = this_host().spawn_procs(per_host={"gpus": 2})
            procs.spawn("b", stderr_module.Both).say.call().get(timeout=30)
            procs.stop().get(timeout=30)
        """
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
        MONARCH_WORKER_SPAWN_METHOD=method,
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    errors, lines = out.stderr.splitlines(), out.stdout.splitlines()
    assert "[0] err line from 0" in errors, out.stderr
    assert "[1] err line from 1" in errors, out.stderr
    assert "[1] out line from 1" in lines, out.stdout
    assert not [line for line in lines if "err line" in line], out.stdout
    assert not [line for line in errors if "out line" in line], out.stderr


def test_output_forwarder_writes_a_window_when_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forwarding thread wakes at the window's end (the pipes still open): the block comes
    without more output; with aggregation off again, lines pass at once, prefixed."""
    written: list[bytes] = []
    changed = threading.Condition()

    def capture(chunk: bytes) -> None:
        with changed:
            written.append(chunk)
            changed.notify_all()

    def wait_for(part: bytes) -> bytes:
        with changed:
            assert changed.wait_for(lambda: part in b"".join(written), 10.0), written
            return b"".join(written)

    monkeypatch.setattr(groups, "_copy_to_stdout", capture)
    (r0, w0), (r1, w1) = os.pipe(), os.pipe()
    streams = [os.fdopen(r0, "rb", buffering=0), os.fdopen(r1, "rb", buffering=0)]
    forwarder = groups.OutputForwarder(streams, [rank_prefix(0), rank_prefix(1)])
    forwarder.set_window(0.3)
    forwarder.start()
    try:
        os.write(w1, b"same\nsame\nsame\n")  # one read: one window
        text = wait_for(b"<<< Aggregated Logs")
        assert b"[3 similar log lines] [1] same\n" in text
        forwarder.set_window(None)
        os.write(w0, b"plain\n")
        assert b"[0] plain\n" in wait_for(b"plain")
    finally:
        os.close(w0)
        os.close(w1)
