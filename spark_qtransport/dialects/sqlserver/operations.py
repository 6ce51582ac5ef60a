"""SQL Server operations (the sqlqueue CLI): statistics, peeking, purging, subscriptions, moving
messages, indexes and privileges.

Reads for people watching queues that NServiceBus endpoints and our readers are working on:
READPAST + READCOMMITTEDLOCK, so a read never waits for a row another session holds (a receive in
progress, an uncommitted send or claim) and keeps its meaning on a READ_COMMITTED_SNAPSHOT
database. Shared locks only, released row by row: no update lock, nothing held after the
statement. The price: rows others hold at that moment are not counted or shown (they are in
flight, being sent or taken).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Mapping, Sequence

from ...errors import QTransportError, field_error
from ..base import OperationsSql, QueueAddress, Statement, check_preview, check_privileges
from .addressing import SqlServerAddressing
from .statements import CHUNK, ROW_BOUND, Params, bounded, copy_rows, json_keys, json_list, literal


def _message_key(key: str) -> int:
    """A key of `lock_messages` (a RowVersion as text) -> the RowVersion."""
    text = str(key)
    if not re.fullmatch(r"-?[0-9]{1,19}", text) or not -(2**63) <= int(text) < 2**63:
        raise QTransportError(f"not a message key: {key!r}", operation="move messages")
    return int(text)


def _native_id(value: str) -> str:
    """A native message id (a uniqueidentifier, any case, braces allowed) -> canonical text."""
    try:
        return str(uuid.UUID(str(value).strip()))
    except ValueError:
        raise field_error("native_ids", f"not a native message id (a uniqueidentifier): {value!r}") from None


class SqlServerOperations(SqlServerAddressing, OperationsSql):
    sequence_column = "rowversion"
    int32_sequence = "RowVersion is a 32-bit int IDENTITY"
    not_null_columns = ("id", "recoverable", "headers", "rowversion")  # NServiceBus's CreateQueueText

    def table_findings(
        self, columns: Mapping[str, str], index_keys: Sequence[tuple[tuple[str, ...], bool]]
    ) -> list[tuple[str, str]]:
        # what NServiceBus.SqlServer checks at start-up, and the legacy Recoverable column
        out = []
        headers_type = columns.get("headers", "").lower()
        if headers_type.startswith(("varchar", "char", "text")):
            out.append(("warning", f"Headers is {headers_type}: non-ASCII header text is lost; "
                        "ALTER it to nvarchar(max), as NServiceBus's installer creates it"))
        if not any(keys and keys[0] == "expires" for keys, _ in index_keys):
            out.append(("warning", "no index on Expires: purging expired messages scans the table "
                        "(NServiceBus creates Index_Expires; see sqlqueue ddl --dialect sqlserver)"))
        if not any(not clustered and keys and keys[0] == "rowversion" for keys, clustered in index_keys):
            # NServiceBus's CheckIfNonClusteredRowVersionIndexIsPresent (SchemaVerification)
            out.append(("warning", "no nonclustered index on RowVersion: every receive and claim scans and "
                        "sorts the table (NServiceBus creates Index_RowVersion; see sqlqueue ddl --dialect sqlserver)"))
        if any(clustered and keys and keys[0] == "rowversion" for keys, clustered in index_keys):
            out.append(("warning", "clustered index on RowVersion: a latch hot spot under load; current "
                        "NServiceBus installers make a heap with a nonclustered Index_RowVersion"))
        out.append(("info", "Recoverable column present: sends write 1" if "recoverable" in columns
                    else "no Recoverable column: sends leave it out"))
        return out

    """The SQL Server operations of the dialect."""

    @staticmethod
    def _check_limit(limit: int) -> int:
        limit = int(limit)
        if limit < 1:
            raise field_error("limit", f"must be at least 1, not {limit}")
        return limit

    @staticmethod
    def _check_subscription(name: str, value: str) -> str:
        """A value of the SubscriptionRouting table: nvarchar(200) NOT NULL, as NServiceBus makes it;
        errors name the field `name` (endpoint, queue, topic)."""
        if not isinstance(value, str) or not value or len(value) > 200:
            raise field_error(name, f"{value!r} must be 1 to 200 characters (SubscriptionRouting)")
        return value

    def peek_messages(self, queue: QueueAddress, *, limit: int, preview: int) -> Statement:
        # Oldest first through Index_RowVersion, like a receive (NServiceBus's ReceiveText: TOP,
        # READPAST, ORDER BY RowVersion), but without UPDLOCK: nothing is taken, and a receiver or
        # claim running now is neither blocked nor disturbed. Only the first bytes of a body are
        # read (SUBSTRING of varbinary(max)); DATALENGTH is its length. Expires is datetime
        # (1753-9999): every value fits a driver's datetime, so its text column is NULL.
        return Statement(
            "SELECT TOP (?) CAST(Id AS varchar(36)), Expires, CAST(NULL AS nvarchar(40)), Headers,"
            " CAST(SUBSTRING(Body, 1, ?) AS varbinary(8000)), DATALENGTH(Body), RowVersion"
            f" FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion",
            (self._check_limit(limit), check_preview(preview)),
        )

    def peek_delayed(self, delayed: QueueAddress, *, limit: int, preview: int) -> Statement:
        # NServiceBus reads the next due time as `SELECT TOP 1 GETUTCDATE(), Due FROM t WITH
        # (READPAST) ORDER BY Due` (its MoveDueDelayedMessageText): the same order through
        # Index_Due, TOP n, and READCOMMITTEDLOCK as `peek_messages` (READPAST needs locking read
        # committed, which a database with READ_COMMITTED_SNAPSHOT would not give). Due is a UTC
        # datetime.
        return Statement(
            "SELECT TOP (?) Due, Headers, CAST(SUBSTRING(Body, 1, ?) AS varbinary(8000)), DATALENGTH(Body)"
            f" FROM {self.qualified(delayed)} WITH (READPAST, READCOMMITTEDLOCK) ORDER BY Due",
            (self._check_limit(limit), check_preview(preview)),
        )

    def list_queues(self, *, like: tuple[str, str] | None = None) -> Statement:
        # names compare as the database's collation does (case-insensitively by default); the
        # caller's exact match decides
        names = "" if like is None else " AND s.name LIKE ? ESCAPE N'\\' AND t.name LIKE ? ESCAPE N'\\' AND"
        return Statement(
            "SELECT s.name, t.name FROM sys.tables AS t JOIN sys.schemas AS s ON s.schema_id = t.schema_id"
            f" WHERE{names} (SELECT COUNT(*) FROM sys.columns AS c WHERE c.object_id = t.object_id"
            " AND LOWER(c.name) IN (N'id', N'headers', N'body', N'expires', N'rowversion')) = 5"
            " ORDER BY s.name, t.name",
            None if like is None else (like[0], like[1]),
        )

    def nullable_columns(self, table: QueueAddress) -> Statement:
        return Statement(
            f"SELECT LOWER(c.name) FROM {self._sys(table)}columns AS c"
            " WHERE c.object_id = OBJECT_ID(?) AND c.is_nullable = 1 ORDER BY c.column_id",
            (self.qualified(table),),
        )

    def oldest_headers(self, queue: QueueAddress) -> Statement:
        # as peek_messages reads: through Index_RowVersion, nothing taken, no one disturbed
        return Statement(
            f"SELECT TOP (1) Headers FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion")

    def queue_stats(self, queue: QueueAddress) -> Statement:
        q = self.qualified(queue)
        # Exact counts of the committed rows no one holds right now (see above): a queue that
        # receivers are busy on never makes the statistics wait. The expired count seeks the
        # filtered Index_Expires; expired as a receive judges it (Expires <= now, UTC).
        return Statement(
            "SELECT COUNT_BIG(*),"
            f" (SELECT COUNT_BIG(*) FROM {q} WITH (READPAST, READCOMMITTEDLOCK) WHERE Expires <= GETUTCDATE()),"
            " MIN(RowVersion), MAX(RowVersion)"
            f" FROM {q} WITH (READPAST, READCOMMITTEDLOCK)"
        )

    def failure_stats(self, queue: QueueAddress, *, limit: int) -> Statement:
        # The oldest rows through Index_RowVersion, as peek_messages reads (nothing taken, rows
        # others hold skipped), then grouped: a bounded read, headers only. JSON_VALUE fails on
        # text that is not JSON even in lax mode: the CASE reads it only where ISJSON says it is.
        # An array, a missing member or a value past 4,000 characters gives NULL (lax mode).
        return Statement(
            "SELECT t.FailedQ, COUNT_BIG(*) FROM (SELECT TOP (?) CASE WHEN ISJSON(Headers) = 1"
            " THEN JSON_VALUE(Headers, N'$.\"NServiceBus.FailedQ\"') END AS FailedQ"
            f" FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion) AS t"
            " GROUP BY t.FailedQ ORDER BY t.FailedQ",
            (self._check_limit(limit),),
        )

    def delayed_stats(self, delayed: QueueAddress) -> Statement:
        d = self.qualified(delayed)
        # Three seeks on Index_Due; Due is UTC datetime, like GETUTCDATE().
        return Statement(
            f"SELECT (SELECT COUNT_BIG(*) FROM {d} WITH (READPAST, READCOMMITTEDLOCK) WHERE Due <= GETUTCDATE()),"
            f" (SELECT COUNT_BIG(*) FROM {d} WITH (READPAST, READCOMMITTEDLOCK) WHERE Due > GETUTCDATE()),"
            f" (SELECT MIN(Due) FROM {d} WITH (READPAST, READCOMMITTEDLOCK) WHERE Due > GETUTCDATE())"
        )

    def claim_stats(self, claims: QueueAddress) -> Statement:
        # In clustered key order (Consumer, ClaimSeq): a stream aggregate, no sort. Claims being
        # inserted or acknowledged right now are skipped, not waited for.
        return Statement(
            f"SELECT Consumer, COUNT_BIG(*), MIN(ClaimedAt) FROM {self.qualified(claims)}"
            " WITH (READPAST, READCOMMITTEDLOCK) GROUP BY Consumer ORDER BY Consumer"
        )

    def count_rows(self, table: QueueAddress) -> Statement:
        # Committed rows no one holds now: an outbox record being written is not waited for.
        return Statement(f"SELECT COUNT_BIG(*) FROM {self.qualified(table)} WITH (READPAST, READCOMMITTEDLOCK)")

    #: OPENJSON, which the claim, the dispatch, the forward, the delayed mover and the operations
    #: read lists with, exists at database compatibility level 130 (SQL Server 2016) and above
    MIN_COMPATIBILITY_LEVEL = 130

    def database_levels(self, catalogs: Sequence[str]) -> Statement:
        # The connection's database (where every batch runs) and each catalog a queue names.
        # Plain parameters, not OPENJSON: this is what finds out whether OPENJSON exists.
        names = [str(c) for c in catalogs]
        cond = "".join(" OR name = ?" for _ in names)
        return Statement(
            f"SELECT name, compatibility_level FROM sys.databases WHERE name = DB_NAME(){cond} ORDER BY name",
            tuple(names),
        )

    def level_problem(self, database: str, level: int) -> str | None:
        if int(level) >= self.MIN_COMPATIBILITY_LEVEL:
            return None
        name = self.quote(database)
        return (f"database {name} is at compatibility level {int(level)}; spark-qtransport needs "
                f"{self.MIN_COMPATIBILITY_LEVEL} or higher (OPENJSON, SQL Server 2016): "
                f"ALTER DATABASE {name} SET COMPATIBILITY_LEVEL = {self.MIN_COMPATIBILITY_LEVEL}")

    def purge_expired(self, queue: QueueAddress, *, limit: int) -> Statement:
        # NServiceBus's PurgeBatchOfExpiredMessagesText: expired rows through the filtered
        # Index_Expires, rows held by receivers skipped (READPAST), row locks. Expired as a receive
        # judges it: Expires <= now. At most ROW_BOUND rows per DELETE, so none escalates to a
        # lock on the whole queue, until `limit` rows or no more; the batch selects the count.
        sql = f"""
