"""The Spark job (``cloud/spark``) against the edge engine, fact for fact.

Every test materialises a program with Spark and with the engine (``agent.engine.Reasoner``) and
requires the very same facts, *with the same Python types*: ``5`` and ``5.0`` are one term, so a
plain set comparison would accept an int where the engine gives a float; :func:`typed` does not.

Spark runs in local mode, one SparkSession for the whole pytest session (the ``spark`` fixture
of ``tests/conftest.py``: ``local[2]``, one shuffle partition, no UI; the CLI tests below run
the job with its own defaults). Spark jobs cost a fixed ~0.1 s each, so operator tests put
several rules (one head predicate per variant) into one program. Without pyspark these tests
fail with an install hint: a suite that silently skips the cloud job proves nothing about it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings

from agent.engine import RDF_TYPE, Literal, Reasoner
from agent.engine.program.rdf import read_facts
from tests.support.reference import to_external
from tests.support.strategies import program_and_facts

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ helpers
def typed(facts: Iterable[tuple]) -> set[tuple]:
    """Facts with each value tagged by its type: ``5`` and ``5.0`` (or ``True`` and ``1``)
    compare different here."""
    return {tuple((type(value).__name__, value) for value in fact) for fact in facts}


def engine(program, facts: list[tuple]) -> Reasoner:
    """The engine's materialisation, given the facts first and then the rules: the order in
    which the Spark job encodes terms (cloud/spark/terms.py). Numerically equal numbers are one
    term, decoded as the first one seen (docs/semantics.md), so a rule constant ``3`` and a
    fact's ``3.0`` come back as whichever was encoded first."""
    reasoner = Reasoner()
    reasoner.add_facts(facts)
    reasoner.add_rules(program)
    return reasoner


def same_as_engine(spark, program, facts: list[tuple], **options):
    """Materialise with both; assert equal typed facts; return (Spark result, reasoner).
    Every hyper-node runs in Spark unless ``local_below`` says otherwise: these tests are
    about the Spark operators, not the driver-side path (``cloud/spark/driver.py``)."""
    from cloud.spark.materialise import materialise

    options.setdefault("local_below", 0)
    reasoner = engine(program, facts)
    result = materialise(spark, program, facts, **options)
    got, want = typed(result.facts()), typed(reasoner.facts())
    missing, extra = sorted(map(repr, want - got)), sorted(map(repr, got - want))
    assert got == want, f"Spark is missing {missing}, has extra {extra}"
    return result, reasoner


def of(result, name: str, arity: int) -> set[tuple]:
    """The values of one relation's facts (without the predicate)."""
    return {fact[1:] if arity > 1 else (fact[1],) for fact in result.facts((name, arity))}


# ------------------------------------------------------------------ operators
def test_joins_constants_repeated_variables_and_class_atoms(spark):
    program = """
        join(X, Z) :- p(X, Y), q(Y, Z) .
        cross(X, W) :- p(X, _), r(W) .
        constant(X) :- p(X, <b>) .
        head(X, <tag>, 3.0) :- q(X, 3) .
        twice(X) :- p(X, X) .
        ends(X, Y) :- t(X, Y, X) .
        ground_yes(X) :- r(X), q(<b>, 3) .
        ground_no(X) :- r(X), q(<b>, 4) .
        <Seen>(X) :- <Thing>(X), p(X, _) .
        typed(X, C) :- <rdf:type>(X, <Thing>), r(C) .
    """
    facts = [
        ("p", "a", "b"),
        ("p", "b", "c"),
        ("p", "c", "c"),
        ("q", "b", 3.0),
        ("q", "c", "d"),
        ("r", "w"),
        ("t", "a", "b", "a"),
        ("t", "a", "b", "c"),
        (RDF_TYPE, "a", "Thing"),
        (RDF_TYPE, "z", "Thing"),
    ]
    result, _ = same_as_engine(spark, program, facts)
    assert of(result, "join", 2) == {("a", 3.0), ("b", "d"), ("c", "d")}
    assert of(result, "head", 3) == {("b", "tag", 3.0)}  # data's 3.0 is the rule's 3
    assert of(result, "twice", 1) == {("c",)}
    assert of(result, "ground_no", 1) == set()
    assert of(result, "Seen", 1) == {("a",)}
    # The API: one DataFrame of term ids per relation that has facts.
    assert ("join", 2) in result and ("ground_no", 1) not in result
    assert result[("join", 2)].columns == ["c0", "c1"]


