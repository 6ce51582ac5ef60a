"""Schema checks for ``sqlqueue doctor``: what NServiceBus warns about at start-up, and ours.

NServiceBus.SqlServer checks a queue's Headers type (varchar loses non-ASCII text), its
`Index_Expires` (the expired-message purge scans without it) and a clustered RowVersion index
(a latch hot spot); int4 sequences of PostgreSQL tables stop accepting messages after about 2.1
billion inserts. A finding is an error (the connector cannot use the table), a warning
(it works, but should be fixed) or information.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dialects import Dialect, QueueAddress
from . import _db as db

__all__ = ["Finding", "check_queue"]

INT4_MAX = 2**31 - 1
QUEUE_COLUMNS = ("id", "headers", "body", "expires")


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning" | "info"
    table: str
    message: str


def check_queue(cur: Any, d: Dialect, queue: QueueAddress) -> list[Finding]:
    """Check one queue table and the tables of ours beside it."""
    name = d.qualified(queue)
    cols = db.columns(cur, d.queue_columns(queue))
    if not cols:
        return [Finding("error", name, "table does not exist (sqlqueue create-queue, or the DDL in sql/)")]
    out: list[Finding] = []
    seq = "seq" if "seq" in cols else "rowversion" if "rowversion" in cols else None
    missing = [c for c in QUEUE_COLUMNS if c not in cols] + ([] if seq else ["seq / RowVersion"])
    if missing:
        return [Finding("error", name, f"not a queue table: missing column(s) {', '.join(missing)}")]
    headers_type = cols["headers"].lower()
    if headers_type.startswith(("varchar", "char", "text")) and d.name == "sqlserver":
        out.append(Finding("warning", name, f"Headers is {headers_type}: non-ASCII header text is lost; "
                           "ALTER it to nvarchar(max), as NServiceBus's installer creates it"))
    if d.name == "postgres" and cols[seq].lower() == "integer":
        (high,) = db.one(cur, d.max_source_seq(queue))
        used = (int(high) if high is not None else 0) / INT4_MAX
        level = "error" if used >= 0.95 else "warning" if used >= 0.8 else "info"
        out.append(Finding(level, name, f"seq is a 32-bit serial (NServiceBus's installer), {used:.1%} used; "
                           "inserts fail once it reaches 2,147,483,647 (ALTER it to bigint)"))
    if d.name == "sqlserver":
        out += _sqlserver_indexes(cur, d, queue, name)
        out.append(Finding("info", name, "Recoverable column present: sends write 1" if "recoverable" in cols
                           else "no Recoverable column: sends leave it out"))
    if "bodystring" in cols:
        out.append(Finding("info", name, "computed BodyString column present (columns are always named: no effect)"))
    for suffix in ("Claims", "Delayed"):
        try:
            companion = d.companion(queue, suffix)
        except Exception:  # noqa: BLE001 - a name too long for the companion: it cannot exist
            continue
        if db.columns(cur, d.queue_columns(companion)):
            out.append(Finding("info", d.qualified(companion), "present"))
    if not any(f.level in ("error", "warning") for f in out):
        out.insert(0, Finding("ok", name, f"queue table fits the transport ({', '.join(sorted(cols))})"))
    return out


def _sqlserver_indexes(cur: Any, d: Dialect, queue: QueueAddress, name: str) -> list[Finding]:
    rows = cur.execute(*db.args(d.indexes(queue))).fetchall()
    keys = [(str(r[1] or "").split(","), bool(r[2])) for r in rows]
    out = []
    if not any(cols and cols[0] == "expires" for cols, _ in keys):
        out.append(Finding("warning", name, "no index on Expires: purging expired messages scans the table "
                           "(NServiceBus creates Index_Expires; see sqlqueue ddl --dialect sqlserver)"))
    if any(clustered and cols and cols[0] == "rowversion" for cols, clustered in keys):
        out.append(Finding("warning", name, "clustered index on RowVersion: a latch hot spot under load; current "
                           "NServiceBus installers make a heap with a nonclustered Index_RowVersion"))
    return out
