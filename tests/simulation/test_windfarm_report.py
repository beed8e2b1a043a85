"""The demo's report writer on synthetic runs (no simulation is run): the plots say what they
draw and how many samples, the diagnosis points stay visible, a latency box needs 5 samples,
live and replayed update times are kept apart with the reason, and report.md names no absolute
path of the machine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from simulations.windfarm import report
from simulations.windfarm.analysis import Check, DiagnosisEvent, Result, Timeline, Update
from simulations.windfarm.farm import CHANGE_CONFIRMED, SENSOR_ANOMALY, Farm

plt = pytest.importorskip("matplotlib.pyplot")


def synthetic(directory: Path, *, faults: list[dict] | None = None, answers: int = 2) -> Result:
    """A run of 5 turbines as the analysis would give it, with ``answers`` rule-request
    latencies (a default run has one per suspicious turbine: 2)."""
    farm = Farm.grid(5)
    sim = SimpleNamespace(
        farm=farm,
        options=SimpleNamespace(
            duration=40, period=1.0, seed=7, sensor_fault="stuck", spark=False, broker=None
        ),
        schedule=SimpleNamespace(fault_at=10.0, warm_at=14.0),
        log=SimpleNamespace(setup_seconds={"agents": 1.5}, faults=faults or [], burst=None,
                            notes=[]),
        graph=SimpleNamespace(facts=set(), materialiser="engine", seconds=0.1,
                              startup_seconds=0.0),
        hosts=[object()],
        broker=SimpleNamespace(log_file=directory / "broker" / "mosquitto.log"),
        directory=directory,
    )  # fmt: skip
    # The diagnosis comes milliseconds after the rules are applied: at one y they overlap.
    timelines = [
        Timeline(farm.broken, "ambient sensor stuck", 10.0, 1.2, 1.5, 1.504,
                 SENSOR_ANOMALY, 3.0, SENSOR_ANOMALY),
        Timeline(farm.warm, "real local warming", 14.0, 2.0, 2.3, 2.302,
                 CHANGE_CONFIRMED, 5.0, CHANGE_CONFIRMED),
    ]  # fmt: skip
    updates = [
        Update(farm.broken, "add anomaly rules", 0.080, 0.004, 0.009, True),
        Update(farm.broken, "release (delete them)", 0.050, 0.002, 0.008, True),
        Update(farm.warm, "add anomaly rules", None, 0.005, 0.010, True),
    ]
    return Result(
        sim,
        timelines=timelines,
        checks=[Check("every diagnosis right", True, "2 of 2")],
        updates=updates,
        base_latencies={t.id: 0.05 + i / 100 for i, t in enumerate(farm.turbines)},
        answer_latencies=[0.2, 0.3][:answers] + [0.25] * max(0, answers - 2),
        telemetry_latencies=[0.01 * i for i in range(1, 13)],
        messages={"readings": (200, 20_000)},
        series={farm.broken: [(0.0, 12.0), (1.0, 12.1)], farm.warm: [(0.0, 12.2)]},
    )


def test_the_timeline_promises_red_fault_lines_only_when_faults_happened(tmp_path):
    quiet = report.timeline_figure(plt, synthetic(tmp_path))
    title = quiet._suptitle.get_text()
    assert "red" not in title and "fault" not in title
    assert "events of 2 suspicious turbines" in title and "3 ambient readings" in title
    red = [line for ax in quiet.axes for line in ax.lines if line.get_color() == "red"]
    assert red == []
    plt.close(quiet)
    faulty = synthetic(tmp_path, faults=[{"fault": "broker stopped", "t": 20.0, "at": 0.0}])
    fig = report.timeline_figure(plt, faulty)
    assert "red lines: 1 injected fault" in fig._suptitle.get_text()
    assert [ln for ax in fig.axes for ln in ax.lines if ln.get_color() == "red"]
    plt.close(fig)


def test_the_diagnosis_points_are_not_hidden_by_the_other_markers(tmp_path):
    fig = report.timeline_figure(plt, synthetic(tmp_path))
    events = fig.axes[0]
    markers = [line for line in events.lines if line.get_marker() not in ("None", None, "")]
    diagnosis = [line for line in markers if line.get_marker() == "*"]
    assert len(diagnosis) == 2
    for point in diagnosis:
        (x,), (y,) = point.get_xdata(), point.get_ydata()
        # Nothing drawn above it at its place, and nothing at the very same place.
        others = [m for m in markers if m is not point]
        assert all(m.get_zorder() < point.get_zorder() for m in others if m not in diagnosis)
        assert all((m.get_xdata()[0], m.get_ydata()[0]) != (x, y) for m in others)
    plt.close(fig)


def test_a_latency_box_needs_five_samples_and_shows_its_count(tmp_path):
    fig = report.latency_figure(plt, synthetic(tmp_path, answers=2))
    ax = fig.axes[0]
    labels = [tick.get_text() for tick in ax.get_xticklabels()]
    assert labels == [
        "base bundle\napplied\nn = 5",
        "request ->\nanswer\nn = 2 (points)",
        "reading ->\ntelemetry\nn = 12",
    ]
    # Two boxes of 7 lines each (box, median, 2 whiskers, 2 caps, fliers), one line of points.
    points = [line for line in ax.lines if line.get_marker() == "D"]
    assert len(points) == 1 and list(points[0].get_ydata()) == [200.0, 300.0]
    assert len(ax.lines) == 2 * 7 + 1
    assert "19 samples" in ax.get_title()
    plt.close(fig)
    fig = report.latency_figure(plt, synthetic(tmp_path, answers=6))
    assert "request ->\nanswer\nn = 6" in [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(fig.axes[0].lines) == 3 * 7
    plt.close(fig)


def test_live_and_replayed_update_times_are_apart_with_the_reason(tmp_path):
    fig = report.updates_figure(plt, synthetic(tmp_path))
    live, replayed = fig.axes
    assert "Live" in live.get_title() and "(2 updates)" in live.get_title()
    assert "Replayed" in replayed.get_title() and "3 updates of 2 turbines" in replayed.get_title()
    assert [round(bar.get_height()) for bar in live.patches] == [80, 50]
    assert len(replayed.patches) == 6
    assert any("smaller than live" in text.get_text() for text in fig.texts)
    plt.close(fig)


def test_the_report_names_no_absolute_path(tmp_path):
    run = tmp_path / "out" / "windfarm" / "run1"
    path = report.write_report(synthetic(run), run)
    text = path.read_text()
    assert str(tmp_path) not in text and "`/" not in text
    assert "`agents`" in text and "`broker/mosquitto.log`" in text
    assert report.REPLAY_NOTE in text
    for plot in report.PLOTS.values():
        assert (run / plot).stat().st_size > 10_000


def test_event_latencies_are_per_diagnosis_from_the_reading_to_broker_and_cloud(tmp_path):
    result = synthetic(tmp_path)
    farm = result.sim.farm
    result.diagnosis_events = [
        # reading sent at 100.0; at the broker 0.2 s later, kept by the cloud 0.25 s later
        DiagnosisEvent(farm.broken, SENSOR_ANOMALY, "bundle", 100.0, 100.2, 100.25),
        DiagnosisEvent(farm.warm, CHANGE_CONFIRMED, "bundle", 200.0, 200.1, 200.4),
        DiagnosisEvent(farm.warm, CHANGE_CONFIRMED, "readings", 300.0, 300.03, 300.05),
        DiagnosisEvent(farm.warm, CHANGE_CONFIRMED, "readings", 400.0, 400.01, None),
        DiagnosisEvent(farm.warm, CHANGE_CONFIRMED, "bundle", None, 500.0, 500.1),
    ]
    lines = report.event_latency_lines(result)
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line for line in lines}
    broken = rows[(SENSOR_ANOMALY, farm.broken, "bundle")]
    assert broken.split("|")[4:9] == [" 1 ", " 200.0 ", " 200.0 ", " 250.0 ", " 250.0 "]
    bundle = rows[(CHANGE_CONFIRMED, farm.warm, "bundle")]
    assert bundle.split("|")[4:9] == [" 2 ", " 100.0 ", " 100.0 ", " 400.0 ", " 400.0 "]
    readings = rows[(CHANGE_CONFIRMED, farm.warm, "readings")]
    # p50 of two samples is their mean; the cloud saw only one of them
    assert readings.split("|")[4:9] == [" 2 ", " 20.0 ", " 30.0 ", " 50.0 ", " 50.0 "]
    assert "1 of 5 diagnoses could not be traced back to a reading" in lines[-1]
    assert "`received_at`" in lines[0] and "Sample counts are diagnoses" in lines[0]
    text = report.write_report(result, tmp_path).read_text()
    assert broken in text
    result.diagnosis_events = []
    assert "| none | - | - | 0 |" in "\n".join(report.event_latency_lines(result))
