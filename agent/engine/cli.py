"""``zodiac-edge``: materialise and query rule files over RDF facts from the command line.

zodiac-edge materialise RULES FACTS... [-o out.nt] [--stats] [--base IRI]
zodiac-edge query RULES FACTS... '<p11>(X, Y)' [--format tsv|json]
zodiac-edge explain RULES FACTS... --fact '<p11>(<a>, <b>)'
zodiac-edge explain RULES FACTS... --plans [RULE]
zodiac-edge shell RULES [FACTS...]

The options shared by every command (budgets, ``--stats``, ``-o``, ``--base``, ``--prefixes``,
``--strict``...) are accepted before or after the command's name: each sub-parser has them too,
with suppressed defaults so that one given before the name is not reset after it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from agent import VersionAction
from agent.engine import Reasoner, ZodiacError
from agent.engine.budget import MEMORY_SLACK, Budget
from agent.engine.console.terms import Shortener, ground_fact
from agent.engine.language import ANONYMOUS, Variable
from agent.engine.program.lint import program_warnings
from agent.engine.program.loaders import RULE_FILE_SUFFIXES

EVERY_RULE = "*"  # --plans without a rule name
DEFAULT_BASE = "urn:zodiac:"  # relative IRIs of the output, made absolute (docs/cli.md)
# Names that are an input file, not a rule name, after --plans.
_FILE_SUFFIXES = (*RULE_FILE_SUFFIXES, ".nt", ".ttl", ".turtle", ".n3", ".rdf", ".owl", ".xml")


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
    add_shared_options(parser, suppress=False)
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
    add_shared_options(materialise, suppress=True)
    materialise.add_argument(
        "--derived-only", action="store_true", help="write only the facts that are not explicit"
    )

    query = commands.add_parser(
        "query",
        help="answer one atom pattern over the materialisation",
        description="Materialise RULES over FACTS, then print the answers of PATTERN, "
        "e.g. '<p11>(X, <windTurbine3>)' (the last argument, as `zodiac-agent query` takes it, "
        "or --pattern). The rule file's @prefix names can be used in it.",
        usage="zodiac-edge query [options] RULES [FACTS ...] PATTERN",
    )
    query.add_argument(
        "inputs",
        metavar="RULES FACTS PATTERN",
        nargs="+",
        help="a rule file, fact files (N-Triples or Turtle), then an atom such as "
        "'<p11>(X, Y)' or '<SensorAnomalyWindTurbine>(X)'",
    )
    query.add_argument(
        "--pattern",
        dest="pattern_option",
        metavar="PATTERN",
        help="the pattern as an option (then every argument is a file)",
    )
    add_shared_options(query, suppress=True)
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
    add_shared_options(explain, suppress=True)
    what = explain.add_mutually_exclusive_group(required=True)
    what.add_argument("--fact", help="a ground atom such as '<p11>(<a>, <b>)'")
    what.add_argument(
        "--plans",
        nargs="?",
        const=EVERY_RULE,
        metavar="RULE",
        help="print the plans compiled for RULE (a label or content key; every rule if omitted; "
        "a file name after it is an input, not a rule)",
    )
    what.add_argument(
        "--rule",
        dest="plans_rule",
        metavar="RULE",
        help="the same as --plans RULE: the plans of one rule",
    )
    explain.add_argument(
        "--max-depth",
        type=_positive(int),
        default=None,
        metavar="N",
        help="with --fact: show premises down to N levels, summarise deeper ones (default: all)",
    )

    shell = commands.add_parser(
        "shell",
        help="add and delete facts and rules interactively and see what each update changed",
        description="Materialise RULES over FACTS, then read commands from standard input, one a "
        "line (type `help`): each update prints the facts it added (+) and removed (-), the "
        "strategy each hyper-node took and the time. Works piped as well as on a terminal.",
    )
    _add_inputs(shell)
    add_shared_options(shell, suppress=True)
    return parser


def add_shared_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The options every command takes, on the main parser (``suppress=False``: with their
    defaults) and on each sub-parser (``suppress=True``: absent unless given there), so that
    ``zodiac-edge --stats materialise ...`` and ``zodiac-edge materialise ... --stats`` are one
    command."""

    def default(value):
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("options of every command (before or after its name)")
    group.add_argument(
        "--progress",
        action="store_true",
        default=default(False),
        help="show progress even when not on a terminal",
    )
    group.add_argument(
        "--no-modules",
        action="store_true",
        default=default(False),
        help="evaluate every hyper-node with plain seminaive evaluation (no closure modules)",
    )
    group.add_argument(
        "--no-decompositions",
        action="store_true",
        default=default(False),
        help="evaluate cyclic rules with join plans, never through hypertree decompositions",
    )
    group.add_argument(
        "--stats",
        action="store_true",
        default=default(False),
        help="print statistics (facts per predicate, hyper-nodes, timings) on stderr",
    )
    group.add_argument(
        "-o",
        "--output",
        default=default(None),
        help="write the output here (default: standard output)",
    )
    group.add_argument(
        "--base",
        default=default(DEFAULT_BASE),
        metavar="IRI",
        help="materialise: write each relative IRI (<windTurbine1>) as IRI + it, since "
        f"N-Triples holds absolute IRIs only (default: {DEFAULT_BASE})",
    )
    group.add_argument(
        "--prefixes",
        action="store_true",
        default=default(False),
        help="print IRIs with the rule file's @prefix names (materialise then writes Turtle)",
    )
    group.add_argument(
        "--strict",
        action="store_true",
        default=default(False),
        help="treat warnings (an atom no rule or fact holds, a name that looks like a "
        "misspelt variable, run-time errors) as errors: exit 1",
    )
    add_budget_options(group, default)


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


