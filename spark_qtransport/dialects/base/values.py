"""The values dialects hand out and take: addresses, statements, claim results, staged columns."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError

__all__ = ["QueueAddress", "Statement", "ClaimFailures", "ClaimResult", "STAGED_COLUMNS", "TABLE_PRIVILEGES", "NUMBER_BASE",
           "MARK", "AFTER_MARK",
           "check_privileges", "one_line"]


#: columns of a staged row, in the order executors write them (see `Dialect.stage_rows`)
STAGED_COLUMNS = (
    "sink", "batch_id", "attempt", "kind", "route", "message_id", "headers", "body", "ttbr_ms", "delay_ms", "due",
)


#: claim numbers of ours start above this: the claim table's identity never gets there, so a
#: checkpoint's numbers say which numbering it uses, and a run that numbers its own claims
#: continues above any identity number a table-mode run gave
NUMBER_BASE = 2**62

#: the claim table's rows that are not claims, by their `consumer` (a control character no
#: endpoint's name begins with, `claim_stats` leaves them out): a prepared claim's
#: after-processing progress (AFTER_MARK + the consumer: claim_seq its first number, source_seq the
#: last number whose audit/forwardTo copies are written: `transport.receiving.prepared.note_progress`,
#: `transport.receiving.chunks.Chunks.held`). An earlier version also kept the prepared claims the
#: sink failed here (MARK + "failed"); every claim statement passes such rows by, as any MARK row.
MARK = "\x1f"
AFTER_MARK = MARK + "after "


#: the table privileges the connector ever needs (and `Dialect.grants` / `Dialect.privileges` take)
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


def check_privileges(privileges: Sequence[str]) -> tuple[str, ...]:
    """Privilege names, upper-cased, each one of `TABLE_PRIVILEGES` (they are written into SQL)."""
    out = tuple(str(p).upper() for p in privileges)
    bad = [p for p in out if p not in TABLE_PRIVILEGES]
    if bad or not out:
        raise ConfigError(f"table privileges must be some of {', '.join(TABLE_PRIVILEGES)}, not {list(privileges)!r}")
    return out


@dataclass(frozen=True)
class QueueAddress:
    """A parsed, unquoted queue address. ``schema``/``catalog`` are None for the connection's default."""

    table: str
    schema: str | None = None
    catalog: str | None = None

    def with_table(self, table: str) -> QueueAddress:
        return QueueAddress(table, self.schema, self.catalog)

    def __str__(self) -> str:
        parts = [p for p in (self.catalog, self.schema, self.table) if p is not None]
        return ".".join(parts)


@dataclass(frozen=True)
class Statement:
    """One SQL statement: text plus bound parameters (a dict for psycopg, a tuple for pyodbc).

    `counted`: the rows the statement wrote are the first value of its one result row, not the
    driver's rowcount (a batch of several bounded writes, whose rowcount would be the first's)."""

    sql: str
    params: Any = field(default=None)
    counted: bool = False


@dataclass(frozen=True)
class ClaimResult:
    """What one claim transaction did."""

    deleted: int  # rows removed from the queue
    expired: int  # of which expired, dropped and counted
    poison: int  # of which moved raw to the error queue
    claimed: int  # of which inserted into the claim table
    max_claim: int | None  # highest claim sequence inserted, None if none
    max_source: int | None  # highest queue sequence seen, None if none
    min_claim: int | None = None  # lowest claim sequence inserted, None if none
    forward: int = 0  # claimed rows whose headers may name a ForwardDestination (text match)
    null_id: int = 0  # of which moved to the error queue with failure headers: no native id
    far_expires: int = 0  # of which moved to the error queue with failure headers: Expires beyond LATEST_TIME

    @property
    def dead_lettered(self) -> dict[str, int]:
        """Rows moved to the error queue with failure headers, per reason (column): none when empty."""
        return {k: v for k, v in (("id", self.null_id), ("expires", self.far_expires)) if v}


