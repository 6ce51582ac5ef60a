"""The wire format's edges that mutation testing found unguarded (tests/mutation/): the poison rule
where the standard library decides (escaped surrogates, NaN), times on a machine whose local zone is
not UTC, the failure headers' values, a conversation's id, given headers in the sink's hot path, and
version-4 ids in bulk."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone

import pytest

from spark_qtransport.wire import (
    EXCEPTION_DATA,
    FAILURE_HEADERS,
    H,
    SentHeaderText,
    decode_header_texts,
    decode_headers,
    encode_headers,
    failure_headers,
    format_time,
    given_texts,
    host_id,
    outgoing_headers,
    parse_time,
    retries_performed,
    uuid4_list,
    uuid4s,
)

#: a value orjson refuses (a number beyond a double), replaced by a repeated key: the standard
#: library decides the rest of the text, which is a flat object then
BEYOND_DOUBLE = '"n":1e999,"n":"x"'


@pytest.fixture
def local_zone_not_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local zone is UTC+05:30 (a POSIX TZ rule: no zone database needed)."""
    monkeypatch.setenv("TZ", "XST-05:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _near_utc_now(text: str | None) -> bool:
    moment = parse_time(text)
    return moment is not None and abs(moment - datetime.now(timezone.utc)) < timedelta(minutes=5)


class TestPoisonRuleOfEscapedSurrogates:
    @pytest.mark.parametrize("text", [
        r'{"a":"\ud800"}',  # a high half alone: the lowest
        r'{"a":"\udbff"}',  # the highest
        r'{"a":"\udc00"}',  # a low half alone: the lowest
        r'{"a":"\udfff"}',  # the highest
        r'{"a":"\ud800\ud800"}',  # a high half followed by another high half
        r'{"a":"\ud800\ue000"}',  # ... by the first character past the low halves
        r'{"a":"\ud800\n"}',  # ... by another escape
        r'{"a":"\ud800x\udc00"}',  # ... by its low half, not next to it
        r'{"a":"\udc00\udc00"}',  # two low halves
        r'{"a":"\ud83d\ude00\ud800"}',  # a pair, then a half alone
        r'{"\ud800":"x"}',  # in a key
        r'{"a":"\ud800","a":"x"}',  # in a value a repeated key then replaces
        r'{"a":"\\\ud800"}',  # an escaped backslash, then a half alone
    ])
    def test_an_escaped_lone_half_is_poison(self, text: str) -> None:
        assert decode_headers(text) is None

    @pytest.mark.parametrize(("pair", "char"), [
        (r"\ud800\udc00", "\U00010000"),  # the lowest pair
        (r"\udbff\udfff", "\U0010ffff"),  # the highest
        (r"\uD83D\uDE00", "\U0001f600"),  # upper-case hex digits
    ])
    def test_an_escaped_pair_is_one_character_where_the_standard_library_decides(self, pair: str, char: str) -> None:
        assert decode_headers(f'{{"a":"{pair}",{BEYOND_DOUBLE}}}') == {"a": char, "n": "x"}

    @pytest.mark.parametrize(("escape", "char"), [(r"\ud7ff", "\ud7ff"), (r"\ue000", "\ue000")])
    def test_an_escape_next_to_the_surrogates_is_a_character(self, escape: str, char: str) -> None:
        assert decode_headers(f'{{"a":"{escape}",{BEYOND_DOUBLE}}}') == {"a": char, "n": "x"}

    def test_an_escaped_backslash_before_u_is_no_escape(self) -> None:
        assert decode_headers(rf'{{"a":"\\ud800",{BEYOND_DOUBLE}}}') == {"a": "\\ud800", "n": "x"}

    def test_a_number_beyond_a_double_in_a_replaced_value_is_not_poison(self) -> None:
        # PostgreSQL's jsonb takes 1e999 (numeric); the object is flat once the key repeats
        assert decode_headers(f"{{{BEYOND_DOUBLE}}}") == {"n": "x"}

    @pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
    def test_nan_and_infinity_are_poison_even_in_a_replaced_value(self, constant: str) -> None:
        # not JSON: jsonb refuses them, so does NServiceBus's System.Text.Json
        assert decode_headers(f'{{"a": {constant}, "a": "x"}}') is None


def test_decode_header_texts_reads_each_text_as_decode_headers_does() -> None:
    texts = ["", '{"a":"b"}', r'{"a":"\ud800"}', f"{{{BEYOND_DOUBLE}}}", rf'{{"a":"\ud83d\ude00",{BEYOND_DOUBLE}}}',
             "[1]", "<corrupted", '{"a": NaN}']
    assert decode_header_texts(texts) == [decode_headers(t) for t in texts]
    assert decode_header_texts(texts)[0] == {}  # '' is no headers, not poison


class TestTimesWhateverTheLocalZone:
    def test_a_naive_time_is_utc(self, local_zone_not_utc: None) -> None:
        assert format_time(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02 03:04:05:000000 Z"

    def test_an_aware_time_is_written_in_utc(self, local_zone_not_utc: None) -> None:
        moment = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=2)))
        assert format_time(moment) == "2026-01-02 01:04:05:000006 Z"

    def test_time_sent_is_now_in_utc(self, local_zone_not_utc: None) -> None:
        headers = outgoing_headers(message_id="m-1", endpoint="Sales", machine="spark-1", message_type="T")
        assert _near_utc_now(headers[H.TIME_SENT])

    def test_time_of_failure_is_now_in_utc(self, local_zone_not_utc: None) -> None:
        headers = failure_headers({}, failed_q="Sales", exception_type="E", message="m", source="s", endpoint="Sales")
        assert _near_utc_now(headers[H.TIME_OF_FAILURE])


