"""The edge agent's configuration: one TOML file per device, validated before anything starts.

Why a strict model: an agent on a turbine runs unattended for months, so a typo must stop it at
start-up with a message naming the file and the field — not surface weeks later as a silently
ignored option (unknown keys are therefore errors) or as an MQTT topic that no ACL matches (ids
are checked because they become topic levels).

Relative paths in the file are resolved against the file's own directory, not the working
directory, so a config means the same thing whether the agent is started by systemd, Docker or
by hand. A relative ``database`` default (``zodiac-agent.db``) lands next to the config file too.

See ``agent.example.toml`` at the repository root for every option with its explanation.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = [
    "AgentConfig",
    "BrokerConfig",
    "BudgetConfig",
    "ConfigError",
    "KeysConfig",
    "EventsConfig",
    "WindowsConfig",
    "LimitsConfig",
    "LogConfig",
    "MetricsConfig",
    "ReasoningConfig",
    "TelemetryConfig",
    "TopicKind",
]

TopicKind = Literal["bundle", "status", "request", "telemetry", "readings", "events"]
TOPIC_KINDS: tuple[str, ...] = ("bundle", "status", "request", "telemetry", "readings", "events")

# Topic levels must not contain MQTT wildcards or separators; this is stricter than MQTT needs,
# but also safe as a file name and in log lines.
_ID = re.compile(r"[A-Za-z0-9_-]+")
# `zodiac/<farm>/all/bundle` is the farm-wide topic: a device called "all" would receive it as
# its own bundle topic and its status would be indistinguishable from a farm-wide message.
_RESERVED_DEVICE_IDS = frozenset({"all"})


class ConfigError(ValueError):
    """The configuration file is missing, is not valid TOML, or does not validate.

    The message always names the file, and for validation errors each bad field as a dotted
    path (``broker.port``), so the operator can fix it without reading code.
    """


# ------------------------------------------------------------------------------ field types
def _check_id(value: str) -> str:
    if not _ID.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid id: use only letters, digits, '_' and '-' "
            "(it becomes an MQTT topic level)"
        )
    return value


def _check_device_id(value: str) -> str:
    _check_id(value)
    if value in _RESERVED_DEVICE_IDS:
        raise ValueError(f"{value!r} is reserved (zodiac/<farm>/all/... is the farm-wide topic)")
    return value


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    """Anchor a relative path at the config file's directory (when loading from a file)."""
    value = value.expanduser()
    base = (info.context or {}).get("base_dir")
    if base is not None and not value.is_absolute():
        value = Path(base) / value
    return value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


Id = Annotated[str, AfterValidator(_check_id)]
DeviceId = Annotated[str, AfterValidator(_check_device_id)]
ConfigPath = Annotated[Path, AfterValidator(_resolve_path)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
# Both accepted in any case ("normal", "debug"), stored upper-case.
Synchronous = Annotated[Literal["OFF", "NORMAL", "FULL", "EXTRA"], BeforeValidator(_upper)]
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(_upper)
]


class _Section(BaseModel):
    # extra="forbid": a misspelt option is an error, never silently ignored.
    # frozen: the running agent must not drift from the file it was started with.
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------- sections
class BrokerConfig(_Section):
    """``[broker]``: how to reach the MQTT broker (DESIGN.md section 4)."""

    host: NonEmptyStr = "127.0.0.1"
    port: int = Field(1883, ge=1, le=65535)
    username: str | None = None
    # repr=False: configs get logged; passwords must not be.
    password: str | None = Field(None, repr=False)
    password_file: ConfigPath | None = None
    tls: bool = False
    ca_file: ConfigPath | None = None
    cert_file: ConfigPath | None = None
    key_file: ConfigPath | None = None
    tls_insecure: bool = False
    keepalive: int = Field(30, ge=0, le=65535)
    # MQTT v5 session expiry (seconds): how long the broker keeps our session and queues bundles
    # while the device is offline. 0 would drop queued bundles at every disconnect.
    session_expiry: int = Field(86400, ge=0, le=0xFFFFFFFF)
    reconnect_min_delay: float = Field(1.0, gt=0)
    reconnect_max_delay: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> BrokerConfig:
        if self.password is not None and self.password_file is not None:
            raise ValueError("give either password or password_file, not both")
        if (self.password is not None or self.password_file is not None) and not self.username:
            raise ValueError("a password needs a username")
        if self.reconnect_max_delay < self.reconnect_min_delay:
            raise ValueError("reconnect_max_delay must be >= reconnect_min_delay")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file (client certificate) go together")
        tls_options = [
            name
            for name in ("ca_file", "cert_file", "key_file", "tls_insecure")
            if getattr(self, name)
        ]
        if tls_options and not self.tls:
            # Almost certainly a forgotten `tls = true`: refuse rather than connect in clear.
            raise ValueError(f"{', '.join(tls_options)} given but tls = false")
        return self

    def resolve_password(self) -> str | None:
        """The password, read from ``password_file`` if that is how it was given.

        Read at connect time rather than at load time so that a rotated secret (a Docker or
        systemd credential file) is picked up on reconnect; only the first line counts, without
        its line ending.
        """
        if self.password_file is None:
            return self.password
        try:
            text = self.password_file.read_text(encoding="utf-8")
        except OSError as exc:
            message = f"cannot read broker.password_file {self.password_file}: {exc}"
            raise ConfigError(message) from exc
        lines = text.splitlines()
        return lines[0] if lines else ""


