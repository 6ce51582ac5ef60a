"""Claims held by prepared transactions (`claimMode`): what names one, and the registry of those a
consumer holds.

A prepared claim deletes its queue rows and ends with PREPARE TRANSACTION instead of COMMIT: the
rows are written once, by the delete, instead of three times (the claim table's insert, its delete
and the queue's delete). Until the acknowledgement's COMMIT PREPARED, every other transaction still
sees the rows, with the claim's transaction id as their `xmax`: that is how the executors read
exactly them, within the claim's sequence range; competing consumers skip them as any locked row.

Its global id (`PreparedClaim.gid`) names everything needed to read it again in another process:
the claim table, the consumer, the claim numbers it covers (a row is numbered ``first + seq -
low``: `ClaimNumbering`), its queue sequence range and the UTC clock it judged expiry by. A prepared
transaction holds vacuum back for the whole cluster, so none lives longer than the stream's bound
(`preparedClaimTimeout`): older ones are *parked*, their deliverable rows copied into the claim
table with the same numbers, then committed (`Parker`): the claim table's form, the only one on
SQL Server, is the durable one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ...dialects import NUMBER_BASE, Connection, Cursor, Dialect
from .. import session as db
from .judge import judged

if TYPE_CHECKING:
    from .setup import Endpoint

__all__ = ["GID_PREFIX", "NUMBER_BASE", "Prepared", "PreparedClaim", "commit", "consumer_token",
           "consumer_tokens", "forget_progress", "listed", "all_on_server", "note_progress", "on_server", "park", "prefix_of", "progress"]

#: every gid of a claim of ours starts with this
GID_PREFIX = "sqlqueue:"

_SAFE = re.compile(r"[A-Za-z0-9._-]{1,60}")
#: what was plain before underscores were (a claim such a version prepared still names its consumer so)
_SAFE_BEFORE = re.compile(r"[A-Za-z0-9.-]{1,60}")


def consumer_token(consumer: str) -> str:
    """The consumer as a gid may hold it: as it is when short and plain (so `sqlqueue stats`
    can name it: `queue_to_delta=2`), else a digest."""
    if _SAFE.fullmatch(consumer):
        return consumer
    return _digest(consumer)


def consumer_tokens(consumer: str) -> frozenset[str]:
    """Every token a gid of this consumer's claims may hold: `consumer_token`'s, and the digest
    that stood for a name with an underscore before (claims prepared by an earlier version)."""
    return frozenset({consumer_token(consumer), consumer if _SAFE_BEFORE.fullmatch(consumer) else _digest(consumer)})


def _digest(consumer: str) -> str:
    return "~" + hashlib.sha256(consumer.encode("utf-8")).hexdigest()[:32]


def prefix_of(table: str) -> str:
    """Every gid of claims on one claim table (its id, digits) starts with this."""
    return f"{GID_PREFIX}{int(table)}:"


@dataclass(frozen=True)
class PreparedClaim:
    """One claim held by a prepared transaction: numbers [first, last], queue rows [low, high]."""

    table: str  # the claim table's id
    first: int
    last: int
    low: int
    high: int
    clock: str  # the claim's UTC clock, 20 digits (YYYYMMDDHHMMSSffffff)
    consumer: str  # consumer_token
    xid: str = ""  # the transaction's id, from pg_prepared_xacts
    age: float = 0.0  # seconds since it was prepared, when listed
    #: this run made the claim and it holds no poison (the driver judged every row's headers):
    #: its rows' copies can be made on the server, unread (`chunks.Chunks.held`). A
    #: claim listed from the server is not known to be
    clean: bool = False

    @property
    def gid(self) -> str:
        return f"{prefix_of(self.table)}{self.first}:{self.last}:{self.low}:{self.high}:{self.clock}:{self.consumer}"

    @property
    def shift(self) -> int:
        """A row's claim number less its queue sequence."""
        return self.first - self.low

    @property
    def claimed(self) -> datetime:
        """The claim's UTC clock as a time."""
        return datetime.strptime(self.clock, "%Y%m%d%H%M%S%f").replace(tzinfo=timezone.utc)

    @property
    def claimed_at(self) -> str:
        """The claim's UTC clock as a timestamp literal."""
        c = self.clock
        return f"{c[0:4]}-{c[4:6]}-{c[6:8]} {c[8:10]}:{c[10:12]}:{c[12:14]}.{c[14:20]}"

    @classmethod
    def parse(cls, gid: str, *, xid: str = "", age: float = 0.0) -> PreparedClaim | None:
        """The claim a gid names, or None when it is not one of ours."""
        parts = gid.split(":")
        if len(parts) != 8 or parts[0] != "sqlqueue":
            return None
        try:
            table, first, last, low, high = (int(p) for p in parts[1:6])
        except ValueError:
            return None
        if len(parts[6]) != 20 or not parts[6].isdigit():
            return None
        return cls(str(table), first, last, low, high, parts[6], parts[7], xid, age)


