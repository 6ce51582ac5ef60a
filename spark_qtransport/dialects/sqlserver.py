"""SQL Server: every SQL statement and identifier rule of the NServiceBus SQL Server transport tables.

Addresses are ``table@[schema]@[catalog]`` and are parsed exactly as NServiceBus's
``QueueAddress.Parse`` does: the table is everything up to the first ``@`` (taken literally, never
unquoted), then schema and catalog, each optionally bracket-quoted (and then allowed to contain
``@``, with ``]`` doubled). Identifiers are quoted ``[like]]this]`` (NServiceBus's ``NameHelper``).

Queue tables are NServiceBus's (``SqlServerConstants.CreateQueueText``): a heap with
``Index_RowVersion`` and a filtered ``Index_Expires``; ``RowVersion bigint IDENTITY`` is the FIFO
order. Columns are always named explicitly, so an added ``BodyString`` column does not matter.
The delayed table and ``SubscriptionRouting`` are NServiceBus's too; ``<endpoint>.Staging`` and
``<endpoint>.Outbox`` are ours. Lists of any length (task attempts, row keys, native ids) travel as
one JSON parameter read with OPENJSON (a request takes at most 2,100 parameters).

Statements are DB-API statements for pyodbc: ``?`` markers, parameters as a tuple in marker order.
A parameterized statement runs inside ``sp_executesql``/``sp_prepexec`` on the server, so the
``SET NOCOUNT``/``SET XACT_ABORT`` of a batch end with it and never leak into the session.
Parameters are never None (pyodbc would have to guess a NULL's type): optional parts of a
statement are left out of its text instead. SQL comments inside statements hold no quote or
question-mark characters, so no driver mistakes them for literals or parameter markers.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ..errors import ConfigError
from .base import STAGED_COLUMNS, Dialect, QueueAddress, Statement, check_privileges, one_line

__all__ = ["SqlServerDialect"]

#: sysname is nvarchar(128): identifiers are limited to 128 characters (UTF-16 code units)
MAX_NAME_CHARS = 128
#: longest quoted three-part name: 3 * (2 + 2 * 128) + 2 dots
_QNAME = "nvarchar(776)"
#: Consumer column width of the claim table
MAX_CONSUMER_CHARS = 200
#: application lock resource names are nvarchar(255)
_MAX_RESOURCE = 255
#: longest ``<database id>.<object id>`` of a consumer lock resource: two ints as text
_MAX_IDS_CHARS = 11 + 1 + 11
#: rows deleted from a queue per DELETE statement of a claim. SQL Server escalates to a table lock
#: once ONE statement holds about 5,000 locks on one table or index (a heap row costs a RID lock,
#: a key lock per index and page intent locks): a table lock on a queue would block every
#: NServiceBus sender and receiver until the claim commits. Below the threshold, never.
CLAIM_CHUNK = 2000
#: Sink column width of the staging and outbox tables
MAX_SINK_CHARS = 200
#: Fingerprint column width of the outbox
MAX_FINGERPRINT_CHARS = 400
#: Text our tables match on (sink, attempt, route, message id) compares exactly, as PostgreSQL
#: text does, whatever the database collation: with a case-insensitive default, routes
#: "Billing" and "billing" (one table) would each pick up both routes' rows and send them twice.
_EXACT = "COLLATE Latin1_General_BIN2"
#: the staging table's column of each of `STAGED_COLUMNS`, in that order
_STAGED = dict(
    zip(
        STAGED_COLUMNS,
        ("Sink", "BatchId", "Attempt", "Kind", "Route", "MessageId", "Headers", "Body", "TtbrMs", "DelayMs", "Due"),
        strict=True,
    )
)

# A flat JSON object whose values are strings or null (OPENJSON type 0 = null, 1 = string).
# ISJSON accepts objects and arrays: the first non-blank character tells them apart (JSON allows
# tab, CR and LF before it as well as spaces; LTRIM alone removes only spaces). OPENJSON raises on
# invalid text and the optimizer may evaluate a subquery before the CASE that guards it, so
# OPENJSON's own argument is guarded too: it only ever sees valid JSON or NULL (no rows).
_POISON = (
    "CASE WHEN ISJSON(Headers) = 1 AND LEFT(LTRIM(REPLACE(REPLACE(REPLACE(LEFT(Headers, 64),"
    " NCHAR(9), N' '), NCHAR(10), N' '), NCHAR(13), N' ')), 1) = N'{'"
    " THEN CASE WHEN EXISTS (SELECT 1 FROM OPENJSON(CASE WHEN ISJSON(Headers) = 1 THEN Headers END)"
    " WHERE type NOT IN (0, 1)) THEN 1 ELSE 0 END"
    " ELSE 1 END"
)

#: a claimed row that may carry NServiceBus.SqlServer.ForwardDestination (checked exactly in Python)
_FORWARD_LIKE = "N'%NServiceBus.SqlServer.ForwardDestination%'"

# -- errors: one classification, behind `SqlServerDialect.is_transient` -----------------------
#
# A pyodbc error's args are (SQLSTATE, message); the message carries each diagnostic record's
# native error number. Permanent markers win (a failed login often comes with a connection
# SQLSTATE); then the transient ones; anything else is permanent and fails at once.

# error numbers that never go away by retrying
_PERMANENT_NUMBERS = frozenset(
    {
        18456,  # login failed
        18452, 18470, 18487, 18488,  # untrusted domain, account disabled, password expired / must change
        4060,  # cannot open database requested by the login
        916,  # the server principal cannot access the database
        229, 230, 262,  # permission denied (object, column, statement)
        208, 207,  # invalid object name, invalid column name
        547,  # constraint conflict
        11001,  # no such host is known (WSAHOST_NOT_FOUND)
    }
)
# error numbers worth a retry on a new connection
_TRANSIENT_NUMBERS = frozenset(
    {
        -2,  # client timeout (SqlClient's number; ODBC reports SQLSTATE HYT00)
        233,  # no process on the other end of the pipe
        1205,  # deadlock victim
        1222,  # lock request time out period exceeded
        4221,  # login to a read-secondary failed: replica not yet available (Azure SQL)
        10053, 10054, 10060,  # connection aborted / reset / timed out
        10928, 10929,  # Azure SQL: resource limit reached
        40197, 40501, 40613,  # Azure SQL: service error, busy, database unavailable
        49918, 49919, 49920,  # Azure SQL: too many operations in progress
    }
)
# SQLSTATEs worth a retry: 08xxx connection exceptions (08S01 link failure, 08001 cannot
# connect), 40001 deadlock victim, HYT00/HYT01 query / connection timeout
_TRANSIENT_STATES = frozenset({"40001", "HYT00", "HYT01"})
# an unknown host is permanent whatever SQLSTATE the driver gives it
_UNKNOWN_HOST = re.compile(
    r"(?i)no such host is known|name or service not known|nodename nor servname|could not translate host name|unknown host"
)
# sentences of SQL Server messages that copy row contents: cut from our errors and logs
_ROW_CONTENTS = re.compile(r"(?i)\s*(?:The duplicate key value is \(.*?\)\.|Truncated value: '.*?'\.)")
# pyodbc formats each diagnostic record as "[SQLSTATE] message (native error) (function)", the
# records joined by "; ": a native number is the parenthesized integer before "(SQL...", ";" or the end.
_NATIVE_NUMBER = re.compile(r"\((-?\d+)\)(?=\s*(?:\(SQL|;|$))")


def _check(kind: str, name: str, option: str | None = None) -> str:
    """Validate one identifier part (quoting makes any text safe, but some text is never a name)."""
    where = f"option '{option}': " if option else ""
    if not isinstance(name, str) or not name or not name.strip():
        raise ConfigError(f"{where}{kind} name is empty")
    if "\x00" in name:
        raise ConfigError(f"{where}{kind} name {name!r} contains a NUL character")
    if len(name.encode("utf-16-le")) // 2 > MAX_NAME_CHARS:
        raise ConfigError(f"{where}{kind} name {name!r} is longer than {MAX_NAME_CHARS} characters")
    return name


def _unquote(part: str) -> str | None:
    """NServiceBus's SafeUnquote: strip one pair of brackets (undoubling ``]]``); blank is None."""
    if len(part) >= 2 and part.startswith("[") and part.endswith("]"):
        part = part[1:-1].replace("]]", "]")
    return part if part.strip() else None


