"""The Particular platform's view of a message: typed columns from its NServiceBus headers, as
ServiceControl derives them, for audit copies and failed messages read with ``format("sqlqueue")``::

    from spark_qtransport import platform_columns
    audit = platform_columns(spark.readStream.format("sqlqueue").option("queue", "audit").load())

Column expressions only (no Python UDF): the work stays in the JVM. Header times are NServiceBus's
UTC wire format (``2025-11-28 00:05:18:653833 Z``), read the same under any
``spark.sql.session.timeZone``; a header that is missing or not in its format gives NULL in its
column, never an error.
"""

from __future__ import annotations

from typing import Any

from ..errors import SchemaError
from ..wire import H

__all__ = ["PLATFORM_COLUMNS", "platform_columns", "utc_date", "wire_time"]

#: the columns `platform_columns` adds (or replaces), in order
PLATFORM_COLUMNS = (
    "message_id", "message_type",
    "time_sent", "processing_started", "processing_ended", "processing_time", "critical_time", "delivery_time",
    "originating_endpoint", "processing_endpoint", "message_intent", "retries", "failed_q",
    "exception_type", "exception_message", "time_of_failure", "unique_message_id",
)

#: NServiceBus's DateTimeOffsetHelper format, exactly (it parses with ParseExact): 28 characters
_WIRE_TIME = r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:[0-5]\d:\d{6} Z$"
#: a whole number as .NET's int.TryParse reads it (surrounding white space, a sign)
_WHOLE = r"^\s*[+-]?\d+\s*$"


