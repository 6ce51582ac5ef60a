"""Routing of addresses from message data (transport/routing.py) without a database: the refusals (no
address, not an address, a system table, a table of the transport, outside the allow-list, not a queue),
the allow-list's parsing, one look-up per address, and `route_rows` sending refused messages to the error
queue with NServiceBus's failure headers. The catalog look-up is answered by a fake cursor; mutation
testing (tests/mutation/) found these unguarded in the unit tier."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from spark_qtransport.dialects import QueueAddress, Statement
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.dialects.sqlserver import SqlServerDialect
from spark_qtransport.errors import ConfigError, QueueNotFoundError
from spark_qtransport.transport.routing import (
    REFUSED_TYPE,
    Item,
    Refusal,
    Router,
    RoutingPolicy,
    Target,
    queue_shape_problem,
    route_rows,
)
from spark_qtransport.wire import H

QUEUE = {"id": "uuid", "headers": "text", "body": "bytea", "expires": "timestamp", "seq": "bigint"}


class Postgres(PostgresDialect):
    """PostgreSQL, whose look-up of a table's columns names the table (for the fake cursor)."""

    def queue_columns(self, table: QueueAddress) -> Statement:
        return Statement("queue columns", (self.qualified(table),))


class SqlServer(SqlServerDialect):
    def queue_columns(self, table: QueueAddress) -> Statement:
        return Statement("queue columns", (self.qualified(table),))


class Cursor:
    """A cursor that answers a table's columns from `tables` (quoted name -> columns), records what
    ran, and raises `fail[sql]` for a statement whose text starts with a key of `fail`."""

    description = (("name",), ("type",))

    def __init__(self, tables: dict[str, dict[str, str]], fail: dict[str, Exception] | None = None) -> None:
        self.tables, self.fail = tables, fail or {}
        self.looked_up: list[str] = []
        self.ran: list[tuple[str, Any]] = []
        self.rowcount = 0
        self._rows: list[tuple[str, str]] = []

    def execute(self, sql: str, params: Any = None) -> None:
        if sql == "queue columns":
            self.looked_up.append(params[0])
            self._rows = list(self.tables.get(params[0], {}).items())
            return
        for start, exc in self.fail.items():
            if sql.startswith(start):
                raise exc
        self.ran.append((sql, params))
        self.rowcount = len(params[1]) if sql.startswith("INSERT") else 0

    def fetchall(self) -> list[tuple[str, str]]:
        return self._rows

    def nextset(self) -> bool:
        return False


def refusal(router: Router, text: str | None, cur: Cursor | None = None) -> Refusal:
    found = router.resolve(cur or Cursor({}), text)
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
        assert isinstance(router.resolve(Cursor({'"public"."Timeouts"': QUEUE}), "Timeouts"), Target)

    def test_outside_the_allowed_schemas(self) -> None:
        router = Router(Postgres(), RoutingPolicy.parse("billing, shipping", None))
        assert refusal(router, "Sales").reason == "schema 'public' is not in the allowed schemas (billing, shipping)"
        assert isinstance(router.resolve(Cursor({'"billing"."Sales"': QUEUE}), "billing.Sales"), Target)

    def test_outside_the_allowed_queue_patterns(self) -> None:
        router = Router(Postgres(), RoutingPolicy.parse(None, "Billing*, *.Replies"))
        assert refusal(router, "Sales").reason == (
            "queue 'Sales' matches none of the allowed queue patterns (Billing*, *.Replies)")
        cur = Cursor({'"public"."Billing.Eu"': QUEUE, '"public"."Web.Replies"': QUEUE})
        assert isinstance(router.resolve(cur, '"Billing.Eu"'), Target)
        assert isinstance(router.resolve(cur, '"Web.Replies"'), Target)

    def test_the_allow_list_ignores_case_on_sql_server(self) -> None:
        router = Router(SqlServer(), RoutingPolicy.parse("DBO", "sales*"))
        assert isinstance(router.resolve(Cursor({"[dbo].[SALES]": QUEUE}), "SALES@[dbo]"), Target)

    def test_a_table_that_does_not_exist(self) -> None:
        assert refusal(Router(Postgres()), "Nope").reason == '"public"."Nope" does not exist'

    def test_a_table_that_is_not_a_queue(self) -> None:
        cur = Cursor({'"public"."Orders"': {"id": "uuid", "total": "numeric"}})
        assert refusal(Router(Postgres()), "Orders", cur).reason == (
            '"public"."Orders" is not a queue table: missing column(s) body, expires, headers, seq')

    def test_a_refusal_names_the_address_as_given(self) -> None:
        router = Router(Postgres())
        assert refusal(router, "Nope").failed_q == "Nope"
        assert refusal(router, "public.Nope").failed_q == "public.Nope"  # the same table, looked up once


