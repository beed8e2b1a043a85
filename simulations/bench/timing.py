"""The benchmarks' one stopwatch."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

# The clock ``timed`` reads: wall time, or with ``use_cpu_clock`` the CPU time of the process
# (every thread's), which a machine shared with other work does not inflate: there a process
# waiting for a core is charged nothing, where wall time charges it all.
CLOCK = [time.perf_counter]


def use_cpu_clock(cpu: bool = True) -> None:
    """Time with the process's CPU time (``time.process_time``) instead of wall time."""
    CLOCK[0] = time.process_time if cpu else time.perf_counter


def clock() -> float:
    """The current reading of the benchmarks' clock (see ``CLOCK``)."""
    return CLOCK[0]()


def timed(action: Callable[[], object]) -> float:
    """Seconds taken by ``action``, after a full collection (so garbage left by earlier work is
    not collected, and charged, in the middle of this)."""
    gc.collect()
    started = clock()
    action()
    return clock() - started


def set_aside() -> None:
    """Keep what is alive now out of the collections ``timed`` makes (``gc.freeze``): for a
    benchmark's own long-lived data, the facts it checks each result against. A collection
    walks every object it tracks, and walking a few hundred thousand reference tuples right
    before a sub-millisecond update left that update to refill the CPU caches, which made it
    up to twice as slow as the same update in an agent (which holds no such data, and whose
    engine freezes its own state after a materialisation: agent/engine/gcpause.py). Objects
    set aside are still freed when dropped (reference counting); `bring_back` undoes it once
    they are."""
    gc.collect()
    gc.freeze()


def bring_back() -> None:
    """Undo `set_aside` (so that the collections see those objects again)."""
    gc.unfreeze()


def speedup(reference: float, seconds: float) -> float:
    """How many times faster ``seconds`` is than ``reference`` (infinite for no time at all)."""
    return reference / seconds if seconds else float("inf")
