"""The spark-submit jobs end to end: real processes, the embedded PostgreSQL, real Delta tables.

Each job runs as its own process (as spark-submit would start it) and its Delta output is read
back with the test session and compared with chispa.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality

from backends import Backend, nsb_headers
from processes import ROOT, START, Job, wait_for
from spark_qtransport.spark.versions import capabilities

JOBS = ROOT / "jobs"

pytestmark = pytest.mark.slow(reason="each job runs as a process of its own (its own JVM), as spark-submit starts it")


def produce(pg: Backend, queue: str, ids: range, *, content_type: str = "application/json") -> None:
    pg.send_many(queue, [
        (nsb_headers(f"order-{i:05d}", **{"NServiceBus.ContentType": content_type,
                                           "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrder, Shop.Messages"}),
         json.dumps({"OrderId": i, "Amount": 10 + i % 7, "Customer": f"c{i % 5}"}).encode())
        for i in ids
    ])


def delta_versions(table: Path) -> int:
    return len(list((table / "_delta_log").glob("*.json")))


@pytest.mark.compat
@pytest.mark.usefixtures("delta")
def test_queue_to_delta_exactly_once_across_a_kill(spark: Any, pg: Backend, names: Any, tmp_path: Path) -> None:
    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    table, ckpt = tmp_path / "bronze", tmp_path / "ckpt"
    args = ["--url", pg.url, "--queue", q, "--error-queue", e, "--table", str(table), "--checkpoint", str(ckpt),
            "--max-messages", "100", "--job-id", "bronze-test"]
    produce(pg, q, range(0, 100))  # Spark 4.0/4.1: a run's first batch takes all that waits
    job = Job(JOBS / "queue_to_delta.py", [*args, "--trigger", "200ms"], log=tmp_path / "job.log")
    wait_for(lambda: delta_versions(table) >= 1, START, "a first Delta commit", job)
    produce(pg, q, range(100, 600))
    wait_for(lambda: delta_versions(table) >= 2, START, "two Delta commits", job)
    job.kill()  # SIGKILL driver, JVM and workers mid-stream
    produce(pg, q, range(600, 1000), content_type="application/octet-stream")
    # on Spark 4.0/4.1 an AvailableNow run is one batch: a replay of the killed run's batch if there
    # is one, then its own; the next run acknowledges the last
    for _ in range(1 if capabilities().admission_control else 3):
        again = Job(JOBS / "queue_to_delta.py", [*args, "--trigger", "available-now"], log=tmp_path / "job.log")
        assert again.wait(300) == 0, (tmp_path / "job.log").read_text()[-3000:]

    bronze = spark.read.format("delta").load(str(table))
    assert bronze.count() == 1000 and bronze.select("message_id").distinct().count() == 1000
    expected = spark.createDataFrame(
        [(f"order-{i:05d}", "Shop.Messages.PlaceOrder, Shop.Messages", f"order-{i:05d}",
          json.dumps({"OrderId": i, "Amount": 10 + i % 7, "Customer": f"c{i % 5}"}) if i < 600 else None)
         for i in range(1000)],
        "message_id string, message_type string, correlation_id string, body_text string",
    )
    got = bronze.select("message_id", "message_type", "correlation_id", "body_text")
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)
    # the date partition comes from TimeSent (2025-11-28 in nsb_headers); nothing left behind
    assert [r.date.isoformat() for r in bronze.select("date").distinct().collect()] == ["2025-11-28"]
    # the queue is empty, and the finished AvailableNow run acknowledged its last batch too
    assert pg.count(q) == 0 and pg.count(pg.claims(q)) == 0


def test_endpoint_job_accepts_replies_publishes_defers_and_fails_invalid_orders(
    spark: Any, pg: Backend, names: Any, tmp_path: Path
) -> None:
    from spark_qtransport.dialects import dialect_named
    from spark_qtransport.wire import decode_headers

    d = dialect_named("postgres")
    sales, e, web, billing = (pg.create_queue(names(n)) for n in ("Sales", "error", "Web", "Billing"))
    subs = names("Subscriptions")
    with pg.connect() as c:
        for stmt in [*d.create_delayed(d.companion(d.parse_address(sales), "Delayed")),
                     *d.create_subscriptions(d.parse_address(subs))]:
            c.execute(stmt.sql, stmt.params)
        c.execute(f'INSERT INTO "{subs}" (QueueAddress, Endpoint, Topic) VALUES (%s, %s, %s)',
                  (billing, "Billing", "Sales.Events.OrderPlaced"))

    def order(i: int, body: bytes, message_type: str = "Shop.Messages.PlaceOrder, Shop.Messages") -> tuple[dict[str, str], bytes]:
        return nsb_headers(f"o{i}", **{"NServiceBus.ReplyToAddress": web, "NServiceBus.EnclosedMessageTypes": message_type}), body

    good = [order(i, json.dumps({"OrderId": i, "Amount": 5.5, "Customer": "c"}).encode()) for i in range(30)]
    bad = [order(100, b'{"OrderId": 100, "Amount": 0}'), order(101, b"not json"),
           order(102, b"{}", "Shop.Messages.Unknown, Shop.Messages")]
    pg.send_many(sales, [*good, *bad])
    table, ckpt = tmp_path / "sales", tmp_path / "ckpt"
    config = tmp_path / "endpoint.toml"
    config.write_text(
        "[endpoint]\n"
        f"queue = {json.dumps(sales)}\nerror_queue = {json.dumps(e)}\ntable = {json.dumps(str(table))}\n"
        f"checkpoint = {json.dumps(str(ckpt))}\ntrigger = \"available-now\"\nreminder_delay = 600\n"
        f"subscription_table = {json.dumps(subs)}\n"
        f"job_id = \"endpoint-{uuid.uuid4().hex[:6]}\"\n"
    )
    job = Job(JOBS / "endpoint.py", ["--config", str(config), "--url", pg.url], log=tmp_path / "job.log")
    assert job.wait(300) == 0, (tmp_path / "job.log").read_text()[-3000:]

    kept = spark.read.format("delta").load(str(table))
    expected = spark.createDataFrame([(f"o{i}", "order", i, 5.5) for i in range(30)],
                                     "message_id string, kind string, order_id long, amount double")
    assert_df_equality(kept.select("message_id", "kind", "order_id", "amount"), expected,
                       ignore_row_order=True, ignore_nullable=True)

    replies = [decode_headers(h) for _, h, _ in pg.rows(web)]
    assert sorted(h["NServiceBus.RelatedTo"] for h in replies) == sorted(f"o{i}" for i in range(30))
    assert {h["NServiceBus.MessageIntent"] for h in replies} == {"Reply"}
    assert all(h["NServiceBus.CorrelationId"] == h["NServiceBus.RelatedTo"] for h in replies)
    events = [decode_headers(h) for _, h, _ in pg.rows(billing)]
    assert len(events) == 30 and {h["NServiceBus.MessageIntent"] for h in events} == {"Publish"}
    with pg.connect() as c:
        delayed = c.execute(f'SELECT headers FROM "{sales}.Delayed" WHERE due > now() + interval \'9 minutes\'').fetchall()
    reminders = [decode_headers(h) for (h,) in delayed]
    assert len(reminders) == 30
    assert {h["NServiceBus.SqlServer.ForwardDestination"] for h in reminders} == {d.format_address(d.parse_address(sales))}
    failed = {decode_headers(h)["NServiceBus.MessageId"]: (decode_headers(h), body) for _, h, body in pg.rows(e)}
    assert sorted(failed) == ["o100", "o101", "o102"]
    for h, _ in failed.values():
        assert h["NServiceBus.FailedQ"] == d.format_address(d.parse_address(sales)) and h["NServiceBus.ExceptionInfo.Message"]
        assert h["NServiceBus.ReplyToAddress"] == web  # the received headers are kept
    assert failed["o101"][1] == b"not json"
    assert "no handler" in failed["o102"][0]["NServiceBus.ExceptionInfo.Message"]
    assert pg.count(sales) == 0


def test_demo_runs_and_every_count_matches(tmp_path: Path) -> None:
    """`make demo` as a new user runs it: its own embedded PostgreSQL, exit code 0, a full report,
    and nothing else: no Spark warnings, Ivy listing or progress bars, not even Java's incubator
    module line; on stderr only the source's own warnings about the expired messages (the claim)
    and the poison one (its batch's acknowledgement) (and, without Delta's jars in the cache, the line saying they are being fetched)."""
    import os
    import subprocess
    import sys

    from test_docs import spark_noise

    env = {k: v for k, v in os.environ.items() if k != "SQLQUEUE_URL"}
    done = subprocess.run([sys.executable, str(JOBS / "demo.py"), "--orders", "400"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = done.stdout[done.stdout.index("spark-qtransport demo report"):]
    assert "BAD" not in report and report.rstrip().endswith("all counts match")
    assert report.count("  ok  ") == 10
    assert done.stdout.startswith("starting an embedded PostgreSQL ...\nShop.Web sent 400 PlaceOrder commands")
    assert not spark_noise(done.stdout + done.stderr), done.stderr[-3000:]
    ours = ('queue "public"."Sales": claimed ', 'queue "public"."Sales": acknowledged ', "fetching io.delta:")
    assert [line for line in done.stderr.splitlines() if not line.startswith(ours)] == [], done.stderr[-3000:]
