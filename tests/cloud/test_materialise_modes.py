"""``zodiac-cloud materialise --spark auto|always|never``: a small input runs on the edge engine
with no Spark session (no pyspark needed) and writes what the Spark job writes; a large one, or
one whose result outgrows the driver, goes to Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cloud.zodiac_cloud_cli as cli
from cloud.engine_job import read_fact_directory

ROOT = Path(__file__).resolve().parents[2]
RULES = (
    "r(X, Y) :- e(X, Y) .\n"
    "r(X, Z) :- r(X, Y) and r(Y, Z) and COMP(X, !=, Z) .\n"
    "<Big>(X) :- v(X, N) and COMP(N, >, 3) .\n"
    "w(X, H) :- v(X, N) and bind(N * 2 as H) .\n"
    "<http://ex/p>(X, <http://ex/o>) :- e(X, Y) .\n"
    "m: pair(X, Y), <Node>(Y) :- e(X, Y) and not v(Y, 2.5) .\n"  # several heads
)
FACTS = (
    "<a> <e> <b> .\n<b> <e> <c> .\n<c> <e> <a> .\n<c> <e> <d> .\n"
    '<a> <v> 5 .\n<b> <v> 2.5 .\n<c> <v> "x"@en .\n<d> <v> true .\n'
    '<d> <http://ex/label> "dee"^^<http://www.w3.org/2001/XMLSchema#token> .\n'
)


def inputs(tmp_path: Path) -> tuple[Path, Path]:
    rules, facts = tmp_path / "p.rules", tmp_path / "f.nt"
    rules.write_text(RULES)
    facts.write_text(FACTS)
    return rules, facts


def run_without_pyspark(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a process where ``import pyspark`` fails, as on an install without the
    cloud extra: a run that needed Spark (and so a JVM) could not succeed."""
    hidden = tmp_path / "hidden"
    (hidden / "pyspark").mkdir(parents=True, exist_ok=True)
    (hidden / "pyspark" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), str(ROOT)]))
    return subprocess.run(
        [sys.executable, "-m", "cloud.zodiac_cloud_cli", "materialise", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def output(directory: Path) -> tuple[set[str], dict, set[tuple]]:
    """What a run wrote: facts.nt's lines, the manifest and the Parquet datasets' facts."""
    lines = set((directory / "facts.nt").read_text().splitlines())
    manifest = json.loads((directory / "parquet" / "manifest.json").read_text())
    facts = set(read_fact_directory(directory / "parquet"))
    return lines, manifest, facts


@pytest.mark.process
def test_auto_on_a_small_input_starts_no_spark_and_writes_what_spark_writes(
    spark, tmp_path, capsys
):
    rules, facts = inputs(tmp_path)
    common = ["--rules", str(rules), "--facts", str(facts)]
    with_spark = tmp_path / "always"
    assert cli.main(["materialise", *common, "--out", str(with_spark), "--spark", "always"]) == 0
    spark_counts = capsys.readouterr().out

    auto = tmp_path / "auto"
    done = run_without_pyspark(tmp_path, *common, "--out", str(auto))  # (auto: the default)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("engine: 9 input facts <= 200,000, no Spark session\n")
    assert done.stdout == spark_counts
    assert output(auto) == output(with_spark)
    assert len(output(auto)[2]) > 10

    # What the engine wrote is a fact directory Spark reads, and `never` reads it back alone.
    again = tmp_path / "again"
    argv = ["materialise", "--rules", str(rules), "--facts", str(auto / "parquet")]
    assert cli.main([*argv, "--out", str(again), "--spark", "always", "--local-below", "0"]) == 0
    assert output(again)[0] == output(with_spark)[0]
    alone = tmp_path / "alone"
    done = run_without_pyspark(
        tmp_path, "--rules", str(rules), "--facts", str(auto / "parquet"), "--out", str(alone),
        "--spark", "never",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--spark never" in done.stderr
    assert output(alone) == output(with_spark)


def test_auto_goes_to_spark_above_the_threshold(tmp_path, monkeypatch, capsys):
    rules, facts = inputs(tmp_path)
    called = []
    monkeypatch.setattr(cli, "_materialise_with_spark", lambda *a: called.append(a) or 0)
    monkeypatch.setattr("cloud.spark.session.require_pyspark", lambda: None)
    monkeypatch.setattr(cli, "SPARK_ABOVE", 8)
    argv = ["materialise", "--rules", str(rules), "--facts", str(facts), "--out"]
    assert cli.main([*argv, str(tmp_path / "big")]) == 0
    assert "Spark: the input has 9 facts (> 8)" in capsys.readouterr().err
    assert len(called) == 1 and not (tmp_path / "big").exists()
    # Under the threshold but deriving more than the driver may hold: Spark too.
    monkeypatch.setattr(cli, "SPARK_ABOVE", 100)
    monkeypatch.setattr("cloud.spark.driver.MAX_OUTPUT", 5)
    assert cli.main([*argv, str(tmp_path / "wide")]) == 0
    assert "Spark: more than 5 facts derived" in capsys.readouterr().err
    assert len(called) == 2
    # never: the engine whatever the size.
    assert cli.main([*argv, str(tmp_path / "never"), "--spark", "never"]) == 0
    assert len(called) == 2 and (tmp_path / "never" / "facts.nt").is_file()


@pytest.mark.process
def test_never_without_pyarrow_is_one_line(tmp_path):
    rules, facts = inputs(tmp_path)
    hidden = tmp_path / "hidden"
    (hidden / "pyarrow").mkdir(parents=True)
    (hidden / "pyarrow" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), str(ROOT)]))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cloud.zodiac_cloud_cli", "materialise", "--rules", str(rules),
         "--facts", str(facts), "--out", str(out), "--spark", "never"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "zodiac-cloud: --spark never writes Parquet with pyarrow: pyarrow is not installed "
        "(pip install pyarrow, part of the 'cloud' extra)"
    ]
    assert not out.exists()