SET NOCOUNT ON;
DECLARE @limit int = ?;
DECLARE @total int = 0, @n int, @chunk int;
WHILE @total < @limit
BEGIN
    SET @chunk = CASE WHEN @limit - @total < {ROW_BOUND} THEN @limit - @total ELSE {ROW_BOUND} END;
    DELETE TOP (@chunk) FROM {self.qualified(queue)} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
    WHERE Expires <= GETUTCDATE();
    SET @n = @@ROWCOUNT;
    SET @total = @total + @n;
    IF @n < @chunk BREAK;
END
SELECT @total AS written;"""
        return Statement(sql.strip(), (self._check_limit(limit),), counted=True)

    def subscribe(self, table: QueueAddress, *, queue_address: str, endpoint: str, topic: str) -> Statement:
        # NServiceBus's SubscribeText: MERGE under HOLDLOCK, TABLOCK (no two subscribers race to
        # insert the same key), the address updated only when it changed. The parameters appear
        # once each, in the USING row; the rest reads them from there.
        sql = f"""
MERGE {self.qualified(table)} WITH (HOLDLOCK, TABLOCK) AS target
USING (SELECT ? AS Endpoint, ? AS QueueAddress, ? AS Topic) AS source
ON target.Endpoint = source.Endpoint
AND target.Topic = source.Topic
WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN
UPDATE SET QueueAddress = source.QueueAddress
WHEN NOT MATCHED THEN
INSERT (QueueAddress, Topic, Endpoint)
VALUES (source.QueueAddress, source.Topic, source.Endpoint);"""
        return Statement(
            sql.strip(),
            (
                self._check_subscription("endpoint", endpoint),
                self._check_subscription("queue", queue_address),
                self._check_subscription("topic", topic),
            ),
        )

    def unsubscribe(self, table: QueueAddress, *, endpoint: str, topic: str) -> Statement:
        # NServiceBus's UnsubscribeText.
        return Statement(
            f"DELETE FROM {self.qualified(table)} WHERE Endpoint = ? AND Topic = ?",
            (self._check_subscription("endpoint", endpoint), self._check_subscription("topic", topic)),
        )

    # Moving messages between queues (sqlqueue error retry): lock rows, insert copies, delete the
    # rows, one transaction. Id is not unique in an NServiceBus queue table (nothing enforces it):
    # a row's key is its RowVersion as text, which IDENTITY makes unique and Index_RowVersion seeks.

    def lock_messages(self, queue: QueueAddress, *, native_ids: list[str] | None, limit: int) -> Statement:
        # A receive's locks, as NServiceBus takes them: UPDLOCK + READPAST + ROWLOCK, so rows a
        # receiver (or ServiceControl, on an error queue) holds are skipped, never waited for, and
        # no one else takes the rows locked here until the transaction ends. Oldest first through
        # Index_RowVersion. Any number of ids travels as one JSON parameter; none selects nothing.
        # At most ROW_BOUND rows: a statement holding about 5,000 locks on the queue escalates to
        # a table lock, which READPAST cannot skip (callers go on while rows are moved).
        limit = int(limit)
        if limit < 0:
            raise field_error("limit", f"must not be negative, not {limit}")
        limit = min(limit, ROW_BOUND)
        sql = (
            "SELECT TOP (?) CAST(RowVersion AS varchar(20)), LOWER(CAST(Id AS varchar(36))), Headers"
            f" FROM {self.qualified(queue)} WITH (UPDLOCK, READPAST, ROWLOCK)"
        )
        if native_ids is None:
            return Statement(sql + " ORDER BY RowVersion", (limit,))
        ids = [_native_id(i) for i in native_ids]
        return Statement(
            sql + " WHERE Id IN (SELECT CAST(value AS uniqueidentifier) FROM OPENJSON(?)) ORDER BY RowVersion",
            (limit, json_list(ids)),
        )

    def move_messages(
        self, queue: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
    ) -> Statement:
        # The rows are this transaction own (locked by lock_messages): READPAST skips only rows
        # others hold.
        return copy_rows(self.qualified(destination), self._sys(destination), [_message_key(k) for k in keys], headers,
                         source=self.qualified(queue), on="AS m WITH (READPAST, READCOMMITTEDLOCK) ON m.RowVersion = k.KeyRow")

    def delete_messages(self, queue: QueueAddress, *, keys: list[str]) -> Statement:
        # Seeks Index_RowVersion per key. The rows are this transaction own (see move_messages).
        # A queue is NServiceBus's: bounded statements (see `bounded`).
        params = Params(named=True)
        marker = params.add("rows", "nvarchar(max)", json_list([[_message_key(k)] for k in keys]))
        keys_sql = json_keys(marker, headers=False)
        step = (f"DELETE m FROM {params.table('queue', self.qualified(queue))} AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)\n"
                f"JOIN #sqlqueue_keys AS k ON m.RowVersion = k.KeyRow\nWHERE {CHUNK};\nSET @n = @@ROWCOUNT;")
        return bounded(params, keys=keys_sql, step=step)

    def indexes(self, table: QueueAddress) -> Statement:
        sys_ = self._sys(table)
        # Key columns only, in key order: included columns have key_ordinal 0, and so do the
        # partitioning columns SQL Server adds to an index silently (is_included_column = 0).
        # Joined up by a recursive CTE rather than STRING_AGG (SQL Server 2017) or FOR XML PATH
        # (fails on names with control characters): runs wherever OPENJSON does, from 2016 on.
        # An index has at most 32 key columns, below the default MAXRECURSION of 100. An index
        # without key columns (columnstore) has NULL columns. Heaps (type 0) are no index;
        # hypothetical indexes (Database Engine Tuning Advisor) are statistics only.
        sql = f"""
