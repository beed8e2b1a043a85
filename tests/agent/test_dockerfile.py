"""`Dockerfile.edge` builds the edge agent image from the right files, with the right packages.

No Docker daemon needed: the Dockerfile is parsed and checked statically, and what a static
check cannot prove — that the image holds the agent only, installs without pyspark or the test
tools, and cannot import ``cloud`` — is checked by carrying out its WORKDIR, COPY and
``pip install`` steps into a temporary directory and a fresh venv, as the build does.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile.edge"
DOCKERIGNORE = ROOT / ".dockerignore"
# The image's build configuration: the agent's packages only.
EDGE_PYPROJECT = ROOT / "packaging" / "edge" / "pyproject.toml"

# Never in the edge image: the Spark job's engine and the test tools.
FORBIDDEN_PACKAGES = ("pyspark", "pytest", "hypothesis", "ruff")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int

    @property
    def words(self) -> list[str]:
        """The arguments as words: JSON (exec) form or shell-like form."""
        text = self.arguments.strip()
        if text.startswith("["):
            return json.loads(text)
        return shlex.split(text)


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (enough for our file)."""
    instructions: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by Docker
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
    assert not pending, "Dockerfile ends inside a continued line"
    return instructions


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def of(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def copy_sources(instructions: list[Instruction]) -> list[str]:
    """Every source path of every COPY/ADD from the build context (not from another stage)."""
    sources = []
    for instruction in of(instructions, "COPY") + of(instructions, "ADD"):
        words = instruction.words
        if any(w.startswith("--from") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        assert len(paths) >= 2, f"line {instruction.line}: COPY needs a source and a destination"
        sources += paths[:-1]
    return sources


def ignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Approximation of Docker's .dockerignore matching, good for the patterns we use.

    A path is excluded when it or one of its parent directories matches; ``**/x`` matches at
    any depth; a later ``!pattern`` re-includes. (fnmatch's ``*`` also crosses ``/``: looser
    than Docker, which only makes the "is excluded" assertions easier to satisfy, never the
    "is kept" ones.)
    """
    parts = path.strip("/").removeprefix("./").split("/")
    n = len(parts)
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        if pattern.startswith("**/"):
            subpaths = ["/".join(parts[i:j]) for i in range(n) for j in range(i + 1, n + 1)]
            hit = any(fnmatch.fnmatch(sub, pattern[3:]) for sub in subpaths)
        else:
            hit = any(fnmatch.fnmatch("/".join(parts[:j]), pattern) for j in range(1, n + 1))
        if hit:
            result = not negate
    return result


# ----------------------------------------------------------------------- static checks
def test_base_image_is_python_311_slim(instructions):
    froms = of(instructions, "FROM")
    assert [f.words[0] for f in froms][-1] == "python:3.11-slim"


def test_every_copy_source_exists_and_is_in_the_build_context(instructions):
    sources = copy_sources(instructions)
    assert sources, "no COPY instruction?"
    patterns = ignore_patterns()
    for source in sources:
        assert (ROOT / source).exists(), f"COPY source {source} does not exist"
        assert not ignored(source, patterns), f"COPY source {source} is excluded by .dockerignore"
    # The image needs exactly the agent's build configuration, its sources and the rules.
    assert {s.rstrip("/") for s in sources} == {"packaging/edge/pyproject.toml", "agent", "rules"}


def test_dockerignore_keeps_out_venv_tests_git_caches_and_output():
    patterns = ignore_patterns()
    for path in (
        ".venv/bin/python",
        "tests/agent/test_config.py",
        ".git/HEAD",
        "agent/__pycache__/config.cpython-311.pyc",
        ".pytest_cache/v",
        ".ruff_cache/x",
        ".hypothesis/examples",
        "out/bench.json",
        "zodiac-agent.db",
        "keys/cloud.key",
        "cloud/zodiac_cloud_cli.py",
        "deploy/mosquitto/acl",
        "simulations/windfarm/run.py",
    ):
        assert ignored(path, patterns), path
    for path in (
        "packaging/edge/pyproject.toml",
        "agent/config.py",
        "agent/engine/modules/seminaive.py",
        "rules/benchmarks/rs1.rules",
    ):
        assert not ignored(path, patterns), path


def test_installs_the_project_without_extras_or_test_tools(instructions):
    runs = " ".join(r.arguments for r in of(instructions, "RUN"))
    lowered = runs.lower()
    for package in FORBIDDEN_PACKAGES:
        assert package not in lowered, f"the image installs {package}"
    assert ".[" not in runs, "the image installs extras of the project"
    assert "-e " not in runs and "--editable" not in runs, "an editable install needs the source"
    installs = [
        shlex.split(r.arguments) for r in of(instructions, "RUN") if "pip install" in r.arguments
    ]
    assert installs, "the image does not pip install anything"
    words = [w for command in installs for w in command]
    assert "." in words, "the project itself is not installed"
    assert "--no-cache-dir" in words


def test_runs_as_a_non_root_user(instructions):
    users = of(instructions, "USER")
    assert users, "no USER: the container would run as root"
    user = users[-1].words[0].split(":")[0]
    assert user not in ("root", "0")
    assert user == "zodiac"
    # USER must come after the last RUN (which needs root) and before the entry point.
    keywords = [i.keyword for i in instructions]
    last_user = max(i for i, k in enumerate(keywords) if k == "USER")
    assert last_user > max(i for i, k in enumerate(keywords) if k == "RUN")
    assert last_user < keywords.index("ENTRYPOINT")


def test_entrypoint_command_volume_and_healthcheck(instructions):
    assert of(instructions, "ENTRYPOINT")[-1].words == ["zodiac-agent"]
    assert of(instructions, "CMD")[-1].words == ["run", "--config", "/etc/zodiac/agent.toml"]
    assert "/var/lib/zodiac" in of(instructions, "VOLUME")[-1].words
    healthcheck = of(instructions, "HEALTHCHECK")[-1].arguments
    assert "CMD" in healthcheck
    exec_form = healthcheck[healthcheck.index("CMD") + 3 :].strip()
    assert json.loads(exec_form) == [
        "zodiac-agent",
        "status",
        "--config",
        "/etc/zodiac/agent.toml",
    ]


def test_pyspark_is_only_an_optional_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"]).lower()
    for package in FORBIDDEN_PACKAGES:
        assert package not in runtime, f"{package} is a runtime dependency of the edge agent"
    optional = project["optional-dependencies"]
    assert any(dep.lower().startswith("pyspark") for dep in optional["cloud"])
    assert "zodiac-agent" in project["scripts"]


def test_edge_build_configuration_is_the_projects_agent_part():
    """packaging/edge/pyproject.toml repeats pyproject.toml's agent half: same version, Python,
    runtime dependencies, every agent package and command, and nothing of the cloud's."""
    whole = tomllib.loads((ROOT / "pyproject.toml").read_text())
    edge = tomllib.loads(EDGE_PYPROJECT.read_text())
    for key in ("version", "requires-python", "dependencies"):
        assert edge["project"][key] == whole["project"][key], key
    assert "optional-dependencies" not in edge["project"]
    agent_packages = [
        p for p in whole["tool"]["setuptools"]["packages"] if p.split(".")[0] == "agent"
    ]
    assert edge["tool"]["setuptools"]["packages"] == agent_packages
    # Every agent package on disk is listed (a new one must be added to both files).
    inits = (ROOT / "agent").rglob("__init__.py")
    on_disk = sorted(".".join(init.parent.relative_to(ROOT).parts) for init in inits)
    assert sorted(agent_packages) == on_disk
    agent_commands = {
        name: target
        for name, target in whole["project"]["scripts"].items()
        if target.startswith("agent.")
    }
    assert edge["project"]["scripts"] == agent_commands
    assert edge["build-system"] == whole["build-system"]


# ------------------------------------------------------------------------- real install
def build_edge_image(instructions: list[Instruction], image: Path, venv: Path) -> Path:
    """Carry out the Dockerfile's file steps with ``image`` as the image's ``/``.

    WORKDIR and COPY as Docker does them (from the build context less what .dockerignore
    excludes; a directory's contents into the destination; several sources or a destination
    ending in ``/`` mean "into this directory"), and each RUN that installs with pip, in its
    WORKDIR, with ``venv``'s pip first on PATH. The one liberty: ``--no-cache-dir`` is dropped,
    so the test reuses this machine's wheel cache instead of downloading every dependency.
    Other RUN steps (the user, the state directory) need root and are checked statically.
    """
    patterns = ignore_patterns()
    workdir = PurePosixPath("/")

    def in_image(path: PurePosixPath) -> Path:
        return image / path.relative_to("/")

    def copy_tree(source: str, target: Path) -> None:
        for path in sorted((ROOT / source).rglob("*")):
            relative = path.relative_to(ROOT).as_posix()
            if path.is_dir() or ignored(relative, patterns):
                continue
            destination = target / path.relative_to(ROOT / source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    for instruction in instructions:
        if instruction.keyword == "WORKDIR":
            workdir = workdir / instruction.words[0]
            in_image(workdir).mkdir(parents=True, exist_ok=True)
        elif instruction.keyword in ("COPY", "ADD"):
            *sources, destination = [w for w in instruction.words if not w.startswith("--")]
            target = in_image(workdir / destination)
            into = destination.endswith("/") or len(sources) > 1
            for source in sources:
                if (ROOT / source).is_dir():
                    copy_tree(source, target)
                else:
                    path = target / Path(source).name if into else target
                    path.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / source, path)
        elif instruction.keyword == "RUN" and "pip install" in instruction.arguments:
            command = instruction.arguments.replace("--no-cache-dir", "")
            done = subprocess.run(
                ["sh", "-c", command],
                cwd=in_image(workdir),
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"line {instruction.line}: {done.stdout}{done.stderr}"
    return in_image(workdir)


@pytest.mark.slow
def test_the_image_holds_the_agent_only_and_cannot_import_cloud(tmp_path, instructions):
    image, venv = tmp_path / "image", tmp_path / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    build_edge_image(instructions, image, venv)
    print(f"fresh venv + the image's pip install: {time.monotonic() - started:.1f} s")

    # What is left of the build context in the image: the rules, nothing else.
    left = {p.relative_to(image).as_posix() for p in image.rglob("*") if p.is_file()}
    assert left and all(p.startswith("opt/zodiac/rules/") for p in left), sorted(left)[:10]

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    probe = (
        "import importlib, importlib.util, json, sys\n"
        "mods = ['agent', 'agent.engine', 'agent.config', 'agent.protocol.messages',\n"
        "        'agent.protocol.keys', 'agent.protocol.signing', 'agent.sync']\n"
        "files = {m: importlib.import_module(m).__file__ for m in mods}\n"
        "try:\n"
        "    import cloud\n"
        "    cloud_error = None\n"
        "except ImportError as error:\n"
        "    cloud_error = type(error).__name__\n"
        f"absent = {['cloud', 'simulations', 'tests', *FORBIDDEN_PACKAGES]!r}\n"
        "found = [p for p in absent if importlib.util.find_spec(p) is not None]\n"
        "print(json.dumps({'files': files, 'cloud_error': cloud_error, 'found': found}))\n"
    )
    # Run from an empty directory: `python -c` puts the working directory on sys.path, and the
    # repository's own agent/ and cloud/ must not be what gets imported.
    workdir = tmp_path / "empty"
    workdir.mkdir()
    python = venv / "bin" / "python"
    result = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=120, cwd=workdir,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cloud_error"] == "ModuleNotFoundError", "the image can import cloud"
    assert report["found"] == [], f"installed without being asked for: {report['found']}"
    for module, file in report["files"].items():
        assert Path(file).is_relative_to(venv), f"{module} imported from {file}, not the venv"

    # The entry point works; the cloud's command is not there.
    agent_help = subprocess.run(
        [str(venv / "bin" / "zodiac-agent"), "--help"],
        capture_output=True, text=True, timeout=120, cwd=workdir, env=env,
    )  # fmt: skip
    assert agent_help.returncode == 0, agent_help.stderr
    assert "usage: zodiac-agent" in agent_help.stdout
    assert not (venv / "bin" / "zodiac-cloud").exists()
