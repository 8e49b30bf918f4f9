"""A program for ``monarch top``'s tests: two worker processes of ``Ticker`` actors, called until
its stdin closes; the admin endpoint comes from ``MONARCH_ADMIN_PORT`` (its token on stderr)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from admin_actors import Ticker

from monarch.actor import this_host

if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    tickers = procs.spawn("tickers", Ticker)
    tickers.tick.call().get(timeout=30)
    print("ready", flush=True)
    done = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    while not done.wait(0.02):  # the workload's pace, until the test closes our stdin
        tickers.tick.call().get(timeout=30)
    procs.stop().get(timeout=30)
    print("program done", flush=True)
