"""What the SQL Server statements of every feature share: column widths, literals, parameter
markers, list parameters, and the bounded writes into tables that are not ours (`bounded`,
`insert_messages`: at most `ROW_BOUND` rows per statement)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...errors import QTransportError
from ..base import Statement

#: longest quoted three-part name: 3 * (2 + 2 * 128) + 2 dots
QNAME = "nvarchar(776)"

#: Consumer column width of the claim table
MAX_CONSUMER_CHARS = 200

#: application lock resource names are nvarchar(255)
MAX_RESOURCE = 255

#: Sink column width of the staging and outbox tables
MAX_SINK_CHARS = 200

#: Fingerprint column width of the outbox
MAX_FINGERPRINT_CHARS = 400

#: Text our tables match on (sink, attempt, route, message id) compares exactly, as PostgreSQL
#: text does, whatever the database collation: with a case-insensitive default, routes
#: "Billing" and "billing" (one table) would each pick up both routes' rows and send them twice.
EXACT = "COLLATE Latin1_General_BIN2"


def literal(value: Any) -> str:
    """A T-SQL literal: in scripts shown to people, and around SQL text made of constants and quoted
    names (dynamic SQL, see `insert_messages`); values of executed statements are parameters."""
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


def json_list(values: list[Any]) -> str:
    """One nvarchar(max) parameter for OPENJSON: any number of values in one marker (a request
    takes at most 2,100 parameters), their order kept."""
    return json.dumps(values, ensure_ascii=False, separators=(",", ":"))


class Param(NamedTuple):
    name: str
    sqltype: str
    value: Any
    #: a quoted table name spliced into the dynamic text of `insert_messages`, not passed to it
    table: bool = False


#: where a `Params.table` name goes in the text of `insert_messages` (never in any SQL text)
_TABLE = "\x1f"


@dataclass
class Params:
    """The values of one statement, in marker order. Plain statements refer to each by a ``?``
    marker; the dynamic INSERT of `insert_messages` by its ``@name``."""

    named: bool = False
    items: list[Param] = field(default_factory=list)

    def add(self, name: str, sqltype: str, value: Any) -> str:
        """Add a value; the text that refers to it in the statement."""
        self.items.append(Param(name, sqltype, value))
        return f"@{name}" if self.named else "?"

    def table(self, name: str, qualified: str) -> str:
        """Add a quoted table name for the text of `insert_messages`: it travels as a value and
        is spliced in on the server, so no name is ever written inside a literal. Plain
        statements name the table in their text."""
        if not self.named:
            return qualified
        self.items.append(Param(name, QNAME, qualified, table=True))
        return f"{_TABLE}{name}{_TABLE}"

    def values(self) -> tuple[Any, ...]:
        return tuple(p.value for p in self.items)


def in_list(column: str, values: list[str], what: str, params: Params) -> str:
    """``column IN (?, ...)`` for a short list of strings, ``1 = 0`` for none. Parameters, not
    OPENJSON: a parameter takes the column's collation, a JSON column could conflict with it."""
    values = [str(v) for v in values]
    if len(values) > 1000:
        raise QTransportError(f"{len(values)} {what} in one statement; at most 1000", operation=f"select {what}")
    if not values:
        return "1 = 0"
    marks = [params.add(f"{what.split()[-1]}{i}", "nvarchar(max)", v) for i, v in enumerate(values)]
    return f"{column} IN ({', '.join(marks)})"


def key_rows(keys: list[Any], headers: list[str], *more: list[Any]) -> list[list[Any]]:
    """``[key, *more, headers]`` per message, for one JSON parameter; `keys` and `headers` pair up."""
    if len(keys) != len(headers):
        raise QTransportError(f"{len(keys)} keys but {len(headers)} headers", operation="move messages")
    return [[k, *m, str(h)] for k, *m, h in zip(keys, *more, headers, strict=True)]


#: rows one statement may write to, or delete from, a table that is not ours (a queue, an error
#: queue, a delayed table: NServiceBus's). SQL Server escalates to a table lock once ONE statement
#: holds about 5,000 locks on one table or index (a heap row costs a RID lock, a key lock per
#: index, page intent locks); READPAST skips row and page locks only, so a table lock on a queue
#: would block every NServiceBus receiver and ServiceControl until our transaction commits.
#: NServiceBus itself writes one row per statement and moves delayed messages 100 at a time.
ROW_BOUND = 2000