def _next_part(text: str) -> tuple[str, str]:
    """Split off the next ``@``-separated part; inside a bracket-quoted part ``@`` does not count.

    An ``@`` ends a part that does not start with ``[``, or one after an odd number of ``]``
    (the closing bracket: inner ones come doubled). The first character is never a separator.
    """
    closing = 0
    for i in range(1, len(text)):
        ch = text[i]
        if ch == "@" and (text[0] != "[" or closing % 2 == 1):
            return text[:i], text[i + 1 :]
        if ch == "]":
            closing += 1
    return text, ""


def _literal(value: Any) -> str:
    """A T-SQL literal, for scripts shown to people (never for statements that are executed)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value).hex()
    return "N'" + str(value).replace("'", "''") + "'"


def placeholders(sql: str) -> list[int]:
    """Offsets of the ``?`` parameter markers of a statement: those outside ``'literals'``,
    ``[identifiers]``, ``"identifiers"`` and comments (a queue may be named ``[what?]``)."""
    found: list[int] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'[\"":
            close = "]" if ch == "[" else ch
            i += 1
            while i < n:
                if sql[i] == close:
                    if i + 1 < n and sql[i + 1] == close:  # doubled: an escaped closing character
                        i += 2
                        continue
                    break
                i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 1
        elif ch == "?":
            found.append(i)
        i += 1
    return found


def _resource(kind: str, *parts: str) -> str:
    """An application lock resource ``sqlqueue <kind> <parts>``. Resources are nvarchar(255):
    longer names get a digest, so two long names never share a lock by truncation."""
    text = f"sqlqueue {kind} " + " ".join(parts)
    if len(text) <= _MAX_RESOURCE:
        return text
    return f"sqlqueue {kind} " + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _json(values: list[Any]) -> str:
    """One nvarchar(max) parameter for OPENJSON: any number of values in one marker (a request
    takes at most 2,100 parameters), their order kept."""
    return json.dumps(values, ensure_ascii=False, separators=(",", ":"))


def _in(column: str, values: list[str], what: str) -> tuple[str, tuple[str, ...]]:
    """``column IN (?, ...)`` for a short list of strings, ``1 = 0`` for none. Parameters, not
    OPENJSON: a parameter takes the column's collation, a JSON column could conflict with it."""
    values = [str(v) for v in values]
    if len(values) > 1000:
        raise ValueError(f"{len(values)} {what} in one statement; at most 1000")
    if not values:
        return "1 = 0", ()
    return f"{column} IN ({', '.join('?' * len(values))})", tuple(values)


def _attempts(attempts: list[str]) -> tuple[str, str]:
    """(condition, parameter) selecting the staged rows of `attempts`: any number of them, as
    one JSON parameter. OPENJSON columns take the database default collation: an explicit
    COLLATE, the Attempt column's own, avoids a conflict and keeps Index_Attempt seekable."""
    values = [str(a) for a in attempts]
    cond = f"Attempt IN (SELECT a.Attempt {_EXACT} FROM OPENJSON(?) WITH (Attempt varchar(64) '$') AS a)"
    return cond, _json(values)


def _delayed_key(key: str) -> tuple[int, str]:
    """A key of `due_delayed` -> (RowVersion, Due as ISO 8601 text)."""
    row, sep, due = str(key).partition(" ")
    if not sep or not due:
        raise ValueError(f"not a delayed row key: {key!r}")
    return int(row), due


def _message_key(key: str) -> int:
    """A key of `lock_messages` (a RowVersion as text) -> the RowVersion."""
    text = str(key)
    if not re.fullmatch(r"-?[0-9]{1,19}", text) or not -(2**63) <= int(text) < 2**63:
        raise ValueError(f"not a message key: {key!r}")
    return int(text)


def _native_id(value: str) -> str:
    """A native message id (a uniqueidentifier, any case, braces allowed) -> canonical text."""
    try:
        return str(uuid.UUID(str(value).strip()))
    except ValueError:
        raise ValueError(f"not a native message id (a uniqueidentifier): {value!r}") from None


#: the time-to-be-received as Expires, computed on the server like NServiceBus's send. DATEADD
#: takes an int: seconds and the remaining milliseconds are added apart (any bigint of
#: milliseconds up to 68 years), and GETUTCDATE() is datetime, like the Expires column.
_EXPIRES = (
    "CASE WHEN m.TtbrMs IS NULL THEN NULL"
    " ELSE DATEADD(second, m.TtbrMs / 1000, DATEADD(ms, m.TtbrMs % 1000, GETUTCDATE())) END"
)


#: a delayed row (columns prefixed `d`) is the one a key (prefixed `k`) names; see `due_delayed`
_KEY_MATCH = (
    "{d}Due >= DATEADD(ms, -4, CONVERT(datetime, {k}KeyDue, 126))"
    " AND {d}Due <= DATEADD(ms, 4, CONVERT(datetime, {k}KeyDue, 126))"
    " AND {d}RowVersion = {k}KeyRow"
)


