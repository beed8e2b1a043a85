"""The docs are true and stay reference, not a diary (as sqlite-utils tests its docs):

* every ```python block of README.md and docs/*.md runs, in a fresh interpreter from an empty
  directory, and ends without error;
* every ```sh block of README.md runs with bash from the repository's root (``set -e``), with
  the interpreter's folder first on ``PATH`` (so ``python``, ``zodiac-edge``, ``zodiac-agent``
  and ``zodiac-cloud`` are this virtual environment's), ``PYTHONPATH`` this checkout (so the
  console scripts, which import the checkout the environment was installed from, run the code
  under test), ``TMPDIR`` the test's own folder (blocks that write files ``cd "$(mktemp -d)"``)
  and ``BROKER_PORT`` a private Mosquitto's port for blocks that name it. The lines of
  ``SKIPPED_COMMANDS`` are left out: they are the suite itself and the demo, run elsewhere;
* every ```sh block of docs/*.md is valid bash (``bash -n``): they are operators' commands
  (installing a broker, a Spark cluster, benchmarks of minutes) that the suite cannot run;
* README.md and docs/*.md carry no dates outside code, no commit hashes and no diary phrases
  ("this session", "the commit before"...): figures with their history belong in the
  CHANGELOG or nowhere, the current ones in docs/benchmarks.md;
* every relative link points to a file that exists.

Each problem is reported as ``file:line``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# docs/*.md by glob: a page added later (docs/benchmarks.md) is checked as soon as it exists.
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", re.DOTALL | re.MULTILINE)
# Commands of the README's sh blocks that the docs test does not run: `make test` and
# `make test-quick` are the suite this test belongs to, `make demo` the simulation, which
# tests/simulation runs with its own checks.
SKIPPED_COMMANDS = ("make demo", "make test", "make test-quick")

# --------------------------------------------------------------------------- diary checks
ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
HEX_WORD = re.compile(r"(?<![\w-])[0-9a-f]{7,40}(?![\w-])")
ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
DIARY = [
    rf"\b(?:this|that|last|previous|next|same|earlier|later|an? {ORDINAL}|the {ORDINAL}|{ORDINAL})"
    r"(?:'s)? sessions?\b",
    r"\ba session (?:earlier|later|before|ago)\b",
    r"\bthis commit\b",
    r"\bthe (?:previous )?commit before\b",
    r"\bcommits? (?:after|since)\b",
    r"\byesterday\b",
    r"\btoday(?:'s)?\b",
    r"\bearlier today\b",
    r"\blast runs?\b",
    r"\bthe day's\b",
    r"\bthat day\b",
    r"\bissue #?\d+ still\b",
    r"\bstill needs\b",
]
DIARY_PHRASE = re.compile("|".join(f"(?:{pattern})" for pattern in DIARY), re.IGNORECASE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def blocks(doc: Path, language: str) -> list[tuple[int, str]]:
    """(line of the opening fence, body) of each fenced block of ``language``."""
    text = doc.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, match.start()) + 1, match[2])
        for match in FENCE.finditer(text)
        if match[1] == language
    ]


def prose_lines(doc: Path) -> Iterator[tuple[int, str, str]]:
    """(line number, the line, the line without inline code) outside fenced blocks."""
    in_fence = False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, line, INLINE_CODE.sub("``", line)


def shown(doc: Path) -> str:
    return str(doc.relative_to(REPO)) if doc.is_relative_to(REPO) else doc.name


def diary_problems(doc: Path) -> list[str]:
    name = shown(doc)
    problems = []
    for number, line, prose in prose_lines(doc):
        for date in ISO_DATE.findall(prose):
            problems.append(f"{name}:{number}: a date ({date}): say what is, not when")
        for word in HEX_WORD.findall(line):
            if re.search(r"\d", word) and re.search(r"[a-f]", word):
                problems.append(f"{name}:{number}: a commit hash? ({word})")
        for phrase in DIARY_PHRASE.finditer(prose):
            problems.append(f"{name}:{number}: a diary phrase ({phrase[0]!r})")
    return problems


def link_problems(doc: Path) -> list[str]:
    problems = []
    for number, line, _ in prose_lines(doc):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # another site (https:, mailto:) or a heading of this page
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                problems.append(f"{shown(doc)}:{number}: no such file: {target}")
    return problems


def test_the_readme_is_a_guide_of_at_most_200_lines() -> None:
    """The README is a guide (what it is, the quick start, a tour, the layout, links); the
    reference lives in docs/."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail to docs/"


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_docs_are_reference_not_a_diary(doc: Path) -> None:
    problems = diary_problems(doc)
    assert not problems, "\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_relative_links_point_to_files(doc: Path) -> None:
    problems = link_problems(doc)
    assert not problems, "\n" + "\n".join(problems)