class TestParseTime:
    @pytest.mark.parametrize("text", [
        "2025-11-28 00:05:18.653833 Z",  # a dot before the microseconds (ISO 8601's)
        "2025-11-28 00:05:18:6538331 Z",  # seven digits (.NET's ticks)
        "2025-11-28 00:05:18:653833Z",  # no space before Z
    ])
    def test_text_near_the_format_is_not_a_time(self, text: str) -> None:
        assert parse_time(text) is None

    @pytest.mark.parametrize(("text", "micro"), [("2025-11-28 00:05:18:653833 Z", 653833),
                                                 ("2025-11-28 00:05:18:6538 Z", 653800)])
    def test_a_time_read_is_aware_utc(self, text: str, micro: int) -> None:
        assert parse_time(text) == datetime(2025, 11, 28, 0, 5, 18, micro, tzinfo=timezone.utc)
        assert parse_time(text).tzinfo == timezone.utc  # type: ignore[union-attr]


class TestFailureHeaders:
    def test_the_headers_and_their_values(self) -> None:
        given = {"NServiceBus.MessageId": "m-1", H.RETRIES: "3", H.FL_RETRIES: "2", "Custom": "c"}
        out = failure_headers(given, failed_q="Sales", exception_type="Shop.Boom", message="boom", source="src",
                              endpoint="Sales", data={"Column": "delay", "Value": "NaN"})
        assert H.RETRIES not in out and H.FL_RETRIES not in out  # NServiceBus's MoveToError removes the counters
        assert out["NServiceBus.MessageId"] == "m-1" and out["Custom"] == "c"
        assert set(FAILURE_HEADERS) <= set(out)
        assert (out[H.FAILED_Q], out[H.EXCEPTION_TYPE], out[H.EXCEPTION_MESSAGE], out[H.EXCEPTION_SOURCE]) == (
            "Sales", "Shop.Boom", "boom", "src")
        assert out[H.EXCEPTION_STACK_TRACE] == ""  # none given
        assert out[H.PROCESSING_ENDPOINT] == "Sales"
        assert out[f"{EXCEPTION_DATA}Column"] == "delay" and out[f"{EXCEPTION_DATA}Value"] == "NaN"
        assert EXCEPTION_DATA == "NServiceBus.ExceptionInfo.Data."


class TestRetriesPerformed:
    """``NServiceBus.Retries`` read as .NET's ``int.TryParse`` reads it."""

    @pytest.mark.parametrize(("value", "count"), [
        ("3", 3), (" 3 ", 3), ("+3", 3), ("0", 0), ("2147483647", 2_147_483_647),
        ("-1", 0),  # a negative count as 0
        ("2147483648", 0), ("3.0", 0), ("abc", 0), ("", 0), ("\u0663", 0),  # not a 32-bit whole number in ASCII
        (3, 0), (None, 0),  # not text
    ])
    def test_the_delayed_retries_performed(self, value: object, count: int) -> None:
        assert retries_performed({H.RETRIES: value}) == count

    def test_absent_is_none_performed(self) -> None:
        assert retries_performed({}) == 0


def test_an_endpoint_is_the_same_host_in_every_release() -> None:
    # ServicePulse tells hosts apart by $.diagnostics.hostid: derived from the endpoint's name alone
    # (a Guid in "N" format), so a new release must not change it
    assert host_id("Sales") == "abfbf3b274495471992ad3c3d9fa0ec7"
    assert host_id("Billing") != host_id("Sales")


