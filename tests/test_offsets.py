"""Offsets are what checkpoints keep: every format we ever wrote must still be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_qtransport.errors import OffsetError
from spark_qtransport.transport.receiving.receiver import ClaimOffset

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "offsets.json").read_text())


@pytest.mark.parametrize("version", [k for k in FIXTURES if k != "comment"])
def test_every_shipped_offset_format_reads(version: str) -> None:
    offset = ClaimOffset.from_dict(FIXTURES[version])
    assert offset.claim == FIXTURES[version]["claim"]
    assert ClaimOffset.from_dict(json.loads(json.dumps(offset.to_dict()))) == offset


def test_current_format_is_the_newest_fixture() -> None:
    newest = [k for k in FIXTURES if k != "comment"][-1]
    assert set(ClaimOffset(1, "x").to_dict()) == set(FIXTURES[newest])


@pytest.mark.parametrize("bad", [{}, {"claim": "x", "claimTable": "1"}, {"claimTable": "1"}, [1], None])
def test_a_foreign_offset_is_a_clear_error(bad: object) -> None:
    with pytest.raises(OffsetError, match='expected e.g. {"claim": 42, "claimTable": "16384"}'):
        ClaimOffset.from_dict(bad)
