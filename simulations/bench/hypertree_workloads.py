"""Deterministic workloads for ``simulations.bench.hypertree``: programs with cyclic rules of
many body atoms, and their data.

* **expressions** (the paper's Exp): random expression trees (operators +, -, x; leaves at
  most ``depth`` levels down) evaluated over ``valuations`` valuations of their leaves. Each
  (expression, valuation) pair has a value node, a skolem IRI, with ``ofExpr``, ``inValuation``
  and ``hasValue`` facts; the leaves' value nodes are given. Three recursive rules, one per
  operator, each with nine body atoms around a cycle through the valuation (the left and right
  operands' value nodes for the same valuation) and three heads.

* **university** (the paper's LUBM L and L+C): the university data of
  ``simulations.bench.peers`` as binary facts, LUBM's simple rules (subclasses, subproperties,
  domains, ranges, inverses, transitive suborganisation) and, for L+C, 16 cyclic rules of the
  kind "two students of the same university share an advisor".
* **graph patterns** (the paper's YAGO rules): a labelled directed graph whose node degrees
  and label frequencies are skewed (both drawn from Zipf-like weights: a few hubs and a few
  common labels, as in real knowledge graphs), and rules whose bodies are 6-cycles, 4-cliques,
  petals (several paths between two ends) and flowers (a petal with extra acyclic stems), plus
  recursive rules with cyclic bodies.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from simulations.bench import peers


@dataclass(frozen=True)
class Workload:
    """A program and its explicit facts, as text the reasoner loads."""

    name: str
    rules: str
    facts: list[tuple[str, str, str]]  # (predicate, subject, object), as add_facts takes them


EXPRESSION_RULES = """\
@prefix ex: <http://example.org/> .
{rules}
"""
EXPRESSION_RULE = """\
{name}: ex:ofExpr(N, E), ex:inValuation(N, V), ex:hasValue(N, X) :-
    ex:{operator}(E) and ex:left(E, L) and ex:right(E, R) and
    ex:ofExpr(NL, L) and ex:inValuation(NL, V) and ex:hasValue(NL, XL) and
    ex:ofExpr(NR, R) and ex:inValuation(NR, V) and ex:hasValue(NR, XR) and
    bind(XL {symbol} XR as X) and bind(skolem("value", E, V) as N) ."""
EX = "http://example.org/"
RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"


def expression_rules() -> str:
    operators = (("plus", "Plus", "+"), ("minus", "Minus", "-"), ("times", "Times", "*"))
    rules = "\n".join(
        EXPRESSION_RULE.format(name=name, operator=op, symbol=symbol)
        for name, op, symbol in operators
    )
    return EXPRESSION_RULES.format(rules=rules)


def expressions(count: int = 40, depth: int = 4, valuations: int = 60, seed: int = 11) -> Workload:
    """``count`` expression trees (an operand is a leaf with probability 1/4 above the
    deepest level), and ``valuations`` values (small ints, so products stay exact) per leaf."""
    rng = random.Random(seed)
    facts: list[tuple] = []
    leaves: list[str] = []
    made = 0

    def build(level: int) -> str:
        nonlocal made
        made += 1
        name = f"{EX}x{made}"
        if level == depth or (level > 0 and rng.random() < 0.25):
            leaves.append(name)
            return name
        operator = rng.choice(("Plus", "Minus", "Times"))
        facts.append((RDF_TYPE, name, EX + operator))
        left, right = build(level + 1), build(level + 1)
        facts.extend([(EX + "left", name, left), (EX + "right", name, right)])
        return name

    for _ in range(count):
        build(0)
    for leaf in leaves:
        for v in range(valuations):
            node = f"{leaf}/v{v}"
            facts += [
                (EX + "ofExpr", node, leaf),
                (EX + "inValuation", node, f"{EX}v{v}"),
                (EX + "hasValue", node, rng.randint(-3, 3)),
            ]
    return Workload("expressions", expression_rules(), facts)


def zipf_weights(count: int, exponent: float) -> list[float]:
    return [1.0 / (rank + 1) ** exponent for rank in range(count)]


def labelled_graph(
    nodes: int = 2_000,
    edges: int = 20_000,
    labels: int = 60,
    seed: int = 7,
    node_exponent: float = 0.8,
    label_exponent: float = 1.0,
) -> list[tuple[str, str, str]]:
    """Edges ``(label, source, target)``: sources and targets drawn with Zipf weights
    (exponent 0.8 by default, so the busiest node has a few hundred edges), labels with
    exponent 1.0 (the commonest label holds about a fifth of the edges), self-loops and
    duplicates dropped."""
    rng = random.Random(seed)
    node_weights = zipf_weights(nodes, node_exponent)
    label_weights = zipf_weights(labels, label_exponent)
    order = list(range(nodes))
    rng.shuffle(order)  # hubs are not the low-numbered nodes
    seen: set[tuple[int, int, int]] = set()
    while len(seen) < edges:
        batch = edges - len(seen)
        sources = rng.choices(order, node_weights, k=batch)
        targets = rng.choices(order, node_weights, k=batch)
        chosen = rng.choices(range(labels), label_weights, k=batch)
        for s, t, label in zip(sources, targets, chosen, strict=True):
            if s != t:
                seen.add((s, label, t))
    return [(f"l{label}", f"n{s}", f"n{t}") for s, label, t in sorted(seen)]


GRAPH_RULES = """\
# 6-cycles
cycle6a(A, D) :- l0(A, B), l1(B, C), l2(C, D), l0(D, E), l3(E, F), l1(F, A) .
cycle6b(A, C) :- l1(A, B), l0(B, C), l4(C, D), l2(D, E), l0(E, F), l5(F, A) .
# 4-cliques (six edges over four nodes)
clique4a(A, B) :- l0(A, B), l0(A, C), l1(A, D), l0(B, C), l2(B, D), l1(C, D) .
clique4b(A, D) :- l1(A, B), l0(A, C), l0(A, D), l3(B, C), l0(B, D), l0(C, D) .
# petals: three two-edge paths between the same ends
petal(A, B) :- l0(A, X), l0(X, B), l1(A, Y), l2(Y, B), l3(A, Z), l0(Z, B) .
# flowers: a petal with stems
flower(A, S) :- l0(A, X), l1(X, B), l0(A, Y), l2(Y, B), l4(A, S), l5(B, T) .
# recursive rules with cyclic bodies
linked(A, B) :- l0(A, B), l1(B, C), l2(C, A) .
linked(A, C) :- linked(A, B), l0(B, C), l1(C, D), l0(D, B) .
tri(A, C) :- l0(A, B), l0(B, C), l0(C, A) .
tri(A, C) :- tri(A, B), tri(B, C), l1(A, C) .
"""


def graph_patterns(nodes: int = 2_000, edges: int = 20_000, seed: int = 7) -> Workload:
    return Workload("graph patterns", GRAPH_RULES, labelled_graph(nodes, edges, 60, seed))


def skewed_graph(
    nodes: int = 2_000,
    edges: int = 20_000,
    labels: int = 8,
    node_exponent: float = 1.1,
    label_exponent: float = 1.2,
    seed: int = 13,
) -> list[tuple[str, str, str]]:
    """Edges ``(label, source, target)`` of a graph skewed as real knowledge graphs are:
    endpoints drawn with Zipf weights of exponent 1.1 (the busiest node is an endpoint of
    about an eighth of the edges, most nodes of one or two), labels with exponent 1.2 over 8
    labels (the commonest holds about 45% of the edges). Cyclic patterns through
    the hubs then have far more instantiations than distinct head pairs. The same draw as
    ``labelled_graph`` (shuffled ranks, self-loops and duplicates dropped)."""
    return labelled_graph(
        nodes, edges, labels, seed, node_exponent=node_exponent, label_exponent=label_exponent
    )


def skewed_patterns(scale: float = 1.0, seed: int = 13) -> Workload:
    """The YAGO-style rules (``GRAPH_RULES``) over ``skewed_graph`` of 2,000 nodes and 20,000
    edges times ``scale`` (``scale=0.1``: 200 nodes, 2,000 edges, for an edit loop)."""
    nodes, edges = max(20, round(2_000 * scale)), max(100, round(20_000 * scale))
    return Workload("skewed patterns", GRAPH_RULES, skewed_graph(nodes, edges, seed=seed))


# ------------------------------------------------------------------ university (LUBM-like)
# LUBM's simple rules (the kind of LUBM L: subclasses, subproperties, domains, ranges,
# inverses, the transitive suborganisation), over binary facts.
# The schema of simulations.bench.peers' university data, plus the teaching assistants added
# below.
SUBCLASSES = peers.SUBCLASSES
SUBPROPERTIES = peers.SUBPROPERTIES
DOMAINS = [*peers.DOMAINS, ("teachingAssistantOf", "Student")]
RANGES = peers.RANGES
INVERSES = [("degreeFrom", "hasAlumnus"), ("memberOf", "member"), ("advisor", "advises")]

# Sixteen complex (cyclic) rules of the kind the paper adds for LUBM L+C.
COMPLEX_RULES = """\
c1: ex:haveSameAdvisor(P1, P2) :-
    ex:hasAlumnus(O, P1), ex:advisor(P1, A), ex:hasAlumnus(O, P2), ex:advisor(P2, A) .
