"""The ``shm`` provider's bookkeeping: maps parsing, share-or-copy, the slot allocator."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.rdma._memory import local_memory
from monarch.rdma._shm_proto import MustCopy, Shared, SlotAllocator, locate, parse_maps

MAPS = """\
55d0a0000000-55d0a0021000 r--p 00000000 08:01 1234 /usr/bin/python3.11
7f0000000000-7f0000100000 rw-s 00000000 00:01 4242 /memfd:weights (deleted)
7f0000100000-7f0000200000 rw-p 00000000 00:00 0
7f0000200000-7f0000300000 rw-s 00002000 00:19 77 /dev/shm/pool
7f0000300000-7f0000400000 rw-s 00000000 08:01 99 /home/user/data.bin
garbage line
7f0000400000-7f0000300000 rw-p 00000000 00:00 0
"""


def test_maps_lines_are_parsed_and_malformed_ones_skipped() -> None:
    entries = parse_maps(MAPS)
    assert len(entries) == 5
    assert entries[1].path == "/memfd:weights (deleted)"
    assert entries[1].shared
    assert not entries[2].shared
    assert entries[2].path == ""
    assert entries[3].offset == 0x2000


@pytest.mark.parametrize(
    ("address", "length", "expected"),
    [
        (0x7F0000000010, 16, Shared("/memfd:weights (deleted)", 4242, 0x10)),
        (0x7F0000200000, 0x100000, Shared("/dev/shm/pool", 77, 0x2000)),
        (0x7F00000FFFF0, 0x20, MustCopy("the region spans more than one mapping")),
        (0x7F0000100000, 8, MustCopy("private memory (anonymous)")),
        (0x7F0000300000, 8, MustCopy("a shared mapping of /home/user/data.bin")),
        (0x10, 8, MustCopy("the address is not mapped")),
        (0x7F0000000010, 0, MustCopy("an empty region")),
    ],
)
def test_a_region_is_shared_only_from_one_shareable_mapping(
    address: int, length: int, expected: Shared | MustCopy
) -> None:
    assert locate(parse_maps(MAPS), address, length) == expected


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd_create here")
def test_memory_of_a_memfd_mapping_is_found_in_this_process() -> None:
    fd = os.memfd_create("monarch-rdma-test")
    try:
        os.ftruncate(fd, 1 << 16)
        with mmap.mmap(fd, 1 << 16) as mapped:
            view = memoryview(mapped)[4096:8192]
            memory = local_memory(view)
            where = locate(parse_maps(Path("/proc/self/maps").read_text()), memory.address, 4096)
            assert isinstance(where, Shared), where
            assert where.path.startswith("/memfd:monarch-rdma-test")
            assert where.offset == 4096
            anonymous = local_memory(memoryview(bytearray(4096)))
            maps = parse_maps(Path("/proc/self/maps").read_text())
            assert isinstance(locate(maps, anonymous.address, 4096), MustCopy)
            del view, memory
    finally:
        os.close(fd)


def test_the_allocator_aligns_bounds_and_merges() -> None:
    slots = SlotAllocator(256, align=64)
    a = slots.allocate(1)
    b = slots.allocate(64)
    c = slots.allocate(100)
    assert (a, b, c) == (0, 64, 128)
    assert a is not None
    assert b is not None
    assert c is not None
    assert slots.allocate(1) is None  # full
    slots.release(b)
    slots.release(a)
    assert slots.free_ranges() == [(0, 128)]
    slots.release(c)
    assert slots.free_ranges() == [(0, 256)]
    with pytest.raises(KeyError):
        slots.release(c)
    with pytest.raises(ValueError):
        slots.allocate(0)
    with pytest.raises(ValueError):
        SlotAllocator(64, align=3)


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 300)), max_size=60))
def test_slots_never_overlap_and_all_come_back(steps: list[tuple[bool, int]]) -> None:
    slots = SlotAllocator(4096, align=16)
    held: dict[int, int] = {}
    for release, size in steps:
        if release and held:
            offset = sorted(held)[size % len(held)]
            del held[offset]
            slots.release(offset)
        else:
            offset_or_none = slots.allocate(size)
            if offset_or_none is not None:
                held[offset_or_none] = -(-size // 16) * 16
        ranges = sorted([*held.items(), *slots.free_ranges()])
        position = 0
        for start, length in ranges:  # used and free ranges tile the segment exactly
            assert start == position
            position += length
        assert position == 4096
        free = slots.free_ranges()
        assert all(sum(free[i]) < free[i + 1][0] for i in range(len(free) - 1))  # merged
    for offset in list(held):
        slots.release(offset)
    assert slots.free_ranges() == [(0, 4096)]
