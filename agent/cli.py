"""``zodiac-agent``: the edge agent's command line.

    zodiac-agent run    --config agent.toml           # the service (MQTT, until SIGTERM)
    zodiac-agent status --config agent.toml           # state summary; exit 0 when healthy
    zodiac-agent query  --config agent.toml PATTERN   # answers from the saved state
    zodiac-agent apply  --config agent.toml BUNDLE    # apply a signed bundle file offline
    zodiac-agent init   --farm F --device D --broker HOST:PORT --trust cloud.pub [--dir DIR]
    zodiac-agent inspect --config agent.toml [--format json|csv] [--table NAME]
    zodiac-agent backup --config agent.toml OUT       # online copy of the state, never overwrites
    zodiac-agent schema readings                      # JSON Schema of a message (no config)

``status`` and ``query`` read the database while a running agent writes it (SQLite WAL allows
that); they never create a database, and neither do ``inspect`` (read-only: tables and row
counts, rules, streams) and ``backup`` (SQLite's online backup), for operators
(agent/state/inspection.py). ``apply`` runs exactly the checks of a bundle received over
MQTT (size, signature, schema, expiry, version sequence, rules) and commits in one transaction.
Exit codes: 0 success, 1 refused or unhealthy, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from agent import VersionAction
from agent.config import AgentConfig, ConfigError
from agent.engine.errors import ZodiacError, read_bytes
from agent.state.schema import StatePathError

log = logging.getLogger("zodiac")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {})
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        return f"{stamp} {record.levelname:<7} {record.getMessage()} {extra}".rstrip()


def setup_logging(config: AgentConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if config.log.format == "json" else TextFormatter())
    root = logging.getLogger("zodiac")
    root.handlers[:] = [handler]
    root.setLevel(config.log.level)
    root.propagate = False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zodiac-agent",
        description="The zodiac-edge agent a turbine runs: signed rule bundles over MQTT, "
        "incremental reasoning, state in SQLite.",
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument(
            "--config",
            required=True,
            type=Path,
            help="the agent's TOML configuration file (see agent.example.toml)",
        )
        return sub

    command("run", "run the agent service until SIGTERM or Ctrl-C")
    command("status", "print the agent's state summary as JSON; exit 1 if it is unusable")
    query = command("query", "answer one atom pattern from the saved state, as JSON lines")
    pattern = query.add_mutually_exclusive_group(required=True)
    pattern.add_argument(
        "pattern", nargs="?", help="an atom such as '<p11>(X, <windTurbine3>)' or '<C>(X)'"
    )
    pattern.add_argument(  # (as zodiac-edge query takes it)
        "--pattern", dest="pattern_option", metavar="PATTERN", help="the same, as an option"
    )
    apply = command("apply", "apply a signed bundle file with the same checks as over MQTT")
    apply.add_argument("bundle", type=Path, help="a signed bundle envelope (msgpack) file")
    add_init_command(commands)
    inspect = command(
        "inspect", "list the state's tables (row counts), rules and streams; read-only"
    )
    inspect.add_argument(
        "--format", choices=("json", "csv"), default="json", help="output format (default json)"
    )
    inspect.add_argument(
        "--table",
        metavar="NAME",
        help="one section (tables, rules, streams) or one table of the file (its rows); "
        "CSV prints one section, 'tables' by default",
    )
    backup = command(
        "backup", "copy the state (while the agent runs) to OUT with SQLite's online backup"
    )
    backup.add_argument("out", type=Path, metavar="OUT", help="the copy's path (must not exist)")
    _add_schema_command(commands)
    return parser


def add_init_command(commands) -> None:
    """``init``: no ``--config`` (it writes one)."""
    description = (
        "Write a working configuration for one device: DIR/agent.toml, DIR/state/ (the "
        "database) and DIR/keys/ with a copy of the trusted public key. Nothing is "
        "overwritten: an existing DIR/agent.toml is refused (exit 2). Then: "
        "zodiac-agent run --config DIR/agent.toml"
    )
    init = commands.add_parser(
        "init", help="write agent.toml and its folders for a device", description=description
    )
    init.add_argument("--farm", required=True, help="the farm id (an MQTT topic level)")
    init.add_argument("--device", required=True, help="this device's id (an MQTT topic level)")
    init.add_argument(
        "--broker", required=True, metavar="HOST:PORT", help="the MQTT broker (port 1883 if none)"
    )
    init.add_argument(
        "--trust",
        required=True,
        type=Path,
        metavar="PUBKEY_FILE",
        help="the cloud's public key (NAME.pub, from zodiac-cloud keys generate)",
    )
    init.add_argument(
        "--dir", type=Path, default=None, metavar="DIR", help="where to write (default: ./agent-D)"
    )
    init.add_argument(
        "--password-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the broker password's file (its first line), referred to by absolute path; the "
        "username is then FARM/DEVICE unless --username says otherwise",
    )
    init.add_argument("--username", default=None, help="the broker username")


def _add_schema_command(commands) -> None:
    """``schema KIND``: needs no configuration (a controller's author has none)."""
    from agent.protocol.schema import MESSAGES

    help = "print the JSON Schema of a message on the farm's topics (see docs/readings.md)"
    sub = commands.add_parser("schema", help=help, description=help)
    sub.add_argument("kind", choices=sorted(MESSAGES), help="the message")


def cmd_schema(args: argparse.Namespace) -> int:
    from agent.protocol.schema import schema_text

    print(schema_text(args.kind))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "init":
        return cmd_init(args)
    if args.command == "schema":
        try:
            return cmd_schema(args)
        except BrokenPipeError:  # (``schema readings | head``)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    if args.command == "query":
        args.pattern = args.pattern or args.pattern_option
    try:
        config = AgentConfig.load(args.config)
    except ConfigError as error:
        print(f"zodiac-agent: {error}", file=sys.stderr)
        return 2
    setup_logging(config)
    try:
        return COMMANDS[args.command](config, args)
    except ConfigError as error:  # (a file the configuration names, found missing on use)
        print(f"zodiac-agent: {error}", file=sys.stderr)
        return 2
    except StatePathError as error:  # (the configured database path: a deployment error)
        print(f"zodiac-agent: {error}", file=sys.stderr)
        return 2
    except ZodiacError as error:
        print(f"zodiac-agent: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # (``status | head``: the reader went away; stop as Unix tools do)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (for the final flush)
        return 0


def cmd_run(config: AgentConfig, args: argparse.Namespace) -> int:
    from agent.service import Agent
    from agent.sync import AgentService

    config.check_files()
    agent = Agent(config)
    service = AgentService(agent)
    service.run()
    if service.failure is not None:  # (stopped by itself: the state file went away)
        print(f"zodiac-agent: {service.failure}", file=sys.stderr)
        return 1
    return 0


def _open_state(config: AgentConfig):
    from agent.state.agent_state import AgentState

    return AgentState(
        config.database,
        synchronous=config.synchronous,
        modules=config.reasoning.modules,
        decompositions=config.reasoning.decompositions,
        create=False,
    )


def cmd_status(config: AgentConfig, args: argparse.Namespace) -> int:
    from agent.state.agent_state import AgentState, StateError

    problems = config.file_problems()
    if problems:
        print(json.dumps({"healthy": False, "error": "configuration", "problems": problems}))
        for problem in problems:
            print(f"zodiac-agent: {problem}", file=sys.stderr)
        return 2
    try:
        state = AgentState(config.database, create=False, load=False)
    except StateError as error:
        print(json.dumps({"healthy": False, "error": str(error)}))
        return 1
    with state:
        problems = state.check_integrity()
        if problems:
            print(
                json.dumps({"healthy": False, "error": "damaged agent state", "problems": problems})
            )
            return 1
        summary = state.summary()
    verdicts = running_verdicts(config)
    print(
        json.dumps(
            {
                "healthy": True,
                "device": config.device,
                "farm": config.farm,
                **summary,
                **({"running": verdicts} if verdicts is not None else {}),
            },
            indent=2,
        )
    )
    if verdicts is not None and verdicts.get("answered") and not verdicts["ready"]:
        return 1
    return 0


def running_verdicts(config: AgentConfig) -> dict | None:
    """The running agent's health verdicts, asked on its ``[metrics] listen`` port (None:
    not configured): ``alive``, ``ready`` and their reasons, or ``answered: false`` when no
    agent answers there (it is not running)."""
    import urllib.error
    import urllib.request

    address = config.metrics.address()
    if address is None:
        return None
    host, port = address
    if port == 0:
        return {"answered": False, "error": "metrics.listen has port 0: see the agent's log"}
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    found: dict = {"answered": True, "url": base}
    reasons: list[str] = []
    for name, path in (("alive", "/healthz"), ("ready", "/readyz")):
        try:
            with urllib.request.urlopen(base + path, timeout=3) as response:
                verdict = json.loads(response.read())
        except urllib.error.HTTPError as error:  # (503: a verdict too)
            verdict = json.loads(error.read() or b"{}")
        except (OSError, ValueError) as error:
            return {"answered": False, "url": base, "error": str(error)}
        found[name] = bool(verdict.get("ok"))
        reasons += verdict.get("reasons", [])
    found["reasons"] = reasons
    return found


def cmd_query(config: AgentConfig, args: argparse.Namespace) -> int:
    with _open_state(config) as state:
        for answer in state.reasoner.query(args.pattern):
            print(json.dumps(answer, default=str))
    return 0


def cmd_apply(config: AgentConfig, args: argparse.Namespace) -> int:
    from agent.service import Agent

    try:
        payload = read_bytes(args.bundle, "bundle file")
    except ZodiacError as error:
        raise ConfigError(str(error)) from None  # (a usage error: exit 2)
    config.check_files(broker=False)
    agent = Agent(config)
    try:
        outcome = agent.handle_bundle(payload)
    finally:
        agent.close()
    print(json.dumps(outcome.as_log(), default=str))
    return 0 if outcome.status in ("applied", "duplicate") else 1


def cmd_init(args: argparse.Namespace) -> int:
    from agent.init_config import write_agent_folder
    from agent.protocol.keys import fingerprint, load_public_key

    directory = args.dir if args.dir is not None else Path(f"agent-{args.device}")
    try:
        result = write_agent_folder(
            directory,
            farm=args.farm,
            device=args.device,
            broker=args.broker,
            trust=args.trust,
            username=args.username,
            password_file=args.password_file,
        )
    except ConfigError as error:
        print(f"zodiac-agent: {error}", file=sys.stderr)
        return 2
    print(f"wrote {result.config}, {directory / 'state'}/ and {result.key_path}")
    print(f"trusts key {result.key_id}: {fingerprint(load_public_key(result.key_path))}")
    print(f"start it with: zodiac-agent run --config {result.config}")
    return 0


def cmd_inspect(config: AgentConfig, args: argparse.Namespace) -> int:
    from agent.state.inspection import UsageError, inspect

    try:
        sys.stdout.write(inspect(config.database, fmt=args.format, table=args.table))
    except UsageError as error:
        raise ConfigError(str(error)) from None  # (a usage error: exit 2)
    return 0


def cmd_backup(config: AgentConfig, args: argparse.Namespace) -> int:
    from agent.state.inspection import UsageError, backup

    try:
        print(json.dumps(backup(config.database, args.out), indent=2))
    except UsageError as error:
        raise ConfigError(str(error)) from None  # (a usage error: exit 2)
    return 0


COMMANDS = {
    "run": cmd_run,
    "status": cmd_status,
    "query": cmd_query,
    "apply": cmd_apply,
    "inspect": cmd_inspect,
    "backup": cmd_backup,
}


if __name__ == "__main__":
    sys.exit(main())
