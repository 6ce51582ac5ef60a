"""The sqlqueue command line against the embedded PostgreSQL (click's runner, a real database)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from click.testing import CliRunner

from backends import Backend
from spark_qtransport.cli import main
from spark_qtransport.wire import H, decode_headers


@pytest.fixture
def run(pg: Backend) -> Any:
    runner = CliRunner()

    def invoke(*args: str, ok: bool = True, url: bool = True, stdin: str | None = None) -> Any:
        env = {"SQLQUEUE_URL": pg.url if url else ""}
        result = runner.invoke(main, list(args), env=env, input=stdin)
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result

    return invoke


def test_create_queue_is_idempotent_and_reports_json(pg: Backend, names: Any, run: Any) -> None:
    q = names("Sales")
    first = run("create-queue", q, "--delayed", "--json")
    again = run("create-queue", q, "--delayed", "--json")
    assert json.loads(first.output) == json.loads(again.output) == [
        {"table": f'"public"."{q}"', "status": "ready"}, {"table": f'"public"."{q}.Delayed"', "status": "ready"}]
    assert pg.count(q) == 0 and pg.count(f'"{q}.Delayed"') == 0
    table = run("create-queue", q).output.splitlines()
    assert table[0].split() == ["table", "status"] and table[1].split() == [f'"public"."{q}"', "ready"]


def test_ddl_needs_no_connection(run: Any) -> None:
    out = run("ddl", "--dialect", "sqlserver", "--queue", "Sales@[billing]", "--part", "queue", "--part", "delayed",
              url=False).output
    assert "CREATE TABLE [billing].[Sales]" in out and "CREATE TABLE [billing].[Sales.Delayed]" in out
    assert "Claims" not in out
    pg_out = run("ddl", url=False).output
    for table in ('"public"."Sales"', '"public"."Sales.Claims"', '"public"."Sales.Staging"', '"public"."Sales.Outbox"',
                  '"public"."Sales.Delayed"', '"public"."SubscriptionRouting"'):
        assert table in pg_out


def test_send_fills_nservicebus_headers_and_is_read_back(pg: Backend, names: Any, run: Any) -> None:
    sales, billing = pg.create_queue(names("Sales")), pg.create_queue(names("Billing"))
    out = run("send", billing, "--endpoint", sales, "--type", "Billing.Messages.Charge", "--body", '{"amount": 12}',
              "--header", "Custom=a=b", "--id", "m-1", "--ttbr", "5m", "--json").output
    assert json.loads(out) == [{"queue": f'"public"."{billing}"', "sent": 1}]
    [(native_id, headers_text, body)] = pg.rows(billing)
    h = decode_headers(headers_text)
    assert body == b'{"amount": 12}' and h is not None
    assert (h[H.MESSAGE_ID], h[H.ENCLOSED_MESSAGE_TYPES], h[H.ORIGINATING_ENDPOINT], h["Custom"]) == (
        "m-1", "Billing.Messages.Charge", sales, "a=b")
    assert h["NServiceBus.TimeToBeReceived"] == "00:05:00"
    assert pg.count(billing, "WHERE expires IS NOT NULL") == 1


def test_send_delayed_then_move_delayed(pg: Backend, names: Any, run: Any) -> None:
    sales, billing = pg.create_queue(names("Sales")), pg.create_queue(names("Billing"))
    run("create-queue", sales, "--delayed")
    out = run("send", billing, "--endpoint", sales, "--type", "T", "--body", "-", "--delay", "1s", "--json",
              stdin="later").output
    assert json.loads(out) == [{"queue": f'"public"."{sales}.Delayed"', "sent": 1}]
    assert pg.count(billing) == 0
    time.sleep(1.1)
    moved = json.loads(run("move-delayed", sales, "--json").output)
    assert moved == [{"destination": f'"public"."{billing}"', "moved": 1}]
    assert [b for _, _, b in pg.rows(billing)] == [b"later"]


def test_delayed_suffix_flag_names_the_table_of_every_command(pg: Backend, names: Any, run: Any) -> None:
    """--delayed-suffix (the option delayedTableSuffix, NServiceBus's DelayedDelivery.TableSuffix):
    create-queue, send, stats, move-delayed and ddl all take <endpoint>.<suffix>."""
    sales, billing = names("Sales"), pg.create_queue(names("Billing"))
    created = json.loads(run("create-queue", sales, "--delayed", "--delayed-suffix", "Timeouts", "--json").output)
    assert [r["table"] for r in created] == [f'"public"."{sales}"', f'"public"."{sales}.Timeouts"']
    out = run("send", billing, "--endpoint", sales, "--type", "T", "--body", "later", "--delay", "1s",
              "--delayed-suffix", "Timeouts", "--json").output
    assert json.loads(out) == [{"queue": f'"public"."{sales}.Timeouts"', "sent": 1}]
    [row] = json.loads(run("stats", sales, "--delayed-suffix", "Timeouts", "--json").output)
    assert (row["delayed_due"], row["delayed_pending"]) == (0, 1)
    [row] = json.loads(run("stats", sales, "--json").output)
    assert row["delayed_pending"] is None  # no <endpoint>.Delayed
    time.sleep(1.1)
    assert "has no delayed table" in run("move-delayed", sales, ok=False).output
    moved = json.loads(run("move-delayed", sales, "--delayed-suffix", "Timeouts", "--json").output)
    assert moved == [{"destination": f'"public"."{billing}"', "moved": 1}]
    assert [b for _, _, b in pg.rows(billing)] == [b"later"]
    ddl = run("ddl", "--queue", "Sales", "--part", "delayed", "--delayed-suffix", "Timeouts", url=False).output
    assert '"public"."Sales.Timeouts"' in ddl and "Sales.Delayed" not in ddl


def test_delayed_table_flag_names_one_endpoint_s_table(pg: Backend, names: Any, run: Any) -> None:
    """--delayed-table (the option delayedTable): an endpoint whose delayed table is not beside its queue."""
    sales, billing, deferred = names("Sales"), pg.create_queue(names("Billing")), names("Deferred")
    created = json.loads(run("create-queue", sales, "--delayed", "--delayed-table", deferred, "--json").output)
    assert [r["table"] for r in created] == [f'"public"."{sales}"', f'"public"."{deferred}"']
    out = run("send", billing, "--endpoint", sales, "--type", "T", "--body", "later", "--delay", "1s",
              "--delayed-table", deferred, "--json").output
    assert json.loads(out) == [{"queue": f'"public"."{deferred}"', "sent": 1}]
    findings = json.loads(run("doctor", sales, "--delayed-table", deferred, "--json").output)
    assert {"level": "info", "table": f'"public"."{deferred}"', "finding": "present"} in findings
    [row] = json.loads(run("stats", sales, "--delayed-table", deferred, "--json").output)
    assert row["delayed_pending"] == 1
    time.sleep(1.1)
    moved = json.loads(run("move-delayed", sales, "--delayed-table", deferred, "--json").output)
    assert moved == [{"destination": f'"public"."{billing}"', "moved": 1}]
    grants = run("ddl", "--queue", "Sales", "--grant-to", "app", "--delayed-table", '"ops"."deferred"', url=False).output
    assert '--   "ops"."deferred": SELECT, INSERT, UPDATE, DELETE' in grants and "Sales.Delayed" not in grants


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("send", "Nowhere_x", "--endpoint", "S", "--type", "T", "--body", "x"), 1, "Nowhere_x\" does not exist"),
        (("send", "--endpoint", "S", "--intent", "publish", "--body", "x"), 2, "--type is required"),
        (("send", "B", "--endpoint", "S", "--type", "T", "--body", "x", "--header", "novalue"), 2, "KEY=VALUE"),
        (("send", "--endpoint", "S", "--type", "T", "--body", "x"), 2, "QUEUE is required"),
        (("send", "B", "--endpoint", "S", "--type", "T", "--body", "x", "--delay", "soon"), 1, "--delay must be a duration"),
        (("move-delayed", "NoSuchEndpoint"), 1, "has no delayed table"),
        (("move-delayed", "S", "--delayed-suffix", "Claims"), 1, "--delayed-suffix: 'Claims' names a table"),
        (("send", "B", "--endpoint", "S", "--type", "T", "--body", "x", "--delayed-table", "S"), 1,
         "--delayed-table: \"public\".\"S\" is the endpoint's queue"),
        (("create-queue", "A", "B", "--delayed", "--delayed-table", "T"), 2, "give one queue"),
        (("create-queue", "A", "--delayed-table", "T"), 2, "--delayed-table goes with --delayed"),
        (("stats", "--delayed-table", "T"), 2, "give one queue"),
    ],
)
def test_errors_are_one_line_with_an_exit_code(run: Any, args: tuple[str, ...], code: int, message: str) -> None:
    result = run(*args, ok=False)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_url_is_required(run: Any) -> None:
    result = run("create-queue", "Sales", ok=False, url=False)
    assert result.exit_code == 2 and "--url is required" in result.output


def test_peek_shows_without_taking(pg: Backend, names: Any, run: Any) -> None:
    from backends import nsb_headers

    q = pg.create_queue(names("Sales"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), b'{"n": %d}' % i) for i in range(3)])
    pg.send(q, "<corrupted headers", b"x" * 100)
    rows = json.loads(run("peek", q, "-n", "10", "--json").output)
    assert [r["message_id"] for r in rows] == ["m0", "m1", "m2", None]
    assert rows[0]["headers"]["NServiceBus.MessageId"] == "m0" and rows[0]["body"] == '{"n": 0}'
    assert rows[3]["headers"] == {"(not a flat JSON object)": "<corrupted headers"} and rows[3]["body"].endswith("...")
    assert pg.count(q) == 4  # nothing taken
    table = run("peek", q, "-n", "2").output.splitlines()
    assert table[0].split()[:3] == ["seq", "native_id", "message_id"] and len(table) == 3


def test_stats_counts_messages_expired_delayed_claims_and_outbox(pg: Backend, names: Any, run: Any) -> None:
    from backends import nsb_headers

    q = pg.create_queue(names("Sales"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(4)])
    pg.send(q, nsb_headers("old"), b"{}", ttbr_ms=1)
    run("create-queue", q, "--delayed")
    run("send", q, "--endpoint", q, "--type", "T", "--body", "later", "--delay", "1h")
    time.sleep(0.01)
    [row] = json.loads(run("stats", q, "--json").output)
    assert (row["messages"], row["expired"], row["backlog_span"]) == (5, 1, 5)
    assert row["oldest_age_s"] > 0  # from the oldest message's TimeSent (2025 in nsb_headers)
    assert (row["delayed_due"], row["delayed_pending"]) == (0, 1)
    assert row["outbox"] == 1 and row["claimed"] is None  # no claim table: every column is there, null
    purged = json.loads(run("purge-expired", q, "--json").output)
    assert purged == [{"queue": f'"public"."{q}"', "purged": 1}] and pg.count(q) == 4


def test_subscribe_and_unsubscribe(pg: Backend, names: Any, run: Any) -> None:
    billing = pg.create_queue(names("Billing"))
    table = names("Subs")
    missing = run("subscribe", billing, "--endpoint", "Billing", "--topic", "A", "--table", table, ok=False)
    assert missing.exit_code == 1 and "create-subscriptions" in missing.output
    run("create-subscriptions", "--table", table)
    run("subscribe", billing, "--endpoint", "Billing", "--topic", "Sales.Events.A", "--topic", "Sales.Events.B", "--table", table)
    run("subscribe", billing, "--endpoint", "Billing", "--topic", "Sales.Events.A", "--table", table)  # upsert
    with pg.connect() as c:
        rows = c.execute(f'SELECT queueaddress, endpoint, topic FROM "{table}" ORDER BY topic').fetchall()
    assert rows == [(f'"public"."{billing}"', "Billing", "Sales.Events.A"), (f'"public"."{billing}"', "Billing", "Sales.Events.B")]
    out = json.loads(run("unsubscribe", "--endpoint", "Billing", "--topic", "Sales.Events.A", "--table", table, "--json").output)
    assert out == [{"endpoint": "Billing", "topic": "Sales.Events.A", "removed": 1}]


def test_error_list_and_retry_send_failed_messages_back(pg: Backend, names: Any, run: Any) -> None:
    from backends import nsb_headers

    sales, error, gone = pg.create_queue(names("Sales")), pg.create_queue(names("error")), names("Gone")
    failure = {"NServiceBus.ExceptionInfo.ExceptionType": "System.Exception", "NServiceBus.ExceptionInfo.Message": "boom",
               "NServiceBus.TimeOfFailure": "2026-11-22 00:00:00:000000 Z"}
    ok = [pg.send(error, nsb_headers(f"m{i}", **{"NServiceBus.FailedQ": sales}, **failure), b"%d" % i) for i in range(3)]
    lost = pg.send(error, nsb_headers("x1", **{"NServiceBus.FailedQ": gone}, **failure), b"x")
    listed = json.loads(run("error", "list", "--queue", error, "--json").output)
    assert [(r["message_id"], r["failed_q"], r["exception"], r["message"]) for r in listed] == [
        ("m0", sales, "System.Exception", "boom"), ("m1", sales, "System.Exception", "boom"),
        ("m2", sales, "System.Exception", "boom"), ("x1", gone, "System.Exception", "boom")]
    one = run("error", "retry", str(ok[1]), "--queue", error, "--json")
    assert json.loads(one.output) == [{"native_id": "", "to": f'"public"."{sales}"', "result": "1 sent back"}]
    rest = run("error", "retry", "--all", "--queue", error, "--json")
    assert {r["result"] for r in json.loads(rest.output)} == {"2 sent back", f'kept: "public"."{gone}" does not exist'}
    back = [(decode_headers(h), b) for _, h, b in pg.rows(sales)]
    assert [(h[H.MESSAGE_ID], b) for h, b in back] == [("m1", b"1"), ("m0", b"0"), ("m2", b"2")]
    assert all(not any(k.startswith("NServiceBus.ExceptionInfo") or k in ("NServiceBus.FailedQ", "NServiceBus.TimeOfFailure")
                       for k in h) for h, _ in back)
    assert [r[0] for r in pg.rows(error)] == [str(lost)]
    missing = run("error", "retry", "00000000-0000-0000-0000-000000000000", "--queue", error, ok=False)
    assert missing.exit_code == 1 and "not in the error queue" in missing.output
    assert run("error", "retry", "--queue", error, ok=False).exit_code == 2


def test_a_malformed_native_id_is_wrong_usage(pg: Backend, names: Any, run: Any) -> None:
    """A native id is a uuid: anything else is a usage error naming the argument, before anything
    connects, not a database failure; the messages in the error queue stay where they are."""
    from backends import nsb_headers

    error = pg.create_queue(names("error"))
    pg.send(error, nsb_headers("m1", **{"NServiceBus.FailedQ": "Sales"}), b"x")
    for bad in ("not-a-uuid", "0f8fad5b-d9cb-469f-a165", "'; DROP TABLE x; --"):
        result = run("error", "retry", "00000000-0000-0000-0000-000000000000", bad, "--queue", error, ok=False)
        assert result.exit_code == 2, result.output
        [line] = [x for x in result.output.splitlines() if x.startswith("Error:")]
        assert "NATIVE_IDS" in line and f"{bad!r} is not a native id" in line, line
        assert "Traceback" not in result.output and "failed" not in result.output
    assert pg.count(error) == 1


def test_doctor_on_our_tables_and_on_nservicebus_created_ones(pg: Backend, names: Any, run: Any) -> None:
    ours, nsb, bad = pg.create_queue(names("Sales")), pg.create_queue(names("Nsb"), nsb=True), names("Bad")
    with pg.connect() as c:
        c.execute(f'CREATE TABLE "{bad}" (id uuid, headers text)')
        # an NServiceBus table close to the end of its int4 sequence
        c.execute(f"SELECT setval(pg_get_serial_sequence('\"{nsb}\"', 'seq'), 1900000000)")
    pg.send(nsb, "{}", b"x")
    result = run("doctor", ours, nsb, "--json")
    findings = json.loads(result.output)
    assert {(f["level"], f["table"]) for f in findings} >= {("ok", f'"public"."{ours}"'), ("warning", f'"public"."{nsb}"')}
    assert any("32-bit serial" in f["finding"] and "88.5% used" in f["finding"] for f in findings)
    failing = run("doctor", ours, bad, names("Missing"), ok=False)
    assert failing.exit_code == 1
    assert "missing column(s) body, expires, seq / RowVersion" in failing.output and "does not exist" in failing.output


def test_create_queue_refuses_names_nservicebus_refuses(pg: Backend, run: Any) -> None:
    """NServiceBus's PostgreSQL transport will not start (installers on) when one of its queues or
    its <endpoint>.Delayed table is named with more than 55 bytes (TableQueueNameLimit); we allow
    PostgreSQL's 63, so create-queue refuses unless told, naming the table and the rule."""
    tag = uuid.uuid4().hex[:8]
    long_name = f"Long_{tag}_" + "x" * (56 - 14)  # 56 bytes
    assert len(long_name.encode()) == 56
    refused = run("create-queue", long_name, ok=False)
    assert refused.exit_code == 1 and long_name in refused.output and "55 bytes" in refused.output
    assert "--allow-long-names" in refused.output
    endpoint = f"Ep_{tag}_" + "é" * 18  # 48 bytes; its .Delayed has 56
    refused = run("create-queue", endpoint, "--delayed", ok=False)
    assert f"{endpoint}.Delayed" in refused.output and "55 bytes" in refused.output
    with pg.connect() as conn:  # nothing was created, not even the names that fit
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname IN (%s, %s)",
                            (long_name, endpoint)).fetchone() == (0,)
    fits = f"Fits_{tag}_" + "x" * (55 - 14)
    assert json.loads(run("create-queue", fits, "--json").output) == [{"table": f'"public"."{fits}"', "status": "ready"}]
    allowed = run("create-queue", long_name, "--allow-long-names")
    assert "warning:" in allowed.output and "55 bytes" in allowed.output
    run("create-queue", endpoint, "--delayed", "--allow-long-names")
    assert pg.count(long_name) == 0 and pg.count(f'"{endpoint}.Delayed"') == 0


