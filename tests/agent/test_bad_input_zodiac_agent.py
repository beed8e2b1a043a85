"""Bad input to ``zodiac-agent``: a broken configuration, unusable paths and keys, and a state
file damaged in ways SQLite does not notice. Every case is a non-zero exit with a clear message
and no traceback (an exception escaping ``main`` is one); a damaged state is reported by
``status``, refused by ``query`` and ``run`` with how to rebuild it, and never changed."""

from __future__ import annotations

import json
import logging
import sqlite3
import zlib
from contextlib import closing

import pytest

from agent.cli import main
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud, agent_command, run_with_the_reader_gone

CONFIG = """device = "t1"
farm = "farm1"
database = "{database}"
[keys]
trusted_keys = "{keys}"
"""


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def config_file(tmp_path, cloud, *, database="t1.db", keys=None, text=None):
    path = tmp_path / "agent.toml"
    path.write_text(
        text if text is not None else CONFIG.format(database=database, keys=keys or cloud.keys)
    )
    return path


def run(argv, capsys) -> tuple[int, str]:
    try:
        code = main([str(a) for a in argv])
    finally:  # the agent logs to the stderr of this test's capture: do not keep it
        for name in ("", "zodiac", "zodiac.agent", "zodiac.sync"):
            logging.getLogger(name).handlers.clear()
    captured = capsys.readouterr()
    text = captured.err + captured.out
    assert "Traceback" not in text
    return code, text


# (id, how the configuration is broken, what the message names)
CONFIGS = [
    ("config-missing", lambda d, c: d / "none.toml", "none.toml"),
    ("config-is-directory", lambda d, c: d, ""),
    ("config-not-toml", lambda d, c: config_file(d, c, text="device = \n[["), "agent.toml"),
    (
        "config-wrong-type",
        lambda d, c: config_file(d, c, text='device = 5\nfarm = "f"\n'),
        "device",
    ),
    (
        "config-unknown-key",
        lambda d, c: config_file(
            d, c, text=CONFIG.format(database="t1.db", keys=c.keys) + "colour = 'red'\n"
        ),
        "colour",
    ),
    (
        "database-is-directory",
        lambda d, c: (d / "db").mkdir() or config_file(d, c, database="db"),
        "db",
    ),
    ("database-parent-is-a-file", lambda d, c: parent_is_a_file(d, c), "file"),
    ("trusted-keys-missing", lambda d, c: config_file(d, c, keys=d / "no-keys"), "no-keys"),
    ("trusted-key-garbage", lambda d, c: garbage_key(d, c), "k.pub"),
    # (run printed a 34-line traceback while status said healthy)
    ("password-file-missing", lambda d, c: with_password_file(d, c, "none.txt"), "none.txt"),
    ("password-file-is-directory", lambda d, c: with_password_file(d, c, "."), "directory"),
    ("rules-file-missing", lambda d, c: with_rules_file(d, c, "none.rules"), "none.rules"),
    # (run: a traceback from the TLS set-up, exit 1; status: healthy)
    ("ca-file-garbage", lambda d, c: with_tls_files(d, c, ca="garbage"), "ca.pem"),
    ("client-cert-garbage", lambda d, c: with_tls_files(d, c, cert="garbage"), "client.pem"),
]
# Configuration problems: exit 2, one line on stderr, from `run` and `status` (which checks the
# files the configuration names); `query` reads only the state.
CHECKED = {
    "password-file-missing",
    "password-file-is-directory",
    "rules-file-missing",
    "trusted-keys-missing",
    "trusted-key-garbage",  # (run: exit 1; status: healthy)
    "ca-file-garbage",
    "client-cert-garbage",
}
# A configuration that does not load: one line in all, exit 2 (a bad value printed a line
# naming the file and one more line per bad option).
UNLOADABLE = {"config-missing", "config-not-toml", "config-wrong-type", "config-unknown-key"}
CASES = [
    (case, command)
    for case in CONFIGS
    for command in ("status", "run", "query")
    if command != "query" or case[0] not in CHECKED
]


def with_password_file(folder, cloud, name):
    text = CONFIG.format(database="t1.db", keys=cloud.keys)
    text = text.replace("[keys]", f'[broker]\nusername = "u"\npassword_file = "{name}"\n[keys]')
    return config_file(folder, cloud, text=text)


