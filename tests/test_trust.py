"""Trust on a shared database: hostile addresses in messages, spellings of one queue, planted functions.

Each test plays what another team's table, a hostile message or a role with CREATE on ``public``
can do to a database the connector shares, and checks the promise that holds regardless: no message
is lost or delivered twice, nothing outside the queues is written, and no one message stops a stream.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from backends import Backend, nsb_headers
from spark_qtransport.errors import ConsumerBusyError
from spark_qtransport.options.parse import ReaderOptions
from spark_qtransport.transport.receiving import receiver as receive
from spark_qtransport.transport.routing import RoutingPolicy
from spark_qtransport.wire import H


def drain(pg: Backend, queue: str) -> list[dict[str, str]]:
    """The headers of every message, received with NServiceBus's receive SQL."""
    return [headers for headers, _ in pg.drain(queue)]


def finish(query: Any, timeout: float = 180) -> None:
    query.awaitTermination(timeout)
    assert not query.isActive
    assert query.exception() is None, query.exception()


@pytest.fixture
def orders(pg: Backend, names: Any) -> Any:
    """Another team's table: not a queue, but with enough columns to look like one to a careless writer."""
    name = names("orders")
    with pg.connect() as c:
        c.execute(f'CREATE TABLE public."{name}" (id uuid, headers text, body bytea, note text)')
        c.execute(f'INSERT INTO public."{name}" VALUES (gen_random_uuid(), \'{{}}\', NULL, \'keep me\')')
    yield name
    with pg.connect() as c:
        c.execute(f'DROP TABLE IF EXISTS public."{name}"')


def _table_rows(pg: Backend, table: str) -> int:
    with pg.connect() as c:
        return int(c.execute(f'SELECT count(*) FROM public."{table}"').fetchone()[0])


def test_forward_destinations_that_are_not_queues_go_to_the_error_queue_and_the_stream_goes_on(
    spark: Any, pg: Backend, names: Any, orders: str, checkpoint: str
) -> None:
    """ForwardDestination naming another team's table, a catalog table and a missing table, among
    200 good messages: the good ones arrive once, the bad ones wait in the error queue with FailedQ
    and the reason, the queue ends empty, and no other table is written."""
    q, e, later = pg.create_queue(names("Sales")), pg.create_queue(names("error")), pg.create_queue(names("Later"))
    bad = {"to-orders": orders, "to-catalog": "pg_catalog.pg_class", "to-missing": names("Nowhere"),
           "to-claims": f'"public"."{q}.Claims"'}
    messages = [(nsb_headers(f"good-{i}"), b"{}") for i in range(100)]
    messages += [(nsb_headers(mid, **{H.FORWARD_DESTINATION: to}), b"bad") for mid, to in bad.items()]
    messages += [(nsb_headers("forwarded", **{H.FORWARD_DESTINATION: later}), b"{}")]
    messages += [(nsb_headers(f"good-{i}"), b"{}") for i in range(100, 200)]
    pg.send_many(q, messages)
    seen: list[str] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend(r.message_id for r in df.select("message_id").collect())

    df = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
          .option("maxMessagesPerTrigger", "60").load())
    query = df.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    finish(query)
    assert sorted(seen) == sorted(f"good-{i}" for i in range(200))  # each once
    assert pg.count(q) == 0
    assert [h[H.MESSAGE_ID] for h in drain(pg, later)] == ["forwarded"]
    failed = {h[H.MESSAGE_ID]: h for h in drain(pg, e)}
    assert set(failed) == set(bad)
    for mid, to in bad.items():
        assert failed[mid][H.FAILED_Q] == to
        assert to.split(".")[-1].strip('"') in failed[mid]["NServiceBus.ExceptionInfo.Message"]
        assert H.FORWARD_DESTINATION not in failed[mid]
    assert "system table" in failed["to-catalog"]["NServiceBus.ExceptionInfo.Message"]
    assert "not a queue table" in failed["to-orders"]["NServiceBus.ExceptionInfo.Message"]
    assert "does not exist" in failed["to-missing"]["NServiceBus.ExceptionInfo.Message"]
    assert _table_rows(pg, orders) == 1


