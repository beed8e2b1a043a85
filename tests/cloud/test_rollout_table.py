"""The pieces of a roll-out that need no broker (cloud/rollout.py): which devices are the
canaries, when a device is ready, and the dry-run table, which docs/operations.md shows as
``publish --dry-run`` prints it (the page's table is made here from the same answers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.protocol.messages import (
    DeviceStatus,
    DryRunReport,
    Health,
    PredicateCount,
    WatchedChangeSummary,
)
from cloud.rollout import canary_split, dry_run_row, not_ready, table
from cloud.status_wait import Answer

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def answer(device, verdict, before, after, predicates=(), watched=(), **extra) -> Answer:
    report = DryRunReport(
        bundle_id=f"{device}:base:4:ab12cd34",
        stream="base",
        version=4,
        verdict=verdict,
        facts_before=before,
        facts_after=after,
        predicates=[PredicateCount(predicate=p, before=b, after=a) for p, b, a in predicates],
        watched=[WatchedChangeSummary(watch=w, appeared=a, disappeared=d) for w, a, d in watched],
        at=0,
        **extra,
    )
    return Answer(device, "dry run", 4, verdict, dry_run=report)


def test_the_docs_dry_run_table_is_what_publish_prints():
    answers = [
        answer(
            "turbine-07",
            "would apply",
            1204,
            1391,
            [("reach/2", 60, 245), ("Suspect/1", 2, 3)],
            [("<Suspect>(X)", 1, 0)],
            seconds=0.041,
            memory_bytes=2_400_000,
        ),
        answer(
            "turbine-08",
            "would apply",
            1187,
            1372,
            [("reach/2", 58, 243)],
            seconds=0.038,
            memory_bytes=90_000,
        ),
        answer(
            "turbine-09",
            "budget_exceeded",
            1190,
            1190,
            seconds=0.512,
            memory_bytes=31_500_000,
            budget={"limit": "derived_facts", "allowed": 100000, "used": 100214},
        ),
        Answer("turbine-10", "no answer"),
    ]
    printed = table([dry_run_row(a) for a in answers])
    (shown,) = re.findall(r"^```text dry-run-table\n(.*?)^```$", DOC.read_text(), re.S | re.M)
    assert shown.rstrip("\n") == printed


def test_canaries_are_the_first_by_id_or_the_ones_named():
    assert canary_split(["t3", "t1", "t2"], 2, None) == (["t1", "t2"], ["t3"])
    assert canary_split(["t3", "t1", "t2"], None, ["t3"]) == (["t3"], ["t1", "t2"])
    with pytest.raises(ValueError, match="--canary-devices t9: not among --devices"):
        canary_split(["t1", "t2"], None, ["t9"])
    with pytest.raises(ValueError, match="canaries must leave some devices"):
        canary_split(["t1", "t2"], 2, None)


def status(**fields) -> DeviceStatus:
    defaults = dict(
        device="t1",
        farm="farm1",
        online=True,
        applied={"base": 2},
        rules=1,
        facts=1,
        explicit_facts=1,
        updated_at=0.0,
    )
    return DeviceStatus(**(defaults | fields))


def test_a_device_is_ready_when_it_applied_the_version_is_online_and_reports_no_error_on_it():
    assert not_ready(Answer("t1", "applied", 2, status=status()), "base") is None
    offline = Answer("t1", "applied", 2, status=status(online=False))
    assert not_ready(offline, "base") == "offline"
    error = json.dumps({"reason": "engine", "message": "boom", "stream": "base"})
    troubled = Answer("t1", "applied", 2, status=status(last_error=error))
    assert not_ready(troubled, "base") == "reports an error on the stream: engine: boom"
    elsewhere = Answer("t1", "applied", 2, status=status(last_error=error))
    assert not_ready(elsewhere, "other") is None
    assert not_ready(Answer("t1", "refused", 2, "bad_rule", "r: x"), "base") == (
        "refused: bad_rule: r: x"
    )
    assert not_ready(Answer("t1", "no answer"), "base").startswith("no answer")
    outage = Health(alive=True, ready=False, reasons=["broker: not connected"])
    unready = Answer("t1", "applied", 2, status=status(health=outage))
    assert not_ready(unready, "base") == "not ready: broker: not connected"
    healthy = Health(alive=True, ready=True)
    assert not_ready(Answer("t1", "applied", 2, status=status(health=healthy)), "base") is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--canary", "3"], "zodiac-cloud: --canary 3: only 2 devices; canaries must leave"),
        (["--canary-devices", "t9"], "zodiac-cloud: --canary-devices t9: not among --devices"),
        (["--to-version", "2"], "zodiac-cloud: --to-version goes with --revert"),
        (["--dry-run", "--no-wait"], "zodiac-cloud: --dry-run waits for the devices' answers"),
        (["--canary", "1", "--no-wait"], "zodiac-cloud: --canary waits for the devices' answers"),
    ],
)
def test_bad_roll_out_options_are_one_line_before_anything_is_sent(tmp_path, capsys, args, message):
    from cloud.zodiac_cloud_cli import main

    command = ["publish", "--farm", "farm1", "--rules-dir", str(tmp_path), "--key", "k.key"]
    code = main([*command, "--state", str(tmp_path / "s.db"), "--devices", "t1", "t2", *args])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_canary_count_must_be_a_positive_number(tmp_path, capsys, value):
    from cloud.zodiac_cloud_cli import main

    command = ["publish", "--farm", "f", "--rules-dir", str(tmp_path), "--key", "k.key"]
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--devices", "t1", "--canary", value])
    assert stopped.value.code == 2
    assert "--canary: " in capsys.readouterr().err