def _header(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("headers").getItem(name)


def wire_time(text: Any) -> Any:
    """A timestamp column from NServiceBus's UTC wire format (``yyyy-MM-dd HH:mm:ss:ffffff Z``);
    NULL for any other text or an impossible date. Built from the parts with the zone named, so the
    session's time zone and ``spark.sql.timestampType`` do not change the instant or the type."""
    from pyspark.sql import functions as F

    def part(start: int, length: int) -> Any:
        return F.substring(text, start, length).cast("int")

    seconds = F.concat(F.substring(text, 18, 2), F.lit("."), F.substring(text, 21, 6)).cast("decimal(8,6)")
    moment = F.try_make_timestamp_ltz(part(1, 4), part(6, 2), part(9, 2), part(12, 2), part(15, 2), seconds,
                                      F.lit("UTC"))
    return F.when(text.rlike(_WIRE_TIME), moment)


def utc_date(moment: Any) -> Any:
    """The UTC calendar date of a timestamp column, whatever the session's time zone."""
    from pyspark.sql import functions as F

    return F.date_from_unix_date(F.floor(F.unix_micros(moment) / F.lit(86_400_000_000)).cast("int"))


def _seconds(start: Any, end: Any) -> Any:
    """``end - start`` in seconds (double, microsecond precision); NULL if either is NULL."""
    from pyspark.sql import functions as F

    return (F.unix_micros(end) - F.unix_micros(start)) / F.lit(1_000_000.0)


def _queue_part(address: Any) -> Any:
    """An address without its ``@schema@catalog`` part (ServiceControl's ExtractQueue)."""
    from pyspark.sql import functions as F

    return F.substring_index(address, "@", 1)


def _dotnet_guid(md5_hex: Any) -> Any:
    """A .NET ``new Guid(bytes)`` of the 16 bytes `md5_hex` spells, in the Guid's "D" format: the
    first 4 bytes, then 2 and 2, little-endian; the last 8 as they are."""
    from pyspark.sql import functions as F

    def byte(i: int) -> Any:
        return F.substring(md5_hex, 2 * i + 1, 2)

    def group(*indexes: int) -> Any:
        return F.concat(*(byte(i) for i in indexes))

    guid = F.concat_ws("-", group(3, 2, 1, 0), group(5, 4), group(7, 6), group(8, 9), group(*range(10, 16)))
    return F.when(md5_hex.isNotNull(), guid)


def platform_columns(df: Any) -> Any:
    """`df` with the platform's columns added from its ``headers`` column (`map<string,string>`, as
    ``format("sqlqueue")`` reads it); each column is described in docs/platform.md ("Platform columns").

    - ``message_id``: kept if `df` has it (the stream's: the MessageId header, else the row's
      native id), else the ``NServiceBus.MessageId`` header;
    - ``message_type`` (replaced: the stream's is the whole header): ServiceControl's, the first
      type of ``NServiceBus.EnclosedMessageTypes`` without its assembly (text from the first comma);
    - the times (timestamps) and durations (double, seconds) ServiceControl computes: start =
      ``NServiceBus.DeliverAt`` if the message has it, else ``NServiceBus.TimeSent``;
      ``processing_time`` = ended - started, ``critical_time`` = ended - start, ``delivery_time`` =
      started - start; NULL when a time they need is missing (ServiceControl shows zero);
    - ``unique_message_id``: ``ServiceControl.Retry.UniqueMessageId`` if present, else
      ServiceControl's DeterministicGuid of MessageId + processing endpoint (MD5 of the UTF-8 text
      read as a .NET Guid), the endpoint being ProcessingEndpoint, else FailedQ's queue, else
      ReplyToAddress's queue (ServiceControl's ProcessingEndpointName); NULL when none is there.

    Raises `SchemaError` (column ``headers``) when `df` has no `map<string,string>` ``headers``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType, StringType

    field = next((f for f in df.schema.fields if f.name == "headers"), None)
    typ = None if field is None else field.dataType
    if field is None or not (isinstance(typ, MapType) and typ.keyType == StringType() and typ.valueType == StringType()):
        found = "no such column" if field is None else f"it is {field.dataType.simpleString()}"
        raise SchemaError("platform_columns needs a column 'headers' of type map<string,string>, as "
                          f"format('sqlqueue') reads it: {found}", column="headers")

    h = _header
    time_sent = wire_time(h(H.TIME_SENT))
    started, ended = wire_time(h(H.PROCESSING_STARTED)), wire_time(h(H.PROCESSING_ENDED))
    # ServiceControl's ProcessingStatisticsEnricher: DeliverAt, when the message has it, else TimeSent
    start = F.when(h(H.DELIVER_AT).isNotNull(), wire_time(h(H.DELIVER_AT))).otherwise(time_sent)
    retries = F.trim(h(H.RETRIES)).try_cast("int")
    processing_endpoint = F.coalesce(F.when(h(H.PROCESSING_ENDPOINT) != "", h(H.PROCESSING_ENDPOINT)),
                                     _queue_part(h(H.FAILED_Q)))
    # HeaderExtensions.UniqueId: MessageId ("" if absent) + ProcessingEndpointName
    id_endpoint = F.coalesce(h(H.PROCESSING_ENDPOINT), _queue_part(h(H.FAILED_Q)),
                             _queue_part(h(H.REPLY_TO_ADDRESS)))
    deterministic = _dotnet_guid(F.md5(F.concat(F.coalesce(h(H.MESSAGE_ID), F.lit("")), id_endpoint).cast("binary")))
    columns = {
        "message_id": F.col("message_id") if "message_id" in df.columns else h(H.MESSAGE_ID),
        "message_type": F.substring_index(F.substring_index(h(H.ENCLOSED_MESSAGE_TYPES), ";", 1), ",", 1),
        "time_sent": time_sent,
        "processing_started": started,
        "processing_ended": ended,
        "processing_time": _seconds(started, ended),
        "critical_time": _seconds(start, ended),
        "delivery_time": _seconds(start, started),
        "originating_endpoint": h(H.ORIGINATING_ENDPOINT),
        "processing_endpoint": processing_endpoint,
        "message_intent": h(H.MESSAGE_INTENT),
        "retries": F.when(h(H.RETRIES).rlike(_WHOLE) & (retries >= 0), retries),
        "failed_q": h(H.FAILED_Q),
        "exception_type": h(H.EXCEPTION_TYPE),
        "exception_message": h(H.EXCEPTION_MESSAGE),
        "time_of_failure": wire_time(h(H.TIME_OF_FAILURE)),
        "unique_message_id": F.coalesce(h(H.RETRY_UNIQUE_MESSAGE_ID), deterministic),
    }
    return df.withColumns(columns)
