"""Benchmark: restarting an agent from its SQLite state vs recomputing the materialisation.

    python -m simulations.bench.restart [--quick]

For each (rule set, data set), in one run:

* ``recompute``: a fresh Reasoner loads the rules and explicit facts and materialises (what a
  restart would cost without saved derived facts);
* ``save``: the same change applied through ``AgentState`` (materialise + write everything in
  one transaction, WAL, synchronous=FULL), i.e. the first start;
* ``restart``: opening the file again, which loads terms, facts, rules and every hyper-node's
  derived facts and answers queries at once (no rule is evaluated);
* ``update``: one small fact change committed (the steady state of an agent), vs the same
  change in memory only.

Ratios are the figures to watch (absolute times on shared machines are noisy).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

from agent.engine import Reasoner
from agent.persistence import AgentState
from simulations.bench.datasets import ds1, ds2

RULES = Path(__file__).resolve().parents[2] / "rules" / "benchmarks"


def timed(action):
    gc.collect()
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def run_case(rule_file: str, data_name: str, facts: list) -> dict:
    rules = (RULES / rule_file).read_text()
    recompute, reasoner = timed(lambda: _materialise(rules, facts))
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "agent.db"
        state = AgentState(path)
        save, _ = timed(lambda: state.apply(add_rules=rules, add_facts=facts))
        state.close()
        restart, state = timed(lambda: AgentState(path))
        assert state.load_report.how == "loaded"
        assert state.reasoner.count() == reasoner.count()
        change = [facts[0]]
        update_disk, _ = timed(lambda: state.apply(delete_facts=change))
        update_mem, _ = timed(lambda: reasoner.update(delete_facts=change))
        size = os.path.getsize(path) + sum(
            os.path.getsize(p) for p in Path(directory).glob("agent.db-*")
        )
        state.close()
    return {
        "case": f"{rule_file[:-6].upper()} {data_name}",
        "facts": reasoner.count(),
        "recompute": recompute,
        "save": save,
        "restart": restart,
        "update_disk": update_disk,
        "update_mem": update_mem,
        "mb": size / 1e6,
    }


def _materialise(rules: str, facts: list) -> Reasoner:
    reasoner = Reasoner()
    reasoner.add_rules(rules)
    reasoner.add_facts(facts)
    return reasoner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data sets only")
    args = parser.parse_args(argv)
    if args.quick:
        cases = [("rs1.rules", "DS1(50)", ds1(50)), ("rs2.rules", "DS2(50)", ds2(50))]
    else:
        cases = [
            ("rs1.rules", "DS1(400)", ds1(400)),
            ("rs2.rules", "DS2(200)", ds2(200)),
            ("rs3.rules", "DS2(200)", ds2(200)),
        ]
    header = (
        f"{'case':<14}{'facts':>9}{'recompute s':>13}{'first save s':>14}{'restart s':>11}"
        f"{'restart/recompute':>19}{'update disk/mem':>17}{'file MB':>9}"
    )
    print(header)
    for rule_file, data_name, facts in cases:
        r = run_case(rule_file, data_name, facts)
        print(
            f"{r['case']:<14}{r['facts']:>9}{r['recompute']:>13.3f}{r['save']:>14.3f}"
            f"{r['restart']:>11.3f}{r['restart'] / r['recompute']:>19.2f}"
            f"{r['update_disk'] / max(r['update_mem'], 1e-9):>17.1f}{r['mb']:>9.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