#: the keys of the rows a bounded batch writes, numbered from 1 in the order they are written
#: (Pos); the other columns hold what each caller's keys need. Nested batches (the dynamic
#: statements below) see a temp table of the batch that made them.
_KEYS = (
    "IF OBJECT_ID(N'tempdb..#sqlqueue_keys') IS NOT NULL DROP TABLE #sqlqueue_keys;\n"
    "CREATE TABLE #sqlqueue_keys (Pos bigint NOT NULL PRIMARY KEY, KeyRow bigint NOT NULL,"
    " KeyDue varchar(23) NULL, Headers nvarchar(max) NULL);\n"
)

#: the rows of one chunk of a bounded batch, in key order (for the queue's RowVersion order)
CHUNK = f"k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND}"


def _dynamic(sql: str) -> str:
    """A T-SQL expression whose value is `sql`, nvarchar(max) from the first piece on (a long text
    is not cut at 4,000 characters), the `Params.table` marks joined in from the variables that
    hold the quoted names: a name is never written inside a literal."""
    text = literal(sql)
    text = re.sub(f"{_TABLE}(\\w+){_TABLE}", r"' + @\1 + N'", text)
    return "CAST(N'' AS nvarchar(max)) + " + text


def bounded(params: Params, *, keys: str, step: str, recoverable: tuple[str, str] | None = None) -> Statement:
    """A batch that writes or deletes rows of a table that is not ours, at most `ROW_BOUND` rows
    per statement, in one caller's transaction.

    `keys` fills ``#sqlqueue_keys`` (Pos from 1, in write order; referring to `params` (named)
    by ``@name``, to tables by their quoted names). `step` is one chunk: the rows whose keys
    satisfy `CHUNK` (``k`` the keys table), ending ``SET @n = @@ROWCOUNT;``; it names tables by
    `Params.table` marks. With `recoverable` = (sys views of the target's catalog, step naming
    Recoverable), that step runs instead where the target table (parameter ``@table``) has the
    legacy Recoverable column: a batch naming a column its table lacks does not compile, even in
    a branch that never runs, so the chunk runs as dynamic SQL (constants and quoted names only;
    its values pass as parameters). The batch selects the rows written (`Statement.counted`)."""
    declare = "".join(f"DECLARE @{p.name} {p.sqltype} = ?;\n" for p in params.items)
    choose = ""
    if recoverable is not None:
        sys_, with_recoverable = recoverable
        choose = (
            f"IF EXISTS (SELECT 1 FROM {sys_}columns WHERE object_id = OBJECT_ID(@table) AND name = N'Recoverable')\n"
            f"    SET @step = {_dynamic(with_recoverable)};\n"
        )
    sql = (
        "SET NOCOUNT ON;\n"
        + declare
        + _KEYS
        + keys.strip() + ";\n"
        + f"DECLARE @step nvarchar(max) = {_dynamic(step)};\n"
        + choose
        + "DECLARE @lo bigint = 0, @n int, @total int = 0, @last bigint;\n"
        "SELECT @last = MAX(Pos) FROM #sqlqueue_keys;\n"
        "WHILE @lo < @last\n"
        "BEGIN\n"
        "    EXEC sys.sp_executesql @step, N'@lo bigint, @n int OUTPUT', @lo = @lo, @n = @n OUTPUT;\n"
        "    SET @total = @total + @n;\n"
        f"    SET @lo = @lo + {ROW_BOUND};\n"
        "END\n"
        "DROP TABLE #sqlqueue_keys;\n"
        "SELECT @total AS written;"
    )
    return Statement(sql, params.values(), counted=True)