class KeysConfig(_Section):
    """``[keys]``: who may sign bundles, and how large a bundle may be before it is refused."""

    # A directory of `<key_id>.pub` Ed25519 public keys (PEM); a bundle signed by any other key
    # is refused.
    trusted_keys: ConfigPath
    # Limits checked *before* decoding: an edge device must not be exhausted by one payload.
    max_bundle_bytes: int = Field(1_000_000, gt=0)
    max_operations: int = Field(10_000, gt=0)


class ReasoningConfig(_Section):
    """``[reasoning]``: the local program and how the device asks for event-specific rules."""

    rules: list[ConfigPath] = []
    facts: list[ConfigPath] = []
    modules: bool = True
    # evaluate cyclic rules through hypertree decompositions where estimated cheaper
    decompositions: bool = True
    # trigger predicate IRI -> event name: when the trigger is derived, request that event's
    # rules from the cloud.
    triggers: dict[NonEmptyStr, NonEmptyStr] = {}
    # predicates whose derivation means the event is over: the requested rules are released.
    resolved: list[NonEmptyStr] = []
    # predicates whose derived facts the device reports in its status (e.g. a diagnosis).
    findings: list[NonEmptyStr] = []
    # the device's own readings, published on its telemetry topic for its neighbours.
    telemetry_predicates: list[NonEmptyStr] = []
    # device ids whose telemetry topics this agent subscribes to and ingests as facts.
    neighbours: list[DeviceId] = []

    @model_validator(mode="after")
    def _unique_neighbours(self) -> ReasoningConfig:
        duplicates = sorted({n for n in self.neighbours if self.neighbours.count(n) > 1})
        if duplicates:
            raise ValueError(f"neighbours listed twice: {', '.join(duplicates)}")
        return self


class TelemetryConfig(_Section):
    """``[telemetry]``: what the agent accepts from its neighbours' telemetry topics, and how
    much. A reading is kept only if its subject is the sending device (or one of its sensors,
    see ``owner_predicate``) and its predicate is accepted; anything else is dropped and
    counted in the status (``dropped``), never stored."""

    # Predicates accepted from neighbours; by default reasoning.telemetry_predicates (what the
    # devices of a farm publish is what they read from each other).
    accept_predicates: list[NonEmptyStr] | None = None
    # When set, a reading about x is also accepted from device d if the agent holds the fact
    # owner_predicate(d, x) (x is one of d's sensors, per the farm graph).
    owner_predicate: NonEmptyStr | None = None
    # Limits per message (payload bytes, readings) and per neighbour (messages per second,
    # with bursts of up to twice that); the device's own readings get the same size limits.
    max_message_bytes: int = Field(64_000, gt=0)
    max_readings: int = Field(1_000, gt=0)
    max_messages_per_second: float = Field(5.0, gt=0)
    # Time (seconds) a reading's or snapshot's time may be ahead of the agent's clock: later
    # than that it is dropped (it would hold back every correct reading until its time came).
    max_clock_skew: float = Field(300.0, gt=0)
    # A reading older than the one applied for its sensor by at most this (seconds) is taken as
    # a redelivery and dropped; older by more, the sender's clock was stepped back: applied.
    replay_window: float = Field(60.0, ge=0)


