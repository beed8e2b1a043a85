"""docs/readings.md shows the messages as the agent validates them: its examples are valid
messages, its JSON Schemas are exactly what ``zodiac-agent schema`` prints, and its topics are
those the agent's configuration gives."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.protocol.messages import DeviceStatus, Telemetry
from agent.protocol.schema import MESSAGES, schema_text

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "readings.md"
BLOCK = re.compile(r"^```json (example|schema)=(\w+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
MODELS = {"readings": Telemetry, "status": DeviceStatus}


def blocks(kind: str) -> dict[str, str]:
    found = {name: text for what, name, text in BLOCK.findall(DOC.read_text()) if what == kind}
    assert set(found) == set(MODELS), f"{DOC.name} {kind} blocks: {sorted(found)}"
    return found


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_docs_examples_are_valid_messages(name: str) -> None:
    message = MODELS[name].model_validate(json.loads(blocks("example")[name]))
    assert message.device == "turbine-07"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_docs_schema_is_the_models(name: str) -> None:
    assert blocks("schema")[name].strip() == schema_text(name)


@pytest.mark.process
def test_the_schema_command_prints_it() -> None:
    for name in ("readings", "status"):
        result = subprocess.run(
            [sys.executable, "-m", "agent.cli", "schema", name],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == blocks("schema")[name].strip()
        assert json.loads(result.stdout)["title"] == MODELS[name].__name__
    wrong = subprocess.run(
        [sys.executable, "-m", "agent.cli", "schema", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr


def test_the_schema_refuses_what_the_model_refuses() -> None:
    """The schema is no looser than the model where it matters to a controller's author."""
    schema = json.loads(schema_text("readings"))
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"device", "farm", "readings", "sent_at"}
    assert schema["properties"]["readings"]["items"]["minItems"] == 2
    assert re.fullmatch(schema["properties"]["device"]["pattern"], "turbine-07")
    assert not re.fullmatch(schema["properties"]["device"]["pattern"], "a/b")


def test_the_docs_topics_are_the_agents() -> None:
    from agent.config import TOPIC_KINDS

    text = DOC.read_text()
    for kind, (_, topic, _) in MESSAGES.items():
        assert kind in TOPIC_KINDS and topic == f"zodiac/<farm>/<device>/{kind}"
        assert f"| `{kind}` |" in text
