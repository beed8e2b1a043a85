"""The operator's commands, as real processes on real files (and a real Mosquitto and agent
where the command talks to one): ``zodiac-cloud keys generate``, ``zodiac-cloud bundle`` then
``zodiac-agent apply`` and ``query``, and ``zodiac-cloud publish`` waiting for each device's
answer (applied, refused with the reason, no answer within ``--timeout``)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time

import pytest

from agent.protocol.keys import fingerprint, load_private_key, load_public_key
from tests.support.agent_harness import REPO, AgentProcess, StatusWatcher, write_config
from tests.support.broker import TestClient

pytestmark = pytest.mark.process

CLOUD = [sys.executable, "-m", "cloud.zodiac_cloud_cli"]
AGENT = [sys.executable, "-m", "agent.cli"]
RULES = "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 50) .\n"
FACTS = '<t1> <temp> "70"^^<http://www.w3.org/2001/XMLSchema#integer> .\n'


def test_every_cloud_command_and_option_has_help_text():
    from cloud.zodiac_cloud_cli import build_parser
    from tests.engine.test_cli import check_help_texts

    parser = build_parser()
    check_help_texts(parser, {"materialise", "publish", "serve", "keys", "bundle", "events"})
    commands = next(a for a in parser._actions if a.dest == "command")
    generate = commands.choices["keys"]._actions[-1].choices["generate"]
    assert generate.description and all(a.help for a in generate._actions)


def run(*command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def generate(directory, name: str = "cloud") -> subprocess.CompletedProcess:
    return run(*CLOUD, "keys", "generate", name, "--dir", directory)


def test_keys_generate_writes_the_pair_and_never_overwrites(tmp_path):
    result = generate(tmp_path / "keys")
    assert result.returncode == 0, result.stderr
    private, public = tmp_path / "keys" / "cloud.key", tmp_path / "keys" / "cloud.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    # The pair the publisher and the agents read, and the fingerprint of its public key.
    key = load_private_key(private)
    assert fingerprint(key.public_key()) == fingerprint(load_public_key(public))
    assert f"fingerprint  {fingerprint(load_public_key(public))}" in result.stdout
    assert str(private) in result.stdout and str(public) in result.stdout

    before = private.read_bytes(), public.read_bytes()
    again = generate(tmp_path / "keys")
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "already exists" in again.stderr, again.stderr
    assert (private.read_bytes(), public.read_bytes()) == before
    public.unlink()  # (the private key alone is not overwritten either)
    assert generate(tmp_path / "keys").returncode == 2
    assert private.read_bytes() == before[0]

    bad = generate(tmp_path / "keys", "../escape")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


def agent_folder(tmp_path, public):
    """An agent's configuration trusting ``public`` (no broker needed for apply/query)."""
    folder = tmp_path / "agent"
    (folder / "keys").mkdir(parents=True)
    (folder / "keys" / public.name).write_bytes(public.read_bytes())
    config = folder / "agent.toml"
    config.write_text(
        'device = "t1"\nfarm = "farm1"\ndatabase = "t1.db"\n[keys]\ntrusted_keys = "keys"\n'
    )
    return config


