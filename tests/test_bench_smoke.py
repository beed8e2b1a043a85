"""Smoke test of ``simulations.bench.incremental``: its ``--quick`` mode runs in about a second,
prints the table, and every incremental update equals materialising its final state from
scratch (the benchmark doubles as an end-to-end check of the incremental engine)."""

from __future__ import annotations

from dataclasses import replace

from simulations.bench import incremental


def quick_row_count(groups: list[str]) -> int:
    """Rows the quick run prints for these groups: one per step of each case."""
    return sum(len(case.steps) for name in groups for case in incremental.GROUPS[name][1](True))


def table_rows(out: str) -> list[str]:
    """The table's data lines (not the header, rule, group titles or targets)."""
    return [line for line in out.splitlines() if any(f" {w} " in line for w in ("OK", "MISMATCH"))]


def test_quick_run_prints_table_with_equal_results(capsys):
    status = incremental.main(["--quick"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.splitlines()[0].split()[:2] == ["scenario", "data"]
    for title, _ in incremental.GROUPS.values():
        assert f"# {title}" in out
    rows = table_rows(out)
    assert len(rows) == quick_row_count(list(incremental.GROUPS))
    assert all(" OK " in row for row in rows), out
    assert "MISMATCH" not in out and "ERROR" not in out
    assert "Paper targets" in out
    assert "rows equal the from-scratch materialisation" in out


def test_mismatch_sets_exit_status(capsys, monkeypatch):
    real = incremental.from_scratch

    def missing_one_fact(state, repeat):
        reference = real(state, repeat)
        return replace(reference, facts=reference.facts - {next(iter(reference.facts))})

    monkeypatch.setattr(incremental, "from_scratch", missing_one_fact)
    status = incremental.main(["--quick", "--only", "rs3"])
    out = capsys.readouterr().out
    assert status == 1
    rows = table_rows(out)
    assert len(rows) == quick_row_count(["rs3"])
    assert all("MISMATCH" in row for row in rows)
