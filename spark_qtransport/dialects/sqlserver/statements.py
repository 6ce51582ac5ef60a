"""What the SQL Server statements of every feature share: column widths, literals, parameter
markers, list parameters, application lock names, and the INSERT of new messages into a queue."""

from __future__ import annotations

import hashlib
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


def resource(kind: str, *parts: str) -> str:
    """An application lock resource ``sqlqueue <kind> <parts>``. Resources are nvarchar(255):
    longer names get a digest, so two long names never share a lock by truncation."""
    text = f"sqlqueue {kind} " + " ".join(parts)
    if len(text) <= MAX_RESOURCE:
        return text
    return f"sqlqueue {kind} " + hashlib.sha256("\n".join(parts).encode()).hexdigest()


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


#: the columns of a queue table an INSERT of new messages names: NServiceBus's, Recoverable
#: (``{recoverable}``) only where the table has that legacy column
_QUEUE_COLUMNS = "Id, CorrelationId, ReplyToAddress{recoverable}, Expires, Headers, Body"


def insert_messages(table: str, sys_: str, *, new_id: str, rest: str, params: Params) -> Statement:
    """INSERT new messages into the queue table `table` (quoted; `sys_` the catalog views of its
    database): Id `new_id`, CorrelationId and ReplyToAddress NULL, Recoverable 1 where the table
    has that column, then `rest` (Expires, Headers, Body, the FROM and ORDER BY), which refers to
    `params` (named) by ``@name`` and to tables by `Params.table`. INSERT ... SELECT ... ORDER BY
    assigns the RowVersion IDENTITY values in ORDER BY order (documented), so queue order is the
    SELECT's order.

    NServiceBus tables have Recoverable (bit NOT NULL, no default), newer ones may not: the server
    decides. A batch that names a column its table lacks does not compile, even in a branch that
    never runs, so the INSERT runs as dynamic SQL: one of two texts made of constants and the
    quoted table names (parameters, joined in on the server), the values passed on as parameters
    of sp_executesql. Only the INSERT counts rows (NOCOUNT until then): the statement's rowcount
    is the rows inserted."""
    into = Params(named=True, items=[Param("table", QNAME, table, table=True), *params.items])

    def text(recoverable: bool) -> str:
        columns = _QUEUE_COLUMNS.format(recoverable=", Recoverable" if recoverable else "")
        lead = f"{new_id}, NULL, NULL" + (", 1" if recoverable else "")
        sql = literal(f"INSERT INTO {_TABLE}table{_TABLE} ({columns})\nSELECT {lead}, {rest.strip()}")
        sql = re.sub(f"{_TABLE}(\\w+){_TABLE}", r"' + @\1 + N'", sql)
        # nvarchar(max) from the first piece on: a long list of routes cannot be cut at 4,000 characters
        return sql.replace("N'INSERT INTO '", "CAST(N'INSERT INTO ' AS nvarchar(max))", 1)

    passed = [p for p in params.items if not p.table]
    sql = (
        "SET NOCOUNT ON;\n"
        + "".join(f"DECLARE @{p.name} {p.sqltype} = ?;\n" for p in into.items)
        + f"DECLARE @insert nvarchar(max) = {text(False)};\n"
        f"IF EXISTS (SELECT 1 FROM {sys_}columns WHERE object_id = OBJECT_ID(@table) AND name = N'Recoverable')\n"
        f"    SET @insert = {text(True)};\n"
        "SET NOCOUNT OFF;\n"
        f"EXEC sys.sp_executesql @insert, {literal(', '.join(f'@{p.name} {p.sqltype}' for p in passed))}"
        + "".join(f", @{p.name} = @{p.name}" for p in passed)
        + ";"
    )
    return Statement(sql, into.values())


def copy_rows(table: str, sys_: str, keys: list[int], headers: list[str], *, source: str, on: str) -> Statement:
    """INSERT rows of the table `source` (quoted; joined as ``m`` `on` ``k.KeyRow``) into the
    queue `table` with new ids, Expires NULL and the given headers, in the order of `keys`. One
    JSON array of [key, Headers]; its [key] is the position, so the new RowVersion values follow
    that order."""
    params = Params(named=True)
    rows = params.add("rows", "nvarchar(max)", json_list(key_rows(keys, headers)))
    rest = f"""NULL, k.Headers, m.Body
FROM OPENJSON({rows}) AS o
CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]', Headers nvarchar(max) '$[1]') AS k
JOIN {params.table("source", source)} {on}
ORDER BY CAST(o.[key] AS int)"""
    return insert_messages(table, sys_, new_id="NEWID()", rest=rest, params=params)
