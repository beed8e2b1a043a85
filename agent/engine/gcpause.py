"""Pausing Python's cyclic garbage collector while an update runs.

Why: an update creates and drops hundreds of thousands of small containers (fact tuples, index
buckets), and CPython's cyclic collector runs every few hundred allocations, each full pass
walking every live container, i.e. the whole materialisation. None of the engine's data forms
reference cycles (tuples of ints, sets and dicts of them), so those passes find nothing: on
RS2 over DS2(200) they were about a third of the materialisation time. Reference counting still
frees everything as usual.

Pausing alone would only defer the cost: the first collection after the update would walk every
object the update created. So when an update leaves many new objects (more than
``FREEZE_AT``), or changes more facts than that (its few new sets may then hold that many
references each), the objects then alive are moved to the collector's permanent generation
(``gc.freeze``): it never walks the materialisation again. Small updates (an agent's usual
ones) freeze nothing: the next ordinary collection walks their few objects.
Facts that are deleted later are still freed at once, by reference counting; only garbage
*cycles* among frozen objects would never be reclaimed, and the engine creates none (compiled
rule functions are kept out of their own globals for this reason). The freeze applies to the
whole process, so a host application's objects alive at that moment are frozen too: harmless
for them, and the same trade-off CPython documents for ``gc.freeze`` in long-lived servers.
The threshold also bounds that effect: unrelated garbage cycles are frozen only at a large
update. If the caller had disabled the collector, nothing is frozen and it stays disabled.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FREEZE_AT", "Pause", "collector_paused"]

# New container objects left by an update (or facts it changed) above which they are frozen
# rather than walked.
FREEZE_AT = 10_000


class Pause:
    """The ``with`` target of `collector_paused`: set ``large`` when the block changed many
    facts. Few new objects can still hold many references (a set of 80,000 removed facts is
    one object), and the collector walks every reference of every young container: without
    a freeze, the first collection after such an update walks them all (RS1 over DS1(400),
    one edge deleted, in simulations.bench.incremental)."""

    __slots__ = ("large",)

    def __init__(self) -> None:
        self.large = False


@contextmanager
def collector_paused() -> Iterator[Pause]:
    """Disable the cyclic collector for the ``with`` block, then freeze what is alive (when the
    block left more than ``FREEZE_AT`` new objects, or was marked ``large``) and restore the
    caller's setting."""
    was_enabled = gc.isenabled()
    gc.disable()
    pause = Pause()
    try:
        yield pause
    finally:
        if was_enabled:
            if pause.large or gc.get_count()[0] > FREEZE_AT:
                gc.freeze()
            gc.enable()
