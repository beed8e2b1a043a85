"""Windows on the cloud side: a stream file's ``@window`` and ``@watch`` lines travel in its
bundles (``Bundle.windows``, ``Bundle.watches``), and ``zodiac-cloud materialise`` refuses a
windowed program with one line before any Spark session starts (docs/cloud.md, "Windows")."""

from __future__ import annotations

import pytest

from agent.engine.errors import DirectiveError
from cloud.bundles import BundleCutter, load_stream_file, load_streams, stream_target
from cloud.spark.materialise import checked_rules
from cloud.zodiac_cloud_cli import main

WINDOW = "@window <hasAirTemperatureMeasurement> 10 min as <recentAirTemperature> ."
STREAM = f"""{WINDOW}
@watch <StuckSensor>(X) .
count: <windowCount>(S, N) :- aggregate( <recentAirTemperature>(S, V, T) ) on S with count(V) as N .
"""


def test_a_stream_files_windows_and_watches_go_into_its_bundles(tmp_path):
    (tmp_path / "streams").mkdir()
    (tmp_path / "streams" / "stuck.rules").write_text(STREAM)
    streams = load_streams(tmp_path / "streams")
    rules = streams["stuck"]
    assert list(rules) == ["count"]
    assert rules.windows == [WINDOW] and rules.watches == ["<StuckSensor>(X)"]
    cutter = BundleCutter(tmp_path / "ledger.db", "farm1")
    first = cutter.cut("t1", "stuck", stream_target(rules))
    assert first.windows == [WINDOW] and first.watches == ["<StuckSensor>(X)"]
    assert cutter.cut("t1", "stuck", stream_target(rules)) is None  # nothing changed
    # The window changed alone: a bundle with the stream's new list and no operation.
    (tmp_path / "streams" / "stuck.rules").write_text(STREAM.replace("10 min", "5 min"))
    changed = cutter.cut(
        "t1", "stuck", stream_target(load_stream_file(tmp_path / "streams" / "stuck.rules"))
    )
    assert changed.version == 2 and changed.operations == []
    assert changed.windows == [WINDOW.replace("10 min", "5 min")] and changed.watches is None
    # A full state carries them all; the ledger remembers them across a restart.
    again = BundleCutter(tmp_path / "ledger.db", "farm1")
    full = again.full_state("t1", "stuck")
    assert full.full_state and full.windows == changed.windows
    assert full.watches == ["<StuckSensor>(X)"]


def test_the_cloud_job_refuses_windows_before_spark(tmp_path, capsys, monkeypatch):
    from cloud.spark import session

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started for a program it must refuse")

    monkeypatch.setattr(session, "local_session", no_spark)
    rules = tmp_path / "stuck.rules"
    rules.write_text(STREAM)
    with pytest.raises(DirectiveError, match="the farm's knowledge graph holds the latest"):
        checked_rules(rules)
    out = tmp_path / "out"
    for mode in ("always", "never", "auto"):
        code = main(
            ["materialise", "--quiet", "--rules", str(rules), "--out", str(out), "--spark", mode]
        )
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert code != 0 and len(lines) == 1, err
        assert lines[0].startswith("zodiac-cloud: windows (@window <hasAirTemperature")
        assert "not evaluate them" in lines[0] and "Traceback" not in err
        assert not out.exists()
