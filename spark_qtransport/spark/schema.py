"""The stream's columns, once: their Spark types (`SCHEMA`), their Arrow types, and output rows ->
Arrow record batches, column by column (much faster than Spark's per-row conversion).

The columns are `ReceivedMessage`'s fields, in order; `COLUMNS` gives each its types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
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

from ..transport.receiving.slices import ReceivedMessage

__all__ = ["SCHEMA", "COLUMNS", "rows_to_batch"]

_UTC = pa.timestamp("us", tz="UTC")
_TEXT = (StringType(), pa.string())
_TIME = (TimestampType(), _UTC)
_LONG = (LongType(), pa.int64())

#: column -> (Spark type, nullable, Arrow type); `headers` is a map built from its keys and values
COLUMNS: dict[str, tuple[DataType, bool, Any]] = {
    "message_id": (_TEXT[0], False, _TEXT[1]),
    "native_id": (_TEXT[0], False, _TEXT[1]),
    "headers": (MapType(StringType(), StringType(), True), False, None),
    "body": (BinaryType(), True, pa.binary()),
    "expires": (_TIME[0], True, _TIME[1]),
    "message_type": (_TEXT[0], True, _TEXT[1]),
    "correlation_id": (_TEXT[0], True, _TEXT[1]),
    "conversation_id": (_TEXT[0], True, _TEXT[1]),
    "reply_to": (_TEXT[0], True, _TEXT[1]),
    "intent": (_TEXT[0], True, _TEXT[1]),
    "time_sent": (_TIME[0], True, _TIME[1]),
    "queue": (_TEXT[0], False, _TEXT[1]),
    "claim_seq": (_LONG[0], False, _LONG[1]),
    "source_seq": (_LONG[0], False, _LONG[1]),
    "claimed_at": (_TIME[0], False, _TIME[1]),
}
if tuple(COLUMNS) != ReceivedMessage._fields:  # pragma: no cover - a change to one without the other
    raise AssertionError(f"COLUMNS {tuple(COLUMNS)} differ from ReceivedMessage {ReceivedMessage._fields}")

SCHEMA = StructType([StructField(name, typ, nullable) for name, (typ, nullable, _) in COLUMNS.items()])

_TYPES = [arrow for _, _, arrow in COLUMNS.values()]
_HEADERS = ReceivedMessage._fields.index("headers")
_BODY = ReceivedMessage._fields.index("body")


def _one_body(body: bytes) -> pa.Array:
    """A binary array of one value that uses the value's memory: a large body alone in its batch
    (reads fetch large rows one at a time) is not copied."""
    offsets = pa.array([0, len(body)], pa.int32()).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(body)])


def rows_to_batch(rows: Sequence[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    """One record batch of the source's output schema from received messages (`ReceivedMessage`)."""
    columns = list(zip(*rows, strict=True))
    keys: list[str] = []
    values: list[str | None] = []
    offsets = [0]
    for h in columns[_HEADERS]:
        keys.extend(h)
        values.extend(h.values())
        offsets.append(len(keys))
    arrays = [
        pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.string()),
            type=schema.field("headers").type,
        )
        if i == _HEADERS
        else _one_body(col[0]) if i == _BODY and len(col) == 1 and col[0] is not None
        else pa.array(col, typ)
        for i, (col, typ) in enumerate(zip(columns, _TYPES, strict=True))
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
