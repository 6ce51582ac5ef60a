"""The sink refuses values the database cannot take, before anything is written, naming the
column, the value and the message: non-finite or out-of-range durations and times, NUL characters."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from backends import Backend, nsb_headers
from spark_qtransport.dialects import dialect_named
from spark_qtransport.dialects.base import STAGED_COLUMNS
from spark_qtransport.errors import MessageError, unwrap
from spark_qtransport.transport.sending.builder import MessageBuilder
from spark_qtransport.transport.sending.messages import DELAYED, SEND, SendPlan, StagedRow

TYPE = "Shop.Messages.PlaceOrder, Shop.Messages"
YEAR = 365.25 * 86_400


def builder(dialect: str = "postgres") -> MessageBuilder:
    plan = SendPlan(dialect=dialect, endpoint="Sales", default_destination=dialect_named(dialect).parse_address("Billing"),
                    reply_to=None, content_type="application/json", sink="default")
    return MessageBuilder(plan, batch_id=1, attempt="a")


def build(**row: Any) -> StagedRow:
    return builder().build({"body": b"{}", "message_id": "order-7", "message_type": TYPE, **row}, datetime.now(timezone.utc))


def refused(column: str, shown: str, **row: Any) -> str:
    with pytest.raises(MessageError) as info:
        build(**row)
    assert info.value.column == column.split("[")[0]
    text = str(info.value)
    assert repr(column) in text and "order-7" in text and shown in text, text
    return text


@pytest.mark.parametrize("column", ["delay", "time_to_be_received"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, Decimal("NaN"), Decimal("Infinity")])
def test_non_finite_durations_are_refused(column: str, value: Any) -> None:
    assert "finite" in refused(column, repr(value), **{column: value})


@pytest.mark.parametrize("column", ["delay", "time_to_be_received"])
def test_durations_past_100_years_are_refused(column: str) -> None:
    assert "too long" in refused(column, "1e+300", **{column: 1e300})
    refused(column, "days=36865", **{column: timedelta(days=101 * 365)})
    # too large for a float at all; the value is shown in part
    assert len(refused(column, str(10**400)[:150], **{column: 10**400})) < 400


def test_durations_up_to_100_years_are_taken() -> None:
    row = build(delay=99 * YEAR)
    assert row.kind == DELAYED and row.delay_ms == round(99 * YEAR * 1000)
    assert build(time_to_be_received=timedelta(days=99 * 365)).ttbr_ms == 99 * 365 * 86_400_000


def test_sql_server_adds_at_most_an_int_of_seconds() -> None:
    b = builder("sqlserver")
    base = {"body": b"{}", "message_id": "order-7", "message_type": TYPE}
    assert b.build({**base, "delay": 2**31 - 1}, "now").delay_ms == (2**31 - 1) * 1000
    with pytest.raises(MessageError) as info:
        b.build({**base, "delay": 2**31}, "now")
    assert info.value.column == "delay"
    assert "'order-7'" in str(info.value) and "2147483648" in str(info.value)  # the message, the value


def test_a_negative_delay_is_due_now() -> None:
    for delay in (-5, -1e300, -(10**20)):
        row = build(delay=delay)
        assert row.kind == SEND and row.delay_ms == 0


def test_deliver_at_more_than_100_years_from_now_is_refused() -> None:
    now = datetime.now(timezone.utc)
    assert "100 years" in refused("deliver_at", "9999-12-31", deliver_at=datetime(9999, 12, 31))
    assert build(deliver_at=now + timedelta(days=99 * 365)).kind == DELAYED


@pytest.mark.parametrize("past", [datetime(1, 1, 1), datetime(1, 1, 1, tzinfo=timezone.utc), datetime(1900, 1, 1),
                                  "a minute ago"])
def test_deliver_at_in_the_past_is_due_now(past: Any) -> None:
    """However far back (the docs: past times are delivered at once): a delay of 0 from the
    database's clock, never a due time some database cannot store (SQL Server's datetime starts
    in 1753)."""
    if past == "a minute ago":
        past = datetime.now(timezone.utc) - timedelta(minutes=1)
    row = build(deliver_at=past)
    assert (row.kind, row.delay_ms, row.due) == (DELAYED, 0, None)


@pytest.mark.parametrize("column", ["correlation_id", "message_type", "reply_to"])
def test_nul_in_text_columns_is_refused(column: str) -> None:
    assert "NUL" in refused(column, r"'a\x00b'", **{column: "a\x00b"})


def test_nul_in_the_message_id_is_refused() -> None:
    with pytest.raises(MessageError) as info:
        build(message_id="order\x007")
    assert info.value.column == "message_id"
    assert r"'order\x007'" in str(info.value)  # the message named by its id, the NUL escaped


def test_nul_in_header_keys_and_values_is_refused() -> None:
    refused("headers", r"'Shop.Tenant\x00'", headers={"Shop.Tenant\x00": "x"})
    refused("headers['Shop.Tenant']", r"'acme\x00'", headers={"Shop.Tenant": "acme\x00"})
    long = "x" * 10_000 + "\x00"
    assert len(refused("headers['Shop.Tenant']", "...", headers={"Shop.Tenant": long})) < 1000


def test_ordinary_values_pass() -> None:
    row = build(correlation_id="c-1", reply_to="Shop.Web", headers={"Shop.Tenant": "acme"}, time_to_be_received=30.5)
    assert row.kind == SEND and row.ttbr_ms == 30_500


def test_staged_rows_have_the_staging_columns_in_order() -> None:
    """The dialects write staged rows by `STAGED_COLUMNS`: the two cannot drift apart."""
    assert StagedRow._fields == STAGED_COLUMNS
    row = build()
    assert row.size == len(row.headers) + 2 and row.message_id == "order-7"


@pytest.mark.usefixtures("spark")
def test_a_stream_with_a_bad_value_fails_naming_column_and_message(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    from pyspark.sql import functions as F

    source, target, error = pg.create_queue(names("Sales")), pg.create_queue(names("Billing")), pg.create_queue(names("error"))
    pg.send_many(source, [(nsb_headers(f"order-{i}"), b"{}") for i in range(3)])
    received = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", source)
                .option("errorQueue", error).load())
    out = received.select(
        "body", "message_id", "message_type", F.lit(target).alias("destination"),
        F.when(F.col("message_id") == "order-1", F.lit(float("nan"))).otherwise(F.lit(1.0)).alias("delay"),
    )
    query = (out.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", source)
             .option("invalidRows", "fail")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    with pytest.raises(Exception) as info:
        query.awaitTermination(180)
    assert not query.isActive
    err = unwrap(info.value)
    assert isinstance(err, MessageError) and err.column == "delay", info.value
    assert "'order-1'" in err.message and "nan" in err.message, err  # the message, the value
    assert pg.count(target) == 0 and pg.count(f'"{source}.Staging"') == 0  # the batch sent nothing


def test_a_destination_with_a_nul_goes_to_the_error_queue_not_to_a_database_error(pg: Any, names: Any) -> None:
    """A NUL cannot be stored in text: a destination holding one is refused by the routing path
    (its FailedQ shows it escaped), not by the staging COPY."""
    from backends import Sender

    sales, error = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    result = Sender(pg, sales, error_queue=error).send([{"body": b"x", "message_type": "T", "destination": "a\x00b"}])
    assert (result.sent, result.failed) == (0, 1)
    [(_, headers, _)] = pg.rows(error)
    assert '"NServiceBus.FailedQ":"a\\\\x00b"' in headers
