"""Queue addresses' edges that mutation testing found unguarded (tests/mutation/): which part of an
address an error names, where a quoting error is, an empty quoted name, white space around an address,
an error's fields when a settings field is at fault, and an index name shortened to the database's limit."""

from __future__ import annotations

import pytest

from spark_qtransport.dialects import QueueAddress
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.dialects.sqlserver import SqlServerDialect
from spark_qtransport.errors import ConfigError

PG, MSSQL = PostgresDialect(), SqlServerDialect()


class TestParseErrors:
    @pytest.mark.parametrize(("text", "part"), [("a.", "table"), (".a", "schema"), ('""', "table"),
                                                ('"billing".""', "table")])
    def test_the_error_names_the_empty_part(self, text: str, part: str) -> None:
        with pytest.raises(ConfigError, match=f"^option 'queue': invalid queue address .*: {part} name is empty$"):
            PG.parse_address(text)

    @pytest.mark.parametrize(("text", "position"), [('"a"b.c', 3), ('c."a"b', 5)])
    def test_text_after_a_closing_quote_is_an_error_naming_its_position(self, text: str, position: int) -> None:
        with pytest.raises(ConfigError, match=f"text after the closing quote at position {position}:"):
            PG.parse_address(text)

    def test_with_a_settings_field_the_error_names_the_field_and_the_queue(self) -> None:
        with pytest.raises(ConfigError) as caught:
            PG.parse_address("a\x00b", field="destination")
        assert caught.value.fields() == {"field": "destination", "queue": "a\x00b"}
        assert str(caught.value) == (
            "destination: invalid queue address 'a\\x00b': table name 'a\\x00b' contains a NUL character")

    def test_with_a_settings_field_an_empty_address_names_the_field_only(self) -> None:
        with pytest.raises(ConfigError) as caught:
            MSSQL.parse_address("", field="destination")
        assert caught.value.fields() == {"field": "destination"}
        assert str(caught.value) == "destination: is empty: give a queue name such as 'Sales' or 'Sales@[dbo]'"

    def test_a_name_that_is_not_text_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="^table name is empty$"):
            PG.check_name("table", 5)  # type: ignore[arg-type]


class TestParse:
    def test_postgres_drops_white_space_around_an_address(self) -> None:
        assert PG.parse_address("  billing.Sales \n") == QueueAddress("Sales", "billing")

    def test_sql_server_keeps_it_as_nservicebus_does(self) -> None:
        assert MSSQL.parse_address(" Sales") == QueueAddress(" Sales")

    def test_an_unquoted_name_ending_with_a_quote_is_taken_as_it_is(self) -> None:
        assert PG.parse_address('Sales"') == QueueAddress('Sales"')


class TestNServiceBusNameLimit:
    """NServiceBus's PostgreSQL transport refuses a queue or delayed table name over 55 UTF-8 bytes."""

    @pytest.mark.parametrize("table", ["x" * 55, "\u00e9" * 27 + "x"])
    def test_up_to_55_bytes_is_fine(self, table: str) -> None:
        assert PG.nservicebus_name_problem(QueueAddress(table)) is None

    @pytest.mark.parametrize("table", ["x" * 56, "\u00e9" * 28])
    def test_over_55_bytes_is_a_problem_naming_the_size_and_the_limit(self, table: str) -> None:
        problem = PG.nservicebus_name_problem(QueueAddress(table))
        assert problem is not None and problem.startswith(f"table name {table!r} is 56 bytes;")
        assert "over 55 bytes" in problem

    def test_sql_server_has_no_such_limit(self) -> None:
        assert MSSQL.nservicebus_name_problem(QueueAddress("x" * 128)) is None


class TestCompanionsAndIndexes:
    def test_a_queue_too_long_for_its_companion_is_an_error_naming_the_queue(self) -> None:
        queue = QueueAddress("x" * 58, "billing")
        with pytest.raises(ConfigError, match="is too long: its table .* would exceed 63 bytes") as caught:
            PG.companion(queue, "Claims")
        assert caught.value.queue == f"billing.{'x' * 58}"

    def test_sql_server_names_a_table_it_cannot_write_as_an_address(self) -> None:
        with pytest.raises(ConfigError, match="contains '@' and cannot be written as an address") as caught:
            MSSQL.format_address(QueueAddress("a@b"))
        assert caught.value.queue == "a@b"

    def test_an_index_name_within_the_limit_is_table_and_suffix(self) -> None:
        assert PG.index_name(QueueAddress("Sales"), "seq_idx") == "Sales_seq_idx"

    @pytest.mark.parametrize("table", ["x" * 70, "é" * 40, "a" + "é" * 40])
    def test_a_long_index_name_is_shortened_to_fit_and_stays_unique(self, table: str) -> None:
        name = PG.index_name(QueueAddress(table), "seq_idx")
        other = PG.index_name(QueueAddress(table + "2"), "seq_idx")
        assert len(name.encode("utf-8")) <= PG.max_table_bytes and name != other
        assert name.endswith("_seq_idx")
        head, digest = name.removesuffix("_seq_idx").rsplit("_", 1)
        assert table.startswith(head) and len(head.encode("utf-8")) >= 40  # most of the name is kept
        assert len(digest) == 8 and int(digest, 16) >= 0
