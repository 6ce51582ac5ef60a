"""Offsets are what checkpoints keep: every shape we ever wrote must still be read, by the stream
that wrote it. Every stream is a `QueueSet`; a one-queue stream's checkpoint keeps the plain
`ClaimOffset` form (unit: a QueueSet connects only when it plans)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shipped_offset_shape_reads_and_is_written_back_as_it_was(shape: str) -> None:
    written = FIXTURES[shape]
    stream = _stream_of(shape)
    offset = stream.offset(written)
    claims = {k: c.claim for k, c in offset.queues.items()}
    if "queues" in written:
        assert claims == {k: v["claim"] for k, v in written["queues"].items()}
    else:
        assert claims == {'"public"."Sales"': written["claim"]}
    # written back in the same form, Spark 4.0/4.1's run tag left to the reader that adds it
    assert stream.encode(offset) == {k: v for k, v in written.items() if k != "run"}
    assert stream.offset(json.loads(json.dumps(stream.encode(offset)))) == offset


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
