"""NServiceBus wire format helpers: the headers column and TimeSent timestamps."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from spark_qtransport.wire import decode_headers, encode_headers, format_time, parse_time


class TestHeaders:
    def test_encode_escapes_slash_and_keeps_non_ascii(self) -> None:
        text = encode_headers({"NServiceBus.ContentType": "application/json", "Ünï": "😀"})
        assert text == r'{"NServiceBus.ContentType":"application\/json","Ünï":"😀"}'
        assert json.loads(text) == {"NServiceBus.ContentType": "application/json", "Ünï": "😀"}

    def test_round_trip_with_nulls_and_quotes(self) -> None:
        h = {"a": None, "b": 'say "hi"\\n', "c/d": "e/f"}
        assert decode_headers(encode_headers(h)) == h

    @pytest.mark.parametrize(
        "text", ["<corrupted headers", "[1]", '{"a": {"b": "c"}}', '{"a": 1}', '"x"', "", "null", '{"a": [1]}']
    )
    def test_poison_is_none(self, text: str) -> None:
        # the same rule the claim transaction applies in SQL
        assert decode_headers(text) is None

    def test_none_is_none(self) -> None:
        assert decode_headers(None) is None


class TestTime:
    def test_format_is_nservicebus_wire_format(self) -> None:
        moment = datetime(2025, 11, 28, 0, 5, 18, 653833, tzinfo=timezone.utc)
        assert format_time(moment) == "2025-11-28 00:05:18:653833 Z"

    def test_parse_round_trip(self) -> None:
        moment = datetime(2025, 11, 28, 0, 5, 18, 653833, tzinfo=timezone.utc)
        assert parse_time(format_time(moment)) == moment

    def test_naive_is_utc(self) -> None:
        assert format_time(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02 03:04:05:000000 Z"

    @pytest.mark.parametrize("text", [None, "", "yesterday", "2025-11-28T00:05:18Z", "2025-13-28 00:05:18:653833 Z"])
    def test_other_text_is_none(self, text: str | None) -> None:
        assert parse_time(text) is None