def add_budget_options(group, default=lambda value: value) -> None:
    """The engine's budgets (agent/engine/budget.py), as the agent's [budget] config has them:
    an update over budget stops with an error and changes nothing."""
    group.add_argument(
        "--max-derived-facts",
        type=_positive(int),
        metavar="N",
        default=default(None),
        help="budget: derived facts held (an update past it stops with an error)",
    )
    group.add_argument(
        "--max-memory-mb",
        type=_positive(int),
        metavar="MB",
        default=default(None),
        help=f"budget: resident memory of the process, counted when it grew by more than "
        f"{MEMORY_SLACK // 2**20} MiB during the update (memory held before is not blamed on it)",
    )
    group.add_argument(
        "--max-seconds",
        type=_positive(float),
        metavar="S",
        default=default(None),
        help="budget: wall time of one update",
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


def load(args: argparse.Namespace, progress: Progress) -> tuple[Reasoner, dict[str, str]]:
    """The reasoner materialised over the inputs, and the rule file's prefixes."""
    from agent.engine.program.parser import parse_file_with_prefixes

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
    program, prefixes = parse_file_with_prefixes(args.rules)
    reasoner.add_rules(program)
    return reasoner, prefixes


def run_materialise(
    args: argparse.Namespace, reasoner: Reasoner, out: TextIO, prefixes: dict[str, str]
) -> None:
    from agent.engine.program.rdf import write_ntriples

    started = time.perf_counter()
    facts = reasoner.facts()
    if args.derived_only:
        explicit = set(Reasoner.facts(_explicit_only(reasoner)))
        facts = (f for f in facts if f not in explicit)
    skipped: Counter[str] = Counter()
    if args.prefixes:  # Turtle: the declared prefixes, then the triples with prefixed names
        shortener = Shortener(prefixes)
        for name, namespace in shortener.prefixes.items():
            out.write(f"@prefix {name}: <{namespace}> .\n")
        out = _Shortened(out, shortener)
    written = write_ntriples(facts, out, skipped, base=args.base)
    if skipped:
        _say_skipped(skipped)
    if args.stats:
        _print_stats(reasoner, written, time.perf_counter() - started)


class _Shortened:
    """A text stream that writes each line with the IRIs under a prefix shortened."""

    def __init__(self, out: TextIO, shortener: Shortener):
        self.out = out
        self.shortener = shortener

    def write(self, text: str) -> int:
        return self.out.write(self.shortener.text(text))


def _say_skipped(skipped: Counter[str]) -> None:
    """Say on stderr which facts N-Triples could not hold (a relation of arity 3 or more, a
    subject that is a literal), so that none goes missing unsaid: ``query`` reads them."""
    total = sum(skipped.values())
    shown = ", ".join(f"{name}: {count}" for name, count in sorted(skipped.items())[:8])
    more = f", and {len(skipped) - 8} more relations" if len(skipped) > 8 else ""
    sys.stderr.write(
        f"zodiac-edge: note: {total} fact{'s' if total != 1 else ''} not written: N-Triples "
        f"holds binary and class facts whose subject is an IRI or a blank node ({shown}{more}); "
        "`zodiac-edge query RULES FACTS PATTERN` answers them\n"
    )


def _explicit_only(reasoner: Reasoner) -> Reasoner:
    """A reasoner sharing the explicit facts but with no rules (for --derived-only)."""
    view = Reasoner()
    view.terms = reasoner.terms
    view.edb = reasoner.edb
    return view


def _print_stats(reasoner: Reasoner, written: int | None, write_seconds: float) -> None:
    stats = reasoner.stats()
    err = sys.stderr
    shown = f", written: {written}" if written is not None else ""
    err.write(
        f"facts: {stats['facts']} ({stats['explicit_facts']} explicit), rules: {stats['rules']}"
        f"{shown}, run-time errors: {stats['runtime_errors']}\n"
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


def split_query_inputs(args: argparse.Namespace) -> None:
    """``query RULES FACTS... PATTERN``: the last argument is the pattern unless --pattern gave
    it; sets ``args.rules``, ``args.facts`` and ``args.pattern``."""
    inputs = list(args.inputs)
    if args.pattern_option is not None:
        args.pattern = args.pattern_option
    elif len(inputs) >= 2 and not _names_a_file(inputs[-1]):
        args.pattern = inputs.pop()
    else:
        raise ZodiacError(
            "query needs RULES, then any FACTS files, then a PATTERN such as '<p11>(X, Y)'"
        )
    args.rules, args.facts = inputs[0], inputs[1:]


def print_answers(
    reasoner: Reasoner,
    text: str,
    out: TextIO,
    prefixes: dict[str, str],
    format: str = "tsv",
    shorten: bool = False,
) -> None:
    from agent.engine.program.parser import parse_atom

    pattern = parse_atom(text, source="pattern", prefixes=prefixes)
    answers = reasoner.query(pattern)
    shortener = Shortener(prefixes if shorten else None)
    if format == "json":
        if shorten:
            answers = [{k: shortener.value(v) for k, v in a.items()} for a in answers]
        json.dump(answers, out, default=str, indent=1)
        out.write("\n")
        return
    names = sorted({t.name for t in pattern.terms if isinstance(t, Variable)} - {ANONYMOUS})
    if not names:  # (a ground pattern, or only ``_``: whether it holds)
        out.write(("true" if answers else "false") + "\n")
        return
    out.write("\t".join(names) + "\n")  # (the header even when nothing answers)
    rows = [[shortener.value(a.get(n, "")) for n in names] for a in answers]
    for row in sorted(rows):
        out.write("\t".join(row) + "\n")


def run_query(
    args: argparse.Namespace, reasoner: Reasoner, out: TextIO, prefixes: dict[str, str]
) -> None:
    print_answers(reasoner, args.pattern, out, prefixes, args.format, args.prefixes)


def explain_fact(
    reasoner: Reasoner,
    text: str,
    out: TextIO,
    prefixes: dict[str, str],
    max_depth: int | None = None,
    shorten: bool = False,
    source: str = "--fact",
) -> None:
    fact = ground_fact(text, source, prefixes)
    try:
        tree = reasoner.explain(fact)
    except KeyError:
        raise ZodiacError(f"{text.strip()} does not hold") from None
    shortener = Shortener(prefixes if shorten else None)
    out.write("\n".join(map(shortener.text, tree.lines(max_depth))) + "\n")
    facts = f"{tree.size} distinct fact{'s' if tree.size != 1 else ''}"
    out.write(f"# {facts}, {tree.height} level{'s' if tree.height != 1 else ''} of rules\n")


def run_explain(
    args: argparse.Namespace, reasoner: Reasoner, out: TextIO, prefixes: dict[str, str]
) -> None:
    if args.plans_rule is not None:
        args.plans = args.plans_rule
    if args.plans is not None:
        print_plans(reasoner, args.plans, out)
        return
    explain_fact(reasoner, args.fact, out, prefixes, args.max_depth, args.prefixes)


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


def run_shell(
    args: argparse.Namespace, reasoner: Reasoner, out: TextIO, prefixes: dict[str, str]
) -> None:
    from agent.engine.console.shell import Shell
    from agent.engine.console.shell import run_shell as run

    shell = Shell(
        reasoner,
        prefixes,
        out,
        sys.stderr,
        answer=lambda r, text, o: print_answers(r, text, o, prefixes, shorten=args.prefixes),
        explain=lambda r, text, o: explain_fact(
            r, text, o, prefixes, shorten=args.prefixes, source="explain"
        ),
        shorten=args.prefixes,
    )
    run(shell)


def _names_a_file(word: str) -> bool:
    """Whether a command-line word is an input file rather than a rule name or a pattern."""
    return os.path.isfile(word) or word.lower().endswith(_FILE_SUFFIXES)


def _plans_before_files(argv: list[str]) -> list[str]:
    """``explain --plans RULES FACTS``: a file name after ``--plans`` is an input, not the rule
    whose plans are wanted (``--plans`` takes an optional rule name), so ``--plans`` is read as
    ``--plans`` alone there."""
    fixed = list(argv)
    for i, word in enumerate(fixed[:-1]):
        following = fixed[i + 1]
        if word == "--plans" and _names_a_file(following):
            fixed[i] = f"--plans={EVERY_RULE}"
    return fixed


def _check_args(args: argparse.Namespace) -> None:
    from agent.engine.program.rdf import is_absolute_iri

    if args.command == "query":
        split_query_inputs(args)
    if not is_absolute_iri(args.base) or any(c in args.base for c in '<>"{}|^`\\ '):
        raise ZodiacError(
            f"--base must be an absolute IRI such as {DEFAULT_BASE} or http://example.org/, "
            f"got {args.base!r}"
        )


COMMANDS = {
    "materialise": run_materialise,
    "query": run_query,
    "explain": run_explain,
    "shell": run_shell,
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(_plans_before_files(argv))
    out = out or sys.stdout
    progress = Progress(force=args.progress)
    handle = None
    try:
        _check_args(args)
        reasoner, prefixes = load(args, progress)
        progress.close()
        warnings = program_warnings(reasoner)
        if warnings and args.strict:
            for warning in warnings:
                sys.stderr.write(f"zodiac-edge: error: {warning}\n")
            sys.stderr.write(
                f"zodiac-edge: error: {len(warnings)} warning"
                f"{'s' if len(warnings) != 1 else ''} under --strict; nothing written\n"
            )
            return 1
        if args.output:
            try:
                handle = open(args.output, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            except OSError as error:
                raise ZodiacError(
                    f"cannot write {args.output}: {error.strerror or error}"
                ) from None
            out = handle
        COMMANDS[args.command](args, reasoner, out, prefixes)
        # (after the command, so that a bad pattern or output path stays one error line)
        for warning in warnings:
            sys.stderr.write(f"zodiac-edge: warning: {warning}\n")
        if args.stats and args.command != "materialise":
            _print_stats(reasoner, None, 0.0)
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
    finally:
        if handle is not None:
            handle.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