class SqlServerDialect(Dialect):
    name = "sqlserver"
    default_schema = "dbo"
    max_table_bytes = 128  # really 128 characters; see _check
    # The schemas of the catalog views. System objects elsewhere (change data capture tables,
    # replication tables) are marked is_ms_shipped, which `queue_columns` filters out.
    system_schemas = frozenset({"sys", "information_schema"})
    #: the server's own databases (mssqlsystemresource is the hidden resource database)
    system_catalogs = frozenset({"master", "model", "msdb", "tempdb", "mssqlsystemresource"})

    def fold_name(self, name: str) -> str:
        # Assumes a case-insensitive database collation (SQL Server's default, such as
        # SQL_Latin1_General_CP1_CI_AS), where Sales and SALES name one table: names compare
        # lower-cased. On a case-sensitive database an allow-list entry then also admits the
        # names differing from it only in case.
        return name.lower()

    def is_system_catalog(self, catalog: str) -> bool:
        return catalog.lower() in self.system_catalogs

    # -- addresses ----------------------------------------------------------------------------

    def quote(self, name: str) -> str:
        _check("identifier", name)
        return "[" + name.replace("]", "]]") + "]"

    def parse_address(self, text: str, *, option: str = "queue") -> QueueAddress:
        """``table``, ``table@schema``, ``table@[schema]@[catalog]``, as NServiceBus parses them.

        The table is everything before the first ``@``, taken literally: ``[X]`` is a table whose
        name has brackets, as in NServiceBus. Text after the catalog part is ignored, as there.
        """
        if text is None or not str(text).strip():
            raise ConfigError(f"option '{option}' is empty: give a queue name such as 'Sales' or 'Sales@[dbo]'")
        text = str(text)
        table, sep, rest = text.partition("@")
        schema = catalog = None
        if sep:
            part, rest = _next_part(rest)
            schema = _unquote(part)
            if rest:
                part, _ = _next_part(rest)
                catalog = _unquote(part)
        try:
            _check("table", table)
            if table.startswith("#"):
                raise ConfigError(f"table name {table!r} starts with '#', which SQL Server reserves for temporary tables")
            if schema is not None:
                _check("schema", schema)
            if catalog is not None:
                _check("catalog", catalog)
        except ConfigError as exc:
            raise ConfigError(f"option '{option}': invalid queue address {text!r}: {exc}") from None
        return QueueAddress(table, schema, catalog)

    def format_address(self, address: QueueAddress) -> str:
        """``table@[schema]`` or ``table@[schema]@[catalog]``: NServiceBus's canonical form."""
        if "@" in address.table:
            raise ConfigError(f"table name {address.table!r} contains '@' and cannot be written as an address")
        text = f"{_check('table', address.table)}@{self.quote(address.schema or self.default_schema)}"
        if address.catalog:
            text += f"@{self.quote(address.catalog)}"
        return text

    def claims_table(self, queue: QueueAddress) -> QueueAddress:
        """``<queue>.Claims`` beside the queue; SQL Server counts the 128 in characters, not bytes."""
        name = f"{queue.table}.Claims"
        if len(name.encode("utf-16-le")) // 2 > MAX_NAME_CHARS:
            raise ConfigError(
                f"queue name {queue.table!r} is too long: its claim table {name!r} would exceed "
                f"{MAX_NAME_CHARS} characters"
            )
        return queue.with_table(name)

    def companion(self, queue: QueueAddress, suffix: str) -> QueueAddress:
        """``<queue>.<suffix>`` beside the queue; SQL Server counts the 128 in characters, not bytes."""
        name = f"{queue.table}.{suffix}"
        if len(name.encode("utf-16-le")) // 2 > MAX_NAME_CHARS:
            raise ConfigError(
                f"queue name {queue.table!r} is too long: its table {name!r} would exceed {MAX_NAME_CHARS} characters"
            )
        return queue.with_table(name)

    def _sys(self, address: QueueAddress) -> str:
        """The catalog views of the address's database: ``sys.`` or ``[catalog].sys.``."""
        return f"{self.quote(address.catalog)}.sys." if address.catalog else "sys."

    # -- savepoints -----------------------------------------------------------------------------

    @staticmethod
    def _check_savepoint(name: str) -> str:
        # Written into the SQL text: a regular identifier only. SQL Server uses 32 characters of it.
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,31}", name):
            raise ValueError(f"savepoint name {name!r} must be a letter or _ then up to 31 letters, digits or _")
        return name

    def savepoint(self, name: str) -> Statement:
        # SAVE TRANSACTION needs an open transaction (error 628 otherwise), and does not open
        # one: pyodbc without autocommit runs in implicit transaction mode, where a transaction
        # starts with the first statement that touches a table, so none may be open yet. There,
        # BEGIN TRANSACTION at @@TRANCOUNT 0 opens two nested transactions (the implicit one and
        # the explicit one, @@TRANCOUNT 2); committing the inner one only lowers the count to 1,
        # leaving the implicit transaction that the driver commit or rollback ends, as usual.
        # Outside implicit mode BEGIN TRANSACTION makes 1 and nothing is committed. No parameter:
        # a plain batch, not sp_executesql (which would refuse to end with a transaction count
        # different from the one it began with).
        return Statement(
            "IF @@TRANCOUNT = 0\n"
            "BEGIN\n"
            "    BEGIN TRANSACTION;\n"
            "    IF @@TRANCOUNT = 2 COMMIT TRANSACTION;\n"
            "END\n"
            f"SAVE TRANSACTION {self._check_savepoint(name)};"
        )

    def rollback_to_savepoint(self, name: str) -> Statement:
        # Undoes the work since the savepoint and keeps the transaction (and @@TRANCOUNT). Only
        # possible while the transaction is committable: an error that dooms it (XACT_STATE -1:
        # XACT_ABORT, most errors raised in a trigger) or ends it (a trigger that rolls back)
        # leaves no savepoint to return to. Then this raises, and the caller error path rolls
        # the whole transaction back.
        return Statement(
            "IF XACT_STATE() = 1\n"
            f"    ROLLBACK TRANSACTION {self._check_savepoint(name)};\n"
            "ELSE\n"
            "    THROW 51000, N'sqlqueue: the failed statement ended the transaction (an error in a trigger"
            " or XACT_ABORT), so it cannot be rolled back to a savepoint', 1;"
        )

    def release_savepoint(self, name: str) -> Statement | None:
        self._check_savepoint(name)
        return None  # SQL Server has no RELEASE: a savepoint lives until the transaction ends

    # -- installers ---------------------------------------------------------------------------

    def _create_batch(self, table: QueueAddress, ddl: str) -> Statement:
        """Idempotent creation, the NServiceBus installer way: existence check, then the
        ``<table>_lock`` application lock inside a transaction, check again, create.

        The lock resource is the one NServiceBus uses (its quoted ``[catalog].[schema].[table]``
        plus ``_lock``, the catalog defaulting to the current database), so this installer and
        an NServiceBus endpoint starting at the same moment never both create the table.
        """
        sys_ = self._sys(table)
        qualified = self.qualified(table)
        params: list[Any] = [qualified]
        lock = "@table + N'_lock'" if table.catalog else "QUOTENAME(DB_NAME()) + N'.' + @table + N'_lock'"
        declare_schema = create_schema = ""
        if table.schema:
            params += [table.schema, self.quote(table.schema)]
            declare_schema = "DECLARE @schema sysname = ?;\nDECLARE @createSchema nvarchar(max) = N'CREATE SCHEMA ' + ?;\n"
            # CREATE SCHEMA must be alone in its batch and run in the catalog it belongs to.
            create_schema = (
                f"        IF NOT EXISTS (SELECT * FROM {sys_}schemas WHERE name = @schema)\n"
                "        BEGIN\n"
                "            BEGIN TRY\n"
                f"                EXEC {sys_}sp_executesql @createSchema;\n"
                "            END TRY\n"
                "            BEGIN CATCH\n"
                "                -- 2714: another installer created the schema meanwhile\n"
                "                IF ERROR_NUMBER() <> 2714 THROW;\n"
                "            END CATCH\n"
                "        END\n"
            )
        body = "\n".join("            " + line if line else "" for line in ddl.strip().splitlines())
        sql = (
            "SET NOCOUNT ON;\n"
            f"DECLARE @table {_QNAME} = ?;\n"
            f"DECLARE @lock nvarchar(255) = {lock};\n"
            "DECLARE @rc int;\n"
            f"{declare_schema}"
            "-- Fast path: the table exists, no lock is taken.\n"
            f"IF NOT EXISTS (SELECT * FROM {sys_}objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')\n"
            "BEGIN\n"
            "    BEGIN TRANSACTION;\n"
            "    BEGIN TRY\n"
            "        EXEC @rc = sys.sp_getapplock @Resource = @lock, @LockMode = N'Exclusive', @LockOwner = N'Transaction';\n"
            "        IF @rc < 0 THROW 51000, N'sqlqueue: timed out waiting for the installer lock', 1;\n"
            f"{create_schema}"
            "        -- Check again under the lock: another installer may have been first.\n"
            f"        IF NOT EXISTS (SELECT * FROM {sys_}objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')\n"
            "        BEGIN\n"
            f"{body}\n"
            "        END\n"
            "        COMMIT TRANSACTION;\n"
            "    END TRY\n"
            "    BEGIN CATCH\n"
            "        -- 2714 table and 1913 index already exist: created by someone not taking the lock\n"
            "        -- (sys.objects may lag under load, says NServiceBus). The table is there: done.\n"
            "        IF ERROR_NUMBER() IN (2714, 1913) AND XACT_STATE() = 1\n"
            "            COMMIT TRANSACTION;\n"
            "        ELSE\n"
            "        BEGIN\n"
            "            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;\n"
            "            THROW;\n"
            "        END\n"
            "    END CATCH\n"
            "END"
        )
        return Statement(sql, tuple(params))

    def create_queue(self, queue: QueueAddress, *, seq_bits: int = 64) -> list[Statement]:
        seq_type = {32: "int", 64: "bigint"}.get(seq_bits)
        if seq_type is None:
            raise ConfigError(f"seq_bits must be 32 or 64, not {seq_bits!r}")
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
    Consumer nvarchar({MAX_CONSUMER_CHARS}) NOT NULL,
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
    Sink nvarchar({MAX_SINK_CHARS}) {_EXACT} NOT NULL,
    BatchId bigint NOT NULL,
    Attempt varchar(64) {_EXACT} NOT NULL,
    Kind char(1) NOT NULL,
    Route nvarchar(max) {_EXACT} NOT NULL,
    MessageId nvarchar(200) {_EXACT} NOT NULL,
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
    Sink nvarchar({MAX_SINK_CHARS}) {_EXACT} NOT NULL,
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
        parameters inlined as literals, batches separated by ``GO``."""
        out = []
        for stmt in statements:
            sql, params = stmt.sql, tuple(stmt.params or ())
            marks = placeholders(sql)
            if len(marks) != len(params):
                raise ValueError(f"statement has {len(marks)} parameter markers but {len(params)} parameters")
            for pos, value in reversed(list(zip(marks, params, strict=True))):
                sql = sql[:pos] + _literal(value) + sql[pos + 1 :]
            out.append(sql.strip() + "\nGO\n")
        return "\n".join(out)

    # -- receive ------------------------------------------------------------------------------

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

    def _check_consumer(self, consumer: str) -> str:
        if not consumer or "\x00" in consumer or len(consumer) > MAX_CONSUMER_CHARS:
            raise ConfigError(
                f"option 'endpoint': consumer name {consumer!r} must be 1 to {MAX_CONSUMER_CHARS} characters "
                "without NUL (the Consumer column of the claim table)"
            )
        return consumer

    def _lock_resource(self, claims: QueueAddress, consumer: str) -> tuple[str, tuple[Any, ...]]:
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
        part = consumer
        if prefix + len(consumer.encode("utf-16-le")) // 2 > _MAX_RESOURCE:
            part = hashlib.sha256(consumer.encode()).hexdigest()
        db_id, params = ("DB_ID(?)", (claims.catalog,)) if claims.catalog else ("DB_ID()", ())
        sql = (
            f"DECLARE @table {_QNAME} = ?;\n"
            "DECLARE @consumer nvarchar(255) = ?;\n"
            f"DECLARE @resource nvarchar(255) = N'sqlqueue consumer ' + CAST({db_id} AS nvarchar(11)) + N'.'"
            " + CAST(OBJECT_ID(@table) AS nvarchar(11)) + N' ' + @consumer;\n"
        )
        return sql, (self.qualified(claims), part, *params)

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
    ) -> list[Statement]:
        q, c, e = self.qualified(queue), self.qualified(claims), self.qualified(error)
        limit = int(limit)
        if limit < 1:
            raise ValueError(f"claim limit must be at least 1, not {limit}")
        params: list[Any] = [limit, int(after)]
        declare_upto, cond_upto = "", ""
        if upto is not None:
            params.append(int(upto))
            declare_upto, cond_upto = "DECLARE @upto bigint = ?;\n", " AND RowVersion <= @upto"
        params += [self._check_consumer(consumer), e]
        # The INSERT naming Recoverable runs as dynamic SQL: a batch that names a column an
        # existing table lacks does not compile, even in a branch that never runs. The dynamic
        # text is made of constants and the quoted error table name; it reads the temp table of
        # this batch, which nested batches see (a table variable they would not).
        insert_recoverable = (
            "N'INSERT INTO ' + @error + N' (Id, Recoverable, Expires, Headers, Body)"
            " SELECT Id, 1, NULL, Headers, Body FROM #sqlqueue_moved"
            " WHERE Poison = 1 AND Expired = 0 ORDER BY RowVersion'"
        )
        sql = f"""
