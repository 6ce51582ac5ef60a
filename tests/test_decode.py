"""A fetch's raw claim rows -> the stream's Arrow record batch (transport/receiving/decode.py): the
edges the dialects' reads can hand it. The same function runs under every read in the contract suite."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from spark_qtransport.errors import QTransportError
from spark_qtransport.spark.schema import SCHEMA
from spark_qtransport.transport.receiving.decode import ARROW_SCHEMA, rows_batch

UTC = timezone.utc
CLAIMED = datetime(2026, 11, 23, 12, 0, 0, 123456)


def row(seq: int, headers: dict[str, object] | str, *, native: str = "6570F854-C422-43DA-9292-AFFA46998CBA",
        body: bytes | None = b"{}", expires: datetime | None = None) -> tuple[object, ...]:
    text = headers if isinstance(headers, str) else json.dumps(headers)
    return (seq, native, expires, text, body, 100 + seq, CLAIMED)


def test_schema_is_spark_schema_in_arrow() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_columns_from_headers_and_claim() -> None:
    headers = {"NServiceBus.MessageId": "m-1", "NServiceBus.EnclosedMessageTypes": "Shop.PlaceOrder",
               "NServiceBus.CorrelationId": "c-1", "NServiceBus.ConversationId": "v-1",
               "NServiceBus.ReplyToAddress": "Shop.Web", "NServiceBus.MessageIntent": "Send",
               "NServiceBus.TimeSent": "2026-11-22 00:05:18:653833 Z", "Custom": None}
    batch = rows_batch("Sales", [row(7, headers, expires=datetime(2026, 11, 24, tzinfo=timezone(timedelta(hours=2))))])
    assert batch.schema.equals(ARROW_SCHEMA)
    (got,) = batch.to_pylist()
    assert got["message_id"] == "m-1"
    assert got["native_id"] == "6570f854-c422-43da-9292-affa46998cba"
    assert dict(got["headers"]) == headers
    assert (got["message_type"], got["correlation_id"], got["conversation_id"], got["reply_to"], got["intent"]) == (
        "Shop.PlaceOrder", "c-1", "v-1", "Shop.Web", "Send")
    assert got["time_sent"] == datetime(2026, 11, 22, 0, 5, 18, 653833, tzinfo=UTC)
    assert got["expires"] == datetime(2026, 11, 23, 22, 0, tzinfo=UTC)  # the same instant, in UTC
    assert got["claimed_at"] == CLAIMED.replace(tzinfo=UTC)  # a timestamp without zone is UTC
    assert (got["queue"], got["claim_seq"], got["source_seq"], got["body"]) == ("Sales", 7, 107, b"{}")


def test_missing_or_empty_message_id_is_the_native_id() -> None:
    batch = rows_batch("q", [row(1, {}), row(2, {"NServiceBus.MessageId": ""}, native="abc"),
                             row(3, {"NServiceBus.MessageId": "x"})])
    assert batch.column("message_id").to_pylist() == ["6570f854-c422-43da-9292-affa46998cba", "abc", "x"]


def test_odd_values_are_kept_or_null_never_fatal() -> None:
    rows = [row(1, {"NServiceBus.TimeSent": "yesterday", "é\u2028": "\x00\u00ff"}, body=None),
            row(2, ' { "a" : "b" } ')]
    got = rows_batch("q", rows).to_pylist()
    assert got[0]["time_sent"] is None and got[0]["body"] is None
    assert dict(got[0]["headers"]) == {"NServiceBus.TimeSent": "yesterday", "é\u2028": "\x00\u00ff"}
    assert dict(got[1]["headers"]) == {"a": "b"}


def test_empty_headers_text_is_an_empty_header_set() -> None:
    """NServiceBus's Message reads Headers '' (string.IsNullOrEmpty) as no headers, not as
    corrupted; white space alone is corrupted there (the claim sends it to the error queue)."""
    got = rows_batch("q", [row(1, ""), row(2, {"NServiceBus.MessageId": "m"}), row(3, "", native="abc")]).to_pylist()
    assert [dict(r["headers"]) for r in got] == [{}, {"NServiceBus.MessageId": "m"}, {}]
    assert [r["message_id"] for r in got] == ["6570f854-c422-43da-9292-affa46998cba", "m", "abc"]


def test_a_large_body_alone_is_not_copied() -> None:
    body = bytes(range(256)) * 4096
    column = rows_batch("q", [row(1, {}, body=body)]).column("body")
    assert column[0].as_py() == body
    assert column.buffers()[2].address == pa.py_buffer(body).address


def test_no_rows_no_columns() -> None:
    assert rows_batch("q", []).num_rows == 0


def test_unreadable_headers_name_the_message_and_claim() -> None:
    with pytest.raises(QTransportError) as info:
        rows_batch("q", [row(8, {}), row(9, "{not json")])
    assert "6570f854-c422-43da-9292-affa46998cba" in str(info.value)  # the message (its native id)
    assert "claim 9" in str(info.value) and "claim 8" not in str(info.value)  # the row at fault


def test_a_lone_surrogate_escape_never_fails_the_read() -> None:
    """SQL Server's ISJSON accepts the escape \\ud800 alone (PostgreSQL's claim dead-letters it):
    read as U+FFFD, as a UTF-8 decoder reads what it cannot, not a failure of every read."""
    got = rows_batch("q", [row(1, '{"NServiceBus.MessageId":"m","a\\udc00":"x\\ud800y"}')]).to_pylist()
    assert dict(got[0]["headers"]) == {"NServiceBus.MessageId": "m", "a\ufffd": "x\ufffdy"}
