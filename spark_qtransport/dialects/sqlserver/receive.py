"""SQL Server receive: the consumer lock, the claim batch, slices, acknowledgements, forwarding."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from ...errors import QTransportError, field_error
from ...wire import RETRY_COUNTERS
from ..base import ClaimFailures, ClaimNumbering, QueueAddress, ReceiveSql, Statement
from .addressing import SqlServerAddressing
from .statements import (
    MAX_CONSUMER_CHARS,
    MAX_RESOURCE,
    QNAME,
    ROW_BOUND,
    Params,
    insert_messages,
    json_keys,
    json_list,
    key_rows,
)

#: longest ``<database id>.<object id>`` of a consumer lock resource: two ints as text
_MAX_IDS_CHARS = 11 + 1 + 11

#: rows deleted from a queue per DELETE statement of a claim. SQL Server escalates to a table lock
#: once ONE statement holds about 5,000 locks on one table or index (a heap row costs a RID lock,
#: a key lock per index and page intent locks): a table lock on a queue would block every
#: NServiceBus sender and receiver until the claim commits. Below the threshold, never.
CLAIM_CHUNK = ROW_BOUND

# A flat JSON object whose values are strings or null (OPENJSON type 0 = null, 1 = string), or
# empty text: NServiceBus reads empty headers as an empty set (`string.IsNullOrEmpty` in
# Message.cs). DATALENGTH, not = N'': comparison pads with spaces, so N'  ' = N'' is true, and
# blank headers are poison to NServiceBus's JSON reader.
# ISJSON accepts objects and arrays: the first non-blank character tells them apart (JSON allows
# tab, CR and LF before it as well as spaces; LTRIM alone removes only spaces). OPENJSON raises on
# invalid text and the optimizer may evaluate a subquery before the CASE that guards it, so
# OPENJSON's own argument is guarded too: it only ever sees valid JSON or NULL (no rows).
_POISON = (
    "CASE WHEN DATALENGTH(Headers) = 0 THEN 0"
    " WHEN ISJSON(Headers) = 1 AND LEFT(LTRIM(REPLACE(REPLACE(REPLACE(LEFT(Headers, 64),"
    " NCHAR(9), N' '), NCHAR(10), N' '), NCHAR(13), N' ')), 1) = N'{'"
    " THEN CASE WHEN EXISTS (SELECT 1 FROM OPENJSON(CASE WHEN ISJSON(Headers) = 1 THEN Headers END)"
    " WHERE type NOT IN (0, 1)) THEN 1 ELSE 0 END"
    " ELSE 1 END"
)


#: a claimed row that may carry NServiceBus.SqlServer.ForwardDestination (checked exactly in Python)
_FORWARD_LIKE = "N'%NServiceBus.SqlServer.ForwardDestination%'"


#: The poison rows' INSERT, one chunk (`PoisonPos` in (@from, @from + CLAIM_CHUNK]) per call. It
#: runs as dynamic SQL: a batch that names a column an existing table lacks (Recoverable) does not
#: compile, even in a branch that never runs. The text is made of constants and the quoted error
#: table name (a parameter); it reads the temp table of the claim batch, which nested batches see
#: (a table variable they would not).
_INSERT_POISON = (
    "N'INSERT INTO ' + @error + N' (Id{recoverable}, Expires, Headers, Body)"
    " SELECT Id{one}, NULL, Headers, Body FROM #sqlqueue_moved"
    " WHERE PoisonPos > @from AND PoisonPos <= @from + {chunk} ORDER BY PoisonPos'"
)

#: The claim's first step: this endpoint's consumer lock is still held, by this session or (for a
#: claim made ahead on a second session) by another. A session-owned application lock vanishes
#: with its server session, and a connection the driver re-opened in its place has none (the
#: driver's connection resiliency is turned off, see `without_reconnect`; this is the check that
#: does not depend on it). APPLOCK_MODE and APPLOCK_TEST look in the current database: they run
#: in the claim table's, where the lock was taken.
_LOCK_HELD = (
    "DECLARE @held bit = 0;\n"
    "IF @resource IS NOT NULL\n"
    "    EXEC {sys_}sp_executesql N'SET @held = CASE WHEN APPLOCK_MODE(N''public'', @resource, N''Session'') <> N''NoLock''"
    " OR APPLOCK_TEST(N''public'', @resource, N''Exclusive'', N''Session'') = 0 THEN 1 ELSE 0 END;',"
    " N'@resource nvarchar(255), @held bit OUTPUT', @resource = @resource, @held = @held OUTPUT;\n"
    "IF @held = 0\n"
    "    THROW 51000, N'sqlqueue: the consumer lock of this endpoint is no longer held (its connection was reset),"
    " so nothing is claimed; the query restarts its connections', 1;\n"
)

#: The claim batch (see `SqlServerReceive.claim`); ``{q}``, ``{c}``, ``{e}`` the quoted queue,
#: claim and error tables, ``{error_sys}`` the error queue's catalog views, ``{declare_upto}`` and
#: ``{cond_upto}`` the optional upper bound.
_CLAIM = """
SET NOCOUNT ON;
{lock}-- Any error undoes the whole claim: a row leaves the queue only together with its copy in the
-- claim table or the error queue.
SET XACT_ABORT ON;
DECLARE @limit bigint = ?;
DECLARE @after bigint = ?;
{declare_upto}DECLARE @consumer nvarchar({max_consumer}) = ?;
DECLARE @error {qname} = ?;
{declare_failure}DECLARE @chunk bigint, @n bigint;
DECLARE @deleted int, @expired int, @poison int, @nullId int, @toError int, @claimed int, @maxClaim bigint, @maxSource bigint;
DECLARE @minClaim bigint, @forward int;
DECLARE @claimedSeq TABLE (ClaimSeq bigint NOT NULL);
IF OBJECT_ID(N'tempdb..#sqlqueue_moved') IS NOT NULL DROP TABLE #sqlqueue_moved;
CREATE TABLE #sqlqueue_moved (
    Id uniqueidentifier NULL,
    Expires datetime NULL,
    Headers nvarchar(max) NOT NULL,
    Body varbinary(max) NULL,
    RowVersion bigint NOT NULL,
    Expired bit NULL,
    Poison bit NULL,
    NullId bit NULL,
    PoisonPos int NULL
);
-- Take the oldest rows, CLAIM_CHUNK per statement so no statement escalates to a table lock.
-- UPDLOCK + READPAST: rows locked by competing consumers and NServiceBus endpoints are skipped,
-- never waited for, never taken twice. ROWLOCK: lock only the rows taken. This is the receive
-- of NServiceBus (TOP 1), batched. The rows are deleted from the queue and kept in the temp table.
-- NULL Headers (a hand-made table) are no headers, as NServiceBus reads them (MessageRow.GetHeaders:
-- DBNull -> null; Message: string.IsNullOrEmpty -> an empty set).
WHILE @limit > 0
BEGIN
    SET @chunk = CASE WHEN @limit < {chunk} THEN @limit ELSE {chunk} END;
    WITH picked AS (
        SELECT TOP (@chunk) Id, Expires, Headers, Body, RowVersion
        FROM {q} WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE RowVersion > @after{cond_upto}
        ORDER BY RowVersion
    )
    DELETE FROM picked
    OUTPUT deleted.Id, deleted.Expires, ISNULL(deleted.Headers, N''), deleted.Body, deleted.RowVersion
    INTO #sqlqueue_moved (Id, Expires, Headers, Body, RowVersion);
    SET @n = @@ROWCOUNT;
    SET @limit = @limit - @n;
    IF @n < @chunk BREAK;
    -- Go on after the last row taken: the skipped ones below it belong to others.
    SELECT @after = MAX(RowVersion) FROM #sqlqueue_moved;
