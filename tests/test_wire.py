"""NServiceBus wire format helpers: the headers column and TimeSent timestamps."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_qtransport.wire import decode_headers, encode_headers, format_time, outgoing_headers, parse_time


class TestHeaders:
    def test_encode_escapes_slash_and_keeps_non_ascii(self) -> None:
        text = encode_headers({"NServiceBus.ContentType": "application/json", "Ünï": "😀"})
        assert text == r'{"NServiceBus.ContentType":"application\/json","Ünï":"😀"}'
        assert json.loads(text) == {"NServiceBus.ContentType": "application/json", "Ünï": "😀"}

    def test_round_trip_with_nulls_and_quotes(self) -> None:
        h = {"a": None, "b": 'say "hi"\\n', "c/d": "e/f"}
        assert decode_headers(encode_headers(h)) == h

    @pytest.mark.parametrize(
        "text", ["<corrupted headers", "[1]", '{"a": {"b": "c"}}', '{"a": 1}', '"x"', " ", "\t\n", "null",
                 '{"a": [1]}']
    )
    def test_poison_is_none(self, text: str) -> None:
        # the same rule the claim transaction applies in SQL
        assert decode_headers(text) is None

    def test_empty_text_is_no_headers(self) -> None:
        # NServiceBus's Message: string.IsNullOrEmpty(headers) -> an empty header set; white space
        # alone fails its JSON parse (poison, above)
        assert decode_headers("") == {}

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


class TestOutgoingHeaders:
    NOW = datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=timezone.utc)

    def make(self, **kw: object) -> dict[str, str | None]:
        base: dict[str, object] = {"message_id": "m-1", "endpoint": "Sales", "machine": "spark-1",
                                   "message_type": "Shop.Messages.OrderAccepted, Shop.Messages", "now": self.NOW}
        base.update(kw)
        return outgoing_headers(**base)  # type: ignore[arg-type]

    def test_a_new_send_has_what_an_endpoint_needs(self) -> None:
        h = self.make(reply_to_address="Sales")
        assert h["NServiceBus.MessageId"] == "m-1"
        assert h["NServiceBus.MessageIntent"] == "Send"
        assert h["NServiceBus.EnclosedMessageTypes"] == "Shop.Messages.OrderAccepted, Shop.Messages"
        assert h["NServiceBus.ContentType"] == "application/json"
        assert h["NServiceBus.TimeSent"] == "2026-11-22 12:00:00:123456 Z"
        assert h["NServiceBus.OriginatingEndpoint"] == "Sales"
        assert h["NServiceBus.OriginatingMachine"] == "spark-1"
        assert h["NServiceBus.CorrelationId"] == "m-1"
        assert h["NServiceBus.ReplyToAddress"] == "Sales"
        assert h["NServiceBus.ConversationId"]  # a new conversation

    def test_a_reply_continues_the_conversation(self) -> None:
        incoming = {"NServiceBus.MessageId": "in-7", "NServiceBus.ConversationId": "conv-1"}
        h = self.make(intent="reply", incoming=incoming)
        assert h["NServiceBus.MessageIntent"] == "Reply"
        assert h["NServiceBus.ConversationId"] == "conv-1"
        assert h["NServiceBus.RelatedTo"] == "in-7"
        assert h["NServiceBus.CorrelationId"] == "in-7"  # no incoming CorrelationId: its MessageId

    def test_the_incoming_correlation_id_wins_over_its_message_id(self) -> None:
        incoming = {"NServiceBus.MessageId": "in-7", "NServiceBus.CorrelationId": "saga-42"}
        assert self.make(incoming=incoming)["NServiceBus.CorrelationId"] == "saga-42"
        assert self.make(incoming=incoming, correlation_id="mine")["NServiceBus.CorrelationId"] == "mine"

    def test_given_headers_win_but_not_the_message_id(self) -> None:
        h = self.make(headers={"NServiceBus.ContentType": "text/xml", "Custom": "x", "NServiceBus.MessageId": "other"})
        assert h["NServiceBus.ContentType"] == "text/xml" and h["Custom"] == "x"
        assert h["NServiceBus.MessageId"] == "m-1"

    @pytest.mark.parametrize("name", ["NServiceBus.SqlServer.ForwardDestination", "NServiceBus.ControlMessage"])
    def test_reserved_headers_are_refused(self, name: str) -> None:
        with pytest.raises(ValueError, match=f"header '{name}' is reserved"):
            self.make(headers={name: "x"})

    def test_type_is_required_and_intent_checked(self) -> None:
        with pytest.raises(ValueError, match="has no message type"):
            self.make(message_type=None)
        assert self.make(message_type=None, headers={"NServiceBus.EnclosedMessageTypes": "T"})["NServiceBus.EnclosedMessageTypes"] == "T"
        with pytest.raises(ValueError, match="intent 'shout' is not one of send, publish, reply"):
            self.make(intent="shout")

    def test_round_trips_through_the_headers_column(self) -> None:
        h = self.make(headers={"Ünï": "😀 a/b"})
        assert decode_headers(encode_headers(h)) == h


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=16), st.none(),
                                                      st.sampled_from(["\ud800", "a\udfffb", "\U0001f600\u2028"])),
                       max_size=8))
def test_encode_headers_writes_what_json_dumps_writes(headers: dict[str, str | None]) -> None:
    """orjson writes the text (a lone surrogate, which it refuses, goes to the standard library):
    byte for byte what ``json.dumps(ensure_ascii=False)`` wrote before, ``/`` escaped."""
    expected = json.dumps(headers, ensure_ascii=False, separators=(",", ":")).replace("/", "\\/")
    assert encode_headers(headers) == expected
