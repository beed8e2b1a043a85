"""Tests of the benchmark data generators (simulations.bench.datasets).

The expected-size formulas are checked against a direct, rule-by-rule set computation of Rule
Sets 1-3 on small inputs (written out here by hand, independent of the engine), and against the
totals the ZodiacEdge paper reports for DS2(200).
"""

from __future__ import annotations

import io
import math
import re
import statistics
from collections import Counter, defaultdict

import pytest

from simulations.bench import datasets
from simulations.bench.datasets import (
    AIR_TEMPERATURE,
    NEIGHBOUR,
    ds1,
    ds1_outliers,
    ds2,
    expected_rs1_sizes,
    expected_rs2_sizes,
    expected_rs3_sizes,
    to_ntriples,
    turbine,
    write_ntriples,
)

# ---------------------------------------------------------------------------------------------
# DS1


@pytest.mark.parametrize("n", [1, 2, 3, 4, 25, 100, 401])
def test_ds1_sizes(n):
    counts = Counter(p for p, _, _ in ds1(n))
    assert counts[NEIGHBOUR] == n - 1
    assert counts[AIR_TEMPERATURE] == n
    assert set(counts) <= {NEIGHBOUR, AIR_TEMPERATURE}


def test_ds1_chain_and_readings_shape():
    facts = ds1(50, seed=3)
    edges = [(s, o) for p, s, o in facts if p == NEIGHBOUR]
    assert edges == [(turbine(i), turbine(i + 1)) for i in range(1, 50)]
    readings = {s: o for p, s, o in facts if p == AIR_TEMPERATURE}
    assert set(readings) == {turbine(i) for i in range(1, 51)}
    assert all(type(value) is int for value in readings.values())


def test_ds1_is_deterministic_and_seeded():
    assert ds1(200) == ds1(200)
    assert ds1(200, seed=7) == ds1(200, seed=7)
    assert ds1(200, seed=0) != ds1(200, seed=1)
    assert ds1_outliers(200, seed=7) == ds1_outliers(200, seed=7)


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_ds1_is_prefix_stable(seed):
    small, large = ds1(120, seed=seed), ds1(150, seed=seed)
    assert set(small) < set(large)
    small_outliers = ds1_outliers(120, seed=seed)
    large_outliers = ds1_outliers(150, seed=seed)
    assert {t: v for t, v in large_outliers.items() if t in small_outliers} == small_outliers


@pytest.mark.parametrize("seed", range(6))
def test_ds1_outliers_present_and_marked(seed):
    n = 100
    outliers = ds1_outliers(n, seed=seed)
    assert len(outliers) == 4  # one in 25
    assert set(outliers.values()) == {40, 5}  # both a hot and a cold outlier
    readings = {s: o for p, s, o in ds1(n, seed=seed) if p == AIR_TEMPERATURE}
    for name, value in readings.items():
        if name in outliers:
            assert value == outliers[name]
        else:
            assert 23 <= value <= 27


@pytest.mark.parametrize("n", [1, 24, 25, 26, 49, 50, 51, 1000])
def test_ds1_outlier_count(n):
    # Every 25th turbine from an offset in 1..25: between floor(n/25) and ceil(n/25) of them.
    count = len(ds1_outliers(n))
    assert n // 25 <= count <= math.ceil(n / 25)


def test_ds1_rejects_empty():
    with pytest.raises(ValueError):
        ds1(0)


def _rs1_by_hand(facts):
    """RS1 evaluated directly: the chain becomes a complete neighbour graph (r1, r2)."""
    turbines = {s for _, s, _ in facts} | {o for p, _, o in facts if p == NEIGHBOUR}
    readings = {s: o for p, s, o in facts if p == AIR_TEMPERATURE}
    connected = len(turbines) >= 2  # a single turbine has no hasNeighbour fact at all
    neighbours = {x: [y for y in turbines if y != x] if connected else [] for x in turbines}
    count, median = {}, {}
    for x, ys in neighbours.items():
        values = [readings[y] for y in ys if y in readings]
        if values:
            count[x] = len(values)
            median[x] = statistics.median(values)
    more_than_3 = {x for x, c in count.items() if c >= 3}
    anomalies = {x for x in more_than_3 if x in readings and abs(readings[x] - median[x]) > 5}
    return {
        NEIGHBOUR: sum(len(ys) for ys in neighbours.values()),
        "hasNeighbourAirTemperatureMeasurementNumber": len(count),
        "hasMedianAirTemperatureMeasurementNearby": len(median),
        "MoreThan3Neighbours": len(more_than_3),
        "SensorAnomalyWindTurbine": anomalies,
    }


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 10, 26, 27, 51, 80])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_expected_rs1_sizes_match_direct_computation(n, seed):
    direct = _rs1_by_hand(ds1(n, seed=seed))
    anomalies = direct.pop("SensorAnomalyWindTurbine")
    expected = expected_rs1_sizes(n, seed=seed)
    assert expected.pop("SensorAnomalyWindTurbine") == len(anomalies)
    assert expected == direct
    if n >= 4:
        assert anomalies == set(ds1_outliers(n, seed=seed))