class BudgetConfig(_Section):
    """``[budget]``: what one change (a bundle, a batch of readings) may cost the device. A
    change over budget is stopped and refused (``budget_exceeded``, with the figures, in the
    status), the state stays exactly as before and the agent keeps running. The defaults fit
    a small controller; a gateway raises them.

    Derived facts are budgeted per stream (agent/budgets/stream_budgets.py): ``max_derived_facts``
    is what the rules of one stream (or the device's local rules) may hold, ``streams`` gives a
    stream (or ``local``) its own figure, and ``readings_headroom`` is how far beyond its
    limit the device's own changes (readings, neighbours' telemetry, local files) may still
    take any of them. Memory and time bound every change as a whole."""

    max_derived_facts: int = Field(1_000_000, gt=0)
    max_memory_mb: int = Field(512, gt=0)
    max_update_seconds: float = Field(60.0, gt=0)
    readings_headroom: float = Field(0.1, ge=0)
    streams: dict[str, Annotated[int, Field(gt=0)]] = {}

    def budget(self):
        """Memory and time, for every change (derived facts: ``stream_budgets``)."""
        from agent.engine.budget import Budget

        return Budget(
            max_memory_bytes=self.max_memory_mb * 1024 * 1024,
            max_seconds=self.max_update_seconds,
        )

    def stream_budgets(self):
        from agent.budgets.stream_budgets import StreamBudgets

        return StreamBudgets(
            max_derived_facts=self.max_derived_facts,
            streams=dict(self.streams),
            readings_headroom=self.readings_headroom,
        )


class LimitsConfig(_Section):
    """``[limits]``: how much the device keeps of what arrives, whoever sends it. Past a limit
    the new item is refused (a bundle: ``too_many_streams``) or dropped and counted in the
    status (``dropped``); what the device already holds is not touched. They keep the state and
    the status, which carries every stream's version and is sent after every bundle, small."""

    # Bundle streams with a version (a device's own and farm-wide ones). A released stream
    # keeps its place: its version sequence must go on.
    max_streams: int = Field(64, gt=0)
    # Sensors (predicate and subject) of the device's own readings; the value of a sensor
    # already known is always replaced.
    max_sensors: int = Field(10_000, gt=0)
    # Versions of each bundle stream's content kept for a signed revert (docs/operations.md,
    # "Reverting a stream"); each costs a copy of the stream's rules and facts. 0: none.
    stream_history: int = Field(3, ge=0)


class EventsConfig(_Section):
    """``[events]``: the watched patterns whose facts' changes the device publishes as events
    on ``zodiac/<farm>/<device>/events`` (docs/agent.md, "Events"), and the outbox's budget."""

    # Atom patterns as queries take them, e.g. "<SensorAnomalyWindTurbine>(X)".
    watch: list[NonEmptyStr] = []
    # Events kept while the broker has not acknowledged them; past it an event is counted
    # (status ``events.over_budget``) instead of kept.
    max_pending: int = Field(10_000, gt=0)

    @field_validator("watch")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        from agent.engine.errors import ParseError
        from agent.engine.program.parser import parse_atom

        for pattern in patterns:
            try:
                parse_atom(pattern)
            except ParseError as error:
                raise ValueError(f"not an atom pattern {pattern!r}: {error}") from None
        return patterns


class WindowsConfig(_Section):
    """``[windows]``: how the windows over readings (``@window`` in rule files and bundles,
    docs/agent.md "Windows") are kept."""

    # Seconds between two expiry batches: facts that left their window are deleted in one
    # change per tick (only when some did).
    tick: float = Field(1.0, gt=0, allow_inf_nan=False)
    # Facts per window relation; past it the oldest go first (counted in the status's
    # ``dropped`` as "windows: over the budget").
    max_facts: int = Field(50_000, gt=0)
