"""Schema checks for ``sqlqueue doctor``: what NServiceBus warns about at start-up, and ours.

NServiceBus.SqlServer checks a queue's Headers type (varchar loses non-ASCII text), its
`Index_Expires` (the expired-message purge scans without it) and a clustered RowVersion index
(a latch hot spot); int4 sequences of PostgreSQL tables stop accepting messages after about 2.1
billion inserts. Ours: the current role's privileges on the queue, its sequence and the tables of
ours beside it (what ``sqlqueue ddl --grant-to`` grants). A finding is an error (the connector
cannot use the table), a warning (it works, but should be fixed) or information.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...dialects import Dialect, QueueAddress
from .. import session as db
from ..routing import QUEUE_COLUMNS
from .privileges import DML

__all__ = ["Finding", "TableFacts", "assess", "check_queue"]

INT4_MAX = 2**31 - 1


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning" | "info"
    table: str
    message: str


@dataclass(frozen=True)
class TableFacts:
    """What `check_queue` reads about one queue table; `assess` judges it without a database."""

    dialect: str
    name: str  # quoted, qualified
    columns: dict[str, str]  # lower-case name -> type, as the dialect's queue_columns reports it
    high_seq: int | None = None  # highest sequence in the table (read for 32-bit sequences only)
    index_keys: tuple[tuple[tuple[str, ...], bool], ...] = ()  # (key columns, clustered), SQL Server
    companions: tuple[str, ...] = ()  # our tables found beside it (quoted names)
    missing: tuple[str, ...] = ()  # privileges the current role lacks on the queue (and its sequence)
    companions_missing: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (quoted name, lacking), ours beside it


def check_queue(cur: Any, d: Dialect, queue: QueueAddress) -> list[Finding]:
    """Check one queue table and the tables of ours beside it."""
    name = d.qualified(queue)
    missing = _missing(cur, d, queue)
    schema = [m for m in missing if m.startswith("USAGE ON SCHEMA")]
    if schema:  # nothing in the schema can even be looked up
        return [_lacking("error", name, schema)]
    cols = db.columns(cur, d.queue_columns(queue))
    high = None
    seq = _seq_column(cols)
    if seq is not None and cols[seq].lower() in _INT32_TYPES:
        (high,) = db.one(cur, d.max_source_seq(queue))
    keys: tuple[tuple[tuple[str, ...], bool], ...] = ()
    if cols and d.name == "sqlserver":
        rows = cur.execute(*db.args(d.indexes(queue))).fetchall()
        keys = tuple((tuple(str(r[1] or "").split(",")), bool(r[2])) for r in rows)
    companions = []
    companions_missing = []
    for suffix in ("Claims", "Delayed", "Staging", "Outbox"):
        try:
            companion = d.companion(queue, suffix)
        except Exception:  # noqa: BLE001 - a name too long for the companion: it cannot exist
            continue
        if cols and db.columns(cur, d.queue_columns(companion)):
            if suffix in ("Claims", "Delayed"):
                companions.append(d.qualified(companion))
            lacking = _missing(cur, d, companion)
            if lacking:
                companions_missing.append((d.qualified(companion), tuple(lacking)))
    return assess(TableFacts(d.name, name, cols, None if high is None else int(high), keys, tuple(companions),
                             tuple(missing) if cols else (), tuple(companions_missing)))


def _missing(cur: Any, d: Dialect, table: QueueAddress) -> list[str]:
    """What the current role lacks of `DML` on `table` and of what using it needs besides
    (schema, sequence). Unknown (NULL: SQL Server cannot see the object) counts as held."""
    rows = cur.execute(*db.args(d.privileges(table, DML))).fetchall()
    return [str(what) for what, granted in rows if granted is not None and not granted]


def _lacking(level: str, name: str, missing: tuple[str, ...] | list[str]) -> Finding:
    return Finding(level, name, f"the current role lacks {', '.join(missing)} (an endpoint needs "
                   f"{', '.join(DML)} here; sqlqueue ddl --grant-to ROLE prints the grants)")


#: sequence column types that are 32 bits wide: PostgreSQL's serial, SQL Server's int IDENTITY
_INT32_TYPES = ("integer", "int")


def _seq_column(cols: dict[str, str]) -> str | None:
    return "seq" if "seq" in cols else "rowversion" if "rowversion" in cols else None


def assess(t: TableFacts) -> list[Finding]:
    """The findings for one queue table, as NServiceBus's start-up checks and ours judge it."""
    name, cols = t.name, t.columns
    if not cols:
        return [Finding("error", name, "table does not exist (sqlqueue create-queue, or the DDL in sql/)")]
    out: list[Finding] = []
    seq = _seq_column(cols)
    missing = [c for c in QUEUE_COLUMNS if c not in cols] + ([] if seq else ["seq / RowVersion"])
    if missing:
        return [Finding("error", name, f"not a queue table: missing column(s) {', '.join(missing)}")]
    assert seq is not None
    headers_type = cols["headers"].lower()
    if headers_type.startswith(("varchar", "char", "text")) and t.dialect == "sqlserver":
        out.append(Finding("warning", name, f"Headers is {headers_type}: non-ASCII header text is lost; "
                           "ALTER it to nvarchar(max), as NServiceBus's installer creates it"))
    if cols[seq].lower() in _INT32_TYPES:
        used = (t.high_seq or 0) / INT4_MAX
        level = "error" if used >= 0.95 else "warning" if used >= 0.8 else "info"
        column = "seq is a 32-bit serial" if t.dialect == "postgres" else "RowVersion is a 32-bit int IDENTITY"
        out.append(Finding(level, name, f"{column} (NServiceBus's installer), {used:.1%} used; "
                           "inserts fail once it reaches 2,147,483,647 (ALTER it to bigint)"))
    if t.dialect == "sqlserver":
        if not any(keys and keys[0] == "expires" for keys, _ in t.index_keys):
            out.append(Finding("warning", name, "no index on Expires: purging expired messages scans the table "
                               "(NServiceBus creates Index_Expires; see sqlqueue ddl --dialect sqlserver)"))
        if any(clustered and keys and keys[0] == "rowversion" for keys, clustered in t.index_keys):
            out.append(Finding("warning", name, "clustered index on RowVersion: a latch hot spot under load; current "
                               "NServiceBus installers make a heap with a nonclustered Index_RowVersion"))
        out.append(Finding("info", name, "Recoverable column present: sends write 1" if "recoverable" in cols
                           else "no Recoverable column: sends leave it out"))
    if "bodystring" in cols:
        out.append(Finding("info", name, "computed BodyString column present (columns are always named: no effect)"))
    if t.missing:
        out.append(_lacking("error", name, t.missing))
    out += [Finding("info", companion, "present") for companion in t.companions]
    out += [_lacking("warning", companion, lacking) for companion, lacking in t.companions_missing]
    if not any(f.level in ("error", "warning") for f in out):
        out.insert(0, Finding("ok", name, f"queue table fits the transport ({', '.join(sorted(cols))})"))
    return out
