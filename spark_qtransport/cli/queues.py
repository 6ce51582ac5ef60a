"""Looking at queues and keeping them: peek, stats (once or --watch), purge-expired, doctor."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import click

from ..transport.delayed import DelayedTableRule
from ..transport.operations.doctor import check_prepared, check_queue, check_server
from ..transport.settings import DEFAULT_PREPARED_TIMEOUT
from ..wire import H, decode_headers
from .app import delayed_options, flag_value, main, registered, url_option
from .db import CommandDb, Peeked, PeekedDelayed, open_db
from .output import echo, json_option, show, show_json_line
from .snapshot import STATS_COLUMNS, all_stats

__all__ = ["STATS_COLUMNS", "peek", "stats", "purge_expired", "doctor"]


@main.command("peek")
@click.argument("queue")
@click.option("-n", "--count", default=10, show_default=True, type=click.IntRange(1, 10_000), help="messages to show")
@url_option
@json_option
def peek(queue: str, count: int, url: str | None, as_json: bool) -> None:
    """Show the oldest messages of a queue without taking them: ids, type, CorrelationId,
    Expires, the first 60 characters of the body (--json: all headers, the body's length in bytes
    and whether the preview is cut). Only the start of each body is read from the database.
    Given an endpoint's delayed table (Sales.Delayed), the messages due soonest: when each is due
    and the queue it goes to then.

    \b
    Examples:
      sqlqueue peek Sales -n 5 --json
      sqlqueue peek Sales.Delayed
    """
    with open_db(url) as s:
        address, delayed = s.peekable(queue)
        messages: Sequence[Peeked | PeekedDelayed] = (
            s.peek_delayed(address, limit=count) if delayed else s.peek(address, limit=count))
    out = []
    for m in messages:
        headers = decode_headers(m.headers)
        record: dict[str, Any] = {}
        if isinstance(m, PeekedDelayed):
            due = m.due.replace(tzinfo=timezone.utc) if isinstance(m.due, datetime) and m.due.tzinfo is None else m.due
            record.update(due=due, destination=(headers or {}).get(H.FORWARD_DESTINATION))
        else:
            record.update(seq=m.seq, native_id=str(m.native_id).lower())
        record.update({
            "message_id": (headers or {}).get(H.MESSAGE_ID),
            "type": (headers or {}).get(H.ENCLOSED_MESSAGE_TYPES),
            "correlation_id": (headers or {}).get(H.CORRELATION_ID),
        })
        if isinstance(m, Peeked):
            record["expires"] = m.expires
        record["body"] = m.preview
        if as_json:
            record["headers"] = headers if headers is not None else {"(not a flat JSON object)": m.headers}
            record["body_bytes"] = m.body_bytes
            record["body_truncated"] = m.cut
        out.append(record)
    show(out, as_json)


@main.command("stats")
@click.argument("queues", nargs=-1)
@click.option("--watch", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="refresh every SECONDS until interrupted, with the time and each queue's rate")
@delayed_options
@url_option
@json_option
def stats(queues: tuple[str, ...], watch: float | None, delayed_suffix: str | None, delayed_table: str | None,
          url: str | None, as_json: bool) -> None:
    """Counts per queue: messages (counted), backlog span, expired, oldest age, delayed due/pending,
    claimed-but-unacknowledged per endpoint, claims held by prepared transactions per endpoint
    (PostgreSQL: how many, up to how many messages, the oldest's age; their messages still count
    in messages), outbox records. Without QUEUE: every queue table of the database. The columns
    are always these, in this order; - where a queue has no .Delayed, .Claims or .Outbox table
    (prepared: on SQL Server too). With --watch, rate_per_s is the change of messages per second
    since the previous refresh (negative: the queue drains).

    \b
    Examples:
      sqlqueue stats
      sqlqueue stats Sales Billing Shop.Web
      sqlqueue stats Sales --watch 2
    """
    with open_db(url) as s:
        rule = s.delayed_rule(delayed_table, delayed_suffix, names=len(queues))
        if not watch:
            rows = all_stats(s, queues, rule)
            show(rows if as_json else [_stats_text(r) for r in rows], as_json)
            return
        try:
            _watch(s, queues, rule, watch, as_json)
        except KeyboardInterrupt:
            return


def _watch(s: CommandDb, queues: tuple[str, ...], rule: DelayedTableRule, every: float, as_json: bool) -> None:
    """Stats every `every` seconds, with the time and each queue's rate, until interrupted."""
    before: dict[str, tuple[float, int]] = {}  # queue -> (when, messages) at the previous refresh
    while True:
        rows = all_stats(s, queues, rule)
        now, at = time.monotonic(), datetime.now(timezone.utc)
        for r in rows:
            last = before.get(r["queue"])
            r["rate_per_s"] = round((r["messages"] - last[1]) / (now - last[0]), 1) if last else None
            before[r["queue"]] = (now, r["messages"])
        stamp = at.isoformat(timespec="seconds").replace("+00:00", "Z")
        if as_json:
            show_json_line({"time": stamp, "queues": rows})
        else:
            click.clear()
            echo(f"{stamp}  every {every:g}s (Ctrl-C stops)")
            show([_stats_text(r) for r in rows], as_json)
        time.sleep(every)