SET NOCOUNT ON;
-- Any error undoes the whole claim: a row leaves the queue only together with its copy in the
-- claim table or the error queue.
SET XACT_ABORT ON;
DECLARE @limit bigint = ?;
DECLARE @after bigint = ?;
{declare_upto}DECLARE @consumer nvarchar({MAX_CONSUMER_CHARS}) = ?;
DECLARE @error {_QNAME} = ?;
DECLARE @chunk bigint, @n bigint;
DECLARE @deleted int, @expired int, @poison int, @claimed int, @maxClaim bigint, @maxSource bigint;
DECLARE @minClaim bigint, @forward int;
DECLARE @claimedSeq TABLE (ClaimSeq bigint NOT NULL);
IF OBJECT_ID(N'tempdb..#sqlqueue_moved') IS NOT NULL DROP TABLE #sqlqueue_moved;
CREATE TABLE #sqlqueue_moved (
    Id uniqueidentifier NOT NULL,
    Expires datetime NULL,
    Headers nvarchar(max) NOT NULL,
    Body varbinary(max) NULL,
    RowVersion bigint NOT NULL,
    Expired bit NULL,
    Poison bit NULL
);
-- Take the oldest rows, CLAIM_CHUNK per statement so no statement escalates to a table lock.
-- UPDLOCK + READPAST: rows locked by competing consumers and NServiceBus endpoints are skipped,
-- never waited for, never taken twice. ROWLOCK: lock only the rows taken. This is the receive
-- of NServiceBus (TOP 1), batched. The rows are deleted from the queue and kept in the temp table.
WHILE @limit > 0
BEGIN
    SET @chunk = CASE WHEN @limit < {CLAIM_CHUNK} THEN @limit ELSE {CLAIM_CHUNK} END;
    WITH picked AS (
        SELECT TOP (@chunk) Id, Expires, Headers, Body, RowVersion
        FROM {q} WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE RowVersion > @after{cond_upto}
        ORDER BY RowVersion
    )
    DELETE FROM picked
    OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion
    INTO #sqlqueue_moved (Id, Expires, Headers, Body, RowVersion);
    SET @n = @@ROWCOUNT;
    SET @limit = @limit - @n;
    IF @n < @chunk BREAK;
    -- Go on after the last row taken: the skipped ones below it belong to others.
    SELECT @after = MAX(RowVersion) FROM #sqlqueue_moved;
