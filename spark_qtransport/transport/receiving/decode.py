"""Claimed rows -> the stream's Arrow record batches, column by column.

A slice is read a fetch at a time (`slices.read_chunks`); each fetch's raw claim rows (claim_seq,
native id, expires, headers text, body, source_seq, claimed_at) become one record batch of the
source's output schema (`ARROW_SCHEMA`, the Arrow form of `spark.schema.SCHEMA`). The only
per-row Python left is parsing the headers' JSON (orjson where installed) and reading six of their
values into lists; everything else is built as whole Arrow columns.
Headers are parsed by orjson (about four times the standard library's speed on NServiceBus headers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import QTransportError
from ...wire import H, decode_header_texts, parse_time

__all__ = ["ARROW_SCHEMA", "RAW_COLUMNS", "ReceivedMessage", "messages_batch", "rows_batch"]

_UTC = pa.timestamp("us", tz="UTC")
_HEADERS = pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string()))

class ReceivedMessage(NamedTuple):
    """One received message as the source hands it to Spark: the output row. Its fields, in this
    order, are the stream's columns (`ARROW_SCHEMA` below gives their Arrow types, `spark_qtransport.spark.schema` their Spark types)."""

    message_id: str
    native_id: str
    headers: dict[str, str | None]
    body: bytes | None
    expires: datetime | None
    message_type: str | None
    correlation_id: str | None
    conversation_id: str | None
    reply_to: str | None
    intent: str | None
    time_sent: datetime | None
    queue: str
    claim_seq: int
    source_seq: int
    claimed_at: datetime | None


#: the output columns (`ReceivedMessage`'s fields) as Spark expects them from read()
ARROW_SCHEMA = pa.schema([
    pa.field("message_id", pa.string(), nullable=False),
    pa.field("native_id", pa.string(), nullable=False),
    pa.field("headers", _HEADERS, nullable=False),
    pa.field("body", pa.binary()),
    pa.field("expires", _UTC),
    pa.field("message_type", pa.string()),
    pa.field("correlation_id", pa.string()),
    pa.field("conversation_id", pa.string()),
    pa.field("reply_to", pa.string()),
    pa.field("intent", pa.string()),
    pa.field("time_sent", _UTC),
    pa.field("queue", pa.string(), nullable=False),
    pa.field("claim_seq", pa.int64(), nullable=False),
    pa.field("source_seq", pa.int64(), nullable=False),
    pa.field("claimed_at", _UTC, nullable=False),
])

if tuple(ARROW_SCHEMA.names) != ReceivedMessage._fields:  # pragma: no cover - a change to one without the other
    raise AssertionError(f"ARROW_SCHEMA {ARROW_SCHEMA.names} differs from ReceivedMessage {ReceivedMessage._fields}")

#: a slice read's columns, in the order the dialects' `read_claims` select them
RAW_COLUMNS = ("claim_seq", "native_id", "expires", "headers", "body", "source_seq", "claimed_at")

#: output columns read from a header: column -> header name
_FROM_HEADERS = {
    "message_type": H.ENCLOSED_MESSAGE_TYPES,
    "correlation_id": H.CORRELATION_ID,
    "conversation_id": H.CONVERSATION_ID,
    "reply_to": H.REPLY_TO_ADDRESS,
    "intent": H.MESSAGE_INTENT,
}


def _loads(text: str, row: int, claim_seq: pa.Array, native_id: pa.Array) -> dict[str, Any]:
    """One row's headers, for a fetch orjson refused (the claim accepted each row's headers as a
    flat JSON object of strings, or as '', no headers): the standard library decides, and an
    error names the row."""
    if text == "":  # NServiceBus's Message: string.IsNullOrEmpty(headers) -> no headers
        return {}
    try:
        return orjson.loads(text)
    except (TypeError, ValueError):
        pass
    try:
        headers = json.loads(text)
    except (TypeError, ValueError) as exc:  # a bug, not a message fault: say which row
        raise QTransportError(
            f"claimed message {native_id[row]} (claim {claim_seq[row]}) has unreadable headers: {exc}"
        ) from exc
    if not isinstance(headers, dict):
        return headers
    return {_utf8(k): v if v is None else _utf8(v) for k, v in headers.items()}