def test_the_diary_check_sees_what_it_should(tmp_path: Path) -> None:
    """The check itself: what it must reject, and what it must let through (MQTT sessions,
    dates in examples, content keys)."""
    page = tmp_path / "page.md"
    bad = [
        "Measured on 2026-11-27, two runs.",
        "Against 312e36d (same machine).",
        "The ninth session gave 1.2x; the fourth session's figure was 0.9x.",
        "In this session the restart got faster than the commit before.",
        "What issue #20 still needs: a bitmap store.",
    ]
    good = [
        "A persistent session keeps queued messages; the session expiry is a day.",
        "`version 4 is valid from 2025-06-01T10:00:00Z`",
        "```",
        "2025-06-01 in a code block, and deadbeef",
        "```",
        "Both labels have the key `hbf146a72456b`; Mosquitto issue 2618.",
    ]
    page.write_text("\n".join(bad + good) + "\n", encoding="utf-8")
    found = diary_problems(page)
    lines = sorted({int(problem.split(":")[1]) for problem in found})
    assert lines == [1, 2, 3, 4, 5], found
    assert len([p for p in found if ":3:" in p]) == 2


# ------------------------------------------------------------------------ running blocks
def python_blocks() -> list:
    return [
        pytest.param(doc, code, id=f"{doc.relative_to(REPO)}:{line}")
        for doc in DOCS
        for line, code in blocks(doc, "python")
    ]


def runnable(script: str) -> str:
    """The block without the lines of SKIPPED_COMMANDS (a command, then maybe a comment)."""
    skipped = re.compile("|".join(rf"{re.escape(c)}\s*(#.*)?" for c in SKIPPED_COMMANDS))
    kept = [line for line in script.splitlines() if not skipped.fullmatch(line.strip())]
    return "\n".join(kept).strip()


def readme_sh_blocks() -> list:
    return [
        pytest.param(script, id=f"README.md:{line}")
        for line, code in blocks(README, "sh")
        if (script := runnable(code))
    ]


def docs_sh_blocks() -> list:
    return [
        pytest.param(code, id=f"{doc.relative_to(REPO)}:{line}")
        for doc in DOCS[1:]
        for line, code in blocks(doc, "sh")
    ]


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)
    env.update(extra)
    return env


@pytest.mark.parametrize(("doc", "code"), python_blocks())
def test_python_block_runs(doc: Path, code: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{doc.name}: the example fails:\n{result.stderr}"


@pytest.mark.parametrize("script", readme_sh_blocks())
def test_readme_sh_block_runs(script: str, tmp_path: Path, make_broker) -> None:
    extra = {"BROKER_PORT": str(make_broker().port)} if "BROKER_PORT" in script else {}
    process = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=REPO,
        env=environment(tmp_path, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its background jobs (an agent) are stopped with it
    )
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"the block did not end within 120 s:\n{stdout}\n{stderr}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    assert process.returncode == 0, f"the block fails:\n{stdout}\n{stderr}"


@pytest.mark.parametrize("code", docs_sh_blocks())
def test_docs_sh_block_is_valid_bash(code: str) -> None:
    result = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_skipped_commands_are_only_those_named() -> None:
    assert runnable("make demo   # the simulation\nmake test\nmake test-quick\n") == ""
    assert runnable("make testing\nmake demo-x") == "make testing\nmake demo-x"