class TestConversation:
    def test_a_reply_to_a_message_without_a_conversation_starts_a_new_one(self) -> None:
        headers = outgoing_headers(message_id="m-1", endpoint="Sales", machine="spark-1", message_type="T",
                                   intent="reply", incoming={H.MESSAGE_ID: "in-7"})
        assert uuid.UUID(str(headers[H.CONVERSATION_ID])).version == 4


class TestSentHeaderText:
    SENT = "2026-01-01 00:00:00:000000 Z"

    @pytest.mark.parametrize("name", [H.MESSAGE_INTENT, H.ENCLOSED_MESSAGE_TYPES, H.CONTENT_TYPE, H.TIME_SENT,
                                      H.ORIGINATING_ENDPOINT, H.ORIGINATING_MACHINE, H.CONVERSATION_ID,
                                      H.CORRELATION_ID, H.REPLY_TO_ADDRESS])
    def test_a_given_header_it_fills_in_wins_as_in_outgoing_headers(self, name: str) -> None:
        given = {name: "given/value", "Custom": "c"}
        writer = SentHeaderText(endpoint="Sales", machine="spark-1", content_type="application/json",
                                new_id=lambda: "conversation-1")
        text = writer.text(message_id="m-1", intent="Send", enclosed="Shop.T", correlation_id="m-1", reply_to="Sales",
                           time_sent=self.SENT, given=given)
        expected = outgoing_headers(message_id="m-1", endpoint="Sales", machine="spark-1", message_type="Shop.T",
                                    reply_to_address="Sales", now=self.SENT, headers=given)
        if name != H.CONVERSATION_ID:
            expected[H.CONVERSATION_ID] = "conversation-1"
        assert text == encode_headers(expected)
        assert json.loads(text)[name] == "given/value"


    @pytest.mark.parametrize(("intent", "enclosed"), [("Send", "Shop.T"),
                                                      (["Send", "Publish", "Send"], ["Shop.A", "Shop.B", "Shop.A"])])
    def test_texts_write_for_each_message_what_text_writes(self, intent: str | Sequence[str],
                                                           enclosed: str | Sequence[str]) -> None:
        # a column with a character to escape but no "/" (the message ids' quote), with "/" (the conversations')
        ids, conversations = ["m-1", 'm"2', "m-\u00fc"], ["c-1", "c/2", "c-3"]
        correlations, replies = ["x/1", None, ""], ["Sales", None, "Web/Replies"]
        given = [{"Custom/1": "a/b", "\u00dcn\u00ef": "1"}, {"Custom/1": "", "\u00dcn\u00ef": "2"},
                 {"Custom/1": 'q"', "\u00dcn\u00ef": "3"}]
        drawn = iter(conversations)
        one = SentHeaderText(endpoint="Sales/EU", machine="spark-1", content_type="application/json",
                             new_id=lambda: next(drawn))
        expected = [one.text(message_id=m, intent=i, enclosed=e, correlation_id=c or m, reply_to=r,
                             time_sent=self.SENT, given=g)
                    for m, i, e, c, r, g in zip(ids, [intent] * 3 if isinstance(intent, str) else intent,
                                                [enclosed] * 3 if isinstance(enclosed, str) else enclosed,
                                                correlations, replies, given, strict=True)]
        many = SentHeaderText(endpoint="Sales/EU", machine="spark-1", content_type="application/json",
                              new_id=lambda: "unused")
        got = many.texts(message_ids=ids, intent=intent, enclosed=enclosed, correlation_ids=correlations,
                         reply_to=replies, time_sent=self.SENT, conversations=conversations,
                         given=given_texts(["Custom/1", "\u00dcn\u00ef"], [[g["Custom/1"] for g in given],
                                                                         [g["\u00dcn\u00ef"] for g in given]]))
        assert got == expected
        assert json.loads(got[1])[H.CORRELATION_ID] == 'm"2'  # no correlation id: the message's own


class TestIds:
    @pytest.mark.parametrize("n", [0, 1, 3])
    def test_uuid4_list_makes_n_ids(self, n: int) -> None:
        ids = uuid4_list(n)
        assert len(ids) == n and len(set(ids)) == n
        assert all(uuid.UUID(i).version == 4 and str(uuid.UUID(i)) == i for i in ids)

    def test_the_ids_are_the_random_bytes_with_version_and_variant_set(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # the bits of uuid.uuid4(): every bit random but the version (4) and the variant (RFC 4122)
        random = bytes(range(256)) * 2
        monkeypatch.setattr(os, "urandom", lambda size: random[:size])
        expected = [uuid.UUID(bytes=random[i:i + 16], version=4) for i in range(0, 48, 16)]
        assert list(uuid4s(3)) == [u.bytes for u in expected]
        assert uuid4_list(3) == [str(u) for u in expected]