class TestQueueShape:
    def test_either_sequence_column_makes_a_queue(self) -> None:
        assert queue_shape_problem(QUEUE) is None
        assert queue_shape_problem({**{k: v for k, v in QUEUE.items() if k != "seq"}, "rowversion": "timestamp"}) is None

    def test_no_columns_is_no_table(self) -> None:
        assert queue_shape_problem({}) == "does not exist"


class TestRouter:
    def test_a_target_is_the_checked_queue(self) -> None:
        found = Router(Postgres()).resolve(Cursor({'"billing"."Sales"': QUEUE}), "billing.Sales")
        assert found == Target(QueueAddress("Sales", "billing"), '"billing"."Sales"', '"billing"."Sales"', QUEUE)

    def test_one_look_up_per_address_until_forgotten(self) -> None:
        router, cur = Router(Postgres()), Cursor({'"public"."Sales"': QUEUE})
        assert router.resolve(cur, "Sales") == router.resolve(cur, "public.Sales")
        assert cur.looked_up == ['"public"."Sales"']
        router.forget()
        router.resolve(cur, "Sales")
        assert cur.looked_up == ['"public"."Sales"'] * 2

    def test_a_trusted_queue_skips_the_allow_list_but_must_be_a_queue(self) -> None:
        router = Router(Postgres(), RoutingPolicy(schemas=("billing",)))
        assert isinstance(router.trusted(Cursor({'"public"."Sales"': QUEUE}), QueueAddress("Sales")), Target)
        assert router.trusted(Cursor({}), QueueAddress("Sales")) == Refusal('"public"."Sales"',
                                                                            '"public"."Sales" does not exist')

    def test_a_missing_error_queue_is_an_error_naming_the_field(self) -> None:
        with pytest.raises(QueueNotFoundError) as caught:
            Router(Postgres()).configured(Cursor({}), QueueAddress("error"), field="error_queue")
        assert caught.value.field == "error_queue" and caught.value.queue == '"public"."error"'
        assert str(caught.value).startswith('error_queue: queue "public"."error" does not exist; create it')


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


def _insert(target: Target, keys: list[Any], headers: list[str]) -> Statement:
    return Statement(f"INSERT INTO {target.name}", (target.text, keys, headers))


