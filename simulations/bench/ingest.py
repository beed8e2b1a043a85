"""Benchmark: ingestion, from fact tuples and RDF files into a reasoner's store.

    python -m simulations.bench.ingest [--facts N] [--repeat N] [--parsers N] [--markdown [FILE]]

A deterministic data set of ``N`` facts (a million by default) over 20 predicates and 100,000
IRIs (``http://example.org/e0`` ...) is loaded into a fresh ``Reasoner`` (no rules) five ways:
``add_facts`` of IRI tuples; of tuples whose objects are numbers (integers for half the
predicates, floats for the others); and a path to the IRI facts written as an N-Triples file,
as a Turtle file with prefixes (``ex:e1 ex:p3 ex:e5 .``), and the number facts as an
N-Triples file of typed literals. Each row prints facts a second (best of ``--repeat``, the
rows alternated within each round) and the bytes per stored fact (``memory.footprint``:
traced Python memory kept, and resident-set growth, in fresh processes).

A second table times the parsers alone on the N-Triples and Turtle files: pyoxigraph's (what
``read_facts`` uses) and rdflib's (what it used before), on the first ``--parsers`` facts
(100,000 by default: rdflib takes about half a minute for a million).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import tempfile

from agent.engine.language import XSD
from agent.engine.reasoner import Reasoner
from simulations.bench.memory import fact_count, footprint
from simulations.bench.table import Table, add_markdown_option, factor, write_markdown
from simulations.bench.timing import timed

BASE = "http://example.org/"
PREDICATES = 20
IRIS = 100_000
SEED = 51


def iri_facts(count: int, iris: int = IRIS) -> list[tuple[str, str, str]]:
    """``count`` distinct triples ``(predicate, subject, object)`` of IRIs, always the same."""
    rng = random.Random(SEED)
    names = [f"{BASE}e{i}" for i in range(iris)]
    predicates = [f"{BASE}p{i}" for i in range(PREDICATES)]
    seen: set[tuple[str, str, str]] = set()
    facts = []
    while len(facts) < count:
        fact = (
            predicates[len(facts) % PREDICATES],
            names[rng.randrange(iris)],
            names[rng.randrange(iris)],
        )
        if fact not in seen:
            seen.add(fact)
            facts.append(fact)
    return facts


def number_facts(count: int, iris: int = IRIS) -> list[tuple[str, str, int | float]]:
    """``count`` distinct triples whose objects are numbers: integers below a million for the
    even predicates, floats with three decimals for the odd ones."""
    rng = random.Random(SEED + 1)
    names = [f"{BASE}e{i}" for i in range(iris)]
    predicates = [f"{BASE}p{i}" for i in range(PREDICATES)]
    seen: set[tuple] = set()
    facts: list[tuple[str, str, int | float]] = []
    while len(facts) < count:
        p = len(facts) % PREDICATES
        value = rng.randrange(1_000_000) if p % 2 == 0 else rng.randrange(1_000_000) / 1000 + 0.0005
        fact = (predicates[p], names[rng.randrange(iris)], value)
        if fact not in seen:
            seen.add(fact)
            facts.append(fact)
    return facts


def ntriples(facts: list[tuple]) -> str:
    """The facts as N-Triples lines (numbers as typed literals)."""
    out = io.StringIO()
    for p, s, o in facts:
        if isinstance(o, str):
            out.write(f"<{s}> <{p}> <{o}> .\n")
        elif isinstance(o, int):
            out.write(f'<{s}> <{p}> "{o}"^^<{XSD}integer> .\n')
        else:
            out.write(f'<{s}> <{p}> "{o!r}"^^<{XSD}decimal> .\n')
    return out.getvalue()


def turtle(facts: list[tuple[str, str, str]]) -> str:
    """The IRI facts as Turtle, every IRI a prefixed name."""
    cut = len(BASE)
    lines = [f"@prefix ex: <{BASE}> .\n"]
    lines += [f"ex:{s[cut:]} ex:{p[cut:]} ex:{o[cut:]} .\n" for p, s, o in facts]
    return "".join(lines)


def load(source: object) -> Reasoner:
    """A fresh reasoner holding ``source`` (tuples, or a path)."""
    reasoner = Reasoner()
    reasoner.add_facts(source)
    return reasoner


def load_made(kind: str, count: int, path: str | None) -> Reasoner:
    """``load`` for ``footprint``'s child: it makes the data itself (module-level, picklable)."""
    if path is not None:
        return load(path)
    return load(iri_facts(count) if kind == "iri" else number_facts(count))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=1_000_000, help="facts in the data set")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the best counts")
    parser.add_argument("--parsers", type=int, default=100_000, help="facts for the parser table")
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    iris = min(IRIS, max(10, args.facts // 10))

    iri = iri_facts(args.facts, iris)
    numbers = number_facts(args.facts, iris)
    with tempfile.TemporaryDirectory(prefix="zodiac-ingest-") as folder:
        files = {}
        for name, text in (
            ("iri.nt", ntriples(iri)),
            ("iri.ttl", turtle(iri)),
            ("numbers.nt", ntriples(numbers)),
        ):
            files[name] = os.path.join(folder, name)
            with open(files[name], "w", encoding="utf-8") as out:
                out.write(text)
        rows = [
            ("add_facts, IRI tuples", "iri", None, lambda: load(iri)),
            ("add_facts, number tuples", "numbers", None, lambda: load(numbers)),
            ("N-Triples file, IRIs", "iri", files["iri.nt"], lambda: load(files["iri.nt"])),
            ("Turtle file, prefixed IRIs", "iri", files["iri.ttl"], lambda: load(files["iri.ttl"])),
            (
                "N-Triples file, number literals",
                "numbers",
                files["numbers.nt"],
                lambda: load(files["numbers.nt"]),
            ),
        ]
        for _, _, _, action in rows:  # (each is checked once, and warms up)
            assert action().count() == args.facts
        best = [float("inf")] * len(rows)
        for round_ in range(args.repeat):  # (rows alternated: each round runs them all)
            order = range(len(rows)) if round_ % 2 == 0 else reversed(range(len(rows)))
            for i in order:
                best[i] = min(best[i], timed(rows[i][3]))
        table = Table(
            ("load", "facts", "s", "facts/s", "kept B/fact", "RSS B/fact"),
            "lrrrrr",
            title=f"Ingestion into a fresh reasoner, {PREDICATES} predicates over {iris:,} IRIs "
            f"(best of {args.repeat})",
        )
        print(f"{args.facts:,} facts of {PREDICATES} predicates over {iris:,} IRIs")
        for (name, kind, path, _), seconds in zip(rows, best, strict=True):
            used = footprint(load_made, fact_count, kind, args.facts, path)
            rate = args.facts / seconds
            kept, rss = used.per_fact(used.traced_kept), used.per_fact(used.rss)
            print(
                f"  {name:<32} {seconds:7.3f} s  {rate / 1e6:6.2f}M facts/s  "
                f"kept {kept:5.0f} B/fact  RSS {rss:5.0f} B/fact"
            )
            table.add(name, f"{args.facts:,}", f"{seconds:.3f}", f"{rate:,.0f}", f"{kept:.0f}",
                      f"{rss:.0f}")  # fmt: skip
        tables = [table, parser_table(files, min(args.parsers, args.facts), args.repeat, folder)]
    write_markdown(args.markdown, tables)
    return 0


def parser_table(files: dict[str, str], count: int, repeat: int, folder: str) -> Table:
    """pyoxigraph's and rdflib's parsers alone, on the first ``count`` lines of each file."""
    import rdflib
    from pyoxigraph import RdfFormat, parse

    table = Table(
        ("file", "facts", "pyoxigraph s", "rdflib s", "rdflib / pyoxigraph"),
        "lrrrr",
        title=f"The parsers alone (best of {repeat})",
    )
    print(f"the parsers alone, {count:,} facts:")
    for name, oxi_format, rdflib_format in (
        ("iri.nt", RdfFormat.N_TRIPLES, "nt"),
        ("iri.ttl", RdfFormat.TURTLE, "turtle"),
    ):
        with open(files[name], "rb") as source:
            lines = source.readlines()[: count + (name.endswith(".ttl"))]
        path = os.path.join(folder, "part-" + name)
        with open(path, "wb") as out:
            out.writelines(lines)

        def oxigraph(path: str = path, oxi_format: RdfFormat = oxi_format) -> None:
            for _ in parse(path=path, format=oxi_format):
                pass

        def with_rdflib(path: str = path, rdflib_format: str = rdflib_format) -> None:
            rdflib.Graph().parse(path, format=rdflib_format)

        oxi = min(timed(oxigraph) for _ in range(repeat))
        slow = min(timed(with_rdflib) for _ in range(repeat))
        print(f"  {name:<8} pyoxigraph {oxi:7.3f} s  rdflib {slow:7.3f} s  ({slow / oxi:.0f}x)")
        table.add(name, f"{count:,}", f"{oxi:.3f}", f"{slow:.3f}", factor(slow / oxi, 1))
    return table


if __name__ == "__main__":
    raise SystemExit(main())
