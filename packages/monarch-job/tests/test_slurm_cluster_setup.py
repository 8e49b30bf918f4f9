"""The test Slurm cluster's setup says why it cannot start (the Slurm tests skip with that), and
writes a configuration of one controller and two node names with their own addresses."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _slurm_cluster
from _slurm_cluster import SlurmUnavailable, ensure_installed, slurm_conf


def test_without_slurm_and_root_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_slurm_cluster, "_missing", lambda: ["slurmd"])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SlurmUnavailable, match=r"not installed \(slurmd\) and we are not root"):
        ensure_installed()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    with pytest.raises(SlurmUnavailable, match="no apt-get"):
        ensure_installed()


def test_nothing_is_installed_when_every_binary_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_slurm_cluster, "_missing", list)
    assert ensure_installed() == 0.0


def test_the_configuration_has_two_nodes_with_their_own_address_and_port(tmp_path: Path) -> None:
    conf = slurm_conf(tmp_path, (("n1", "127.0.0.2"), ("n2", "127.0.0.3")), 20000)
    lines = conf.splitlines()
    nodes = [line for line in lines if line.startswith("NodeName=")]
    assert [n.split()[0:2] for n in nodes] == [
        ["NodeName=n1", "NodeAddr=127.0.0.2"],
        ["NodeName=n2", "NodeAddr=127.0.0.3"],
    ]
    assert "Port=20001" in nodes[0]
    assert "Port=20002" in nodes[1]
    assert "SlurmctldPort=20000" in lines
    assert f"AuthInfo=socket={tmp_path}/munge/munge.sock" in lines
    assert "PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP" in lines
    assert all(str(tmp_path) in line for line in lines if "File=" in line or "Location=" in line)
