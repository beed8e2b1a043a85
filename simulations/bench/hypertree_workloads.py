"""Deterministic workloads for ``simulations.bench.hypertree``: programs with cyclic rules of
many body atoms, and their data.

* **graph patterns** (the paper's YAGO rules): a labelled directed graph whose node degrees
  and label frequencies are skewed (both drawn from Zipf-like weights: a few hubs and a few
  common labels, as in real knowledge graphs), and rules whose bodies are 6-cycles, 4-cliques,
  petals (several paths between two ends) and flowers (a petal with extra acyclic stems), plus
  recursive rules with cyclic bodies.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    """A program and its explicit facts, as text the reasoner loads."""

    name: str
    rules: str
    facts: list[tuple[str, str, str]]  # (predicate, subject, object), as add_facts takes them


def zipf_weights(count: int, exponent: float) -> list[float]:
    return [1.0 / (rank + 1) ** exponent for rank in range(count)]


def labelled_graph(
    nodes: int = 2_000, edges: int = 20_000, labels: int = 60, seed: int = 7
) -> list[tuple[str, str, str]]:
    """Edges ``(label, source, target)``: sources and targets drawn with Zipf weights
    (exponent 0.8, so the busiest node has a few hundred edges), labels with exponent 1.0 (the
    commonest label holds about a fifth of the edges), duplicates dropped."""
    rng = random.Random(seed)
    node_weights = zipf_weights(nodes, 0.8)
    label_weights = zipf_weights(labels, 1.0)
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
