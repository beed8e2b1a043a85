"""What a dry-run bundle reports (docs/operations.md, "Dry runs"): the verdict a real bundle
would get, the fact counts per predicate and the watched facts its change would make appear
and disappear, and what it cost: the time, and the agent's resident memory at its peak above
where it started.

The peak is the kernel's high-water mark of the process's resident set (``VmHWM`` in
``/proc/self/status``), reset before the dry run (``/proc/self/clear_refs``, Linux 4.0 and
later), so a short-lived allocation the engine freed before the end is counted: the figure a
memory budget and an out-of-memory killer care about. Where it cannot be reset or read, the
growth of the resident set from start to end is reported instead (a lower bound).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from agent.engine.budget import resident_memory
from agent.protocol.messages import (
    MAX_DRY_RUN_FACTS,
    MAX_DRY_RUN_PREDICATES,
    MAX_DRY_RUN_WATCHES,
    Bundle,
    DryRunReport,
    PredicateCount,
    WatchedChangeSummary,
    encode_fact,
)

WOULD_APPLY = "would apply"
_HIGH_WATER = re.compile(rb"VmHWM:\s+(\d+)\s+kB")


@dataclass
class Cost:
    """Filled in when the measured block ends."""

    seconds: float = 0.0
    memory_bytes: int = 0


def _high_water() -> int | None:
    try:
        with open("/proc/self/status", "rb") as status:
            found = _HIGH_WATER.search(status.read())
    except OSError:
        return None
    return int(found[1]) * 1024 if found else None


def _reset_high_water() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        return False
    return True


@contextmanager
def measured() -> Iterator[Cost]:
    """Time and peak memory growth of the block (see the module docstring)."""
    cost = Cost()
    start = resident_memory() or 0
    peak_known = _reset_high_water()
    began = time.perf_counter()
    try:
        yield cost
    finally:
        cost.seconds = time.perf_counter() - began
        peak = _high_water() if peak_known else None
        end = peak if peak is not None else (resident_memory() or 0)
        cost.memory_bytes = max(0, end - start)


def dry_run_report(
    bundle: Bundle,
    verdict: str,
    message: str,
    change: dict,
    cost: Cost,
    facts_before: int,
    *,
    at: float,
) -> DryRunReport:
    """The report of a dry run of ``bundle``: ``change`` is what ``AgentState.apply`` reported
    (empty when it was refused before or by the engine), a refusal's budget figures under
    ``budget``."""
    sizes = change.get("predicates", {})
    ordered = sorted(sizes.items(), key=lambda item: (-abs(item[1][1] - item[1][0]), item[0]))
    predicates = [
        PredicateCount(predicate=f"{name}/{arity}", before=before, after=after)
        for (name, arity), (before, after) in ordered[:MAX_DRY_RUN_PREDICATES]
    ]
    watched = [
        WatchedChangeSummary(
            watch=name,
            appeared=len(delta.appeared),
            disappeared=len(delta.disappeared),
            appeared_facts=[encode_fact(f) for f in sorted(delta.appeared, key=repr)][
                :MAX_DRY_RUN_FACTS
            ],
            disappeared_facts=[encode_fact(f) for f in sorted(delta.disappeared, key=repr)][
                :MAX_DRY_RUN_FACTS
            ],
        )
        for name, delta in sorted(change.get("events", {}).items())
        if delta.appeared or delta.disappeared
    ][:MAX_DRY_RUN_WATCHES]
    growth = sum(after - before for before, after in sizes.values())
    return DryRunReport(
        bundle_id=bundle.bundle_id,
        stream=bundle.source,
        version=bundle.version,
        verdict=verdict,
        message=message,
        facts_before=facts_before,
        facts_after=max(0, facts_before + growth),
        predicates=predicates,
        predicates_omitted=max(0, len(ordered) - MAX_DRY_RUN_PREDICATES),
        watched=watched,
        seconds=cost.seconds,
        memory_bytes=cost.memory_bytes,
        budget={k: v for k, v in change.get("budget", {}).items() if v is not None},
        at=at,
    )
