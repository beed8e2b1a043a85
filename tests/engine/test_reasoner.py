"""The Reasoner's public API: results, stats, explain, query, and bad input that changes nothing."""

from __future__ import annotations

import re

import pytest

from agent.engine import (
    RDF_TYPE,
    Literal,
    ParseError,
    Reasoner,
    RuleError,
    StratificationError,
    UnknownRuleError,
    UnsafeRuleError,
    ZodiacError,
)
from agent.engine.terms import MAX_TERMS

ANCESTORS = """
anc(X, Y) :- parent(X, Y) .
anc(X, Z) :- anc(X, Y) and parent(Y, Z) .
"""


def snapshot(reasoner: Reasoner):
    return (
        set(reasoner.facts()),
        dict(reasoner.rules),
        [(n.name, [r.id for r in n.rules]) for n in reasoner.nodes],
    )


@pytest.fixture
def family() -> Reasoner:
    reasoner = Reasoner()
    reasoner.add_rules(ANCESTORS)
    reasoner.add_facts([("parent", "a", "b"), ("parent", "b", "c"), ("parent", "c", "d")])
    return reasoner


def test_add_rules_returns_ids_in_text_order_and_is_idempotent():
    reasoner = Reasoner()
    ids = reasoner.add_rules("r1: p(X) :- q(X) .\nr0: s(X) :- p(X) .\nt(X) :- s(X) .")
    assert ids[:2] == ["r1", "r0"] and ids[2].startswith("h")
    assert reasoner.add_rules("r0: s(X) :- p(X) .") == ["r0"]
    assert len(reasoner.rules) == 3


def test_same_label_for_a_different_rule_is_refused(family: Reasoner):
    family.add_rules("x: q(X) :- anc(X, Y) .")
    before = snapshot(family)
    with pytest.raises(RuleError, match="already used"):
        family.add_rules("x: q(Y) :- anc(X, Y) .")
    assert snapshot(family) == before


def test_facts_are_decoded_tuples(family: Reasoner):
    assert ("anc", "a", "d") in set(family.facts("anc"))
    assert len(set(family.facts("anc"))) == 6
    assert family.count() == 9


def test_class_facts_come_out_as_rdf_type_triples():
    reasoner = Reasoner()
    reasoner.add_rules("<Big>(X) :- <size>(X, S) and COMP(S, >, 10) .")
    reasoner.add_facts([("size", "t1", 12), ("size", "t2", 3)])
    assert set(reasoner.facts(RDF_TYPE)) == {(RDF_TYPE, "t1", "Big")}
    assert reasoner.query("<Big>(X)") == [{"X": "t1"}]


def test_numbers_compare_numerically_and_5_equals_5_0():
    reasoner = Reasoner()
    reasoner.add_rules("same(X, Y) :- v(X, A), v(Y, B), A = B, X != Y .")
    reasoner.add_facts([("v", "a", 5), ("v", "b", 5.0), ("v", "c", 6)])
    assert set(reasoner.facts("same")) == {("same", "a", "b"), ("same", "b", "a")}


def test_literals_strings_and_booleans_are_kept_apart():
    reasoner = Reasoner()
    reasoner.add_rules("eq(X, Y) :- v(X, A), v(Y, B), A = B, X != Y .")
    reasoner.add_facts([("v", "a", "1"), ("v", "b", Literal("1")), ("v", "c", 1), ("v", "d", True)])
    assert set(reasoner.facts("eq")) == set()


def test_runtime_errors_drop_the_substitution_and_are_counted():
    reasoner = Reasoner()
    reasoner.add_rules("q(X, R) :- v(X, A), d(X, B), bind(A / B as R) .")
    reasoner.add_facts([("v", "a", 6), ("d", "a", 3), ("v", "b", 1), ("d", "b", 0)])
    reasoner.add_facts([("v", "c", "text"), ("d", "c", 2)])
    assert set(reasoner.facts("q")) == {("q", "a", 2.0)}
    assert reasoner.stats()["runtime_errors"] >= 2


def test_query_with_constants_and_repeated_variables(family: Reasoner):
    assert sorted(a["Y"] for a in family.query("anc(<a>, Y)")) == ["b", "c", "d"]
    assert family.query("anc(X, X)") == []
    assert family.query("anc(<a>, <zzz>)") == []


def test_stats_report_hyper_nodes_modules_and_sizes(family: Reasoner):
    stats = family.stats()
    assert stats["predicates"]["anc/2"] == 6
    assert stats["explicit_facts"] == 3 and stats["facts"] == 9
    nodes = stats["hyper_nodes"]
    assert [n["module"] for n in nodes] == ["renaming", "linear closure (right-linear)"]
    assert any(n["recursive"] for n in nodes)
    assert all("seconds" in n for n in nodes)
    assert stats["last_update"]["seconds"] >= 0


def test_explain_gives_a_well_founded_derivation(family: Reasoner):
    tree = family.explain(("anc", "a", "d"))
    assert tree.rule is not None and tree.fact == ("anc", "a", "d")

    def leaves(node):
        return [node] if not node.premises else [x for p in node.premises for x in leaves(p)]

    assert all(leaf.explicit for leaf in leaves(tree))
    assert ("parent", "c", "d") in {leaf.fact for leaf in leaves(tree)}
    assert "by rule" in str(tree)
    with pytest.raises(KeyError):
        family.explain(("anc", "d", "a"))


