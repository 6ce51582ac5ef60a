"""Odd values from a queue never stop an endpoint: each reaches the error queue with failure
headers, or is read as NServiceBus reads it, and the rest goes on (embedded PostgreSQL; the
stream test in a real local Spark with a real checkpoint)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from click.testing import CliRunner

from backends import Backend, nsb_headers
from spark_qtransport.cli import main
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.transport.receiving.receiver import Receiver, read_slice
from spark_qtransport.transport.settings import ReceiveSettings
from spark_qtransport.wire import H, decode_headers

#: Expires values PostgreSQL's timestamp holds, by what they mean to a receiver
DELIVERED = {"infinity": None, "9999-12-31 23:59:59": "9999-12-31 23:59:59"}
EXPIRED = ("-infinity", "0001-01-01 00:00:00", "0044-03-15 00:00:00 BC")
TOO_LATE = "10000-01-01 00:00:00"


def insert(pg: Backend, table: str, rows: list[tuple[Any, ...]]) -> None:
    """Rows of (id, expires text, headers text, body) as another application may write them."""
    with pg.connect() as conn:
        conn.cursor().executemany(
            f"INSERT INTO {pg.q(table)} (id, expires, headers, body) VALUES (%s, %s::timestamp, %s, %s)", rows)


def odd_row(message_id: str, expires: str | None) -> tuple[Any, ...]:
    return (uuid.uuid4(), expires, json.dumps(nsb_headers(message_id)), message_id.encode())


def stats(pg: Backend, *queues: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["stats", *queues, "--json"], env={"SQLQUEUE_URL": pg.url})
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def peek(pg: Backend, queue: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["peek", queue, "-n", "1000", "--json"], env={"SQLQUEUE_URL": pg.url})
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def claimed(pg: Backend, queue: str) -> int:
    return pg.count(pg.claims(queue))


def failures(pg: Backend, error: str) -> list[tuple[str, dict[str, Any], bytes | None]]:
    return [(nid, decode_headers(text) or {}, body) for nid, text, body in pg.rows(error)]


def test_odd_expires_never_stop_a_stream(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    """Expires infinity, -infinity, year 9999, year 1, BC and year 10000 among 200 good rows: every
    good one arrives once, infinity and 9999 are delivered, the expired ones dropped and counted,
    year 10000 is in the error queue with failure headers naming expires; `stats` works while
    they wait; two runs of the checkpoint leave nothing claimed."""
    from test_stream import Collect, reader, run_available_now

    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    rows = [odd_row("inf", "infinity")]  # first: the oldest row is what stats reads headers of
    rows += [odd_row(f"good-{i}", None) for i in range(100)]
    rows += [odd_row(f"expired-{i}", v) for i, v in enumerate(EXPIRED)]
    rows += [odd_row("late", "9999-12-31 23:59:59"), odd_row("too-late", TOO_LATE)]
    rows += [odd_row(f"good-{i}", None) for i in range(100, 200)]
    insert(pg, q, rows)
    before = stats(pg, q)[0]
    assert (before["messages"], before["expired"]) == (len(rows), len(EXPIRED))
    assert any(r["queue"] == f'"public"."{q}"' for r in stats(pg))  # every queue of the database
    assert len(peek(pg, q)) == len(rows)

    sink = Collect()
    df = reader(spark, pg, q, e, maxMessagesPerTrigger="60")
    query = run_available_now(spark, df, checkpoint, sink)
    ids = sink.ids()
    assert sorted(ids) == sorted([f"good-{i}" for i in range(200)] + ["inf", "late"])  # each once
    expires = {r.message_id: r.expires for r in sink.rows if r.message_id in ("inf", "late")}
    assert expires["inf"] is None and expires["late"].year == 9999
    offset = json.loads(query.lastProgress["sources"][0]["latestOffset"])
    assert (offset["expired"], offset["deadLettered"]) == (len(EXPIRED), 1)

    [(native_id, headers, body)] = failures(pg, e)
    assert native_id == str(rows[105][0]) and body == b"too-late"
    assert headers[H.MESSAGE_ID] == "too-late" and headers[H.FAILED_Q] == f'"public"."{q}"'
    message = headers["NServiceBus.ExceptionInfo.Message"]
    assert "expires" in message and "10000-01-01 00:00:00" in message  # the column, the value it holds
    assert headers["NServiceBus.ExceptionInfo.ExceptionType"] == "spark_qtransport.MessageError"
    assert headers[H.TIME_OF_FAILURE] and headers["NServiceBus.ProcessingEndpoint"]
    after = stats(pg, q)[0]
    assert after["messages"] == 0 and sum((after["claimed"] or {}).values()) == claimed(pg, q) == 0
    assert peek(pg, q) == [] and len(peek(pg, e)) == 1  # a finished AvailableNow run left nothing claimed

    # the checkpoint's next run finds nothing and receives nothing twice
    run_available_now(spark, reader(spark, pg, q, e), checkpoint, sink)
    assert sorted(sink.ids()) == sorted(ids) and claimed(pg, q) == 0 and pg.count(q) == 0


def test_claims_an_older_version_left_with_odd_expires_are_read(pg: Backend, names: Any) -> None:
    """A claim table already holding Expires infinity (as an older version claimed it), year
    10000 or BC: the read maps them (infinity and later: none; before year 1: year 1) instead of
    failing every read of the batch."""
    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    insert(pg, q, [odd_row(f"m{i}", None) for i in range(4)])
    # claims in the claim table, as an older version made them (prepared claims have no copy to plant)
    r = Receiver(ReceiveSettings.create(pg.url, q, error_queue=e, claim_ahead=False, claim_mode="table"))
    try:
        start = r.initial_offset()
        end = r.latest(start, 10)
        with pg.connect() as conn:
            conn.cursor().execute(
                f"UPDATE {pg.q(pg.claims(q))} SET expires = (ARRAY[timestamp 'infinity', '{TOO_LATE}',"
                " '0044-03-15 BC', '2030-01-01'])[claim_seq - (SELECT min(claim_seq) - 1 FROM"
                f" {pg.q(pg.claims(q))})]")
        got = {m.message_id: m.expires for part in r.slices(start, end) for m in read_slice(part)}
        assert got["m0"] is None and got["m1"] is None
        assert got["m2"].year == 1 and got["m3"].year == 2030
        r.ack(end)
    finally:
        r.close()


@pytest.fixture
def hand_made(pg: Backend, names: Any) -> tuple[str, str]:
    """A queue table made by hand whose id and headers may be NULL (doctor finds it fits)."""
    q, e = names("Sales"), pg.create_queue(names("error"))
    with pg.connect() as conn:
        conn.cursor().execute(
            f"CREATE TABLE {pg.q(q)} (id uuid, expires timestamp, headers text, body bytea, seq bigserial NOT NULL UNIQUE)")
    return q, e


@pytest.mark.parametrize("helper", [False, True], ids=["builtin", "plpgsql-helper"])
def test_null_headers_and_null_id_in_a_hand_made_table(pg: Backend, hand_made: tuple[str, str], helper: bool,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """NULL headers are no headers (NServiceBus: DBNull -> null -> an empty set): delivered. A
    NULL id goes to the error queue with a new id and failure headers naming id, its own headers
    (a NUL escape among them, which jsonb refuses) kept as they were. Nothing stays behind."""
    q, e = hand_made
    nul = '{"NServiceBus.MessageId":"no-id","Note":"a\\u0000b","K\\\\u0000":"\\\\\\u0000"}'
    insert(pg, q, [odd_row("first", None), (uuid.uuid4(), None, None, b"no headers"), (None, None, nul, b"no id"),
                   (None, None, None, None), odd_row("last", None)])
    r = Receiver(ReceiveSettings.create(pg.url, q, error_queue=e, claim_ahead=False))
    r.endpoint.dialect = PostgresDialect(force_helper=helper)  # helper: PostgreSQL 13-15's poison check
    try:
        start = r.initial_offset()
        end = r.latest(start, 10)
        got = [(m.message_id, m.headers, m.body) for part in r.slices(start, end) for m in read_slice(part)]
        r.ack(end)
        assert r.stats.dead_lettered == 2 and r.report()["deadLettered"] == 2
        [warning] = [m.getMessage() for m in caplog.records if "failure headers" in m.getMessage()]
        assert "moved 2" in warning and f'"public"."{e}"' in warning and "id is NULL" in warning  # how many, where, why
    finally:
        r.close()
    assert [g[0] for g in got] == ["first", got[1][0], "last"]
    assert got[1][1:] == ({}, b"no headers")
    dead = failures(pg, e)
    assert [d[2] for d in dead] == [b"no id", None]
    for native_id, headers, _ in dead:
        uuid.UUID(native_id)  # a new id
        assert headers[H.FAILED_Q] == f'"public"."{q}"'
        assert headers["NServiceBus.ExceptionInfo.Message"].startswith("column id is NULL")
    assert {k: v for k, v in dead[0][1].items() if not k.startswith(("NServiceBus.", "$.diagnostics.")) or k == H.MESSAGE_ID} == {
        "NServiceBus.MessageId": "no-id", "Note": "a\x00b", "K\\u0000": "\\\x00"}
    assert pg.count(q) == 0 and claimed(pg, q) == 0


def test_doctor_names_nullable_columns_and_companion_names_too_long(pg: Backend, hand_made: tuple[str, str],
                                                                     names: Any) -> None:
    """A hand-made table whose id and headers allow NULL does not "fit the transport"; a queue
    whose `.Claims`, `.Staging`, `.Outbox` or delayed table name would pass 63 bytes is named."""
    q, _ = hand_made
    long_name = f"L{uuid.uuid4().hex[:8]}_" + "x" * 48  # 58 bytes: every companion would be 65 or more
    with pg.connect() as conn:
        conn.cursor().execute(
            f'CREATE TABLE "{long_name}" (id uuid NOT NULL PRIMARY KEY, expires timestamp, headers text NOT NULL,'
            " body bytea, seq bigserial NOT NULL UNIQUE)")
    try:
        runner = CliRunner()
        out = runner.invoke(main, ["doctor", q, long_name, "--delayed-suffix", "Timeouts", "--json"],
                            env={"SQLQUEUE_URL": pg.url})
        assert out.exit_code == 0, out.output
        findings = json.loads(out.output)
        mine = [(f["level"], f["finding"]) for f in findings if f["table"] == f'"public"."{q}"']
        assert not [m for level, m in mine if level == "ok"]  # no longer "fits the transport"
        [nullable] = [m for level, m in mine if level == "warning" and "allow NULL" in m]
        assert nullable.startswith("column(s) id, headers allow NULL, where NServiceBus's queue table declares NOT NULL")
        long = [f["finding"] for f in findings if f["table"] == f'"public"."{long_name}"' and f["level"] == "warning"]
        for suffix, without in (("Claims", "no stream can receive"), ("Staging", "no sink can send"),
                                ("Outbox", "no sink can send"), ("Timeouts", "cannot defer")):
            [finding] = [m for m in long if f"{long_name}.{suffix}" in m]
            assert "more than the 63 the database allows" in finding and without in finding
        table = runner.invoke(main, ["doctor", long_name], env={"SQLQUEUE_URL": pg.url}).output
        assert f"{long_name}.Claims" in table
    finally:
        pg.drop(long_name)