class TestRouteRows:
    TABLES = {'"public"."Billing"': QUEUE, '"public"."Shipping"': QUEUE, '"public"."error"': QUEUE}

    def route(self, cur: Cursor, items: list[Item], *, error_queue: bool = True) -> Any:
        router = Router(Postgres())
        return route_rows(cur, router, items, insert=_insert, delete=lambda keys: Statement("DELETE", keys),
                          error_queue=(lambda: router.trusted(cur, QueueAddress("error"))) if error_queue else None,
                          source="delayed", endpoint="Sales")

    def inserted(self, cur: Cursor) -> dict[str, tuple[list[Any], list[str]]]:
        return {params[0]: (params[1], params[2]) for sql, params in cur.ran if sql.startswith("INSERT")}

    def test_messages_go_to_their_queues_and_leave_the_source(self) -> None:
        cur = Cursor(self.TABLES)
        done = self.route(cur, [Item(1, {"a": "1"}, "Billing"), Item(2, {"a": "2"}, "Shipping"),
                                Item(3, {"a/b": "3"}, "public.Billing")])
        assert (done.moved, done.failed, done.kept) == ({'"public"."Billing"': 2, '"public"."Shipping"': 1}, 0, [])
        assert self.inserted(cur) == {'"public"."Billing"': ([1, 3], ['{"a":"1"}', '{"a\\/b":"3"}']),
                                      '"public"."Shipping"': ([2], ['{"a":"2"}'])}
        assert cur.ran[-1] == ("DELETE", [1, 3, 2])

    def test_a_refused_message_goes_to_the_error_queue_with_failure_headers(self, caplog: Any) -> None:
        cur = Cursor(self.TABLES)
        with caplog.at_level(logging.WARNING, logger="spark_qtransport.routing"):
            done = self.route(cur, [Item(1, {H.MESSAGE_ID: "m-1"}, '"Sales.Claims"'), Item(2, {"a": "2"}, "Billing")])
        assert (done.moved, done.failed) == ({'"public"."Billing"': 1}, 1)
        keys, (text,) = self.inserted(cur)['"public"."error"']
        headers = json.loads(text)
        assert keys == [1] and headers[H.MESSAGE_ID] == "m-1"
        assert headers[H.FAILED_Q] == '"Sales.Claims"'
        assert headers[H.EXCEPTION_TYPE] == REFUSED_TYPE == "spark_qtransport.RoutingError"
        assert headers[H.EXCEPTION_MESSAGE] == (
            'cannot deliver the message to "Sales.Claims": "public"."Sales.Claims" is a table of the transport itself, '
            "not a queue")
        assert (headers[H.EXCEPTION_SOURCE], headers[H.PROCESSING_ENDPOINT]) == ("delayed", "Sales")
        assert cur.ran[-1] == ("DELETE", [2, 1])
        assert 'delayed: a message went to "public"."error": cannot deliver the message to "Sales.Claims"' in caplog.text

    def test_unreadable_headers_go_to_the_error_queue_as_they_are(self) -> None:
        cur = Cursor(self.TABLES)
        done = self.route(cur, [Item(1, None, "Billing", raw="<corrupted")])
        assert done.failed == 1 and self.inserted(cur)['"public"."error"'] == ([1], ["<corrupted"])

    def test_without_an_error_queue_refused_messages_stay_where_they_are(self) -> None:
        cur = Cursor(self.TABLES)
        done = self.route(cur, [Item(1, {"a": "1"}, "Nope"), Item(2, None, "Billing", raw="x")], error_queue=False)
        assert done.kept == [(1, '"public"."Nope" does not exist'), (2, "its headers are not a flat JSON object")]
        assert done.failed == 0 and not any(sql.startswith(("INSERT", "DELETE")) for sql, _ in cur.ran)

    def test_a_queue_that_refuses_the_write_sends_its_messages_to_the_error_queue(self) -> None:
        cur = Cursor(self.TABLES, fail={'INSERT INTO "public"."Shipping"': RuntimeError("permission denied")})
        done = self.route(cur, [Item(1, {"a": "1"}, "Shipping"), Item(2, {"a": "2"}, "Billing")])
        assert (done.moved, done.failed) == ({'"public"."Billing"': 1}, 1)
        assert ("ROLLBACK TO SAVEPOINT sqlqueue_route", None) in cur.ran
        (text,) = self.inserted(cur)['"public"."error"'][1]
        assert json.loads(text)[H.EXCEPTION_MESSAGE] == (
            'cannot deliver the message to "public"."Shipping": writing to "public"."Shipping" failed: permission denied')
