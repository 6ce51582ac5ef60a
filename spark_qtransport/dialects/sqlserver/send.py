"""SQL Server send: fast executemany into staging, the outbox, and the dispatch INSERTs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

from ...errors import QTransportError, field_error
from ..base import STAGED_COLUMNS, Connection, QueueAddress, SendSql, Statement
from .addressing import SqlServerAddressing
from .driver import pyodbc_connection
from .statements import (
    CHUNK,
    EXACT,
    MAX_FINGERPRINT_CHARS,
    MAX_SINK_CHARS,
    Params,
    bounded,
    copy_rows,
    in_list,
    insert_messages,
    insert_one,
    json_list,
)

#: topics one `subscribers` statement looks up (a request takes at most 2,100 parameters)
_MAX_TOPICS = 1000

#: body types written as they are (other buffers become bytes)
_AS_IS = frozenset({bytes, type(None)})

#: ODBC SQL types (sqlext.h), the values of pyodbc's constants of the same names
SQL_WVARCHAR, SQL_VARBINARY = -9, -3
#: the longest Route/Headers (UTF-16 code units) and Body (bytes) bound in place, as
#: nvarchar(4000) and varbinary(8000); longer values are bound as (max)
BOUND_CHARS, BOUND_BYTES = 4000, 8000
#: the bytes one executemany call may ask pyodbc to allocate for its parameter array
PARAM_ARRAY_BYTES = 16 << 20
#: a bound parameter's buffer besides its value: its length indicator (an SQLLEN)
_INDICATOR = 8
#: the parameter array bytes of one row's other columns, bound as the server describes them:
#: Sink, Attempt, Kind and MessageId as UTF-16 text, BatchId, TtbrMs, DelayMs and Due (at most
#: 16 bytes each), with their 8 indicators
_OTHER_BYTES = 2 * (MAX_SINK_CHARS + 64 + 1 + 200) + 4 * 16 + 8 * _INDICATOR
#: what pyodbc holds in the parameter array for a value sent in pieces (a (max) cell)
_PIECES_BYTES = 16 + _INDICATOR

#: the staging table's column of each of `STAGED_COLUMNS`, in that order
_STAGED = dict(
    zip(
        STAGED_COLUMNS,
        ("Sink", "BatchId", "Attempt", "Kind", "Route", "MessageId", "Headers", "Body", "TtbrMs", "DelayMs", "Due"),
        strict=True,
    )
)
_ROUTE, _HEADERS, _BODY = (list(_STAGED).index(c) for c in ("route", "headers", "body"))


def _fits_nvarchar(value: Any) -> bool:
    """Whether `value` fits nvarchar(4000): at most 4,000 UTF-16 code units, what pyodbc sends
    (a character outside the Basic Multilingual Plane takes two). NULL fits; other types take
    the (max) path, as they did before."""
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    n = len(value)
    if n <= BOUND_CHARS // 2:  # at most two code units a character
        return True
    if n > BOUND_CHARS:
        return False
    return value.isascii() or len(value.encode("utf-16-le", "surrogatepass")) <= 2 * BOUND_CHARS


def _fits_varbinary(value: Any) -> bool:
    return value is None or (isinstance(value, bytes) and len(value) <= BOUND_BYTES)


#: a row's bind mode: whether its Route, Headers and Body fit the bounded types
_Mode = tuple[bool, bool, bool]


def _input_sizes(mode: _Mode) -> list[tuple[int, int, int] | None]:
    """`cursor.setinputsizes` for the staging INSERT: (SQL type, column size, decimal digits)
    of Route, Headers and Body, bounded where `mode` says the values fit, else size 0 (the
    driver's nvarchar(max)/varbinary(max), which pyodbc sends in pieces); the other columns
    (None) keep the types the server describes."""
    route, headers, body = mode
    sizes: list[tuple[int, int, int] | None] = [None] * len(_STAGED)
    sizes[_ROUTE] = (SQL_WVARCHAR, BOUND_CHARS if route else 0, 0)
    sizes[_HEADERS] = (SQL_WVARCHAR, BOUND_CHARS if headers else 0, 0)
    sizes[_BODY] = (SQL_VARBINARY, BOUND_BYTES if body else 0, 0)
    return sizes


def _rows_per_call(mode: _Mode) -> int:
    """How many rows of `mode` one call binds within `PARAM_ARRAY_BYTES`: pyodbc allocates a
    whole call's parameter array at once, each bounded cell its full size."""
    route, headers, body = mode
    row = _OTHER_BYTES + sum(
        (size + _INDICATOR) if fits else _PIECES_BYTES
        for fits, size in ((route, 2 * BOUND_CHARS), (headers, 2 * BOUND_CHARS), (body, BOUND_BYTES))
    )
    return max(1, PARAM_ARRAY_BYTES // row)


def _calls(data: list[tuple[Any, ...]], modes: list[_Mode]) -> Iterator[tuple[_Mode, list[tuple[Any, ...]]]]:
    """`data` cut into runs of consecutive rows of one mode, each at most `_rows_per_call` rows:
    one executemany each, in order. Never regrouped: Seq (IDENTITY) numbers rows in the order
    they are inserted, and a dispatch sends them in Seq order."""
    start = 0
    while start < len(data):
        mode, end = modes[start], start + 1
        limit = min(len(data), start + _rows_per_call(mode))
        while end < limit and modes[end] == mode:
            end += 1
        yield mode, data[start:end]
        start = end


def _attempts(attempts: list[str], params: Params) -> str:
    """The condition selecting the staged rows of `attempts`: any number of them, as one JSON
    parameter. OPENJSON columns take the database default collation: an explicit COLLATE, the
    Attempt column's own, avoids a conflict and keeps Index_Attempt seekable."""
    mark = params.add("attempts", "nvarchar(max)", json_list([str(a) for a in attempts]))
    return f"Attempt IN (SELECT a.Attempt {EXACT} FROM OPENJSON({mark}) WITH (Attempt varchar(64) '$') AS a)"


#: the time-to-be-received as Expires, computed on the server like NServiceBus's send. DATEADD
#: takes an int: seconds and the remaining milliseconds are added apart (any bigint of
#: milliseconds up to 68 years), and GETUTCDATE() is datetime, like the Expires column.
_EXPIRES = (
    "CASE WHEN m.TtbrMs IS NULL THEN NULL"
    " ELSE DATEADD(second, m.TtbrMs / 1000, DATEADD(ms, m.TtbrMs % 1000, GETUTCDATE())) END"
)


class SqlServerSend(SqlServerAddressing, SendSql):
    """The SQL Server send of the dialect."""

    #: DATEADD takes an int of seconds
    max_interval_seconds = 2**31 - 1

    def stage_rows(self, conn: Connection, staging: QueueAddress, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return  # pyodbc refuses an empty executemany
        cols = ", ".join(_STAGED.values())
        marks = ", ".join("?" * len(_STAGED))
        names = list(_STAGED)
        due, body = names.index("due"), names.index("body")
        width = len(_STAGED)
        data: list[tuple[Any, ...]] = []
        modes: list[_Mode] = []
        for row in rows:
            row = tuple(row)
            if len(row) != width:
                raise QTransportError(f"a staged row has {len(row)} values, not {width} ({', '.join(_STAGED)})",
                                     operation="stage rows")
            when = row[due]
            if when is not None or row[body].__class__ not in _AS_IS:
                values = list(row)
                if isinstance(values[body], (bytearray, memoryview)):
                    values[body] = bytes(values[body])
                if isinstance(when, datetime) and when.tzinfo is not None:
                    # datetime2 has no time zone: stored as UTC wall-clock time (naive is taken as UTC)
                    values[due] = when.astimezone(timezone.utc).replace(tzinfo=None)
                row = tuple(values)
            data.append(row)
            modes.append((_fits_nvarchar(row[_ROUTE]), _fits_nvarchar(row[_HEADERS]), _fits_varbinary(row[_BODY])))
        sql = f"INSERT INTO {self.qualified(staging)} ({cols}) VALUES ({marks})"
        cur = pyodbc_connection(conn).cursor()
        try:
            # One round trip per array of rows. Route, Headers and Body are (max) columns: bound
            # as the server describes them, pyodbc would send every one of their cells in pieces
            # (SQLPutData), a few thousand rows a second. Values that fit nvarchar(4000) and
            # varbinary(8000) are bound as those, in the array; runs of rows with a longer value
            # take the (max) path for that column. The other columns keep the types the server
            # describes, so None needs no guessing.
            cur.fast_executemany = True
            for mode, part in _calls(data, modes):
                cur.setinputsizes(_input_sizes(mode))
                cur.executemany(sql, part)
        finally:
            cur.close()

    def insert_message(self, destination: QueueAddress, *, headers: str, body: bytes, ttbr_ms: int | None) -> Statement:
        # NServiceBus's SendText (Recoverable where the table has it), Expires as `dispatch`
        # computes it. The body travels as hexadecimal text (CONVERT style 2), so every value is
        # plain text or a number, as the other statements bind them.
        params = Params(named=True)
        if ttbr_ms is None:
            expires = "NULL"
        else:
            ttbr = params.add("ttbr", "bigint", int(ttbr_ms))
            expires = f"DATEADD(second, {ttbr} / 1000, DATEADD(ms, {ttbr} % 1000, GETUTCDATE()))"
        text = params.add("headers", "nvarchar(max)", str(headers))
        hexed = params.add("body", "nvarchar(max)", bytes(body).hex())
        return insert_one(self.qualified(destination), self._sys(destination),
                          values=f"{expires}, {text}, CONVERT(varbinary(max), {hexed}, 2)", params=params)

    @staticmethod
    def _check_sink(sink: str) -> str:
        if not isinstance(sink, str) or not sink or len(sink) > MAX_SINK_CHARS:
            raise field_error("sink", f"sink name {sink!r} must be 1 to {MAX_SINK_CHARS} characters")
        return sink

    def outbox_insert(self, outbox: QueueAddress, *, sink: str, batch_id: int, fingerprint: str) -> Statement:
        if not fingerprint or len(fingerprint) > MAX_FINGERPRINT_CHARS:
            raise QTransportError(
                f"outbox fingerprint must be 1 to {MAX_FINGERPRINT_CHARS} characters, not {fingerprint!r}",
                operation="record the batch in the outbox",
            )
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
        # NServiceBus's GetSubscribersText (SELECT DISTINCT QueueAddress ... WHERE Topic IN
        # (@Topic_0, ...)) cut into one SELECT per topic, each tagged with the topic's position:
        # every comparison is still the Topic column against a parameter, so the column's
        # collation decides (case, trailing spaces) exactly as for NServiceBus, and the caller
        # never has to find the spelling the server returns among its own. Not a join on a
        # VALUES list: a derived table's column may take the current database's collation and
        # conflict with the column's (error 468) when the table lives in another catalog.
        # UNION removes duplicates as DISTINCT did. One scan per topic of a small table.
        t = self.qualified(table)
        values = [str(v) for v in topics]
        if len(values) > _MAX_TOPICS:
            raise QTransportError(f"{len(values)} topics in one statement; at most {_MAX_TOPICS}",
                                  operation="select topics")
        if not values:
            return Statement(f"SELECT QueueAddress, 0 AS TopicIndex FROM {t} WHERE 1 = 0", ())
        sql = "\nUNION\n".join(
            f"SELECT QueueAddress, {i} AS TopicIndex FROM {t} WHERE Topic = ?" for i in range(len(values))
        )
        return Statement(sql, tuple(values))

    def dispatch(
        self,
        staging: QueueAddress,
        destination: QueueAddress,
        *,
        attempts: list[str],
        route: str | None,
        publish_routes: list[str],
    ) -> Statement:
        params = Params(named=True)
        s = self.qualified(staging)
        first = self._first_staged(s, params, attempts=attempts, route=route, publish_routes=publish_routes)
        keys = f"INSERT INTO #sqlqueue_keys (Pos, KeyRow)\nSELECT ROW_NUMBER() OVER (ORDER BY f.Seq), f.Seq\n{first}"
        return insert_messages(self.qualified(destination), self._sys(destination), keys=keys, new_id="NEWID()",
                               select=f"{_EXPIRES}, m.Headers, m.Body",
                               joins=f"JOIN {params.table('staging', s)} AS m ON m.Seq = k.KeyRow", params=params)

    @staticmethod
    def _first_staged(
        s: str, params: Params, *, attempts: list[str], route: str | None, publish_routes: list[str],
    ) -> str:
        """``FROM ... AS f``: the Seq of the staged rows a dispatch sends, of the staging table `s`
        (quoted), its values added to `params`: what `dispatch` inserts and `staged_messages` reads."""
        cond = _attempts(attempts, params)
        routes = []
        if route is not None:
            routes.append(f"(Kind = 's' AND Route = {params.add('route', 'nvarchar(max)', str(route))})")
        if publish_routes:
            routes.append(f"(Kind = 'p' AND {in_list('Route', publish_routes, 'published routes', params)})")
        # `f` picks one staged row per message id (the first staged, as NServiceBus's dispatcher
        # deduplicates on message id and destination) from the index alone; the rows are then
        # read by their clustered key.
        return f"""FROM (SELECT MIN(Seq) AS Seq FROM {s}
      WHERE {cond}
        AND ({' OR '.join(routes) or '1 = 0'})
      GROUP BY MessageId) AS f"""

    def staged_messages(
        self, staging: QueueAddress, *, attempts: list[str], route: str | None, publish_routes: list[str]
    ) -> Statement:
        # The rows `dispatch` would insert, keyed by their Seq (the clustered key `move_staged` seeks).
        params = Params()
        s = self.qualified(staging)
        first = self._first_staged(s, params, attempts=attempts, route=route, publish_routes=publish_routes)
        return Statement(f"SELECT m.Seq, m.Headers\n{first}\nJOIN {s} AS m ON m.Seq = f.Seq\nORDER BY f.Seq",
                         params.values())

    def move_staged(
        self, staging: QueueAddress, destination: QueueAddress, *, keys: list[Any], headers: list[str],
    ) -> Statement:
        # Each staged row is read by its clustered key, as `dispatch` reads them: committed rows
        # of the batch, no hint needed.
        return copy_rows(self.qualified(destination), self._sys(destination), [int(k) for k in keys], headers,
                         source=self.qualified(staging), on="AS m ON m.Seq = k.KeyRow")

    def dispatch_delayed(self, staging: QueueAddress, delayed: QueueAddress, *, attempts: list[str]) -> Statement:
        s, d = self.qualified(staging), self.qualified(delayed)
        params = Params(named=True)
        cond = _attempts(attempts, params)
        keys = f"""INSERT INTO #sqlqueue_keys (Pos, KeyRow)
SELECT ROW_NUMBER() OVER (ORDER BY Seq), Seq FROM {s} WHERE {cond} AND Kind = 'd'"""
        # Due as NServiceBus's StoreDelayedMessageText computes it: on the server, in UTC, as
        # datetime; DATEADD takes an int, so seconds and the remaining milliseconds apart. The
        # delayed table is NServiceBus's: bounded statements (see `bounded`).
        step = f"""INSERT INTO {params.table('delayed', d)} (Headers, Body, Due)
SELECT m.Headers, m.Body, COALESCE(m.Due, DATEADD(second, m.DelayMs / 1000, DATEADD(ms, m.DelayMs % 1000, GETUTCDATE())))
FROM #sqlqueue_keys AS k
JOIN {params.table('staging', s)} AS m ON m.Seq = k.KeyRow
WHERE {CHUNK}
ORDER BY k.Pos;
SET @n = @@ROWCOUNT;"""
        return bounded(params, keys=keys, step=step)

    def delete_staged(self, staging: QueueAddress, *, attempts: list[str]) -> Statement:
        # No READPAST: the rowcount is checked against what the tasks staged.
        params = Params()
        cond = _attempts(attempts, params)
        return Statement(f"DELETE FROM {self.qualified(staging)} WHERE {cond}", params.values())

    def delete_batch_leftovers(self, staging: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        # READPAST: rows other tasks are still writing (another batch, or a zombie attempt of
        # this one) are skipped, not waited for; the retention cleanup takes what is left.
        return Statement(
            f"DELETE FROM {self.qualified(staging)} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE Sink = ? AND BatchId = ?",
            (self._check_sink(sink), int(batch_id)),
        )

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
