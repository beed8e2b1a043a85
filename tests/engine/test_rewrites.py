"""Plans as objects: each rewrite claims the rule shapes it is written for (asserted on the
compiled entry's ``shape``, never on generated text), describes itself, and the compiled code
is named after the rule, its delta position and its shape; ``zodiac-edge explain --plans``
prints all of it. Whether each shape computes the right facts is the differential tests' job.
"""

from __future__ import annotations

import io
import traceback

import pytest

from agent.engine import Reasoner
from agent.engine.cli import main as zodiac_edge
from agent.engine.plan.compiler import code_of
from agent.engine.plan.executor import Variant
from agent.engine.plan.rewrites import REWRITES, Shape
from agent.engine.plan.rewrites.base import Context, Node
from agent.engine.plan.rewrites.product import product

EDGES = [("e", f"n{i}", f"n{i + 1}") for i in range(6)] + [("k", "n1"), ("k", "n3")]
# (rule, the shape its first evaluation must take)
SHAPES = [
    ("h: <h>(X, Y) :- <e>(X, Y) .", Shape.PROJECTION),
    ("h: <h>(Y, X) :- <e>(X, Y) .", Shape.PROJECTION),
    ("h: <h>(X, Y) :- <e>(X, Y) and <k>(Y) .", Shape.KEY_FILTER),
    ("h: <h>(X) :- <e>(X, Y) and not <k>(Y) .", Shape.KEY_FILTER),
    ("h: <h>(X, Z) :- <e>(X, Y) and <e>(Y, Z) .", Shape.GROUPED_JOIN),
    ("h: <h>(X, Y, Z) :- <e>(X, Y) and <e>(Y, Z) .", Shape.PRODUCT),
    ("h: <h>(X, Z) :- <e>(X, Y) and <e>(Y, Z) and COMP(X, <, Z) .", Shape.NESTED_LOOPS),
    ("h: <h>(X, Z) :- <e>(X, Y) and <missing>(Y, Z) .", Shape.EMPTY),
]


def reasoner_with(rule: str) -> Reasoner:
    reasoner = Reasoner(modules=False)
    reasoner.add_facts(EDGES)
    reasoner.add_rules(rule)
    return reasoner


@pytest.mark.parametrize(("rule", "shape"), SHAPES)
def test_each_shape_is_chosen_for_the_rules_it_is_written_for(rule, shape):
    entries = [e for e in reasoner_with(rule).plans("h") if e.variant is Variant.RULE]
    assert [e.shape for e in entries] == [shape]
    entry = entries[0]
    assert entry.node.shape is shape
    assert entry.describe().startswith(f"h [rule, no delta] {shape.value}")
    assert entry.function.__code__.co_filename == f"<h rule {shape.value}>"


def test_a_plan_deeper_than_python_allows_is_segmented():
    body = " and ".join(f"<e>(X{i}, X{i + 1})" for i in range(24))
    reasoner = reasoner_with(f"h: <h>(X0, X24, X12) :- {body} .")
    assert [e.shape for e in reasoner.plans("h")] == [Shape.SEGMENTED]


def test_every_rewrite_declines_what_it_is_not_written_for():
    """The generic plan of a join with a value comparison: no rewrite may claim it."""
    reasoner = reasoner_with(SHAPES[6][0])
    plan = reasoner.plans("h")[0].plan
    context = Context(tuple(plan.rule.head.terms), {0: 1, 1: 1, 2: 0})
    assert [rewrite(plan, context) for rewrite in REWRITES] == [None] * len(REWRITES)
    assert product(plan, context) is None


def test_a_runtime_error_names_the_rule_and_shape_in_its_traceback():
    """Compiled code carries a filename naming the rule: a traceback from inside it says which
    rule ran (here the plan is called with a broken store list on purpose)."""
    reasoner = reasoner_with(SHAPES[4][0])
    entry = reasoner.plans("h")[0]
    with pytest.raises(Exception) as error:
        entry.function([[None]] * 2, None, set(), [0], None)
    frames = [frame.filename for frame in traceback.extract_tb(error.value.__traceback__)]
    assert "<h rule grouped join>" in frames


def test_nodes_describe_their_steps():
    entry = reasoner_with(SHAPES[2][0]).plans("h")[0]
    assert isinstance(entry.node, Node)
    text = entry.node.describe()
    assert text.startswith("key filter: <e>(X, Y)") and "<k>(Y)" in text


