"""``zodiac-edge``: materialise and query rule files over RDF facts from the command line.

zodiac-edge materialise RULES FACTS... [-o out.nt] [--stats]
zodiac-edge query RULES FACTS... --pattern '<p11>(X, Y)' [--format tsv|json]
zodiac-edge explain RULES FACTS... --fact '<p11>(<a>, <b>)'
zodiac-edge explain RULES FACTS... --plans [RULE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from agent import VersionAction
from agent.engine import Reasoner, ZodiacError
from agent.engine.budget import MEMORY_SLACK, Budget
from agent.engine.language import ANONYMOUS, RDF_TYPE, Constant, Variable

EVERY_RULE = "*"  # --plans without a rule name


class Progress:
    """One status line on stderr, rewritten in place, shown only on a terminal (or when asked)
    and only once work has taken longer than ``delay`` seconds, so short runs stay quiet."""

    def __init__(self, stream: TextIO = sys.stderr, *, force: bool = False, delay: float = 0.5):
        self.stream = stream
        self.enabled = force or stream.isatty()
        self.started = time.perf_counter()
        self.delay = delay
        self.shown = False

    def __call__(self, label: str, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.started
        if not self.enabled or elapsed < self.delay:
            return
        self.stream.write(
            f"\r  materialising hyper-node {done}/{total} ({label})  {elapsed:6.1f}s "
        )
        self.stream.flush()
        self.shown = True

    def step(self, message: str) -> None:
        if self.enabled and time.perf_counter() - self.started >= self.delay:
            self.stream.write(f"\r  {message}".ljust(60))
            self.stream.flush()
            self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 70 + "\r")
            self.stream.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zodiac-edge",
        description="Materialise Datalog rules over RDF facts with the zodiac-edge engine.",
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument(
        "--progress", action="store_true", help="show progress even when not on a terminal"
    )
    parser.add_argument(
        "--no-modules",
        action="store_true",
        help="evaluate every hyper-node with plain seminaive evaluation (no closure modules)",
    )
    parser.add_argument(
        "--no-decompositions",
        action="store_true",
        help="evaluate cyclic rules with join plans, never through hypertree decompositions",
    )
    add_budget_options(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    materialise = commands.add_parser(
        "materialise",
        help="compute every fact the rules derive and write them as N-Triples",
        description="Compute the materialisation of RULES over FACTS (N-Triples or Turtle files) "
        "and write all facts, explicit and derived, as N-Triples. Facts N-Triples cannot hold "
        "(arity 3 or more, a literal as subject) are counted on stderr by relation; `query` "
        "answers them.",
    )
    _add_inputs(materialise)
    materialise.add_argument(
        "-o", "--output", help="write N-Triples here (default: standard output)"
    )
    materialise.add_argument(
        "--stats",
        action="store_true",
        help="print statistics (facts per predicate, hyper-nodes, timings) on stderr",
    )
    materialise.add_argument(
        "--derived-only", action="store_true", help="write only the facts that are not explicit"
    )

    query = commands.add_parser(
        "query",
        help="answer one atom pattern over the materialisation",
        description="Materialise RULES over FACTS, then print the answers of PATTERN, "
        "e.g. '<p11>(X, <windTurbine3>)'.",
    )
    _add_inputs(query)
    query.add_argument(
        "--pattern",
        required=True,
        help="an atom such as '<p11>(X, Y)' or '<SensorAnomalyWindTurbine>(X)'",
    )
    query.add_argument(
        "--format",
        choices=("tsv", "json"),
        default="tsv",
        help="answer format (default: tsv: a header of the pattern's variables, then an answer "
        "a line; a pattern without variables prints true or false)",
    )

    explain = commands.add_parser(
        "explain",
        help="print one derivation tree of a fact",
        description="Materialise RULES over FACTS, then explain why FACT holds, or print how "
        "rules were evaluated: each compiled plan, its shape and its generated source.",
    )
    _add_inputs(explain)
    what = explain.add_mutually_exclusive_group(required=True)
    what.add_argument("--fact", help="a ground atom such as '<p11>(<a>, <b>)'")
    what.add_argument(
        "--plans",
        nargs="?",
        const=EVERY_RULE,
        metavar="RULE",
        help="print the plans compiled for RULE (a label or content key; every rule if omitted)",
    )
    explain.add_argument(
        "--max-depth",
        type=_positive(int),
        default=None,
        metavar="N",
        help="with --fact: show premises down to N levels, summarise deeper ones (default: all)",
    )
    return parser


def _positive(kind: type):
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return convert


def add_budget_options(parser: argparse.ArgumentParser) -> None:
    """The engine's budgets (agent/engine/budget.py), as the agent's [budget] config has them:
    an update over budget stops with an error and changes nothing."""
    group = parser.add_argument_group("budgets (each update stops with an error past them)")
    group.add_argument(
        "--max-derived-facts", type=_positive(int), metavar="N", help="derived facts held"
    )
    group.add_argument(
        "--max-memory-mb",
        type=_positive(int),
        metavar="MB",
        help=f"resident memory of the process, counted when it grew by more than "
        f"{MEMORY_SLACK // 2**20} MiB during the update (memory held before is not blamed on it)",
    )
    group.add_argument(
        "--max-seconds", type=_positive(float), metavar="S", help="wall time of one update"
    )


def budget_of(args: argparse.Namespace) -> Budget:
    memory = args.max_memory_mb
    return Budget(
        max_derived_facts=args.max_derived_facts,
        max_memory_bytes=memory * 1024 * 1024 if memory else None,
        max_seconds=args.max_seconds,
    )


def _add_inputs(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "rules", metavar="RULES", help="a rule file (ZodiacEdge or Datalog syntax)"
    )
    command.add_argument(
        "facts", metavar="FACTS", nargs="*", help="fact files: N-Triples (.nt) or Turtle (.ttl)"
    )


def load(args: argparse.Namespace, progress: Progress) -> Reasoner:
    reasoner = Reasoner(
        progress=progress,
        modules=not args.no_modules,
        decompositions=not args.no_decompositions,
        budget=budget_of(args),
    )
    for path in args.facts:
        progress.step(f"reading {path}")
        reasoner.add_facts(path)
    progress.step(f"loading rules {args.rules}")
    reasoner.add_rules(Path(args.rules))
    return reasoner


def run_materialise(args: argparse.Namespace, reasoner: Reasoner, out: TextIO) -> None:
    from agent.engine.program.rdf import write_ntriples

    started = time.perf_counter()
    facts = reasoner.facts()
    if args.derived_only:
        explicit = set(Reasoner.facts(_explicit_only(reasoner)))
        facts = (f for f in facts if f not in explicit)
    skipped: Counter[str] = Counter()
    if args.output:
        try:
            handle = open(args.output, "w", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as error:
            raise ZodiacError(f"cannot write {args.output}: {error.strerror or error}") from None
        with handle:
            written = write_ntriples(facts, handle, skipped)
    else:
        written = write_ntriples(facts, out, skipped)
    if skipped:
        _say_skipped(skipped)
    if args.stats:
        _print_stats(reasoner, written, time.perf_counter() - started)


def _say_skipped(skipped: Counter[str]) -> None:
    """Say on stderr which facts N-Triples could not hold (a relation of arity 3 or more, a
    subject that is a literal), so that none goes missing unsaid: ``query`` reads them."""
    total = sum(skipped.values())
    shown = ", ".join(f"{name}: {count}" for name, count in sorted(skipped.items())[:8])
    more = f", and {len(skipped) - 8} more relations" if len(skipped) > 8 else ""
    sys.stderr.write(
        f"zodiac-edge: note: {total} fact{'s' if total != 1 else ''} not written: N-Triples "
        f"holds binary and class facts whose subject is an IRI or a blank node ({shown}{more}); "
        "`zodiac-edge query RULES FACTS --pattern ...` answers them\n"
    )


def _explicit_only(reasoner: Reasoner) -> Reasoner:
    """A reasoner sharing the explicit facts but with no rules (for --derived-only)."""
    view = Reasoner()
    view.terms = reasoner.terms
    view.edb = reasoner.edb
    return view


def _print_stats(reasoner: Reasoner, written: int, write_seconds: float) -> None:
    stats = reasoner.stats()
    err = sys.stderr
    err.write(
        f"facts: {stats['facts']} ({stats['explicit_facts']} explicit), rules: {stats['rules']}, "
        f"written: {written}, run-time errors: {stats['runtime_errors']}\n"
    )
    err.write(
        f"materialisation: {stats['last_update'].get('seconds', 0.0):.3f}s, "
        f"writing: {write_seconds:.3f}s\n"
    )
    err.write("facts per predicate:\n")
    for name, count in stats["predicates"].items():
        err.write(f"  {count:>10}  {name}\n")
    err.write("hyper-nodes (topological order):\n")
    for node in stats["hyper_nodes"]:
        err.write(
            f"  {node['name']:>6}  {node['module']:<10} {node['facts']:>9} facts "
            f"{node.get('seconds', 0.0):8.3f}s  rules {', '.join(node['rules'])}\n"
        )


def run_query(args: argparse.Namespace, reasoner: Reasoner, out: TextIO) -> None:
    from agent.engine.program.parser import parse_atom

    pattern = parse_atom(args.pattern, source="--pattern")
    answers = reasoner.query(pattern)
    if args.format == "json":
        json.dump(answers, out, default=str, indent=1)
        out.write("\n")
        return
    names = sorted({t.name for t in pattern.terms if isinstance(t, Variable)} - {ANONYMOUS})
    if not names:  # (a ground pattern, or only ``_``: whether it holds)
        out.write(("true" if answers else "false") + "\n")
        return
    out.write("\t".join(names) + "\n")  # (the header even when nothing answers)
    for answer in sorted(answers, key=lambda a: [str(a.get(n)) for n in names]):
        out.write("\t".join(str(answer.get(n, "")) for n in names) + "\n")


def run_explain(args: argparse.Namespace, reasoner: Reasoner, out: TextIO) -> None:
    from agent.engine.program.parser import parse_atom

    if args.plans is not None:
        print_plans(reasoner, args.plans, out)
        return

    atom = parse_atom(args.fact, source="--fact")
    if not atom.is_ground():
        raise ZodiacError(f"--fact must be ground (no variables): {args.fact}")
    values = [t.value for t in atom.terms if isinstance(t, Constant)]
    fact = (RDF_TYPE, values[0], atom.predicate) if atom.arity == 1 else (atom.predicate, *values)
    try:
        tree = reasoner.explain(fact)
    except KeyError:
        raise ZodiacError(f"{args.fact} does not hold") from None
    out.write("\n".join(tree.lines(args.max_depth)) + "\n")
    facts = f"{tree.size} distinct fact{'s' if tree.size != 1 else ''}"
    out.write(f"# {facts}, {tree.height} level{'s' if tree.height != 1 else ''} of rules\n")


def print_plans(reasoner: Reasoner, name: str, out: TextIO) -> None:
    """Every plan compiled so far for one rule (or all): its description, then its source.
    A rule evaluated by a closure module, or whose body never had facts to read, has none."""
    if name != EVERY_RULE and name not in reasoner.rules:
        raise ZodiacError(
            f"--plans: no rule named {name!r} (rules: {_rule_names(reasoner)}; "
            "--plans alone prints every rule's)"
        )
    names = sorted(reasoner.rules) if name == EVERY_RULE else [name]
    view = reasoner.view()
    for rule_name in names:
        rule = reasoner.rules[rule_name]
        out.write(f"# {rule}\n" if rule.label == rule_name else f"# {rule_name}: {rule}\n")
        entries = reasoner.plans(rule_name)
        evaluation = reasoner.evaluation(rule_name)
        if evaluation is not None:
            out.write(f"evaluated {evaluation}\n")
        if not entries:
            node = view.node_of(rule)
            module = node.module if node is not None else "none"
            out.write(f"no compiled plan (evaluated by the {module} module)\n\n")
        for entry in entries:
            out.write(f"{entry.describe()}\n{entry.source}\n")


def _rule_names(reasoner: Reasoner) -> str:
    """The rules' names for a message: labels, then the content keys of unlabelled rules
    (the names ``--plans`` takes), the first 20."""
    names = sorted(reasoner.rules, key=lambda name: (name == reasoner.rules[name].key, name))
    return ", ".join(names[:20]) + (" ..." if len(names) > 20 else "") or "none"


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    progress = Progress(force=args.progress)
    try:
        reasoner = load(args, progress)
        progress.close()
        {"materialise": run_materialise, "query": run_query, "explain": run_explain}[args.command](
            args, reasoner, out
        )
    except ZodiacError as error:
        progress.close()
        # One line: the first line of the message says what and where (file:line:column);
        # the rest (the rule's full text) can be thousands of characters.
        sys.stderr.write(f"zodiac-edge: error: {str(error).splitlines()[0]}\n")
        return 2
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as Unix tools do. Point stdout at
        # /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
