"""Staged roll-outs and dry runs for ``zodiac-cloud publish`` (docs/operations.md).

A staged roll-out sends a stream's bundle to a few *canary* devices first and waits until each
reports it applied and ready; only then are the other devices sent theirs. The first canary
that refuses the bundle (a bad rule, a budget verdict), does not become ready, or does not
answer stops the roll-out there: the other devices are never sent it, and the publisher says
which device stopped it and why.

A dry run sends each device the bundle it would get, marked ``dry_run``: the device applies
it in a transaction it rolls back and answers in its status (agent/budgets/dry_runs.py); the
answers are printed as one table.
"""

from __future__ import annotations

from agent.protocol.messages import DryRunReport
from cloud.status_wait import Answer, last_error_fields

# Predicates named per device in the dry-run table (the status lists up to 50, largest first).
TABLE_PREDICATES = 3


def canary_split(
    devices: list[str], canary: int | None, canary_devices: list[str] | None
) -> tuple[list[str], list[str]]:
    """The canaries and the rest: ``canary_devices`` when given (each must be among
    ``devices``), else the first ``canary`` devices by id. Raises ValueError when there would
    be no canary, or nothing left after them."""
    unique = list(dict.fromkeys(devices))
    if canary_devices:
        unknown = [d for d in canary_devices if d not in unique]
        if unknown:
            raise ValueError(f"--canary-devices {' '.join(unknown)}: not among --devices")
        chosen = list(dict.fromkeys(canary_devices))
    else:
        if canary is None or canary < 1:
            raise ValueError(f"--canary must be at least 1, got {canary}")
        if canary >= len(unique):
            raise ValueError(
                f"--canary {canary}: only {len(unique)} devices; canaries must leave some "
                "devices for after them"
            )
        chosen = sorted(unique)[:canary]
    return chosen, [d for d in unique if d not in chosen]


def not_ready(answer: Answer, source: str) -> str | None:
    """Why a device that answered a bundle on ``source`` is not ready (None: it is). Ready
    means: it applied the version, is online, reports no error about the stream, and its own
    readiness verdict (the status's ``health``, docs/operations.md) says ready."""
    if answer.outcome == "refused":
        return f"refused: {answer.reason}: {answer.message}"
    if answer.outcome != "applied" or answer.status is None:
        return "no answer (is the agent running and connected?)"
    status = answer.status
    if not status.online:
        return "offline"
    error = last_error_fields(status.last_error)
    if error.get("stream") == source:
        return f"reports an error on the stream: {error.get('reason')}: {error.get('message')}"
    if status.health is not None and not status.health.ready:
        return "not ready: " + ("; ".join(status.health.reasons) or "no reason given")
    return None


def _changes(report: DryRunReport) -> str:
    parts = [f"{p.predicate} {p.after - p.before:+d}" for p in report.predicates[:TABLE_PREDICATES]]
    more = len(report.predicates) - TABLE_PREDICATES + report.predicates_omitted
    if more > 0:
        parts.append(f"+{more} more")
    return ", ".join(parts) or "-"


def _watched(report: DryRunReport) -> str:
    if not report.watched:
        return "-"
    appeared = sum(w.appeared for w in report.watched)
    disappeared = sum(w.disappeared for w in report.watched)
    return f"+{appeared} -{disappeared}"


def dry_run_row(answer: Answer) -> list[str]:
    """One device's row of the dry-run table."""
    report = answer.dry_run
    if report is None:
        verdict = answer.reason if answer.outcome == "refused" else answer.outcome
        return [answer.device, verdict, "-", "-", "-", "-", "-"]
    verdict = report.verdict
    if report.budget:
        verdict += f" ({report.budget.get('limit')}: {report.budget.get('used')} > "
        verdict += f"{report.budget.get('allowed')})"
    return [
        answer.device,
        verdict,
        f"{report.facts_before} -> {report.facts_after}",
        _changes(report),
        _watched(report),
        f"{report.seconds * 1000:.0f} ms",
        _megabytes(report.memory_bytes),
    ]


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count / 1e3:.0f} kB"


HEADER = ["device", "verdict", "facts", "changes per predicate", "watched", "time", "memory"]


def table(rows: list[list[str]]) -> str:
    """Rows under :data:`HEADER`, columns padded to their widest cell."""
    every = [HEADER, *rows]
    widths = [max(len(row[i]) for row in every) for i in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in every
    ]
    return "\n".join(lines)


def would_apply(answer: Answer) -> bool:
    return answer.dry_run is not None and answer.dry_run.verdict == "would apply"
