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


def speedup(reference: float, seconds: float) -> float:
    """How many times faster ``seconds`` is than ``reference`` (infinite for no time at all)."""
    return reference / seconds if seconds else float("inf")
