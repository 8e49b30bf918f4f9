"""The host session protocol: its pure codec (property-based) and a worker daemon's answers to
a hello, in process over loopback UDP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor._hosts.attach_daemon import WorkerDaemon
from monarch.actor._hosts.attach_protocol import (
    ATTACH_PROTOCOL,
    MAX_SESSION_FRAME,
    PROTOCOL_VERSION,
    Detach,
    Exited,
    Heartbeat,
    Hello,
    Kill,
    KillProcs,
    Message,
    Refused,
    SessionDecoder,
    SessionProtocolError,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    Welcome,
    _Channel,
    _udp_address,
    encode_message,
)

text = st.text(max_size=40)
hex_pid = st.binary(min_size=16, max_size=16).map(bytes.hex)
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(
        Hello,
        st.integers(0, 10),
        text,
        st.floats(0.1, 60),
        st.none() | st.tuples(st.sampled_from(["name", "path"]), text),
        text,
    ),
    st.builds(Welcome, text, st.integers(1, 2**22), text),
    st.builds(Refused, text),
    st.builds(Spawn, st.integers(0, 2**31), st.lists(text, max_size=8)),
    st.builds(
        Spawned,
        st.integers(0, 2**31),
        st.lists(hex_pid, max_size=4),
        st.lists(st.integers(1, 2**22), max_size=4),
    ),
    st.builds(SpawnFailed, st.integers(0, 2**31), text),
    st.builds(Exited, hex_pid, text, st.integers(1, 2**22), st.integers(-64, 255)),
    st.builds(KillProcs, st.lists(hex_pid, max_size=4)),
    st.just(Heartbeat()),
    st.just(Detach()),
    st.just(Shutdown()),
    st.just(Kill()),
)


@given(st.lists(messages, max_size=6), st.integers(1, 64))
def test_messages_round_trip_in_any_chunking(batch: list[Message], chunk: int) -> None:
    data = b"".join(encode_message(m) for m in batch)
    decoder = SessionDecoder()
    out: list[Message] = []
    for start in range(0, len(data), chunk):
        decoder.feed(data[start : start + chunk])
        while (message := decoder.next()) is not None:
            out.append(message)
    assert out == batch
    assert decoder.next() is None


def test_an_oversize_length_prefix_is_refused_before_buffering() -> None:
    decoder = SessionDecoder()
    decoder.feed((MAX_SESSION_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(SessionProtocolError, match="over the bound"):
        decoder.next()


def test_an_oversize_prefix_is_refused_with_its_first_bytes_and_poisons_the_decoder() -> None:
    """The shared bounded decoder (``chrysalis.core.framing``): the prefix is refused as soon
    as its four bytes are known, with nothing of the body kept, and the decoder stays failed:
    a well-formed message fed after it is not decoded."""
    decoder = SessionDecoder()
    decoder.feed((MAX_SESSION_FRAME + 1).to_bytes(4, "big") + b"x" * 1000)
    with pytest.raises(SessionProtocolError, match="1048577 bytes is over the bound"):
        decoder.next()
    assert decoder.buffered == 0
    with pytest.raises(SessionProtocolError, match="over the bound"):
        decoder.feed(encode_message(Heartbeat()))
    with pytest.raises(SessionProtocolError, match="over the bound"):
        decoder.next()


def test_a_malformed_body_poisons_the_decoder() -> None:
    """After a malformed message the stream is out of step: later messages are refused with
    the same error instead of being decoded."""
    decoder = SessionDecoder()
    decoder.feed((3).to_bytes(4, "big") + b"\xc1\xc1\xc1" + encode_message(Heartbeat()))
    with pytest.raises(SessionProtocolError, match="malformed") as first:
        decoder.next()
    with pytest.raises(SessionProtocolError, match="malformed") as again:
        decoder.next()
    assert again.value is first.value
    assert decoder.buffered == 0


def test_malformed_bodies_and_oversize_spawns_are_refused() -> None:
    decoder = SessionDecoder()
    decoder.feed((3).to_bytes(4, "big") + b"\xc1\xc1\xc1")
    with pytest.raises(SessionProtocolError, match="malformed"):
        decoder.next()
    decoder = SessionDecoder()
    decoder.feed(encode_message(Spawn(1, ["x"] * 1025)))
    with pytest.raises(SessionProtocolError, match="spawn of 1025"):
        decoder.next()
    with pytest.raises(SessionProtocolError, match="over the bound"):
        encode_message(Refused("x" * (MAX_SESSION_FRAME + 1)))


def test_worker_addresses_are_normalised_or_refused() -> None:
    assert _udp_address("udp://localhost:7000") == "udp://127.0.0.1:7000"
    assert _udp_address("127.0.0.1:7000") == "udp://127.0.0.1:7000"
    assert _udp_address("udp://0.0.0.0:0", any_port=True) == "udp://0.0.0.0:0"
    # Monarch's tcp:// addresses: the same host and port over UDP.
    assert _udp_address("tcp://localhost:7000") == "udp://127.0.0.1:7000"
    assert _udp_address("tcp://0.0.0.0:0", any_port=True) == "udp://0.0.0.0:0"
    for bad in (
        "udp://127.0.0.1:0",
        "tcp://127.0.0.1:0",
        "udp://127.0.0.1:70000",
        "ipc:///tmp/x",
        "metatls://127.0.0.1:7000",
        "udp://:1",
        "tcp://",
    ):
        with pytest.raises(ValueError, match="udp://"):
            _udp_address(bad)


def test_a_daemon_refuses_a_wrong_version_and_welcomes_a_client(tmp_path: Path) -> None:
    from chrysalis.node import Node
    from chrysalis.quic import DevelopmentIdentityProvider

    ca = tmp_path / "ca"

    async def main() -> tuple[Message, Message]:
        daemon = WorkerDaemon("udp://127.0.0.1:0", ca, idle_timeout=3.0)
        ready = asyncio.Event()
        serving = asyncio.create_task(daemon.serve(lambda _: ready.set()))
        await asyncio.wait_for(ready.wait(), 20)
        from chrysalis.core import DatagramAddr

        identity = DevelopmentIdentityProvider(ca).issue_identity()
        async with Node.serve(identity, "udp://127.0.0.1:0") as node:
            address = DatagramAddr.parse(daemon.address)
            replies = []
            for version in (PROTOCOL_VERSION + 1, PROTOCOL_VERSION):
                _, stream = await node.transport.dial_link_local_unpinned(address, ATTACH_PROTOCOL)
                channel = _Channel(stream)
                await channel.send(Hello(version, "udp://127.0.0.1:9", 3.0))
                replies.append(await asyncio.wait_for(channel.recv(), 20))
            await channel.send(Shutdown())
            await asyncio.wait_for(serving, 20)
        return replies[0], replies[1]

    refused, welcome = asyncio.run(asyncio.wait_for(main(), 60))
    assert isinstance(refused, Refused)
    assert "protocol version" in refused.reason
    assert isinstance(welcome, Welcome)
