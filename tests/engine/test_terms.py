"""The term dictionary's batch encoding (``encode_facts``) against encoding fact by fact.

``Reasoner.update`` encodes every batch of facts with ``encode_facts``, which groups tuple facts
by predicate and arity and encodes them a column at a time. Whatever the batch holds (several
predicates and arities, rdf:type facts, ground atoms, numbers, literals, booleans, IRIs seen
before and new ones), it must give the facts ``encode_fact`` gives one by one: the same
relations and, decoded, the same values; and a bad fact must raise what ``encode_fact`` raises.

Small batches (an agent's reading) go fact by fact (``COLUMNS_FROM``): every test here runs
twice, once with the column path taken from the first fact on.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engine import terms as terms_module
from agent.engine.errors import NonFiniteError, ZodiacError
from agent.engine.language import RDF_TYPE, Atom, Constant, Literal
from agent.engine.terms import TermDictionary


@pytest.fixture(autouse=True, scope="module", params=["by columns from one fact", "as shipped"])
def column_threshold(request):
    """The tests once with every batch taken a column at a time, once as the engine ships."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param != "as shipped":
            patch.setattr(terms_module, "COLUMNS_FROM", (1, 1))
        yield


values = st.one_of(
    st.sampled_from(["a", "b", "c", "http://x/d"]),
    st.integers(-3, 3),
    st.sampled_from([1.5, 2.0, True, False, 0.0, -0.0, 3.0]),
    st.builds(Literal, st.sampled_from(["x", "y"])),
)
tuple_facts = st.builds(
    lambda predicate, args: (predicate, *args),
    st.sampled_from(["p", "q"]),
    st.lists(values, min_size=1, max_size=3),
)
type_facts = st.builds(lambda value, cls: (RDF_TYPE, value, cls), values, st.sampled_from("CD"))
atom_facts = st.builds(
    lambda predicate, args: Atom(predicate, tuple(Constant(v) for v in args)),
    st.sampled_from(["p", "r"]),
    st.lists(values, min_size=1, max_size=2),
)
class_named_facts = st.builds(lambda cls, value: (cls, value), st.sampled_from("CD"), values)
batches = st.one_of(
    st.lists(st.one_of(tuple_facts, tuple_facts, type_facts, atom_facts), max_size=30),
    # tuples only: the batch is encoded a relation and a column at a time (``C(x)`` given as
    # ``(C, x)`` and as ``(rdf:type, x, C)`` in one batch is one relation)
    st.lists(st.one_of(tuple_facts, type_facts, class_named_facts), max_size=30),
    # one relation of one arity (a CSV file's rows: its columns are cut out at once)
    st.integers(1, 3).flatmap(
        lambda arity: st.lists(
            st.lists(values, min_size=arity, max_size=arity).map(lambda args: ("p", *args)),
            max_size=30,
        )
    ),
)


def decoded(terms: TermDictionary, grouped: dict) -> dict:
    return {
        key: sorted(map(repr, (tuple(map(terms.decode, ids)) for ids in rows)))
        for key, rows in grouped.items()
    }


def one_by_one(facts: list) -> tuple[TermDictionary, dict]:
    terms = TermDictionary()
    grouped: dict = {}
    for fact in facts:
        key, ids = terms.encode_fact(fact)
        grouped.setdefault(key, []).append(ids)
    return terms, grouped


@given(known=batches, batch=batches)
def test_a_batch_encodes_as_fact_by_fact(known, batch):
    terms = TermDictionary()
    terms.encode_facts(known)  # some terms seen before the batch
    grouped, count = terms.encode_facts(batch)
    assert count == len(batch)
    expected_terms, _ = one_by_one(known)
    expected: dict = {}
    for fact in batch:
        key, ids = expected_terms.encode_fact(fact)
        expected.setdefault(key, []).append(ids)
    # (5 after 5.0 is one term, decoded as the first seen: the same in both)
    assert decoded(terms, grouped) == decoded(expected_terms, expected)
    assert len(terms) == len(expected_terms)  # no term twice