def _utf8(text: str) -> str:
    """`text`, each lone UTF-16 surrogate (an escape such as \\ud800 alone, which SQL Server's
    ISJSON accepts, orjson refuses and the standard library reads) replaced by U+FFFD, as a UTF-8
    decoder replaces what it cannot read: Arrow strings are UTF-8, and one such header must not
    fail every read of its batch."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _headers(texts: Sequence[str], claim_seq: pa.Array, native_id: pa.Array, *,
             judge: bool = False) -> tuple[list[dict[str, Any]], pa.Array, list[int] | None]:
    """Each row's headers as a dict, all of them as one map column, and which rows those are:
    None for all of them. With `judge` (the claim did not judge headers: `ReceiveSql.poison_at_claim`)
    poison rows (`wire.decode_headers`) are left out: they go to the error queue with the batch's
    acknowledgement, never to Spark."""
    loads = orjson.loads
    try:
        dicts = [loads(text) for text in texts]
    except (TypeError, ValueError):  # rare ('' headers, poison): row by row below
        dicts = None
    if dicts is not None and (not judge or all(type(d) is dict for d in dicts)):
        try:
            return dicts, _map_column(dicts), None
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # a header value that is no string: poison
            if not judge:
                raise
    if judge:
        judged = decode_header_texts(texts)
        keep = [row for row, d in enumerate(judged) if d is not None]
        kept: list[dict[str, Any]] = [d for d in judged if d is not None]
        return kept, _map_column(kept), None if len(keep) == len(judged) else keep
    # with the standard library where orjson refuses
    dicts = [_loads(text, row, claim_seq, native_id) for row, text in enumerate(texts)]
    return dicts, _map_column(dicts), None


def _map_column(dicts: list[dict[str, Any]]) -> pa.Array:
    keys: list[str] = []
    values: list[str | None] = []
    offsets = [0]
    for d in dicts:
        keys.extend(d)
        values.extend(d.values())
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()), type=_HEADERS)


def _one_body(body: bytes) -> pa.Array:
    """A binary array of one value that uses the value's memory: a large body alone in its batch
    (reads fetch large rows one at a time) is not copied."""
    offsets = pa.array([0, len(body)], pa.int32()).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(body)])


def messages_batch(queue: str, claim_seq: pa.Array, native_id: pa.Array, expires: pa.Array, headers: Sequence[str],
                   body: pa.Array, source_seq: pa.Array, claimed_at: pa.Array, *, judge: bool = False) -> pa.RecordBatch:
    """One record batch of `ARROW_SCHEMA` from a fetch's raw columns (`RAW_COLUMNS`; `headers` as
    text). Timestamps without a zone are UTC. `message_id` is the MessageId header, or the native id
    where that is missing or empty; native ids are lower case. `judge`: leave poison rows out (see
    `_headers`)."""
    native_id = pc.utf8_lower(native_id.cast(pa.string()))
    dicts, header_map, keep = _headers(headers, claim_seq, native_id, judge=judge)
    if keep is not None:
        rows = pa.array(keep, pa.int64())
        claim_seq, native_id, expires, body, source_seq, claimed_at = (
            a.take(rows) for a in (claim_seq, native_id, expires, body, source_seq, claimed_at))
    ids = native_id.to_pylist()
    columns: dict[str, Any] = {
        "message_id": pa.array([d.get(H.MESSAGE_ID) or i for d, i in zip(dicts, ids, strict=True)], pa.string()),
        "native_id": native_id,
        "headers": header_map,
        "body": body.cast(pa.binary()),
        "expires": expires.cast(_UTC),
        **{column: pa.array([d.get(name) for d in dicts], pa.string()) for column, name in _FROM_HEADERS.items()},
        "time_sent": pa.array([parse_time(d.get(H.TIME_SENT)) for d in dicts], _UTC),
        "queue": pa.array([queue] * len(ids), pa.string()),
        "claim_seq": claim_seq.cast(pa.int64()),
        "source_seq": source_seq.cast(pa.int64()),
        "claimed_at": claimed_at.cast(_UTC),
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def rows_batch(queue: str, rows: Sequence[Sequence[Any]], *, judge: bool = False) -> pa.RecordBatch:
    """`messages_batch` of a fetch's raw rows (tuples in `RAW_COLUMNS` order), as a DB-API driver
    returns them."""
    claim_seq, native_id, expires, headers, body, source_seq, claimed_at = zip(*rows, strict=True) if rows else ((),) * 7
    return messages_batch(
        queue,
        pa.array(claim_seq, pa.int64()),
        pa.array([str(i) for i in native_id], pa.string()),
        pa.array(expires, _UTC),
        headers,
        _one_body(bytes(body[0])) if len(body) == 1 and body[0] is not None else pa.array(body, pa.binary()),
        pa.array(source_seq, pa.int64()),
        pa.array(claimed_at, _UTC),
        judge=judge,
    )