def test_negation_including_existential_variables(spark):
    program = """
        n1(X, Y) :- p(X, Y), not q(Y, X) .
        n2(X) :- node(X), not p(X, _) .
        n3(Y) :- p(X, Y), not p(Y, Z) .
        n4(X) :- node(X), not t(X, Z, Z) .
        n5(X) :- node(X), not q(<zz>, <zz>) .
        n6(X) :- node(X), not r(_) .
        n7(X) :- node(X), not missing(X, _) .
        n8(X, Y) :- p(X, Y), not t(X, Y, _) .
    """
    facts = [("node", n) for n in ("a", "b", "c", "d")] + [
        ("p", "a", "b"),
        ("p", "b", "c"),
        ("q", "c", "b"),
        ("t", "a", "e", "e"),
        ("t", "b", "e", "f"),
        ("t", "a", "b", "x"),
        ("r", "w"),
    ]
    result, _ = same_as_engine(spark, program, facts)
    assert of(result, "n2", 1) == {("c",), ("d",)}
    assert of(result, "n3", 1) == {("c",)}
    assert of(result, "n4", 1) == {("b",), ("c",), ("d",)}  # only a has t(a, z, z)
    assert of(result, "n6", 1) == set()
    assert of(result, "n8", 2) == {("b", "c")}


VALUES = [
    ("v", "i1", 1),
    ("v", "i5", 5),
    ("v", "f5", 5.0),
    ("v", "f25", 2.5),
    ("v", "zero", 0),
    ("v", "neg", -4),
    ("v", "iri", "b"),
    ("v", "iri2", "a"),
    ("v", "lit", Literal("text")),
    ("v", "yes", True),
]


def test_comparisons(spark):
    program = """
        lt(X, Y) :- v(X, A), v(Y, B), COMP(A, <, B) .
        eq(X, Y) :- v(X, A), v(Y, B), A = B .
        ne(X) :- v(X, A), A != 5 .
        ge(X) :- v(X, A), COMP(A, >=, 2.5) .
        plus(X, Y) :- v(X, A), v(Y, B), COMP(A + 4, =, B) .
        always(X) :- v(X, _), COMP(1, <, 2) .
        never(X) :- v(X, _), COMP(1, <, <a>) .
    """
    result, reasoner = same_as_engine(spark, program, VALUES)
    lt = of(result, "lt", 2)
    assert ("iri2", "iri") in lt and ("f25", "i5") in lt  # IRIs by string, numbers by value
    assert not any("lit" in pair or "yes" in pair for pair in lt)  # errors drop
    assert ("i5", "f5") in of(result, "eq", 2)  # 5 and 5.0 are one term
    assert ("f5",) not in of(result, "ne", 1)
    assert of(result, "plus", 2) == {("i1", "i5"), ("i1", "f5"), ("neg", "zero")}
    assert of(result, "never", 1) == set()
    assert result.runtime_errors > 0 and reasoner.stats()["runtime_errors"] > 0


def test_binds_and_runtime_errors(spark):
    program = """
        double(X, Y) :- v(X, A), bind(A * 2 as Y) .
        half(X, Y) :- v(X, A), bind(A / 2 as Y) .
        inverse(X, Y) :- v(X, A), bind(10 / A as Y) .
        rounded(X, Y) :- v(X, A), bind(round(A) as Y) .
        floored(X, Y, Z) :- v(X, A), bind(floor(A) as Y), bind(ceil(A) as Z) .
        root(X, Y) :- v(X, A), bind(sqrt(A) as Y) .
        misc(X, Y, Z, W) :- v(X, A), bind(abs(A) as Y), bind(min(A, 3) as Z), bind(max(A, 3) as W) .
        huge(X, Y) :- v(X, A), bind(A * 1e308 * 10 as Y) .
        constant(Y) :- bind(2 + 3 as Y) .
        chained(X, Z) :- bind(Y + 1 as Z), v(X, A), bind(A * 2 as Y) .
        filtered(X) :- v(X, A), bind(A - 1 as D), COMP(D, >, 2) .
    """
    result, reasoner = same_as_engine(spark, program, VALUES)
    assert of(result, "double", 2) >= {("i5", 10), ("f25", 5.0)}
    assert ("zero",) not in {(x,) for x, _ in of(result, "inverse", 2)}  # division by zero
    assert ("f25", 2) in of(result, "rounded", 2)  # round half to even
    assert ("neg",) not in {(x,) for x, _ in of(result, "root", 2)}  # sqrt of a negative
    assert of(result, "constant", 1) == {(5,)}
    assert of(result, "huge", 2) == {("zero", 0)}  # the others overflow to inf: an error
    assert result.runtime_errors > 0 and reasoner.stats()["runtime_errors"] > 0


