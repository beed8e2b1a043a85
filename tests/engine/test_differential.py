"""Differential tests: the engine against the reference evaluator on random programs.

``tests/support/strategies.py`` generates small valid programs (recursion, negation with existential
variables, comparisons, binds, aggregates) and fact sets; ``tests/support/reference.py`` is the
oracle. Checked here:

(a) the engine's materialisation equals the oracle's;
(b) it does not depend on how the facts are batched (one batch, one at a time, random chunks)
    nor on whether rules come before, after or between the facts, all at once or one by one;
(c) run-time errors: zero in both or non-zero in both. Only on programs generated with
    ``robust_errors=True`` (where whether an error happens cannot depend on the order in which
    a plan evaluates body items), and only for single-batch loads: with incremental updates an
    engine legitimately evaluates rules over intermediate states (a fact derived through
    negation, later retracted), where errors the final state does not show can happen.
"""

from __future__ import annotations

from itertools import pairwise

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from agent.engine import Reasoner
from agent.engine.language import ANONYMOUS, Atom, Constant, Program, Variable
from tests.support.reference import evaluate, same, to_external
from tests.support.strategies import program_and_facts

SETTINGS = settings(  # twice the profile's examples (tests/conftest.py): 200 in CI
    max_examples=2 * settings.default.max_examples,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def external(facts: list[tuple]) -> list[tuple]:
    return [to_external(fact) for fact in facts]


def expected(program: Program, facts: list[tuple]) -> set[tuple]:
    note(f"program:\n{program}")
    note(f"facts: {facts}")
    return evaluate(program, facts).external()


def engine_facts(reasoner: Reasoner) -> set[tuple]:
    return {tuple(fact) for fact in reasoner.facts()}


def assert_same(actual: set[tuple], wanted: set[tuple], how: str) -> None:
    """Equality, with the difference spelled out (sets compare 5 and 5.0 as equal)."""
    assert actual == wanted, (
        f"{how}: engine is missing {sorted(map(repr, wanted - actual))}, "
        f"has extra {sorted(map(repr, actual - wanted))}"
    )


def chunks(data: st.DataObject, items: list) -> list[list]:
    """``items`` cut at random places (possibly into empty pieces)."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(items)), max_size=5), label="cuts"))
    return [items[a:b] for a, b in pairwise([0, *cuts, len(items)])]


@SETTINGS
@given(program_and_facts())
def test_engine_equals_reference(case):
    program, facts = case
    wanted = expected(program, facts)
    reasoner = Reasoner()
    reasoner.add_rules(program)
    reasoner.add_facts(external(facts))
    assert_same(engine_facts(reasoner), wanted, "rules, then facts in one batch")


@SETTINGS
@given(program_and_facts(), st.data())
def test_batching_and_rule_order_do_not_matter(case, data):
    program, facts = case
    wanted = expected(program, facts)
    ext = external(facts)

    one_by_one = Reasoner()
    one_by_one.add_rules(program)
    for fact in ext:
        one_by_one.add_facts([fact])
    assert_same(engine_facts(one_by_one), wanted, "rules, then facts one at a time")

    chunked = Reasoner()
    chunked.add_rules(program)
    for piece in chunks(data, ext):
        chunked.add_facts(piece)
    assert_same(engine_facts(chunked), wanted, "rules, then facts in random chunks")

    rules_last = Reasoner()
    rules_last.add_facts(ext)
    rules_last.add_rules(program)
    assert_same(engine_facts(rules_last), wanted, "facts, then rules")

    split = data.draw(st.integers(0, len(ext)), label="split")
    between = Reasoner()
    between.add_facts(ext[:split])
    between.add_rules(program)
    between.add_facts(ext[split:])
    assert_same(engine_facts(between), wanted, "some facts, rules, the other facts")


@SETTINGS
@given(program_and_facts(), st.data())
def test_rules_added_one_at_a_time(case, data):
    """Every subset of a valid generated program is valid (stratifiable, one rule per aggregate
    head), so rules can be inserted one by one in any order, between fact batches."""
    program, facts = case
    wanted = expected(program, facts)
    rules = data.draw(st.permutations(program.rules), label="rule order")
    pieces = chunks(data, external(facts))
    reasoner = Reasoner()
    for i, rule in enumerate(rules):
        if i < len(pieces):
            reasoner.add_facts(pieces[i])
        reasoner.add_rules(Program((rule,)))
    for piece in pieces[len(rules) :]:
        reasoner.add_facts(piece)
    assert_same(engine_facts(reasoner), wanted, f"rules one at a time, in order {rules}")


@SETTINGS
@given(program_and_facts(robust_errors=True), st.booleans())
def test_runtime_errors_agree(case, rules_first):
    program, facts = case
    oracle = evaluate(program, facts)
    note(f"program:\n{program}")
    note(f"facts: {facts}")
    reasoner = Reasoner()
    if rules_first:
        reasoner.add_rules(program)
        reasoner.add_facts(external(facts))
    else:
        reasoner.add_facts(external(facts))
        reasoner.add_rules(program)
    assert_same(engine_facts(reasoner), oracle.external(), "single batch")
    errors = reasoner.stats()["runtime_errors"]
    assert (errors > 0) == (oracle.errors > 0), (
        f"engine counted {errors} run-time errors, the reference {oracle.errors}"
    )


# Query patterns: a named variable (one written with a leading ``_`` included), the anonymous
# ``_`` (each occurrence its own, no part of the answers), or a constant.
PATTERN_VARIABLES = [Variable("X"), Variable("Y"), Variable("_x")]


def pattern_answers(facts: set[tuple], atom: Atom) -> set[frozenset]:
    """The reference answers of a pattern over facts in logical form: each matching fact's
    binding of the named variables, as a set (so distinct by construction)."""
    found = set()
    for fact in facts:
        if fact[0] != atom.predicate or len(fact) - 1 != atom.arity:
            continue
        binding: dict[str, object] = {}
        for term, value in zip(atom.terms, fact[1:], strict=True):
            if isinstance(term, Constant):
                if not same(term.value, value):
                    break
            elif term.name == ANONYMOUS:
                continue
            elif term.name in binding:
                if not same(binding[term.name], value):
                    break
            else:
                binding[term.name] = value
        else:
            found.add(frozenset(binding.items()))
    return found


@SETTINGS
@given(program_and_facts(), st.data())
def test_query_answers_each_binding_once(case, data):
    """``Reasoner.query`` against the reference's facts, for patterns over the relations the
    model holds: constants from the facts (or absent ones), repeated variables and ``_``.
    Every answer is given once: a pattern with ``_`` once gave an answer per match."""
    program, facts = case
    model = evaluate(program, facts).facts
    reasoner = Reasoner()
    reasoner.add_rules(program)
    reasoner.add_facts(external(facts))
    relations = sorted({(fact[0], len(fact) - 1) for fact in model})
    if not relations:
        return
    for _ in range(3):
        name, arity = data.draw(st.sampled_from(relations), label="relation")
        values = sorted({v for fact in model for v in fact[1:]}, key=repr) + ["absent"]
        terms = data.draw(
            st.lists(
                st.one_of(
                    st.sampled_from(PATTERN_VARIABLES),
                    st.just(Variable(ANONYMOUS)),
                    st.sampled_from(values).map(Constant),
                ),
                min_size=arity,
                max_size=arity,
            ),
            label="pattern",
        )
        atom = Atom(name, tuple(terms))
        answers = reasoner.query(atom)
        got = [frozenset(answer.items()) for answer in answers]
        assert len(got) == len(set(got)), f"{atom}: an answer given twice: {answers}"
        assert set(got) == pattern_answers(model, atom), f"{atom}: {answers}"


def test_a_query_text_keeps_its_anonymous_variables_apart():
    """In pattern text each ``_`` matches anything on its own, and ``_x`` is a variable."""
    reasoner = Reasoner()
    reasoner.add_facts([("p", "a", "b"), ("p", "a", "c"), ("p", "d", "d")])
    assert sorted(a["X"] for a in reasoner.query("p(X, _)")) == ["a", "d"]
    assert reasoner.query("p(_, _)") == [{}]
    assert sorted(a["_x"] for a in reasoner.query("p(_x, _x)")) == ["d"]
    assert reasoner.query("p(<a>, <b>)") == [{}] and reasoner.query("p(<b>, _)") == []
