"""What a new user meets in the first hour, each case one that once went wrong: an unbalanced quote
in a name, a dotted name that is not a schema, the CLI's own words for a missing type, a claim
table given as a queue, a sink cell run again with other options, queryName, the documented
signatures of fail() and retry_later(), and one-off batch writes."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from backends import Backend, nsb_headers
from spark_qtransport import unwrap
from spark_qtransport.cli import main
from spark_qtransport.errors import ConfigError, QueueNotFoundError
from spark_qtransport.options.parse import ReaderOptions
from spark_qtransport.wire import H, decode_headers


@pytest.fixture
def cli(pg: Backend) -> Any:
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        return runner.invoke(main, list(args), env={"SQLQUEUE_URL": pg.url})

    return invoke


# -- names -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("option", "text", "message"), [
    ("queue", '"Sales', "option 'queue': invalid queue address '\"Sales': the quote at position 1 is never closed"),
    ("queue", 'public."Sales', "the quote at position 8 is never closed"),
    ("queue", '"Sales"x', "text after the closing quote at position 7"),
    ("queuePattern", '"tenant_*.audit', "option 'queuePattern': invalid pattern '\"tenant_*.audit': the quote at "
                                        "position 1 is never closed"),
])
def test_an_unbalanced_quote_names_the_option_and_the_position(option: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as failed:
        ReaderOptions.stream({"url": "postgresql://u@h/db", option.lower(): text})
    assert message in str(failed.value)
    assert failed.value.option == option


def test_create_queue_with_an_unbalanced_quote_creates_nothing(pg: Backend, cli: Any) -> None:
    result = cli("create-queue", '"Sales')
    assert result.exit_code != 0
    assert "the quote at position 1 is never closed" in result.output
    with pg.connect() as c:
        assert c.execute("SELECT count(*) FROM pg_class WHERE relname LIKE '%\"Sales%'").fetchone()[0] == 0


def test_create_queue_says_which_table_a_dotted_name_made(pg: Backend, names: Any, cli: Any) -> None:
    name = f"{names('tenant')}.audit"
    result = cli("create-queue", name)
    assert result.exit_code == 0, result.output
    assert f'"public"."{name}"' in result.output
    assert f'note: there is no schema "{name.split(".")[0]}", so {name} is the table "public"."{name}"' in result.output
    assert "create the schema first" in result.output


def test_send_without_a_type_names_the_flag(pg: Backend, names: Any, cli: Any) -> None:
    probe = pg.create_queue(names("Probe"))
    result = cli("send", probe, "--endpoint", names("Web"), "--body", "x")
    assert result.exit_code == 2
    assert "--type is required" in result.output and "message_type column" not in result.output
    assert pg.count(probe) == 0


@pytest.mark.parametrize("command", ["stats", "peek"])
def test_a_claim_table_is_named_for_what_it_is(pg: Backend, names: Any, cli: Any, command: str) -> None:
    from backends import receive_batch

    q, e = pg.create_queue(names("Kq")), pg.create_queue(names("error"))
    receive_batch(pg, q, e)  # makes its claim table
    result = cli(command, f"{q}.Claims")
    assert result.exit_code == 1
    assert result.output.strip() == (f'error: "public"."{q}.Claims" is the connector\'s claim table of queue '
                                     f'"public"."{q}", not a queue')


# -- the sink --------------------------------------------------------------------------------------

def _types(pg: Backend, queue: str) -> list[dict[str, str]]:
    return [decode_headers(h) for _, h, _ in pg.rows(queue)]  # type: ignore[misc]


def test_a_sink_run_again_with_other_options_uses_them(spark: Any, pg: Backend, names: Any) -> None:
    out, e1, e2 = pg.create_queue(names("Out")), pg.create_queue(names("err1")), pg.create_queue(names("err2"))
    endpoint = names("Cell")

    def write(content_type: str, error_queue: str, invalid: str) -> None:
        df = spark.createDataFrame([("{}", "T", None), ("{}", "T", float("nan"))], "body string, message_type string, delay double")
        (df.write.format("sqlqueue").option("url", pg.url).option("endpoint", endpoint).option("destination", out)
         .option("contentType", content_type).option("errorQueue", error_queue).option("invalidRows", invalid).mode("append").save())

    write("application/json", e1, "error-queue")
    write("text/xml", e2, "error-queue")
    assert [h[H.CONTENT_TYPE] for h in _types(pg, out)] == ["application/json", "text/xml"]
    assert pg.count(e1) == 1 and pg.count(e2) == 1, "each run's invalid row went to that run's errorQueue"
    with pytest.raises(Exception, match="delay"):
        write("text/xml", e2, "fail")
    assert pg.count(out) == 2 and pg.count(e2) == 1, "invalidRows=fail, given in the third run, failed it whole"


def test_query_name_is_how_a_sink_query_is_named(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    q, out, e = pg.create_queue(names("Named")), pg.create_queue(names("NamedOut")), pg.create_queue(names("error"))
    pg.send(q, nsb_headers("n1"), b"{}")
    query = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e).load()
             .select("body", "message_type").writeStream.format("sqlqueue").queryName(names("orders"))
             .option("url", pg.url).option("endpoint", q).option("destination", out)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        assert query.name == names("orders")
        query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
    assert pg.count(out) == 1


def test_fail_and_retry_later_take_their_arguments_as_the_readme_writes_them(spark: Any) -> None:
    from pyspark.sql import functions as F

    from spark_qtransport import fail, retry_later

    received = spark.createDataFrame(
        [(b"{}", "m1", {"NServiceBus.MessageId": "m1"}, "Sales", 7)],
        "body binary, message_id string, headers map<string,string>, queue string, claim_seq long")

    def failure(columns: list[Any]) -> dict[str, Any]:
        [row] = received.select(*columns).collect()
        return row.asDict(recursive=True)

    # positional as the docs write them, and by keyword: the same message, each argument in its place
    # (fails when the signature's order changes, or an argument lands in another field)
    written = failure(fail("reason", "Shop.Type"))
    assert written == failure(fail(F.lit("reason"), exception_type="Shop.Type"))
    assert written["intent"] == "fail" and written["message_id"] == "m1"
    assert {k: written["failure"][k] for k in ("exception_type", "message", "failed_q", "claim_seq")} == {
        "exception_type": "Shop.Type", "message": "reason", "failed_q": "Sales", "claim_seq": 7}
    later = failure(retry_later("reason", "Shop.Type", "at Handler()", 5, 30))
    assert later == failure(retry_later(F.lit("reason"), exception_type="Shop.Type", stack_trace="at Handler()",
                                        max_retries=5, delay=30))
    assert later["intent"] == "retry" and later["destination"] == "Sales"
    assert {k: later["failure"][k] for k in ("exception_type", "message", "stack_trace", "max_retries", "delay")} == {
        "exception_type": "Shop.Type", "message": "reason", "stack_trace": "at Handler()", "max_retries": 5,
        "delay": 30.0}


def test_a_batch_write_sends_its_rows_in_one_transaction(spark: Any, pg: Backend, names: Any) -> None:
    from pyspark.sql import functions as F

    out = pg.create_queue(names("Batch"))
    endpoint = names("Once")
    rows = spark.createDataFrame([(f'{{"n": {i}}}', "Shop.Ping", f"b{i}") for i in range(3)],
                                 "body string, message_type string, message_id string")
    rows.write.format("sqlqueue").option("url", pg.url).option("endpoint", endpoint).option("destination", out).mode("append").save()
    assert sorted(h[H.MESSAGE_ID] for h in _types(pg, out)) == ["b0", "b1", "b2"]
    # one row's destination (from data) is missing, so it must go to the error queue, which is missing
    # too: the write fails, naming the option, and sends none of its rows, the good ones included
    routed = rows.withColumn("destination", F.when(F.col("message_id") == "b1", F.lit(names("Nowhere")))
                             .otherwise(F.lit(out)))
    no_errors = names("NoErrors")
    with pytest.raises(Exception) as failed:
        (routed.write.format("sqlqueue").option("url", pg.url).option("endpoint", endpoint)
         .option("errorQueue", no_errors).mode("append").save())
    cause = unwrap(failed.value)
    assert isinstance(cause, QueueNotFoundError) and cause.option == "errorQueue", failed.value
    assert no_errors in str(cause.queue)
    assert pg.count(out) == 3, "a write that fails sends nothing"
    # with the error queue there, the missing destination is no failure: that row goes there, the rest is sent
    errors = pg.create_queue(names("error"))
    (routed.write.format("sqlqueue").option("url", pg.url).option("endpoint", names("Twice"))
     .option("errorQueue", errors).mode("append").save())
    assert pg.count(out) == 5 and [h[H.MESSAGE_ID] for h in _types(pg, errors)] == ["b1"]
    rows.write.format("sqlqueue").option("url", pg.url).option("endpoint", endpoint).option("destination", out).mode("append").save()
    assert pg.count(out) == 8, "a second write sends again: its message ids let a receiver's outbox drop them"
