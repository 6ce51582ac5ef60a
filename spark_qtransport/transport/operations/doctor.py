"""Schema checks for ``sqlqueue doctor``: what NServiceBus warns about at start-up, and ours.

NServiceBus.SqlServer checks a queue's Headers type (varchar loses non-ASCII text), its
`Index_Expires` (the expired-message purge scans without it) and its nonclustered
`Index_RowVersion` (every receive scans without it); ours besides: a clustered RowVersion index
(a latch hot spot); int4 sequences of PostgreSQL tables stop accepting messages after about 2.1
billion inserts. Ours: columns NServiceBus declares NOT NULL that allow NULL (a hand-made table),
a queue name too long for the tables of ours beside it (``.Claims``, ``.Staging``, ``.Outbox``,
its delayed table), the current role's privileges on the queue, its sequence and the tables of
ours beside it (what ``sqlqueue ddl --grant-to`` grants); PostgreSQL's WAL settings, as advice;
PostgreSQL's prepared transactions: claims held by them past their bound, others as old, and
whether ``max_prepared_transactions`` leaves claims room (`check_prepared`). A finding is an error
(the connector cannot use the table), a warning (it works, but should be fixed) or information.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...dialects import Cursor, Dialect, QueueAddress
from ...errors import ConfigError
from .. import session as db
from ..delayed import NSERVICEBUS_DELAYED, DelayedTableRule
from ..receiving.prepared import GID_PREFIX, PreparedClaim, on_server
from ..receiving.sessions import PreparedSlots
from ..routing import QUEUE_COLUMNS
from ..server import database_problems
from ..settings import DEFAULT_PREPARED_TIMEOUT
from .privileges import DML

__all__ = ["Finding", "TableFacts", "WalSettings", "assess", "check_prepared", "check_queue",
           "check_server", "read_wal_settings", "setting_value", "wal_advice"]

INT4_MAX = 2**31 - 1


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning" | "info"
    table: str
    message: str


@dataclass(frozen=True)
class TableFacts:
    """What `check_queue` reads about one queue table; `assess` judges it without a database."""

    name: str  # quoted, qualified
    columns: dict[str, str]  # lower-case name -> type, as the dialect's queue_columns reports it
    high_seq: int | None = None  # highest sequence in the table (read for 32-bit sequences only)
    index_keys: tuple[tuple[tuple[str, ...], bool], ...] = ()  # (key columns, clustered) of each index
    companions: tuple[str, ...] = ()  # our tables found beside it (quoted names)
    missing: tuple[str, ...] = ()  # privileges the current role lacks on the queue (and its sequence)
    companions_missing: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (quoted name, lacking), ours beside it
    long_names: tuple[tuple[str, str], ...] = ()  # (quoted name, why): the queue or its .Delayed, refused by NServiceBus
    nullable: tuple[str, ...] = ()  # lower-case names of the columns that allow NULL
    too_long: tuple[tuple[str, str, int], ...] = ()  # (suffix, name, length): companions the database cannot name


def check_server(cur: Cursor, d: Dialect, queues: list[QueueAddress]) -> list[Finding]:
    """What the server must offer besides the tables, for the databases of `queues` and the
    connection's own: SQL Server's compatibility level 130 (OPENJSON), an error below it; a
    PostgreSQL TimeZone that is not UTC, a warning (NServiceBus stores a delayed message's Due as
    the UTC wall clock read in the session's TimeZone, and so do we: both movers agree while every
    session uses one zone, but a session in another zone, or a daylight-saving change while a
    message waits, moves it early or late); PostgreSQL's WAL settings, information (`wal_advice`)."""
    out = [Finding("error", "(server)", problem) for problem in database_problems(cur, d, queues)]
    stmt = d.server_time_zone()
    if stmt is not None:
        zone, now_offset, later_offset = db.one(cur, stmt)
        if now_offset or later_offset:
            out.append(Finding("warning", "(server)", (
                f"TimeZone is {zone!r}, not UTC: NServiceBus stores a delayed message's Due as UTC wall-clock time read "
                "in the session's TimeZone (and so does sqlqueue, to agree with it), so a session in another zone, or a "
                "daylight-saving change while a message waits, delivers it early or late by the difference; "
                "set TimeZone = 'UTC' (ALTER DATABASE ... SET TimeZone = 'UTC')")))
    stmt = d.wal_settings()
    if stmt is not None:
        out += wal_advice(read_wal_settings(db.rows(cur, stmt)))
    return out