# ---------------------------------------------------------------------------------------------
# DS2


@pytest.mark.parametrize("w", [1, 2, 5, 6, 7, 200])
def test_ds2_sizes(w):
    counts = Counter(p for p, _, _ in ds2(w))
    assert counts == {"p1": w, "p2": w, "p3": w, "p4": w, "p5": math.ceil(w / 5)}
    assert Counter(p for p, _, _ in ds2(w, p5=False)) == {"p1": w, "p2": w, "p3": w, "p4": w}


def test_ds2_chains_share_end_nodes():
    w = 7
    facts = ds2(w)
    by_predicate = defaultdict(list)
    for p, s, o in facts:
        by_predicate[p].append((s, o))
    for k, p in enumerate(["p1", "p2", "p3", "p4"]):
        assert by_predicate[p] == [(turbine(i + k * w), turbine(i + k * w + 1)) for i in range(w)]
    assert by_predicate["p5"] == [(turbine(w + i), turbine(w + i + 1)) for i in range(0, w, 5)]
    assert set(by_predicate["p5"]) <= set(by_predicate["p2"])
    nodes = {s for _, s, _ in facts} | {o for _, _, o in facts}
    assert nodes == {turbine(k) for k in range(4 * w + 1)}


def test_ds2_is_deterministic_and_duplicate_free():
    assert ds2(50) == ds2(50)
    assert len(set(ds2(50))) == len(ds2(50))


def test_ds2_rejects_zero_width():
    with pytest.raises(ValueError):
        ds2(0)


def _compose(left, right, *, distinct=False):
    by_first = defaultdict(set)
    for y, z in right:
        by_first[y].add(z)
    return {(x, z) for x, y in left for z in by_first.get(y, ()) if not (distinct and x == z)}


def _reverse(pairs):
    return {(y, x) for x, y in pairs}


def _fixpoint(step, initial):
    current = set(initial)
    while True:
        extended = current | step(current)
        if extended == current:
            return current
        current = extended


def _rs_by_hand(facts, *, rs3):
    """Rule Set 2 (or 3) evaluated rule by rule with Python sets."""
    edb = defaultdict(set)
    for p, s, o in facts:
        edb[p].add((s, o))
    # r1-r3 and r4-r5
    p11 = _fixpoint(lambda s: _reverse(s) | _compose(s, s, distinct=True), edb["p1"])
    p12 = _fixpoint(lambda s: _compose(s, s, distinct=True), edb["p2"])
    # r6-r8
    p13, p14 = set(edb["p3"]), set()
    while True:
        new14 = p14 | p13
        new13 = p13 | _reverse(new14)
        if (new13, new14) == (p13, p14):
            break
        p13, p14 = new13, new14
    # r9-r14 (r10 or r10new)
    if rs3:
        p13_subjects = {x for x, _ in p13}
        p12_into_p20 = {(x, y) for x, y in p12 if y not in p13_subjects}
    else:
        p12_into_p20 = p12
    p20, p21, p22 = set(), set(), set()
    while True:
        new20 = p20 | p11 | p12_into_p20 | p13 | p22
        new21 = p21 | new20
        new22 = p22 | new21
        if (new20, new21, new22) == (p20, p21, p22):
            break
        p20, p21, p22 = new20, new21, new22
    # r15-r18
    p5 = edb["p5"]
    p25 = {(x, z) for x, y in p11 for y2, z in p12 if y == y2 and (y, z) not in p5}
    p26 = {(x, z) for x, y in p12 for z, y2 in p13 if y == y2 and (z, y) not in p5}
    p30 = _compose(p22, p21)
    p26_subjects = {x for x, _ in p26}
    p31 = {(x, y) for x, y in p25 if y in p26_subjects}
    derived = {
        "p11": p11, "p12": p12, "p13": p13, "p14": p14, "p20": p20, "p21": p21, "p22": p22,
        "p25": p25, "p26": p26, "p30": p30, "p31": p31,
    }  # fmt: skip
    return {name: len(pairs) for name, pairs in derived.items()}


