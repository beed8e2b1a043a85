"""Deterministic benchmark data sets DS1 and DS2 of the ZodiacEdge paper, and their expected sizes.

A fact is a tuple ``(predicate, subject, object)``: IRIs are plain ``str`` (``"windTurbine1"``),
numbers are ``int``. :func:`to_ntriples` / :func:`write_ntriples` print them the way ZodiacEdge's
data files do, one triple a line, numbers bare::

    <windTurbine1> <hasNeighbour> <windTurbine2> .
    <windTurbine1> <hasAirTemperatureMesurement> 25 .

(bare numbers are not W3C N-Triples; pass ``typed_literals=True`` for ``"25"^^xsd:integer``).

Command line: ``python -m simulations.bench.datasets ds1 100 -o out/ds1_100.nt`` (see ``--help``).

DS1 (Rule Set 1)
================
``ds1(n, seed)``: turbines ``windTurbine1 .. windTurbineN``, a chain of ``hasNeighbour`` edges
``windTurbine{i} -> windTurbine{i+1}`` (n - 1 facts) and one ``hasAirTemperatureMesurement``
integer per turbine (n facts), drawn from 23..27, except that every 25th turbine (from a seeded
offset in 1..25) is an *outlier* reading alternately 40 and 5. Generation is prefix-stable: the
first k turbines of ``ds1(n)`` are those of ``ds1(k)`` (same seed), so ``ds1(n + m)`` minus
``ds1(n)`` is the "extra turbines" update of the paper's data-incremental experiment.

Under RS1 (``rules/benchmarks/rs1.rules``), for n >= 2:

* ``hasNeighbour``: r1 + r2 connect the chain into a complete graph without loops: n(n - 1).
* ``hasNeighbourAirTemperatureMeasurementNumber`` and ``hasMedianAirTemperatureMeasurementNearby``:
  one per turbine, n each (every turbine has n - 1 neighbours, each with one reading, so the count
  is n - 1 everywhere).
* ``MoreThan3Neighbours``: n when n - 1 >= 3, that is n >= 4; otherwise 0.
* ``SensorAnomalyWindTurbine``: exactly the outliers (:func:`ds1_outliers`) when n >= 4. The
  outliers are at most ceil(n / 25) of any turbine's n - 1 neighbours, fewer than half, so every
  neighbour median lies in 23..27; a normal reading (23..27) is then within 4 of it and an
  outlier (40 or 5) more than 5 away.

(The paper's "up to 160,800 facts" is n = 400 with a reading on turbines 1..399 only:
159,600 + 3 x 400 derived facts.)

DS2 (Rule Sets 2 and 3)
=======================
``ds2(w)``, with ``t_k = windTurbine{k}``: for i = 0 .. w - 1, ``p1(t_i, t_i+1)``,
``p2(t_i+w, t_i+w+1)``, ``p3(t_i+2w, t_i+2w+1)``, ``p4(t_i+3w, t_i+3w+1)`` and, when i % 5 == 0,
``p5(t_i+w, t_i+w+1)``. So p1..p4 are four directed chains of w edges over the node ranges
C1 = t_0..t_w, C2 = t_w..t_2w, C3 = t_2w..t_3w, C4 = t_3w..t_4w (consecutive chains share one end
node), and p5 marks every 5th p2 edge, the first one ``p5(t_w, t_w+1)`` included. EDB sizes:
w for each of p1..p4, ceil(w / 5) for p5. ``ds2(w, p5=False)`` is the paper's data set (its
generator writes no p5).

Expected sizes under RS2, for w >= 2 (:func:`expected_rs2_sizes`; the rule numbers are RS2's):

* p11 = w(w + 1). r1 copies the p1 chain, r2 makes it symmetric, r3 closes it transitively:
  all ordered pairs (x, y), x != y, of the w + 1 nodes of C1. No reflexive pair arises: p1 has no
  loop, r2 only swaps the arguments of a non-reflexive pair, and r3 forbids X = Y.
* p12 = w(w + 1) / 2. r4 + r5 give the transitive closure of the directed chain C2: the pairs
  (t_a, t_b), w <= a < b <= 2w. The chain is acyclic, so r5's X != Y never bites.
* p13 = p14 = 2w. r7 makes p14 = p13 and r8 adds p14 reversed to p13, so
  p13 = p3 + reverse(p3), the C3 chain edges in both directions (no loops, no overlap).
* p20 = p21 = p22 = w(w + 1) + w(w + 1) / 2 + 2w. r9-r11 put p11, p12 and p13 into p20 and r12-r14
  only copy p20 -> p21 -> p22 -> p20. The three parts are disjoint: their pairs lie inside C1, C2
  and C3 respectively, which share at most one node, and none of them is reflexive.
* p25 = w(w - 1), or w^2 without p5. In r15 the join variable Y must end a p11 pair (Y in C1) and
  start a p12 pair (Y in t_w..t_2w-1), so Y = t_w; then X is any of the w other nodes of C1 and
  Z any of t_w+1..t_2w, except t_w+1 when ``p5(t_w, t_w+1)`` holds: p25 = {t_0..t_w-1} x
  {t_w+2..t_2w} (x {t_w+1..t_2w} without p5).
* p26 = w. In r16 Y ends a p12 pair (Y in t_w+1..t_2w) and p13(Z, Y) needs Y in C3: Y = t_2w,
  whose only p13 predecessor is Z = t_2w+1; X is any of t_w..t_2w-1, and no p5 fact starts at
  t_2w+1, so the negation never blocks: p26 = {t_w..t_2w-1} x {t_2w+1}.
* p30 = (w + 1)^2 + w^2 + w(w - 1) / 2 + w + (3w - 1). r17 composes U = p20 = p11 + p12 + p13
  with itself (p21 = p22 = U); the non-empty parts of U o U are pairwise disjoint:
  p11 o p11 = C1 x C1, loops included (w + 1 >= 3 nodes: for x != z pick a third node, for x = z
  any other node): (w + 1)^2; p11 o p12 via t_w = {t_0..t_w-1} x {t_w+1..t_2w}: w^2;
  p12 o p12 = the C2 pairs (t_a, t_b) with b - a >= 2: w(w - 1) / 2;
  p12 o p13 via t_2w = {t_w..t_2w-1} x {t_2w+1}: w; p13 o p13 over the undirected C3 chain = its
  w + 1 loops and 2(w - 1) pairs at distance 2: 3w - 1. The other parts (p11 o p13, p12 o p11,
  p13 o p11, p13 o p12) are empty, as no node ends a pair of the first and starts one of the
  second.
* p31 = w(w - 2), or w(w - 1) without p5. r18 keeps the p25 pairs (X, Y) whose Y starts a p26
  pair (Y in t_w..t_2w-1): X in t_0..t_w-1 and Y in t_w+2..t_2w-1 (t_w+1..t_2w-1 without p5).

RS3 replaces r10 by r10new ``p20(X, Y) :- p12(X, Y) and not p13(Y, Z)``: the p12 pairs ending in
a node with a p13 successor, i.e. in C3, are dropped; in C2 that is t_2w, the w pairs
(t_w+a, t_2w). So (:func:`expected_rs3_sizes`) p20 = p21 = p22 lose w each, and in p30 the parts
through or into t_2w shrink: p11 o p12 = w(w - 1), p12 o p12 = (w - 1)(w - 2) / 2, p12 o p13 = 0,
giving p30 = (w + 1)^2 + w(w - 1) + (w - 1)(w - 2) / 2 + (3w - 1). p11..p14, p25, p26 and p31 do
not read p20 and are as in RS2.

Check against the paper (Table 1, DS2 with w = 200, no p5): the derived facts of RS2 add up to
40,200 + 20,100 + 400 + 400 + 3 x 60,700 + 40,000 + 200 + 101,100 + 39,800 = 424,300, and those
of RS3 to 424,300 - 3 x 200 - 599 = 423,101: both the paper's figures exactly (which also shows
that the paper's RS3 includes r18, missing from its appendix).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

Fact = tuple[str, str, "str | int"]

NEIGHBOUR = "hasNeighbour"
AIR_TEMPERATURE = "hasAirTemperatureMesurement"  # sic: the paper's spelling, kept for its rules
NORMAL_TEMPERATURES = (23, 27)  # inclusive range of normal readings
OUTLIER_PERIOD = 25  # one turbine in OUTLIER_PERIOD is an outlier
OUTLIER_TEMPERATURES = (40, 5)  # outliers alternate between these readings
P5_PERIOD = 5  # p5 marks every P5_PERIOD-th p2 edge
XSD_INTEGER = "http://www.w3.org/2001/XMLSchema#integer"
XSD_DOUBLE = "http://www.w3.org/2001/XMLSchema#double"


def turbine(i: int) -> str:
    """The IRI of turbine ``i``: ``windTurbine{i}``."""
    return f"windTurbine{i}"


# --------------------------------------------------------------------------------------------
# DS1


def _ds1_plan(n: int, seed: int) -> tuple[list[int], dict[int, int]]:
    """Readings of turbines 1..n (index 0 is turbine 1) and the outliers {turbine: reading}."""
    if n < 1:
        raise ValueError(f"ds1 needs at least one turbine, got n={n}")
    rng = random.Random(seed)
    offset = rng.randint(1, OUTLIER_PERIOD)  # the first outlier turbine
    low, high = NORMAL_TEMPERATURES
    # One draw per turbine, whether or not it is an outlier: keeps the data prefix-stable.
    readings = [rng.randint(low, high) for _ in range(n)]
    outliers: dict[int, int] = {}
    for k, i in enumerate(range(offset, n + 1, OUTLIER_PERIOD)):
        value = OUTLIER_TEMPERATURES[k % len(OUTLIER_TEMPERATURES)]
        readings[i - 1] = value
        outliers[i] = value
    return readings, outliers


def ds1(n: int, seed: int = 0) -> list[Fact]:
    """DS1 with ``n`` turbines: the ``hasNeighbour`` chain, then one reading per turbine."""
    readings, _ = _ds1_plan(n, seed)
    facts: list[Fact] = [(NEIGHBOUR, turbine(i), turbine(i + 1)) for i in range(1, n)]
    facts += [(AIR_TEMPERATURE, turbine(i), t) for i, t in enumerate(readings, start=1)]
    return facts


def ds1_outliers(n: int, seed: int = 0) -> dict[str, int]:
    """The outlier turbines of ``ds1(n, seed)`` with their readings, in turbine order.

    These are exactly the turbines RS1 flags as ``SensorAnomalyWindTurbine`` when n >= 4.
    """
    _, outliers = _ds1_plan(n, seed)
    return {turbine(i): value for i, value in outliers.items()}


def expected_rs1_sizes(n: int, seed: int = 0) -> dict[str, int]:
    """Number of facts per derived predicate of RS1 over ``ds1(n, seed)`` (n >= 2).

    For the class atoms ``<MoreThan3Neighbours>(X)`` and ``<SensorAnomalyWindTurbine>(X)`` the
    count is the number of members (``rdf:type`` triples with that class).
    """
    if n < 2:
        raise ValueError(f"the RS1 size formulas need n >= 2, got n={n}")
    enough = n >= 4  # MoreThan3Neighbours needs n - 1 >= 3 neighbours with a reading
    return {
        NEIGHBOUR: n * (n - 1),
        "hasNeighbourAirTemperatureMeasurementNumber": n,
        "hasMedianAirTemperatureMeasurementNearby": n,
        "MoreThan3Neighbours": n if enough else 0,
        "SensorAnomalyWindTurbine": len(ds1_outliers(n, seed)) if enough else 0,
    }


# --------------------------------------------------------------------------------------------
# DS2


def ds2(w: int, *, p5: bool = True) -> list[Fact]:
    """DS2 of width ``w``: four chains p1..p4 of ``w`` edges each, plus p5 on every 5th p2 edge.

    ``p5=False`` leaves out the p5 facts (the data set the paper's sizes were measured on).
    """
    if w < 1:
        raise ValueError(f"ds2 needs w >= 1, got w={w}")
    t = turbine
    facts: list[Fact] = []
    for i in range(w):
        facts.append(("p1", t(i), t(i + 1)))
        facts.append(("p2", t(i + w), t(i + w + 1)))
        facts.append(("p3", t(i + 2 * w), t(i + 2 * w + 1)))
        facts.append(("p4", t(i + 3 * w), t(i + 3 * w + 1)))
        if p5 and i % P5_PERIOD == 0:
            facts.append(("p5", t(i + w), t(i + w + 1)))
    return facts


def _check_width(w: int) -> None:
    if w < 2:
        raise ValueError(f"the DS2 size formulas need w >= 2, got w={w}")


def expected_rs2_sizes(w: int, *, p5: bool = True) -> dict[str, int]:
    """Number of facts per derived predicate of RS2 over ``ds2(w, p5=p5)`` (w >= 2).

    Derived by hand in the module docstring; EDB predicates (p1..p5) are not included.
    """
    _check_width(w)
    p11 = w * (w + 1)
    p12 = w * (w + 1) // 2
    p13 = 2 * w
    p20 = p11 + p12 + p13
    return {
        "p11": p11,
        "p12": p12,
        "p13": p13,
        "p14": p13,
        "p20": p20,
        "p21": p20,
        "p22": p20,
        "p25": w * (w - 1) if p5 else w * w,
        "p26": w,
        "p30": (w + 1) ** 2 + w * w + w * (w - 1) // 2 + w + (3 * w - 1),
        "p31": w * (w - 2) if p5 else w * (w - 1),
    }


def expected_rs3_sizes(w: int, *, p5: bool = True) -> dict[str, int]:
    """Number of facts per derived predicate of RS3 over ``ds2(w, p5=p5)`` (w >= 2)."""
    sizes = expected_rs2_sizes(w, p5=p5)
    p20 = sizes["p20"] - w  # r10new drops the w p12 pairs ending in t_2w
    sizes.update(p20=p20, p21=p20, p22=p20)
    sizes["p30"] = (w + 1) ** 2 + w * (w - 1) + (w - 1) * (w - 2) // 2 + (3 * w - 1)
    return sizes


# --------------------------------------------------------------------------------------------
# N-Triples output


def format_term(value: object, *, typed_literals: bool = False) -> str:
    """One term of a triple: ``<iri>`` for a str, a bare number (or a typed literal)."""
    if isinstance(value, bool):
        raise TypeError("booleans are not generated by these data sets")
    if isinstance(value, str):
        return f"<{value}>"
    if isinstance(value, int):
        return f'"{value}"^^<{XSD_INTEGER}>' if typed_literals else str(value)
    if isinstance(value, float):
        return f'"{value!r}"^^<{XSD_DOUBLE}>' if typed_literals else repr(value)
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as an RDF term")


def ntriples_lines(facts: Iterable[Fact], *, typed_literals: bool = False) -> Iterable[str]:
    """One line (with its newline) per fact ``(predicate, subject, object)``."""
    for predicate, subject, obj in facts:
        s = format_term(subject)
        o = format_term(obj, typed_literals=typed_literals)
        yield f"{s} <{predicate}> {o} .\n"


def to_ntriples(facts: Iterable[Fact], *, typed_literals: bool = False) -> str:
    """The facts as N-Triples text, one triple a line, in the order given."""
    return "".join(ntriples_lines(facts, typed_literals=typed_literals))


def write_ntriples(
    facts: Iterable[Fact], target: str | os.PathLike[str] | TextIO, *, typed_literals: bool = False
) -> int:
    """Write the facts to a path (parent folders are created) or an open text file.

    Returns the number of facts written.
    """
    lines = ntriples_lines(facts, typed_literals=typed_literals)
    if isinstance(target, (str, os.PathLike)):
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8", newline="\n") as out:
            return _write_lines(lines, out)
    return _write_lines(lines, target)


def _write_lines(lines: Iterable[str], out: TextIO) -> int:
    count = 0
    for line in lines:
        out.write(line)
        count += 1
    return count


# --------------------------------------------------------------------------------------------
# Command line


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.bench.datasets",
        description=(
            "Write a ZodiacEdge benchmark data set as N-Triples (numbers bare, as in "
            "ZodiacEdge's files). ds1: a chain of N turbines with air-temperature readings "
            "(Rule Set 1). ds2: four chains p1..p4 of width N plus p5 marks (Rule Sets 2, 3)."
        ),
    )
    parser.add_argument("dataset", choices=("ds1", "ds2"), help="which data set to generate")
    parser.add_argument(
        "size", type=int, help="ds1: number of turbines (n); ds2: width of each chain (w)"
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="file to write (parent folders are created); default: standard output",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="ds1 only: seed of the readings (default: 0)"
    )
    parser.add_argument(
        "--no-p5",
        action="store_true",
        help="ds2 only: leave out the p5 facts (the data the paper's sizes were measured on)",
    )
    parser.add_argument(
        "--typed-literals",
        action="store_true",
        help='write numbers as "25"^^xsd:integer literals (standard N-Triples) instead of bare',
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        if args.dataset == "ds1":
            facts = ds1(args.size, seed=args.seed)
        else:
            facts = ds2(args.size, p5=not args.no_p5)
    except ValueError as error:
        parser.error(str(error))
    target = args.output if args.output else sys.stdout
    count = write_ntriples(facts, target, typed_literals=args.typed_literals)
    if args.output:
        print(f"wrote {count} facts to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
