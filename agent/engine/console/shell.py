"""``zodiac-edge shell``: add and delete facts and rules one line at a time and see what each
update did: the facts it added and removed, the strategy each hyper-node took (recompute,
in-place maintenance, merge...) and the time. It is the quickest way to watch incremental
maintenance at work, and reads its commands from standard input, so it works piped too.

A bad line (a syntax error, an unsafe rule, an unknown rule name) prints one error line and
changes nothing; the shell goes on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TextIO

from agent.engine import Reasoner, ZodiacError
from agent.engine.console.terms import Shortener, fact_text, ground_fact

HELP = """commands (one a line):
  + ATOM .             add an explicit fact, e.g. + <edge>(<a>, <b>) .
  - ATOM .             delete an explicit fact
  +rule RULE           add a rule, e.g. +rule r9: <path>(X, Z) :- <edge>(X, Y), <path>(Y, Z) .
  -rule NAME           delete a rule by label or content key
  query PATTERN        print the answers of an atom pattern, e.g. query <path>(<a>, X)
  explain ATOM         print one derivation tree of a fact
  facts                print every fact
  rules                print every rule
  help                 this text
  quit                 leave (end of input does the same)
after each update: the facts it added (+) and removed (-), each hyper-node's strategy, the time"""


class Shell:
    def __init__(
        self,
        reasoner: Reasoner,
        prefixes: dict[str, str],
        out: TextIO,
        err: TextIO,
        answer: Callable[[Reasoner, str, TextIO], None],
        explain: Callable[[Reasoner, str, TextIO], None],
        shorten: bool = False,
    ):
        self.reasoner = reasoner
        self.prefixes = prefixes
        self.declared = Shortener(prefixes).declared()  # (for +rule's text)
        self.shorten = Shortener(prefixes if shorten else None)  # (--prefixes: for printing)
        self.out = out
        self.err = err
        self.answer = answer
        self.explain = explain
        self.errors = 0

    def run(self, lines: Iterable[str], prompt: bool = False) -> int:
        """Run every line; return the number of lines refused."""
        if prompt:
            self.out.write("zodiac-edge shell: type help for the commands\n> ")
            self.out.flush()
        for line in lines:
            if not self.one(line.strip()):
                break
            if prompt:
                self.out.write("> ")
            self.out.flush()
        return self.errors

    def one(self, line: str) -> bool:
        """Run one command; False when it was ``quit``."""
        if not line or line.startswith("#"):
            return True
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        try:
            if word in ("quit", "exit"):
                return False
            if word == "help":
                self.out.write(HELP + "\n")
            elif word == "+rule":
                self.update(add_rules=self._with_prefixes(rest))
            elif word == "-rule":
                if not rest:
                    raise ZodiacError("-rule needs a rule name (a label or content key)")
                self.update(delete_rules=rest.split())
            elif word == "+" or (word.startswith("+") and word != "+rule"):
                fact = ground_fact(line[1:], "+", self.prefixes)
                self.update(add_facts=[fact])
            elif word == "-" or (word.startswith("-") and word != "-rule"):
                fact = ground_fact(line[1:], "-", self.prefixes)
                self.update(delete_facts=[fact])
            elif word == "query":
                self.answer(self.reasoner, rest, self.out)
            elif word == "explain":
                self.explain(self.reasoner, rest, self.out)
            elif word == "facts":
                for text in sorted(map(fact_text, self.reasoner.facts())):
                    self.out.write(self.shorten.text(text) + "\n")
            elif word == "rules":
                for name, rule in sorted(self.reasoner.rules.items()):
                    shown = str(rule) if rule.label == name else f"{name}: {rule}"
                    self.out.write(self.shorten.text(shown) + "\n")
            else:
                raise ZodiacError(f"unknown command {word!r} (type help)")
        except ZodiacError as error:
            self.errors += 1
            self.err.write(f"error: {str(error).splitlines()[0]}\n")
            self.err.flush()
        return True

    def _with_prefixes(self, text: str) -> str:
        """Rule text with the rule file's prefixes declared first, so that ``ex:p`` works."""
        if not text:
            raise ZodiacError("+rule needs a rule, e.g. +rule r: <p>(X) :- <q>(X) .")
        header = "".join(
            f"@prefix {name}: <{ns}> .\n" for name, ns in self.declared.items()
        )
        return header + text

    def update(self, **change) -> None:
        before = set(map(fact_text, self.reasoner.facts()))
        report = self.reasoner.update(**change)
        after = set(map(fact_text, self.reasoner.facts()))
        write = self.out.write
        for text in sorted(after - before):
            write(f"+ {self.shorten.text(text)}\n")
        for text in sorted(before - after):
            write(f"- {self.shorten.text(text)}\n")
        for name, node in report["hyper_nodes"].items():
            write(
                f"  hyper-node {name}: {node['strategy']} (+{node['added']} -{node['removed']}, "
                f"{node['seconds'] * 1000:.2f} ms)\n"
            )
        write(f"# {report['operation']}: {report['seconds'] * 1000:.2f} ms\n")


def run_shell(shell: Shell, stream: TextIO = sys.stdin) -> int:
    return shell.run(stream, prompt=stream.isatty())