#: checkpoints further apart than these: PostgreSQL's documented way to reduce the cost of
#: full-page writes (checkpoint_timeout 15 to 30 minutes, a max_wal_size that holds that much WAL)
CHECKPOINT_TIMEOUT_ADVISED = 15 * 60  # seconds
MAX_WAL_SIZE_ADVISED = 4 * 1024**3  # bytes

#: pg_settings units, in bytes or seconds
_UNITS = {"B": 1, "kB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4,
          "ms": 1e-3, "s": 1, "min": 60, "h": 3600, "d": 86400}


def setting_value(setting: str, unit: str | None) -> float | None:
    """A numeric pg_settings value in bytes or seconds: `setting` counts `unit`s, which may be a
    multiple (``8kB``, ``16MB``); None when the unit is not one of these (nothing to judge)."""
    m = re.fullmatch(r"(\d*)([A-Za-z]+)", unit or "")
    try:
        number = float(setting)
    except ValueError:
        return None
    if not unit:
        return number
    if m is None or m[2] not in _UNITS:
        return None
    return number * int(m[1] or 1) * _UNITS[m[2]]


@dataclass(frozen=True)
class WalSettings:
    """The PostgreSQL settings `wal_advice` judges (None: not read, or not judged)."""

    checkpoint_timeout: float | None = None  # seconds
    max_wal_size: float | None = None  # bytes
    full_page_writes: bool = True
    wal_compression: str = "off"
    methods: tuple[str, ...] = ("pglz",)  # the wal_compression methods the server was built with


def read_wal_settings(rows: Sequence[Sequence[Any]]) -> WalSettings:
    """`WalSettings` from the rows of the dialect's `wal_settings` (name, setting, unit, enumvals
    joined by commas)."""
    got = {str(r[0]): r for r in rows}

    def value(name: str) -> float | None:
        row = got.get(name)
        return None if row is None else setting_value(str(row[1]), row[2])

    compression = got.get("wal_compression")
    allowed = str(compression[3] or "") if compression is not None else ""
    methods = tuple(m for m in allowed.split(",") if m and m not in ("on", "off")) or ("pglz",)  # a boolean: pglz
    return WalSettings(
        checkpoint_timeout=value("checkpoint_timeout"),
        max_wal_size=value("max_wal_size"),
        full_page_writes=str(got["full_page_writes"][1]) != "off" if "full_page_writes" in got else True,
        wal_compression=str(compression[1]) if compression is not None else "off",
        methods=methods,
    )


def _shown(value: float, units: tuple[tuple[str, float], ...]) -> str:
    """`value` in the largest of `units` (largest first) that divides it, as PostgreSQL shows it."""
    for name, size in units:
        if value >= size and value % size == 0:
            return f"{value / size:g}{name}"
    return f"{value:g}{units[-1][0]}"


