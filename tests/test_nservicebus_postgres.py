"""Live runs beside NServiceBus's own PostgreSQL SQL, copied verbatim from
NServiceBus.Transport.PostgreSql (PostgreSqlConstants.cs), on the embedded server.

- Delayed delivery on a server whose TimeZone is not UTC: NServiceBus stores `Due` (timestamptz)
  as the UTC wall clock read in the session's TimeZone and moves rows whose `Due < now() AT TIME
  ZONE 'UTC'`. Messages stored by either side must be moved on time by the other's mover.
- Installers racing NServiceBus's (QueueCreator): its unlocked DDL must not fail ours.
- Names NServiceBus refuses (PostgreSqlTransportInfrastructure.TableQueueNameLimit, 55 bytes).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

import pytest

from backends import PG_NSB_CREATE_DELAYED, Backend, Sender, nsb_headers
from spark_qtransport.transport.delayed import DelayedMover
from spark_qtransport.wire import H

# NServiceBus's texts below are verbatim but for trailing blanks; Npgsql's @Name parameters become
# psycopg's in `npgsql`.

# PostgreSqlConstants.StoreDelayedMessageText ({0} the delayed table)
NSB_STORE_DELAYED = """
WITH params (DueDate) as (
   values (timestamptz (now() AT TIME ZONE 'UTC') + (@DueAfterDays || ' days ')::INTERVAL + (@DueAfterHours || ' hours ')::INTERVAL + (@DueAfterMinutes || ' mins ')::INTERVAL + (@DueAfterSeconds || ' s ')::INTERVAL + (@DueAfterMilliseconds || ' ms')::INTERVAL)
)
INSERT INTO {0} (
    Headers,
    Body,
    Due)
SELECT @Headers, @Body, DueDate
FROM params;"""

# PostgreSqlConstants.MoveDueDelayedMessageText ({0} the delayed table, {1} the input queue)
NSB_MOVE_DUE = """
WITH message as (DELETE FROM {0} WHERE id in (SELECT id from {0} WHERE {0}.Due < now() AT TIME ZONE 'UTC' LIMIT @BatchSize)
RETURNING id, headers, body)
INSERT into {1} (id, expires, headers, body) SELECT id, NULL, headers, body FROM message;

SELECT now() AT TIME ZONE 'UTC' as UtcNow, Due as NextDue
FROM {0}
ORDER BY Due LIMIT 1 FOR UPDATE SKIP LOCKED"""



def npgsql(sql: str) -> str:
    """Npgsql's `@Name` parameters as psycopg's `%(Name)s`."""
    return re.sub(r"@(\w+)", r"%(\1)s", sql)


def run_nsb(backend: Backend, sql: str, params: dict[str, Any]) -> None:
    """NServiceBus's text as Npgsql sends it: several statements, parameters bound (client side)."""
    import psycopg

    with backend.connect() as conn, psycopg.ClientCursor(conn) as cur:
        cur.execute(npgsql(sql), params)