WITH t AS (SELECT OBJECT_ID(?) AS id),
k AS (
SELECT ic.object_id, ic.index_id, ic.key_ordinal, CAST(LOWER(c.name) AS nvarchar(max)) AS cols
FROM t
JOIN {sys_}index_columns AS ic ON ic.object_id = t.id AND ic.key_ordinal = 1 AND ic.is_included_column = 0
JOIN {sys_}columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id
UNION ALL
SELECT ic.object_id, ic.index_id, ic.key_ordinal, CAST(k.cols + N',' + LOWER(c.name) AS nvarchar(max))
FROM k
JOIN {sys_}index_columns AS ic ON ic.object_id = k.object_id AND ic.index_id = k.index_id
AND ic.key_ordinal = k.key_ordinal + 1 AND ic.is_included_column = 0
JOIN {sys_}columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id
)
SELECT i.name, k.cols, CAST(CASE WHEN i.type = 1 THEN 1 ELSE 0 END AS bit), i.is_unique, i.filter_definition
FROM t
JOIN {sys_}indexes AS i ON i.object_id = t.id
LEFT JOIN k ON k.object_id = i.object_id AND k.index_id = i.index_id
AND NOT EXISTS (SELECT 1 FROM {sys_}index_columns AS n
WHERE n.object_id = k.object_id AND n.index_id = k.index_id AND n.key_ordinal = k.key_ordinal + 1)
WHERE i.type <> 0 AND i.is_hypothetical = 0
ORDER BY i.name"""
        return Statement(sql.strip(), (self.qualified(table),))

    def grants(
        self, role: str, tables: Mapping[QueueAddress, Sequence[str]], *, queues: Collection[QueueAddress] = ()
    ) -> list[Statement]:
        # Object privileges are all: an IDENTITY column needs none, schemas have no USAGE, and
        # sp_getapplock (the consumer and mover locks) needs only membership in public.
        grantee = self.quote(role)
        out = []
        for table, privileges in tables.items():
            on = ".".join(self.quote(p) for p in (table.schema or self.default_schema, table.table))
            grant = f"GRANT {', '.join(check_privileges(privileges))} ON {on} TO {grantee}"
            if table.catalog:  # GRANT names objects of the current database only
                grant = f"EXEC {self.quote(table.catalog)}.sys.sp_executesql {literal(grant)}"
            out.append(Statement(grant))
        return out

    def privileges(self, table: QueueAddress, privileges: Sequence[str]) -> Statement:
        # NULL when the object does not exist or the role cannot see it at all.
        values = ", ".join(f"(N'{p}')" for p in check_privileges(privileges))
        return Statement(
            f"SELECT p.v, HAS_PERMS_BY_NAME(?, N'OBJECT', p.v) FROM (VALUES {values}) AS p(v)",
            (self.qualified(table),),
        )