def with_tls_files(folder, cloud, *, ca="", cert=""):
    """TLS files that exist: a real CA and client certificate unless ``garbage`` is asked."""
    from tests.support.broker import make_tls_files

    files = make_tls_files(folder / "pki")
    (folder / "ca.pem").write_bytes(b"not a certificate" if ca else files.ca_cert.read_bytes())
    (folder / "client.pem").write_bytes(
        b"not a certificate" if cert else files.client_cert.read_bytes()
    )
    text = CONFIG.format(database="t1.db", keys=cloud.keys).replace(
        "[keys]",
        '[broker]\ntls = true\nca_file = "ca.pem"\ncert_file = "client.pem"\n'
        f'key_file = "{files.client_key}"\n[keys]',
    )
    return config_file(folder, cloud, text=text)


def with_rules_file(folder, cloud, name):
    text = CONFIG.format(database="t1.db", keys=cloud.keys) + f'[reasoning]\nrules = ["{name}"]\n'
    return config_file(folder, cloud, text=text)


def parent_is_a_file(folder, cloud):
    (folder / "file").write_text("x")
    return config_file(folder, cloud, database="file/t1.db")


def garbage_key(folder, cloud):
    (folder / "bad").mkdir()
    (folder / "bad" / "k.pub").write_text("garbage")
    return config_file(folder, cloud, keys=folder / "bad")


@pytest.mark.parametrize(("case", "command"), CASES, ids=[f"{c[0]}-{m}" for c, m in CASES])
def test_a_broken_configuration_is_a_clear_refusal(tmp_path, capsys, cloud, case, command):
    _, make, names = case
    config = make(tmp_path, cloud)
    extra = ["<p>(X)"] if command == "query" else []
    code, text = run([command, "--config", config, *extra], capsys)
    assert code != 0, text
    assert names in text
    if case[0] in UNLOADABLE:
        assert code == 2 and len(text.strip().splitlines()) == 1, text
    if case[0] in CHECKED:  # a configuration problem: exit 2, one line on stderr
        assert code == 2, text
        assert len([line for line in text.splitlines() if "zodiac-agent:" in line]) == 1, text


@pytest.mark.parametrize("kind", ["missing", "directory", "symlink loop"])
def test_apply_of_a_bundle_file_it_cannot_read_is_one_line(tmp_path, capsys, cloud, kind):
    """(A missing file, a directory or a symlink loop escaped as a traceback.)"""
    config = config_file(tmp_path, cloud)
    path = tmp_path / "bundle.bin"
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink loop":
        path.symlink_to(tmp_path / "other.bin")
        (tmp_path / "other.bin").symlink_to(path)
    code, text = run(["apply", "--config", config, path], capsys)
    assert code == 2, text
    assert text.count("\n") == 1 and "bundle file" in text and str(path.name) in text, text


def damage_term_not_a_term(conn):  # (checksum kept consistent: what it holds is wrong)
    values, literals = json.loads(conn.execute("SELECT packed FROM terms").fetchone()[0])
    values[0] = {"not": "a term"}
    packed = json.dumps([values, literals]).encode()
    conn.execute("UPDATE terms SET packed = ?, crc = ?", (packed, zlib.crc32(packed)))


def damage_schema_version(conn):
    conn.execute("UPDATE meta SET value = 'two' WHERE key = 'schema_version'")


def damage_missing_term(conn):  # (counts and checksum kept consistent: the id is what is wrong)
    from agent.state.packing import checksum

    size, top, packed = conn.execute("SELECT size, top, packed FROM explicit").fetchone()
    conn.execute("UPDATE explicit SET high = 99999, crc = ?", (checksum(size, 99999, top, packed),))


def damage_explicit_fact_bytes(conn):  # a fact's bytes changed: its checksum no longer matches
    conn.execute("UPDATE explicit SET packed = substr(packed, 1, length(packed) - 1) || x'07'")


def damage_term_count(conn):
    conn.execute("UPDATE terms SET count = count + 1")


def damage_term_gap(conn):  # the ids of the terms would all shift
    conn.execute("UPDATE terms SET chunk = chunk + 1")


def damage_rule_form(conn):
    conn.execute("""UPDATE rules SET form = '["R","q",["A","q",[["V","X"]]],[],[["A","p",'""")


def damage_rule_form_operator(conn):
    conn.execute('UPDATE rules SET form = replace(form, \'["A","p"\', \'["Q","p"\')')


def damage_rule_form_unsafe(conn):  # well formed, but the head's variable is not in the body
    conn.execute('UPDATE rules SET form = replace(form, \'["V","X"]]]\', \'["V","Z"]]]\')')


def damage_rule_text_without_form(conn):  # (a rule whose text did not parse when upgraded)
    conn.execute("UPDATE rules SET text = 'q: <q>(X :- .', form = NULL")