END
-- Expired rows are dropped (counted, never delivered). Poison rows: headers that are not a flat
-- JSON object of strings or nulls.
UPDATE #sqlqueue_moved SET
    Expired = CASE WHEN Expires IS NOT NULL AND Expires <= GETUTCDATE() THEN 1 ELSE 0 END,
    Poison = {_POISON};
SELECT @poison = COUNT(*) FROM #sqlqueue_moved WHERE Poison = 1 AND Expired = 0;
IF @poison > 0
BEGIN
    -- Poison rows go raw to the error queue: same Id, Headers and Body, no expiry, Recoverable = 1
    -- where the table has that legacy column (NServiceBus tables have it, with no default).
    IF EXISTS (SELECT 1 FROM {self._sys(error)}columns WHERE object_id = OBJECT_ID(@error) AND name = N'Recoverable')
    BEGIN
        DECLARE @insertError nvarchar(max) = {insert_recoverable};
        EXEC sys.sp_executesql @insertError;
    END
    ELSE
    BEGIN
        INSERT INTO {e} (Id, Expires, Headers, Body)
        SELECT Id, NULL, Headers, Body FROM #sqlqueue_moved WHERE Poison = 1 AND Expired = 0 ORDER BY RowVersion;
    END
END
-- The rest is claimed. INSERT ... SELECT ... ORDER BY assigns the IDENTITY values in ORDER BY
-- order (documented by SQL Server), so claim order is queue order.
INSERT INTO {c} (Consumer, Id, Expires, Headers, Body, SourceSeq)
OUTPUT inserted.ClaimSeq INTO @claimedSeq (ClaimSeq)
SELECT @consumer, Id, Expires, Headers, Body, RowVersion
FROM #sqlqueue_moved WHERE Poison = 0 AND Expired = 0 ORDER BY RowVersion;
SET @claimed = @@ROWCOUNT;
SELECT @maxClaim = MAX(ClaimSeq), @minClaim = MIN(ClaimSeq) FROM @claimedSeq;
-- Rows that may carry the ForwardDestination header: the caller forwards them in this transaction.
SELECT @forward = COUNT(*) FROM #sqlqueue_moved WHERE Poison = 0 AND Expired = 0 AND Headers LIKE {_FORWARD_LIKE};
SELECT @deleted = COUNT(*), @expired = COUNT(CASE WHEN Expired = 1 THEN 1 END), @maxSource = MAX(RowVersion)
FROM #sqlqueue_moved;
DROP TABLE #sqlqueue_moved;
SELECT @deleted AS deleted, @expired AS expired, @poison AS poison, @claimed AS claimed,
       @maxClaim AS max_claim, @maxSource AS max_source, @minClaim AS min_claim, @forward AS forward;
"""
        return [Statement(sql.strip(), tuple(params))]

    def backlog(self, queue: QueueAddress) -> Statement:
        # NServiceBus's peek: the span of unlocked sequences. READPAST skips rows being received
        # or inserted; READCOMMITTEDLOCK keeps locking reads on a READ_COMMITTED_SNAPSHOT database.
        return Statement(
            "SELECT isnull(cast(max(RowVersion) - min(RowVersion) + 1 AS bigint), 0)"
            f" FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK)"
        )

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

    def read_claims(self, claims: QueueAddress, consumer: str, *, after: int, upto: int) -> Statement:
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

    def forward_claims(
        self, claims: QueueAddress, consumer: str, destination: QueueAddress, *, keys: list[int],
        headers: list[str], recoverable: bool = False,
    ) -> Statement:
        if len(keys) != len(headers):
            raise ValueError(f"{len(keys)} keys but {len(headers)} headers")
        rows = [[int(k), str(h)] for k, h in zip(keys, headers, strict=True)]
        cols, _ = self._queue_columns(recoverable)
        lead = "c.Id, NULL, NULL, 1" if recoverable else "c.Id, NULL, NULL"
        # Same Id, no expiry, as NServiceBus forwards (Id is no key in a queue table). One JSON
        # array of [ClaimSeq, Headers]; its [key] keeps the order of `keys`.
        sql = f"""