def listen_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets, ``[::1]:9600``) as a host and a port; port 0
    takes a free port (the bound one is logged). Raises ValueError saying what is wrong."""
    import ipaddress

    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ValueError(f'{value!r} is not HOST:PORT (e.g. "127.0.0.1:9600")')
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port {port} of {value!r} is not in 0-65535")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare != "localhost":
        try:
            ipaddress.ip_address(bare)
        except ValueError:
            raise ValueError(
                f"host {host!r} of {value!r} is not an IP address or localhost"
            ) from None
    return bare, int(port)


def _check_listen(value: str | None) -> str | None:
    if value is not None:
        listen_address(value)
    return value


class MetricsConfig(_Section):
    """``[metrics]``: Prometheus metrics and the health endpoints (``/metrics``, ``/healthz``,
    ``/readyz``) on one HTTP port, off unless ``listen`` is given (docs/operations.md). Meant
    for a loopback address: the endpoints have no authentication; a collector on the device
    (or an SSH tunnel) scrapes them."""

    listen: Annotated[str | None, AfterValidator(_check_listen)] = None

    def address(self) -> tuple[str, int] | None:
        return listen_address(self.listen) if self.listen is not None else None


class LogConfig(_Section):
    """``[log]``: logging for journald / Docker (JSON lines by default, for log shippers)."""

    level: LogLevel = "INFO"
    format: Literal["json", "text"] = "json"


# ------------------------------------------------------------------------------ the config
class AgentConfig(_Section):
    """Everything one edge agent needs to know; build it with `AgentConfig.load`."""

    device: DeviceId
    farm: Id
    database: ConfigPath = Field(Path("zodiac-agent.db"), validate_default=True)
    # SQLite PRAGMA synchronous. FULL (with WAL) makes every committed bundle survive power loss,
    # which a turbine will see; NORMAL may lose the last transactions on power loss.
    synchronous: Synchronous = "FULL"
    broker: BrokerConfig = BrokerConfig()
    keys: KeysConfig
    reasoning: ReasoningConfig = ReasoningConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    budget: BudgetConfig = BudgetConfig()
    limits: LimitsConfig = LimitsConfig()
    events: EventsConfig = EventsConfig()
    windows: WindowsConfig = WindowsConfig()
    metrics: MetricsConfig = MetricsConfig()
    log: LogConfig = LogConfig()
    # The file this config was loaded from (set by `load`, for messages); not a TOML option.
    source: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _not_own_neighbour(self) -> AgentConfig:
        if self.device in self.reasoning.neighbours:
            raise ValueError(f"device {self.device!r} lists itself in reasoning.neighbours")
        return self

    @model_validator(mode="after")
    def _username_is_this_device(self) -> AgentConfig:
        """A username of the shipped broker's form ``<farm>/<device>`` (deploy/mosquitto) must
        name this device: its ACL gives a device exactly the topics of its username, so any
        other name would have every publish refused and no bundle delivered, silently."""
        username, own = self.broker.username, f"{self.farm}/{self.device}"
        if username and "/" in username and username != own:
            raise ValueError(
                f"broker.username {username!r} is not this device's: with the broker "
                f"configuration of deploy/mosquitto it must be {own!r}"
            )
        return self

    # ---------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AgentConfig:
        """Read and validate a TOML config file; raises `ConfigError` naming file and field."""
        path = Path(path).expanduser()
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8: {exc}") from None
        return cls.loads(text, base_dir=path.resolve().parent, source=path)

    @classmethod
    def loads(
        cls,
        text: str,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        source: str | os.PathLike[str] | None = None,
    ) -> AgentConfig:
        """Validate TOML text; relative paths are anchored at ``base_dir`` (if given)."""
        name = str(source) if source is not None else "<string>"
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {name} is not valid TOML: {exc}") from None
        if "source" in raw:
            raise ConfigError(f"invalid config file {name}: source: not a config option")
        if source is not None:
            raw["source"] = Path(source)
        context = {"base_dir": Path(base_dir) if base_dir is not None else None}
        try:
            return cls.model_validate(raw, context=context)
        except ValidationError as exc:
            raise ConfigError(f"invalid config file {name}: {_describe(exc)}") from None

    # ------------------------------------------------------------------------------ files
    def file_problems(self, *, broker: bool = True) -> list[str]:
        """What is wrong with the files this configuration names, one line each: a missing or
        unreadable password, key, certificate, rule or fact file, a trusted-keys path that is
        not a directory (the database path is the state's to check, as it opens it:
        ``StatePathError``). Checked before the agent
        starts (``zodiac-agent run`` / ``apply`` refuse, ``status`` reports), so that a typo
        is one line at start rather than a traceback when the broker connection is made.
        ``broker=False`` leaves out the broker's files (``apply`` makes no connection)."""
        where = f" (in {self.source})" if self.source is not None else ""
        connection = [
            ("broker.password_file", self.broker.password_file),
            ("broker.ca_file", self.broker.ca_file),
            ("broker.cert_file", self.broker.cert_file),
            ("broker.key_file", self.broker.key_file),
        ]
        files = [
            *(connection if broker else []),
            *((f"reasoning.rules[{i}]", path) for i, path in enumerate(self.reasoning.rules)),
            *((f"reasoning.facts[{i}]", path) for i, path in enumerate(self.reasoning.facts)),
        ]
        problems = [
            f"{option} {path}: {problem}{where}"
            for option, path in files
            if path is not None and (problem := _file_problem(path)) is not None
        ]
        if broker and self.broker.tls and not problems:
            problems += [f"{problem}{where}" for problem in self._tls_problems()]
        keys = self.keys.trusted_keys
        if not keys.is_dir():
            problem = "no such directory" if not keys.exists() else "not a directory"
            problems.append(f"keys.trusted_keys {keys}: {problem}{where}")
        else:
            problems += [f"keys.trusted_keys {p}{where}" for p in _key_problems(keys)]
        return problems

    def _tls_problems(self) -> list[str]:
        """TLS files that exist but that TLS cannot use (not PEM, a key that is not the
        certificate's, an encrypted key): found now, not as a traceback when connecting."""
        import ssl

        problems = []
        context = ssl.create_default_context()
        if self.broker.ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.broker.ca_file)
            except (ssl.SSLError, ValueError) as error:
                problems.append(
                    f"broker.ca_file {self.broker.ca_file}: no PEM CA certificate in it "
                    f"({_ssl_reason(error)})"
                )
        if self.broker.cert_file is not None and self.broker.key_file is not None:
            try:  # (a password callback: an encrypted key must not prompt on a terminal)
                context.load_cert_chain(
                    self.broker.cert_file, self.broker.key_file, password=lambda: b""
                )
            except (ssl.SSLError, ValueError) as error:
                problems.append(
                    f"broker.cert_file {self.broker.cert_file} and broker.key_file "
                    f"{self.broker.key_file}: not a PEM certificate with its unencrypted "
                    f"private key ({_ssl_reason(error)})"
                )
        return problems

    def check_files(self, *, broker: bool = True) -> None:
        """Raise ConfigError naming every problem of `file_problems`."""
        problems = self.file_problems(broker=broker)
        if problems:
            raise ConfigError("; ".join(problems))

    # ----------------------------------------------------------------------------- topics
    def topic(self, kind: TopicKind) -> str:
        """This device's topic ``zodiac/<farm>/<device>/<kind>`` (DESIGN.md section 4)."""
        if kind not in TOPIC_KINDS:
            raise ValueError(f"unknown topic kind {kind!r}; expected one of {TOPIC_KINDS}")
        return f"zodiac/{self.farm}/{self.device}/{kind}"

    def farm_bundle_topic(self) -> str:
        """The farm-wide bundle topic every device of the farm subscribes to."""
        return f"zodiac/{self.farm}/all/bundle"

    def neighbour_telemetry_topic(self, device: str) -> str:
        """The telemetry topic of another device of the same farm."""
        _check_device_id(device)
        return f"zodiac/{self.farm}/{device}/telemetry"

    def accepted_telemetry_predicates(self) -> set[str]:
        accepted = self.telemetry.accept_predicates
        return set(self.reasoning.telemetry_predicates if accepted is None else accepted)

    def neighbour_telemetry_topics(self) -> list[str]:
        """The telemetry topics of all configured neighbours (what the agent subscribes to)."""
        return [self.neighbour_telemetry_topic(d) for d in self.reasoning.neighbours]