def nsb_store_delayed(backend: Backend, delayed: str, destination: str, delay: timedelta, body: bytes) -> None:
    """NServiceBus's DelayedMessageTable.Store: the ForwardDestination header added, the delay cut
    into TimeSpan's Days, Hours, Minutes, Seconds and Milliseconds."""
    headers = nsb_headers(**{H.FORWARD_DESTINATION: destination})
    whole_ms = int(delay / timedelta(milliseconds=1))
    days, rest = divmod(whole_ms, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, ms = divmod(rest, 1000)
    run_nsb(backend, NSB_STORE_DELAYED.format(backend.q(delayed)), {
        "Headers": json.dumps(headers), "Body": body, "DueAfterDays": days, "DueAfterHours": hours,
        "DueAfterMinutes": minutes, "DueAfterSeconds": seconds, "DueAfterMilliseconds": ms,
    })


def nsb_move_due(backend: Backend, delayed: str, input_queue: str) -> None:
    run_nsb(backend, NSB_MOVE_DUE.format(backend.q(delayed), backend.q(input_queue)), {"BatchSize": 100})


@pytest.fixture(scope="module")
def berlin(pg_url: str) -> Iterator[Backend]:
    """A database whose sessions run in Europe/Berlin, as a server a DBA set up in Germany:
    `ALTER DATABASE ... SET TimeZone`, so every session (ours, NServiceBus's) gets it by default."""
    import psycopg

    name = f"sqlqueue_berlin_{uuid.uuid4().hex[:8]}"
    admin = Backend(pg_url)
    with admin.connect() as conn:
        try:
            conn.execute(f'CREATE DATABASE "{name}"')
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("the test role may not create a database")
        conn.execute(f"ALTER DATABASE \"{name}\" SET TimeZone = 'Europe/Berlin'")
    url = urlsplit(pg_url)._replace(path=f"/{name}").geturl()
    try:
        yield Backend(url)
    finally:
        with admin.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_berlin_sessions_are_not_utc(berlin: Backend) -> None:
    with berlin.connect() as conn:
        (zone, offset) = conn.execute("SELECT current_setting('TimeZone'), extract(timezone FROM now())").fetchone()
        conn2 = berlin.dialect.connect(berlin.parsed)  # the connector's own sessions too
        try:
            (ours,) = conn2.execute("SELECT current_setting('TimeZone')").fetchone()
        finally:
            conn2.close()
    assert zone == ours == "Europe/Berlin" and offset in (3600, 7200)


def _landed(backend: Backend, queue: str) -> list[str]:
    return sorted(json.loads(h)[H.MESSAGE_ID] for _, h, _ in backend.rows(queue))


DELAY = 1.5


def test_our_delayed_messages_are_moved_on_time_by_nservicebus(berlin: Backend) -> None:
    """We store (delay and deliver_at); NServiceBus's mover, verbatim, moves them: not an hour
    late (our Due was now() + delay, which its `Due < now() AT TIME ZONE 'UTC'` reached an hour
    after), and not early either."""
    tag = uuid.uuid4().hex[:8]
    sales, billing = berlin.create_queue(f"Sales_{tag}"), berlin.create_queue(f"Billing_{tag}")
    s = Sender(berlin, sales, destination=billing, create_queues=True)
    delayed = berlin.dialect.format_address(s.options.delayed)
    start = time.monotonic()
    result = s.send([
        {"body": b"by delay", "message_type": "T, A", "message_id": "delay", "delay": DELAY},
        {"body": b"by time", "message_type": "T, A", "message_id": "deliver-at",
         "deliver_at": datetime.now(timezone.utc) + timedelta(seconds=DELAY)},
    ])
    assert result.delayed == 2
    nsb_move_due(berlin, delayed, sales)
    assert berlin.count(delayed) == 2 and berlin.count(sales) == 0, "NServiceBus moved them early"
    time.sleep(max(DELAY + 0.3 - (time.monotonic() - start), 0))
    nsb_move_due(berlin, delayed, sales)
    assert berlin.count(delayed) == 0, "NServiceBus's mover did not see them due (an hour late)"
    assert _landed(berlin, sales) == ["delay", "deliver-at"]


def nsb_delayed_table(backend: Backend, queue: str) -> tuple[Any, str]:
    """The delayed table of the endpoint whose queue is `queue`, made by NServiceBus's own DDL:
    its address and its text."""
    d = backend.dialect
    address = d.companion(d.parse_address(queue), "Delayed")
    with backend.connect() as conn:
        conn.execute(PG_NSB_CREATE_DELAYED.format(d.qualified(address), address.table))
    return address, d.format_address(address)


def test_nservicebus_delayed_messages_are_moved_on_time_by_ours(berlin: Backend) -> None:
    """NServiceBus stores (its delayed retries go this way too); our mover moves them on time,
    not an hour early (its Due, read as an instant, is an hour before the time it means)."""
    tag = uuid.uuid4().hex[:8]
    sales, billing = berlin.create_queue(f"Sales_{tag}"), berlin.create_queue(f"Billing_{tag}")
    error = berlin.create_queue(f"error_{tag}")
    d = berlin.dialect
    delayed_address, delayed = nsb_delayed_table(berlin, sales)
    start = time.monotonic()
    nsb_store_delayed(berlin, delayed, d.format_address(d.parse_address(billing)), timedelta(seconds=DELAY), b"soon")
    nsb_store_delayed(berlin, delayed, billing, timedelta(minutes=30), b"later")
    mover = DelayedMover(d, delayed_address, d.parse_address(sales), d.parse_address(error))
    conn = d.connect(berlin.parsed)
    try:
        assert mover.move(conn).moved == 0, "our mover moved NServiceBus's delayed messages early"
        time.sleep(max(DELAY + 0.3 - (time.monotonic() - start), 0))
        assert mover.move(conn).moved == 1
    finally:
        conn.close()
    assert [b for _, _, b in berlin.rows(billing)] == [b"soon"]
    assert berlin.count(delayed) == 1


def test_stats_of_a_delayed_table_read_nservicebus_due_times(berlin: Backend) -> None:
    """`sqlqueue stats` counts due and pending delayed messages, and the next due time is the
    instant NServiceBus means."""
    tag = uuid.uuid4().hex[:8]
    sales = berlin.create_queue(f"Sales_{tag}")
    d = berlin.dialect
    delayed_address, delayed = nsb_delayed_table(berlin, sales)
    nsb_store_delayed(berlin, delayed, sales, timedelta(minutes=30), b"pending")
    nsb_store_delayed(berlin, delayed, sales, timedelta(seconds=-1), b"due")
    stmt = d.delayed_stats(delayed_address)
    with berlin.connect() as conn:
        due, pending, next_due = conn.execute(stmt.sql, stmt.params).fetchone()
    assert (due, pending) == (1, 1)
    assert abs(next_due - (datetime.now(timezone.utc) + timedelta(minutes=30))) < timedelta(minutes=1)


def test_doctor_names_a_server_time_zone_that_is_not_utc(berlin: Backend, pg: Backend) -> None:
    from click.testing import CliRunner

    from spark_qtransport.cli import main

    def doctor(backend: Backend) -> list[dict[str, str]]:
        queue = backend.create_queue(f"Sales_{uuid.uuid4().hex[:8]}")
        result = CliRunner().invoke(main, ["doctor", queue, "--json"], env={"SQLQUEUE_URL": backend.url})
        assert result.exit_code == 0, result.output
        return list(json.loads(result.output))

    [zone, table] = doctor(berlin)
    assert zone["level"] == "warning" and zone["table"] == "(server)"
    assert "'Europe/Berlin', not UTC" in zone["finding"] and table["level"] == "ok"
    assert [f["level"] for f in doctor(pg)] == ["ok"]


def _wait_for_a_lock_wait(backend: Backend, other_than: int, timeout: float = 20.0) -> None:
    """Until a session other than `other_than` waits on a lock (ours, behind NServiceBus's DDL)."""
    deadline = time.monotonic() + timeout
    with backend.connect() as conn:
        while time.monotonic() < deadline:
            (n,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> %s",
                                (other_than,)).fetchone()
            if n:
                return
            time.sleep(0.02)
    raise AssertionError("our installer never waited for NServiceBus's")


@pytest.mark.parametrize("table", ["queue", "delayed"])
def test_installers_racing_nservicebus_installers(pg: Backend, table: str) -> None:
    """NServiceBus's installers run CREATE ... IF NOT EXISTS without a lock and swallow the
    "already exists" errors (42P07, 42710, 23505) a concurrent installer causes (QueueCreator,
    SubscriptionTableCreator). Ours, started while one of theirs holds the same table uncommitted,
    waits, then finds it made and goes on: no error."""
    import threading

    from click.testing import CliRunner

    from backends import PG_NSB_CREATE_QUEUE
    from spark_qtransport.cli import main
    from spark_qtransport.transport import create_queues

    name = f"Race_{uuid.uuid4().hex[:8]}"
    d = pg.dialect
    failures: list[BaseException | str] = []

    def ours() -> None:
        try:
            if table == "queue":
                create_queues(pg.parsed, name)
            else:  # the CLI's installer: the queue, then its .Delayed, in one transaction
                result = CliRunner().invoke(main, ["create-queue", name, "--delayed"], env={"SQLQUEUE_URL": pg.url})
                if result.exit_code != 0:
                    failures.append(result.output)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)

    nsb = pg.connect(autocommit=False)
    try:
        if table == "queue":
            nsb.execute(PG_NSB_CREATE_QUEUE.format(pg.q(name)))
        else:
            delayed = d.companion(d.parse_address(name), "Delayed")
            nsb.execute(PG_NSB_CREATE_DELAYED.format(d.qualified(delayed), delayed.table))
        thread = threading.Thread(target=ours)
        thread.start()
        _wait_for_a_lock_wait(pg, nsb.info.backend_pid)
        nsb.commit()
        thread.join(30)
    finally:
        nsb.close()
    assert not thread.is_alive() and failures == []
    assert pg.count(name) == 0
    if table == "delayed":
        assert pg.count(d.format_address(d.companion(d.parse_address(name), "Delayed"))) == 0


def test_creating_a_queue_nservicebus_refuses_is_a_warning(pg: Backend, caplog: Any) -> None:
    """PostgreSqlTransportInfrastructure: over 55 bytes (TableQueueNameLimit), an endpoint whose
    installers run refuses to start. Our installers (create_queues, createQueues) create it, with
    a warning that names the table and the rule; 55 bytes is fine."""
    import logging

    from spark_qtransport.transport import create_queues

    tag = uuid.uuid4().hex[:8]
    fits, too_long = f"Fits_{tag}_" + "x" * 41, f"Long_{tag}_" + "x" * 42
    with caplog.at_level(logging.WARNING, logger="spark_qtransport.install"):
        create_queues(pg.parsed, fits, too_long)
    [record] = caplog.records
    assert too_long in record.getMessage() and "over 55 bytes" in record.getMessage()
    assert pg.count(fits) == pg.count(too_long) == 0
