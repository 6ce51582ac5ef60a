"""SQL Server delayed delivery: NServiceBus's delayed table, moved by one mover at a time.

A delayed row's key is its RowVersion and its Due as text: the table is NServiceBus's heap whose
only index is Index_Due, so moving and deleting rows seek a few milliseconds of Due (the text has
milliseconds; datetime rounds to 3.33 ms) and match RowVersion exactly, instead of scanning the
whole table for RowVersion once per batch.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ...errors import QTransportError
from ..base import DelayedSql, QueueAddress, Statement
from .addressing import SqlServerAddressing
from .statements import CHUNK, QNAME, Params, bounded, insert_messages, json_keys, json_list, key_rows


class DelayedKey(NamedTuple):
    """A key of `due_delayed`: ``<RowVersion> <Due as ISO 8601 text>``."""

    row: int
    due: str


def _delayed_key(key: str) -> DelayedKey:
    row, sep, due = str(key).partition(" ")
    if not sep or not due or not re.fullmatch(r"-?[0-9]{1,19}", row):
        raise QTransportError(f"not a delayed row key: {key!r}", operation="move delayed messages")
    return DelayedKey(int(row), due)


#: a delayed row (columns prefixed `d`) is the one a key (prefixed `k`) names; see `due_delayed`
_KEY_MATCH = (
    "{d}Due >= DATEADD(ms, -4, CONVERT(datetime, {k}KeyDue, 126))"
    " AND {d}Due <= DATEADD(ms, 4, CONVERT(datetime, {k}KeyDue, 126))"
    " AND {d}RowVersion = {k}KeyRow"
)


class SqlServerDelayed(SqlServerAddressing, DelayedSql):
    """The SQL Server delayed delivery of the dialect."""

    def any_due(self, delayed: QueueAddress) -> Statement:
        # READPAST: rows being moved or stored by others are not waited for; READCOMMITTEDLOCK
        # keeps READPAST valid on a READ_COMMITTED_SNAPSHOT database. Shared locks only.
        return Statement(
            f"SELECT TOP (1) 1 FROM {self.qualified(delayed)} WITH (READPAST, READCOMMITTEDLOCK)"
            " WHERE Due <= GETUTCDATE()"
        )

    def lock_mover(self, delayed: QueueAddress) -> Statement:
        d = self.qualified(delayed)
        # A Transaction-owned applock needs an open transaction. pyodbc without autocommit runs
        # in implicit transaction mode, where EXEC opens none but a SELECT from a table does:
        # one opens it if this is the first statement. LockTimeout 0: a busy mover is reported
        # at once (return code -1). The lock is taken in the delayed table own database and keyed
        # by the table identity, not its spelling: `Sales.Delayed`, `SALES.DELAYED@[dbo]` and a
        # three-part name are one table, so one mover.
        db_id, params = ("DB_ID(?)", (delayed.catalog,)) if delayed.catalog else ("DB_ID()", ())
        return Statement(
            "SET NOCOUNT ON;\n"
            f"DECLARE @table {QNAME} = ?;\n"
            "DECLARE @rc int;\n"
            "IF @@TRANCOUNT = 0\n"
            f"    SELECT TOP (1) @rc = 0 FROM {d} WITH (READPAST, READCOMMITTEDLOCK);\n"
            "IF @@TRANCOUNT = 0\n"
            "    THROW 51000, N'sqlqueue: the delayed mover lock needs a transaction, not autocommit', 1;\n"
            f"DECLARE @resource nvarchar(255) = N'sqlqueue mover ' + CAST({db_id} AS nvarchar(11)) + N'.'"
            " + CAST(OBJECT_ID(@table) AS nvarchar(11));\n"
            f"EXEC @rc = {self._sys(delayed)}sp_getapplock @Resource = @resource, @LockMode = N'Exclusive',"
            " @LockOwner = N'Transaction', @LockTimeout = 0;\n"
            "SELECT CAST(CASE WHEN @rc >= 0 THEN 1 ELSE 0 END AS bit)",
            (d, *params),
        )

    def due_delayed(self, delayed: QueueAddress, *, limit: int) -> Statement:
        # NServiceBus's MoveDueDelayedMessageText picks rows the same way: UPDLOCK + READPAST +
        # ROWLOCK, so an NServiceBus mover on the same table skips ours and we skip its rows.
        # ORDER BY Due alone follows Index_Due: no sort that would lock rows beyond the TOP.
        return Statement(
            "SELECT TOP (?) CAST(RowVersion AS varchar(20)) + ' ' + CONVERT(varchar(23), Due, 126), Headers"
            f" FROM {self.qualified(delayed)} WITH (UPDLOCK, READPAST, ROWLOCK)"
            " WHERE Due <= GETUTCDATE() ORDER BY Due",
            (int(limit),),
        )

    def move_delayed(
        self, delayed: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
    ) -> Statement:
        found = [_delayed_key(k) for k in keys]
        params = Params(named=True)
        rows = key_rows([k.row for k in found], headers, [k.due for k in found])
        marker = params.add("rows", "nvarchar(max)", json_list(rows))
        # One JSON array of [RowVersion, Due, Headers]; its positions keep the order of `keys`.
        # The rows are this transaction own (locked by due_delayed): READPAST skips only rows
        # other transactions hold.
        joins = (f"JOIN {params.table('delayed', self.qualified(delayed))} AS d WITH (READPAST, READCOMMITTEDLOCK)\n"
                 f"  ON {_KEY_MATCH.format(d='d.', k='k.')}")
        return insert_messages(self.qualified(destination), self._sys(destination), keys=json_keys(marker, due=True),
                               new_id="NEWID()", select="NULL, k.Headers, d.Body", joins=joins, params=params)

    def delete_delayed(self, delayed: QueueAddress, *, keys: list[str]) -> Statement:
        rows = [[k.row, k.due] for k in map(_delayed_key, keys)]  # [RowVersion, Due]
        params = Params(named=True)
        marker = params.add("rows", "nvarchar(max)", json_list(rows))
        # NServiceBus's delayed table: bounded statements (see `bounded`).
        step = (f"DELETE d FROM {params.table('delayed', self.qualified(delayed))} AS d WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)\n"
                f"JOIN #sqlqueue_keys AS k ON {_KEY_MATCH.format(d='d.', k='k.')}\n"
                f"WHERE {CHUNK};\nSET @n = @@ROWCOUNT;")
        return bounded(params, keys=json_keys(marker, due=True, headers=False), step=step)
