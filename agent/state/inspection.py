"""The operator's commands on an agent's state file: ``zodiac-agent inspect`` and ``backup``.

Both work while the agent runs, and neither changes the state:

- ``inspect`` opens the file read-only (SQLite ``mode=ro``) and lists its tables with their row
  counts, the rules held (label, stream, the stream's applied version) and the streams, as JSON
  or CSV. A reader in WAL mode never blocks the agent's writer, and the agent's writer never
  blocks it: it sees the last committed state.
- ``backup`` copies the state with SQLite's online backup API (`sqlite3.Connection.backup`) in
  one step: that step reads one snapshot, so the copy is a consistent committed state even
  while the agent applies bundles, and the agent goes on committing meanwhile (WAL). The copy
  is written under a temporary name beside OUT, checked, switched to a rollback journal (one
  self-contained file; the agent turns WAL on again when it opens it) and linked to OUT, which
  is never overwritten.

They use sqlite-utils (table names, counts, queries), always as ``Database(conn,
execute_plugins=False)``: a sqlite-utils plugin installed on the device must not get hooks on
a connection to the agent's state. The agent's service never imports this module (its hot path
is plain ``sqlite3``; tests/agent/test_inspect_backup.py checks ``zodiac-agent run``'s
imports).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import sqlite3
import uuid
from pathlib import Path

from sqlite_utils import Database

from agent.engine.errors import ZodiacError
from agent.state.agent_state import _refuse_orphaned_log, _state_file
from agent.state.schema import FORMAT, SCHEMA_VERSION, StateError


class UsageError(ZodiacError):
    """A bad option or path given to ``inspect`` or ``backup`` (the CLI's exit status 2)."""

# The views of the state ``inspect --table`` knows besides the file's own tables.
SECTIONS = ("tables", "rules", "streams")
FORMATS = ("json", "csv")
EXISTS = "already exists; the backup never overwrites a file"


def state_file(database: Path) -> Path:
    """The state file a configured ``database`` names (links followed), which must exist: the
    operator's commands never create a state."""
    file = _state_file(database)
    _refuse_orphaned_log(database, file)
    if not file.is_file() or file.stat().st_size == 0:
        raise StateError(f"{database}: no agent state here (run the agent once to create it)")
    return file


def open_read_only(database: Path) -> Database:
    """The agent state at ``database`` through a read-only connection, checked to be one."""
    file = state_file(database)
    try:
        conn = sqlite3.connect(f"{file.as_uri()}?mode=ro", uri=True, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=5000")
        db = Database(conn, execute_plugins=False, recursive_triggers=False)
        tables = set(db.table_names())
        meta = dict(conn.execute("SELECT key, value FROM meta")) if "meta" in tables else {}
    except sqlite3.DatabaseError as error:
        raise StateError(f"{database}: not a readable SQLite database ({error})") from None
    if meta.get("format") != FORMAT:
        conn.close()
        raise StateError(f"{database}: not a zodiac-edge agent state")
    return db


def schema_version(db: Database) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return row[0] if row else None


def inspect_state(db: Database) -> dict[str, list[dict]]:
    """Every section of ``inspect``: the tables with their row counts, the rules, the streams."""
    tables = [{"name": name, "rows": db.table(name).count} for name in sorted(db.table_names())]
    streams = [
        dict(row)
        for row in db.query(
            "SELECT stream, version, bundle_id, applied_at FROM streams ORDER BY stream"
        )
    ]
    rules = [
        dict(row)
        for row in db.query(
            "SELECT r.name AS label, r.stream AS stream, s.version AS version, r.text AS text "
            "FROM rules r LEFT JOIN streams s ON s.stream = r.stream "
            "ORDER BY r.stream, r.position, r.name"
        )
    ]
    return {"tables": tables, "rules": rules, "streams": streams}


def table_rows(db: Database, name: str) -> list[dict]:
    """The rows of one of the file's tables, binary columns shown as their size."""
    return [
        {
            key: f"<{len(value)} bytes>" if isinstance(value, bytes) else value
            for key, value in row.items()
        }  # fmt: skip
        for row in db.table(name).rows
    ]


def inspect(database: Path, *, fmt: str = "json", table: str | None = None) -> str:
    """What ``zodiac-agent inspect`` prints (see the module docstring).

    JSON without ``table`` holds every section; CSV is one section (``table``, by default
    ``tables``). ``table`` is a section or one of the file's tables (its rows)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    db = open_read_only(database)
    try:
        names = set(db.table_names())
        if table is not None and table not in SECTIONS and table not in names:
            choices = ", ".join([*SECTIONS, *sorted(names - set(SECTIONS))])
            raise UsageError(f"--table: no table {table!r} in {database} (one of: {choices})")
        version = schema_version(db)
        if version != str(SCHEMA_VERSION) and table not in names | {"tables"}:
            # (the rules and streams are read as this version lays them out)
            raise StateError(
                f"{database}: state schema version {version}, this agent reads version "
                f"{SCHEMA_VERSION}: `zodiac-agent run` migrates it at start; `--table tables` "
                "or one of its tables lists it as it is"
            )
        if table in SECTIONS or (table is None and fmt == "csv"):
            data: object = inspect_state(db)[table or "tables"]
        elif table is not None:
            data = table_rows(db, table)
        else:
            data = {"database": str(database), "schema_version": int(version),
                    **inspect_state(db)}  # fmt: skip
    finally:
        db.close()
    if fmt == "json":
        return json.dumps(data, indent=2, default=str) + "\n"
    assert isinstance(data, list)
    out = io.StringIO()
    columns = list(dict.fromkeys(key for row in data for key in row))
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(data)
    return out.getvalue()


def backup(database: Path, out: Path) -> dict:
    """Copy the agent state at ``database`` to ``out`` (which must not exist) while the agent
    may be running; what was copied (the copy's tables and row counts)."""
    if out.exists() or out.is_symlink():
        raise UsageError(f"{out}: {EXISTS}")
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent}: no such directory for the backup")
    source = open_read_only(database)
    partial = out.parent / f".{out.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        copy = sqlite3.connect(partial)
        try:
            # One step (pages=-1): a single read transaction, so one consistent snapshot.
            source.conn.backup(copy, pages=-1)
            check = copy.execute("PRAGMA quick_check").fetchone()
            if not check or check[0] != "ok":
                raise StateError(f"{out}: the copy does not check ({check})")
            copy.execute("PRAGMA journal_mode=DELETE")  # (one file; the agent turns WAL on)
            copy.commit()
        finally:
            copy.close()
        with Database(partial, execute_plugins=False, recursive_triggers=False) as made:
            tables = {name: made.table(name).count for name in sorted(made.table_names())}
        try:
            os.link(partial, out)  # (fails if OUT appeared meanwhile: never overwritten)
        except FileExistsError:
            raise UsageError(f"{out}: {EXISTS}") from None
        except OSError as error:
            raise ZodiacError(f"{out}: cannot write the backup ({error.strerror})") from None
    except sqlite3.Error as error:
        raise ZodiacError(f"{out}: the backup failed ({error})") from None
    finally:
        source.close()
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return {"backup": str(out), "bytes": out.stat().st_size, "tables": tables}