@pytest.mark.parametrize("w", range(2, 13))
@pytest.mark.parametrize("p5", [True, False])
def test_expected_rs2_sizes_match_direct_computation(w, p5):
    assert expected_rs2_sizes(w, p5=p5) == _rs_by_hand(ds2(w, p5=p5), rs3=False)


@pytest.mark.parametrize("w", range(2, 13))
@pytest.mark.parametrize("p5", [True, False])
def test_expected_rs3_sizes_match_direct_computation(w, p5):
    assert expected_rs3_sizes(w, p5=p5) == _rs_by_hand(ds2(w, p5=p5), rs3=True)


def test_expected_sizes_match_the_paper_totals():
    # ZodiacEdge paper, Table 1: DS2 with 800 turbines (w = 200), generated without p5.
    assert sum(expected_rs2_sizes(200, p5=False).values()) == 424_300
    assert sum(expected_rs3_sizes(200, p5=False).values()) == 423_101


def test_expected_sizes_need_width_two():
    with pytest.raises(ValueError):
        expected_rs2_sizes(1)
    with pytest.raises(ValueError):
        expected_rs1_sizes(1)


# ---------------------------------------------------------------------------------------------
# N-Triples


_LINE = re.compile(r"<[^<>\s]+> <[^<>\s]+> (?:<[^<>\s]+>|-?\d+) \.")


def test_ntriples_shape():
    text = to_ntriples(ds1(30, seed=1))
    lines = text.splitlines()
    assert text.endswith(" .\n")
    assert len(lines) == 2 * 30 - 1
    assert all(_LINE.fullmatch(line) for line in lines)
    assert lines[0] == "<windTurbine1> <hasNeighbour> <windTurbine2> ."
    readings = {s: o for p, s, o in ds1(30, seed=1) if p == AIR_TEMPERATURE}
    assert f"<windTurbine1> <hasAirTemperatureMesurement> {readings['windTurbine1']} ." in lines


def test_ntriples_ds2_shape():
    lines = to_ntriples(ds2(3)).splitlines()
    assert lines[:5] == [
        "<windTurbine0> <p1> <windTurbine1> .",
        "<windTurbine3> <p2> <windTurbine4> .",
        "<windTurbine6> <p3> <windTurbine7> .",
        "<windTurbine9> <p4> <windTurbine10> .",
        "<windTurbine3> <p5> <windTurbine4> .",
    ]


def test_ntriples_typed_literals():
    text = to_ntriples([(AIR_TEMPERATURE, "windTurbine1", 25)], typed_literals=True)
    assert text == (
        "<windTurbine1> <hasAirTemperatureMesurement> "
        '"25"^^<http://www.w3.org/2001/XMLSchema#integer> .\n'
    )


def test_ntriples_rejects_unknown_values():
    with pytest.raises(TypeError):
        to_ntriples([("p", "a", object())])


def test_write_ntriples_to_path_and_stream(tmp_path):
    facts = ds2(4)
    target = tmp_path / "nested" / "dir" / "ds2.nt"
    assert write_ntriples(facts, target) == len(facts)
    assert target.read_text(encoding="utf-8") == to_ntriples(facts)
    stream = io.StringIO()
    assert write_ntriples(facts, stream) == len(facts)
    assert stream.getvalue() == to_ntriples(facts)


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_writes_file(tmp_path, capsys):
    target = tmp_path / "out" / "ds1_100.nt"
    assert datasets.main(["ds1", "100", "-o", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == to_ntriples(ds1(100))
    assert "199 facts" in capsys.readouterr().err


def test_cli_writes_stdout(capsys):
    assert datasets.main(["ds2", "5", "--no-p5"]) == 0
    assert capsys.readouterr().out == to_ntriples(ds2(5, p5=False))


def test_cli_seed_and_typed_literals(capsys):
    assert datasets.main(["ds1", "10", "--seed", "4", "--typed-literals"]) == 0
    assert capsys.readouterr().out == to_ntriples(ds1(10, seed=4), typed_literals=True)


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        datasets.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("dataset", "size", "--output", "--seed", "--no-p5", "--typed-literals"):
        assert option in out


@pytest.mark.parametrize("argv", [["ds3", "10"], ["ds1", "ten"], ["ds2", "0"]])
def test_cli_rejects_bad_arguments(argv):
    with pytest.raises(SystemExit) as exit_info:
        datasets.main(argv)
    assert exit_info.value.code == 2
