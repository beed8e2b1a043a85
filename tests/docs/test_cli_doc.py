"""docs/cli.md is the command line as ``--help`` shows it: every subcommand and option of
``zodiac-edge`` is on the page and the page names no other; every subcommand of
``zodiac-agent`` and ``zodiac-cloud`` is in its table, and every option the page gives them
exists. Read from the parsers themselves (what ``--help`` prints), in process."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
CODE = re.compile(r"`([^`\n]+)`|^(?:zodiac-\w+ .*)$", re.MULTILINE)
# An option: --long, or -x alone (not the shell's -rule, not a bare -).
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z](?![\w-]))")


def section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def documented_options(text: str) -> set[str]:
    """The options the page writes in code (inline code and sh blocks)."""
    found: set[str] = set()
    for match in CODE.finditer(text):
        found |= set(OPTION.findall(match.group()))
    for block in re.findall(r"^```sh\n(.*?)^```$", text, re.DOTALL | re.MULTILINE):
        found |= set(OPTION.findall(block))
    return found


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def all_options(parser: argparse.ArgumentParser) -> set[str]:
    """The options of the parser and of its subcommands, nested ones too (``keys generate``)."""
    found = options(parser)
    if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        for sub in subcommands(parser).values():
            found |= all_options(sub)
    return found


def test_zodiac_edge_on_the_page_is_its_help():
    from agent.engine.cli import build_parser

    parser = build_parser()
    text = section("zodiac-edge")
    headings = set(re.findall(r"^### zodiac-edge (\w+)$", text, re.MULTILINE))
    assert headings == set(subcommands(parser))
    help_options = all_options(parser)
    on_page = documented_options(text)
    assert help_options - on_page == set(), "options in --help missing from docs/cli.md"
    assert on_page - help_options == set(), "options in docs/cli.md that --help does not have"
    for name, sub in subcommands(parser).items():  # each command's own options in its section
        own = options(sub) - options(parser)
        start = text.index(f"### zodiac-edge {name}")
        end = text.find("\n### ", start + 1)
        assert own <= documented_options(text[start : end if end != -1 else None]), name


@pytest.mark.parametrize(
    ("title", "module"), [("zodiac-agent", "agent.cli"), ("zodiac-cloud", "cloud.zodiac_cloud_cli")]
)
def test_the_agent_and_cloud_subcommands_on_the_page_are_theirs(title, module):
    import importlib

    parser = importlib.import_module(module).build_parser()
    text = section(title)
    listed = set(re.findall(rf"^\| `{title} (\w+)", text, re.MULTILINE))
    assert listed == set(subcommands(parser))
    assert documented_options(text) - all_options(parser) == set()
