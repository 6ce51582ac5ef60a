"""platform_columns(df): ServiceControl's view of audit copies and failed messages, from headers
written as NServiceBus writes them. Expected values are computed here in plain Python (datetime
arithmetic, hashlib + uuid for the Guid), never by the code under test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from platform_data import audit_copy, dotnet_guid, failure_copy, sent, wire

from backends import Backend
from spark_qtransport import SchemaError, platform_columns

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
T0 = datetime(2025, 11, 28, 23, 59, 58, 653833, tzinfo=timezone.utc)  # near midnight: a date in the wrong zone shows

#: the timestamp columns, read back as microseconds since the epoch (no time zone involved)
TIMES = ("time_sent", "processing_started", "processing_ended", "time_of_failure")
OTHERS = ("message_id", "message_type", "processing_time", "critical_time", "delivery_time", "originating_endpoint",
          "processing_endpoint", "message_intent", "retries", "failed_q", "exception_type", "exception_message",
          "unique_message_id")


@contextlib.contextmanager
def session_conf(spark: Any, **conf: str) -> Iterator[None]:
    """Set session settings for a block, then put the old values back."""
    old = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def micros(moment: datetime | None) -> int | None:
    return None if moment is None else (moment - EPOCH) // timedelta(microseconds=1)


def parse(text: str | None) -> datetime | None:
    """NServiceBus's wire format, as .NET's ParseExact reads it (anything else: None)."""
    if text is None or len(text) != 28:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S:%f Z").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def seconds(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else (b - a).total_seconds()


def expected(h: dict[str, str]) -> dict[str, Any]:
    """What ServiceControl makes of a message with headers `h` (docs/platform.md, "Platform columns")."""
    time_sent, started, ended = parse(h.get("NServiceBus.TimeSent")), parse(h.get("NServiceBus.ProcessingStarted")), \
        parse(h.get("NServiceBus.ProcessingEnded"))
    start = parse(h["NServiceBus.DeliverAt"]) if "NServiceBus.DeliverAt" in h else time_sent
    failed_q = h.get("NServiceBus.FailedQ")
    endpoint = h.get("NServiceBus.ProcessingEndpoint") or (failed_q.split("@")[0] if failed_q is not None else None)
    id_endpoint = h.get("NServiceBus.ProcessingEndpoint")
    for fallback in (failed_q, h.get("NServiceBus.ReplyToAddress")):
        if id_endpoint is None and fallback is not None:
            id_endpoint = fallback.split("@")[0]
    retries = h.get("NServiceBus.Retries")
    try:
        retries_n: int | None = int(retries.strip()) if retries is not None and "." not in retries else None
    except ValueError:
        retries_n = None
    if retries_n is not None and not 0 <= retries_n < 2**31:
        retries_n = None
    types = h.get("NServiceBus.EnclosedMessageTypes")
    unique = h.get("ServiceControl.Retry.UniqueMessageId")
    if unique is None and id_endpoint is not None:
        unique = dotnet_guid(h.get("NServiceBus.MessageId", "") + id_endpoint)
    return {
        "message_id": h.get("NServiceBus.MessageId"),
        "message_type": None if types is None else types.split(";")[0].split(",")[0],
        "time_sent": micros(time_sent), "processing_started": micros(started), "processing_ended": micros(ended),
        "processing_time": seconds(started, ended), "critical_time": seconds(start, ended),
        "delivery_time": seconds(start, started),
        "originating_endpoint": h.get("NServiceBus.OriginatingEndpoint"),
        "processing_endpoint": endpoint,
        "message_intent": h.get("NServiceBus.MessageIntent"),
        "retries": retries_n,
        "failed_q": failed_q,
        "exception_type": h.get("NServiceBus.ExceptionInfo.ExceptionType"),
        "exception_message": h.get("NServiceBus.ExceptionInfo.Message"),
        "time_of_failure": micros(parse(h.get("NServiceBus.TimeOfFailure"))),
        "unique_message_id": unique,
    }


def observed(df: Any) -> Any:
    """platform_columns of `df`, timestamps as epoch microseconds, keyed by the MessageId header."""
    from pyspark.sql import functions as F

    out = platform_columns(df)
    return out.select(F.col("headers").getItem("NServiceBus.MessageId").alias("key"),
                      *(F.unix_micros(c).alias(c) for c in TIMES), *OTHERS)


def platform_traffic(ack_queue: str) -> list[dict[str, str]]:
    """Audit copies and failed messages as endpoints write them (a ServicePulse retry
    acknowledged to `ack_queue`)."""
    def at(s: float) -> datetime:
        return T0 + timedelta(seconds=s)

    place = sent("Shop.Messages.PlaceOrder", "Shop.Web", "Send", at(0), "audit-plain")
    deferred = sent("Shop.Messages.Remind", "Sales", "Send", at(0), "audit-deferred",
                    **{"NServiceBus.DeliverAt": wire(at(600))})
    retried = sent("Shop.Events.OrderPlaced", "Sales", "Publish", at(1), "audit-retried",
                   **{"NServiceBus.Retries": "2", "NServiceBus.Retries.Timestamp": wire(at(21))})
    from_pulse = sent("Shop.Messages.ChargeCard", "Billing", "Send", at(2), "audit-pulse",
                      **{"ServiceControl.Retry.UniqueMessageId": "0d5d3f5e-1c4b-4f0e-9b39-4a3bc2b4e7a1",
                         "ServiceControl.Retry.AcknowledgementQueue": ack_queue})
    failing = sent("Shop.Messages.ShipOrder", "Shipping", "Send", at(3), "failed-plain",
                   **{"NServiceBus.Retries": "3"})
    failing_deferred = sent("Shop.Messages.ShipOrder", "Shipping", "Send", at(3), "failed-deferred",
                            **{"NServiceBus.DeliverAt": wire(at(63))})
    return [
        audit_copy(place, "Sales", at(0.25), at(0.375)),
        audit_copy(deferred, "Sales", at(600.5), at(601.000001)),
        audit_copy(retried, "Billing", at(41.5), at(41.6)),
        audit_copy(from_pulse, "Payments", at(3), at(4), **{"ServiceControl.Retry.AcknowledgementSent": "true"}),
        failure_copy(failing, "Warehouse", at(95), "System.TimeoutException", "The operation has timed out."),
        failure_copy(failing_deferred, "Warehouse", at(70), "System.InvalidOperationException",
                     "Größe ist ungültig: ≠ 0", failed_q="Warehouse@[dbo]@[shop]"),
    ]


def test_platform_columns_of_a_stream_of_audit_copies_and_failures(spark: Any, pg: Backend, names: Any,
                                                                    checkpoint: str) -> None:
    """Sent to a queue, read with format("sqlqueue") in AvailableNow, under a session time zone
    far from UTC (and TIMESTAMP_NTZ as the default timestamp type): the columns are ServiceControl's."""
    queue, error = pg.create_queue(names("audit")), pg.create_queue(names("error"))
    traffic = platform_traffic(ack_queue=error)
    pg.send_many(queue, [(h, b"{}") for h in traffic])
    got: list[Any] = []
    with session_conf(spark, **{"spark.sql.session.timeZone": "Pacific/Kiritimati",
                                "spark.sql.timestampType": "TIMESTAMP_NTZ"}):
        df = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", queue)
              .option("errorQueue", error).option("retryAcknowledgements", "false").load())
        out = platform_columns(df)
        assert {f.name: f.dataType.simpleString() for f in out.schema.fields if f.name in TIMES} == \
            dict.fromkeys(TIMES, "timestamp")
        q = (observed(df).writeStream.foreachBatch(lambda b, _: got.extend(b.collect()))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None, q.exception()
    rows = {r.key: r.asDict() for r in got}
    assert sorted(rows) == sorted(h["NServiceBus.MessageId"] for h in traffic)
    for h in traffic:
        want = expected(h)
        assert {k: rows[h["NServiceBus.MessageId"]][k] for k in want} == want, h["NServiceBus.MessageId"]
    # a few values worked out by hand, as a check on `expected` itself
    plain, deferred = rows["audit-plain"], rows["audit-deferred"]
    assert (plain["processing_time"], plain["critical_time"], plain["delivery_time"]) == (0.125, 0.375, 0.25)
    assert (deferred["delivery_time"], deferred["critical_time"]) == (0.5, 1.000001)  # from DeliverAt, not TimeSent
    assert plain["time_sent"] == 1764374398653833 and plain["message_type"] == "Shop.Messages.PlaceOrder"
    assert rows["audit-retried"]["retries"] == 2 and rows["failed-plain"]["retries"] is None  # removed on failure
    assert rows["audit-pulse"]["unique_message_id"] == "0d5d3f5e-1c4b-4f0e-9b39-4a3bc2b4e7a1"
    assert rows["failed-deferred"]["processing_endpoint"] == "Warehouse"  # FailedQ without @schema@catalog
    assert rows["failed-deferred"]["exception_message"] == "Größe ist ungültig: ≠ 0"
    # retryAcknowledgements=false: the audited retry was acknowledged by its endpoint, not again here
    assert pg.count(error) == 0 and pg.count(queue) == 0


def test_unique_message_id_is_servicecontrols_deterministic_guid(spark: Any) -> None:
    """MD5("message-1" + "Sales") = 1439a840c6aa509be50128b75a684b92 (md5sum); .NET's
    new Guid(bytes) turns the first three groups (4, 2, 2 bytes) around."""
    df = spark.createDataFrame([({"NServiceBus.MessageId": "message-1", "NServiceBus.ProcessingEndpoint": "Sales"},)],
                               "headers map<string,string>")
    assert platform_columns(df).first().unique_message_id == "40a83914-aac6-9b50-e501-28b75a684b92"


def edge(mid: str, **headers: str) -> dict[str, str]:
    return {"NServiceBus.MessageId": mid, **headers}


EDGES = [
    # times in any other shape than NServiceBus's are NULL, never an error (ANSI mode is on)
    edge("dot-fraction", **{"NServiceBus.TimeSent": "2025-11-28 00:05:18.653833 Z"}),
    edge("iso", **{"NServiceBus.TimeSent": "2025-11-28T00:05:18Z"}),
    edge("five-digits", **{"NServiceBus.TimeSent": "2025-11-28 00:05:18:65383 Z"}),
    edge("month-13", **{"NServiceBus.TimeSent": "2025-13-28 00:05:18:653833 Z"}),
    edge("feb-30", **{"NServiceBus.TimeOfFailure": "2025-02-30 00:05:18:653833 Z"}),
    edge("second-60", **{"NServiceBus.ProcessingEnded": "2025-11-28 00:05:60:000000 Z"}),
    edge("empty-time", **{"NServiceBus.ProcessingStarted": ""}),
    edge("extremes", **{"NServiceBus.TimeSent": "0001-01-01 00:00:00:000000 Z",
                        "NServiceBus.ProcessingEnded": "9999-12-31 23:59:59:999999 Z"}),
    # a malformed DeliverAt is the start all the same (ServiceControl does not fall back to TimeSent)
    edge("bad-deliver-at", **{"NServiceBus.TimeSent": wire(T0), "NServiceBus.DeliverAt": "tomorrow",
                              "NServiceBus.ProcessingStarted": wire(T0), "NServiceBus.ProcessingEnded": wire(T0)}),
    # ended before started: negative durations, as the clocks say
    edge("clock-skew", **{"NServiceBus.TimeSent": wire(T0), "NServiceBus.ProcessingStarted": wire(T0 - timedelta(seconds=2)),
                          "NServiceBus.ProcessingEnded": wire(T0 - timedelta(seconds=1))}),
    # NServiceBus.Retries as .NET's int.TryParse reads it; a negative count is NULL
    edge("retries-spaces", **{"NServiceBus.Retries": " 3 "}),
    edge("retries-plus", **{"NServiceBus.Retries": "+2"}),
    edge("retries-negative", **{"NServiceBus.Retries": "-1"}),
    edge("retries-decimal", **{"NServiceBus.Retries": "3.0"}),
    edge("retries-huge", **{"NServiceBus.Retries": "99999999999"}),
    edge("retries-text", **{"NServiceBus.Retries": "three"}),
    # the endpoint of the unique id: ProcessingEndpoint, else FailedQ's queue, else ReplyToAddress's
    edge("by-failed-q", **{"NServiceBus.FailedQ": "Sales@[dbo]@[shop]"}),
    edge("by-reply-to", **{"NServiceBus.ReplyToAddress": "Web@[dbo]"}),
    edge("no-endpoint"),
    edge("non-ascii-ü", **{"NServiceBus.ProcessingEndpoint": "Verkäufe"}),
    edge("empty-endpoint", **{"NServiceBus.ProcessingEndpoint": "", "NServiceBus.FailedQ": "Sales"}),
    # message types: the first one, without its assembly
    edge("types-list", **{"NServiceBus.EnclosedMessageTypes": "Shop.A, Shop, Version=1.0.0.0;Shop.IA, Shop"}),
    edge("types-bare", **{"NServiceBus.EnclosedMessageTypes": "Shop.A;Shop.B"}),
    edge("types-nested", **{"NServiceBus.EnclosedMessageTypes": "Shop.Outer+Inner, Shop"}),
]


def test_edge_cases_give_null_or_servicecontrols_value_never_an_error(spark: Any) -> None:
    with session_conf(spark, **{"spark.sql.session.timeZone": "America/St_Johns", "spark.sql.ansi.enabled": "true"}):
        df = spark.createDataFrame([(h,) for h in EDGES], "headers map<string,string>")
        rows = {r.key: r.asDict() for r in observed(df).collect()}
    for h in EDGES:
        want = expected(h)
        assert {k: rows[h["NServiceBus.MessageId"]][k] for k in want} == want, h
    assert rows["extremes"]["time_sent"] == micros(datetime(1, 1, 1, tzinfo=timezone.utc))
    assert rows["bad-deliver-at"]["critical_time"] is None and rows["bad-deliver-at"]["processing_time"] == 0.0
    assert rows["clock-skew"]["processing_time"] == 1.0 and rows["clock-skew"]["delivery_time"] == -2.0
    assert [rows[k]["retries"] for k in ("retries-spaces", "retries-plus", "retries-negative", "retries-decimal",
                                         "retries-huge", "retries-text")] == [3, 2, None, None, None, None]
    assert rows["by-failed-q"]["unique_message_id"] == dotnet_guid("by-failed-qSales")
    assert rows["by-failed-q"]["processing_endpoint"] == "Sales"
    assert rows["by-reply-to"]["unique_message_id"] == dotnet_guid("by-reply-toWeb")
    assert rows["by-reply-to"]["processing_endpoint"] is None
    assert rows["no-endpoint"]["unique_message_id"] is None
    assert rows["empty-endpoint"]["processing_endpoint"] == "Sales"
    assert rows["empty-endpoint"]["unique_message_id"] == dotnet_guid("empty-endpoint")  # "" is an endpoint to it
    assert [rows[k]["message_type"] for k in ("types-list", "types-bare", "types-nested")] == \
        ["Shop.A", "Shop.A", "Shop.Outer+Inner"]


def test_message_id_is_kept_or_taken_from_the_header(spark: Any) -> None:
    with_id = spark.createDataFrame([("native-1", {"NServiceBus.MessageId": "m-1"})],
                                    "message_id string, headers map<string,string>")
    without = spark.createDataFrame([({"NServiceBus.MessageId": "m-2"},), ({},)], "headers map<string,string>")
    assert platform_columns(with_id).first().message_id == "native-1"
    assert [r.message_id for r in platform_columns(without).collect()] == ["m-2", None]
    assert list(platform_columns(without).columns) == ["headers", *[c for c in platform_columns(with_id).columns
                                                                     if c != "headers"]]


def test_a_dataframe_without_a_headers_map_is_refused_naming_the_column(spark: Any) -> None:
    for schema in ("body binary", "headers string"):
        df = spark.createDataFrame([], schema)
        with pytest.raises(SchemaError, match="headers") as caught:
            platform_columns(df)
        assert caught.value.column == "headers"