INSERT INTO {self.qualified(destination)} ({cols})
SELECT {lead}, NULL, k.Headers, c.Body
FROM OPENJSON(?) AS o
CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]', Headers nvarchar(max) '$[1]') AS k
JOIN {self.qualified(claims)} AS c ON c.Consumer = ? AND c.ClaimSeq = k.KeyRow
ORDER BY CAST(o.[key] AS int)"""
        return Statement(sql.strip(), (_json(rows), self._check_consumer(consumer)))

    def set_claim_headers(self, claims: QueueAddress, consumer: str, *, keys: list[int], headers: list[str]) -> Statement:
        if len(keys) != len(headers):
            raise ValueError(f"{len(keys)} keys but {len(headers)} headers")
        rows = [[int(k), str(h)] for k, h in zip(keys, headers, strict=True)]
        return Statement(
            f"UPDATE c SET Headers = k.Headers FROM {self.qualified(claims)} AS c"
            " JOIN OPENJSON(?) WITH (KeyRow bigint '$[0]', Headers nvarchar(max) '$[1]') AS k ON c.ClaimSeq = k.KeyRow"
            " WHERE c.Consumer = ?",
            (_json(rows), self._check_consumer(consumer)),
        )

    def drop_claims(self, claims: QueueAddress, consumer: str, *, keys: list[int]) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(claims)} WHERE Consumer = ?"
            " AND ClaimSeq IN (SELECT k.KeyRow FROM OPENJSON(?) WITH (KeyRow bigint '$') AS k)",
            (self._check_consumer(consumer), _json([int(k) for k in keys])),
        )

    def max_source_seq(self, queue: QueueAddress) -> Statement:
        # READPAST: rows being inserted (not in the queue yet) or received by others (leaving it)
        # are not waited for.
        return Statement(
            f"SELECT max(RowVersion) FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK)"
        )

    # -- send: staging -------------------------------------------------------------------------

    def stage_rows(self, conn: Any, staging: QueueAddress, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return  # pyodbc refuses an empty executemany
        cols = ", ".join(_STAGED.values())
        marks = ", ".join("?" * len(_STAGED))
        names = list(_STAGED)
        due, body = names.index("due"), names.index("body")
        data = []
        for row in rows:
            values = list(row)
            if len(values) != len(_STAGED):
                raise ValueError(f"a staged row has {len(values)} values, not {len(_STAGED)} ({', '.join(_STAGED)})")
            if isinstance(values[body], (bytearray, memoryview)):
                values[body] = bytes(values[body])
            when = values[due]
            if isinstance(when, datetime) and when.tzinfo is not None:
                # datetime2 has no time zone: stored as UTC wall-clock time (naive is taken as UTC)
                values[due] = when.astimezone(timezone.utc).replace(tzinfo=None)
            data.append(tuple(values))
        cur = conn.cursor()
        try:
            # One round trip per array of rows: pyodbc binds the parameter types the server
            # describes for the INSERT, so None needs no guessing.
            cur.fast_executemany = True
            cur.executemany(f"INSERT INTO {self.qualified(staging)} ({cols}) VALUES ({marks})", data)
        finally:
            cur.close()

    # -- send: dispatch -------------------------------------------------------------------------

    @staticmethod
    def _check_sink(sink: str) -> str:
        if not isinstance(sink, str) or not sink or len(sink) > MAX_SINK_CHARS:
            raise ValueError(f"sink name {sink!r} must be 1 to {MAX_SINK_CHARS} characters")
        return sink

    def outbox_insert(self, outbox: QueueAddress, *, sink: str, batch_id: int, fingerprint: str) -> Statement:
        if not fingerprint or len(fingerprint) > MAX_FINGERPRINT_CHARS:
            raise ValueError(f"outbox fingerprint must be 1 to {MAX_FINGERPRINT_CHARS} characters, not {fingerprint!r}")
        t = self.qualified(outbox)
        # UPDLOCK + HOLDLOCK: the key (present or not) stays locked until commit, so a second
        # dispatcher of the batch waits here, then finds the record (rowcount 0). One statement
        # without SET NOCOUNT: its rowcount is what the caller reads.
        return Statement(
            f"INSERT INTO {t} (Sink, BatchId, Fingerprint) SELECT ?, ?, ?"
            f" WHERE NOT EXISTS (SELECT 1 FROM {t} WITH (UPDLOCK, HOLDLOCK) WHERE Sink = ? AND BatchId = ?)",
            (self._check_sink(sink), int(batch_id), str(fingerprint), sink, int(batch_id)),
        )

    def outbox_get(self, outbox: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        # DispatchedAt is datetime2 without time zone: UTC wall-clock time.
        return Statement(
            f"SELECT Fingerprint, DispatchedAt, Sent, Delayed, Published FROM {self.qualified(outbox)}"
            " WHERE Sink = ? AND BatchId = ?",
            (self._check_sink(sink), int(batch_id)),
        )

    def outbox_finish(
        self, outbox: QueueAddress, *, sink: str, batch_id: int, sent: int, delayed: int, published: int
    ) -> Statement:
        return Statement(
            f"UPDATE {self.qualified(outbox)} SET Sent = ?, Delayed = ?, Published = ? WHERE Sink = ? AND BatchId = ?",
            (int(sent), int(delayed), int(published), self._check_sink(sink), int(batch_id)),
        )

    def subscribers(self, table: QueueAddress, topics: list[str]) -> Statement:
        # NServiceBus's GetSubscribersText, with the topic each address subscribed to.
        cond, params = _in("Topic", topics, "topics")
        return Statement(f"SELECT DISTINCT QueueAddress, Topic FROM {self.qualified(table)} WHERE {cond}", params)

    def _queue_columns(self, recoverable: bool) -> tuple[str, str]:
        """(columns, leading values) of an INSERT of new messages into a queue table: a new Id,
        the legacy columns NULL, and Recoverable = 1 where the table has that column."""
        if recoverable:
            return ("Id, CorrelationId, ReplyToAddress, Recoverable, Expires, Headers, Body", "NEWID(), NULL, NULL, 1")
        return ("Id, CorrelationId, ReplyToAddress, Expires, Headers, Body", "NEWID(), NULL, NULL")

    def dispatch(
        self,
        staging: QueueAddress,
        destination: QueueAddress,
        *,
        attempts: list[str],
        route: str | None,
        publish_routes: list[str],
        recoverable: bool = False,
    ) -> Statement:
        first, params = self._first_staged(staging, attempts=attempts, route=route, publish_routes=publish_routes)
        cols, lead = self._queue_columns(recoverable)
        # INSERT ... SELECT ... ORDER BY assigns the RowVersion IDENTITY values in ORDER BY order
        # (documented), so queue order is staging order.
        sql = f"""
INSERT INTO {self.qualified(destination)} ({cols})
SELECT {lead}, {_EXPIRES}, m.Headers, m.Body
{first}"""
        return Statement(sql.strip(), params)

    def _first_staged(
        self, staging: QueueAddress, *, attempts: list[str], route: str | None, publish_routes: list[str]
    ) -> tuple[str, tuple[Any, ...]]:
        """``FROM ... ORDER BY`` of the staged rows a dispatch sends (`m`, in staging order) and
        its parameters: what `dispatch` inserts and `staged_messages` reads."""
        s = self.qualified(staging)
        cond, attempts_json = _attempts(attempts)
        params: list[Any] = [attempts_json]
        routes = []
        if route is not None:
            routes.append("(Kind = 's' AND Route = ?)")
            params.append(str(route))
        if publish_routes:
            in_routes, route_params = _in("Route", publish_routes, "published routes")
            routes.append(f"(Kind = 'p' AND {in_routes})")
            params += route_params
        # `f` picks one staged row per message id (the first staged, as NServiceBus's dispatcher
        # deduplicates on message id and destination) from the index alone; the join then reads
        # each picked row by its clustered key.
        sql = f"""FROM (SELECT MIN(Seq) AS Seq FROM {s}
      WHERE {cond}
        AND ({' OR '.join(routes) or '1 = 0'})
      GROUP BY MessageId) AS f
JOIN {s} AS m ON m.Seq = f.Seq
ORDER BY f.Seq"""
        return sql, tuple(params)

    def staged_messages(
        self, staging: QueueAddress, *, attempts: list[str], route: str | None, publish_routes: list[str]
    ) -> Statement:
        # The rows `dispatch` would insert, keyed by their Seq (the clustered key `move_staged` seeks).
        first, params = self._first_staged(staging, attempts=attempts, route=route, publish_routes=publish_routes)
        return Statement(f"SELECT m.Seq, m.Headers\n{first}", params)

    def move_staged(
        self, staging: QueueAddress, destination: QueueAddress, *, keys: list[Any], headers: list[str],
        recoverable: bool = False,
    ) -> Statement:
        # Each staged row is read by its clustered key, as `dispatch` reads them: committed rows
        # of the batch, no hint needed.
        return self._copy_rows(destination, [int(k) for k in keys], headers, recoverable=recoverable,
                               source=f"{self.qualified(staging)} AS m ON m.Seq = k.KeyRow")

    def _copy_rows(
        self, destination: QueueAddress, keys: list[int], headers: list[str], *, recoverable: bool, source: str
    ) -> Statement:
        """INSERT rows of `source` (joined as ``m`` on ``k.KeyRow``) into a queue with new ids,
        Expires NULL and the given headers, in the order of `keys`. One JSON array of
        [key, Headers]; its [key] is the position, so the new RowVersion values follow that order
        (INSERT ... SELECT ... ORDER BY)."""
        if len(keys) != len(headers):
            raise ValueError(f"{len(keys)} keys but {len(headers)} headers")
        rows = [[k, str(h)] for k, h in zip(keys, headers, strict=True)]
        cols, lead = self._queue_columns(recoverable)
        sql = f"""
INSERT INTO {self.qualified(destination)} ({cols})
SELECT {lead}, NULL, k.Headers, m.Body
FROM OPENJSON(?) AS o
CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]', Headers nvarchar(max) '$[1]') AS k
JOIN {source}
ORDER BY CAST(o.[key] AS int)"""
        return Statement(sql.strip(), (_json(rows),))

    def dispatch_delayed(self, staging: QueueAddress, delayed: QueueAddress, *, attempts: list[str]) -> Statement:
        s, d = self.qualified(staging), self.qualified(delayed)
        cond, attempts_json = _attempts(attempts)
        # Due as NServiceBus's StoreDelayedMessageText computes it: on the server, in UTC, as
        # datetime; DATEADD takes an int, so seconds and the remaining milliseconds apart.
        sql = f"""
