"""`AgentConfig`: the example file loads, paths anchor at the file, errors name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentConfig, ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "agent.example.toml"

MINIMAL = """\
device = "dev1"
farm = "farm1"
[keys]
trusted_keys = "keys"
"""


def write(directory: Path, text: str, name: str = "agent.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_example_config_loads_and_documents_every_option():
    config = AgentConfig.load(EXAMPLE)
    assert config.device == "turbine-07" and config.farm == "north-sea-1"
    assert config.source == EXAMPLE
    assert config.database == ROOT / "zodiac-agent.db"
    assert config.keys.trusted_keys == ROOT / "keys"
    assert config.reasoning.rules == [ROOT / "rules" / "turbine.rules"]
    assert config.reasoning.triggers == {
        "http://example.org/wind#AmbientTemperatureAnomaly": "anomaly/ambient-temperature"
    }
    assert config.broker.password is None
    assert config.broker.password_file == ROOT / "secrets" / "mqtt-password"
    # Every option of every section appears in the example (set or commented out), so the
    # example stays the reference documentation as options are added.
    text = EXAMPLE.read_text()
    sections = {
        "": AgentConfig,
        "broker": type(config.broker),
        "keys": type(config.keys),
        "reasoning": type(config.reasoning),
        "telemetry": type(config.telemetry),
        "budget": type(config.budget),
        "limits": type(config.limits),
        "events": type(config.events),
        "windows": type(config.windows),
        "metrics": type(config.metrics),
        "log": type(config.log),
    }
    for section, model in sections.items():
        for name in model.model_fields:
            if name in sections or name == "source":
                continue
            forms = (f"\n{name} =", f"\n# {name} =", f"\n[{section}.{name}]")
            assert any(form in text for form in forms), f"{section}.{name} is not in the example"


def test_defaults():
    config = AgentConfig.loads(MINIMAL)
    assert config.synchronous == "FULL"
    assert config.broker.host == "127.0.0.1" and config.broker.port == 1883
    assert config.broker.session_expiry == 86400 and config.broker.keepalive == 30
    assert config.keys.max_bundle_bytes == 1_000_000 and config.keys.max_operations == 10_000
    assert config.reasoning.modules is True and config.reasoning.neighbours == []
    assert config.log.level == "INFO" and config.log.format == "json"


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path, monkeypatch):
    conf_dir = tmp_path / "etc" / "zodiac"
    conf_dir.mkdir(parents=True)
    path = write(
        conf_dir,
        MINIMAL
        + """
[broker]
username = "dev1"
password_file = "../secret/pw"
ca_file = "/abs/ca.pem"
tls = true

