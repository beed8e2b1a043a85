"""The benchmarks' one stopwatch."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


def timed(action: Callable[[], object]) -> float:
    """Seconds taken by ``action``, after a full collection (so garbage left by earlier work is
    not collected, and charged, in the middle of this)."""
    gc.collect()
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


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
