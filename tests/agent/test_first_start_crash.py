"""Killing the agent during its very first start never leaves a state it refuses to start from.

A real ``zodiac-agent run`` process with local rule and fact files is SIGKILLed at random points
of its first start, 28 times: half at a random time after launch, a quarter right after the
temporary file the state is built in appears, a quarter right after the state file itself
appears (waiting for the file, not guessing a delay, so that every stage is reached however fast
or slow the machine is). Each time the next start must open the
state (no "not a zodiac-edge agent state"), hold exactly the configured local rules and facts,
and leave no temporary file behind; and a local rules file that was broken at the first start
is applied at the first start after it is fixed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.engine.errors import ParseError
from agent.service import Agent
from tests.support.agent_harness import REPO, Cloud, agent_command, write_config
from tests.support.broker import Broker

TRIALS = 28  # 7 of each kind of kill (see the module docstring)
LOCAL_RULES = "l1: <Warm>(X) :- <temp>(X, T) and COMP(T, >, 20) .\nl2: <Hot>(X) :- <Warm>(X) .\n"
LOCAL_FACTS = "<t1> <temp> 25 .\n<t2> <temp> 12 .\n"


def write_local_files(directory: Path) -> str:
    (directory / "local.rules").write_text(LOCAL_RULES)
    (directory / "local.nt").write_text(LOCAL_FACTS)
    return 'rules = ["local.rules"]\nfacts = ["local.nt"]'


def state_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(("t1.db", ".t1.db"))]


def temporary_or_state_file(directory: Path) -> bool:
    return bool(state_files(directory))


def final_state_file(directory: Path) -> bool:
    return (directory / "t1.db").exists()


def kill_during_first_start(
    config: Path, rng: random.Random, wait_for: Callable[[Path], bool] | None
) -> str:
    """Start the agent and SIGKILL it, after a random delay or just after ``wait_for`` holds.

    Returns where the kill landed (for the failure message).
    """
    directory = config.parent
    process = subprocess.Popen(
        agent_command("run", "--config", str(config)),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        if wait_for is not None:
            deadline = time.monotonic() + 30
            while not wait_for(directory) and time.monotonic() < deadline:
                time.sleep(0.0005)
            delay = rng.uniform(0, 0.03)
            time.sleep(delay)
            where = f"{delay:.4f} s after {wait_for.__name__} held"
        else:
            delay = rng.uniform(0.02, 1.2)
            time.sleep(delay)
            where = f"{delay:.3f} s after launch"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    return where


def test_a_first_start_killed_anywhere_starts_again(tmp_path, broker: Broker):
    rng = random.Random(20261123)
    cloud = Cloud(tmp_path / "cloud")
    reached = {"nothing": 0, "temporary file": 0, "state file": 0}
    for trial in range(TRIALS):
        directory = tmp_path / f"trial{trial}"
        reasoning = write_local_files(directory) if directory.mkdir() is None else ""
        config = write_config(directory, broker, cloud.keys, reasoning=reasoning)
        wait_for = (None, temporary_or_state_file, None, final_state_file)[trial % 4]
        where = kill_during_first_start(config, rng, wait_for)
        names = {p.name for p in state_files(directory)}
        if "t1.db" in names:
            reached["state file"] += 1
        elif names:
            reached["temporary file"] += 1
        else:
            reached["nothing"] += 1
        agent = Agent(AgentConfig.load(config))  # the next start
        try:
            assert sorted(agent.reasoner.rules) == ["l1", "l2"], where
            assert agent.reasoner.query("<Hot>(X)") == [{"X": "t1"}], where
            assert sorted(agent.state.facts_of_source("local")) == [
                ("temp", "t1", 25),
                ("temp", "t2", 12),
            ], where
        finally:
            agent.close()
        assert not [p for p in directory.iterdir() if ".creating-" in p.name], where
    # The kills landed before, during and after the creation of the state file.
    assert reached["state file"] >= 5 and reached["temporary file"] >= 1, reached


def test_local_rules_fixed_after_a_failed_first_start_are_applied(tmp_path, broker: Broker):
    cloud = Cloud(tmp_path / "cloud")
    directory = tmp_path / "agent"
    directory.mkdir()
    reasoning = write_local_files(directory)
    (directory / "local.rules").write_text("l1: <Warm>(X) :- <temp>(X, T) and and .\n")
    config = write_config(directory, broker, cloud.keys, reasoning=reasoning)
    with pytest.raises(ParseError, match="local.rules:1"):
        Agent(AgentConfig.load(config))
    (directory / "local.rules").write_text(LOCAL_RULES)
    agent = Agent(AgentConfig.load(config))
    assert sorted(agent.reasoner.rules) == ["l1", "l2"]
    agent.close()
    # Editing the file later changes the state at the next start: l2 removed, l3 added.
    (directory / "local.rules").write_text(
        LOCAL_RULES.splitlines()[0] + "\nl3: <Cold>(X) :- <temp>(X, T) and COMP(T, <, 15) .\n"
    )
    agent = Agent(AgentConfig.load(config))
    assert sorted(agent.reasoner.rules) == ["l1", "l3"]
    assert agent.reasoner.query("<Cold>(X)") == [{"X": "t2"}]
    agent.close()