def test_a_bundle_file_is_applied_by_zodiac_agent_apply(tmp_path):
    assert generate(tmp_path / "k").returncode == 0
    config = agent_folder(tmp_path, tmp_path / "k" / "cloud.pub")
    (tmp_path / "base.rules").write_text(RULES)
    (tmp_path / "t1.nt").write_text(FACTS)
    out = tmp_path / "t1.bundle"
    bundle = [
        *CLOUD, "bundle", "--key", tmp_path / "k" / "cloud.key", "--farm", "farm1",
        "--device", "t1", "--stream", "base", "--rules", tmp_path / "base.rules",
        "--facts", tmp_path / "t1.nt", "--state", tmp_path / "cloud.db", "-o", out,
    ]  # fmt: skip
    made = run(*bundle)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"wrote {out}: t1 base version 1 (full state, 1 rules, 1 facts")

    applied = run(*AGENT, "apply", "--config", config, out)
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["status"] == "applied"
    answers = run(*AGENT, "query", "--config", config, "<Hot>(X)")
    assert answers.returncode == 0, answers.stderr
    assert [json.loads(line) for line in answers.stdout.splitlines()] == [{"X": "t1"}]

    # The next file continues the ledger's sequence, and replaces the stream (a full state):
    # a rule whose text changed is replaced (the agent refused a full state holding a new text
    # under a label it held: "label hot is already used by a different rule").
    (tmp_path / "base.rules").write_text(RULES.replace("50", "80"))
    again = run(*bundle)
    assert again.returncode == 0 and "version 2" in again.stdout, again.stderr
    assert run(*AGENT, "apply", "--config", config, out).returncode == 0
    assert run(*AGENT, "query", "--config", config, "<Hot>(X)").stdout == ""


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"--rules": "none.rules"}, "none.rules"),
        ({"--key": "none.key"}, "none.key"),
        ({"--device": "t/1"}, "--device"),
        ({"-o": "no-dir/t1.bundle"}, "no-dir"),
    ],
)
def test_bundle_refuses_bad_input_in_one_line(tmp_path, change, names):
    assert generate(tmp_path).returncode == 0
    (tmp_path / "base.rules").write_text(RULES)
    options = {
        "--key": "cloud.key", "--farm": "farm1", "--device": "t1",
        "--rules": "base.rules", "--state": "cloud.db", "-o": "t1.bundle",
    } | change  # fmt: skip
    argv = [x for option, value in options.items() for x in (option, value)]
    argv = [str(tmp_path / a) if a.endswith((".key", ".rules", ".db", ".bundle")) else a
            for a in argv]  # fmt: skip
    result = run(*CLOUD, "bundle", *argv)
    assert result.returncode != 0 and names in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "t1.bundle").exists()


def publish(tmp_path, broker, key, *args: str, timeout: float = 60):
    rules = tmp_path / "streams"
    rules.mkdir(exist_ok=True)
    (rules / "base.rules").write_text(RULES)
    return run(
        *CLOUD, "publish", "--farm", "farm1", "--rules-dir", rules, "--key", key,
        "--broker", f"{broker.host}:{broker.port}", "--state", tmp_path / "cloud.db",
        *args, timeout=timeout,
    )  # fmt: skip


def running_agent(tmp_path, broker, trusted, device: str = "t1"):
    config = write_config(tmp_path / device, broker, trusted, device=device)
    return AgentProcess(config)


def test_publish_waits_for_the_device_to_apply(tmp_path, make_broker):
    broker = make_broker()
    assert generate(tmp_path / "k").returncode == 0
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "cloud.pub").write_bytes((tmp_path / "k" / "cloud.pub").read_bytes())
    with running_agent(tmp_path, broker, trusted), TestClient(broker, "watch") as client:
        StatusWatcher(client, "farm1", "t1").wait(lambda s: s.online)
        result = publish(tmp_path, broker, tmp_path / "k" / "cloud.key", "--devices", "t1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "t1: base version 1 (1 rules, 0 facts)",
        "t1: applied base version 1",
    ]


def test_publish_names_the_device_that_refused_and_why(tmp_path, make_broker):
    """(``publish`` printed success and exited 0 for a bundle signed by an untrusted key.)"""
    broker = make_broker()
    assert generate(tmp_path / "trusted").returncode == 0
    (tmp_path / "trusted" / "cloud.key").unlink()  # (the device trusts cloud.pub only)
    assert generate(tmp_path / "other", "rogue").returncode == 0
    with running_agent(tmp_path, broker, tmp_path / "trusted"), TestClient(broker, "w") as client:
        StatusWatcher(client, "farm1", "t1").wait(lambda s: s.online)
        result = publish(tmp_path, broker, tmp_path / "other" / "rogue.key", "--devices", "t1")
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stdout.splitlines()[-1]
    assert last.startswith("t1: refused base: unknown_key: "), last
    assert "signed with unknown key 'rogue'" in last


def test_publish_reports_a_device_that_does_not_answer(tmp_path, make_broker):
    broker = make_broker()
    assert generate(tmp_path / "k").returncode == 0
    started = time.monotonic()
    result = publish(
        tmp_path, broker, tmp_path / "k" / "cloud.key", "--devices", "t9", "--timeout", "2"
    )
    took = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("t9: no answer"), result.stdout
    assert 2 <= took < 20, took
    # --no-wait: sent, exit 0, as before.
    quick = publish(tmp_path, broker, tmp_path / "k" / "cloud.key", "--devices", "t8", "--no-wait")
    assert quick.returncode == 0, quick.stderr
    assert quick.stdout.splitlines() == ["t8: base version 1 (1 rules, 0 facts)"]