def test_replies_to_hostile_reply_addresses_go_to_the_error_queue_and_the_query_finishes(
    spark: Any, pg: Backend, names: Any, orders: str, checkpoint: str
) -> None:
    """A reply stream (destination = ReplyToAddress) with requests whose ReplyToAddress names
    another team's table and a catalog table, among 100 good ones: the query finishes, the 100
    replies arrive once, the two bad ones wait in the endpoint's error queue."""
    from spark_qtransport import reply

    q, e, web = pg.create_queue(names("Sales")), pg.create_queue(names("error")), pg.create_queue(names("Web"))
    requests = [(nsb_headers(f"req-{i}", **{H.REPLY_TO_ADDRESS: web}), b"{}") for i in range(50)]
    requests += [(nsb_headers("evil-orders", **{H.REPLY_TO_ADDRESS: f"public.{orders}"}), b"{}"),
                 (nsb_headers("evil-catalog", **{H.REPLY_TO_ADDRESS: "pg_catalog.pg_proc"}), b"{}")]
    requests += [(nsb_headers(f"req-{i}", **{H.REPLY_TO_ADDRESS: web}), b"{}") for i in range(50, 100)]
    pg.send_many(q, requests)
    from pyspark.sql import functions as F

    received = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
                .option("maxMessagesPerTrigger", "40").load())
    replies = received.select(*reply(body=F.lit(b"{}"), message_type="Sales.OrderAccepted"))
    query = (replies.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", q).option("errorQueue", e)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    finish(query)
    got = drain(pg, web)
    assert sorted(h[H.RELATED_TO] for h in got) == sorted(f"req-{i}" for i in range(100))
    failed = {h[H.RELATED_TO]: h for h in drain(pg, e)}
    assert set(failed) == {"evil-orders", "evil-catalog"}
    assert failed["evil-catalog"][H.FAILED_Q] == '"pg_catalog"."pg_proc"'  # as the sink parsed it
    assert failed["evil-orders"][H.MESSAGE_INTENT] == "Reply"
    assert _table_rows(pg, orders) == 1


@pytest.mark.parametrize("spelling", ["public.{q}", '"public"."{q}"'])
def test_one_endpoint_lock_however_the_queue_is_spelled(pg: Backend, names: Any, spelling: str) -> None:
    """The one-receiver-per-(queue, endpoint) lock is the table's, not its spelling's: a second
    receiver naming the same queue another way waits, then fails, and claims nothing."""
    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(10)])

    def receiver(text: str, clock: Any = time.monotonic) -> receive.Receiver:
        options = ReaderOptions.parse({"url": pg.url, "queue": text, "errorQueue": e, "endpoint": "Shop.Sales",
                                       "claimAhead": "false"})
        return receive.Receiver(options, clock=clock)

    first = receiver(q)
    try:
        end = first.latest(first.initial_offset(), 5)
        assert end.claim > 0
        ticks = iter(range(0, 10_000, 40))  # each look at the clock: 40 s later
        second = receiver(spelling.format(q=q), clock=lambda: float(next(ticks)))
        with pytest.raises(ConsumerBusyError, match="Shop.Sales"):
            second.initial_offset()
        second.close()
    finally:
        first.close()
    assert pg.count(q) == 5  # the second receiver claimed nothing


#: functions a role with CREATE on public could plant, each a better match than the catalog's for a
#: call the connector makes with an implicit cast (name -> text, integer -> bigint, ...)
PLANTED = [
    "hashtextextended(text, integer) RETURNS bigint",
    "lower(name) RETURNS text",
    "pg_try_advisory_lock(integer) RETURNS boolean",
    "pg_advisory_unlock(integer) RETURNS boolean",
    "to_regclass(text) RETURNS regclass",
    "gen_random_uuid() RETURNS uuid",
    "jsonb_path_exists(jsonb, text, jsonb, boolean) RETURNS boolean",
    "format_type(oid, bigint) RETURNS text",
]


@pytest.fixture
def planted(pg: Backend, names: Any) -> Any:
    calls = f"trojan_calls_{names.tag}"  # a sequence: its nextval survives the caller's rollback
    with pg.connect() as c:
        c.execute(f"CREATE SEQUENCE public.{calls}")
        for sig in PLANTED:
            fn, ret = sig.split(" RETURNS ")
            c.execute(
                f"CREATE FUNCTION public.{fn} RETURNS {ret} LANGUAGE plpgsql AS $$ BEGIN "
                f"PERFORM pg_catalog.nextval('public.{calls}'); RAISE EXCEPTION 'trojan {fn} called'; END $$"
            )
    yield calls
    with pg.connect() as c:
        for sig in PLANTED:
            c.execute(f"DROP FUNCTION IF EXISTS public.{sig.split(' RETURNS ')[0]}")
        c.execute(f"DROP SEQUENCE IF EXISTS public.{calls}")