def _stats_text(row: dict[str, Any]) -> dict[str, Any]:
    """A stats row for the table: claims as `Sales.Analytics=120, Other=3`, prepared claims as
    `Sales.Analytics=2 (up to 200, 3.1s)`: claims, up to how many messages, the oldest's age (- when none)."""
    claimed = row.get("claimed")
    text = ", ".join(f"{c}={n}" for c, n in claimed.items()) if claimed else None
    prepared = row.get("prepared")
    held = ", ".join(f"{c}={p['claims']} (up to {p['messages_up_to']}, {p['oldest_age_s']:.1f}s)"
                     for c, p in prepared.items()) if prepared else None
    rate = row.get("rate_per_s")
    return {**row, "claimed": text, "prepared": held, **({"rate_per_s": f"{rate:+g}"} if rate is not None else {})}


@main.command("purge-expired")
@click.argument("queue")
@click.option("--batch", default=10_000, show_default=True, type=click.IntRange(1, 100_000), help="rows per DELETE")
@url_option
@json_option
def purge_expired(queue: str, batch: int, url: str | None, as_json: bool) -> None:
    """Delete expired messages (past their time to be received) in batches; others are untouched.

    \b
    Example:
      sqlqueue purge-expired Sales
    """
    total = 0
    with open_db(url) as s:
        address = s.queue(queue)
        while True:
            n = s.rowcount(s.d.purge_expired(address, limit=batch))
            total += n
            if n < batch:
                break
        name = s.d.format_address(address)
    show([{"queue": name, "purged": total}], as_json)


@main.command("doctor")
@click.argument("queues", nargs=-1, required=True)
@registered("--prepared-timeout", "DURATION", "PostgreSQL: a prepared transaction older than this is reported "
            f"(30s, 5m); default {DEFAULT_PREPARED_TIMEOUT:g}s")
@delayed_options
@url_option
@json_option
def doctor(queues: tuple[str, ...], prepared_timeout: str | None, delayed_suffix: str | None,
           delayed_table: str | None, url: str | None, as_json: bool) -> None:
    """Check queue tables as NServiceBus does at start-up (Headers type, Expires index, clustered
    RowVersion, int4 seq near exhaustion, Recoverable), columns that allow NULL where NServiceBus
    declares NOT NULL, names too long for the tables of ours beside a queue, and those tables, and what the server
    must offer (SQL Server: database compatibility level 130, an error below; PostgreSQL: a
    TimeZone other than UTC, a warning: it shifts delayed messages' Due). PostgreSQL's WAL settings,
    as information: checkpoint_timeout under 15min or max_wal_size under 4GB (each checkpoint makes
    the next change to every queue page write the whole page to WAL), wal_compression off where
    the server has lz4 or zstd. PostgreSQL's prepared transactions: a claim of ours prepared more
    than --prepared-timeout ago (its stream stopped or hangs) and any other as old, warnings (each
    holds vacuum back); max_prepared_transactions too low for prepared claims on the queues given
    that have a claim table, as information (their claims are written to the claim table as well).
    Exit 1 on errors.

    \b
    Example:
      sqlqueue doctor Sales Billing error
    """
    timeout = flag_value("--prepared-timeout", prepared_timeout)
    with open_db(url) as s:
        addresses = [s.address(q, option="QUEUE") for q in queues]
        rule = s.delayed_rule(delayed_table, delayed_suffix, names=len(queues))
        findings = s.run(lambda conn: check_server(conn.cursor(), s.d, addresses)
                         + check_prepared(conn.cursor(), s.d, addresses, timeout=timeout)
                         + [f for a in addresses for f in check_queue(conn.cursor(), s.d, a, delayed=rule)])
    show([{"level": f.level, "table": f.table, "finding": f.message} for f in findings], as_json)
    if any(f.level == "error" for f in findings):
        sys.exit(1)