INSERT INTO {d} (Headers, Body, Due)
SELECT Headers, Body, COALESCE(Due, DATEADD(second, DelayMs / 1000, DATEADD(ms, DelayMs % 1000, GETUTCDATE())))
FROM {s}
WHERE {cond} AND Kind = 'd'
ORDER BY Seq"""
        return Statement(sql.strip(), (attempts_json,))

    def delete_staged(self, staging: QueueAddress, *, attempts: list[str]) -> Statement:
        # No READPAST: the rowcount is checked against what the tasks staged.
        cond, attempts_json = _attempts(attempts)
        return Statement(f"DELETE FROM {self.qualified(staging)} WHERE {cond}", (attempts_json,))

    def delete_batch_leftovers(self, staging: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        # READPAST: rows other tasks are still writing (another batch, or a zombie attempt of
        # this one) are skipped, not waited for; the retention cleanup takes what is left.
        return Statement(
            f"DELETE FROM {self.qualified(staging)} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE Sink = ? AND BatchId = ?",
            (self._check_sink(sink), int(batch_id)),
        )

    # -- send: cleanup --------------------------------------------------------------------------

    def outbox_cleanup(self, outbox: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        # Through Index_DispatchedAt; records of dispatches in progress are skipped.
        return Statement(
            f"DELETE TOP (?) FROM {self.qualified(outbox)} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE DispatchedAt < DATEADD(second, -?, SYSUTCDATETIME())",
            (int(limit), int(older_than_seconds)),
        )

    def staging_cleanup(self, staging: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        # Rows tasks are writing now are skipped, never waited for.
        return Statement(
            f"DELETE TOP (?) FROM {self.qualified(staging)} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE StagedAt < DATEADD(second, -?, SYSUTCDATETIME())",
            (int(limit), int(older_than_seconds)),
        )

    # -- delayed delivery -----------------------------------------------------------------------
    #
    # A delayed row's key is its RowVersion and its Due as text: the table is NServiceBus's heap
    # whose only index is Index_Due, so moving and deleting rows seek a few milliseconds of Due
    # (the text has milliseconds; datetime rounds to 3.33 ms) and match RowVersion exactly,
    # instead of scanning the whole table for RowVersion once per batch.

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
        # at once (return code -1). The lock is taken in the delayed table own database.
        return Statement(
            "SET NOCOUNT ON;\n"
            "DECLARE @rc int;\n"
            "IF @@TRANCOUNT = 0\n"
            f"    SELECT TOP (1) @rc = 0 FROM {d} WITH (READPAST, READCOMMITTEDLOCK);\n"
            "IF @@TRANCOUNT = 0\n"
            "    THROW 51000, N'sqlqueue: the delayed mover lock needs a transaction, not autocommit', 1;\n"
            f"EXEC @rc = {self._sys(delayed)}sp_getapplock @Resource = ?, @LockMode = N'Exclusive',"
            " @LockOwner = N'Transaction', @LockTimeout = 0;\n"
            "SELECT CAST(CASE WHEN @rc >= 0 THEN 1 ELSE 0 END AS bit)",
            (_resource("mover", d),),
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
        recoverable: bool = False,
    ) -> Statement:
        if len(keys) != len(headers):
            raise ValueError(f"{len(keys)} keys but {len(headers)} headers")
        rows = [[*_delayed_key(k), str(h)] for k, h in zip(keys, headers, strict=True)]
        cols, lead = self._queue_columns(recoverable)
        # One JSON array of [RowVersion, Due, Headers]; its [key] is the position, so the new
        # RowVersion values follow the order of `keys`. The rows are this transaction own
        # (locked by due_delayed): READPAST skips only rows other transactions hold.
        sql = f"""
INSERT INTO {self.qualified(destination)} ({cols})
SELECT {lead}, NULL, k.Headers, d.Body
FROM OPENJSON(?) AS o
CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]', KeyDue varchar(23) '$[1]', Headers nvarchar(max) '$[2]') AS k
JOIN {self.qualified(delayed)} AS d WITH (READPAST, READCOMMITTEDLOCK)
  ON {_KEY_MATCH.format(d="d.", k="k.")}
