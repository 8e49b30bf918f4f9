"""The scale tool (``chrysalis.node._scale``): placement, the echo codec, latency summaries,
the launcher's failure handling, the worker's echo service, and one tiny real run that must
leave no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.node._cli import PING_PAYLOAD, PING_TAG, ping_payload
from chrysalis.node._echo import serve_stream
from chrysalis.node._scale import (
    BASELINES_OP,
    DELIVERY_OP,
    ECHO_OP,
    MAX_ECHO_PAYLOAD,
    POOLED_ECHO_OP,
    RESTART_BACKOFF_MAX,
    ProcessGroup,
    RestartPolicy,
    ScaleError,
    ScaleSettings,
    _default_signals,
    _hand_identity,
    _parse_worker,
    _parser,
    _restart_error,
    _scale_handler,
    _serve_echo,
    _stop_on_signals,
    _worker_command,
    _worker_identity,
    decode_echo_reply,
    encode_echo_request,
    main,
    plan_placement,
    process_cpu_ms,
    run_scale,
    summarize_latencies,
    tree_cpu,
)


@settings(max_examples=150, deadline=None)
@given(
    nodes=st.integers(2, 400),
    per_task=st.integers(1, 64),
    topology=st.sampled_from(["flat", "task-head"]),
)
def test_placement_is_a_tree_rooted_at_rank_zero(nodes: int, per_task: int, topology: str) -> None:
    plan = plan_placement(nodes, per_task, topology)  # type: ignore[arg-type]
    assert [p.rank for p in plan] == list(range(nodes))
    assert plan[0].role == "root"
    assert plan[0].parent is None
    assert plan[0].level == 0
    for p in plan[1:]:
        assert p.parent is not None
        assert p.parent < p.rank
        parent = plan[p.parent]
        assert parent.role in ("root", "head")
        assert p.level == parent.level + 1
        assert p.task == p.rank // per_task
        if topology == "flat":
            assert p.role == "leaf"
            assert p.parent == 0
        elif p.rank % per_task == 0:
            assert p.role == "head"
            assert p.parent == 0
        else:
            assert p.role == "leaf"
            assert p.parent == p.task * per_task
    heads = sum(p.role in ("root", "head") for p in plan)
    assert heads == (1 if topology == "flat" else -(-nodes // per_task))


@pytest.mark.parametrize(
    ("nodes", "per_task", "topology"),
    [(1, 10, "flat"), (5000, 10, "flat"), (10, 0, "task-head"), (10, 5, "ring")],
)
def test_placement_rejects_invalid_runs(nodes: int, per_task: int, topology: str) -> None:
    with pytest.raises(ValueError):
        plan_placement(nodes, per_task, topology)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(payload=st.binary(max_size=2048))
def test_echo_request_and_reply_round_trip(payload: bytes) -> None:
    request = encode_echo_request(payload)
    op, length = struct.unpack_from(">BI", request)
    assert (op, length, request[5:]) == (ECHO_OP, len(payload), payload)
    decode_echo_reply(struct.pack(">I", length) + request[5:], payload)
    with pytest.raises(ScaleError):
        decode_echo_reply(struct.pack(">I", length) + request[5:] + b"x", payload)


def test_echo_codec_rejects_oversize_short_and_wrong_replies() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        encode_echo_request(bytes(MAX_ECHO_PAYLOAD + 1))
    with pytest.raises(ScaleError, match="no length prefix"):
        decode_echo_reply(b"\x00\x00", b"*")
    with pytest.raises(ScaleError, match="mismatch"):
        decode_echo_reply(b"\x00\x00\x00\x01+", b"*")


def test_latency_summary_uses_nearest_rank_percentiles_in_milliseconds() -> None:
    summary = summarize_latencies([i / 1000 for i in range(10, 0, -1)])  # 1..10 ms, unsorted
    assert (summary.count, summary.p50_ms, summary.p90_ms, summary.max_ms) == (10, 5, 9, 10)
    assert summary.mean_ms == pytest.approx(5.5)
    with pytest.raises(ValueError):
        summarize_latencies([])
    with pytest.raises(ValueError):
        summarize_latencies([0.1, -0.001])


def test_settings_reject_zero_concurrency_and_bad_timeouts() -> None:
    with pytest.raises(ValueError):
        ScaleSettings(4, launch_concurrency=0)
    with pytest.raises(ValueError):
        ScaleSettings(4, join_timeout=0)
    with pytest.raises(ValueError):
        ScaleSettings(1)


def test_restarts_need_persist_and_bounded_settings() -> None:
    ScaleSettings(4, persist=True, restart=3, restart_backoff=0)
    with pytest.raises(ValueError, match="needs --persist"):
        ScaleSettings(4, restart=1)
    with pytest.raises(ValueError, match="restart must be"):
        ScaleSettings(4, persist=True, restart=-1)
    with pytest.raises(ValueError, match="restart_backoff"):
        ScaleSettings(4, persist=True, restart=1, restart_backoff=RESTART_BACKOFF_MAX + 1)


def test_restart_policy_counts_per_rank_doubles_the_backoff_and_gives_up() -> None:
    policy = RestartPolicy(3, 0.5, cap=1.5)
    assert policy.exited(4, 0) is None  # a clean exit is not restarted (and not counted)
    assert [policy.exited(4, -9) for _ in range(4)] == [0.5, 1.0, 1.5, None]  # capped, then
    assert (policy.used(4), policy.used(5), policy.total) == (3, 0, 3)  # given up on
    assert policy.exited(5, 1) == 0.5  # every rank has its own budget
    assert policy.total == 4
    assert RestartPolicy(0, 0.5).exited(1, -9) is None  # restarts off
    for limit, backoff, cap in ((-1, 0.5, 1.0), (1, 2.0, 1.0), (1, float("nan"), 1.0)):
        with pytest.raises(ValueError):
            RestartPolicy(limit, backoff, cap)


def test_a_failed_restart_is_reported_by_the_new_process_s_own_error() -> None:
    exc = ScaleError("rank-2 exited with status 1 within 9 s: rank 2 ready: 4 ms\nbad: 'chain'\n")
    assert _restart_error(exc) == "rank-2 exited with status 1 within 9 s: bad: 'chain'"
    assert _restart_error(OSError()) == "OSError"
    assert len(_restart_error(ScaleError("x" * 1000))) == 300


def test_a_kept_identity_is_read_back_with_its_pid(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    path = tmp_path / "rank-1.json"
    first = _worker_identity(ca, path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert _worker_identity(ca, path).pid == first.pid  # a restart: the same PID
    assert _worker_identity(ca, None).pid != first.pid  # no file: a new identity each time
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    path.write_text('{"chain": "not pem"}')
    with pytest.raises(ScaleError, match="not usable"):
        _worker_identity(ca, path)


def test_identities_issued_ahead_are_handed_once_each(tmp_path: Path) -> None:
    """The fork server's batch (``_hand_identity`` before each fork): every worker gets an
    identity of its own, issued by the same CA, taken exactly once; another CA's is not
    used; with nothing handed a worker issues its own."""
    import chrysalis.node._scale as scale

    ca, other = tmp_path / "ca", tmp_path / "other"
    taken = []
    for _ in range(scale._IDENTITY_BATCH + 3):  # more than one batch
        _hand_identity(ca)
        taken.append(_worker_identity(ca, None))
        assert scale._HANDED == []  # taken: a second call issues anew
    assert len({identity.pid for identity in taken}) == len(taken)
    assert {identity.roots for identity in taken} == {taken[0].roots}
    _hand_identity(ca)
    handed = scale._HANDED[0][1]
    assert _worker_identity(other, None).pid != handed.pid  # another CA: not this one
    assert scale._HANDED == []
    assert _worker_identity(ca, None).pid != handed.pid  # nothing handed: a fresh one
    scale._ISSUED.clear()


def _worker_lines(tmp_path: Path) -> list[list[str]]:
    settings = ScaleSettings(8, 4, "task-head", idle_timeout=12.5)
    lines = []
    for placement in plan_placement(8, 4, "task-head")[1:]:
        head = placement.role == "head"
        lines.append(
            _worker_command(
                settings,
                placement,
                udp="udp://127.0.0.1:0" if head else None,
                unix=str(tmp_path / "t.sock"),
                parent="unixgram:///p.sock",
                authority=None if placement.rank % 3 == 0 else "ab" * 16,
                ca_dir=tmp_path / "ca",
                database=tmp_path / "db" if placement.rank % 2 else None,
                host="127.0.0.1" if head else None,
                identity_file=tmp_path / "id.json" if placement.rank == 2 else None,
            )
        )
    return lines


def test_the_workers_own_parse_equals_argparses(tmp_path: Path) -> None:
    """A forked worker parses its command line without argparse (``_parse_worker``): the
    same namespace for every line ``_worker_command`` writes, and ``None`` (argparse then
    decides) for anything it does not handle."""
    for line in _worker_lines(tmp_path):
        assert _parse_worker(line) == _parser().parse_args(line), line
    line = _worker_lines(tmp_path)[0]
    rank = line.index("--rank")
    role = line.index("--role")
    for odd in (
        ["run", "--nodes", "4"],  # another command
        [*line[:rank], "--rank=1", *line[rank + 2 :]],  # --name=value
        [*line[:rank], *line[rank + 2 :]],  # a required option missing
        [*line, "--rank", "2"],  # given twice
        [*line[: rank + 1], "one", *line[rank + 2 :]],  # not an integer
        [*line[: role + 1], "root", *line[role + 2 :]],  # not a choice
        [*line, "--bogus", "1"],  # unknown
        [*line, "--unix"],  # a value missing
        [*line[: rank + 1], "-1", *line[rank + 2 :]],  # a value that looks like an option
    ):
        assert _parse_worker(odd) is None, odd


def test_relaunch_replaces_an_exited_process_and_owns_its_failures(tmp_path: Path) -> None:
    ready = "import sys; print('up', flush=True); sys.stdin.read()"

    async def go() -> None:
        group = ProcessGroup(tmp_path)
        try:
            (line,) = await group.launch(
                [[sys.executable, "-c", ready]], names=["w"], concurrency=1, timeout=20
            )
            assert line == "up"
            with pytest.raises(ScaleError, match="still running"):
                await group.relaunch("w", [sys.executable, "-c", ready], timeout=20)
            first = group.named_pids()["w"]
            os.kill(first, 9)
            assert await asyncio.wait_for(group.wait_exit(), 20) == [("w", -9)]
            line, second = await group.relaunch("w", [sys.executable, "-c", ready], timeout=20)
            assert (line, len(group)) == ("up", 1)
            assert second != first
            assert group.named_pids() == {"w": second}
            os.kill(second, 9)
            assert await asyncio.wait_for(group.wait_exit(), 20) == [("w", -9)]

            def refuse(line: str) -> None:
                raise ScaleError(f"refused {line}")

            for command, check, match in (
                ([sys.executable, "-c", "import sys; sys.exit('boom')"], None, "boom"),
                ([sys.executable, "-c", ready], refuse, "refused up"),
            ):
                with pytest.raises(ScaleError, match=match):
                    await group.relaunch("w", command, timeout=20, check=check)
                assert (len(group), group.exited()) == (0, [])  # killed, forgotten, unreported
            assert "boom" in (tmp_path / "w.log").read_text()  # logs are appended to
        finally:
            await group.stop(grace=1)

    asyncio.run(go())


class FakeStream:
    """A ``ByteStream`` that reads ``data`` (then EOF) and records what is written."""

    def __init__(self, data: bytes) -> None:
        self.reader = asyncio.StreamReader()
        self.reader.feed_data(data)
        self.reader.feed_eof()
        self.written = bytearray()
        self.eof = False

    async def read(self, n: int = -1) -> bytes:
        return await self.reader.read(n)

    async def read_exactly(self, n: int) -> bytes:
        return await self.reader.readexactly(n)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def write_eof(self) -> None:
        self.eof = True

    async def drain(self) -> None:
        return None

    def close(self, error_code: int = 0) -> None:
        self.eof = True

    def abort(self, error_code: int = 0) -> None:
        self.eof = True

    async def wait_closed(self) -> None:
        return None


def _serve(data: bytes) -> FakeStream:
    async def go() -> FakeStream:
        stream = FakeStream(data)
        await serve_stream(stream, _serve_echo)  # as the worker's echo service runs it
        return stream

    return asyncio.run(go())


def test_worker_echo_answers_length_and_payload() -> None:
    stream = _serve(encode_echo_request(b"hello"))
    assert bytes(stream.written) == b"\x00\x00\x00\x05hello"
    assert stream.eof


def test_worker_counts_a_stream_transfer_and_answers_the_byte_count() -> None:
    stream = _serve(bytes([DELIVERY_OP]) + b"\x2a" * 300_000)  # more than one read
    assert bytes(stream.written) == (300_000).to_bytes(8, "big")
    assert stream.eof


def test_worker_echo_returns_other_streams_raw() -> None:
    stream = _serve(b"plain text")
    assert bytes(stream.written) == b"plain text"
    assert stream.eof


def test_every_ping_payload_is_echoed_raw_by_a_scale_worker() -> None:
    """``chrysalis ping`` against a scale worker: its payload never starts with a request op
    (random first bytes hit ECHO_OP or DELIVERY_OP 2 times in 256)."""
    payloads = [ping_payload() for _ in range(2048)]
    assert not [p for p in payloads if p[0] in (ECHO_OP, DELIVERY_OP)]
    assert {p[0] for p in payloads} == {PING_TAG}
    assert {len(p) for p in payloads} == {PING_PAYLOAD}
    assert len(set(payloads)) == len(payloads)  # still random after the tag
    stream = _serve(payloads[0])
    assert bytes(stream.written) == payloads[0]


def test_worker_echo_refuses_an_oversize_length_without_reading_it() -> None:
    stream = _serve(struct.pack(">BI", ECHO_OP, MAX_ECHO_PAYLOAD + 1) + b"x")
    assert bytes(stream.written) == b""
    assert stream.eof


def test_worker_echo_survives_a_truncated_request() -> None:
    stream = _serve(struct.pack(">BI", ECHO_OP, 10) + b"abc")
    assert bytes(stream.written) == b""
    assert stream.eof


def test_launcher_reports_a_process_that_exits_before_its_ready_line(tmp_path: Path) -> None:
    async def go() -> None:
        group = ProcessGroup(tmp_path)
        try:
            with pytest.raises(ScaleError, match=r"broken.*boom"):
                await group.launch(
                    [[sys.executable, "-c", "import sys; sys.exit('boom')"]],
                    names=["broken"],
                    concurrency=1,
                    timeout=10,
                )
        finally:
            await group.stop()

    asyncio.run(go())


def test_launcher_times_out_a_silent_process_and_stop_ends_it(tmp_path: Path) -> None:
    async def go() -> list[int | None]:
        group = ProcessGroup(tmp_path)
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
        try:
            with pytest.raises(ScaleError, match="silent"):
                await group.launch(
                    [[sys.executable, "-c", code]], names=["silent"], concurrency=1, timeout=0.5
                )
        finally:
            procs = [child.proc for child in group._children]
            await group.stop(grace=0.5)
        return [proc.returncode for proc in procs]

    assert asyncio.run(go()) == [-9]  # ignored stdin EOF and SIGTERM: killed


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found


@pytest.mark.slow
def test_tiny_exec_run_converges_echoes_and_leaves_no_worker_behind(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    config = ScaleSettings(
        4, nodes_per_task=2, echo_rounds=2, join_timeout=60, echo_timeout=30, start="exec"
    )
    result = asyncio.run(run_scale(config, workdir=work))
    assert (result.tasks, result.children) == (2, 3)
    assert 0 < result.launch_seconds <= result.join_seconds
    assert result.first_echo.count == 3
    assert result.echo is not None
    assert result.echo.count == 3
    record = result.to_json()
    assert record["event"] == "chrysalis_scale_result"
    assert record["nodes"] == 4
    assert record["start"] == "exec"
    assert _processes_mentioning(str(work)) == []


def test_command_line_usage_errors_exit_2() -> None:
    assert main(["run"]) == 2
    assert main(["run", "--nodes", "1"]) == 1  # valid syntax, invalid run: one error line


def test_worker_answers_a_pooled_echo_frame_by_frame() -> None:
    from chrysalis.node._baselines import FrameReader, frame

    frames = [b"one", b"", b"\x2a" * 70_000]
    stream = _serve(bytes([POOLED_ECHO_OP]) + b"".join(frame(f) for f in frames))
    assert FrameReader().feed(bytes(stream.written)) == frames
    assert stream.eof


def test_worker_tells_its_baseline_addresses_and_refuses_an_oversized_pooled_frame() -> None:
    async def go(handler_data: bytes, baselines: bytes) -> FakeStream:
        stream = FakeStream(handler_data)
        await serve_stream(stream, _scale_handler(baselines))
        return stream

    answer = asyncio.run(go(bytes([BASELINES_OP]), b'{"tcp": "127.0.0.1:9"}'))
    assert bytes(answer.written) == b'{"tcp": "127.0.0.1:9"}'
    assert bytes(_serve(bytes([BASELINES_OP])).written) == b"{}"  # a worker without servers
    oversized = (MAX_ECHO_PAYLOAD + 1).to_bytes(4, "big")
    refused = asyncio.run(go(bytes([POOLED_ECHO_OP]) + oversized, b"{}"))
    assert bytes(refused.written) == b""


def test_process_cpu_counts_every_thread_and_declines_a_gone_process() -> None:
    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    before = process_cpu_ms(os.getpid())
    assert before is not None
    thread = threading.Thread(target=burn, args=(0.05,))
    thread.start()
    thread.join()
    burn(0.05)
    after = process_cpu_ms(os.getpid())
    assert after is not None
    # 100 ms burnt, 50 of them in a thread that has ended: /proc/PID/stat still counts it.
    assert after - before >= 60
    assert after <= time.process_time() * 1000 + 20
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_cpu_ms(child.pid) is None  # reaped: no /proc entry


def test_tree_cpu_adds_up_roles() -> None:
    me = os.getpid()
    cpu = tree_cpu([me, me], [me], None, 30.0)
    assert cpu is not None
    own = cpu["leaf_ms_median"]
    assert own > 0
    assert cpu["workers"] == 3
    assert cpu["head_ms_median"] == pytest.approx(own, rel=0.1)
    assert cpu["forkserver_ms"] == 0
    assert cpu["ms_per_worker"] == pytest.approx(
        (cpu["leaf_ms_total"] + cpu["head_ms_total"] + 30.0) / 3
    )
    assert tree_cpu([], [], me, 1.0) is None


def test_a_worker_s_signal_handlers_set_its_stop_event_and_are_restored() -> None:
    async def go() -> None:
        stop = asyncio.Event()
        _stop_on_signals(asyncio.get_running_loop(), stop)
        try:
            for signum in (signal.SIGTERM, signal.SIGINT):
                stop.clear()
                os.kill(os.getpid(), signum)
                await asyncio.wait_for(stop.wait(), 5)
        finally:
            _default_signals()

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        asyncio.run(go())
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
