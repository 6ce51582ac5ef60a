"""The sink's value checks (transport/sending/checks.py) on their own: a .NET TimeSpan's text, duration
columns in seconds and their bounds, NUL characters, the headers column, and what an error copy shows
of a refused row. The unit tier reached them only through the builder's property tests; mutation
testing (tests/mutation/) found their edges unguarded."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from spark_qtransport.transport.sending.checks import (
    MAX_SECONDS,
    SHOWN_CHARS,
    Refused,
    Timing,
    clean,
    given_headers,
    loose_headers,
    no_nul,
    related_to,
    seconds_of,
    shown,
    timespan,
)
from spark_qtransport.wire import H


class TestTimespan:
    """NServiceBus.TimeToBeReceived is a TimeSpan in .NET's constant format, ``[d.]hh:mm:ss[.fffffff]``."""

    @pytest.mark.parametrize(("seconds", "text"), [
        (0, "00:00:00"),
        (59, "00:00:59"),
        (90.5, "00:01:30.5000000"),
        (3600, "01:00:00"),
        (86_400, "1.00:00:00"),
        (86_400 + 3723, "1.01:02:03"),
        (10 * 86_400 + 0.25, "10.00:00:00.2500000"),
        (1e-7, "00:00:00.0000001"),  # one tick
        (59.99999999, "00:01:00"),  # rounded to the tick
    ])
    def test_the_constant_format(self, seconds: float, text: str) -> None:
        assert timespan(seconds) == text


class TestSecondsOf:
    def test_no_value_is_none(self) -> None:
        assert seconds_of(None, "delay", "m-1") is None

    @pytest.mark.parametrize(("value", "seconds"), [(timedelta(minutes=2, milliseconds=5), 120.005), ("12.5", 12.5),
                                                    (7, 7.0), (-5, -5.0), (MAX_SECONDS, MAX_SECONDS)])
    def test_a_number_or_an_interval_in_seconds(self, value: Any, seconds: float) -> None:
        assert seconds_of(value, "delay", "m-1") == pytest.approx(seconds)

    def test_not_a_number_is_refused_naming_column_and_message(self) -> None:
        with pytest.raises(Refused) as caught:
            seconds_of("soon", "delay", "m-1")
        assert (caught.value.column, caught.value.reason, caught.value.message_id) == (
            "delay", "'soon' is not a number of seconds", "m-1")

    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
    def test_not_finite_is_refused(self, value: float) -> None:
        with pytest.raises(Refused, match="is not a finite number of seconds"):
            seconds_of(value, "ttbr", "m-1")

    def test_longer_than_a_hundred_years_is_refused(self) -> None:
        with pytest.raises(Refused) as caught:
            seconds_of(MAX_SECONDS + 1, "delay", "m-1")
        assert caught.value.reason == (
            "3155760001.0 is too long (3155760001 s; at most 3155760000 s, about 100 years)")
        assert MAX_SECONDS == 100 * 365.25 * 86_400

    def test_the_dialect_may_set_a_lower_limit(self) -> None:
        assert seconds_of(60, "delay", "m-1", limit=60) == 60
        with pytest.raises(Refused, match=r"is too long \(61 s; at most 60 s"):
            seconds_of(61, "delay", "m-1", limit=60)


@pytest.mark.parametrize(("check", "column"), [
    (lambda: seconds_of(math.nan, "delay", "m-7"), "delay"),
    (lambda: seconds_of(MAX_SECONDS * 2, "ttbr", "m-7"), "ttbr"),
    (lambda: no_nul("a\x00", "body", "m-7"), "body"),
    (lambda: given_headers({"k\x00": "v"}, "m-7"), "headers"),
    (lambda: given_headers({"k": "v\x00"}, "m-7"), "headers"),
])
def test_a_refusal_names_the_message(check: Any, column: str) -> None:
    # the error (or the error copy) says which message the row was being built as
    with pytest.raises(Refused) as caught:
        check()
    assert (caught.value.column, caught.value.message_id) == (column, "m-7")


