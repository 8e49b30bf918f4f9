"""The ``chrysalis`` command in-process: join-token and reference syntax, the resolver plugin,
argument errors (exit 2) and command errors (one stderr line, exit 1), identity commands and
the exact ``ls`` / ``resolve`` renderings and JSON shapes."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr, Pid, PluginRegistry
from chrysalis.nameserver import Labels, Locator, ProcEntry
from chrysalis.node import _address
from chrysalis.node._address import (
    AddressSyntaxError,
    JoinToken,
    format_address,
    parse_join_token,
    parse_listen,
    parse_pid_reference,
)
from chrysalis.node._cli import entry_record, format_entry, format_table, main

PID_A = Pid.parse("0123456789abcdef0123456789abcdef")
PID_B = Pid.parse("fedcba9876543210fedcba9876543210")


def test_join_token_accepts_pinned_udp_unix_and_address_only_forms() -> None:
    pinned = parse_join_token(f"udp://127.0.0.1:4433?authority={PID_A.hex()}")
    assert pinned == JoinToken(DatagramAddr.udp("127.0.0.1", 4433), PID_A)
    assert parse_join_token("udp://[::1]:5000").address == DatagramAddr.udp("::1", 5000)
    assert parse_join_token("udp://[::1]:5000").authority is None
    unix = parse_join_token(f"unix:///tmp/x.sock?authority={PID_B.hex().upper()}")
    assert unix == JoinToken(DatagramAddr.unixgram("/tmp/x.sock"), PID_B)
    assert str(unix) == f"unix:///tmp/x.sock?authority={PID_B.hex()}"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("127.0.0.1:4433", "no scheme"),
        (f"{PID_A.hex()}@udp://127.0.0.1:1", "unsupported carrier scheme"),
        (f"{PID_A.hex()}@127.0.0.1:1", "PID@address"),
        ("tcp://127.0.0.1:1", "unsupported carrier scheme"),
        ("udp://localhost:1", "expected udp://<ipv4>:<port>"),
        ("udp://127.0.0.1:1?authority=abc", "exactly 32 hex digits"),
        ("udp://127.0.0.1:1?authority=" + "0" * 32, "reserved"),
        ("udp://127.0.0.1:1?authority=" + "g" * 32, "invalid authority"),
        (f"udp://127.0.0.1:1?authority={PID_A.hex()}&x=1", "only query"),
        ("udp://127.0.0.1:1?pid=1", "only query"),
        ("unix://", "missing path"),
        ("", "empty"),
        ("udp://127.0.0.1:1?authority=" + "a" * 5000, "longer than"),
    ],
)
def test_join_token_rejects_malformed_text_with_one_line(text: str, reason: str) -> None:
    with pytest.raises(AddressSyntaxError) as info:
        parse_join_token(text)
    assert reason in str(info.value)
    assert "\n" not in str(info.value)


@settings(max_examples=150, deadline=None)
@given(
    raw=st.binary(min_size=16, max_size=16).filter(lambda b: any(b)),
    port=st.integers(0, 65535),
    v6=st.booleans(),
)
def test_join_token_text_round_trips(raw: bytes, port: int, v6: bool) -> None:
    address = DatagramAddr.udp("::1" if v6 else "10.1.2.3", port)
    token = JoinToken(address, Pid(raw))
    assert parse_join_token(str(token)) == token


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80))
def test_join_token_parser_never_fails_with_an_undocumented_exception(text: str) -> None:
    with contextlib.suppress(AddressSyntaxError):
        parse_join_token(text)


def test_listen_accepts_auto_unix_and_carriers() -> None:
    assert parse_listen("unix://*") is None
    assert parse_listen("udp://127.0.0.1:0") == DatagramAddr.udp("127.0.0.1", 0)
    with pytest.raises(AddressSyntaxError, match="takes no query"):
        parse_listen(f"udp://127.0.0.1:0?authority={PID_A.hex()}")


def test_pid_references_accept_prefixes_and_reject_qualified_or_bad_ones() -> None:
    assert parse_pid_reference("01234").matches(PID_A)
    assert parse_pid_reference(PID_A.hex().upper()).matches(PID_A)
    for bad in ("", "xyz", "0" * 33, "0123@udp://127.0.0.1:1"):
        with pytest.raises(AddressSyntaxError):
            parse_pid_reference(bad)


def test_addresses_print_in_token_spelling() -> None:
    assert format_address(DatagramAddr.unixgram("/run/a.sock")) == "unix:///run/a.sock"
    assert format_address(DatagramAddr.udp("::1", 7)) == "udp://[::1]:7"


def test_resolver_plugin_turns_tokens_into_join_settings() -> None:
    registry = PluginRegistry()
    registry.register(_address)
    settings_ = registry.resolve_address(f"unix:///tmp/p.sock?authority={PID_A.hex()}")
    assert settings_.address == DatagramAddr.unixgram("/tmp/p.sock")
    assert settings_.authority == PID_A
    with pytest.raises(ValueError, match=r"no scheme|only query"):
        registry.resolve_address("udp://127.0.0.1:1?bogus")


def _entries() -> list[ProcEntry]:
    udp = DatagramAddr.udp("127.0.0.1", 4000)
    unix = DatagramAddr.unixgram("/tmp/n.sock")
    return [
        ProcEntry(PID_B, "localhost", Labels({"role": "leaf"}), (Locator(unix, 10),)),
        ProcEntry(PID_A, "localhost", Labels(), (Locator(udp, 0), Locator(unix, 5))),
        ProcEntry(Pid.parse("11" * 16), "", Labels(), ()),
    ]


def test_process_table_sorts_processes_and_locators() -> None:
    assert format_table(_entries()) == (
        "PID       PRIORITY  LABELS     ADDRESS\n"
        "01234567         0  -          udp://127.0.0.1:4000\n"
        "01234567         5  -          unix:///tmp/n.sock\n"
        "11111111         -  -          -\n"
        "fedcba98        10  role=leaf  unix:///tmp/n.sock"
    )
    assert format_table(_entries(), full=True).splitlines()[1].startswith(PID_A.hex() + "  ")


def test_resolve_record_renders_every_field() -> None:
    first, second, third = _entries()
    assert format_entry(first) == (
        f"pid: {PID_B.hex()}\ntls_server_name: localhost\nlabels:\n  role=leaf\n"
        "locators:\n  - priority: 10\n    address: unix:///tmp/n.sock"
    )
    assert format_entry(third).endswith("labels: []\nlocators: []")
    assert entry_record(second) == {
        "pid": PID_A.hex(),
        "tls_server_name": "localhost",
        "labels": {},
        "locators": [
            {"address": "udp://127.0.0.1:4000", "priority": 0},
            {"address": "unix:///tmp/n.sock", "priority": 5},
        ],
    }


def test_top_level_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "required" in capsys.readouterr().err


def test_bad_token_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "127.0.0.1:4433"]) == 2
    assert "has no scheme" in capsys.readouterr().err


def test_global_flags_are_accepted_before_and_after_the_command(tmp_path: Path) -> None:
    out = io.StringIO()
    before = ["--ca-dir", str(tmp_path / "ca"), "identity", "issue", "--out", str(tmp_path / "a")]
    assert main([*before, "--json"], out=out) == 0
    after = ["identity", "issue", "--out", str(tmp_path / "b"), "--ca-dir", str(tmp_path / "ca")]
    assert main(after, out=out) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "ca"]


def test_identity_issue_and_show_agree_on_the_pid(tmp_path: Path) -> None:
    ca = ["--ca-dir", str(tmp_path / "ca")]
    out = io.StringIO()
    assert main(["identity", "init", *ca, "--json"], out=out) == 0
    assert json.loads(out.getvalue())["directory"] == str(tmp_path / "ca")
    out = io.StringIO()
    assert main(["identity", "issue", "--out", str(tmp_path / "id"), *ca, "--json"], out=out) == 0
    issued = json.loads(out.getvalue())["pid"]
    out = io.StringIO()
    args = ["identity", "show", "--identity-dir", str(tmp_path / "id"), "--json"]
    assert main(args, out=out) == 0
    assert json.loads(out.getvalue())["pid"] == issued
    out = io.StringIO()
    assert main(["identity", "show", "--chain", str(tmp_path / "id" / "chain.pem")], out=out) == 0
    assert out.getvalue().startswith(f"pid: {issued}\n")


def test_errors_are_one_line_and_exit_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["identity", "show", "--chain", str(tmp_path / "missing.pem")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("chrysalis: error: cannot read")
    assert err.count("\n") == 1
    assert main(["serve", "--label", "role=boss", "--ca-dir", str(tmp_path)]) == 1
    assert "set by the command itself" in capsys.readouterr().err
    assert main(["serve", "--identity-dir", str(tmp_path / "none")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_scale_is_handed_to_the_scale_tool(capsys: pytest.CaptureFixture[str]) -> None:
    import io

    code = main(["scale", "--nodes", "0"], out=io.StringIO())
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err == "chrysalis-scale: error: nodes must be in 2..4096, got 0"
