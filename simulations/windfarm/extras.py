"""The optional dependencies a simulation run needs, checked before anything starts.

matplotlib (the ``simulation`` extra) draws the report's plots, the run's very last step, and
pyspark (the ``cloud`` extra) materialises the farm graph with ``--spark always`` (``auto``, the
default, runs a farm this small on the edge engine). Both are imported only where they are
used, so without this check a missing one is found minutes into the run, as a traceback.
Imported for real (not merely found): a broken install counts as missing too.
"""

from __future__ import annotations

import importlib

__all__ = ["missing_extras_message"]

# extra -> (module it provides, what the simulation needs it for)
EXTRAS = {
    "simulation": ("matplotlib", "the report's plots"),
    "cloud": ("pyspark", "the cloud's Spark job"),
}


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_extras_message(*, spark: bool) -> str | None:
    """One line naming what is missing and the install command, or None if nothing is."""
    needed = ["simulation", "cloud"] if spark else ["simulation"]
    missing = [extra for extra in needed if not _importable(EXTRAS[extra][0])]
    if not missing:
        return None
    what = "; ".join(
        f"{EXTRAS[extra][0]} ({EXTRAS[extra][1]}, the '{extra}' extra)" for extra in missing
    )
    line = (
        f"not installed: {what}. Install with: pip install -e '.[{','.join(missing)}]' "
        "(from the repository root)"
    )
    if "cloud" in missing:
        line += ", or run with --spark auto or never to do without Spark"
    return line
