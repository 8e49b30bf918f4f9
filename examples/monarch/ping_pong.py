"""Ping and pong: two actor meshes on one process mesh, ``call_one`` and ``call``.

Written against Meta's Monarch API only; runs unchanged under the reference
``torchmonarch`` and under this repository's ``monarch-actor``.
"""

from __future__ import annotations

from monarch.actor import Actor, endpoint, this_host


class Pong(Actor):
    def __init__(self) -> None:
        self.served = 0

    @endpoint
    def ping(self, n: int) -> str:
        self.served += 1
        return f"pong {n}"

    @endpoint
    def served_count(self) -> int:
        return self.served


class Ping(Actor):
    def __init__(self, pong: Pong) -> None:
        self.pong = pong

    @endpoint
    def rally(self, rounds: int) -> list[str]:
        # A sync endpoint may block on another actor's future.
        return [self.pong.ping.call_one(i).get() for i in range(rounds)]


def main() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    pong = procs.spawn("pong", Pong)
    ping = procs.spawn("ping", Ping, pong)
    print("call_one:", pong.ping.call_one(7).get())
    print("rally:", ping.rally.call_one(3).get())
    replies = ping.rally.call(2).get()
    print("call values:", replies.values())
    print("served:", pong.served_count.call_one().get())
    procs.stop().get()
    print("stopped")


if __name__ == "__main__":
    main()