class TestNul:
    def test_text_with_a_nul_is_refused_naming_the_part(self) -> None:
        with pytest.raises(Refused) as caught:
            no_nul("a\x00b", "headers", "m-1", field="headers['x']")
        assert (caught.value.column, caught.value.field, caught.value.reason) == (
            "headers", "headers['x']", "'a\\x00b' contains a NUL character (\\x00)")

    def test_other_values_pass(self) -> None:
        no_nul("ab", "body", "m-1")
        no_nul(b"a\x00b", "body", "m-1")  # bytes hold any byte


class TestTiming:
    NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)

    @pytest.mark.parametrize(("timing", "deferred"), [
        (Timing(None, None, None), False),
        (Timing(60.0, 0.0, None), False),  # a delay of 0 is none
        (Timing(None, 0.5, None), True),
        (Timing(None, None, NOW), True),
        (Timing(None, None, None, due_now=True), True),
    ])
    def test_deferred(self, timing: Timing, deferred: bool) -> None:
        assert timing.deferred is deferred


class TestGivenHeaders:
    def test_nulls_are_dropped_and_arrow_pairs_read(self) -> None:
        assert given_headers([("a", "1"), ("b", None)], "m-1") == {"a": "1"}
        assert given_headers(None, "m-1") == {}

    def test_a_nul_in_a_name_is_refused_for_the_column(self) -> None:
        with pytest.raises(Refused) as caught:
            given_headers({"a\x00": "1"}, "m-1")
        assert (caught.value.column, caught.value.field) == ("headers", None)

    def test_a_nul_in_a_value_is_refused_naming_the_header(self) -> None:
        with pytest.raises(Refused) as caught:
            given_headers({"a": "1\x00"}, "m-1")
        assert (caught.value.column, caught.value.field) == ("headers", "headers['a']")


class TestRelatedTo:
    @pytest.mark.parametrize(("given", "related"), [
        ({H.RELATED_TO: "in-7"}, "in-7"),
        ([(H.RELATED_TO, "in-8")], "in-8"),  # Arrow's pairs
        ({H.RELATED_TO: ""}, None),
        ({H.RELATED_TO: 7}, None),
        ({"other": "x"}, None),
        (None, None),
        (5, None),  # not a map
    ])
    def test_the_related_message_of_a_headers_column(self, given: Any, related: str | None) -> None:
        assert related_to(given) == related


class TestWhatAnErrorCopyShows:
    def test_shown_is_the_repr_cut_at_its_length(self) -> None:
        assert shown("a\x00") == "'a\\x00'"
        assert shown("x" * (SHOWN_CHARS - 2)) == repr("x" * (SHOWN_CHARS - 2))  # just fits
        long = shown("x" * 300)
        assert long == repr("x" * 300)[:SHOWN_CHARS] + "..." and SHOWN_CHARS == 200

    def test_shown_of_a_value_without_a_repr_is_its_type(self) -> None:
        class Opaque:
            def __repr__(self) -> str:
                raise RuntimeError("no")

        assert shown(Opaque()) == "<Opaque>"

    @pytest.mark.parametrize(("value", "text"), [(None, None), ("", None), ("a\x00b", "a\\x00b"), (5, "5"),
                                                 ("plain", "plain")])
    def test_clean(self, value: Any, text: str | None) -> None:
        assert clean(value) == text

    def test_loose_headers_keep_what_an_error_copy_can_carry(self) -> None:
        given = {"a": "1", "b": None, "": "x", H.CONTROL_MESSAGE: "true", H.FORWARD_DESTINATION: "q", "n": 5,
                 "k\x00": "v\x00"}
        assert loose_headers(given) == {"a": "1", "n": "5", "k\\x00": "v\\x00"}
        assert loose_headers([("a", "b")]) == {"a": "b"}
        assert loose_headers(5) == {}