def wal_advice(s: WalSettings) -> list[Finding]:
    """Advice, as information, on the settings that make the churn of queue pages expensive in WAL:
    after each checkpoint the first change to a page writes the whole page (full_page_writes), and
    every received message is deleted from a queue page and inserted into and deleted from a claim
    page. Nothing with full_page_writes off (no page images). wal_compression is advised where the
    server has lz4 or zstd; pglz (its only method otherwise) costs server CPU, so it is only
    mentioned beside short checkpoints."""
    if not s.full_page_writes:
        return []
    out = []
    off = s.wal_compression == "off"
    cheap = [m for m in ("lz4", "zstd") if m in s.methods]
    short = []
    if s.checkpoint_timeout is not None and s.checkpoint_timeout < CHECKPOINT_TIMEOUT_ADVISED:
        short.append(f"checkpoint_timeout is {_shown(s.checkpoint_timeout, (('h', 3600), ('min', 60), ('s', 1)))}")
    if s.max_wal_size is not None and s.max_wal_size < MAX_WAL_SIZE_ADVISED:
        short.append(f"max_wal_size is {_shown(s.max_wal_size, (('GB', 1024**3), ('MB', 1024**2), ('kB', 1024)))}")
    if short:
        text = (f"{' and '.join(short)}: after each checkpoint the next change to every queue and claim page writes the "
                "whole 8 KB page to WAL (full_page_writes), so a busy queue writes up to about 2 KB more WAL per "
                "message right after each checkpoint; checkpoints further apart are PostgreSQL's documented way to "
                "reduce it: checkpoint_timeout = 15min to 30min and a max_wal_size that holds the WAL written in that "
                "time, at the cost of a longer crash recovery")
        if off and not cheap:
            text += ("; wal_compression with pglz (this server's only method) makes those pages smaller but costs server "
                     "CPU (a claim cost about 60% more with incompressible bodies): worth it only where WAL bandwidth "
                     "is the limit")
        out.append(Finding("info", "(server)", text))
    if off and cheap:
        out.append(Finding("info", "(server)", (
            "wal_compression is off: the whole pages written to WAL after each checkpoint (full_page_writes) go "
            f"uncompressed; this server was built with {' and '.join(cheap)}: set wal_compression = {cheap[0]} "
            "(pglz costs much more CPU)")))
    return out


#: prepared transactions a queue needs free for a stream to hold its claims in them: it holds
#: `PreparedSlots.PER_QUEUE` and leaves as many of the free ones to the server's other users
FREE_PER_QUEUE = 2 * PreparedSlots.PER_QUEUE
#: ages of one prepared transaction read by two statements differ by less than this (seconds)
_SAME_AGE = 1.0


def check_prepared(cur: Cursor, d: Dialect, queues: Sequence[QueueAddress], *,
                   timeout: float = DEFAULT_PREPARED_TIMEOUT) -> list[Finding]:
    """PostgreSQL's prepared transactions, as claims use them (`claimMode`); nothing where the
    database has none (SQL Server). Warnings: a claim of ours prepared longer ago than `timeout`
    (a running stream moves its claims into the claim table before `preparedClaimTimeout`, so its
    stream has stopped or hangs), another prepared transaction as old, in this database or
    another; each holds vacuum back. Information: `max_prepared_transactions` too low for the
    queues checked that a stream reads (those with a claim table), whose claims are then written
    to the claim table as well."""
    if not d.prepared_claims:
        return []
    setting, in_use = (int(v or 0) for v in db.one(cur, d.prepared_capacity()))
    oldest, frozen = db.one(cur, d.prepared_bound())
    listed = [(p.gid, p.age, p.claim) for p in on_server(db.rows(cur, d.list_prepared("")))]
    ours = [(gid, age, claim) for gid, age, claim in listed if gid.startswith(GID_PREFIX)]
    # the queues' claim tables by id, read only where a finding may need them
    advice_possible = setting < FREE_PER_QUEUE * len(queues) + in_use
    tables = _claim_tables(cur, d, queues) if ours or advice_possible else {}
    held = f"age(datfrozenxid) is {int(frozen):,} transactions" if frozen is not None else "age(datfrozenxid) unknown"
    out = _old_claims(d, ours, tables, timeout=timeout, held=held)
    others = [(gid, age) for gid, age, _ in listed if not gid.startswith(GID_PREFIX) and age > timeout]
    out += [Finding("warning", "(server)", (
        f"prepared transaction {gid!r} (not sqlqueue's) was prepared {_age(age)} ago: it holds vacuum back (no row "
        f"deleted or updated since can be removed; {held}) until whoever prepared it commits or rolls it back "
        "(COMMIT PREPARED / ROLLBACK PREPARED)"))
        for gid, age in others]
    if oldest is not None and float(oldest) > timeout and not any(age >= float(oldest) - _SAME_AGE for _, age, _ in listed):
        out.append(Finding("warning", "(server)", (
            f"a prepared transaction in another database of this server was prepared {_age(float(oldest))} ago: it "
            "holds vacuum back there and on the shared catalogs until it is committed or rolled back; "
            "pg_prepared_xacts names it (gid, database), and sqlqueue doctor connected to that database judges it")))
    mine = sum(1 for _, _, claim in ours if claim is not None and claim.table in tables)
    out += prepared_capacity_advice(setting, in_use - mine, streamed=len(tables))
    return out