def test_aggregates(spark):
    program = """
        count(X, N) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with count(T) as N .
        sum(X, N) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with sum(T) as N .
        min(X, N) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with min(T) as N .
        max(X, N) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with max(T) as N .
        avg(X, N) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with avg(T) as N .
        med(X, N) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with med(T) as N .
        total(N) :- aggregate( temp(Y, T) ) with count(T) as N .
        none(N) :- aggregate( missing(Y, T) ) with count(T) as N .
        edges(X, N) :- aggregate( nb(X, _) ) on X with count(X) as N .
        big(X, N) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with count(T) as N and N >= 3 .
        halved(X, H) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with sum(T) as S
            and bind(S / 2 as H) .
        ones(X, N) :- aggregate( nb(X, Y) ) on X with sum(1) as N .
        doubled(B, X, N) :- aggregate( nb(X, Y) and temp(Y, T) and bind(T * 2 as B) )
            on B, X with count(Y) as N .
    """
    facts = [
        ("nb", "a", "s1"),
        ("nb", "a", "s2"),
        ("nb", "a", "s3"),
        ("nb", "a", "s4"),
        ("nb", "b", "s1"),
        ("nb", "b", "s2"),
        ("nb", "b", "s5"),
        ("nb", "c", "s6"),
        ("nb", "d", "s5"),
        ("nb", "d", "s7"),
        ("temp", "s1", 20),
        ("temp", "s2", 20),  # same reading, other neighbour: counts twice
        ("temp", "s3", 23),
        ("temp", "s4", 24.5),
        ("temp", "s5", 21),
        ("temp", "s6", Literal("broken")),  # skipped by sum..med, counted by count
        ("temp", "s7", 21.0),
    ]
    result, _ = same_as_engine(spark, program, facts)
    assert of(result, "count", 2) == {("a", 4), ("b", 3), ("c", 1), ("d", 2)}
    assert ("a", 87.5) in of(result, "sum", 2) and ("b", 61) in of(result, "sum", 2)
    assert ("c",) not in {(x,) for x, _ in of(result, "sum", 2)}  # no number left
    assert ("a", 21.5) in of(result, "med", 2) and ("b", 20) in of(result, "med", 2)
    assert of(result, "total", 1) == {(7,)}
    assert of(result, "none", 1) == set()  # no substitution, no group, no count of 0
    assert of(result, "big", 2) == {("a", 4), ("b", 3)}
    assert ("d", 42, 2) in {(x, b, n) for b, x, n in of(result, "doubled", 3)}  # 21 and 21.0


EDGES = [
    ("e", "a", "b"),
    ("e", "b", "c"),
    ("e", "c", "a"),  # a cycle
    ("e", "c", "d"),
    ("e", "x", "y"),
    ("e", "y", "x"),  # a two-cycle: irreflexive TC derives nothing new from it
    ("e", "l", "l"),  # a self-loop
    ("e", "l", "m"),
    ("e", "s", "t"),
]
TC = "r(X, Y) :- e(X, Y) .\nr(X, Z) :- r(X, Y) and r(Y, Z) {extra} .\n"
STC = TC + "r(X, Y) :- r(Y, X) .\n"


@pytest.mark.parametrize("irreflexive", [False, True], ids=["plain", "irreflexive"])
def test_transitive_closure(spark, irreflexive):
    program = TC.format(extra="and COMP(X, !=, Z)" if irreflexive else "")
    result, _ = same_as_engine(spark, program, EDGES)
    assert any(r.module.startswith("transitive") for r in result.reports)
    assert (("a", "a") in of(result, "r", 2)) is not irreflexive


@pytest.mark.parametrize("irreflexive", [False, True], ids=["plain", "irreflexive"])
def test_symmetric_transitive_closure(spark, irreflexive):
    program = STC.format(extra="and COMP(X, !=, Z)" if irreflexive else "")
    result, _ = same_as_engine(spark, program, EDGES)
    assert any(r.module.startswith("symmetric-transitive") for r in result.reports)
    pairs = of(result, "r", 2)
    assert ("d", "b") in pairs and ("m", "l") in pairs and ("l", "l") in pairs  # X's loop
    assert (("a", "a") in pairs) is not irreflexive and (("s", "s") in pairs) is not irreflexive


