"""Output rows -> Arrow record batches, column by column (much faster than Spark's per-row conversion)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

__all__ = ["rows_to_batch"]

_UTC = pa.timestamp("us", tz="UTC")
# Arrow type of each output column but `headers` (a map, built from its keys and values below),
# in `spark_qtransport.spark.reader.SCHEMA` order.
_TYPES = [pa.string(), pa.string(), None, pa.binary(), _UTC, pa.string(), pa.string(), pa.string(),
          pa.string(), pa.string(), _UTC, pa.string(), pa.int64(), pa.int64(), _UTC]
_HEADERS = 2
_BODY = 3


def _one_body(body: bytes) -> pa.Array:
    """A binary array of one value that uses the value's memory: a large body alone in its batch
    (reads fetch large rows one at a time) is not copied."""
    offsets = pa.array([0, len(body)], pa.int32()).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(body)])


def rows_to_batch(rows: Sequence[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    """One record batch of the source's output schema from output tuples (`queues.receive.output_row`)."""
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
