"""What `sqlqueue stats` and `sqlqueue metrics` report, read once: a row per queue (STATS_COLUMNS)
and an error queue's failures by ``NServiceBus.FailedQ``. Both commands take their numbers from
here, so a dashboard and ``stats --json`` always agree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..dialects import Dialect, QueueAddress
from ..errors import ConfigError
from ..transport.delayed import DelayedTableRule
from ..transport.receiving.prepared import GID_PREFIX, PreparedClaim, consumer_tokens, on_server
from ..transport.settings import DEFAULT_ERROR_QUEUE
from ..wire import H, decode_headers, parse_time
from .db import CommandDb

__all__ = ["STATS_COLUMNS", "NO_FAILED_Q", "Snapshot", "all_stats", "queue_stats", "failures", "prepared_claims",
           "server_dialect", "take_snapshot"]

#: the columns of `sqlqueue stats`, always all of them in this order (- where a queue has no such table)
STATS_COLUMNS = ("queue", "messages", "backlog_span", "expired", "oldest_age_s", "delayed_due", "delayed_pending",
                 "claimed", "prepared", "outbox")

#: what failures are counted under whose headers name no FailedQ (not a JSON object, or no such header)
NO_FAILED_Q = "(none)"


@dataclass
class Snapshot:
    """One round of queries: the stats rows, and per error queue its failures by FailedQ."""

    queues: list[dict[str, Any]]
    failures: dict[str, dict[str, int]] = field(default_factory=dict)


def all_stats(s: CommandDb, queues: Sequence[str], rule: DelayedTableRule) -> list[dict[str, Any]]:
    """A stats row per queue given, or per queue table of the database when none is."""
    names = queues or [s.d.format_address(QueueAddress(str(table), str(schema)))
                       for schema, table in s.all(s.d.list_queues())]
    held = prepared_claims(s)
    return [queue_stats(s, q, rule, prepared=held) for q in names]


def prepared_claims(s: CommandDb) -> list[PreparedClaim] | None:
    """Every claim of ours held by a prepared transaction in the database (`PreparedClaim`, with
    its age), one statement for all queues; None where the database has none (SQL Server)."""
    if not s.d.prepared_claims:
        return None
    return [p.claim for p in on_server(s.all(s.d.list_prepared(GID_PREFIX))) if p.claim is not None]


def _prepared_by_consumer(claims: list[PreparedClaim], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Prepared claims per consumer: how many, up to how many messages (the claim numbers they
    span: expired rows, poison and gaps in the sequence make it fewer) and the oldest's age. A
    consumer is named as the claim table names it where one of `names` has its gid's token."""
    named = {token: n for n in names for token in consumer_tokens(n)}
    out: dict[str, dict[str, Any]] = {}
    for c in sorted(claims, key=lambda c: c.first):
        entry = out.setdefault(named.get(c.consumer, c.consumer), {"claims": 0, "messages_up_to": 0, "oldest_age_s": 0.0})
        entry["claims"] += 1
        entry["messages_up_to"] += c.last - c.first + 1
        entry["oldest_age_s"] = max(entry["oldest_age_s"], round(c.age, 1))
    return dict(sorted(out.items()))


def _companion(s: CommandDb, address: QueueAddress, suffix: str) -> QueueAddress | None:
    """``<queue>.<suffix>``, or None where that name would be too long for the database (a queue
    name within a few bytes of its limit): such a table cannot exist."""
    try:
        return s.d.companion(address, suffix)
    except ConfigError:
        return None