@pytest.mark.parametrize(
    "step",
    ["r(X, Z) :- r(X, Y) and e(Y, Z) .", "r(X, Z) :- e(X, Y) and r(Y, Z) ."],
    ids=["right-linear", "left-linear"],
)
def test_linear_closures_run_seminaively_and_agree(spark, step):
    """The engine's linear module has no Spark twin: the hyper-node runs as seminaive
    DataFrames, with a filtered copy as base rule and explicit facts of r seeding it."""
    program = f"r(X, Y) :- e(X, Y) and COMP(X, !=, Y) .\n{step}\n"
    facts = EDGES + [("r", "s", "a")]
    result, reasoner = same_as_engine(spark, program, facts)
    assert "seminaive" in {r.module for r in result.reports}
    modules = {n["module"] for n in reasoner.stats()["hyper_nodes"]}
    assert any(m.startswith("linear closure") for m in modules), modules


def test_closures_evaluated_seminaively_agree(spark):
    """``closures=False`` (like ``Reasoner(modules=False)``) runs the same closure programs
    through the generic seminaive evaluation."""
    program = STC.format(extra="and COMP(X, !=, Z)") + "u(X, Z) :- u(X, Y), u(Y, Z) .\n"
    facts = EDGES + [("u", x, y) for _, x, y in EDGES]
    result, _ = same_as_engine(spark, program, facts, closures=False)
    assert {r.module for r in result.reports} == {"non-recursive", "seminaive"}


# The benchmark rule sets (RS1-RS3) run through Spark in tests/engine/test_golden.py, against the
# expected facts of their golden folders and the engine's strata.


