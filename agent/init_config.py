"""``zodiac-agent init``: a working configuration and its folders for one device.

    zodiac-agent init --farm north-sea-1 --device turbine-07 --broker mqtt.example:1883 \\
        --trust cloud.pub [--dir agent-turbine-07] [--password-file secret]

writes ``DIR/agent.toml`` (the options of ``agent.example.toml`` that a device must set; the
others keep their defaults, explained there), ``DIR/state/`` (the database), ``DIR/keys/`` with
a copy of the trusted public key (its file name is the key id bundles name), and checks the
result as ``zodiac-agent run`` would before it says so. Nothing is overwritten: a second
``init`` of the same folder is refused, so an edited configuration is never lost.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent.config import AgentConfig, ConfigError, _check_device_id, _check_id

__all__ = ["InitResult", "write_agent_folder"]

TEMPLATE = """\
# zodiac-edge agent configuration of {device} (farm {farm}), written by zodiac-agent init.
# Every option, with what it does, is in agent.example.toml; relative paths are resolved
# against the folder of this file. Start the agent with:
#   zodiac-agent run --config {config}

device = {device_q}
farm = {farm_q}
# The state (rules, facts, applied bundle versions, derived facts), in its own folder.
database = "state/agent.db"

[broker]
host = {host_q}
port = {port}
{auth}
[keys]
# One <key id>.pub per cloud signing key this device trusts.
trusted_keys = "keys"

[log]
# "json" for journald and log shippers, "text" for a terminal.
format = "json"

# Last, so that lines appended to this file are options of [reasoning] (its neighbours,
# telemetry_predicates, findings, resolved; then a [reasoning.triggers] table): see
# agent.example.toml and docs/tutorial.md.
[reasoning]
# Local rule and fact files of this device (the cloud's bundles need none).
rules = []
facts = []
"""


@dataclass(frozen=True)
class InitResult:
    config: Path
    key_id: str
    key_path: Path


def parse_broker(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``HOST``: port 1883) -> (host, port); ValueError saying what is wrong."""
    host, colon, port_text = text.rpartition(":")
    if not colon:
        host, port_text = text, "1883"
    host = host.strip("[]")  # ([::1]:1883)
    if not host:
        raise ValueError(f"--broker {text!r}: expected HOST:PORT")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"--broker {text!r}: the port {port_text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"--broker {text!r}: the port must be 1 to 65535")
    return host, port


def write_agent_folder(
    directory: Path,
    *,
    farm: str,
    device: str,
    broker: str,
    trust: Path,
    username: str | None = None,
    password_file: Path | None = None,
) -> InitResult:
    """Write the folder (see the module docstring); ConfigError (one line) on bad input or an
    existing configuration, before anything is written."""
    from agent.engine.errors import ZodiacError
    from agent.protocol.keys import _check_key_id, load_public_key

    checks = (("--farm", farm, _check_id), ("--device", device, _check_device_id))
    for option, value, check in checks:
        try:
            check(value)
        except ValueError as error:
            raise ConfigError(f"{option}: {error}") from None
    try:
        host, port = parse_broker(broker)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    try:
        key_id = _check_key_id(trust.name.removesuffix(".pub"))
    except ValueError as error:
        raise ConfigError(f"--trust {trust}: {error}") from None
    try:
        load_public_key(trust)
    except ZodiacError as error:
        raise ConfigError(f"--trust: {error} (give the cloud's NAME.pub)") from None
    if password_file is not None:
        password_file = password_file.expanduser().resolve()
        if not password_file.is_file():
            raise ConfigError(f"--password-file {password_file}: no such file")
        username = username or f"{farm}/{device}"
    config = directory / "agent.toml"
    if config.exists() or config.is_symlink():
        raise ConfigError(f"{config} already exists: not overwritten")
    key_path = directory / "keys" / f"{key_id}.pub"
    if key_path.exists() and key_path.read_bytes() != trust.read_bytes():
        raise ConfigError(f"{key_path} already exists (another key): not overwritten")

    auth = ""
    if username:
        auth += f"username = {json.dumps(username)}\n"
    if password_file is not None:
        auth += f"password_file = {json.dumps(str(password_file))}\n"
    text = TEMPLATE.format(
        device=device,
        farm=farm,
        config=config,
        device_q=json.dumps(device),
        farm_q=json.dumps(farm),
        host_q=json.dumps(host),
        port=port,
        auth=auth,
    )
    try:
        for folder in (directory, directory / "state", directory / "keys"):
            folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trust, key_path)
        with open(config, "x", encoding="utf-8") as handle:  # (x: never over a file)
            handle.write(text)
    except OSError as error:
        raise ConfigError(f"{directory}: cannot write ({error.strerror or error})") from None
    os.chmod(directory / "state", 0o700)  # (the state holds the device's facts)
    problems = AgentConfig.load(config).file_problems()
    if problems:  # (a bug here, not the operator's: say it rather than leave a bad config)
        raise ConfigError("; ".join(problems))
    return InitResult(config, key_id, key_path)