@given(known=batches, batch=batches)
def test_a_batch_is_looked_up_as_fact_by_fact(known, batch):
    """Deletions are looked up, never encoded: a batch by columns gives what each fact's own
    lookup gives, facts naming a term never seen left out, and adds no term."""
    terms = TermDictionary()
    terms.encode_facts(known)
    size = len(terms)
    expected = [terms.lookup_fact(fact) for fact in batch]
    found = terms.lookup_facts(batch)
    assert sorted(found) == sorted(fact for fact in expected if fact[0] is not None)
    assert len(terms) == size


def test_one_relation_from_a_csv_file_is_encoded_by_columns():
    rows = [("triple", f"s{i % 50}", "type", f"C{i % 7}") for i in range(1000)]
    terms = TermDictionary()
    grouped, count = terms.encode_facts(rows)
    assert count == 1000 and list(grouped) == [("triple", 3)]
    assert [tuple(map(terms.decode, ids)) for ids in grouped[("triple", 3)]] == [
        r[1:] for r in rows
    ]
    assert len(terms) == 50 + 1 + 7
    assert terms.lookup("s3") == terms.encode("s3") and terms.lookup("nowhere") is None


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (("p", float("nan")), NonFiniteError),
        (("p", ["a list"]), TypeError),
        ((5, "a"), ZodiacError),
        (("p",), ZodiacError),
    ],
)
def test_a_bad_fact_in_a_batch_raises_what_encode_fact_raises(bad, error):
    batch = [("p", "a"), ("p", "b"), bad, ("p", "c")]
    with pytest.raises(error):
        TermDictionary().encode_fact(bad)
    with pytest.raises(error):
        TermDictionary().encode_facts(batch)
    with pytest.raises(error):
        TermDictionary().encode_facts([bad] * 3)


def test_a_batch_of_several_relations_and_classes_is_grouped_by_relation():
    batch = [
        ("hasSensor", "t1", "s1"),
        (RDF_TYPE, "t1", "Turbine"),
        ("hasSensor", "t2", "s2"),
        ("Turbine", "t2"),  # the class fact Turbine(t2), given as a unary fact
        (RDF_TYPE, "s1", "Sensor"),
        ("reading", "s1", 3.5, Literal("ok")),
    ]
    terms = TermDictionary()
    grouped, count = terms.encode_facts(batch)
    assert count == 6
    assert {
        key: [tuple(map(terms.decode, ids)) for ids in rows] for key, rows in grouped.items()
    } == {
        ("hasSensor", 2): [("t1", "s1"), ("t2", "s2")],
        ("Turbine", 1): [("t1",), ("t2",)],
        ("Sensor", 1): [("s1",)],
        ("reading", 3): [("s1", 3.5, Literal("ok"))],
    }
    assert len(terms) == 6  # t1 s1 t2 s2 3.5 "ok": classes and predicates are not terms


def test_the_term_limit_is_checked_for_a_batch_of_new_iris():
    terms = TermDictionary()
    terms.limit = 10
    terms.encode_facts([("p", "a", "b")])
    with pytest.raises(ZodiacError, match="dictionary is full.*'n8' is one too many"):
        terms.encode_facts([("p", f"n{i}", "a") for i in range(20)])
    assert len(terms) <= 10


@pytest.mark.parametrize(
    "batch",
    [
        [("p", "a", 2.0), ("p", 2, "b")],  # new numbers in two columns: fact by fact
        [("p", "a", 2.0), ("p", "b", 2)],  # in one column: by columns, in the same order
        [("temp", "t1", 25.0), ("temp", "t2", 25), ("temp", "t1", True), ("temp", "t3", 1)],
        # new numbers in two relations: fact by fact, so the one given first is the spelling
        [("speed", "t1", 7.0), ("load", "t1", "x"), ("power", "t2", 7)],
        [("power", "t2", 7), ("speed", "t1", 7.0)],
        # in one relation of several: by columns
        [("speed", "t1", 7.0), (RDF_TYPE, "t1", "Turbine"), ("speed", "t2", 7)],
    ],
)
def test_equal_numbers_keep_the_spelling_seen_first(batch):
    terms = TermDictionary()
    grouped, _ = terms.encode_facts(batch)
    expected_terms, expected = one_by_one(batch)
    assert decoded(terms, grouped) == decoded(expected_terms, expected)
    assert [tuple(map(terms.decode, ids)) for ids in next(iter(grouped.values()))] == [
        tuple(map(expected_terms.decode, ids)) for ids in next(iter(expected.values()))
    ]