def test_planted_functions_in_public_are_never_called(
    spark: Any, pg: Backend, names: Any, planted: str, checkpoint: str
) -> None:
    """Receive, forward, send, publish, defer, the delayed mover and the CLI, all with a trojan per
    implicitly cast call planted in public: none is ever called."""
    import subprocess
    import sys

    from pyspark.sql import functions as F

    q, e, out = pg.create_queue(names("Sales")), pg.create_queue(names("error")), pg.create_queue(names("Out"))
    later = pg.create_queue(names("Later"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(20)]
                 + [(nsb_headers("fwd", **{H.FORWARD_DESTINATION: later}), b"{}"), ("<corrupted headers", b"x")])
    received = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
                .load())
    sends = received.select(F.col("body"), F.lit(out).alias("destination"),
                            F.lit("Sales.OrderAccepted").alias("message_type"),
                            F.when(F.col("message_id") == "m0", F.lit(0.01)).alias("delay"))
    query = (sends.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", q).option("errorQueue", e)
             .option("createQueues", "true").option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    finish(query)
    cli = [sys.executable, "-m", "spark_qtransport.cli"]
    env_url = ["--url", pg.url]
    for args in (["stats", q], ["peek", out], ["move-delayed", q], ["doctor", q]):
        done = subprocess.run(cli + args + env_url, capture_output=True, text=True, timeout=60)
        assert "trojan" not in done.stdout + done.stderr, done.stderr
    with pg.connect() as c:
        assert c.execute(f"SELECT is_called FROM public.{planted}").fetchone()[0] is False
    assert pg.count(out) + pg.count(f'"public"."{q}.Delayed"') == 20
    assert pg.count(later) == 1 and pg.count(e) == 1


def test_the_allow_list_is_the_same_for_reader_sink_and_cli(pg: Backend, names: Any) -> None:
    """allowedSchemas / allowedQueues: an address from data outside them is refused like a missing
    queue (to the error queue, or kept by error retry), wherever it comes from."""
    import subprocess
    import sys

    from backends import Sender, receive_batch
    from spark_qtransport.options.parse import ReaderOptions

    q, e, ok = pg.create_queue(names("Sales")), pg.create_queue(names("error")), pg.create_queue(names("Billing"))
    other = pg.create_queue(names("Shipping"))
    # the sink: only Billing* queues may be named by data
    s = Sender(pg, q, error_queue=e, routing=RoutingPolicy(queues=("Billing*",)))
    result = s.send([{"body": b"1", "message_type": "T", "destination": ok},
                     {"body": b"2", "message_type": "T", "destination": other, "message_id": "refused"}])
    assert (result.sent, result.failed) == (1, 1)
    [failed] = drain(pg, e)
    assert failed[H.MESSAGE_ID] == "refused" and "allowed queue patterns" in failed["NServiceBus.ExceptionInfo.Message"]
    # the reader: a ForwardDestination outside allowedSchemas
    pg.send(q, nsb_headers("fwd", **{H.FORWARD_DESTINATION: ok}), b"f")
    options = ReaderOptions.parse({"url": pg.url, "queue": q, "errorQueue": e, "allowedSchemas": "billing"})
    assert options.routing.schemas == ("billing",)
    rows = receive_batch(pg, q, e, routing=RoutingPolicy(schemas=("billing",)))
    assert rows == [] and pg.count(ok) == 1
    [failed] = drain(pg, e)
    assert failed[H.FAILED_Q] == ok and "allowed schemas" in failed["NServiceBus.ExceptionInfo.Message"]
    # the CLI: error retry keeps a message whose FailedQ is outside the allow-list
    pg.send(e, {**nsb_headers("back"), H.FAILED_Q: other}, b"b")
    cli = [sys.executable, "-m", "spark_qtransport.cli", "error", "retry", "--all", "--queue", e, "--url", pg.url,
           "--json"]
    done = subprocess.run([*cli, "--allowed-queues", "Billing*"], capture_output=True, text=True, timeout=60)
    assert "allowed queue patterns" in done.stdout and pg.count(e) == 1 and pg.count(other) == 0
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert pg.count(e) == 0 and pg.count(other) == 1


@pytest.mark.slow(reason="two queries run until one gives up waiting for the endpoint's lock")
def test_two_running_queries_one_endpoint_two_spellings_never_share_a_message(
    spark: Any, pg: Backend, names: Any, tmp_path: Any
) -> None:
    """Two running queries with one endpoint on `Sales` and `"public"."Sales"`: the second waits
    for the endpoint's lock, then fails with ConsumerBusyError; no message reaches both."""
    import threading

    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    got: dict[str, list[str]] = {"plain": [], "quoted": []}
    lock = threading.Lock()

    def collect(name: str) -> Any:
        def sink(df: Any, batch_id: int) -> None:
            ids = [r.message_id for r in df.select("message_id").collect()]
            with lock:
                got[name].extend(ids)
        return sink

    def start(name: str, spelling: str) -> Any:
        df = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", spelling)
              .option("errorQueue", e).option("endpoint", "Shop.Sales").load())
        return (df.writeStream.foreachBatch(collect(name)).option("checkpointLocation", str(tmp_path / name))
                .trigger(processingTime="200 milliseconds").start())

    first = start("plain", q)
    try:
        pg.send_many(q, [(nsb_headers(f"a{i}"), b"{}") for i in range(50)])
        deadline = time.monotonic() + 60
        while len(got["plain"]) < 50 and time.monotonic() < deadline:
            time.sleep(0.2)
        second = start("quoted", f'"public"."{q}"')
        pg.send_many(q, [(nsb_headers(f"b{i}"), b"{}") for i in range(50)])
        with pytest.raises(Exception, match=r"(?s)ConsumerBusyError: endpoint 'Shop.Sales' is already receiving"):
            second.awaitTermination(120)
        assert not second.isActive
        deadline = time.monotonic() + 60
        while len(got["plain"]) < 100 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        first.stop()
    assert sorted(got["plain"]) == sorted([f"a{i}" for i in range(50)] + [f"b{i}" for i in range(50)])
    assert got["quoted"] == []