def _claim_tables(cur: Cursor, d: Dialect, queues: Sequence[QueueAddress]) -> dict[str, QueueAddress]:
    """The id of each queue's claim table (`Dialect.table_id`, as a gid holds it) -> the queue, for
    the queues that have one; a schema the role may not use is skipped (its tables cannot be looked
    up by name)."""
    out: dict[str, QueueAddress] = {}
    for queue in queues:
        try:
            claims = d.claims_table(queue)
        except ConfigError:  # a name too long for a claim table: there is none
            continue
        if any(m.startswith("USAGE ON SCHEMA") for m in _missing(cur, d, claims)):
            continue
        (table_id,) = db.one(cur, d.table_id(claims))
        if table_id is not None:
            out[str(int(table_id))] = queue
    return out


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _old_claims(d: Dialect, ours: list[tuple[str, float, PreparedClaim | None]], tables: dict[str, QueueAddress], *,
                timeout: float, held: str) -> list[Finding]:
    """A warning per claim table and consumer holding prepared claims older than `timeout`."""
    groups: dict[tuple[str, str], list[PreparedClaim]] = {}
    out = []
    for gid, age, claim in ours:
        if age <= timeout:
            continue
        if claim is None:  # ours by its prefix, but not a gid this version makes
            out.append(Finding("warning", "(server)", (
                f"prepared transaction {gid!r} (sqlqueue's, of another version) was prepared {_age(age)} ago, past the "
                f"{_age(timeout)} bound: it holds vacuum back (no row deleted or updated since can be removed; {held}); "
                "a stream of that version moves it into the claim table when it starts again")))
            continue
        groups.setdefault((claim.table, claim.consumer), []).append(claim)
    for (table, consumer), claims in groups.items():
        queue = tables.get(table)
        where = d.qualified(queue) if queue is not None else "(server)"
        on = "" if queue is not None else (f" on the claim table with id {table}, of a queue not checked here "
                                           f"(SELECT {table}::regclass names it),")
        age = max(c.age for c in claims)
        count = f"{len(claims)} prepared claims" if len(claims) > 1 else "a prepared claim"
        span = sum(c.last - c.first + 1 for c in claims)
        out.append(Finding("warning", where, (
            f"{count} of consumer {consumer!r}{on} prepared {_age(age)} ago, past the {_age(timeout)} bound "
            "(--prepared-timeout; the option preparedClaimTimeout): a running stream moves its claims into the claim "
            "table by then, so this one has stopped or hangs; until then it holds vacuum back (no row deleted or "
            f"updated since can be removed; {held}) and up to {span:,} message(s) stay claimed; starting the stream "
            f"again (or stopping it cleanly) moves it into the claim table (gid {', '.join(c.gid for c in claims)})")))
    return out


