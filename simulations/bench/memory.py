"""The benchmarks' one memory gauge: what building a materialisation costs in memory.

Two figures, because neither alone tells the truth:

* **traced**: the peak and the retained size of Python allocations (``tracemalloc``) while the
  action runs. It sees every Python object, but not memory a C extension takes from ``malloc``
  itself (pyroaring's bitmaps, SQLite's page cache): a store kept in such structures would look
  free.
* **RSS**: the growth of the process's resident set over the action, which sees everything but
  also counts freed memory the allocator keeps for later.

Each measurement runs in a fresh child of a clean server process (multiprocessing's
"forkserver"): a child forked from the benchmark itself would reuse the memory earlier cases
freed, already resident, and show less growth than a new process has. Tracing (which slows
allocation down) never touches a timing. ``build`` and ``count`` must therefore be module-level
functions, and ``args`` picklable.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

from agent.engine.update.reclaim import RECLAIMER

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Footprint:
    facts: int
    traced_peak: int  # bytes
    traced_kept: int  # bytes still allocated when the action returned, result alive
    rss: int  # bytes of resident-set growth, result alive

    def per_fact(self, size: int) -> float:
        return size / self.facts if self.facts else float("nan")


def resident() -> int:
    """The process's resident set size in bytes (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def footprint(
    build: Callable[..., object], count: Callable[[object], int], *args: object
) -> Footprint:
    """Memory taken by ``build(*args)`` (and held by what it returns), ``count(result)`` facts.

    Two children: one for RSS, untraced, one under tracemalloc."""
    rss, facts = _in_child(_rss_of, build, count, args)
    peak, kept = _in_child(_traced_of, build, count, args)
    return Footprint(facts=facts, traced_peak=peak, traced_kept=kept, rss=rss)


def resident_growth(
    build: Callable[..., object],
    count: Callable[[object], int],
    *args: object,
    prepare: Callable[..., object] | None = None,
) -> tuple[int, int]:
    """(RSS growth, ``count(result)``) of ``build(*args)`` in one fresh child, untraced: for
    builds whose memory the tracer cannot see (another engine's, allocated in Rust or C++).
    ``prepare(*args)`` runs first, outside the measurement (importing the engine's module)."""
    if prepare is None:
        return _in_child(_rss_of, build, count, args)
    return _in_child(_rss_prepared, build, count, (prepare, args))


def fact_count(reasoner: object) -> int:
    """``footprint``'s count for a build that returns a Reasoner: its distinct facts."""
    return reasoner.count()  # type: ignore[attr-defined]


def _settled(build, args) -> object:
    """``build(*args)``, then what the engine's reclaimer holds freed (objects an update let
    go, which it frees off the update's path moments later: not memory the result keeps)."""
    result = build(*args)
    RECLAIMER.drain()
    gc.collect()
    return result


def _rss_of(build, count, args) -> tuple[int, int]:
    gc.collect()
    before = resident()
    result = _settled(build, args)
    return resident() - before, count(result)


def _rss_prepared(build, count, args) -> tuple[int, int]:
    prepare, args = args
    prepare(*args)
    return _rss_of(build, count, args)


def _traced_of(build, count, args) -> tuple[int, int]:
    gc.collect()
    tracemalloc.start()
    result = _settled(build, args)
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del result
    return peak, kept


def _child(sender, measure, build, count, args) -> None:
    sender.send(measure(build, count, args))
    sender.close()


def _in_child(measure, build, count, args) -> tuple[int, int]:
    context = multiprocessing.get_context("forkserver")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, measure, build, count, args))
    process.start()
    sender.close()
    try:
        found = receiver.recv()
    except EOFError:
        raise RuntimeError("the memory measurement's child process died") from None
    process.join()
    return found


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f}"
