"""``zodiac-agent init``: the configuration it writes passes ``status``'s checks, and ``run``
starts with it against a real Mosquitto (retained status online, then healthy); it never
overwrites; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent.config import AgentConfig
from tests.support.agent_harness import REPO, AgentProcess, StatusWatcher
from tests.support.broker import TestClient

pytestmark = pytest.mark.process


def run(*command, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


AGENT = [sys.executable, "-m", "agent.cli"]


@pytest.fixture
def public_key(tmp_path):
    keys = tmp_path / "cloud"
    made = run(sys.executable, "-m", "cloud.zodiac_cloud_cli", "keys", "generate", "cloud",
               "--dir", keys)  # fmt: skip
    assert made.returncode == 0, made.stderr
    return keys / "cloud.pub"


def test_init_writes_a_configuration_the_agent_runs_with(tmp_path, make_broker, public_key):
    broker = make_broker()
    folder = tmp_path / "agent-t1"
    init = [*AGENT, "init", "--farm", "farm1", "--device", "t1", "--broker",
            f"{broker.host}:{broker.port}", "--trust", public_key, "--dir", folder]  # fmt: skip
    result = run(*init)
    assert result.returncode == 0, result.stderr
    config = folder / "agent.toml"
    assert f"zodiac-agent run --config {config}" in result.stdout
    assert (folder / "state").is_dir()
    assert (folder / "keys" / "cloud.pub").read_bytes() == public_key.read_bytes()
    loaded = AgentConfig.load(config)
    assert (loaded.farm, loaded.device, loaded.broker.port) == ("farm1", "t1", broker.port)
    assert loaded.file_problems() == []

    # Before the first run: no configuration problem (not exit 2), only no state yet.
    before = run(*AGENT, "status", "--config", config)
    assert before.returncode == 1 and "run the agent once" in before.stdout, before.stdout

    with AgentProcess(config) as agent, TestClient(broker, "watch") as client:
        StatusWatcher(client, "farm1", "t1").wait(lambda s: s.online)
        status = run(*AGENT, "status", "--config", config)
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["healthy"] is True
        assert agent.terminate() == 0

    text = config.read_text()
    again = run(*init)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "already exists" in again.stderr and config.read_text() == text


def test_init_with_a_password_file_names_the_device_as_user(tmp_path, public_key):
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    result = run(*AGENT, "init", "--farm", "farm1", "--device", "t2", "--broker", "mqtt.example",
                 "--trust", public_key, "--dir", tmp_path / "a",
                 "--password-file", secret)  # fmt: skip
    assert result.returncode == 0, result.stderr
    loaded = AgentConfig.load(tmp_path / "a" / "agent.toml")
    assert loaded.broker.username == "farm1/t2" and loaded.broker.resolve_password() == "s3cret"
    assert (loaded.broker.host, loaded.broker.port) == ("mqtt.example", 1883)


def test_lines_appended_to_the_written_configuration_are_reasoning_options(tmp_path, public_key):
    """docs/tutorial.md appends a device's neighbours, findings and triggers to the file init
    wrote: [reasoning] is its last table, so they land there (not in [log])."""
    result = run(*AGENT, "init", "--farm", "farm1", "--device", "t2", "--broker", "mqtt.example",
                 "--trust", public_key, "--dir", tmp_path / "a")  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = tmp_path / "a" / "agent.toml"
    with config.open("a") as handle:
        handle.write('neighbours = ["t1"]\nfindings = ["Broken"]\n'
                     '[reasoning.triggers]\n"Suspicion" = "anomaly/x"\n')  # fmt: skip
    loaded = AgentConfig.load(config)
    assert loaded.reasoning.neighbours == ["t1"] and loaded.reasoning.findings == ["Broken"]
    assert loaded.reasoning.triggers == {"Suspicion": "anomaly/x"}
    assert loaded.file_problems() == []


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"--device": "t/1"}, "--device"),
        ({"--farm": "all farms"}, "--farm"),
        ({"--broker": "host:port"}, "--broker"),
        ({"--trust": "PRIVATE"}, "not a PEM public key"),
        ({"--trust": "none.pub"}, "none.pub"),
    ],
)
def test_init_refuses_bad_input_in_one_line(tmp_path, public_key, change, names):
    options = {"--farm": "farm1", "--device": "t1", "--broker": "127.0.0.1:1883",
               "--trust": str(public_key), "--dir": str(tmp_path / "a")} | change  # fmt: skip
    if options["--trust"] == "PRIVATE":
        options["--trust"] = str(public_key.with_suffix(".key"))
    argv = [x for option, value in options.items() for x in (option, value)]
    result = run(*AGENT, "init", *argv)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and names in result.stderr, result.stderr
    assert not (tmp_path / "a").exists()
