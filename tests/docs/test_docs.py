"""The docs' Python examples run: every ```python block of README.md and docs/*.md is executed,
in a fresh interpreter from an empty directory (as a reader would paste it, with the package
installed), and must end without error."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks() -> list:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(pytest.param(doc, match[1], id=f"{doc.relative_to(REPO)}:{line}"))
    return found


@pytest.mark.parametrize(("doc", "code"), python_blocks())
def test_python_block_runs(doc: Path, code: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO if "simulations" in code else tmp_path,  # (the README's uses the repo's data)
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{doc.name}: the example fails:\n{result.stderr}"
