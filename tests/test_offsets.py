"""Offsets are what checkpoints keep: every shape we ever wrote must still be read, by the stream
that wrote it. Every stream is a `QueueSet`; a one-queue stream's checkpoint keeps the plain
`ClaimOffset` form (unit: a QueueSet connects only when it plans)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_qtransport.dialects import NUMBER_BASE
from spark_qtransport.errors import OffsetError
from spark_qtransport.options.parse import ReaderOptions
from spark_qtransport.transport.receiving.queueset import QueueSet
from spark_qtransport.transport.receiving.receiver import ClaimOffset

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "offsets.json").read_text())
SHAPES = [k for k in FIXTURES if k != "comment"]
URL = "postgresql://u@127.0.0.1:1/db"


def _stream(queues: str) -> QueueSet:
    return QueueSet(ReaderOptions.stream({"url": URL, "queue": queues, "errorQueue": "error"}))


def _stream_of(shape: str) -> QueueSet:
    return _stream("Orders_eu,Orders_us" if shape.startswith("several") else "Sales")


def _position(v: object) -> tuple[int, str]:
    """A several-queue offset's position in either form: ``{"claim", "claimTable"}`` or a pair."""
    return (v["claim"], v["claimTable"]) if isinstance(v, dict) else (v[0], v[1])  # type: ignore[index,return-value]


#: the newest shape of each kind: what a stream writes now
NEWEST = {"one queue": "one queue", "several": "several queues, positions as pairs"}


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shipped_offset_shape_reads_and_is_written_back_in_the_newest_form(shape: str) -> None:
    written = FIXTURES[shape]
    stream = _stream_of(shape)
    offset = stream.offset(written)
    positions = {k: (c.claim, c.table) for k, c in offset.queues.items()}
    if "queues" in written:
        assert positions == {k: _position(v) for k, v in written["queues"].items()}
        newest = {"queues": {k: list(_position(v)) for k, v in written["queues"].items()}}
    else:
        assert positions == {'"public"."Sales"': (written["claim"], written["claimTable"])}
        newest = {k: v for k, v in written.items() if k != "run"}
    # written in the newest form, Spark 4.0/4.1's run tag left to the reader that adds it
    assert stream.encode(offset) == newest
    assert stream.offset(json.loads(json.dumps(stream.encode(offset)))) == offset


def test_the_newest_shapes_are_written_back_as_they_were() -> None:
    for kind, shape in NEWEST.items():
        stream = _stream_of(shape)
        assert stream.encode(stream.offset(FIXTURES[shape])) == FIXTURES[shape], kind


def test_an_offset_over_a_thousand_queues_fits_in_one_spark_buffer() -> None:
    """Spark passes a stream's offset between the JVM and the source's process at every trigger
    through a 64 KB buffer; over TCP a larger message can wait 40 ms for a delayed acknowledgement
    (`QueueSetOffset`). The offset over 1,000 tenant queues (about 60 KB) stays inside it."""
    from spark_qtransport.transport.receiving.queueset import QueueSetOffset

    # prepared claims' numbers (2**62 and up: 19 digits), claim tables' ids of 7 digits
    offset = QueueSetOffset({f'"tenant_{i:04d}"."audit"': ClaimOffset(NUMBER_BASE + i, "1234567")
                             for i in range(1000)})
    size = len(json.dumps(offset.to_dict()).encode())  # as Spark's runner serialises it
    assert size < 64_000, size  # with the call's other fields (its id, the read limit) in one buffer
    assert QueueSetOffset.from_dict(json.loads(json.dumps(offset.to_dict()))) == offset


@pytest.mark.parametrize("bad", [[1], [True, "1"], ["1", "1"], [1, 2], [1, "1", 2], 5, {"claim": 1}, None])
def test_a_several_queue_offset_with_a_foreign_position_names_the_queue(bad: object) -> None:
    with pytest.raises(OffsetError, match=r'queue "public"."Orders_eu" in offset: .* is not a position; expected'):
        _stream("Orders_eu,Orders_us").offset({"queues": {'"public"."Orders_eu"': bad}})


def test_the_one_queue_form_is_the_claim_offset() -> None:
    newest = [k for k in SHAPES if not k.startswith("several")][0]
    assert set(ClaimOffset(1, "x").to_dict()) == set(FIXTURES[newest])
    stream = _stream("Sales")
    assert stream.encode(stream.offset(FIXTURES[newest])) == ClaimOffset.from_dict(FIXTURES[newest]).to_dict()


@pytest.mark.parametrize("shape", SHAPES)
def test_a_checkpoint_cannot_switch_between_one_queue_and_several(shape: str) -> None:
    other = _stream("Sales" if shape.startswith("several") else "Orders_eu,Orders_us")
    with pytest.raises(OffsetError, match="start this stream from a new checkpoint"):
        other.offset(FIXTURES[shape])


@pytest.mark.parametrize("bad", [{}, {"claim": "x", "claimTable": "1"}, {"claimTable": "1"}, [1], None])
def test_a_foreign_offset_is_a_clear_error(bad: object) -> None:
    with pytest.raises(OffsetError, match='expected e.g. {"claim": 42, "claimTable": "16384"}'):
        ClaimOffset.from_dict(bad)
    with pytest.raises(OffsetError, match='expected e.g. {"claim": 42, "claimTable": "16384"}'):
        _stream("Sales").offset(bad)