def queue_stats(s: CommandDb, text: str, rule: DelayedTableRule, *,
                prepared: list[PreparedClaim] | None = None) -> dict[str, Any]:
    """One queue's stats row: every column of STATS_COLUMNS, None where it has no such table.
    The oldest age is the oldest row's ``NServiceBus.TimeSent`` header: queue tables have no time
    column (None where that header is missing or unreadable). `prepared`: the database's prepared
    claims (`prepared_claims`), read here when not given; a claim's gid names its claim table by id."""
    address = s.queue(text)
    messages, expired, low, high = s.one(s.d.queue_stats(address))
    record: dict[str, Any] = dict.fromkeys(STATS_COLUMNS)
    record.update({
        "queue": s.d.format_address(address),
        "messages": int(messages or 0),
        "backlog_span": int(high - low + 1) if low is not None else 0,
        "expired": int(expired or 0),
    })
    oldest = s.all(s.d.oldest_headers(address))
    if oldest:
        sent = parse_time((decode_headers(oldest[0][0]) or {}).get(H.TIME_SENT))
        if sent is not None:
            record["oldest_age_s"] = round((datetime.now(timezone.utc) - sent).total_seconds(), 1)
    try:
        delayed: QueueAddress | None = rule.table_for(s.d, address)
    except ConfigError:  # a queue name too long to have one
        delayed = None
    if delayed is not None and s.exists(delayed):
        due, pending, _ = s.one(s.d.delayed_stats(delayed))
        record["delayed_due"], record["delayed_pending"] = int(due or 0), int(pending or 0)
    claims = _companion(s, address, "Claims")
    if claims is not None and s.exists(claims):
        record["claimed"] = {str(consumer): int(n) for consumer, n, _ in s.all(s.d.claim_stats(claims))}
        held = prepared_claims(s) if prepared is None else prepared
        if held is not None:
            mine: list[PreparedClaim] = []
            if held:
                (table_id,) = s.one(s.d.table_id(claims))
                mine = [c for c in held if table_id is not None and c.table == str(int(table_id))]
            record["prepared"] = _prepared_by_consumer(mine, list(record["claimed"]))
    outbox = _companion(s, address, "Outbox")
    if outbox is not None and s.exists(outbox):
        (outbox_rows,) = s.one(s.d.count_rows(outbox))
        record["outbox"] = int(outbox_rows)
    return record


def take_snapshot(s: CommandDb, queues: Sequence[str], rule: DelayedTableRule, error_queues: Sequence[str], *,
                  failures_limit: int) -> Snapshot:
    """One round: the stats rows of `queues` (every queue table when none is given) and the
    failures of each error queue; with no error queue given, of ``error`` where that table exists."""
    out = Snapshot(all_stats(s, queues, rule))
    if error_queues:
        targets = [s.queue(q, option="--error-queue") for q in error_queues]
    else:
        default = s.address(DEFAULT_ERROR_QUEUE, option="--error-queue")
        targets = [default] if s.exists(default) else []
    if targets:
        d = server_dialect(s, targets[0])
        for address in targets:
            out.failures[s.d.format_address(address)] = failures(s, d, address, limit=failures_limit)
    return out


def server_dialect(s: CommandDb, near: QueueAddress) -> Dialect:
    """The command's dialect as the server asks for it (PostgreSQL before 16 reads headers
    without pg_input_is_valid): `adapt_to_server`, the one place that decides it."""
    check = s.d.server_check()
    if check is None:
        return s.d
    (version,) = s.one(check)
    adapted, _ = s.d.adapt_to_server(int(version), near)
    return adapted


def failures(s: CommandDb, d: Dialect, error_queue: QueueAddress, *, limit: int) -> dict[str, int]:
    """The oldest `limit` messages of an error queue by FailedQ, the value as canonical as the
    dialect can name it (an address that does not parse stays as written); NO_FAILED_Q for rows
    that name none."""
    out: dict[str, int] = {}
    for value, n in s.all(d.failure_stats(error_queue, limit=limit)):
        text = d.failed_q_value(value)
        name = NO_FAILED_Q if text is None or not text.strip() else _canonical(d, text)
        out[name] = out.get(name, 0) + int(n)
    return out


def _canonical(d: Dialect, text: str) -> str:
    try:
        return d.format_address(d.parse_address(text, option="NServiceBus.FailedQ"))
    except ConfigError:
        return text
