"""What the PostgreSQL statements of several features share: the UTC clocks of Expires and Due,
bounded deletes, pages of reads, and literals for scripts people read."""

from __future__ import annotations

from typing import Any

from ..base import Statement

#: the current time as the wall-clock UTC ``timestamp`` NServiceBus writes into Expires
UTC_NOW = "(now() AT TIME ZONE 'UTC')"

#: "now" as NServiceBus writes it into a delayed table's Due (timestamptz): the UTC wall clock read
#: back as a time in the session's TimeZone (StoreDelayedMessageText: `timestamptz (now() AT TIME
#: ZONE 'UTC') + ...`). Its mover compares `Due < now() AT TIME ZONE 'UTC'`, where the timestamp is
#: converted the same way, so stored and compared values agree whatever the TimeZone, as long as
#: the sessions share it. On a server whose TimeZone is not UTC such a Due, read as an instant, is
#: off by the zone's offset: every statement on Due uses these expressions, never now().
DUE_NOW = f"timestamptz {UTC_NOW}"


#: the native id of a claim table row that is not a claim (`values.MARK`)
NO_ID = "00000000-0000-0000-0000-000000000000"


def due_of(instant: str) -> str:
    """The Due NServiceBus would store for a given instant (a timestamptz expression)."""
    return f"timestamptz ({instant} AT TIME ZONE 'UTC')"


def instant_of(due: str) -> str:
    """The instant a Due means (the inverse of `due_of`): its wall clock, read as UTC."""
    return f"(({due})::timestamp AT TIME ZONE 'UTC')"


def literal(value: Any) -> str:
    """A literal for scripts people read and run (DO blocks take no parameters); the connector
    otherwise always binds parameters."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


#: The queue's statistics lag its backlog (a queue last analyzed empty and now holding a million
#: rows is estimated at a few thousand), and how many rows one xmax holds is a guess: left alone,
#: the planner may read and classify every row above `after` and sort them, seconds per claim or
#: per page of a read. Without bitmap and sequential scans it walks the seq index in order and
#: stops at the limit. LOCAL: the transaction only.
BY_INDEX = [Statement("SET LOCAL enable_seqscan = off"), Statement("SET LOCAL enable_bitmapscan = off")]


def copies(destination: str, source: str, alias: str, params: dict[str, Any], *, headers: list[str] | None,
           ttbr_ms: int | None) -> Statement:
    """INSERT copies of rows into the (quoted) `destination`, in the order of %(keys)s: `source`
    joins the row `alias` (id, headers, body) to each key `v.seq`; with `headers`, one text per key
    instead of the row's own. A new native id, as NServiceBus forwards: its receiver sends the
    message on as a new row (ProcessStrategy.TryHandleDelayedMessage -> TableBasedQueue.Send ->
    MessageRow.From, Guid.NewGuid()); no expiry (TimeSpan.MaxValue) unless a time to be received
    is given."""
    expires = "NULL" if ttbr_ms is None else f"{UTC_NOW} + %(ttbr_ms)s * interval '1 millisecond'"
    params = {**params, "ttbr_ms": ttbr_ms}
    if headers is None:
        keys, text = "unnest(%(keys)s::bigint[]) WITH ORDINALITY AS v(seq, n)", f"{alias}.headers"
    else:
        keys, text = "unnest(%(keys)s::bigint[], %(headers)s::text[]) WITH ORDINALITY AS v(seq, headers, n)", "v.headers"
        params["headers"] = list(headers)
    return Statement(
        f"INSERT INTO {destination} (id, expires, headers, body)"
        f" SELECT gen_random_uuid(), {expires}, {text}, {alias}.body FROM {keys} {source} ORDER BY v.n", params)


def page(limit: int | None) -> str:
    """The LIMIT of a page of a slice's read (`ReceiveSql.read_in_pages`), bound as %(limit)s."""
    return "" if limit is None else " LIMIT %(limit)s"


#: Bounded deletes pick their rows once, by physical address, then delete exactly those
#: (`DELETE ... WHERE ctid = ANY(ARRAY(SELECT ctid ... LIMIT n))`): the array is computed once,
#: before the scan, whatever the statistics say. The common `WHERE key IN (SELECT key ... LIMIT n)`
#: is planned as a semi join, and on a table whose statistics say "one row" (last vacuumed empty)
#: as a nested loop that runs the LIMIT query again for every row: 290 s to acknowledge 10,000
#: claims. The delete is then a TID scan. Rows here are only inserted and deleted, never updated,
#: and a tuple our snapshot sees cannot be vacuumed away, so each ctid still names the row picked.
ROWS_OF = "ctid = ANY(ARRAY"