def insert_messages(table: str, sys_: str, *, keys: str, new_id: str, select: str, joins: str,
                    params: Params) -> Statement:
    """INSERT new messages into the queue table `table` (quoted; `sys_` the catalog views of its
    database), `ROW_BOUND` at a time (see `bounded`): Id `new_id`, Recoverable 1 where the table
    has that column, then `select` (Expires, Headers, Body) from the keys ``k`` `joins` the
    source. The columns are NServiceBus's SendText's: Id, Recoverable (where present), Expires,
    Headers, Body; the legacy CorrelationId and ReplyToAddress are left out, so a table without
    them works. INSERT ... SELECT ... ORDER BY assigns the RowVersion IDENTITY values in ORDER BY
    order (documented), and the chunks run in key order, so queue order is key order."""
    into = Params(named=True, items=[Param("table", QNAME, table, table=True), *params.items])

    def step(recoverable: bool) -> str:
        columns = "Id" + (", Recoverable" if recoverable else "") + ", Expires, Headers, Body"
        lead = new_id + (", 1" if recoverable else "")
        return (f"INSERT INTO {_TABLE}table{_TABLE} ({columns})\nSELECT {lead}, {select.strip()}\n"
                f"FROM #sqlqueue_keys AS k\n{joins.strip()}\nWHERE {CHUNK}\nORDER BY k.Pos;\nSET @n = @@ROWCOUNT;")

    return bounded(into, keys=keys, step=step(False), recoverable=(sys_, step(True)))


def insert_one(table: str, sys_: str, *, values: str, params: Params) -> Statement:
    """INSERT one message into the queue table `table` (quoted; `sys_` the catalog views of its
    database): Id NEWID(), Recoverable 1 where the table has that column, then `values` (Expires,
    Headers, Body expressions referring to `params`, named, by ``@name``). One VALUES row: a
    bounded write by construction. As in `bounded`, the INSERT runs as dynamic SQL chosen by the
    table's columns (a batch naming a column its table lacks does not compile); the table's name
    is spliced in from a parameter and the values pass to it as parameters of sp_executesql."""
    into = Params(named=True, items=[Param("table", QNAME, table, table=True), *params.items])

    def step(recoverable: bool) -> str:
        columns = "Id" + (", Recoverable" if recoverable else "") + ", Expires, Headers, Body"
        lead = "NEWID()" + (", 1" if recoverable else "")
        return f"INSERT INTO {_TABLE}table{_TABLE} ({columns})\nVALUES ({lead}, {values.strip()});"

    declare = "".join(f"DECLARE @{p.name} {p.sqltype} = ?;\n" for p in into.items)
    passed = [p for p in into.items if not p.table]
    signature = literal(", ".join(f"@{p.name} {p.sqltype}" for p in passed))
    assign = "".join(f", @{p.name} = @{p.name}" for p in passed)
    sql = (
        "SET NOCOUNT ON;\n"
        + declare
        + f"DECLARE @step nvarchar(max) = {_dynamic(step(False))};\n"
        + f"IF EXISTS (SELECT 1 FROM {sys_}columns WHERE object_id = OBJECT_ID(@table) AND name = N'Recoverable')\n"
        + f"    SET @step = {_dynamic(step(True))};\n"
        + f"EXEC sys.sp_executesql @step, {signature}{assign};"
    )
    return Statement(sql, into.values())


def json_keys(marker: str, *, due: bool = False, headers: bool = True) -> str:
    """Fill ``#sqlqueue_keys`` from a JSON array of ``[key, (due,) (headers)]`` (`key_rows`): Pos
    is the array position, so the order of the keys is the order written."""
    parts = [("KeyRow", "bigint"), *([("KeyDue", "varchar(23)")] if due else []),
             *([("Headers", "nvarchar(max)")] if headers else [])]
    columns = ", ".join(name for name, _ in parts)
    values = ", ".join(f"k.{name}" for name, _ in parts)
    defs = ", ".join(f"{name} {sqltype} '$[{i}]'" for i, (name, sqltype) in enumerate(parts))
    return (f"INSERT INTO #sqlqueue_keys (Pos, {columns})\n"
            f"SELECT CAST(o.[key] AS bigint) + 1, {values}\n"
            f"FROM OPENJSON({marker}) AS o\n"
            f"CROSS APPLY OPENJSON(o.value) WITH ({defs}) AS k")


def copy_rows(table: str, sys_: str, keys: list[int], headers: list[str], *, source: str, on: str) -> Statement:
    """INSERT rows of the table `source` (quoted; joined as ``m`` `on` ``k.KeyRow``) into the
    queue `table` with new ids, Expires NULL and the given headers, in the order of `keys`."""
    params = Params(named=True)
    rows = params.add("rows", "nvarchar(max)", json_list(key_rows(keys, headers)))
    return insert_messages(table, sys_, keys=json_keys(rows), new_id="NEWID()", select="NULL, k.Headers, m.Body",
                           joins=f"JOIN {params.table('source', source)} {on}", params=params)