# ------------------------------------------------------------------ random programs
@settings(
    # 10 in CI (each example starts several Spark jobs: the suite's time budget), 100 with
    # HYPOTHESIS_PROFILE=thorough
    max_examples=max(1, settings.default.max_examples // 10),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=program_and_facts())
def test_random_programs(spark, case):
    from cloud.spark.materialise import materialise_facts

    program, logical = case
    facts = [to_external(fact) for fact in logical]
    note(f"program:\n{program}")
    note(f"facts: {facts}")
    want = typed(engine(program, facts).facts())
    got = typed(materialise_facts(spark, program, facts, local_below=0))
    assert got == want, f"in Spark: missing {want - got}, extra {got - want}"
    got = typed(materialise_facts(spark, program, facts))  # small: on the driver
    assert got == want, f"on the driver: missing {want - got}, extra {got - want}"


# ------------------------------------------------------------------ command line
def test_cli_writes_parquet_and_ntriples_and_reads_them_back(spark, tmp_path, capsys):
    from cloud.zodiac_cloud_cli import main

    rules = tmp_path / "tc.rules"
    rules.write_text(TC.format(extra="and COMP(X, !=, Z)") + "w(X, N) :- v(X, N) .\n")
    data = tmp_path / "facts.nt"
    data.write_text(
        "".join(f"<{s}> <e> <{o}> .\n" for _, s, o in EDGES)
        + '<a> <v> 5 .\n<b> <v> 2.5 .\n<c> <v> "x"@en .\n<d> <v> true .\n'
    )
    want = typed(engine(rules, list(read_facts(data))).facts())
    first = tmp_path / "first"
    assert (
        main(
            ["materialise", "--rules", str(rules), "--facts", str(data), "--out", str(first)]
            + ["--spark", "always"]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "stratum 1/" in err and "r/2" in out and "total" in out
    assert typed(read_facts(first / "facts.nt")) == want
    # A Parquet fact directory is an input too: the same program over its own output.
    second = tmp_path / "second"
    argv = ["materialise", "--rules", str(rules), "--facts", str(first / "parquet")]
    argv += ["--spark", "always"]
    # (the first run evaluated these small hyper-nodes on the driver; this one in Spark)
    assert main([*argv, "--out", str(second), "--quiet", "--local-below", "0"]) == 0
    assert typed(read_facts(second / "facts.nt")) == want
    assert (second / "parquet" / "manifest.json").is_file()


def test_cli_checkpoint_dir_gets_reliable_checkpoints(spark, tmp_path, capsys):
    """``--checkpoint-dir``: every stratum and seminaive round is checkpointed there (files
    appear), the facts are still the engine's, and a reused session gets its setting back."""
    from cloud.zodiac_cloud_cli import main

    rules = tmp_path / "recursive.rules"
    # A symmetric-transitive closure (its own algorithm) and a linear recursion (seminaive).
    rules.write_text(
        STC.format(extra="and COMP(X, !=, Z)") + "reach(X, Y) :- e(X, Y) .\n"
        "reach(X, Z) :- e(X, Y), reach(Y, Z) .\n"
    )
    data = tmp_path / "facts.nt"
    data.write_text("".join(f"<{s}> <e> <{o}> .\n" for _, s, o in EDGES))
    want = typed(engine(rules, list(read_facts(data))).facts())
    checkpoints, out = tmp_path / "checkpoints", tmp_path / "out"
    before = spark.sparkContext.getCheckpointDir()
    argv = ["materialise", "--rules", str(rules), "--facts", str(data), "--out", str(out)]
    argv += ["--local-below", "0", "--spark", "always"]  # every hyper-node in Spark jobs
    assert main([*argv, "--checkpoint-dir", str(checkpoints), "--quiet"]) == 0
    capsys.readouterr()
    assert typed(read_facts(out / "facts.nt")) == want
    written = [p for p in checkpoints.rglob("*") if p.is_file()]
    assert any(p.parent.name.startswith("rdd-") for p in written), written
    assert spark.sparkContext.getCheckpointDir() == before


@pytest.mark.process
def test_cloud_imports_without_pyspark(tmp_path):
    """The edge install has no pyspark: ``import cloud`` and the CLI's help must work, and
    running the job must say what is missing."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["pyspark"] = None  # any "import pyspark..." now raises ImportError
        import cloud, cloud.spark, cloud.spark.materialise, cloud.spark.storage
        import cloud.zodiac_cloud_cli as cli
        assert cli.build_parser().format_help()
        code = cli.main(["materialise", "--rules", "x.rules", "--out", {str(tmp_path)!r},
                         "--spark", "always"])
        sys.exit(0 if code == 1 else 3)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "pyspark is not installed" in done.stderr and "cloud" in done.stderr


# ------------------------------------------------------------------ the driver-side path
def test_small_hyper_nodes_run_on_the_driver_and_an_exploding_one_in_spark(spark, monkeypatch):
    """With the default threshold every hyper-node here reads few facts, so each runs on the
    driver, except the product whose output is over the (lowered) limit: it is handed back to
    Spark. Run-time errors met on the driver are counted like Spark's."""
    import cloud.spark.materialise as job

    monkeypatch.setattr(job, "MAX_OUTPUT", 500)
    program = (
        "pair(X, Y) :- n(X) and n(Y) .\n"
        "half(X, H) :- v(X, N) and bind(N / 2 as H) .\n"
        "inv(X, R) :- v(X, N) and bind(1 / N as R) .\n"
    )
    facts = [(RDF_TYPE, f"x{i}", "n") for i in range(30)]
    facts += [("v", "a", 4), ("v", "b", 0), ("v", "c", 2.5)]
    result, reasoner = same_as_engine(spark, program, facts, local_below=job.LOCAL_BELOW)
    modules = {tuple(report.rules): report.module for report in result.reports}
    assert [m for m in modules.values() if m != "driver"] == ["non-recursive"], modules
    assert result.counts()[("pair", 2)] == 900
    assert result.runtime_errors > 0 and reasoner.stats()["runtime_errors"] > 0


# ------------------------------------------------------------------ equality (owl:sameAs)
def test_equality_gives_the_engines_expanded_model(spark):
    """Equality from a key, a functional property, a constant, transitive links and explicit
    facts; rules above it with negation, aggregates, comparisons, binds, merged constants and
    owl:sameAs read; every hyper-node in Spark, including the equality component's rounds."""
    from cloud.spark.materialise import materialise
    from tests.engine.test_equality import POOL, PREFIX, RDF

    chosen = [rule for rule in POOL if "X != Y ." not in rule and "not alias" not in rule]
    chosen = [rule for rule in chosen if "node(X) ." not in rule or "key:" not in rule]
    program = PREFIX + "\n".join(chosen)
    same = "http://www.w3.org/2002/07/owl#sameAs"
    facts = [
        ("key", "a", "s1"), ("key", "b", "s1"), ("code", "c", "s2"), ("key", "d", "s2"),
        ("fn", "e", "c"), ("fn", "e", "e"), ("link", "a", "c"), ("link", "c", "b"),
        ("link", "b", "a"), ("link", "d", "e"), ("val", "a", 2), ("val", "e", 3),
        (RDF, "b", "node"), (RDF, "d", "alias"), (RDF, "c", "node"), (same, "e", 1),
    ]  # fmt: skip
    want = engine(program, facts)
    assert want.stats()["equality"]["largest_class"] >= 3
    result = materialise(spark, program, facts, local_below=0)
    assert typed(result.facts()) == typed(want.facts())
    assert result.equality_reports, "the equality component ran in Spark"