@dataclass(frozen=True)
class PickedRows:
    """The queue rows a numbered claim takes, picked and locked first (`ReceiveSql.pick`), their
    headers judged by the driver by the rule every read judges by (`wire.decode_header_texts`):
    the database parses no header (a jsonb parse cost it 6 µs of the 11 a prepared claim cost)."""

    seqs: list[int]  # every row picked, in order
    poison: list[int]  # of which the headers are poison (they go raw to the error queue)
    forward: list[int]  # of the rest, those with a ForwardDestination header
    #: any of the rest needs the claim table's machinery (a ForwardDestination, a retry acknowledgement)
    special: bool
    #: any row neither poison nor expired has a value no reader could take (no id, a far Expires)
    odd: bool = False


@dataclass(frozen=True)
class ClaimNumbering:
    """Claim numbers of ours instead of the claim table's identity: a claimed row is numbered
    ``first + (its seq - the lowest seq the claim picked)``. `prepared`: the claim is to be held by
    a prepared transaction, so its rows go into the claim table only when one of them needs the
    claim table's machinery (`picked.special`); else always. `picked`: the rows it takes."""

    first: int
    prepared: bool
    picked: PickedRows
    #: a run's first claim (None: later ones): its numbers begin at least at `clock_base` plus the
    #: database server's clock in microseconds since 1970 times `NUMBERS_PER_MICROSECOND`. A new
    #: run cannot always know where the checkpoint left off (Spark 4.0/4.1 give the first batch no
    #: start) and its previous run's claims may all be committed, leaving no trace: numbering from
    #: the last number known would reuse the checkpoint's numbers, and the acknowledgement of the
    #: checkpoint's last batch would then commit the new claim undelivered. One clock for every
    #: driver: numbers of a later run start above any a run before used, as long as the queue's
    #: sequence grows slower than 512 a microsecond (and the server's clock does not step back)
    clock_base: int | None = None


#: how many claim numbers a microsecond of the server's clock is worth (`ClaimNumbering.clock_base`):
#: numbers above 2**62 stay below 2**63 until about the year 2255
NUMBERS_PER_MICROSECOND = 512


#: the latest time Python's datetime (and so a Spark timestamp handed to Python) can hold; a queue
#: row's Expires after it (PostgreSQL's timestamp goes to year 294276) cannot be delivered
LATEST_TIME = "9999-12-31 23:59:59.999999"

#: the exception type in the failure headers of a queue row the claim could not accept for a value
ODD_VALUE_TYPE = "spark_qtransport.MessageError"


@dataclass(frozen=True)
class ClaimFailures:
    """The failure headers (JSON text of a flat object) a claim merges, server-side, into the
    headers of a row it moves to the error queue because of a value: built once per claim, in
    Python, by `wire.failure_headers` (the one builder). `slot` stands, in `far_expires`, for the
    row's Expires, which the server writes in."""

    null_id: str
    far_expires: str
    slot: str

    @classmethod
    def build(cls, *, failed_q: str, endpoint: str) -> ClaimFailures:
        from ...wire import encode_headers, failure_headers

        slot = f"{{expires:{uuid.uuid4().hex}}}"

        def headers(message: str) -> str:
            return encode_headers(failure_headers({}, failed_q=failed_q, exception_type=ODD_VALUE_TYPE,
                                                  message=message, source="spark_qtransport.claim", endpoint=endpoint))

        return cls(
            null_id=headers(
                f"column id is NULL: a queue row needs its native id (NServiceBus's queue table declares id NOT NULL);"
                f" the message was moved to the error queue with a new id when {failed_q} was received"),
            far_expires=headers(
                f"column expires holds {slot}, after {LATEST_TIME}, the latest time Python and Spark can hold;"
                f" the message was moved to the error queue without an expiry when {failed_q} was received"),
            slot=slot,
        )


def one_line(text: str) -> str:
    """The first non-blank line of an error's text, whitespace collapsed, passwords masked: a
    driver's later lines may quote the statement or the row at fault."""
    from ...connections import mask

    for line in text.splitlines():
        if line.strip():
            return mask(" ".join(line.split()))
    return ""
