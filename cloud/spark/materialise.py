"""Materialise a program with PySpark DataFrames, with the same semantics as the edge engine.

Path of a call::

    rules -> checks + HRDG (agent.engine.program.dependency: the engine's own strata)
    facts -> term ids on the driver (terms.TermSpace) -> one DataFrame per relation
    per hyper-node, in the engine's own topological order of the HRDG (execution_plan):
        small inputs             -> driver.evaluate_on_driver (the engine itself, on the job's ids)
        aggregate rule           -> rules.evaluate_aggregate (groupBy over distinct substitutions)
        transitive closure       -> closures.transitive_closure (seminaive squaring)
        symmetric-transitive     -> closures.symmetric_transitive_closure (large/small-star CC)
        anything else            -> seminaive: delta = rules(delta ⋈ all) − all, until empty
    owl:sameAs (equality.py): the equality component first, by rounds of its rules and
        connected components of its equalities, everything rewritten to representatives;
        the result expanded to every name at the end
    -> Materialisation: relation -> DataFrame of term ids, decodable to the engine's facts

The hyper-nodes, their order and the choice of closure algorithm are the engine's
(``build_hyper_graph``, ``detect_closure``), so strata are the same by construction. Every
relation is kept as a distinct DataFrame holding *all* its facts so far (explicit ones and those
of earlier hyper-nodes, as the engine's DataStoreBag shows them). A hyper-node's results are
checkpointed when it is done (``frames.cut``: local checkpoints, or reliable ones when the
SparkContext has a checkpoint directory), as are every seminaive delta and, every few rounds, a
recursive node's growing relations: no plan carries more than a few rounds of lineage.

Relations that are small stay on the driver as well, as sets of term-id tuples (the explicit
facts parsed there, the results of hyper-nodes evaluated there): a hyper-node whose inputs are
all small is evaluated by the engine on the driver (``driver.py``), with no Spark job at all,
and a DataFrame of a driver-side relation is only made when a Spark step or the caller needs it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.engine.equality.component import SAME_AS, mentions_equality
from agent.engine.errors import DirectiveError, RuleError, refuse_directives
from agent.engine.language import RESERVED_PREFIX, Atom, Program, Rule
from agent.engine.modules.shapes import detect_closure
from agent.engine.program.dependency import HyperNode, build_hyper_graph, execution_plan
from agent.engine.program.loaders import load_facts, load_program
from agent.engine.program.validation import check_rule
from agent.engine.reasoner import by_key
from cloud.spark.closures import symmetric_transitive_closure, transitive_closure
from cloud.spark.driver import LOCAL_BELOW, MAX_OUTPUT, evaluate_on_driver, fits, inputs_of
from cloud.spark.equality import SparkEquality
from cloud.spark.frames import cut, schema, settle, union_all
from cloud.spark.rules import evaluate_rule
from cloud.spark.session import require_pyspark
from cloud.spark.terms import RelationKey, TermSpace

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

CHECKPOINT_EVERY = 3  # seminaive rounds between checkpoints of the growing relations
Progress = Callable[[str], None]
ProgramSource = str | os.PathLike | Program | Iterable[Rule]
FactSource = str | os.PathLike | Iterable[tuple | Atom]


@dataclass
class NodeReport:
    """What one hyper-node did: for progress lines and ``Materialisation.reports``."""

    index: int
    rules: list[str]
    module: str
    rounds: int
    seconds: float
    counts: dict[RelationKey, int] = field(default_factory=dict)

    def describe(self, total: int) -> str:
        sizes = ", ".join(f"{name}/{arity}={n}" for (name, arity), n in sorted(self.counts.items()))
        return (
            f"stratum {self.index + 1}/{total} [{self.module}] {', '.join(self.rules)}: "
            f"{sizes} ({self.rounds} round(s), {self.seconds:.2f}s)"
        )


class Materialisation(dict[RelationKey, "DataFrame"]):
    """``(name, arity) -> DataFrame`` of the relation's facts as term ids (columns ``c0..``),
    for every relation with at least one fact; plus the term dictionary to decode them.

    ``facts()`` yields exactly what ``Reasoner.facts()`` yields for the same program and facts.
    """

    def __init__(
        self,
        space: TermSpace,
        frames: dict,
        reports: list[NodeReport],
        local: dict[RelationKey, set[tuple]] | None = None,
    ) -> None:
        super().__init__(frames)
        self.space = space
        self.reports = reports
        # Relations whose facts are on the driver too (read without a Spark job).
        self.local = {key: rows for key, rows in (local or {}).items() if key in frames}
        # The equality component's hyper-nodes, per round (cloud/spark/equality.py).
        self.equality_reports: list[NodeReport] = []

    def visible(self) -> list[RelationKey]:
        """The relations a reader sees, sorted: all but the engine's own (a multi-head rule's
        body, ``language.RESERVED_PREFIX``)."""
        return sorted(key for key in self if not key[0].startswith(RESERVED_PREFIX))

    def facts(self, key: RelationKey | None = None) -> Iterator[tuple]:
        """Every fact (or those of one relation) as ``(predicate, *values)``, a class fact as
        ``(rdf:type, x, C)``.

        All relations come to the driver in one Spark job (a union padded to the widest
        arity): this is for results that fit in the driver, like ``set(Reasoner.facts())``.
        For big results use :meth:`stream`."""
        from pyspark.sql import functions as F

        keys = self.visible() if key is None else [k for k in [key] if k in self]
        for relation in [k for k in keys if k in self.local]:
            for row in self.local[relation]:
                yield self.space.external(relation, row)
        keys = [k for k in keys if k not in self.local]
        if not keys:
            return
        width = max(arity for _, arity in keys)
        padded = [
            self[k].select(
                F.lit(n).alias("__r"),
                *[F.col(f"c{i}") if i < k[1] else F.lit(None).cast("long") for i in range(width)],
            )
            for n, k in enumerate(keys)
        ]
        for row in union_all(padded).collect():
            relation = keys[row[0]]
            yield self.space.external(relation, tuple(row[1 : 1 + relation[1]]))

    def stream(self) -> Iterator[tuple]:
        """Like :meth:`facts`, one partition at a time (one Spark job per partition)."""
        for relation in self.visible():
            rows = self.local.get(relation)
            for row in self[relation].toLocalIterator() if rows is None else rows:
                yield self.space.external(relation, tuple(row))

    def counts(self) -> dict[RelationKey, int]:
        return {
            key: len(self.local[key]) if key in self.local else self[key].count()
            for key in self.visible()
        }

    @property
    def runtime_errors(self) -> int:
        """Run-time errors met (diagnostic, like the engine's: only "zero or not" compares)."""
        return self.space.runtime_errors


def materialise(
    spark: SparkSession,
    program: ProgramSource,
    facts: FactSource = (),
    *,
    closures: bool = True,
    progress: Progress | None = None,
    local_below: int = LOCAL_BELOW,
) -> Materialisation:
    """Materialise ``program`` (a Program, rule text, a rule file or Rule objects) over
    ``facts`` (fact tuples as ``Reasoner.add_facts`` takes them, or an RDF file).

    ``closures=False`` evaluates closure hyper-nodes seminaively, like the engine's
    ``Reasoner(modules=False)``. A hyper-node that reads at most ``local_below`` facts is
    evaluated on the driver by the engine (``driver.py``; 0: every hyper-node in Spark).
    Raises the engine's errors (ParseError, RuleError, StratificationError) for a program the
    engine would refuse.
    """
    require_pyspark()
    rules, parsed = checked_rules(program)
    space = TermSpace(spark)
    # The engine's encoding order: the program's own facts, then the given ones.
    encoded = space.encode_facts([*parsed.facts, *load_facts(facts)])
    counts = {key: len(rows) for key, rows in encoded.items()}
    return materialise_frames(
        spark,
        rules,
        space,
        {},
        counts,
        closures=closures,
        progress=progress,
        local=encoded,
        local_below=local_below,
    )


def materialise_facts(
    spark: SparkSession,
    program: ProgramSource,
    facts: FactSource = (),
    *,
    closures: bool = True,
    local_below: int = LOCAL_BELOW,
) -> set[tuple]:
    """The materialisation as a set of fact tuples, the form of ``set(Reasoner.facts())``."""
    result = materialise(spark, program, facts, closures=closures, local_below=local_below)
    return set(result.facts())


def materialise_paths(
    spark: SparkSession,
    program: ProgramSource,
    paths: Iterable[str | os.PathLike],
    *,
    closures: bool = True,
    progress: Progress | None = None,
    local_below: int = LOCAL_BELOW,
) -> Materialisation:
    """Like :func:`materialise`, with facts from files: RDF files (N-Triples, Turtle...),
    parsed on the driver, and fact directories written by ``storage.write_parquet``, whose
    facts stay in Spark (only their distinct terms visit the driver)."""
    from cloud.spark.storage import read_parquet

    require_pyspark()
    rules, parsed = checked_rules(program)
    space = TermSpace(spark)
    parts: dict[RelationKey, list[DataFrame]] = {}
    counts: dict[RelationKey, int] = {}
    encoded = space.encode_facts(parsed.facts)
    for path in paths:
        if os.path.isdir(path):
            frames, sizes = read_parquet(spark, path, space)
            for key, frame in frames.items():
                parts.setdefault(key, []).append(frame)
                counts[key] = counts.get(key, 0) + sizes[key]
        else:
            for key, rows in space.encode_facts(load_facts(path)).items():
                encoded.setdefault(key, set()).update(rows)
    local = {key: rows for key, rows in encoded.items() if key not in parts}
    for key, rows in encoded.items():
        if key in parts:  # also in a fact directory: the union is made in Spark
            parts[key].append(spark.createDataFrame(sorted(rows), schema(key[1])))
        counts[key] = counts.get(key, 0) + len(rows)
    frames = {}
    for key, pieces in parts.items():
        frames[key] = union_all(pieces)
        if len(pieces) > 1:
            frames[key], counts[key] = settle(frames[key].distinct())
    return materialise_frames(
        spark,
        rules,
        space,
        frames,
        counts,
        closures=closures,
        progress=progress,
        local=local,
        local_below=local_below,
    )


def checked_rules(program: ProgramSource) -> tuple[list[Rule], Program]:
    """The program's rules, checked like the engine checks them (safety, labels), one rule
    per content (``Rule.key``); raises what ``Reasoner.add_rules`` raises.

    A program with windows (``@window``) is refused (DirectiveError), before any Spark session
    starts: a window is kept per device over the timestamped readings it receives (its own
    and its neighbours'), while the farm's knowledge graph holds the topology and the latest
    readings, no history to evaluate a window over (docs/cloud.md, "Windows")."""
    parsed = load_program(program)
    if parsed.windows:
        raise DirectiveError(
            f"windows ({parsed.windows[0]}) are kept by each agent over the readings it "
            "receives; the farm's knowledge graph holds the latest readings, not their "
            "history, so the cloud job does not evaluate them: publish the file as a stream "
            "(zodiac-cloud bundle/publish), or remove its @window lines"
        )
    refuse_directives(parsed.windows, parsed.watches)
    rules: dict[str, Rule] = {}
    for rule in parsed.rules:
        check_rule(rule)
        existing = rules.get(rule.id)
        if existing is not None and existing.key != rule.key:
            raise RuleError(
                f"label {rule.id} is already used by a different rule: {existing}", rule=str(rule)
            )
        rules.setdefault(rule.id, rule)
    return list(by_key(rules.values()).values()), parsed


def materialise_frames(
    spark: SparkSession,
    rules: list[Rule],
    space: TermSpace,
    frames: dict[RelationKey, DataFrame],
    counts: dict[RelationKey, int],
    *,
    closures: bool = True,
    progress: Progress | None = None,
    local: dict[RelationKey, set[tuple]] | None = None,
    local_below: int = LOCAL_BELOW,
) -> Materialisation:
    """The core: the explicit facts, already encoded with ``space``, are in ``frames``
    (DataFrames) or ``local`` (id tuples on the driver); ``counts`` their sizes (used to leave
    empty relations out of the result and to choose where a hyper-node runs)."""
    job = _Job(spark, space, dict(frames), dict(local or {}), counts, closures, progress)
    job.local_below = local_below
    reports = []

    def run(step: int, node: HyperNode, into: list[NodeReport]) -> NodeReport:
        report = job.run(step, node)
        counts.update(report.counts)
        into.append(report)
        return report

    equality = None
    if mentions_equality(rules) or counts.get(SAME_AS, 0):  # owl:sameAs: see equality.py
        equality = SparkEquality(job, run)
        rules = equality.materialise(rules)
        if progress:
            progress(
                f"equality: {len(set(equality.rep.values()))} class(es) of merged names, "
                f"{equality.rounds} round(s)"
            )
    graph = build_hyper_graph(rules)
    # The engine's own order (a topological order of the HRDG, Algorithm 4): with the rule
    # constants and computed numbers encoded in the same order, a number computed as both 4
    # and 4.0 is decoded as whichever the engine saw first.
    for step, index in enumerate(execution_plan(graph, range(len(graph.nodes)))):
        report = run(step, graph.nodes[index], reports)
        if progress:
            progress(report.describe(len(graph.nodes)))
    if equality is not None:
        equality.expand(job.frames, job.local, counts)
    space.release()  # every relation is checkpointed: no UDF reads the dictionary again
    kept = {key: job.frame(key) for key in {*job.frames, *job.local} if counts.get(key, 0) > 0}
    result = Materialisation(space, kept, reports, job.local)
    result.equality_reports = equality.reports if equality is not None else []
    return result


class _Job:
    """The relations of one materialisation, and how each kind of hyper-node updates them."""

    def __init__(
        self,
        spark: SparkSession,
        space: TermSpace,
        frames: dict[RelationKey, DataFrame],
        local: dict[RelationKey, set[tuple]],
        counts: dict[RelationKey, int],
        closures: bool,
        progress: Progress | None,
    ) -> None:
        self.spark = spark
        self.space = space
        self.frames = frames
        # Relations whose facts are (also) on the driver, and every relation's size (updated
        # as hyper-nodes run: it decides where the next one runs).
        self.local = local
        self.counts = counts
        self.closures = closures
        self.progress = progress
        self.keep: list[DataFrame] = []  # cached intermediates of the current hyper-node
        self.local_below = LOCAL_BELOW
        self.max_output = MAX_OUTPUT

    def frame(self, key: RelationKey) -> DataFrame:
        """The relation as a DataFrame (made from the driver's copy the first time)."""
        found = self.frames.get(key)
        if found is None:
            rows = sorted(self.local.get(key, ()))
            found = self.frames[key] = self.spark.createDataFrame(rows, schema(key[1]))
        return found

    def run(self, index: int, node: HyperNode) -> NodeReport:
        started = time.perf_counter()
        if self.on_driver(node):
            sizes = {key: len(self.local[key]) for key in node.heads}
            seconds = time.perf_counter() - started
            return NodeReport(index, [r.id for r in node.rules], "driver", 1, seconds, sizes)
        for key in node.heads:  # Spark's result replaces any copy on the driver
            self.frame(key)
            self.local.pop(key, None)
        pattern = detect_closure(node.rules) if self.closures else None
        if any(rule.aggregate() is not None for rule in node.rules):
            module, rounds = "aggregate", self.once(node)
        elif pattern is not None:
            module, rounds = pattern.kind, 1
            closure = (
                transitive_closure if pattern.kind == "transitive" else symmetric_transitive_closure
            )
            x = self.frame(pattern.relation)
            self.frames[pattern.relation] = closure(x, pattern.irreflexive, self.tick)
            if pattern.irreflexive:
                module += " (irreflexive)"
        elif node.recursive:
            module, rounds = "seminaive", self.seminaive(node)
        else:
            module, rounds = "non-recursive", self.once(node)
        self.finish(node, sizes := {})
        return NodeReport(
            index, [r.id for r in node.rules], module, rounds, time.perf_counter() - started, sizes
        )

    def on_driver(self, node: HyperNode) -> bool:
        """Evaluate the hyper-node with the engine on the driver if its inputs are small
        (``driver.py``); False when it must run in Spark (large inputs, or an output that
        would be too large)."""
        inputs = inputs_of(node)
        if not fits([self.counts.get(key, 0) for key in inputs], self.local_below):
            return False
        for key in inputs:  # small relations computed in Spark come to the driver
            if key not in self.local and key in self.frames:
                self.local[key] = {tuple(row) for row in self.frames[key].collect()}
        facts = {key: self.local.get(key, set()) for key in inputs}
        done = evaluate_on_driver(
            node, self.space, facts, closures=self.closures, max_output=self.max_output
        )
        if done is None:
            return False
        heads, errors = done
        if errors:
            self.space.errors.add(errors)
        for key, rows in heads.items():
            self.local[key] = rows
            self.counts[key] = len(rows)
            self.frames.pop(key, None)  # made again from the driver's copy when needed
        return True

    def finish(self, node: HyperNode, sizes: dict[RelationKey, int]) -> None:
        """Checkpoint and count the node's relations; release its cached intermediates."""
        for key in node.heads:
            self.frames[key], sizes[key] = settle(self.frame(key))
        for df in self.keep:
            df.unpersist()
        self.keep.clear()

    def tick(self, message: str) -> None:
        if self.progress:
            self.progress(f"  {message}")

    def derive(self, rules: Iterable[Rule], delta: dict | None = None) -> dict[RelationKey, list]:
        """Head frames of ``rules`` (all instances, or only those using a delta fact)."""
        derived: dict[RelationKey, list[DataFrame]] = {}
        for rule in rules:
            key = rule.head.relation
            if delta is None:
                derived.setdefault(key, []).append(
                    evaluate_rule(rule, self.space, self.frame, self.keep)
                )
                continue
            for position, item in enumerate(rule.body):
                if isinstance(item, Atom) and item.relation in delta:
                    frame = evaluate_rule(
                        rule, self.space, self.frame, self.keep, (position, delta[item.relation])
                    )
                    derived.setdefault(key, []).append(frame)
        return derived

    def once(self, node: HyperNode) -> int:
        """A non-recursive hyper-node (or an aggregate): each rule once over the relations."""
        for key, parts in self.derive(node.rules).items():
            self.frames[key] = union_all([self.frame(key), *parts]).distinct()
        return 1

    def seminaive(self, node: HyperNode) -> int:
        """Round 0 evaluates every rule over everything; round r > 0 evaluates, for each body
        atom over a relation of this node, the rule with that atom reading only the facts new in
        round r - 1 (the other atoms read everything, this round's new facts included)."""
        delta: dict[RelationKey, DataFrame] = {}
        derived = self.derive(node.rules)
        rounds = 0
        while derived:
            rounds += 1
            delta = {}
            for key, parts in derived.items():
                new, size = settle(union_all(parts).distinct().subtract(self.frame(key)))
                if not size:
                    continue
                grown = self.frame(key).union(new)
                if rounds % CHECKPOINT_EVERY == 0:
                    grown = cut(grown)
                self.frames[key] = grown
                delta[key] = new
            if not delta:
                break
            self.tick(f"seminaive round {rounds}: new facts in {len(delta)} relation(s)")
            derived = self.derive(node.rules, delta)
        return rounds