[reasoning]
rules = ["rules/a.rules", "/opt/b.rules"]
facts = ["facts.nt"]
""",
    )
    # The working directory must not matter.
    monkeypatch.chdir(tmp_path)
    config = AgentConfig.load(path)
    assert config.database == conf_dir / "zodiac-agent.db"  # the default too
    assert config.keys.trusted_keys == conf_dir / "keys"
    assert config.broker.password_file == conf_dir / "../secret/pw"
    assert config.broker.ca_file == Path("/abs/ca.pem")
    assert config.reasoning.rules == [conf_dir / "rules/a.rules", Path("/opt/b.rules")]
    assert config.reasoning.facts == [conf_dir / "facts.nt"]
    # Loading through a relative path to the file gives the same absolute paths.
    assert AgentConfig.load(Path("etc/zodiac/agent.toml")).keys.trusted_keys == (conf_dir / "keys")


def test_absolute_database_path_is_kept(tmp_path: Path):
    text = MINIMAL.replace('farm = "farm1"', 'farm = "farm1"\ndatabase = "/var/lib/zodiac/a.db"')
    assert AgentConfig.load(write(tmp_path, text)).database == Path("/var/lib/zodiac/a.db")


def test_password_file_is_read_at_use(tmp_path: Path):
    (tmp_path / "pw").write_text("s3cret\n")
    path = write(
        tmp_path, MINIMAL + '[broker]\nusername = "dev1"\npassword_file = "pw"\n', "a.toml"
    )
    broker = AgentConfig.load(path).broker
    assert broker.resolve_password() == "s3cret"
    inline = AgentConfig.loads(MINIMAL + '[broker]\nusername = "u"\npassword = "s3cret"\n')
    assert inline.broker.resolve_password() == "s3cret"
    assert "s3cret" not in repr(inline)


@pytest.mark.parametrize("bad", ["dev/1", "dev 1", "dev+", "#", "", "dév1", "all"])
def test_invalid_device_id_names_field_and_file(tmp_path: Path, bad: str):
    path = write(tmp_path, MINIMAL.replace('"dev1"', f'"{bad}"'))
    with pytest.raises(ConfigError) as err:
        AgentConfig.load(path)
    message = str(err.value)
    assert str(path) in message
    assert ": device:" in message
    assert ": farm:" not in message


def test_invalid_farm_and_neighbour_ids(tmp_path: Path):
    path = write(
        tmp_path,
        MINIMAL.replace('"farm1"', '"farm/1"') + '[reasoning]\nneighbours = ["ok", "b+d"]\n',
    )
    message = str(pytest.raises(ConfigError, AgentConfig.load, path).value)
    assert ": farm:" in message
    assert "reasoning.neighbours.1:" in message
    assert "'b+d'" in message


@pytest.mark.parametrize("username", ["farm1/dev2", "farm2/dev1", "farm1/dev1/controller"])
def test_a_username_of_the_broker_convention_must_name_this_device(tmp_path: Path, username):
    path = write(tmp_path, MINIMAL + f'[broker]\nusername = "{username}"\n')
    message = str(pytest.raises(ConfigError, AgentConfig.load, path).value)
    assert f"broker.username {username!r} is not this device's" in message
    assert "'farm1/dev1'" in message
    for fine in ("farm1/dev1", "dev1", "any-name"):  # other brokers, other conventions
        path = write(tmp_path, MINIMAL + f'[broker]\nusername = "{fine}"\n')
        assert AgentConfig.load(path).broker.username == fine


def test_unknown_field_names_field_and_file(tmp_path: Path):
    path = write(tmp_path, MINIMAL + '[broker]\nhostname = "broker.example"\n')
    with pytest.raises(ConfigError) as err:
        AgentConfig.load(path)
    message = str(err.value)
    assert str(path) in message
    assert "broker.hostname: unknown option" in message


def test_unknown_top_level_field(tmp_path: Path):
    path = write(tmp_path, 'devise = "x"\n' + MINIMAL)
    message = str(pytest.raises(ConfigError, AgentConfig.load, path).value)
    assert "devise: unknown option" in message


@pytest.mark.parametrize(
    ("drop", "field"),
    [('device = "dev1"\n', "device"), ('farm = "farm1"\n', "farm")],
)
def test_missing_required_field(tmp_path: Path, drop: str, field: str):
    path = write(tmp_path, MINIMAL.replace(drop, ""))
    message = str(pytest.raises(ConfigError, AgentConfig.load, path).value)
    assert str(path) in message
    assert f": {field}: required option is missing" in message


def test_missing_keys_section(tmp_path: Path):
    path = write(tmp_path, 'device = "dev1"\nfarm = "farm1"\n')
    message = str(pytest.raises(ConfigError, AgentConfig.load, path).value)
    assert ": keys: required option is missing" in message


def test_bad_values_are_named_with_their_value(tmp_path: Path):
    path = write(
        tmp_path,
        MINIMAL + '[broker]\nport = 70000\nkeepalive = "soon"\n[log]\nformat = "xml"\n',
    )
    message = str(pytest.raises(ConfigError, AgentConfig.load, path).value)
    assert "\n" not in message  # (one line: the configuration's problems, "; " between)
    assert "broker.port:" in message and "70000" in message
    assert "broker.keepalive:" in message
    assert "log.format:" in message and "'xml'" in message


@pytest.mark.parametrize(
    ("broker", "complaint"),
    [
        ('username = "u"\npassword = "p"\npassword_file = "f"', "not both"),
        ('password = "p"', "needs a username"),
        ("reconnect_min_delay = 10\nreconnect_max_delay = 5", "reconnect_max_delay"),
        ('ca_file = "ca.pem"', "tls = false"),
        ('tls = true\ncert_file = "c.pem"', "go together"),
    ],
)
def test_inconsistent_broker_options(broker: str, complaint: str):
    with pytest.raises(ConfigError) as err:
        AgentConfig.loads(MINIMAL + "[broker]\n" + broker + "\n", source="x.toml")
    assert ": broker: " in str(err.value) and complaint in str(err.value)


def test_device_cannot_be_its_own_neighbour():
    with pytest.raises(ConfigError, match="lists itself"):
        AgentConfig.loads(MINIMAL + '[reasoning]\nneighbours = ["dev1"]\n')


def test_level_and_synchronous_are_case_insensitive():
    config = AgentConfig.loads(
        MINIMAL.replace('farm = "farm1"', 'farm = "farm1"\nsynchronous = "normal"')
        + '[log]\nlevel = "debug"\n'
    )
    assert config.synchronous == "NORMAL" and config.log.level == "DEBUG"


def test_toml_syntax_error_names_the_file(tmp_path: Path):
    path = write(tmp_path, 'device = "dev1\n')
    message = str(pytest.raises(ConfigError, AgentConfig.load, path).value)
    assert str(path) in message and "line 1" in message


def test_missing_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        AgentConfig.load(tmp_path / "nope.toml")


def test_topics():
    config = AgentConfig.loads(MINIMAL + '[reasoning]\nneighbours = ["dev2", "dev3"]\n')
    assert config.topic("bundle") == "zodiac/farm1/dev1/bundle"
    assert config.topic("status") == "zodiac/farm1/dev1/status"
    assert config.topic("request") == "zodiac/farm1/dev1/request"
    assert config.topic("telemetry") == "zodiac/farm1/dev1/telemetry"
    assert config.farm_bundle_topic() == "zodiac/farm1/all/bundle"
    assert config.neighbour_telemetry_topic("dev2") == "zodiac/farm1/dev2/telemetry"
    assert config.neighbour_telemetry_topics() == [
        "zodiac/farm1/dev2/telemetry",
        "zodiac/farm1/dev3/telemetry",
    ]
    with pytest.raises(ValueError):
        config.topic("secrets")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        config.neighbour_telemetry_topic("+")


def test_config_is_immutable():
    config = AgentConfig.loads(MINIMAL)
    with pytest.raises(ValueError):
        config.device = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("listen", "complaint"),
    [
        ("9600", "is not HOST:PORT"),
        ("127.0.0.1:", "is not HOST:PORT"),
        ("127.0.0.1:99999", "port 99999"),
        ("metrics.example:9600", "is not an IP address or localhost"),
    ],
)
def test_a_bad_metrics_listen_is_one_line_naming_the_option(tmp_path: Path, listen, complaint):
    path = write(tmp_path, MINIMAL + f'[metrics]\nlisten = "{listen}"\n')
    with pytest.raises(ConfigError) as caught:
        AgentConfig.load(path)
    message = str(caught.value)
    assert "metrics.listen" in message and complaint in message and "\n" not in message


def test_metrics_are_off_unless_listen_is_given(tmp_path: Path):
    assert AgentConfig.load(write(tmp_path, MINIMAL)).metrics.address() is None
    on = AgentConfig.load(write(tmp_path, MINIMAL + '[metrics]\nlisten = "[::1]:0"\n'))
    assert on.metrics.address() == ("::1", 0)
