"""The stream's columns as Spark sees them (`SCHEMA`). The columns are `ReceivedMessage`'s fields, in
order; `COLUMNS` gives each its Spark type and nullability. Reads yield Arrow record batches of
`transport.receiving.decode.ARROW_SCHEMA`, which is `SCHEMA`'s Arrow form (checked at import).
"""

from __future__ import annotations

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..transport.receiving.decode import ARROW_SCHEMA, ReceivedMessage

__all__ = ["SCHEMA", "COLUMNS", "ARROW_SCHEMA", "ARROW_READS"]

_TEXT, _TIME, _LONG = StringType(), TimestampType(), LongType()

#: column -> (Spark type, nullable)
COLUMNS: dict[str, tuple[DataType, bool]] = {
    "message_id": (_TEXT, False),
    "native_id": (_TEXT, False),
    "headers": (MapType(StringType(), StringType(), True), False),
    "body": (BinaryType(), True),
    "expires": (_TIME, True),
    "message_type": (_TEXT, True),
    "correlation_id": (_TEXT, True),
    "conversation_id": (_TEXT, True),
    "reply_to": (_TEXT, True),
    "intent": (_TEXT, True),
    "time_sent": (_TIME, True),
    "queue": (_TEXT, False),
    "claim_seq": (_LONG, False),
    "source_seq": (_LONG, False),
    "claimed_at": (_TIME, False),
}
if tuple(COLUMNS) != ReceivedMessage._fields:  # pragma: no cover - a change to one without the other
    raise AssertionError(f"COLUMNS {tuple(COLUMNS)} differ from ReceivedMessage {ReceivedMessage._fields}")

SCHEMA = StructType([StructField(name, typ, nullable) for name, (typ, nullable) in COLUMNS.items()])

try:  # pyspark >= 4.2 says which Arrow schema it expects from read(); 4.0/4.1 take plain rows
    _SPARK_ARROW = to_arrow_schema(SCHEMA, timezone="UTC")
except TypeError:  # pragma: no cover - Spark 4.0/4.1
    _SPARK_ARROW = None

#: whether read() yields Arrow record batches (else plain rows, which Spark converts)
ARROW_READS = _SPARK_ARROW is not None
if _SPARK_ARROW is not None and not _SPARK_ARROW.equals(ARROW_SCHEMA):  # pragma: no cover - as above
    raise AssertionError(f"ARROW_SCHEMA {ARROW_SCHEMA} is not SCHEMA's Arrow form {_SPARK_ARROW}")