def _file_problem(path: Path) -> str | None:
    """Why a file the configuration names cannot be read, or None."""
    try:
        with open(path, "rb"):
            return None
    except FileNotFoundError:
        return "no such file" if not path.is_symlink() else "a symlink to a missing file"
    except IsADirectoryError:
        return "a directory, not a file"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"


def _key_problems(directory: Path) -> list[str]:
    """The ``*.pub`` files of the trusted-keys folder that are not Ed25519 public keys (the
    agent refuses to start with one: it would not know which key the operator meant)."""
    from agent.engine.errors import ZodiacError
    from agent.protocol.keys import load_public_key

    problems = []
    for path in sorted(directory.glob("*.pub")):
        try:
            load_public_key(path)
        except ZodiacError as error:
            problems.append(str(error))
    return problems


def _ssl_reason(error: Exception) -> str:
    return getattr(error, "reason", None) or str(error).splitlines()[0]


def _describe(exc: ValidationError) -> str:
    """Every error on one line, ``; `` between them (a configuration problem is one line on
    stderr, for journald and for the operator): dotted field path, message, and the offending
    value when short."""
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown option (misspelt, or in the wrong [table]?)"
        elif error["type"] == "missing":
            message = "required option is missing"
        elif error["type"] == "value_error" and "error" in error.get("ctx", {}):
            message = str(error["ctx"]["error"])  # our own validators' words, no "Value error,"
        value = error.get("input")
        shown = ""
        if error["type"] not in ("missing", "extra_forbidden") and not isinstance(value, dict):
            text = repr(value)
            if len(text) <= 60 and "password" not in where:
                shown = f" (got {text})"
        lines.append(f"{where}: {message}{shown}")
    return "; ".join(lines)
