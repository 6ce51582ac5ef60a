"""SQL Server DDL: NServiceBus's queue, delayed and subscription tables, our claim, staging and
outbox tables, each created the NServiceBus installer way."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from ...errors import QTransportError
from ..base import FAILED_TABLE, InstallSql, QueueAddress, Statement
from .addressing import SqlServerAddressing
from .statements import EXACT, MAX_CONSUMER_CHARS, MAX_FINGERPRINT_CHARS, MAX_SINK_CHARS, QNAME, literal, placeholders

#: creating the schema of a table, inside `_CREATE_BATCH`: CREATE SCHEMA must be alone in its
#: batch and run in the catalog it belongs to (``{sys}``, its catalog views)
_CREATE_SCHEMA = """\
        IF NOT EXISTS (SELECT * FROM {sys}schemas WHERE name = @schema)
        BEGIN
            BEGIN TRY
                EXEC {sys}sp_executesql @createSchema;
            END TRY
            BEGIN CATCH
                -- 2714: another installer created the schema meanwhile
                IF ERROR_NUMBER() <> 2714 THROW;
            END CATCH
        END
"""

#: DDL run once, the NServiceBus installer way (see `SqlServerInstall._locked_batch`): a check
#: without a lock, then the table's installer lock inside a transaction, the check again, the DDL
_LOCKED_BATCH = """\
SET NOCOUNT ON;
DECLARE @table {qname} = ?;
DECLARE @lock nvarchar(255) = {lock};
DECLARE @rc int;
{declare_schema}-- Fast path: {fast_path}, no lock is taken.
IF {needed}
BEGIN
    BEGIN TRANSACTION;
    BEGIN TRY
        EXEC @rc = sys.sp_getapplock @Resource = @lock, @LockMode = N'Exclusive', @LockOwner = N'Transaction';
        IF @rc < 0 THROW 51000, N'sqlqueue: timed out waiting for the installer lock', 1;
{create_schema}        -- Check again under the lock: another installer may have been first.
        IF {needed_again}
        BEGIN
{ddl}
        END
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- {done_why}
        IF ERROR_NUMBER() IN ({done}) AND XACT_STATE() = 1
            COMMIT TRANSACTION;
        ELSE
        BEGIN
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END
    END CATCH
END"""

#: `_LOCKED_BATCH`'s table test (``{sys}``: the table's catalog views)
_TABLE_EXISTS = "EXISTS (SELECT * FROM {sys}objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')"


#: the first batch of every script for people. A filtered index (the queue's Index_Expires)
#: can only be created, and a table that has one only written to, with QUOTED_IDENTIFIER and
#: ANSI_NULLS ON. Every ODBC or SqlClient connection (the connector's, NServiceBus's, SSMS's)
#: has both ON, but classic ``sqlcmd`` runs with QUOTED_IDENTIFIER OFF unless given ``-I``:
#: there CREATE INDEX fails with error 1934 and the CATCH rolls the whole table creation back.
#: A batch of its own: QUOTED_IDENTIFIER is applied when a batch is parsed, so it must be set
#: before the batch that needs it is sent.
SCRIPT_SET_OPTIONS = "SET ANSI_NULLS ON;\nSET QUOTED_IDENTIFIER ON;\nGO\n"


class SqlServerInstall(SqlServerAddressing, InstallSql):
    """The SQL Server installers of the dialect."""

    seq_types = MappingProxyType({32: "int", 64: "bigint"})

    def _create_batch(self, table: QueueAddress, ddl: str) -> Statement:
        """Idempotent creation, the NServiceBus installer way: existence check, then the
        ``<table>_lock`` application lock inside a transaction, check again, create.

        The lock resource is the one NServiceBus uses (its quoted ``[catalog].[schema].[table]``
        plus ``_lock``, the catalog defaulting to the current database), so this installer and
        an NServiceBus endpoint starting at the same moment never both create the table.
        """
        sys_ = self._sys(table)
        params: list[Any] = [self.qualified(table)]
        declare_schema = create_schema = ""
        if table.schema:
            params += [table.schema, self.quote(table.schema)]
            declare_schema = "DECLARE @schema sysname = ?;\nDECLARE @createSchema nvarchar(max) = N'CREATE SCHEMA ' + ?;\n"
            create_schema = _CREATE_SCHEMA.format(sys=sys_)
        missing = "NOT " + _TABLE_EXISTS.format(sys=sys_)
        return self._locked_batch(
            table, ddl, params, fast_path="the table exists", needed=missing, needed_again=missing,
            done="2714, 1913", done_why="2714 table and 1913 index already exist: created by someone not taking the lock\n"
            "        -- (sys.objects may lag under load, says NServiceBus). The table is there: done.",
            declare_schema=declare_schema, create_schema=create_schema)

    def _locked_batch(self, table: QueueAddress, ddl: str, params: list[Any], *, fast_path: str, needed: str,
                      needed_again: str, done: str, done_why: str, declare_schema: str = "",
                      create_schema: str = "") -> Statement:
        """`_LOCKED_BATCH` for `table`: `ddl` runs when `needed` holds, then, under the lock, when
        `needed_again` does; errors `done` (someone else did it without the lock) end it as done."""
        sql = _LOCKED_BATCH.format(
            qname=QNAME, declare_schema=declare_schema, create_schema=create_schema, fast_path=fast_path,
            needed=needed, needed_again=needed_again, done=done, done_why=done_why,
            lock="@table + N'_lock'" if table.catalog else "QUOTENAME(DB_NAME()) + N'.' + @table + N'_lock'",
            ddl="\n".join("            " + line if line else "" for line in ddl.strip().splitlines()),
        )
        return Statement(sql, tuple(params))

    def create_queue(self, queue: QueueAddress, *, seq_bits: int = 64) -> list[Statement]:
        seq_type = self.seq_type(seq_bits)
        t = self.qualified(queue)
        # Column for column NServiceBus's CreateQueueText: a heap (a clustered RowVersion index
        # makes every insert and delete fight over the last page), FIFO through Index_RowVersion,
        # expiry purges through the filtered Index_Expires.
        ddl = f"""