ORDER BY CAST(o.[key] AS int)"""
        return Statement(sql.strip(), (_json(rows),))

    def delete_delayed(self, delayed: QueueAddress, *, keys: list[str]) -> Statement:
        rows = [list(_delayed_key(k)) for k in keys]
        return Statement(
            f"DELETE FROM {self.qualified(delayed)} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE EXISTS (SELECT 1 FROM OPENJSON(?) WITH (KeyRow bigint '$[0]', KeyDue varchar(23) '$[1]') AS k"
            f" WHERE {_KEY_MATCH.format(d='', k='k.')})",
            (_json(rows),),
        )

    # -- operations (the sqlqueue CLI) ----------------------------------------------------------
    #
    # Reads for people watching queues that NServiceBus endpoints and our readers are working
    # on: READPAST + READCOMMITTEDLOCK, so a read never waits for a row another session holds
    # (a receive in progress, an uncommitted send or claim) and keeps its meaning on a
    # READ_COMMITTED_SNAPSHOT database. Shared locks only, released row by row: no update lock,
    # nothing held after the statement. The price: rows others hold at that moment are not
    # counted or shown (they are in flight, being sent or taken).

    @staticmethod
    def _check_limit(limit: int) -> int:
        limit = int(limit)
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        return limit

    @staticmethod
    def _check_subscription(option: str, value: str) -> str:
        """A value of the SubscriptionRouting table: nvarchar(200) NOT NULL, as NServiceBus makes it."""
        if not isinstance(value, str) or not value or len(value) > 200:
            raise ConfigError(f"option '{option}': {value!r} must be 1 to 200 characters (SubscriptionRouting)")
        return value

    def peek_messages(self, queue: QueueAddress, *, limit: int) -> Statement:
        # Oldest first through Index_RowVersion, like a receive, but without UPDLOCK: nothing is
        # taken, and a receiver or claim running now is neither blocked nor disturbed.
        return Statement(
            "SELECT TOP (?) CAST(Id AS varchar(36)), Expires, Headers, Body, RowVersion"
            f" FROM {self.qualified(queue)} WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion",
            (self._check_limit(limit),),
        )

    def list_queues(self) -> Statement:
        return Statement(
            "SELECT s.name, t.name FROM sys.tables AS t JOIN sys.schemas AS s ON s.schema_id = t.schema_id"
            " WHERE (SELECT COUNT(*) FROM sys.columns AS c WHERE c.object_id = t.object_id"
            " AND LOWER(c.name) IN (N'id', N'headers', N'body', N'expires', N'rowversion')) = 5"
            " ORDER BY s.name, t.name"
        )

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

    def purge_expired(self, queue: QueueAddress, *, limit: int) -> Statement:
        # NServiceBus's PurgeBatchOfExpiredMessagesText, one statement: expired rows through
        # the filtered Index_Expires, rows held by receivers skipped (READPAST), row locks.
        # Expired as a receive judges it: Expires <= now. No SET NOCOUNT: the caller reads the
        # rowcount. A limit of 5,000 rows or more may escalate to a table lock for the moment
        # of the statement (the claim deletes in chunks for that reason).
        return Statement(
            f"DELETE TOP (?) FROM {self.qualified(queue)} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE Expires <= GETUTCDATE()",
            (self._check_limit(limit),),
        )

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
                self._check_subscription("--endpoint", endpoint),
                self._check_subscription("queue", queue_address),
                self._check_subscription("--topic", topic),
            ),
        )

    def unsubscribe(self, table: QueueAddress, *, endpoint: str, topic: str) -> Statement:
        # NServiceBus's UnsubscribeText.
        return Statement(
            f"DELETE FROM {self.qualified(table)} WHERE Endpoint = ? AND Topic = ?",
            (self._check_subscription("--endpoint", endpoint), self._check_subscription("--topic", topic)),
        )

    # Moving messages between queues (sqlqueue error retry): lock rows, insert copies, delete the
    # rows, one transaction. Id is not unique in an NServiceBus queue table (nothing enforces it):
    # a row's key is its RowVersion as text, which IDENTITY makes unique and Index_RowVersion seeks.

    def lock_messages(self, queue: QueueAddress, *, native_ids: list[str] | None, limit: int) -> Statement:
        # A receive's locks, as NServiceBus takes them: UPDLOCK + READPAST + ROWLOCK, so rows a
        # receiver (or ServiceControl, on an error queue) holds are skipped, never waited for, and
        # no one else takes the rows locked here until the transaction ends. Oldest first through
        # Index_RowVersion. Any number of ids travels as one JSON parameter; none selects nothing.
        limit = int(limit)
        if limit < 0:
            raise ValueError(f"limit must not be negative, not {limit}")
        sql = (
            "SELECT TOP (?) CAST(RowVersion AS varchar(20)), LOWER(CAST(Id AS varchar(36))), Headers"
            f" FROM {self.qualified(queue)} WITH (UPDLOCK, READPAST, ROWLOCK)"
        )
        if native_ids is None:
            return Statement(sql + " ORDER BY RowVersion", (limit,))
        ids = [_native_id(i) for i in native_ids]
        return Statement(
            sql + " WHERE Id IN (SELECT CAST(value AS uniqueidentifier) FROM OPENJSON(?)) ORDER BY RowVersion",
            (limit, _json(ids)),
        )

    def move_messages(
        self, queue: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
        recoverable: bool = False,
    ) -> Statement:
        # The rows are this transaction own (locked by lock_messages): READPAST skips only rows
        # others hold.
        return self._copy_rows(destination, [_message_key(k) for k in keys], headers, recoverable=recoverable,
                               source=f"{self.qualified(queue)} AS m WITH (READPAST, READCOMMITTEDLOCK)"
                               " ON m.RowVersion = k.KeyRow")

    def delete_messages(self, queue: QueueAddress, *, keys: list[str]) -> Statement:
        # Seeks Index_RowVersion per key. The rows are this transaction own (see move_messages).
        rows = [_message_key(k) for k in keys]
        return Statement(
            f"DELETE FROM {self.qualified(queue)} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE RowVersion IN (SELECT k.KeyRow FROM OPENJSON(?) WITH (KeyRow bigint '$') AS k)",
            (_json(rows),),
        )

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

    # -- privileges -------------------------------------------------------------------------------

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
                grant = f"EXEC {self.quote(table.catalog)}.sys.sp_executesql {_literal(grant)}"
            out.append(Statement(grant))
        return out

    def privileges(self, table: QueueAddress, privileges: Sequence[str]) -> Statement:
        # NULL when the object does not exist or the role cannot see it at all.
        values = ", ".join(f"(N'{p}')" for p in check_privileges(privileges))
        return Statement(
            f"SELECT p.v, HAS_PERMS_BY_NAME(?, N'OBJECT', p.v) FROM (VALUES {values}) AS p(v)",
            (self.qualified(table),),
        )

    # -- connections --------------------------------------------------------------------------

    # streaming_cursor: pyodbc's default cursor is a forward-only firehose whose fetchmany()
    # reads rows off the wire as asked, so the base implementation streams already.

    def connect(self, url: Any) -> Any:
        import pyodbc

        # No ODBC connection pooling: a pooled session would keep its sp_getapplock (the
        # endpoint's receiver lock) after close() and make the next query look busy. Only takes
        # effect before the process's first pyodbc connection.
        pyodbc.pooling = False
        conn = pyodbc.connect(url.odbc_string(), autocommit=False)
        try:
            # READCOMMITTED: READPAST and UPDLOCK keep their meaning (SNAPSHOT would break them).
            # Set on every connection: a pooled connection keeps its previous isolation level.
            cur = conn.cursor()
            cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cur.close()
            conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _diagnostics(exc: BaseException) -> tuple[str, set[int]]:
        """(SQLSTATE, native error numbers) of a pyodbc error: args are (sqlstate, message), the
        message carrying each native number in parentheses, e.g. ``... (1205) (SQLExecDirectW)``."""
        args = getattr(exc, "args", ()) or ()
        state = args[0] if args and isinstance(args[0], str) and len(args[0]) == 5 else ""
        text = " ".join(str(a) for a in args[1:]) if state else " ".join(str(a) for a in args)
        numbers = {int(m) for m in _NATIVE_NUMBER.findall(text)}
        number = getattr(exc, "number", None)  # other drivers (pymssql, SqlClient-style)
        if isinstance(number, int):
            numbers.add(number)
        return state.upper(), numbers

    def is_driver_error(self, exc: BaseException) -> bool:
        try:
            import pyodbc
        except ImportError:  # pragma: no cover - the sqlserver extra is not installed
            return bool(self._diagnostics(exc)[0])
        return isinstance(exc, pyodbc.Error) or bool(self._diagnostics(exc)[0])

    def sqlstate(self, exc: BaseException) -> str | None:
        return self._diagnostics(exc)[0] or None

    def is_transient(self, exc: BaseException) -> bool:
        # Judged by the diagnostics alone, whatever the driver's class: pyodbc raises a failed
        # login and a lost connection alike as OperationalError.
        state, numbers = self._diagnostics(exc)
        if numbers & _PERMANENT_NUMBERS or _UNKNOWN_HOST.search(self._message(exc)):
            return False
        if state.startswith("08") or state in _TRANSIENT_STATES:
            return True
        return bool(numbers & _TRANSIENT_NUMBERS)

    def is_undefined_table(self, exc: BaseException) -> bool:
        state, numbers = self._diagnostics(exc)
        return state == "42S02" or 208 in numbers

    @staticmethod
    def _message(exc: BaseException) -> str:
        args = getattr(exc, "args", ()) or ()
        if len(args) >= 2 and isinstance(args[0], str) and len(args[0]) == 5:
            return " ".join(str(a) for a in args[1:])
        return " ".join(str(a) for a in args) if args else str(exc)

    def error_text(self, exc: BaseException) -> str:
        # The driver's message without pyodbc's tuple around it, and without the sentences that
        # quote a row (a duplicate key's value, a truncated value).
        return one_line(_ROW_CONTENTS.sub("", self._message(exc))) or type(exc).__name__
