"""Progress a person can follow: one line per micro-batch, and a summary of every batch of the run.

The jobs wait on their query with `follow` instead of ``awaitTermination()``: it polls the query's
recent progress reports (plain API calls, so it works over Spark Connect as well as on classic
Spark) and prints each batch once, as it finishes::

    batch 3: 10,000 messages in 0.84 s (11,905 msg/s), backlog 40000

The summary counts every batch seen, not only the last 100 reports Spark keeps.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["RunSummary", "follow", "line"]


@dataclass
class RunSummary:
    batches: int = 0
    messages: int = 0
    seconds: float = 0.0
    #: the signal that stopped the run (`_stops`), or None
    stopped: str | None = None

    def __str__(self) -> str:
        rate = self.messages / self.seconds if self.seconds else 0.0
        return (f"{plural(self.messages, 'message')} in {plural(self.batches, 'micro-batch', 'micro-batches')}, "
                f"{self.seconds:.1f} s ({per_second(rate)})")

    @property
    def outcome(self) -> str:
        """``done: ...`` or, after a signal, ``stopped (Ctrl-C): ...; the checkpoint resumes the rest``."""
        if self.stopped is None:
            return f"done: {self}"
        return f"stopped ({self.stopped}): {self}; the next run resumes from the checkpoint"


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def per_second(rate: float) -> str:
    """A rate as people read it: whole numbers from 100 up, one decimal below."""
    return f"{rate:,.0f} msg/s" if rate >= 100 or rate == 0 else f"{rate:.1f} msg/s"


def _get(report: Any, key: str, default: Any = None) -> Any:
    try:
        value = report[key]
    except (KeyError, TypeError, IndexError):
        return default
    return default if value is None else value


def _backlog(report: Any) -> Any:
    """The queue's backlog our source reports with its latest offset (None if it does not)."""
    for source in _get(report, "sources", []) or []:
        offset = _get(source, "latestOffset")
        if isinstance(offset, str):
            try:
                offset = json.loads(offset)
            except ValueError:
                continue
        if isinstance(offset, dict) and "backlog" in offset:
            return offset["backlog"]
    return None


def line(report: Any) -> str:
    """One progress report as a line: rows, batch duration, rate, backlog."""
    rows = int(_get(report, "numInputRows", 0))
    ms = int(_get(report, "batchDuration", 0) or _get(_get(report, "durationMs", {}), "triggerExecution", 0))
    rate = rows / (ms / 1000) if ms else 0.0
    backlog = _backlog(report)
    return (f"batch {_get(report, 'batchId')}: {plural(rows, 'message')} in {ms / 1000:.2f} s ({per_second(rate)})"
            + (f", backlog {backlog}" if backlog is not None else ""))


def follow(query: Any, *, poll: float = 1.0, out: Any = None) -> RunSummary:
    """Wait for `query` to end, printing a line per finished batch; the run's summary. Raises
    what the query failed with, as ``awaitTermination()`` does. After Ctrl-C or SIGTERM
    (`_stops`) the query is stopped between two polls, and the summary says so."""
    import sys

    out = out or sys.stdout
    summary, seen, started = RunSummary(), set(), time.monotonic()

    def report_new() -> None:
        for report in query.recentProgress:
            batch, rows = _get(report, "batchId"), int(_get(report, "numInputRows", 0))
            if rows == 0 or batch in seen:  # no-data reports, and batches already printed
                continue
            seen.add(batch)
            summary.batches += 1
            summary.messages += rows
            print(line(report), file=out, flush=True)

    from _stops import STOPS, stop_query

    STOPS.running = True
    try:
        while not query.awaitTermination(poll):
            report_new()
            if STOPS.requested:
                stop_query(query)
                break
    except Exception:
        if not STOPS.requested:
            raise  # the query failed; after a signal it ended as asked (`_stops.gated`)
    finally:
        STOPS.running = False
        report_new()
        summary.seconds = time.monotonic() - started
        summary.stopped = STOPS.name if STOPS.requested else None
    return summary