@dataclass(frozen=True)
class Prepared:
    """A prepared transaction of this database, as `on_server` lists it."""

    gid: str
    age: float  # seconds since it was prepared
    #: the claim of ours it holds; None: not a claim of ours
    claim: PreparedClaim | None


def on_server(rows: Iterable[Sequence[Any]]) -> list[Prepared]:
    """The one reading of the server's prepared transactions: `rows` as `Dialect.list_prepared`
    returns them (gid, xid, prepared at, age), each with the claim of ours it holds. The stream
    (`listed`), `sqlqueue stats` and `sqlqueue doctor` read them so."""
    out = []
    for gid, xid, _at, age in rows:
        seconds = float(age or 0.0)
        out.append(Prepared(str(gid), seconds, PreparedClaim.parse(str(gid), xid=str(xid), age=seconds)))
    return out


def listed(endpoint: Endpoint, cur: Cursor, table: str, *, server: list[Prepared] | None = None) -> list[PreparedClaim]:
    """The prepared claims the endpoint's consumer holds on the server now, oldest first; from
    `server` if given (`all_on_server`, read in the caller's transaction: many queues' in one)."""
    tokens, prefix = consumer_tokens(endpoint.options.consumer), prefix_of(table)
    if server is None:
        server = on_server(db.rows(cur, endpoint.dialect.list_prepared(prefix)))
    found = [p.claim for p in server
             if p.gid.startswith(prefix) and p.claim is not None and p.claim.consumer in tokens]
    return sorted(found, key=lambda c: c.first)


def all_on_server(dialect: Dialect, cur: Cursor) -> list[Prepared]:
    """Every prepared transaction of ours in this database (`listed` of many queues from one reading:
    the server keeps a handful, `max_prepared_transactions`)."""
    return on_server(db.rows(cur, dialect.list_prepared(GID_PREFIX)))


def commit(conn: Connection, endpoint: Endpoint, claim: PreparedClaim) -> bool:
    """COMMIT PREPARED; False when it is gone already (committed or parked before)."""
    d = endpoint.dialect
    try:
        d.run_outside_transaction(conn, d.commit_prepared(claim.gid))
    except Exception as exc:
        if d.is_unknown_prepared(exc):
            return False
        raise
    return True


def progress(cur: Cursor, endpoint: Endpoint, claim: PreparedClaim) -> int:
    """The last number of `claim` whose after-processing (audit and forwardTo copies) is written:
    `claim.first - 1` when none is (`chunks.Chunks.held`)."""
    d, o = endpoint.dialect, endpoint.options
    row = db.first(cur, d.after_progress(endpoint.claims, o.consumer, first=claim.first))
    return claim.first - 1 if row is None else int(row[0])


def note_progress(cur: Cursor, endpoint: Endpoint, claim: PreparedClaim, done: int) -> None:
    """In the caller's transaction: `claim`'s after-processing is written up to number `done`."""
    d, o = endpoint.dialect, endpoint.options
    for stmt in d.note_progress(endpoint.claims, o.consumer, first=claim.first, done=done):
        db.execute(cur, stmt)


def forget_progress(conn: Connection, endpoint: Endpoint, claim: PreparedClaim) -> None:
    """`claim` is committed: its progress record goes (one that stays, the driver dying first, is
    deleted by the next one noted: `note_progress`)."""
    d, o = endpoint.dialect, endpoint.options
    db.execute(conn.cursor(), d.forget_progress(endpoint.claims, o.consumer, upto=claim.first))
    conn.commit()


def park(conn: Connection, endpoint: Endpoint, claim: PreparedClaim) -> None:
    """Move a prepared claim into the claim table: its deliverable rows are copied there with
    their numbers (one transaction, committed; a copy made before is not made again), then the
    prepared transaction is committed. Its batch reads the copies from then on (`read_chunks`).
    Rows whose after-processing its acknowledgement wrote already (`progress`: it was cut short
    before its COMMIT PREPARED) are not copied: their batch is acknowledged, and a copy would be
    audited twice. The copy notes the claim's progress as complete, so an acknowledgement that
    finds the claim still prepared afterwards (the driver died before the commit) commits it and
    copies nothing again."""
    d, o = endpoint.dialect, endpoint.options
    cur = conn.cursor()
    done = progress(cur, endpoint, claim)
    if done < claim.last:
        after = max(claim.low - 1, done - claim.shift)
        # the poison its claim moved to the error queue, judged again by the same rule (`judge`)
        poison = [int(row[0]) for row, headers in judged(
            cur, lambda a, n: d.prepared_headers(o.queue, xid=claim.xid, after=a, high=claim.high,
                                                 claimed_at=claim.claimed_at, limit=n), after=after)
            if headers is None]
        db.execute(cur, d.park(o.queue, endpoint.claims, o.consumer, xid=claim.xid, shift=claim.shift,
                               first=claim.first, last=claim.last, low=after + 1, high=claim.high,
                               claimed_at=claim.claimed_at, poison=poison))
    note_progress(cur, endpoint, claim, claim.last)
    conn.commit()
    commit(conn, endpoint, claim)
    forget_progress(conn, endpoint, claim)
