"""Routing of addresses from message data (transport/routing.py), the part decided before any
database is asked: the refusals (no address, not an address, a system table, a table of the
transport, outside the allow-list), the allow-list's parsing and the shape of a queue's columns.
Look-ups, targets and the error queue copies need a database: tests/test_trust.py and the send
contract suite hold those against a real one. Mutation testing (tests/mutation/) found these
unguarded in the unit tier."""

from __future__ import annotations

from typing import Any

import pytest

from spark_qtransport.dialects import QueueAddress
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.dialects.sqlserver import SqlServerDialect
from spark_qtransport.errors import ConfigError
from spark_qtransport.transport.routing import (
    Refusal,
    Router,
    RoutingPolicy,
    queue_shape_problem,
)

QUEUE = {"id": "uuid", "headers": "text", "body": "bytea", "expires": "timestamp", "seq": "bigint"}


Postgres, SqlServer = PostgresDialect, SqlServerDialect


class Unasked:
    """What `resolve` gets as its cursor where the answer must come before any look-up: using it fails."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the router asked the database ({name}) for an address it must refuse first")


def refusal(router: Router, text: str | None) -> Refusal:
    found = router.resolve(Unasked(), text)
    assert isinstance(found, Refusal), found
    return found


class TestRefusals:
    @pytest.mark.parametrize("text", [None, "", "   "])
    def test_no_address(self, text: str | None) -> None:
        found = refusal(Router(Postgres()), text)
        assert found == Refusal("", "the message names no destination queue")
        assert found.message == "cannot deliver the message to (no address): the message names no destination queue"

    def test_not_an_address(self) -> None:
        found = refusal(Router(Postgres()), '"Sales')
        assert found.failed_q == '"Sales'
        assert found.reason.startswith("not a queue address (") and "never closed" in found.reason

    @pytest.mark.parametrize(("dialect", "text", "name"), [
        (Postgres(), "pg_catalog.pg_class", '"pg_catalog"."pg_class"'),
        (Postgres(), "information_schema.tables", '"information_schema"."tables"'),
        (Postgres(), "pg_temp_3.Sales", '"pg_temp_3"."Sales"'),
        (SqlServer(), "objects@[sys]", "[sys].[objects]"),
        (SqlServer(), "Sales@[dbo]@[master]", "[master].[dbo].[Sales]"),
    ])
    def test_a_system_table(self, dialect: Any, text: str, name: str) -> None:
        assert refusal(Router(dialect), text).reason == f"{name} is a system table, not a queue"

    @pytest.mark.parametrize("suffix", ["Claims", "Staging", "Outbox", "Delayed"])
    def test_a_companion_table(self, suffix: str) -> None:
        found = refusal(Router(Postgres()), f'"Sales.{suffix}"')
        assert found.reason == f'"public"."Sales.{suffix}" is a table of the transport itself, not a queue'

    def test_a_companion_table_in_another_case_on_sql_server(self) -> None:
        assert "is a table of the transport itself" in refusal(Router(SqlServer()), "Sales.CLAIMS").reason

    def test_the_delayed_table_the_options_name(self) -> None:
        policy = RoutingPolicy().reserving(suffix="Later", table=QueueAddress("Timeouts", "billing"))
        router = Router(Postgres(), policy)
        assert "is a table of the transport itself" in refusal(router, '"Sales.Later"').reason
        assert "is a table of the transport itself" in refusal(router, "billing.Timeouts").reason

    def test_outside_the_allowed_schemas(self) -> None:
        router = Router(Postgres(), RoutingPolicy.parse("billing, shipping", None))
        assert refusal(router, "Sales").reason == "schema 'public' is not in the allowed schemas (billing, shipping)"

    def test_outside_the_allowed_queue_patterns(self) -> None:
        router = Router(Postgres(), RoutingPolicy.parse(None, "Billing*, *.Replies"))
        assert refusal(router, "Sales").reason == (
            "queue 'Sales' matches none of the allowed queue patterns (Billing*, *.Replies)")

    def test_a_refusal_names_the_address_as_given(self) -> None:
        assert refusal(Router(Postgres()), '"Sales').failed_q == '"Sales'
        assert refusal(Router(Postgres()), 'pg_catalog.pg_class').failed_q == 'pg_catalog.pg_class'


class TestQueueShape:
    def test_either_sequence_column_makes_a_queue(self) -> None:
        assert queue_shape_problem(QUEUE) is None
        assert queue_shape_problem({**{k: v for k, v in QUEUE.items() if k != "seq"}, "rowversion": "timestamp"}) is None

    def test_no_columns_is_no_table(self) -> None:
        assert queue_shape_problem({}) == "does not exist"


class TestPolicyParse:
    def test_not_given_is_no_allow_list(self) -> None:
        assert RoutingPolicy.parse(None, None) == RoutingPolicy(None, ())

    def test_lists_are_comma_separated_and_trimmed(self) -> None:
        assert RoutingPolicy.parse(" billing, shipping ,", "Sales*,, *.Replies") == RoutingPolicy(
            ("billing", "shipping"), ("Sales*", "*.Replies"))

    @pytest.mark.parametrize(("schemas", "queues", "field"), [("", None, "allowed_schemas"),
                                                              (" , ", None, "allowed_schemas"),
                                                              (None, ",", "allowed_queues")])
    def test_an_empty_list_is_refused(self, schemas: str | None, queues: str | None, field: str) -> None:
        with pytest.raises(ConfigError) as caught:
            RoutingPolicy.parse(schemas, queues)
        assert caught.value.field == field
        assert str(caught.value) == f"{field}: is empty: give a comma-separated list, or leave it out"

    @pytest.mark.parametrize(("schemas", "queues", "field"), [("billing,bi\x00lling", None, "allowed_schemas"),
                                                              (None, "Sales\x00", "allowed_queues")])
    def test_a_nul_character_is_refused(self, schemas: str | None, queues: str | None, field: str) -> None:
        with pytest.raises(ConfigError) as caught:
            RoutingPolicy.parse(schemas, queues)
        assert (caught.value.field, str(caught.value)) == (field, f"{field}: contains a NUL character")

