"""The device-free part of the ibverbs provider: discovery (devices, active ports), the QP
handshake codec, the region table. The test that needs a device skips cleanly without
``/dev/infiniband``; the provider itself is tested in ``test_verbs_provider.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.rdma import _ibverbs, get_rdma_backend, is_ibverbs_available
from monarch.rdma._verbs_proto import (
    MTU_BYTES,
    ConnectAccept,
    ConnectReject,
    ConnectRequest,
    HandshakeError,
    QpInfo,
    RegionInfo,
    RegionTable,
    decode,
    encode,
)


def test_discovery_needs_both_the_sysfs_device_and_its_uverbs_file(tmp_path: Path) -> None:
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    assert _ibverbs.list_devices(sysfs, dev) == []  # neither exists
    sysfs.mkdir()
    (sysfs / "mlx5_0").mkdir()
    dev.mkdir()
    assert _ibverbs.list_devices(sysfs, dev) == []  # no uverbs file
    (dev / "uverbs0").touch()
    assert _ibverbs.list_devices(sysfs, dev) == ["mlx5_0"]


def test_without_pyverbs_or_a_device_ibverbs_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ibverbs, "usable_devices", lambda: ["mlx5_0"])
    monkeypatch.setattr(_ibverbs, "pyverbs_importable", lambda: False)
    assert _ibverbs.is_ibverbs_available() is False
    monkeypatch.setattr(_ibverbs, "pyverbs_importable", lambda: True)
    assert _ibverbs.is_ibverbs_available() is True
    monkeypatch.setattr(_ibverbs, "usable_devices", list)
    assert _ibverbs.is_ibverbs_available() is False


def test_each_missing_piece_is_named_as_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    assert "does not exist" in (_ibverbs.unavailable_reason(sysfs, dev) or "")
    (sysfs / "mlx5_0").mkdir(parents=True)
    assert "no uverbs device file" in (_ibverbs.unavailable_reason(sysfs, dev) or "")
    dev.mkdir()
    (dev / "uverbs0").touch()
    monkeypatch.setattr(_ibverbs, "pyverbs_importable", lambda: False)
    assert "no port of mlx5_0 is active" in (_ibverbs.unavailable_reason(sysfs, dev) or "")
    (sysfs / "mlx5_0" / "ports" / "1").mkdir(parents=True)
    (sysfs / "mlx5_0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    assert "no port of mlx5_0 is active" in (_ibverbs.unavailable_reason(sysfs, dev) or "")
    (sysfs / "mlx5_0" / "ports" / "2").mkdir()
    (sysfs / "mlx5_0" / "ports" / "2" / "state").write_text("4: ACTIVE\n")
    assert _ibverbs.usable_devices(sysfs, dev) == ["mlx5_0"]
    assert "pyverbs is not installed" in (_ibverbs.unavailable_reason(sysfs, dev) or "")
    monkeypatch.setattr(_ibverbs, "pyverbs_importable", lambda: True)
    assert _ibverbs.unavailable_reason(sysfs, dev) is None


@pytest.mark.skipif(Path("/dev/infiniband").exists(), reason="an RDMA device exists here")
def test_without_a_device_ibverbs_is_unavailable_with_a_clear_reason() -> None:
    reason = _ibverbs.unavailable_reason()
    assert reason is not None
    assert reason.startswith("no RDMA device"), reason
    assert is_ibverbs_available() is False
    assert get_rdma_backend() == "tcp"


@pytest.mark.skipif(not Path("/dev/infiniband").exists(), reason="no /dev/infiniband here")
def test_a_device_is_discovered_where_one_exists() -> None:
    assert _ibverbs.list_devices()
    usable = bool(_ibverbs.usable_devices()) and _ibverbs.pyverbs_importable()
    assert is_ibverbs_available() == usable
    assert get_rdma_backend() == ("ibverbs" if usable else "tcp")


GID = bytes(range(16))
QP = QpInfo(lid=7, gid=GID, qp_num=0x123456, psn=0xABCDEF, mtu=5, port=1, gid_index=3)

qps = st.builds(
    QpInfo,
    lid=st.integers(0, 0xFFFF),
    gid=st.binary(min_size=16, max_size=16),
    qp_num=st.integers(0, 0xFFFFFF),
    psn=st.integers(0, 0xFFFFFF),
    mtu=st.sampled_from(sorted(MTU_BYTES)),
    port=st.integers(1, 255),
    gid_index=st.integers(0, 255),
)
regions = st.integers(1, 1 << 40).flatmap(
    lambda length: st.builds(
        RegionInfo,
        address=st.integers(0, (1 << 64) - length),
        length=st.just(length),
        rkey=st.integers(0, 0xFFFFFFFF),
    )
)
requests = st.integers(0, 0xFFFFFFFF)
messages = st.one_of(
    st.builds(ConnectRequest, request=requests, qp=qps),
    st.builds(ConnectAccept, request=requests, qp=qps, region=regions),
    st.builds(ConnectReject, request=requests, reason=st.text(max_size=200)),
)


@given(messages)
def test_every_message_round_trips(message: ConnectRequest | ConnectAccept | ConnectReject) -> None:
    assert decode(encode(message)) == message


@given(st.binary(max_size=128))
def test_any_bytes_decode_or_raise_handshake_error(data: bytes) -> None:
    try:
        message = decode(data)
    except HandshakeError:
        return
    assert encode(message) == data


@given(messages, st.data())
def test_truncated_or_extended_messages_are_refused(
    message: ConnectRequest | ConnectAccept | ConnectReject, data: st.DataObject
) -> None:
    wire = encode(message)
    cut = data.draw(st.integers(0, len(wire) - 1))
    with pytest.raises(HandshakeError):
        decode(wire[:cut])
    with pytest.raises(HandshakeError):
        decode(wire + b"\0")


def test_fields_out_of_range_are_refused() -> None:
    with pytest.raises(HandshakeError, match="qp_num"):
        QpInfo(lid=0, gid=GID, qp_num=1 << 24, psn=0, mtu=5, port=1, gid_index=0)
    with pytest.raises(HandshakeError, match="gid"):
        QpInfo(lid=0, gid=b"short", qp_num=1, psn=0, mtu=5, port=1, gid_index=0)
    with pytest.raises(HandshakeError, match="mtu"):
        QpInfo(lid=0, gid=GID, qp_num=1, psn=0, mtu=6, port=1, gid_index=0)
    with pytest.raises(HandshakeError, match="port"):
        QpInfo(lid=0, gid=GID, qp_num=1, psn=0, mtu=5, port=0, gid_index=0)
    with pytest.raises(HandshakeError, match="wraps"):
        RegionInfo(address=(1 << 64) - 1, length=2, rkey=1)
    with pytest.raises(HandshakeError, match="length"):
        RegionInfo(address=0, length=0, rkey=1)
    with pytest.raises(HandshakeError, match="reason"):
        ConnectReject(1, "x" * 1025)
    wire = bytearray(encode(ConnectRequest(1, QP)))
    wire[0:3] = b"XXX"
    with pytest.raises(HandshakeError, match="not a monarch-rdma"):
        decode(bytes(wire))
    wire = bytearray(encode(ConnectRequest(1, QP)))
    wire[3] = 9
    with pytest.raises(HandshakeError, match="version 9"):
        decode(bytes(wire))


def test_the_region_table_checks_accesses_against_live_registrations() -> None:
    table = RegionTable(limit=2)
    table.add(RegionInfo(address=0x1000, length=100, rkey=5))
    assert table.allows(5, 0, 100)
    assert table.allows(5, 99, 1)
    assert not table.allows(5, 99, 2)
    assert not table.allows(5, -1, 1)
    assert not table.allows(6, 0, 1)
    with pytest.raises(ValueError, match="already registered"):
        table.add(RegionInfo(address=0, length=1, rkey=5))
    table.add(RegionInfo(address=0, length=1, rkey=6))
    with pytest.raises(ValueError, match="at most 2"):
        table.add(RegionInfo(address=0, length=1, rkey=7))
    assert table.remove(5) is not None
    assert table.remove(5) is None
    assert not table.allows(5, 0, 1)
    assert len(table) == 1