CREATE TABLE {t} (
    Id uniqueidentifier NOT NULL,
    CorrelationId varchar(255) NULL,
    ReplyToAddress varchar(255) NULL,
    Recoverable bit NOT NULL,
    Expires datetime NULL,
    Headers nvarchar(max) NOT NULL,
    Body varbinary(max) NULL,
    RowVersion {seq_type} IDENTITY(1,1) NOT NULL
);
CREATE NONCLUSTERED INDEX [Index_RowVersion] ON {t} (RowVersion);
CREATE NONCLUSTERED INDEX [Index_Expires] ON {t} (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL;
"""
        return [self._create_batch(queue, ddl)]

    def create_claims(self, claims: QueueAddress) -> list[Statement]:
        t = self.qualified(claims)
        # Clustered on (Consumer, ClaimSeq): a consumer's claims are one contiguous range, read in
        # slices by executors and deleted from the front by acknowledgements. No lock escalation:
        # a claim inserting, or an acknowledgement deleting, thousands of rows must not take a
        # table lock that blocks executors reading the previous batch.
        ddl = f"""
CREATE TABLE {t} (
    Consumer nvarchar({MAX_CONSUMER_CHARS}) {EXACT} NOT NULL,
    ClaimSeq bigint IDENTITY(1,1) NOT NULL,
    Id uniqueidentifier NOT NULL,
    Expires datetime NULL,
    Headers nvarchar(max) NOT NULL,
    Body varbinary(max) NULL,
    SourceSeq bigint NOT NULL,
    ClaimedAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME(),
    PRIMARY KEY CLUSTERED (Consumer, ClaimSeq)
);
ALTER TABLE {t} SET (LOCK_ESCALATION = DISABLE);
"""
        return [self._create_batch(claims, ddl)]

    def create_staging(self, staging: QueueAddress) -> list[Statement]:
        t = self.qualified(staging)
        # Rows live from a task's stage to the batch's dispatch. Clustered on Seq: staging order.
        # Index_Attempt leads with the attempt every dispatch statement filters on, so a dispatch
        # seeks the batch's own committed rows and never waits for rows other tasks are still
        # writing (locking READ COMMITTED blocks a scan on them). Route and MessageId are only
        # included: a published route is a list of .NET type names, too long for an index key.
        # No lock escalation: a dispatch deleting a big batch must not lock out staging tasks.
        ddl = f"""
CREATE TABLE {t} (
    Seq bigint IDENTITY(1,1) NOT NULL,
    Sink nvarchar({MAX_SINK_CHARS}) {EXACT} NOT NULL,
    BatchId bigint NOT NULL,
    Attempt varchar(64) {EXACT} NOT NULL,
    Kind char(1) NOT NULL,
    Route nvarchar(max) {EXACT} NOT NULL,
    MessageId nvarchar(200) {EXACT} NOT NULL,
    Headers nvarchar(max) NOT NULL,
    Body varbinary(max) NULL,
    TtbrMs bigint NULL,
    DelayMs bigint NULL,
    Due datetime2 NULL,
    StagedAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME(),
    PRIMARY KEY CLUSTERED (Seq)
);
CREATE NONCLUSTERED INDEX [Index_Attempt] ON {t} (Attempt, Kind) INCLUDE (Route, MessageId);
ALTER TABLE {t} SET (LOCK_ESCALATION = DISABLE);
"""
        return [self._create_batch(staging, ddl)]

    def create_outbox(self, outbox: QueueAddress) -> list[Statement]:
        t = self.qualified(outbox)
        # Index_DispatchedAt: the retention cleanup deletes the oldest records without a scan.
        ddl = f"""
CREATE TABLE {t} (
    Sink nvarchar({MAX_SINK_CHARS}) {EXACT} NOT NULL,
    BatchId bigint NOT NULL,
    Fingerprint nvarchar({MAX_FINGERPRINT_CHARS}) NOT NULL,
    Sent int NULL,
    Delayed int NULL,
    Published int NULL,
    DispatchedAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME(),
    PRIMARY KEY CLUSTERED (Sink, BatchId)
);
CREATE NONCLUSTERED INDEX [Index_DispatchedAt] ON {t} (DispatchedAt);
ALTER TABLE {t} SET (LOCK_ESCALATION = DISABLE);
"""
        return [self._create_batch(outbox, ddl)]

    def create_batches(self, table: QueueAddress) -> list[Statement]:
        t = self.qualified(table)
        # A heap with a unique nonclustered key (a clustered key may be 900 bytes at most; a
        # claim table's quoted name alone may be 1,552). EXACT: names compare as PostgreSQL's text.
        ddl = f"""
CREATE TABLE {t} (
    QueryId nvarchar(64) {EXACT} NOT NULL,
    BatchId bigint NOT NULL,
    Claims {QNAME} {EXACT} NOT NULL,
    Consumer nvarchar({MAX_CONSUMER_CHARS}) {EXACT} NOT NULL,
    TableId nvarchar(64) NOT NULL,
    AfterClaim bigint NOT NULL,
    UptoClaim bigint NOT NULL,
    SettledAt datetime2 NULL,
    ReadAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME()
);
CREATE UNIQUE NONCLUSTERED INDEX [Index_Batch] ON {t} (QueryId, BatchId, Claims, Consumer);
CREATE NONCLUSTERED INDEX [Index_Claims] ON {t} (Claims, Consumer, UptoClaim);
ALTER TABLE {t} SET (LOCK_ESCALATION = DISABLE);
"""
        # beside it, the claims the sink failed: a row per failed message until its claim is
        # acknowledged (`dialects.base.settled`)
        failed = self.qualified(table.with_table(FAILED_TABLE))
        failed_ddl = f"""
CREATE TABLE {failed} (
    TableId nvarchar(20) NOT NULL,
    ClaimSeq bigint NOT NULL,
    FailedAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME(),
    PRIMARY KEY CLUSTERED (TableId, ClaimSeq)
);
ALTER TABLE {failed} SET (LOCK_ESCALATION = DISABLE);
"""
        return [self._create_batch(table, ddl), self._create_batch(table.with_table(FAILED_TABLE), failed_ddl)]

    def create_delayed(self, delayed: QueueAddress) -> list[Statement]:
        t = self.qualified(delayed)
        # Column for column NServiceBus's CreateDelayedMessageStoreText: a heap, Due in UTC,
        # found through the non-unique Index_Due.
        ddl = f"""
CREATE TABLE {t} (
    Headers nvarchar(max) NOT NULL,
    Body varbinary(max) NULL,
    Due datetime NOT NULL,
    RowVersion bigint IDENTITY(1,1) NOT NULL
);
CREATE NONCLUSTERED INDEX [Index_Due] ON {t} (Due);
"""
        return [self._create_batch(delayed, ddl)]

    def create_subscriptions(self, table: QueueAddress) -> list[Statement]:
        t = self.qualified(table)
        # NServiceBus's CreateSubscriptionTableText.
        ddl = f"""
CREATE TABLE {t} (
    QueueAddress nvarchar(200) NOT NULL,
    Endpoint nvarchar(200) NOT NULL,
    Topic nvarchar(200) NOT NULL,
    PRIMARY KEY CLUSTERED (Endpoint, Topic)
);
"""
        return [self._create_batch(table, ddl)]

    def script(self, statements: list[Statement]) -> str:
        """The statements as a T-SQL script for people (``sqlqueue ddl``, ``sql/sqlserver/``):
        `SCRIPT_SET_OPTIONS` first, then the statements' batches with their parameters inlined as
        literals, each batch ended by ``GO``."""
        out = [SCRIPT_SET_OPTIONS]
        for stmt in statements:
            sql, params = stmt.sql, tuple(stmt.params or ())
            marks = placeholders(sql)
            if len(marks) != len(params):
                raise QTransportError(f"statement has {len(marks)} parameter markers but {len(params)} parameters",
                                      operation="script")
            for pos, value in reversed(list(zip(marks, params, strict=True))):
                sql = sql[:pos] + literal(value) + sql[pos + 1 :]
            out.append(sql.strip() + "\nGO\n")
        return "\n".join(out)