def prepared_capacity_advice(setting: int, others: int, *, streamed: int) -> list[Finding]:
    """Advice, as information, on `max_prepared_transactions` (`setting`, of which `others` are
    held by others than the `streamed` queues' streams) for `streamed` queues a stream reads: a
    stream holds a queue's claims in prepared transactions (claimMode auto) only where
    FREE_PER_QUEUE are free when it starts, else in the claim table, which writes each message
    twice more (its insert and its delete, besides the queue's delete). Nothing without such a
    queue: the advice is for queues streams read."""
    if not streamed:
        return []
    needed = FREE_PER_QUEUE * streamed + max(0, others)
    if setting >= needed:
        return []
    how = (f"set max_prepared_transactions to at least {needed} ({FREE_PER_QUEUE} per queue a stream reads: it holds "
           f"{PreparedSlots.PER_QUEUE} and leaves as many free to others; {streamed} queue(s) checked here have a "
           f"claim table{f'; {others} held by others' if others > 0 else ''}) plus what other users of the "
           "server need (64 leaves room) and restart the server: claimMode auto then holds claims in prepared "
           "transactions, which write each message once (about a third of the WAL per message)")
    if setting <= 0:
        return [Finding("info", "(server)", (
            "max_prepared_transactions is 0: every claim is held in the claim table, so each message received is "
            f"written three times (the queue's delete, the claim table's insert and its delete) instead of once; {how}"))]
    return [Finding("info", "(server)", (
        f"max_prepared_transactions is {setting}: too few for prepared claims on every queue a stream reads, so some "
        f"hold their claims in the claim table, writing each message three times instead of once; {how}"))]


def check_queue(cur: Cursor, d: Dialect, queue: QueueAddress, *,
                delayed: DelayedTableRule = NSERVICEBUS_DELAYED) -> list[Finding]:
    """Check one queue table, the tables of ours beside it and its endpoint's delayed table."""
    name = d.qualified(queue)
    missing = _missing(cur, d, queue)
    schema = [m for m in missing if m.startswith("USAGE ON SCHEMA")]
    if schema:  # nothing in the schema can even be looked up
        return [_lacking("error", name, schema)]
    cols = db.columns(cur, d.queue_columns(queue))
    high = None
    seq = d.sequence_column
    if seq in cols and cols[seq].lower() in _INT32_TYPES:
        (high,) = db.one(cur, d.max_source_seq(queue))
    keys: tuple[tuple[tuple[str, ...], bool], ...] = ()
    if cols:
        rows = db.rows(cur, d.indexes(queue))
        keys = tuple((tuple(str(r[1] or "").split(",")), bool(r[2])) for r in rows)
    companions = []
    companions_missing = []
    too_long = []
    long_names = [(name, problem)] if (problem := d.nservicebus_name_problem(queue)) is not None else []
    for suffix in ("Claims", "Delayed", "Staging", "Outbox"):
        try:
            companion = delayed.table_for(d, queue) if suffix == "Delayed" else d.companion(queue, suffix)
        except ConfigError:  # a name too long for the companion: it cannot exist
            text = f"{queue.table}.{delayed.suffix if suffix == 'Delayed' else suffix}"
            too_long.append((suffix, text, d.name_length(text)))
            continue
        if cols and db.columns(cur, d.queue_columns(companion)):
            if suffix in ("Claims", "Delayed"):
                companions.append(d.qualified(companion))
            if suffix == "Delayed" and (problem := d.nservicebus_name_problem(companion)) is not None:
                long_names.append((d.qualified(companion), problem))
            lacking = _missing(cur, d, companion)
            if lacking:
                companions_missing.append((d.qualified(companion), tuple(lacking)))
    nullable = tuple(str(r[0]) for r in db.rows(cur, d.nullable_columns(queue))) if cols else ()
    return assess(TableFacts(name, cols, None if high is None else int(high), keys, tuple(companions),
                             tuple(missing) if cols else (), tuple(companions_missing), tuple(long_names),
                             nullable, tuple(too_long)), d)


def _missing(cur: Cursor, d: Dialect, table: QueueAddress) -> list[str]:
    """What the current role lacks of `DML` on `table` and of what using it needs besides
    (schema, sequence). Unknown (NULL: SQL Server cannot see the object) counts as held."""
    rows = db.rows(cur, d.privileges(table, DML))
    return [str(what) for what, granted in rows if granted is not None and not granted]