def test_explain_plans_prints_every_rule_and_one_by_name(tmp_path):
    rules = tmp_path / "r.rules"
    rules.write_text(
        "copy: <h>(X, Y) :- <e>(X, Y) .\n"
        "semi: <s>(X) :- <e>(X, Y) and not <e>(Y, X) .\n"
        "two: <g>(X, Z) :- <e>(X, Y) and <e>(Y, Z) and COMP(X, !=, Z) .\n"
        "pair: <p>(X, Z) :- <e>(X, Y) and <e>(Y, Z) .\n"
        "tc: <t>(X, Y) :- <e>(X, Y) .\n"
        "tc2: <t>(X, Z) :- <t>(X, Y) and <t>(Y, Z) .\n"
    )
    facts = tmp_path / "f.nt"
    facts.write_text("".join(f"<{s}> <e> <{o}> .\n" for _, s, o in EDGES[:6]))
    out = io.StringIO()
    assert zodiac_edge(["explain", str(rules), str(facts), "--plans"], out=out) == 0
    text = out.getvalue()
    assert "# copy: <h>(X, Y) :- <e>(X, Y) ." in text
    assert "no compiled plan (evaluated by the renaming module)" in text
    assert "semi [rule, no delta] key filter" in text
    assert "two [rule, no delta] grouped join" in text
    assert "def rule(S, D, out, ERR, GUARD):" in text
    assert "no compiled plan (evaluated by the transitive module)" in text
    assert "no compiled plan (evaluated by the composition module)" in text
    out = io.StringIO()
    assert zodiac_edge(["explain", str(rules), str(facts), "--plans", "two"], out=out) == 0
    assert "# two:" in out.getvalue() and "# copy" not in out.getvalue()


def test_explain_plans_of_an_unknown_rule_is_a_clear_error(tmp_path, capsys):
    rules = tmp_path / "r.rules"
    rules.write_text("copy: <h>(X, Y) :- <e>(X, Y) .\n<g>(X) :- <h>(X, Y) .\n")
    facts = tmp_path / "f.nt"
    facts.write_text("<a> <e> <b> .\n")
    assert zodiac_edge(["explain", str(rules), str(facts), "--plans", "nope"]) == 2
    err = capsys.readouterr().err  # (labels first, then the content keys of unlabelled rules)
    assert "no rule named 'nope' (rules: copy, h" in err and "--plans alone" in err


def test_compiled_code_is_shared_between_reasoners_only_for_the_same_text():
    """Python's compilation of a plan's text is kept for the whole process (compiler.code_of):
    a second reasoner with the same rule and terms reuses it, and one whose constant has
    another term id compiles its own text and answers by its own ids."""
    rule = "q(X, Y) :- p(X, Y) and p(X, a) ."
    first, second, third = Reasoner(), Reasoner(), Reasoner()
    for reasoner in (first, second):
        reasoner.add_facts([("p", "x", "a"), ("p", "y", "b")])
    third.add_facts([("p", "y", "b"), ("p", "z", "c"), ("p", "x", "a")])  # "a" numbered later
    hits = code_of.cache_info().hits
    first.add_rules(rule)
    second.add_rules(rule)
    assert code_of.cache_info().hits > hits
    third.add_rules(rule)
    assert (
        set(first.facts("q"))
        == set(second.facts("q"))
        == set(third.facts("q"))
        == {("q", "x", "a")}
    )


def test_an_innermost_atom_with_several_free_columns_is_a_product():
    """Its bucket holds tuples: the head's columns are cut out of it in C, every fact kept."""
    reasoner = Reasoner(modules=False)
    triples = [("t", f"s{i}", f"n{i % 9}", f"o{i}") for i in range(30)]
    reasoner.add_facts([*EDGES, *triples])
    reasoner.add_rules("h: <h>(A, Z, X) :- <e>(A, Y) and <t>(X, Y, Z) .")
    entries = [e for e in reasoner.plans("h") if e.variant is Variant.RULE]
    assert [e.shape for e in entries] == [Shape.PRODUCT]
    edges = {(a, b) for _, a, b in EDGES[:6]}
    expected = {("h", a, o, s) for _, s, n, o in triples for a, b in edges if b == n}
    assert expected and set(reasoner.facts("h")) == expected
