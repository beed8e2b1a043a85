"""Smoke test of ``simulations.bench.incremental``: its ``--quick`` mode runs in about a second,
prints the table, and every incremental update equals materialising its final state from
scratch (the benchmark doubles as an end-to-end check of the incremental engine)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from simulations.bench import incremental, program_size


def quick_row_count(groups: list[str]) -> int:
    """Rows the quick run prints for these groups: one per step of each case."""
    return sum(len(case.steps) for name in groups for case in incremental.GROUPS[name][1](True))


def table_rows(out: str) -> list[str]:
    """The table's data lines (not the header, rule, group titles or targets)."""
    return [line for line in out.splitlines() if any(f" {w} " in line for w in ("OK", "MISMATCH"))]


def test_quick_run_prints_table_with_equal_results(capsys):
    status = incremental.main(["--quick", "--no-bytes"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.splitlines()[0].split()[:2] == ["scenario", "data"]
    for title, _ in incremental.GROUPS.values():
        assert f"# {title}" in out
    rows = table_rows(out)
    assert len(rows) == quick_row_count(list(incremental.GROUPS))
    assert all(" OK " in row for row in rows), out
    assert "MISMATCH" not in out and "ERROR" not in out
    assert 'Targets, read on "again"' in out
    assert "net change at most 10%: at least 5x faster" in out
    assert "the leaf r18 added at DS2(800)" in out
    # Every row's net change was measured on the checking pass: a percentage, not "nan%".
    changes = [row.split()[row.split().index("OK") - 9] for row in rows]
    assert all(change.endswith("%") and change != "nan%" for change in changes), rows
    # Every update, of facts or of rules, is timed again after undoing it (a running agent).
    again = {row.split("  ")[0]: row.split()[row.split().index("OK") - 5] for row in rows}
    assert float(again["RS1 change a reading"]) > 0 and float(again["RS1 delete r1"]) > 0, rows
    assert float(again["close the cycle"]) > 0, rows
    assert "rows equal the from-scratch materialisation" in out


def test_mismatch_sets_exit_status(capsys, monkeypatch):
    real = incremental.from_scratch

    def missing_one_fact(state, repeat):
        reference = real(state, repeat)
        return replace(reference, facts=reference.facts - {next(iter(reference.facts))})

    monkeypatch.setattr(incremental, "from_scratch", missing_one_fact)
    status = incremental.main(["--quick", "--only", "rs3", "--no-bytes"])
    out = capsys.readouterr().out
    assert status == 1
    rows = table_rows(out)
    assert len(rows) == quick_row_count(["rs3"])
    assert all("MISMATCH" in row for row in rows)


# ------------------------------------------------------------------ simulations.bench.spark
# Spark against the engine: tiny sizes on the test session's shared SparkSession (conftest).


def test_spark_benchmark_prints_table_and_reading(spark, capsys):
    """The STC series only: Spark takes ~20 s per RS2 case whatever its size (one job per rule
    and round), and RS2 on Spark is checked against the engine in tests/cloud/test_spark.py."""
    from simulations.bench import spark as bench

    status = bench.main(["--widths", "--ds1", "10", "20", "--no-warmup", "--no-fixed-cost"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    lines = captured.out.splitlines()
    assert lines[1].split()[:4] == ["case", "out", "facts", "engine"]
    rows = [line.split() for line in lines if line.startswith(("RS2 DS2(", "STC DS1("))]
    assert [row[:2] for row in rows] == [["STC", "DS1(10)"], ["STC", "DS1(20)"]]
    assert rows[1][2] == str(20 * 19)  # n(n - 1) hasNeighbour facts
    assert all(row[3] != "-" and row[4] != "-" for row in rows)  # both sides timed
    assert "results equal" in captured.err
    assert any(line.startswith("STC: Spark ") for line in lines), captured.out
    assert captured.out.count("time ~ facts^") == 2
    assert "over 2 case(s)" in captured.out  # a fitted line per side
    assert spark.range(3).count() == 3  # the shared session was reused, not stopped


def test_spark_benchmark_time_out_skips_larger_cases(spark):
    from simulations.bench import spark as bench

    rows = bench.run(spark, [5, 10], [], timeout=1.0, report=lambda _: None)
    assert [row.engine is not None for row in rows] == [True, True]
    assert [row.spark for row in rows] == [None, None]  # cancelled, then skipped
    assert all("spark > 1 s at DS2(5)" in row.note for row in rows)
    assert spark.range(3).count() == 3  # cancelling left the session usable


def test_spark_benchmark_mismatch_is_loud():
    from agent.engine import Reasoner
    from simulations.bench import spark as bench

    case = bench.stc_case(5)
    reasoner = Reasoner()
    reasoner.add_facts(case.facts)
    reasoner.add_rules(case.program)
    want = bench.engine_counts(reasoner)
    counts = dict(want)
    bench.check_equal(case, want, None, None, counts)  # counts only: equal
    counts[("hasNeighbour", 2)] -= 1
    with pytest.raises(bench.MismatchError, match="hasNeighbour"):
        bench.check_equal(case, want, None, None, counts)


# ------------------------------------------------------------------ simulations.bench.explain


def test_explain_benchmark_prints_every_case_and_the_target(capsys):
    from simulations.bench import explain

    assert explain.main(["--quick", "--sample", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines()[2:] if line and not line.startswith("Target")]
    assert len(rows) == len(explain.cases(quick=True))
    assert "Target: every explanation" in out


# ------------------------------------------------------ simulations.bench.materialise / .restart
def memory_rows(out: str, title: str) -> list[list[str]]:
    """The rows of the memory table, which follows the header line containing ``title``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    return [line.split() for line in lines[start + 1 :] if line.strip() and set(line) != {"-"}]


def test_materialise_benchmark_prints_memory_per_fact(capsys):
    from simulations.bench import materialise

    assert materialise.main(["--quick", "--repeat", "1"]) == 0
    rows = memory_rows(capsys.readouterr().out, "RSS B/fact")
    assert len(rows) == len(materialise.cases(quick=True))
    for row in rows:  # rules data facts peak kept kept/fact rss rss/fact
        facts, peak, kept, per_fact = int(row[2]), float(row[3]), float(row[4]), float(row[5])
        assert facts > 0 and peak >= kept > 0
        assert 0 < per_fact < 2000  # bitmaps keep a fact in a few bytes; not a gigabyte


@pytest.mark.process
def test_restart_benchmark_prints_memory_after_recompute_and_restart(capsys):
    from simulations.bench import restart

    assert restart.main(["--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rows = memory_rows(out, "restart: kept B/fact")
    assert len(rows) == 3
    for row in rows:  # case (two words), facts, then kept and RSS per fact: recompute, restart
        assert int(row[2]) > 0 and float(row[3]) > 0 and float(row[5]) > 0
    # The sides again, each run in a process of its own: every figure measured, until the
    # first answered query and until the first update after it, with the target's verdict.
    table = out.split("In new processes", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    cases = [["RS1", "DS1(50)"], ["RS2", "DS2(50)"], ["RDFS", "university(1)"]]
    assert [line.split()[:2] for line in table] == cases
    for line in table:
        found = re.fullmatch(
            r"(.*x)  (>= 5x back to work|back to work < 10 ms): (met|NOT met)", line
        )
        assert found, line
        recompute, restart_s, query, to_answer, first, back, back_ratio = found[1].split()[2:]
        assert float(recompute) > 0 and float(restart_s) > 0 and float(query) > 0
        assert float(first) > 0 and float(back) > 0
        assert to_answer.endswith("x") and back_ratio.endswith("x")


# ------------------------------------------------------------------ simulations.bench.bitmaps
def test_bitmap_benchmark_compares_both_sides_on_every_row(capsys):
    from simulations.bench import bitmaps

    assert bitmaps.main(["--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.rstrip().endswith((" ms", " B"))]
    assert len(rows) == 2 * 7 + 3  # seven rows per workload, three for the closure
    for line in rows:  # (a tiny run's memory growth may round to no new page)
        set_side, bitmap_side = (float(x) for x in line.split()[-4:-2])
        assert set_side >= 0 and bitmap_side >= 0
        assert line.endswith(" B") or (set_side > 0 and bitmap_side > 0)


# ------------------------------------------------------------------ simulations.bench.peers
@pytest.mark.process
def test_peer_benchmark_runs_both_engines_and_they_agree(capsys):
    """Each side in its own process, on the same CSV file; the fact counts must agree (the
    benchmark exits 1 on a mismatch)."""
    from simulations.bench import peers

    assert peers.main(["--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if "total time" not in line]
    sides = [row[0] for row in rows if row and row[0] in peers.SIDES]
    assert sides == ["ours", "ours-no-modules", "nemo", "clingo", "ours", "nemo", "clingo"]
    assert "MISMATCH" not in out and out.count("total time:") == 3


# ------------------------------------------------------ memory in .incremental and .modules
def test_program_size_benchmark_prints_every_column_for_every_size(capsys):
    assert program_size.main(["--quick"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["rules", "hyper-nodes"]
    for column in program_size.COLUMNS:
        assert f"{column} ms" in lines[0]
    sizes = [line.split() for line in lines[1:3]]
    assert [row[0] for row in sizes] == ["10", "40"]
    # (rules, hyper-nodes, a column per step, facts, kept and RSS bytes per fact)
    assert all(len(row) == 2 + len(program_size.COLUMNS) + 3 for row in sizes)
    assert "Ratio to 10 rules" in out
    ratios = lines[-1].split()
    assert ratios[0] == "40" and len(ratios) == 1 + len(program_size.COLUMNS), out


def test_incremental_benchmark_prints_peak_memory_per_row(capsys):
    assert incremental.main(["--quick", "--only", "rs3", "--memory", "--no-bytes"]) == 0
    out = capsys.readouterr().out
    rows = memory_rows(out, "update peak MB")
    rows = [row for row in rows if row[0] == "RS3"]
    assert len(rows) == quick_row_count(["rs3"])
    for row in rows:  # RS3 name data update-MB scratch-MB ratio
        assert float(row[4]) > 0 and float(row[5]) > 0


def test_modules_benchmark_prints_memory_of_both_sides(capsys):
    from simulations.bench import modules

    assert modules.main(["--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("memory, ")]
    assert [line.split()[1] for line in lines] == ["module", "seminaive"]
    assert all(float(line.split()[3]) > 0 for line in lines)
    # Both ways a reader may read the closure: building its tuples, or one pass through it.
    reads = [line for line in out.splitlines() if line.startswith(("+ first full", "+ one read"))]
    assert len(reads) == 2 and all(float(line.split()[5]) >= 0 for line in reads)
    # Linear TC: the three ways of writing the closure, each with the module that takes it.
    linear = [line.split(maxsplit=2) for line in out.splitlines() if line.startswith("DAG(100)")]
    assert [row[1] for row in linear] == ["non-linear", "right-linear", "left-linear"]
    assert "transitive" in linear[0][2] and "linear closure (right-linear)" in linear[1][2]
    assert "linear closure (left-linear)" in linear[2][2]


# ------------------------------------------------------------------ simulations.bench.hypertree
@pytest.mark.process
def test_hypertree_benchmark_quick_run(capsys):
    """Both sides agree after every step (the benchmark exits otherwise), every expression rule
    is decomposed, and the hash-seed spread finds the same plans in fresh processes."""
    from simulations.bench import hypertree

    hypertree.main(
        ["--quick", "--repeat", "1", "--no-memory", "--seeds", "2", "--only", "expressions"]
    )
    out = capsys.readouterr().out
    assert "expressions:" in out and "'cyclic': 3, 'decomposed': 3" in out
    for step in hypertree.STEPS:
        assert f"  {step} " in out
    assert "identical in all: True" in out


# ------------------------------------------------------------------ simulations.bench.equality
def test_equality_benchmark_checks_every_step_against_the_axioms(capsys):
    """Small sizes: each step's result is compared with axiomatised equality (the benchmark
    exits 1 on a mismatch), and every row is printed for both class sizes."""
    from simulations.bench import equality

    assert equality.main(["--quick", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    out = "\n".join(lines)
    steps = ["materialise", "delete 100", "delete 1,000", "delete 5,000", "split largest"]
    for step in steps:
        assert sum(line.strip().startswith(step + " ") for line in lines) == 2, step
    assert "largest class 40 names" in out


def test_equality_benchmark_compares_large_models_by_classes_and_normal_forms(monkeypatch):
    """Above EXPANDED_CHECK_LIMIT expanded facts, without the axiomatised side, results are
    compared by their classes and facts in normal form (as values); a changed class or a
    missing fact is still a mismatch."""
    from simulations.bench import equality

    monkeypatch.setattr(equality, "EXPANDED_CHECK_LIMIT", 0)
    facts = equality.university(6, departments=2, students=5)
    model = equality._model(equality.rewriting(facts), expanded=False)
    classes, normal = model
    assert max(map(len, classes)) >= 6 and normal  # (the star, its aliases and more)
    assert model == equality._model(equality.rewriting(list(reversed(facts))), expanded=False)
    star_link = next(f for f in facts if f[0] == equality.OWL_SAME_AS)
    split = equality._model(
        equality.rewriting([f for f in facts if f != star_link]), expanded=False
    )
    with pytest.raises(SystemExit):
        equality._check(split, model, "split")


def test_sweep_benchmark_checks_every_update_against_recomputing(capsys):
    """``simulations.bench.sweep --quick``: every program's updates (a fact of each relation
    deleted and added, entities leaving) are printed with their speed-up, checked equal to
    recomputing; the closing lines say which small updates are slower and that all agree."""
    from simulations.bench import sweep

    assert sweep.main(["--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rows = [
        line for line in out.splitlines() if line.endswith(("OK", "MISMATCH")) or " OK " in line
    ]
    for name in ("RS1", "RS2", "RS3", "farm"):
        assert any(row.startswith(name) for row in rows), name
    assert any("leaves" in row for row in rows) and any("delete one" in row for row in rows)
    assert "MISMATCH" not in out
    assert f"All {len(rows)} rows equal the from-scratch materialisation." in out
    assert "slower than recomputing:" in out and "slower than recomputing made again:" in out


def test_sweep_benchmark_reports_a_wrong_update(capsys, monkeypatch):
    """An engine whose updates forget their deletions: the sweep says MISMATCH and fails."""
    from agent.engine import Reasoner
    from simulations.bench import sweep

    real_update = Reasoner.update

    def forgetful(self, **kwargs):
        kwargs.pop("delete_facts", None)
        return real_update(self, **kwargs)

    quick = sweep.workloads(True)[:1]
    monkeypatch.setattr(sweep, "workloads", lambda _quick: quick)
    monkeypatch.setattr(Reasoner, "update", forgetful)
    assert sweep.main(["--quick", "--repeat", "1"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


@pytest.mark.process
def test_incremental_benchmark_prints_bytes_per_stored_fact_on_every_row(capsys):
    assert incremental.main(["--quick", "--only", "cycle"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert len(rows) == quick_row_count(["cycle"])
    for row in rows:  # ... freed-later, kept B/fact, RSS B/fact, OK
        cells = row.split()
        kept, rss = cells[cells.index("OK") - 2 : cells.index("OK")]
        assert 0 < float(kept) < 2000 and float(rss) >= 0


# ------------------------------------------------------------------ simulations.bench.windows


def test_windows_benchmark_ticks_equal_recomputing_and_both_rules_hold(capsys):
    """A tick (arrivals and expiry in one update) leaves the reasoner equal to recomputing
    the window rules over the windows' facts, and the data make both rules hold somewhere."""
    from simulations.bench import windows

    argv = ["--sensors", "10", "--ticks", "1", "7", "--repeat", "2", "--no-memory"]
    status = windows.main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "windows of 10 min (6000 facts) and 2 min (1200 facts)" in out
    rows = [line for line in out.splitlines() if line.lstrip().startswith("tick of")]
    assert len(rows) == 2 and all(row.endswith("equal") for row in rows), rows
    # the agent's path (window module, SQLite state) ends equal to recomputing too
    agent = [line for line in out.splitlines() if line.lstrip().startswith("agent, tick of")]
    assert len(agent) == 2 and all(row.endswith("equal") for row in agent), agent
    # 10 sensors: two frozen (0, 5), two warming (1, 6); a tick of 7 s brings 70 readings
    assert all("stuck 2 rising 2" in row for row in rows), rows
    assert "70 readings in" in rows[1] and "140 facts expired" in rows[1], rows


def test_windows_follow_the_clock():
    """Expiry: a fact leaves its window once ``now - length >= time``; each window holds
    exactly its length of readings."""
    from simulations.bench import windows

    state = windows.filled(3, 2.5)
    assert len(state.long) == 3 * 150 and len(state.short) == 3 * 120
    arrived, expired = state.advance(4)
    assert len(arrived) == 2 * 3 * 4 and len(expired) == 2 * 3 * 4
    newest = max(fact[3] for fact in state.long)
    assert all(newest - fact[3] < 150 for fact in state.long)
    assert all(newest - fact[3] < 120 for fact in state.short)


def test_windows_benchmark_refuses_bad_arguments(capsys):
    from simulations.bench import windows

    for argv in (["--sensors", "0"], ["--minutes", "1"], ["--ticks", "0"]):
        with pytest.raises(SystemExit) as exit_:
            windows.main(argv)
        assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--ticks must be whole seconds" in err
def test_metrics_benchmark_prints_the_ratio_and_a_real_scrape(capsys):
    from simulations.bench import metrics

    argv = ["--updates", "4", "--repeat", "1", "--facts", "400", "--scrapes", "1"]
    assert metrics.main(argv) == 0
    out = capsys.readouterr().out
    ratio = re.search(r"on / off x(\d+\.\d+)", out)
    assert ratio and float(ratio[1]) > 0, out
    scrape = re.search(r"scrape of /metrics, (\d+) facts held, best of 1: ([\d.]+) ms", out)
    assert scrape and int(scrape[1]) == 500 and float(scrape[2]) > 0, out  # (400 and 100 Hot)