def _lacking(level: str, name: str, missing: tuple[str, ...] | list[str]) -> Finding:
    return Finding(level, name, f"the current role lacks {', '.join(missing)} (an endpoint needs "
                   f"{', '.join(DML)} here; sqlqueue ddl --grant-to ROLE prints the grants)")


#: sequence column types that are 32 bits wide: PostgreSQL's serial, SQL Server's int IDENTITY
_INT32_TYPES = ("integer", "int")


#: what a companion table whose name the database cannot hold keeps the connector from doing
_WITHOUT = {
    "Claims": "no stream can receive from this queue",
    "Staging": "no sink can send as this endpoint",
    "Outbox": "no sink can send as this endpoint",
    "Delayed": "this endpoint cannot defer messages",
}


def _nullable(t: TableFacts, d: Dialect) -> list[Finding]:
    """Columns NServiceBus's installer declares NOT NULL that allow NULL here (a hand-made table)."""
    loose = [c for c in d.not_null_columns if c in t.nullable and c in t.columns]
    if not loose:
        return []
    return [Finding("warning", t.name, (
        f"column(s) {', '.join(loose)} allow NULL, where NServiceBus's queue table declares NOT NULL: NServiceBus "
        "fails to receive a row without an id at every attempt; sqlqueue moves such a row to the error queue and "
        "reads NULL headers as none; ALTER the column(s) to NOT NULL"))]


def _too_long(t: TableFacts, d: Dialect) -> list[Finding]:
    """Companion tables (`<queue>.Claims`, ...) whose names the database cannot hold."""
    return [Finding("warning", t.name, (
        f"table {text!r} would be named with {length} {d.length_unit}, more than the {d.max_table_bytes} the database "
        f"allows: {_WITHOUT[suffix]} (a shorter queue name fits)")) for suffix, text, length in t.too_long]


def assess(t: TableFacts, d: Dialect) -> list[Finding]:
    """The findings for one queue table, as NServiceBus's start-up checks and ours judge it (the
    dialect adds what only its database's tables can show)."""
    name, cols = t.name, t.columns
    if not cols:
        return [Finding("error", name, "table does not exist (sqlqueue create-queue, or the DDL in sql/)")]
    out: list[Finding] = []
    seq = d.sequence_column
    missing = [c for c in QUEUE_COLUMNS if c not in cols] + ([] if seq in cols else ["seq / RowVersion"])
    if missing:
        return [Finding("error", name, f"not a queue table: missing column(s) {', '.join(missing)}")]
    found = d.table_findings(cols, t.index_keys)
    out += [Finding(level, name, text) for level, text in found if level == "warning"]
    out += _nullable(t, d) + _too_long(t, d)
    if cols[seq].lower() in _INT32_TYPES:
        used = (t.high_seq or 0) / INT4_MAX
        level = "error" if used >= 0.95 else "warning" if used >= 0.8 else "info"
        out.append(Finding(level, name, f"{d.int32_sequence} (NServiceBus's installer), {used:.1%} used; "
                           "inserts fail once it reaches 2,147,483,647 (ALTER it to bigint)"))
    out += [Finding(level, name, text) for level, text in found if level != "warning"]
    out += [Finding("warning", table, problem) for table, problem in t.long_names]
    if "bodystring" in cols:
        out.append(Finding("info", name, "computed BodyString column present (columns are always named: no effect)"))
    if t.missing:
        out.append(_lacking("error", name, t.missing))
    out += [Finding("info", companion, "present") for companion in t.companions]
    out += [_lacking("warning", companion, lacking) for companion, lacking in t.companions_missing]
    if not any(f.level in ("error", "warning") for f in out):
        out.insert(0, Finding("ok", name, f"queue table fits the transport ({', '.join(sorted(cols))})"))
    return out