c2: ex:taUnderHead(S, C) :-
    ex:teachingAssistantOf(S, C), ex:degreeFrom(S, U), ex:teacherOf(T, C), ex:headOf(T, D),
    ex:subOrganizationOf(D, U) .
c3: ex:deptCoauthors(A, B) :-
    ex:publicationAuthor(P, A), ex:publicationAuthor(P, B), ex:memberOf(A, D),
    ex:memberOf(B, D) .
c4: ex:classmatesSameAdvisor(S1, S2) :-
    ex:takesCourse(S1, C), ex:takesCourse(S2, C), ex:advisor(S1, A), ex:advisor(S2, A) .
c5: ex:teachesOwnAdvisee(T, S) :-
    ex:teacherOf(T, C), ex:takesCourse(S, C), ex:advisor(S, T) .
c6: ex:takesDeptCourse(S, C) :-
    ex:takesCourse(S, C), ex:memberOf(S, D), ex:teacherOf(T, C), ex:worksFor(T, D) .
c7: ex:alumniColleagues(A, B) :-
    ex:worksFor(A, D), ex:worksFor(B, D), ex:doctoralDegreeFrom(A, U),
    ex:doctoralDegreeFrom(B, U) .
c8: ex:coauthorAdvisor(S, A) :-
    ex:advisor(S, A), ex:publicationAuthor(P, S), ex:publicationAuthor(P, A) .