def test_doctor_warns_about_names_nservicebus_refuses(pg: Backend, run: Any) -> None:
    name = f"Long_{uuid.uuid4().hex[:8]}_" + "x" * 42
    run("create-queue", name, "--allow-long-names")
    findings = json.loads(run("doctor", name, "--json").output)
    assert any(f["level"] == "warning" and "55 bytes" in f["finding"] for f in findings)


def test_create_outbox_creates_the_sender_tables(pg: Backend, names: Any, run: Any) -> None:
    e = names("Sales")
    out = json.loads(run("create-outbox", e, "--json").output)
    assert out == [{"table": f'"public"."{e}.Staging"', "status": "ready"}, {"table": f'"public"."{e}.Outbox"', "status": "ready"}]
    assert pg.count(f'"{e}.Staging"') == 0 and pg.count(f'"{e}.Outbox"') == 0


def test_stats_without_queues_lists_every_queue_with_its_claims(pg: Backend, names: Any, run: Any) -> None:
    from backends import nsb_headers
    from spark_qtransport.transport.receiving.receiver import Receiver
    from spark_qtransport.transport.settings import ReceiveSettings

    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    run("create-queue", q, "--delayed")
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(3)])
    r = Receiver(ReceiveSettings.create(pg.url, q, error_queue=e, consumer="Sales.Spark", claim_ahead=False))
    try:
        r.latest(r.initial_offset(), 2)  # claimed, never acknowledged
    finally:
        r.close()
    rows = {row["queue"]: row for row in json.loads(run("stats", "--json").output)}
    mine = rows[f'"public"."{q}"']
    assert (mine["messages"], mine["claimed"]) == (1, {"Sales.Spark": 2})
    assert f'"public"."{e}"' in rows
    assert not [name for name in rows if name.endswith(('.Claims"', '.Delayed"', '.Staging"', '.Outbox"'))]


def test_table_output_escapes_control_characters(pg: Backend, names: Any, run: Any) -> None:
    """A header from a queue cannot drive the terminal: ESC, DEL, C1 and line breaks are shown as
    escapes in tables; JSON output stays JSON and carries the text unchanged."""
    from backends import nsb_headers

    error = pg.create_queue(names("error"))
    hostile = "boom\x1b]0;owned\x07\x1b[2J\r\nfake line\x7f\x9b"
    pg.send(error, nsb_headers("m1", **{"NServiceBus.FailedQ": "Sales", "NServiceBus.ExceptionInfo.Message": hostile}), b"x")
    table = run("error", "list", "--queue", error).output
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 for c in table), repr(table)
    assert r"boom\x1b]0;owned\x07\x1b[2J\x0d\x0afake line\x7f\x9b" in table
    assert len(table.splitlines()) == 2  # the header line and one row: no injected line
    output = run("error", "list", "--queue", error, "--json").output
    assert "\x1b" not in output and "\x9b" not in output
    assert json.loads(output)[0]["message"] == hostile
