"""Meshes are named-dimension rectangles: slicing, extents, points and ValueMesh.

Written against Meta's Monarch API only; runs unchanged under the reference
``torchmonarch`` and under this repository's ``monarch-actor``.
"""

from __future__ import annotations

from monarch.actor import Actor, context, current_rank, current_size, endpoint, this_host


class Where(Actor):
    @endpoint
    def spawn_rank(self) -> dict[str, int]:
        rank = context().actor_instance.rank
        return {label: rank[label] for label in rank}

    @endpoint
    def message_rank(self) -> str:
        return f"{current_rank()} of {current_size()}"

    @endpoint
    def square(self) -> int:
        rank = context().actor_instance.rank
        return (rank["hosts"] * 3 + rank["gpus"]) ** 2


def main() -> None:
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 3})
    print("proc extent:", procs.extent)
    print("len:", len(procs), "sizes:", procs.sizes, "size(gpus):", procs.size("gpus"))
    where = procs.spawn("where", Where)
    print("actor extent:", where.extent)

    squares = where.square.call().get()
    print("values:", squares.values())
    print("len(values):", len(squares))
    for point, value in squares.items():
        print(f"  {point} rank={point.rank} -> {value}")
    print("item(hosts=1, gpus=2):", squares.item(hosts=1, gpus=2))
    print("flatten:", squares.flatten("r").slice(r=4).item())

    row = where.slice(hosts=1)
    print("slice(hosts=1) extent:", row.extent)
    print("slice(hosts=1) values:", row.square.call().get().values())
    column = where.slice(gpus=slice(1, 3))
    print("slice(gpus=1:3) extent:", column.extent)
    print("slice(gpus=1:3) spawn ranks:", column.spawn_rank.call().get().values())
    strided = where.slice(hosts=0, gpus=slice(0, 3, 2))
    print("strided message ranks:", strided.message_rank.call().get().values())
    print("one rank:", where.slice(hosts=1, gpus=0).message_rank.call_one().get())
    print("value mesh slice:", squares.slice(gpus=1).values())
    print(squares)
    print(squares.slice(hosts=1))

    try:
        where.slice(gpus=3)
    except IndexError as error:
        print("IndexError:", error)
    try:
        where.slice(nodes=0)
    except TypeError:
        print("TypeError for an unknown dimension")
    try:
        where.square.call_one()
    except ValueError as error:
        print("ValueError:", error)
    procs.stop().get()
    print("stopped")


if __name__ == "__main__":
    main()
