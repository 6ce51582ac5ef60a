"""Test helpers that speak to a real database the way an NServiceBus endpoint would.

`Backend` wraps one database (the embedded PostgreSQL, or a SQL Server named by
SQLQUEUE_TEST_SQLSERVER_URL) with NServiceBus's own send and receive SQL, so tests can produce and
consume messages exactly as .NET endpoints sharing the database do.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from spark_qtransport.connections import parse_url
from spark_qtransport.dialects import Dialect, QueueAddress, dialect_for
from spark_qtransport.transport import create_queues
from spark_qtransport.transport.sending.dispatch import Dispatcher, set_up_sender
from spark_qtransport.transport.sending.messages import InputColumns
from spark_qtransport.transport.sending.staging import StageReport, stage_partition
from spark_qtransport.transport.settings import ReceiveSettings, SendSettings

# NServiceBus.Transport.PostgreSql PostgreSqlConstants (SendText, ReceiveText, CreateQueueText),
# with {0} the quoted table name. Used verbatim so our tables stay interchangeable with theirs.
PG_NSB_CREATE_QUEUE = """
CREATE TABLE IF NOT EXISTS {0} (
    Id uuid NOT NULL PRIMARY KEY,
    Expires TIMESTAMP,
    Headers TEXT NOT NULL,
    Body BYTEA,
    Seq serial NOT NULL UNIQUE
)"""
# PostgreSqlConstants.CreateDelayedMessageStoreText ({0} the quoted table, {1} its name): the
# index on Due is not unique
PG_NSB_CREATE_DELAYED = """
CREATE TABLE IF NOT EXISTS {0} (
    Id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    Headers text NOT NULL,
    Body bytea,
    Due timestamptz NOT NULL
) WITH (fillfactor=100);

