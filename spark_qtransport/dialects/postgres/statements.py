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
