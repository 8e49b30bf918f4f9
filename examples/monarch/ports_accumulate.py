"""Broadcast, Accumulator, ports and channels.

``broadcast`` is fire-and-forget but ordered with the sender's later messages; an
``Accumulator`` folds a stream of replies; a ``Port`` opened with ``Channel.open()`` is
a handle another actor can send to, and explicit-response-port endpoints reply
through one.

Written against Meta's Monarch API only; runs unchanged under the reference
``torchmonarch`` and under this repository's ``monarch-actor``.
"""

from __future__ import annotations

import operator

from monarch.actor import (
    Accumulator,
    Actor,
    Channel,
    Port,
    context,
    endpoint,
    this_host,
)


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int) -> None:
        self.value += by

    @endpoint
    def value_now(self) -> int:
        return self.value

    @endpoint
    def report_to(self, port: Port[tuple[int, int]], times: int) -> None:
        gpu = context().actor_instance.rank["gpus"]
        for i in range(times):
            port.send((gpu, self.value * 100 + i))

    @endpoint(explicit_response_port=True)
    def later(self, port: Port[str], word: str) -> None:
        port.send(word.upper())


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = procs.spawn("counters", Counter, 10)

    counters.incr.broadcast(1)
    counters.slice(gpus=slice(2, 4)).incr.broadcast(5)
    print("values:", counters.value_now.call().get().values())

    total: Accumulator[[], int, int] = Accumulator(counters.value_now, 0, operator.add)
    print("sum:", total.accumulate().get())
    largest: Accumulator[[], int, int] = Accumulator(counters.value_now, 0, max)
    print("max:", largest.accumulate().get())
    print("stream:", sorted(f.get() for f in counters.value_now.stream()))

    port, receiver = Channel[tuple[int, int]].open()
    counters.report_to.broadcast(port, 3)
    received = [receiver.recv().get() for _ in range(12)]
    per_sender: dict[int, list[int]] = {}
    for gpu, value in received:
        per_sender.setdefault(gpu, []).append(value)
    for gpu in sorted(per_sender):
        # Each sender's messages arrive in the order they were sent.
        print(f"port from gpus={gpu}:", per_sender[gpu])

    print("explicit port:", counters.slice(gpus=3).later.call_one("ok").get())
    print("explicit port call:", counters.later.call("hi").get().values())
    procs.stop().get()
    print("stopped")


if __name__ == "__main__":
    main()