def _rule_rows_checksummed_again(conn):  # (what a row holds is wrong, its checksum agrees)
    from agent.state.saved_rules import row_checksum

    rows = conn.execute(
        "SELECT name, key, text, stream, bundle_id, position, form FROM rules"
    ).fetchall()
    for row in rows:
        conn.execute(
            "UPDATE rules SET crc = ? WHERE name = ? AND stream = ?",
            (row_checksum(*row), row[0], row[3]),
        )


def damage_rule_form_checksummed(conn):
    damage_rule_form(conn)
    _rule_rows_checksummed_again(conn)


def damage_rule_form_operator_checksummed(conn):
    damage_rule_form_operator(conn)
    _rule_rows_checksummed_again(conn)


def damage_stream_version(conn):  # (status said healthy; run crashed in pydantic)
    conn.execute("UPDATE streams SET version = 'two'")


def damage_reading_time(conn):
    conn.execute("INSERT INTO reading_times VALUES ('sensor', 't1', 'yesterday')")


def damage_request_status(conn):
    conn.execute("INSERT INTO requests (request_id, event, status, created_at) "
                 "VALUES ('r1', 'e', 'maybe', 0)")  # fmt: skip


DAMAGES = [
    damage_stream_version,
    damage_reading_time,
    damage_request_status,
    damage_term_not_a_term,
    damage_schema_version,
    damage_missing_term,
    damage_explicit_fact_bytes,
    damage_term_count,
    damage_term_gap,
    damage_rule_form,
    damage_rule_form_operator,
    damage_rule_form_unsafe,
    damage_rule_text_without_form,
    damage_rule_form_checksummed,
    damage_rule_form_operator_checksummed,
]


@pytest.mark.parametrize("damage", DAMAGES, ids=[d.__name__ for d in DAMAGES])
def test_a_damaged_state_is_reported_refused_and_left_alone(tmp_path, capsys, cloud, damage):
    agent = make_agent(tmp_path, cloud)
    bundle = cloud.bundle(
        "base", 1, rules={"q": "q: <q>(X) :- <p>(X, Y) ."}, facts=[("p", "a", 12), ("p", "b", 3.5)]
    )
    assert agent.handle_bundle(cloud.sign(bundle)).status == "applied"
    agent.close()
    database = tmp_path / "t1.db"
    with closing(sqlite3.connect(database)) as conn, conn:
        damage(conn)
    before = database.read_bytes()
    config = tmp_path / "agent.toml"
    code, text = run(["status", "--config", config], capsys)
    assert code == 1 and '"healthy": false' in text and "damaged" in text, text
    for command in (["query", "--config", config, "<q>(X)"], ["run", "--config", config]):
        code, text = run(command, capsys)
        assert code == 1, text
        assert "damaged agent state" in text and "move the file away" in text, text
        assert len(text.strip().splitlines()) == 1, text
    assert database.read_bytes() == before


@pytest.mark.process
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path, cloud):
    """``zodiac-agent status | head -1``: the reader closes the pipe before the command has
    written; the command stops with status 0 and no traceback (it printed BrokenPipeError's)."""
    agent = make_agent(tmp_path, cloud)
    agent.close()
    config = tmp_path / "agent.toml"
    for command in (["status", "--config", config], ["query", "--config", config, "<q>(X)"]):
        code, error = run_with_the_reader_gone(agent_command(*map(str, command)))
        assert code == 0 and "Traceback" not in error and "BrokenPipe" not in error, error


def test_query_takes_its_pattern_as_zodiac_edge_does_too(tmp_path, capsys, cloud):
    """``zodiac-agent query PATTERN`` and ``--pattern PATTERN`` (zodiac-edge's form) answer
    alike; neither, or both, is a usage error."""
    agent = make_agent(tmp_path, cloud)
    bundle = cloud.bundle("base", 1, rules={}, facts=[("p", "a", 12), ("p", "b", 3.5)])
    assert agent.handle_bundle(cloud.sign(bundle)).status == "applied"
    agent.close()
    config = str(tmp_path / "agent.toml")
    answers = []
    for pattern in (["<p>(X, _)"], ["--pattern", "<p>(X, _)"]):
        code, text = run(["query", "--config", config, *pattern], capsys)
        assert code == 0, text
        answers.append(sorted(json.loads(line)["X"] for line in text.splitlines()))
    assert answers == [["a", "b"], ["a", "b"]]
    for wrong in ([], ["<p>(X, _)", "--pattern", "<p>(X, _)"]):
        with pytest.raises(SystemExit) as exit_:
            main(["query", "--config", config, *wrong])
        assert exit_.value.code == 2
