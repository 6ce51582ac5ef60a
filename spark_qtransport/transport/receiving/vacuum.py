"""Space of the rows the connector deletes in bulk (claims once acknowledged, staged rows once
dispatched): made reusable every few seconds, not once a minute when autovacuum wakes.

Every message passes once through the claim table and once through the staging table, so at
10,000 messages/s they see about 7 MB/s of deleted rows. PostgreSQL reuses that space only after a
vacuum. After an acknowledgement or a dispatch, `vacuum_if_due` asks the server's statistics
whether the table holds at least `VACUUM_MIN_ROWS` deleted rows and was not vacuumed in the last
`VACUUM_EVERY` seconds (by anyone: the state lives in the database, so short-lived sink commit
processes share it), and vacuums it if so. Housekeeping: a failure is logged, never raised.
SQL Server reclaims the space by itself (`Dialect.vacuum_due` is None).

Only a table's owner (PostgreSQL 17+: or a role with MAINTAIN on it) may vacuum it. A role with
table privileges only never runs VACUUM: the log says once per process and table that autovacuum
is relied on (tune ``autovacuum_vacuum_scale_factor``/``_threshold`` of the table, or grant MAINTAIN).
"""

from __future__ import annotations

import logging
import threading

from ...dialects import Connection, Dialect, QueueAddress
from .. import session as db

log = logging.getLogger("spark_qtransport.vacuum")

#: seconds between two vacuums of one table, at least
VACUUM_EVERY = 10.0
#: deleted rows that make a vacuum worth its table scan
VACUUM_MIN_ROWS = 1000

#: tables this process may not vacuum, already reported: (dialect, quoted table name)
_LEFT_TO_AUTOVACUUM: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def vacuum_if_due(dialect: Dialect, conn: Connection, table: QueueAddress, *, every: float = VACUUM_EVERY,
                  min_rows: int = VACUUM_MIN_ROWS) -> bool:
    """Vacuum `table` on `conn` (between transactions) if it is due. True if it ran."""
    due, stmt = dialect.vacuum_due(table, every_seconds=every, min_rows=min_rows), dialect.vacuum(table)
    if due is None or stmt is None:
        return False
    try:
        db.rollback(conn)
        conn.autocommit = True  # VACUUM cannot run inside a transaction
        try:
            row = db.first(conn.cursor(), due)
            if not row:
                return False
            if not row[1]:
                _left_to_autovacuum(dialect, table)
                return False
            if not row[0]:
                return False
            db.execute(conn.cursor(), stmt)
            return True
        finally:
            conn.autocommit = False
    except Exception as exc:  # noqa: BLE001 - housekeeping; autovacuum still runs
        log.info("vacuum of %s failed: %s", dialect.qualified(table), db.describe(dialect, exc))
        return False


def _left_to_autovacuum(dialect: Dialect, table: QueueAddress) -> None:
    key = (dialect.name, dialect.qualified(table))
    with _LOCK:
        if key in _LEFT_TO_AUTOVACUUM:
            return
        _LEFT_TO_AUTOVACUUM.add(key)
    # info, not warning: a role with table privileges only is the recommended set-up
    log.info("%s is not owned by this role (nor, on PostgreSQL 17+, may it MAINTAIN it): never vacuumed "
             "here, autovacuum is relied on to reuse the space of its deleted rows", key[1])