END
-- Poison rows: headers that are not a flat JSON object of strings or nulls; empty headers are
-- an empty set, as NServiceBus reads them. Expired rows are dropped (counted, never delivered).
UPDATE #sqlqueue_moved SET
    Poison = {poison},
    Expired = CASE WHEN Expires IS NOT NULL AND Expires <= GETUTCDATE() THEN 1 ELSE 0 END;
SELECT @poison = COUNT(*) FROM #sqlqueue_moved WHERE Poison = 1;
-- A row without an Id (a hand-made table) no reader can take (the receive of NServiceBus fails on
-- it at every attempt): it goes to the error queue with a new Id and the failure headers merged into
-- its own (they are a flat JSON object or empty, the poison check said so); expired ones are dropped.
UPDATE #sqlqueue_moved SET NullId = CASE WHEN Id IS NULL AND Poison = 0 AND Expired = 0 THEN 1 ELSE 0 END;
SELECT @nullId = COUNT(*) FROM #sqlqueue_moved WHERE NullId = 1;
IF @nullId > 0
    UPDATE #sqlqueue_moved SET Headers = {merge_failure} WHERE NullId = 1;
UPDATE #sqlqueue_moved SET Id = NEWID() WHERE Id IS NULL AND (Poison = 1 OR NullId = 1);
SET @toError = @poison + @nullId;
IF @toError > 0
BEGIN
    -- Poison rows go raw to the error queue, expired or not (NServiceBus dead-letters a corrupted
    -- row before it looks at its expiry), rows without an Id with failure headers: same Id (a new
    -- one where there was none), Headers and Body, no expiry, Recoverable = 1
    -- where the table has that legacy column (NServiceBus tables have it, with no default).
    -- At most {chunk} rows per INSERT into the error queue, numbered in queue order, so no
    -- statement escalates to a lock on the whole error queue.
    UPDATE m SET PoisonPos = p.Pos
    FROM #sqlqueue_moved AS m
    JOIN (SELECT RowVersion, ROW_NUMBER() OVER (ORDER BY RowVersion) AS Pos
          FROM #sqlqueue_moved WHERE Poison = 1 OR NullId = 1) AS p ON p.RowVersion = m.RowVersion;
    DECLARE @insertError nvarchar(max) = {insert_poison_plain};
    IF EXISTS (SELECT 1 FROM {error_sys}columns WHERE object_id = OBJECT_ID(@error) AND name = N'Recoverable')
        SET @insertError = {insert_poison_recoverable};
    DECLARE @from int = 0;
    WHILE @from < @toError
    BEGIN
        EXEC sys.sp_executesql @insertError, N'@from int', @from = @from;
        SET @from = @from + {chunk};
    END
END
-- The rest is claimed. INSERT ... SELECT ... ORDER BY assigns the IDENTITY values in ORDER BY
-- order (documented by SQL Server), so claim order is queue order.
INSERT INTO {c} (Consumer, Id, Expires, Headers, Body, SourceSeq)
OUTPUT inserted.ClaimSeq INTO @claimedSeq (ClaimSeq)
SELECT @consumer, Id, Expires, Headers, Body, RowVersion
FROM #sqlqueue_moved WHERE Poison = 0 AND Expired = 0 AND NullId = 0 ORDER BY RowVersion;
SET @claimed = @@ROWCOUNT;
SELECT @maxClaim = MAX(ClaimSeq), @minClaim = MIN(ClaimSeq) FROM @claimedSeq;
-- Rows that may carry the ForwardDestination header: the caller forwards them in this transaction.
SELECT @forward = COUNT(*) FROM #sqlqueue_moved WHERE Poison = 0 AND Expired = 0 AND NullId = 0
    AND Headers LIKE {forward_like};
-- Counts by WHERE, never COUNT(<expression that may be NULL>): an aggregate that skips a NULL
-- raises warning 8153, which ODBC reports as one more result before the row below.
SELECT @expired = COUNT(*) FROM #sqlqueue_moved WHERE Poison = 0 AND Expired = 1;
SELECT @deleted = COUNT(*), @maxSource = MAX(RowVersion) FROM #sqlqueue_moved;
DROP TABLE #sqlqueue_moved;
SELECT @deleted AS deleted, @expired AS expired, @poison AS poison, @claimed AS claimed,
       @maxClaim AS max_claim, @maxSource AS max_source, @minClaim AS min_claim, @forward AS forward,
       @nullId AS null_id;
"""


def _failure_merge(failure: str) -> tuple[str, str, list[str]]:
    """The failure headers (JSON text of a flat object) as the claim batch merges them into a row's
    headers: declarations of one bound nvarchar(max) variable per header, the expression (one
    JSON_MODIFY per header: a key the row has is replaced, the rest of its text kept as it is), and
    the values. Header names go into JSON paths, which SQL Server 2016 takes only as literals: they
    are the transport's own constants, checked to be letters and dots."""
    headers = json.loads(failure)
    declare, merged, values = "", "CASE WHEN DATALENGTH(Headers) = 0 THEN N'{}' ELSE Headers END", []
    for name in RETRY_COUNTERS:  # removed, as NServiceBus's MoveToError does (lax mode: a NULL deletes the key)
        if not _HEADER_NAME.fullmatch(name):
            raise QTransportError(f"header {name!r} cannot be removed by the claim", operation="claim")
        merged = f"JSON_MODIFY({merged}, N'$.\"{name}\"', NULL)"
    for n, (name, value) in enumerate(headers.items()):
        if not _HEADER_NAME.fullmatch(name) or not isinstance(value, str):
            raise QTransportError(f"failure header {name!r} cannot be merged by the claim", operation="claim")
        declare += f"DECLARE @failure{n} nvarchar(max) = ?;\n"
        merged = f"JSON_MODIFY({merged}, N'$.\"{name}\"', @failure{n})"
        values.append(value)
    return declare, merged, values


#: a failure header's name, as the claim writes it into a quoted key of a JSON path literal: letters
#: and dots, or NServiceBus's diagnostics prefix ``$.`` (``$.diagnostics.hostid``)
_HEADER_NAME = re.compile(r"(?:\$\.)?[A-Za-z][A-Za-z.]*")


class SqlServerReceive(SqlServerAddressing, ReceiveSql):
    """The SQL Server receive of the dialect."""

    def _check_consumer(self, consumer: str) -> str:
        # nvarchar counts UTF-16 code units: a character beyond the BMP takes two. A longer name
        # would be cut by the claim's nvarchar(200) variable, and its claims never read back.
        if not consumer or "\x00" in consumer or len(consumer.encode("utf-16-le")) // 2 > MAX_CONSUMER_CHARS:
            raise field_error("consumer", f"consumer name {consumer!r} must be 1 to {MAX_CONSUMER_CHARS} characters "
                              "(UTF-16 code units) without NUL (the Consumer column of the claim table)")
        return consumer

    def _lock_resource(self, claims: QueueAddress, consumer: str, *, table: str = "table",
                       who: str = "consumer") -> tuple[str, tuple[Any, ...]]:
        """The application lock of (claim table, consumer): SQL declaring ``@resource`` and its
        parameters.

        Keyed by the claim table's identity, computed on the server, not by its spelling:
        ``Sales``, ``SALES@[dbo]`` and ``Sales@[dbo]@[<current database>]`` are one table, so one
        lock, ``sqlqueue consumer <database id>.<object id> <consumer>``. The ids are digits, so
        the text cannot be read two ways; NULL (no such table) makes the resource NULL. Resources
        are nvarchar(255): a consumer name too long for the rest gets a digest, so two long names
        never share a lock by truncation.
        """
        self._check_consumer(consumer)
        prefix = len("sqlqueue consumer ") + _MAX_IDS_CHARS + 1
        # Folded (upper case, no trailing spaces): sp_getapplock compares resources in binary, a
        # claim table made before its Consumer column compared exactly (BIN2) compares as the
        # database does, by default without case and trailing spaces. `Sales` and `sales` must
        # meet on one lock, or both would receive into one claim table and take each other's rows.
        part = consumer.rstrip(" ").upper()
        if prefix + len(part.encode("utf-16-le")) // 2 > MAX_RESOURCE:
            part = hashlib.sha256(part.encode()).hexdigest()
        db_id, params = ("DB_ID(?)", (claims.catalog,)) if claims.catalog else ("DB_ID()", ())
        sql = (
            f"DECLARE @{table} {QNAME} = ?;\n"
            f"DECLARE @{who} nvarchar(255) = ?;\n"
            f"DECLARE @resource nvarchar(255) = N'sqlqueue consumer ' + CAST({db_id} AS nvarchar(11)) + N'.'"
            f" + CAST(OBJECT_ID(@{table}) AS nvarchar(11)) + N' ' + @{who};\n"
        )
        return sql, (self.qualified(claims), part, *params)

    def table_id(self, table: QueueAddress) -> Statement:
        # OBJECT_ID changes when the table is dropped and created again; NULL when there is none.
        return Statement("SELECT CAST(OBJECT_ID(?) AS nvarchar(20))", (self.qualified(table),))

    def queue_columns(self, table: QueueAddress) -> Statement:
        sys_ = self._sys(table)
        # user_type_id, not system_type_id: nvarchar and sysname share a system type id.
        # Ordinary user tables only: sys.tables holds no view and no synonym (OBJECT_ID of a
        # synonym is the synonym's own id), is_ms_shipped marks system objects in any schema and
        # is_external PolyBase external tables, the counterparts of PostgreSQL foreign tables.
        return Statement(
            "SELECT LOWER(c.name),"
            " CASE WHEN t.name IN (N'varchar', N'char', N'varbinary', N'binary')"
            " THEN t.name + N'(' + CASE WHEN c.max_length = -1 THEN N'max' ELSE CAST(c.max_length AS nvarchar(10)) END + N')'"
            " WHEN t.name IN (N'nvarchar', N'nchar')"
            " THEN t.name + N'(' + CASE WHEN c.max_length = -1 THEN N'max' ELSE CAST(c.max_length / 2 AS nvarchar(10)) END + N')'"
            " ELSE t.name END"
            f" FROM {sys_}columns AS c JOIN {sys_}types AS t ON t.user_type_id = c.user_type_id"
            f" JOIN {sys_}tables AS o ON o.object_id = c.object_id AND o.is_ms_shipped = 0 AND o.is_external = 0"
            " WHERE c.object_id = OBJECT_ID(?) ORDER BY c.column_id",
            (self.qualified(table),),
        )

    def try_lock_consumer(self, claims: QueueAddress, consumer: str) -> Statement:
        # Session-owned: held across transactions until released or the connection closes.
        # LockTimeout 0: a busy consumer is reported at once (return code -1), never waited for.
        # An application lock belongs to a database: this one is taken in the claim table own
        # database, as the delayed mover lock is (see lock_mover), so two sessions whose current
        # databases differ still meet on the same lock when they name the same claim table.
        declare, params = self._lock_resource(claims, consumer)
        return Statement(
            "SET NOCOUNT ON;\n"
            f"{declare}"
            "DECLARE @rc int;\n"
            "IF @resource IS NULL\n"
            "    THROW 51000, N'sqlqueue: the claim table does not exist, so no consumer lock can be taken on it', 1;\n"
            f"EXEC @rc = {self._sys(claims)}sp_getapplock @Resource = @resource, @LockMode = N'Exclusive',"
            " @LockOwner = N'Session', @LockTimeout = 0;\n"
            "SELECT CAST(CASE WHEN @rc >= 0 THEN 1 ELSE 0 END AS bit)",
            params,
        )

    def unlock_consumer(self, claims: QueueAddress, consumer: str) -> Statement:
        # Releasing a lock not held is an error (1223): only release what this session holds.
        # APPLOCK_MODE looks in the current database only: the check and the release run in the
        # claim table own database, where try_lock_consumer took the lock. A claim table dropped
        # meanwhile has no resource: nothing to release here, closing the connection does it.
        declare, params = self._lock_resource(claims, consumer)
        return Statement(
            "SET NOCOUNT ON;\n"
            f"{declare}"
            "IF @resource IS NOT NULL\n"
            f"    EXEC {self._sys(claims)}sp_executesql"
            " N'IF APPLOCK_MODE(N''public'', @resource, N''Session'') <> N''NoLock''"
            " EXEC sys.sp_releaseapplock @Resource = @resource, @LockOwner = N''Session'';',"
            " N'@resource nvarchar(255)', @resource = @resource;",
            params,
        )

    def peek(self, queue: QueueAddress, *, after: int, upto: int | None) -> Statement:
        # UPDLOCK + READPAST: rows another consumer (or NServiceBus endpoint) holds are skipped,
        # never waited for and never counted as work for us (counting them would start a storm
        # of empty claims). ROWLOCK keeps the lock on the one row found; an empty range locks
        # nothing, so an idle queue costs a read, not a write.
        cond = "RowVersion > ?" + (" AND RowVersion <= ?" if upto is not None else "")
        params = (int(after),) + ((int(upto),) if upto is not None else ())
        return Statement(
            f"SELECT TOP (1) RowVersion FROM {self.qualified(queue)} WITH (UPDLOCK, READPAST, ROWLOCK)"
            f" WHERE {cond} ORDER BY RowVersion",
            params,
        )

    def claim(
        self,
        queue: QueueAddress,
        claims: QueueAddress,
        error: QueueAddress,
        *,
        consumer: str,
        limit: int,
        after: int,
        upto: int | None,
        failures: ClaimFailures | None = None,
        numbering: ClaimNumbering | None = None,
    ) -> list[Statement]:
        if numbering is not None:  # only prepared claims number their rows, and SQL Server has none
            raise NotImplementedError("SQL Server claims are numbered by the claim table's IDENTITY")
        q, c, e = self.qualified(queue), self.qualified(claims), self.qualified(error)
        failures = failures or ClaimFailures.build(failed_q=self.format_address(queue), endpoint=queue.table)
        limit = int(limit)
        if limit < 1:
            raise QTransportError(f"claim limit must be at least 1, not {limit}", operation="claim")
        params: list[Any] = [limit, int(after)]
        declare_upto, cond_upto = "", ""
        if upto is not None:
            params.append(int(upto))
            declare_upto, cond_upto = "DECLARE @upto bigint = ?;\n", " AND RowVersion <= @upto"
        declare_failure, merge_failure, failure_values = _failure_merge(failures.null_id)
        params += [self._check_consumer(consumer), e, *failure_values]
        declare, lock_params = self._lock_resource(claims, consumer, table="lockTable", who="lockConsumer")
        params = [*lock_params, *params]
        sql = _CLAIM.format(
            lock=declare + _LOCK_HELD.format(sys_=self._sys(claims)),
            q=q, c=c, e=e, error_sys=self._sys(error), declare_upto=declare_upto, cond_upto=cond_upto,
            declare_failure=declare_failure, merge_failure=merge_failure, max_consumer=MAX_CONSUMER_CHARS, qname=QNAME, chunk=CLAIM_CHUNK, poison=_POISON, forward_like=_FORWARD_LIKE,
            insert_poison_plain=_INSERT_POISON.format(recoverable="", one="", chunk=CLAIM_CHUNK),
            insert_poison_recoverable=_INSERT_POISON.format(recoverable=", Recoverable", one=", 1", chunk=CLAIM_CHUNK),
        )
        return [Statement(sql.strip(), tuple(params))]

    def backlog(self, queue: QueueAddress, *, above: int = 0) -> Statement:
        if above:  # no prepared claims here (`prepared_claims` is False)
            raise ValueError("SQL Server holds no prepared claims to look above")
        # NServiceBus's peek: the span of unlocked sequences. READPAST skips rows being received
        # or inserted; READCOMMITTEDLOCK keeps locking reads on a READ_COMMITTED_SNAPSHOT database.
        return Statement(
            "SELECT isnull(cast(max(RowVersion) - min(RowVersion) + 1 AS bigint), 0)"
            f" FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK)"
        )

    def tables_exist(self, tables: Sequence[QueueAddress]) -> Statement:
        # OBJECT_ID with type 'U': user tables only (no view, no synonym); three-part names reach
        # another database as queue_columns does
        return Statement(
            "SELECT CAST(j.[key] AS int), CASE WHEN OBJECT_ID(j.[value], N'U') IS NULL THEN 0 ELSE 1 END"
            " FROM OPENJSON(?) AS j",
            (json.dumps([self.qualified(t) for t in tables]),),
        )

    def backlogs(self, queues: Sequence[QueueAddress]) -> Statement:
        # NServiceBus's peek (`backlog`) for each queue, one UNION ALL branch a queue: the same
        # READPAST, READCOMMITTEDLOCK read, so a row being received or inserted is skipped, never
        # waited on.
        return Statement(" UNION ALL ".join(
            f"SELECT {int(i)}, (SELECT isnull(cast(max(RowVersion) - min(RowVersion) + 1 AS bigint), 0)"
            f" FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK))"
            for i, queue in enumerate(queues)
        ))

    def max_claim(self, claims: QueueAddress, consumer: str) -> Statement:
        c = self.qualified(claims)
        # Two TOP (1) seeks at the ends of the consumer's range, not an aggregate over all of it.
        return Statement(
            f"SELECT (SELECT TOP (1) ClaimSeq FROM {c} WHERE Consumer = ? ORDER BY ClaimSeq DESC),"
            f" (SELECT TOP (1) ClaimSeq FROM {c} WHERE Consumer = ? ORDER BY ClaimSeq)",
            (self._check_consumer(consumer), consumer),
        )

    def nth_claim(self, claims: QueueAddress, consumer: str, *, after: int, n: int) -> Statement:
        return Statement(
            f"SELECT ClaimSeq FROM {self.qualified(claims)} WHERE Consumer = ? AND ClaimSeq > ?"
            " ORDER BY ClaimSeq OFFSET ? ROWS FETCH NEXT 1 ROWS ONLY",
            (self._check_consumer(consumer), int(after), max(int(n) - 1, 0)),
        )

    def read_claims(self, claims: QueueAddress, consumer: str, *, after: int, upto: int,
                    limit: int | None = None) -> Statement:
        if limit is not None:  # read through one firehose cursor (`read_in_pages` is False)
            raise ValueError("SQL Server reads a slice through one cursor, not in pages")
        return Statement(
            "SELECT ClaimSeq, CAST(Id AS varchar(36)), Expires, Headers, Body, SourceSeq, ClaimedAt"
            f" FROM {self.qualified(claims)}"
            " WHERE Consumer = ? AND ClaimSeq > ? AND ClaimSeq <= ?"
            " ORDER BY ClaimSeq",
            (self._check_consumer(consumer), int(after), int(upto)),
        )

    def ack_claims(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int) -> Statement:
        # The claims of a consumer up to `upto` are all acknowledged: which of them a TOP deletes
        # first does not matter. The claim table never escalates to a table lock (create_claims).
        return Statement(
            f"DELETE TOP (?) FROM {self.qualified(claims)} WHERE Consumer = ? AND ClaimSeq <= ?",
            (int(batch), self._check_consumer(consumer), int(upto)),
        )

    def forward_candidates(self, claims: QueueAddress, consumer: str, *, lo: int, hi: int) -> Statement:
        return Statement(
            f"SELECT ClaimSeq, Headers FROM {self.qualified(claims)}"
            f" WHERE Consumer = ? AND ClaimSeq >= ? AND ClaimSeq <= ? AND Headers LIKE {_FORWARD_LIKE} ORDER BY ClaimSeq",
            (self._check_consumer(consumer), int(lo), int(hi)),
        )

    def claims_with_header(self, claims: QueueAddress, consumer: str, *, upto: int, header: str,
                           limit: int) -> Statement:
        if not re.fullmatch(r"[A-Za-z.]+", header):  # a name of ours, never data: LIKE wildcards cannot appear
            raise ValueError(f"not a header name of ours: {header!r}")
        return Statement(
            f"SELECT TOP (?) ClaimSeq, Headers FROM {self.qualified(claims)} WITH (UPDLOCK, ROWLOCK)"
            " WHERE Consumer = ? AND ClaimSeq <= ? AND CHARINDEX(?, Headers) > 0"
            " ORDER BY ClaimSeq",
            (int(limit), self._check_consumer(consumer), int(upto), header),
        )

    def ack_rows(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int, after: int = 0) -> Statement:
        return Statement(
            f"SELECT TOP (?) ClaimSeq, Headers, ClaimedAt FROM {self.qualified(claims)} WITH (UPDLOCK, ROWLOCK)"
            " WHERE Consumer = ? AND ClaimSeq > ? AND ClaimSeq <= ? ORDER BY ClaimSeq",
            (int(batch), self._check_consumer(consumer), int(after), int(upto)),
        )

    def forward_claims(
        self, claims: QueueAddress, consumer: str, destination: QueueAddress, *, keys: list[int],
        headers: list[str] | None, ttbr_ms: int | None = None,
    ) -> Statement:
        # A new Id, as NServiceBus forwards (MessageRow.From: Guid.NewGuid()); no expiry unless a
        # time to be received is given (then as its send computes Expires: the server's UTC clock;
        # DATEADD takes an int, so seconds and the remaining milliseconds apart). One JSON array of
        # [ClaimSeq(, Headers)]; its positions keep the order of `keys`. Only this consumer's claims
        # are copied: the keys of others' are dropped before the chunks.
        params = Params(named=True)
        ints = [int(k) for k in keys]
        rows = params.add("rows", "nvarchar(max)",
                          json_list([[k] for k in ints] if headers is None else key_rows(ints, headers)))
        who = params.add("consumer", f"nvarchar({MAX_CONSUMER_CHARS})", self._check_consumer(consumer))
        expires = "NULL"
        if ttbr_ms is not None:
            # The chunk runs as dynamic SQL that sees only @lo and @n: the time to be received (an
            # int of our own, from a parsed option) is written as two integer constants.
            seconds, ms = divmod(int(ttbr_ms), 1000)
            expires = f"DATEADD(second, {seconds:d}, DATEADD(ms, {ms:d}, GETUTCDATE()))"
        c = self.qualified(claims)
        keys_sql = (json_keys(rows, headers=headers is not None)
                    + f"\nWHERE EXISTS (SELECT 1 FROM {c} AS c WHERE c.Consumer = {who} AND c.ClaimSeq = k.KeyRow)")
        text = "c.Headers" if headers is None else "k.Headers"
        return insert_messages(self.qualified(destination), self._sys(destination), keys=keys_sql, new_id="NEWID()",
                               select=f"{expires}, {text}, c.Body",
                               joins=f"JOIN {params.table('claims', c)} AS c ON c.ClaimSeq = k.KeyRow", params=params)

    def control_messages(self, destination: QueueAddress, *, headers: list[str]) -> Statement:
        # NServiceBus sends the acknowledgement with an empty body (Array.Empty<byte>()): 0x, not NULL.
        params = Params(named=True)
        rows = params.add("rows", "nvarchar(max)", json_list(key_rows(list(range(len(headers))), headers)))
        return insert_messages(self.qualified(destination), self._sys(destination), keys=json_keys(rows),
                               new_id="NEWID()", select="NULL, k.Headers, 0x", joins="", params=params)

    def set_claim_headers(self, claims: QueueAddress, consumer: str, *, keys: list[int], headers: list[str]) -> Statement:
        rows = key_rows([int(k) for k in keys], headers)
        return Statement(
            f"UPDATE c SET Headers = k.Headers FROM {self.qualified(claims)} AS c"
            " JOIN OPENJSON(?) WITH (KeyRow bigint '$[0]', Headers nvarchar(max) '$[1]') AS k ON c.ClaimSeq = k.KeyRow"
            " WHERE c.Consumer = ?",
            (json_list(rows), self._check_consumer(consumer)),
        )

    def drop_claims(self, claims: QueueAddress, consumer: str, *, keys: list[int]) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(claims)} WHERE Consumer = ?"
            " AND ClaimSeq IN (SELECT k.KeyRow FROM OPENJSON(?) WITH (KeyRow bigint '$') AS k)",
            (self._check_consumer(consumer), json_list([int(k) for k in keys])),
        )

    def max_source_seq(self, queue: QueueAddress) -> Statement:
        # READPAST: rows being inserted (not in the queue yet) or received by others (leaving it)
        # are not waited for.
        return Statement(
            f"SELECT max(RowVersion) FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK)"
        )
