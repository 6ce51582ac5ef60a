"""The option registry's edges that mutation testing found unguarded (tests/mutation/): how a type and
its bounds read in the documentation, a value given empty or blank, a text option's length bounds, what
an error names (the option, the flag, the value), and the command line's names for settings fields."""

from __future__ import annotations

import pytest

from spark_qtransport.errors import ConfigError, field_error
from spark_qtransport.options import registry as r

READ, WRITE = r.for_side(r.READ), r.for_side(r.WRITE)


class TestTypeText:
    """``type_text``: the type and bounds column of the documentation's option tables."""

    @pytest.mark.parametrize(("option", "text"), [
        (READ["maxmessagespertrigger"], "whole number, 1 to 10,000,000"),
        (WRITE["inlinebytes"], "whole number, 0 to 1,073,741,824"),
        (READ["preparedclaimtimeout"], "duration, 1s to 1d"),
        (READ["monitoringinterval"], "duration, 100ms to 1d"),
        (WRITE["deduplicationretention"], "duration, 1s to 3650d"),
        (READ["outagetimeout"], "duration, at least 0s"),
        (WRITE["sinkname"], "text, 1 to 200 characters"),
        (READ["claimmode"], "one of `auto`, `prepared`, `table`"),
        (READ["createqueues"], "true or false"),
        (READ["queue"], "queue addresses"),
    ])
    def test_the_documentation_shows_the_type_and_bounds(self, option: r.Option, text: str) -> None:
        assert option.type_text() == text

    @pytest.mark.parametrize(("low", "high", "text"), [
        (60, 7200, "duration, 1m to 2h"),
        (90, 120, "duration, 90s to 2m"),  # not a whole number of minutes: seconds
        (0.5, 1, "duration, 500ms to 1s"),
        (5, None, "duration, at least 5s"),
    ])
    def test_a_duration_bound_reads_in_its_largest_whole_unit(self, low: float, high: float | None, text: str) -> None:
        assert r.Option("x", r.DURATION, "m", r.BOTH, minimum=low, maximum=high).type_text() == text

    def test_a_whole_number_with_a_lower_bound_only(self) -> None:
        assert r.Option("x", r.INT, "m", r.BOTH, minimum=0).type_text() == "whole number, at least 0"
        assert r.Option("x", r.INT, "m", r.BOTH).type_text() == "whole number"


class TestParse:
    def test_a_blank_value_of_an_option_that_is_not_text_is_as_if_not_given(self) -> None:
        assert READ["maxmessagespertrigger"].parse("   ") == 10_000
        assert READ["claimahead"].parse(" ") is True

    def test_an_empty_text_value_is_as_if_not_given(self) -> None:
        assert WRITE["sinkname"].parse("") == "default"

    def test_a_text_option_without_bounds_takes_the_text(self) -> None:
        assert READ["user"].parse("app_user") == "app_user"

    @pytest.mark.parametrize("value", ["a", "x" * 200, "  padded  "])
    def test_a_sink_name_within_its_bounds_is_taken(self, value: str) -> None:
        assert WRITE["sinkname"].parse(value) == value.strip()

    @pytest.mark.parametrize("value", ["   ", "x" * 201])
    def test_a_sink_name_out_of_its_bounds_is_refused_naming_the_option(self, value: str) -> None:
        with pytest.raises(ConfigError, match=r"^option 'sinkName' must be 1 to 200 characters$") as caught:
            WRITE["sinkname"].parse(value)
        assert caught.value.option == "sinkName"

    def test_a_bad_true_or_false_is_named_with_the_value(self) -> None:
        with pytest.raises(ConfigError, match=r"^option 'createQueues' must be true or false, not 'maybe'$"):
            READ["createqueues"].parse("maybe")

    @pytest.mark.parametrize(("option", "where"), [("outageTimeout", "option 'outageTimeout'"),
                                                   ("--outage-timeout", "--outage-timeout")])
    def test_a_bad_duration_names_the_option_or_the_flag(self, option: str, where: str) -> None:
        with pytest.raises(ConfigError) as caught:
            r.parse_duration("soon", option=option)
        assert str(caught.value) == f"{where} must be a duration such as 30s, 12h or 7d, not 'soon'"
        assert caught.value.option == option


class TestCommandLineNames:
    def test_an_argument_of_the_command_is_named_as_it_is(self) -> None:
        # the command's own arguments (`cli`) read as they are, not as "option '...'"
        exc = r.name_fields(field_error("queue", "is empty"), cli={"queue": "QUEUE"})
        assert (str(exc), exc.option) == ("QUEUE is empty", "QUEUE")

    def test_a_field_no_flag_takes_keeps_its_own_name(self) -> None:
        exc = r.name_fields(field_error("max_messages", "must be at least 1, as `num_partitions` says"), cli={})
        assert str(exc) == "max_messages: must be at least 1, as `num_partitions` says"
        assert exc.option is None

    def test_the_flags_name_only_fields_they_take(self) -> None:
        assert all(field and flag.startswith("--") for field, flag in r.cli_names().items())
        assert r.cli_names()["outage_timeout"] == "--outage-timeout"