def test_explain_shows_absent_facts_of_negation():
    reasoner = Reasoner()
    reasoner.add_rules("ok(X) :- item(X), not broken(X) .")
    reasoner.add_facts([(RDF_TYPE, "a", "item")])
    tree = reasoner.explain((RDF_TYPE, "a", "ok"))
    assert tree.absent and "broken" in tree.absent[0]


@pytest.mark.parametrize(
    "text, error, message",
    [
        ("p(X) :- q(X", ParseError, "1:"),
        ("p(X, Y) :- q(X) .", UnsafeRuleError, "Y"),
        ("p(X) :- q(X) and bind(Z + 1 as W) .", UnsafeRuleError, "Z"),
        ("p(X) :- q(X) and COMP(Y, >, 3) .", UnsafeRuleError, "Y"),
        ("p(X) :- q(X) and not r(X) .\nr(X) :- p(X) .", StratificationError, "cycle"),
        (
            "c(X, N) :- aggregate( e(X, Y) ) on X with count(Y) as N .\nc(X, Y) :- e(X, Y) .",
            RuleError,
            "aggregate",
        ),
    ],
)
def test_bad_rules_are_refused_and_change_nothing(family, text, error, message):
    before = snapshot(family)
    with pytest.raises(error, match=message):
        family.add_rules(text)
    assert snapshot(family) == before


def test_parse_error_names_file_line_and_column(tmp_path, family):
    bad = tmp_path / "bad.rules"
    bad.write_text("ok(X) :- q(X) .\n\nbroken(X) :- q(X) and and r(X) .\n")
    before = snapshot(family)
    with pytest.raises(ParseError) as error:
        family.add_rules(bad)
    assert error.value.source.endswith("bad.rules") and error.value.line == 3
    assert error.value.column > 1
    assert snapshot(family) == before


def test_a_mistyped_rule_file_name_is_said_so(tmp_path, family):
    """A one-line string that ends as a rule file's name but names no file is a path
    mistyped: said so, not parsed as rule text (it gave "expected '(' after the predicate")."""
    before = snapshot(family)
    for name in (str(tmp_path / "missing.rules"), "missing.dl"):
        with pytest.raises(ZodiacError, match=f"no such rule file: {re.escape(name)}"):
            family.add_rules(name)
    assert snapshot(family) == before
    good = tmp_path / "good.rules"
    good.write_text("kid(X) :- parent(Y, X) .\n")
    assert len(family.add_rules(str(good))) == 1


def test_bad_fact_file_changes_nothing(tmp_path, family):
    bad = tmp_path / "bad.nt"
    bad.write_text('<a> <parent> <z> .\n<b> <parent> "unterminated .\n')
    before = snapshot(family)
    with pytest.raises(ParseError, match="bad.nt"):
        family.add_facts(bad)
    assert snapshot(family) == before
    with pytest.raises(ZodiacError, match="no such fact file"):
        family.add_facts(tmp_path / "missing.nt")


def test_malformed_fact_tuples_are_refused(family):
    before = snapshot(family)
    for bad in [("parent",), (42, "a", "b"), "parent a b"]:
        with pytest.raises(ZodiacError):
            family.add_facts([("parent", "x", "y"), bad])
    assert snapshot(family) == before


def test_the_term_dictionary_limit_is_refused_and_changes_nothing(family):
    """Term ids are 32-bit (the saved state's bitmaps hold 32-bit values): the update that
    would bring one term too many is refused, with the reason, before anything changes. The
    limit is lowered here to reach it; the real one is 2**32."""
    assert MAX_TERMS == 2**32 and family.terms.limit == MAX_TERMS
    family.terms.limit = len(family.terms) + 1
    before = snapshot(family)
    with pytest.raises(ZodiacError, match="term dictionary is full"):
        family.add_facts([("parent", "new-1", "new-2")])
    assert snapshot(family) == before
    family.add_facts([("parent", "a", "new-1")])  # one new term still fits
    assert ("parent", "a", "new-1") in set(family.facts())


def test_delete_rules_by_id_and_by_text(family):
    ids = family.add_rules("q(X) :- anc(X, <d>) .")
    assert {f[1] for f in family.facts(RDF_TYPE)} == {"a", "b", "c"}
    family.delete_rules("q(X) :- anc(X, <d>) .")
    assert set(family.facts(RDF_TYPE)) == set()
    with pytest.raises(UnknownRuleError):
        family.delete_rules(ids)


def test_delete_facts_only_removes_explicit_ones(family):
    assert family.delete_facts([("anc", "a", "b")]) == 0
    assert family.delete_facts([("parent", "c", "d")]) == 1
    assert ("anc", "a", "d") not in set(family.facts("anc"))


def test_existential_negation():
    reasoner = Reasoner()
    reasoner.add_rules("<p20>(X, Y) :- <p12>(X, Y) and not <p13>(Y, Z) .")
    reasoner.add_facts([("p12", "a", "b"), ("p12", "a", "c"), ("p13", "c", "z")])
    assert set(reasoner.facts("p20")) == {("p20", "a", "b")}


def test_n_ary_relations_and_facts_in_rule_text():
    reasoner = Reasoner()
    reasoner.add_rules(
        "edge3(a, b, 1) . edge3(b, c, 2) .\n"
        "hop(X, Z, W) :- edge3(X, Y, A), edge3(Y, Z, B), bind(A + B as W) ."
    )
    assert set(reasoner.facts("hop")) == {("hop", "a", "c", 3)}