c9: ex:headTeachesMember(H, S) :-
    ex:headOf(H, D), ex:memberOf(S, D), ex:takesCourse(S, C), ex:teacherOf(H, C) .
c10: ex:taForAdvisor(S, A) :-
    ex:teachingAssistantOf(S, C), ex:teacherOf(A, C), ex:advisor(S, A) .
c11: ex:sharedCourseAlumni(S1, S2) :-
    ex:takesCourse(S1, C), ex:takesCourse(S2, C), ex:undergraduateDegreeFrom(S1, U),
    ex:undergraduateDegreeFrom(S2, U) .
c12: ex:advisorColleague(S, T) :-
    ex:advisor(S, A), ex:worksFor(A, D), ex:worksFor(T, D), ex:teacherOf(T, C),
    ex:takesCourse(S, C) .
c13: ex:coauthorsAtAlmaMater(A, B) :-
    ex:publicationAuthor(P, A), ex:publicationAuthor(P, B), ex:degreeFrom(A, U),
    ex:degreeFrom(B, U) .
c14: ex:deptHeadAdvisee(S, H) :-
    ex:advisor(S, A), ex:worksFor(A, D), ex:headOf(H, D), ex:memberOf(S, D) .
c15: ex:taClassmates(T, S) :-
    ex:teachingAssistantOf(T, C), ex:takesCourse(S, C), ex:memberOf(T, D), ex:memberOf(S, D) .
c16: ex:sameAdvisorCourse(S1, S2) :-
    ex:advisor(S1, A), ex:advisor(S2, A), ex:takesCourse(S1, C), ex:takesCourse(S2, C),
    ex:memberOf(S1, D), ex:memberOf(S2, D) .
"""


def university_simple_rules() -> str:
    lines = ["@prefix ex: <http://example.org/> ."]
    lines += [f"ex:{b}(X) :- ex:{a}(X) ." for a, b in SUBCLASSES]
    lines += [f"ex:{q}(X, Y) :- ex:{p}(X, Y) ." for p, q in SUBPROPERTIES]
    lines += [f"ex:{c}(X) :- ex:{p}(X, Y) ." for p, c in DOMAINS]
    lines += [f"ex:{c}(Y) :- ex:{p}(X, Y) ." for p, c in RANGES]
    lines += [f"ex:{q}(Y, X) :- ex:{p}(X, Y) ." for p, q in INVERSES]
    lines.append(
        "ex:subOrganizationOf(X, Z) :- ex:subOrganizationOf(X, Y), ex:subOrganizationOf(Y, Z) ."
    )
    return "\n".join(lines) + "\n"


def university_facts(universities: int, seed: int = 3) -> list[tuple]:
    """The university data of ``simulations.bench.peers`` (15 departments per university, with
    faculty, students, courses and articles) as binary facts and class facts, plus a research
    group per department (a suborganisation chain) and teaching assistants."""
    rng = random.Random(seed)
    facts: list[tuple] = []
    courses: dict[str, list[str]] = {}
    for s, p, o in peers.university(universities, seed):
        if p in ("sc", "sp", "dom", "rng"):
            continue  # the schema is in the rules
        if p == "type":
            facts.append((RDF_TYPE, EX + s, EX + o))
        else:
            facts.append((EX + p, EX + s, EX + o))
            if p == "teacherOf":
                courses.setdefault(s.rsplit("f", 1)[0], []).append(o)
    for dept, offered in sorted(courses.items()):
        group = f"{dept}rg"
        facts.append((EX + "subOrganizationOf", EX + group, EX + dept))
        for s in range(0, 30, 3):
            student = f"{dept}g{s}"
            course = rng.choice(offered)
            facts.append((EX + "teachingAssistantOf", EX + student, EX + course))
    return sorted(set(facts), key=repr)


def university_workload(universities: int = 4, complex_rules: bool = True) -> Workload:
    rules = university_simple_rules()
    if complex_rules:
        rules += "@prefix ex: <http://example.org/> .\n" + COMPLEX_RULES
    name = "university L+C" if complex_rules else "university L"
    return Workload(name, rules, university_facts(universities))