CREATE INDEX IF NOT EXISTS  "{1}_Due" on {0}(Due);
"""
PG_NSB_SEND = "INSERT INTO {0} (Id, Expires, Headers, Body) VALUES (%s, NULL, %s, %s)"
PG_NSB_SEND_TTBR = (
    "INSERT INTO {0} (Id, Expires, Headers, Body) "
    "VALUES (%s, (now() AT TIME ZONE 'UTC') + %s * interval '1 millisecond', %s, %s)"
)
PG_NSB_RECEIVE = """
DELETE FROM {0} rs
WHERE rs.id = (SELECT id FROM {0} ORDER BY Seq LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING rs.id,
    CASE WHEN Expires IS NULL THEN 0 WHEN Expires > now() AT TIME ZONE 'UTC' THEN 0 ELSE 1 END Expired,
    rs.Headers, rs.Body"""

# NServiceBus.Transport.SqlServer SqlServerConstants (SendText, ReceiveText), trimmed to the columns.
MS_NSB_SEND = (
    "INSERT INTO {0} (Id, CorrelationId, ReplyToAddress, Recoverable, Expires, Headers, Body) "
    "VALUES (?, NULL, NULL, 1, CASE WHEN ? IS NULL THEN NULL ELSE DATEADD(ms, ?, GETUTCDATE()) END, ?, ?)"
)
MS_NSB_RECEIVE = """
WITH message AS (SELECT TOP(1) * FROM {0} WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion)
DELETE FROM message
OUTPUT deleted.Id,
    CASE WHEN deleted.Expires IS NULL THEN 0 WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END,
    deleted.Headers, deleted.Body"""


def nsb_headers(message_id: str | None = None, **extra: str) -> dict[str, str]:
    """The headers every NServiceBus-sent message carries."""
    mid = message_id or str(uuid.uuid4())
    h = {
        "NServiceBus.MessageId": mid,
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.ConversationId": str(uuid.uuid4()),
        "NServiceBus.CorrelationId": mid,
        "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrder, Shop.Messages",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.TimeSent": "2025-11-28 00:05:18:653833 Z",
        "NServiceBus.OriginatingEndpoint": "Shop.Web",
        "NServiceBus.OriginatingMachine": "web-1",
        "NServiceBus.Version": "9.2.3",
        "NServiceBus.ReplyToAddress": "Shop.Web@[dbo]",
    }
    h.update(extra)
    return h


@dataclass
class Backend:
    """One live database with NServiceBus send/receive SQL."""

    url: str

    def __post_init__(self) -> None:
        self.parsed = parse_url(self.url)
        self.dialect: Dialect = dialect_for(self.parsed)

    @property
    def name(self) -> str:
        return self.dialect.name

    def connect(self, *, autocommit: bool = True) -> Any:
        """A plain driver connection, as another application sharing the database has (on
        PostgreSQL the server's default search_path, unlike the connector's pinned one)."""
        if self.name == "postgres":
            import psycopg

            return psycopg.connect(**self.parsed.psycopg_kwargs(), autocommit=autocommit)
        conn = self.dialect.connect(self.parsed)
        conn.autocommit = autocommit
        return conn

    def address(self, text: str) -> QueueAddress:
        return self.dialect.parse_address(text)

    def q(self, text: str) -> str:
        return self.dialect.qualified(self.address(text))

    def claims(self, queue: str) -> str:
        """The address of a queue's claim table."""
        return self.dialect.format_address(self.dialect.claims_table(self.address(queue)))

    # -- tables -------------------------------------------------------------------------------

    def create_queue(self, name: str, *, nsb: bool = False) -> str:
        """Create a queue with our installer, or (nsb=True) with NServiceBus's own DDL (int4 seq)."""
        if not (nsb and self.name == "postgres"):
            create_queues(self.parsed, name)
            return name
        with self.connect() as conn:
            cur = conn.cursor()
            addr = self.address(name)
            if addr.schema:
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {self.dialect.quote(addr.schema)}")
            cur.execute(PG_NSB_CREATE_QUEUE.format(self.q(name)))
        return name

    def drop(self, name: str) -> None:
        with self.connect() as conn:
            conn.cursor().execute(f"DROP TABLE IF EXISTS {self.q(name)}")

    def count(self, name: str, where: str = "") -> int:
        with self.connect() as conn:
            cur = conn.cursor()
            cur.execute(f"SELECT count(*) FROM {self.q(name)} {where}")
            return int(cur.fetchone()[0])

    def unheld(self, name: str) -> int:
        """Rows of queue `name` no prepared transaction deleted: what is left for anyone to receive
        (a stopped stream's last batch, held by prepared claims, still counts in `count` until the
        claims are committed or parked)."""
        return self.count(name, "WHERE xmax::text NOT IN (SELECT transaction::text FROM pg_catalog.pg_prepared_xacts)")

    def held(self, queue: str) -> int:
        """Messages of `queue` claimed and not acknowledged, in either form: rows of its claim table,
        and rows of the queue a prepared claim deleted."""
        if self.name != "postgres":
            return self.count(self.claims(queue))
        # the claim table's marks of prepared claims (progress, failed: consumer MARK + ...) are not claims
        return self.count(self.claims(queue), "WHERE left(consumer, 1) <> chr(31)") + self.count(queue) - self.unheld(queue)

    def let_go_prepared(self) -> None:
        """Roll back every prepared claim of ours on the server (a test's teardown: its messages
        return to their queues, and the locks the claims hold on its tables go)."""
        if self.name != "postgres":
            return
        with self.connect() as c:
            for (gid,) in c.execute("SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE gid LIKE 'sqlqueue:%%'"
                                    " AND database = current_database()").fetchall():
                c.execute(self.dialect.rollback_prepared(gid).sql)

    # -- NServiceBus send / receive -----------------------------------------------------------

    def send(
        self,
        queue: str,
        headers: dict[str, str | None] | str,
        body: bytes | None = b"{}",
        *,
        ttbr_ms: int | None = None,
        native_id: uuid.UUID | None = None,
        conn: Any = None,
    ) -> uuid.UUID:
        """Insert one message with NServiceBus's send SQL. `headers` may be raw (corrupted) text."""
        text = headers if isinstance(headers, str) else json.dumps(headers, ensure_ascii=False)
        nid = native_id or uuid.uuid4()
        own = conn is None
        conn = conn or self.connect()
        try:
            cur = conn.cursor()
            if self.name == "postgres":
                if ttbr_ms is None:
                    cur.execute(PG_NSB_SEND.format(self.q(queue)), (nid, text, body))
                else:
                    cur.execute(PG_NSB_SEND_TTBR.format(self.q(queue)), (nid, ttbr_ms, text, body))
            else:
                cur.execute(MS_NSB_SEND.format(self.q(queue)), (str(nid), ttbr_ms, ttbr_ms, text, body))
        finally:
            if own:
                conn.close()
        return nid

    def send_many(self, queue: str, messages: list[tuple[dict[str, str] | str, bytes]]) -> None:
        with self.connect(autocommit=False) as conn:
            for headers, body in messages:
                self.send(queue, headers, body, conn=conn)
            conn.commit()

    def receive_one(self, queue: str, conn: Any) -> tuple[Any, ...] | None:
        """NServiceBus's receive SQL: one row per transaction (caller commits)."""
        cur = conn.cursor()
        sql = PG_NSB_RECEIVE if self.name == "postgres" else MS_NSB_RECEIVE
        cur.execute(sql.format(self.q(queue)))
        row = cur.fetchone()
        return tuple(row) if row is not None else None

    def drain(self, queue: str) -> list[tuple[dict[str, str], bytes | None]]:
        """Receive everything with NServiceBus's receive SQL: (headers, body) in queue order, each
        headers text a flat JSON object of strings (checked)."""
        from spark_qtransport.wire import decode_headers

        out = []
        with self.connect(autocommit=False) as conn:
            while (row := self.receive_one(queue, conn)) is not None:
                conn.commit()
                headers = decode_headers(row[2])
                assert headers is not None and all(isinstance(v, str) for v in headers.values()), row[2]
                out.append((headers, None if row[3] is None else bytes(row[3])))
        return out

    def rows(self, queue: str) -> list[tuple[str, str, bytes | None]]:
        """(id, headers, body) of every row, in queue order."""
        order = "seq" if self.name == "postgres" else "RowVersion"
        with self.connect() as conn:
            cur = conn.cursor()
            cur.execute(f"SELECT CAST(id AS varchar(36)), headers, body FROM {self.q(queue)} ORDER BY {order}")
            return [(str(r[0]).lower(), r[1], None if r[2] is None else bytes(r[2])) for r in cur.fetchall()]


def receive_batch(backend: Backend, queue: str, error: str, *, limit: int = 1000, **settings: Any) -> list[tuple[Any, ...]]:
    """One micro-batch the way Spark runs it, without Spark: claim, read every slice, acknowledge."""
    from spark_qtransport.transport.receiving.receiver import Receiver, read_slice

    r = Receiver(ReceiveSettings.create(backend.url, queue, error_queue=error, claim_ahead=False, **settings))
    try:
        start = r.initial_offset()
        end = r.latest(start, limit)
        rows = [row for part in r.slices(start, end) for row in read_slice(part)]
        r.ack(end)
        return rows
    finally:
        r.close()


#: the streaming query id the send tests dispatch under (any stable text)
QUERY = "3f1c9a57-0000-4000-8000-000000000001"


class Sender:
    """One endpoint's sink, driven the way Spark drives it: tasks stage, the driver dispatches."""

    #: the `inline_bytes` setting of senders that do not give one (None: the setting's default)
    inline_bytes: int | None = None
    #: tasks take their rows as row dicts rather than column by column
    by_rows: bool = False

    def __init__(self, backend: Backend, endpoint: str, **settings: Any) -> None:
        self.backend = backend
        if self.inline_bytes is not None:
            settings.setdefault("inline_bytes", self.inline_bytes)
        self.options = SendSettings.create(backend.url, endpoint, **settings)
        self.plan = set_up_sender(self.options)

    def stage(self, rows: list[dict[str, Any]], batch_id: int, *, query: str | None = QUERY,
              partition: int = 0) -> StageReport:
        """One task's part: its rows column by column, as Spark's writer hands them over
        (`InputColumns`: every column in every row), or with `by_rows` as row dicts."""
        batch = list(rows) if self.by_rows else InputColumns.of(rows)
        return stage_partition(self.options, self.plan, [batch], batch_id=batch_id, query_id=query, partition=partition)

    def dispatch(self, batch_id: int, reports: list[StageReport | None], *, query: str | None = QUERY) -> Any:
        d = Dispatcher(self.options)
        try:
            return d.dispatch(batch_id, reports, query_id=query)
        finally:
            d.close()

    def send(self, rows: list[dict[str, Any]], batch_id: int = 0, *, query: str | None = QUERY) -> Any:
        return self.dispatch(batch_id, [self.stage(rows, batch_id, query=query)], query=query)

    def staged(self) -> int:
        return self.backend.count(self.backend.dialect.format_address(self.options.staging))


def prepared_slots() -> int:
    """The prepared transactions the suite's servers allow (SQLQUEUE_TEST_PREPARED_SLOTS, default 0):
    above 0, streams (claimMode auto) hold their claims in prepared transactions, not the claim table."""
    return int(os.environ.get("SQLQUEUE_TEST_PREPARED_SLOTS") or 0)


def server_settings(**settings: str) -> dict[str, str]:
    """Settings of an embedded server a test starts: no prepared transactions unless
    SQLQUEUE_TEST_PREPARED_SLOTS says how many (claimMode auto then holds claims in them), so a
    test's streams hold their claims in the claim table, whose rows the tests look at."""
    return {"max_prepared_transactions": str(prepared_slots()), **settings}


def server_of_its_own(**settings: str) -> Iterator[Any]:
    """A module fixture's body: an embedded server of the module's own (fsync off: tests kill
    processes, not machines), with `settings`."""
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    with EmbeddedPostgres(fsync=False, settings=settings) as pg:
        yield pg

