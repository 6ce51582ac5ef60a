"""PostgreSQL SQL without Spark: address parsing, quoting, and the DBA scripts in sql/postgres/."""

from __future__ import annotations

import re

import pytest

from backends import Backend
from dba_scripts import SQL_ROOT, assert_matches_file, endpoint_scripts, render
from spark_qtransport.dialects import QueueAddress
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.errors import ConfigError

D = PostgresDialect()
SQL_DIR = SQL_ROOT / "postgres"

HEADER = """\
-- {title}
--
-- Generated from spark_qtransport.dialects.postgres.PostgresDialect.{method}() and rendered with
-- PostgresDialect.script(): exactly what the connector runs, with its parameters written as
-- literals. tests/test_postgres_sql.py fails when this file and the code differ (regenerate with
-- SQLQUEUE_WRITE_SQL=1 pytest tests/test_postgres_sql.py -k script_files).
--
-- Idempotent: CREATE ... IF NOT EXISTS under a transaction-scoped advisory lock, so concurrent
-- runs of it never race. NServiceBus's installers take no lock: run at the same moment as one of
-- theirs it may fail with "already exists" (42P07, 42710, 23505); run it again. Run it inside a
-- transaction (psql -1 -f ...).
"""
SCRIPTS = {
    "queue.sql": (
        'Queue table "public"."Sales": the NServiceBus PostgreSQL transport layout, with a 64-bit seq.',
        "create_queue",
        lambda: D.create_queue(D.parse_address("Sales")),
    ),
    "claims.sql": (
        'Claim table "public"."Sales.Claims" of queue "Sales": messages claimed by spark-qtransport readers.',
        "create_claims",
        lambda: D.create_claims(D.claims_table(D.parse_address("Sales"))),
    ),
    "batches.sql": (
        'The database\'s settled-batches table "public"."SqlQueue.Batches" (which claims each streaming batch read, and whether its sink settled it) and failed-claims table "public"."SqlQueue.Failed" (the claims its sink failed).',
        "create_batches",
        lambda: D.create_batches(D.batches_table()),
    ),
    **endpoint_scripts(D),
    "poison_headers_pg13-15.sql": (
        'PostgreSQL 13 to 15 only: the header check the claim uses where pg_input_is_valid is missing.',
        "create_helpers",
        lambda: _legacy().create_helpers(QueueAddress("Sales.Claims")),
    ),
}


def _legacy() -> PostgresDialect:
    d, problem = PostgresDialect().adapt_to_server(150000, QueueAddress("Sales.Claims"))
    assert problem is None
    return d


def _script_file(name: str) -> str:
    title, method, make = SCRIPTS[name]
    return render(D, HEADER, title, method, make())


class TestAddresses:
    @pytest.mark.parametrize(
        ("text", "schema", "table"),
        [
            ("Sales", None, "Sales"),
            ("billing.Sales", "billing", "Sales"),
            ('"billing"."Sales.Retries"', "billing", "Sales.Retries"),
            ('"Sales.Retries"', None, "Sales.Retries"),
            ('"we""ird"."x"', 'we"ird', "x"),
            ('Sa"les', None, 'Sa"les'),
        ],
    )
    def test_parse(self, text: str, schema: str | None, table: str) -> None:
        assert D.parse_address(text) == QueueAddress(table, schema)

    @pytest.mark.parametrize("text", ["Sales", "billing.Sales", '"a"".b"."c.d"', "Ünï 😀"])
    def test_format_round_trip(self, text: str) -> None:
        a = D.parse_address(text)
        assert D.parse_address(D.format_address(a)).table == a.table

    def test_quote_doubles_quotes(self) -> None:
        assert D.qualified(QueueAddress('x"; DROP TABLE y; --')) == '"public"."x""; DROP TABLE y; --"'

    @pytest.mark.parametrize("text", ["", "  ", "a\x00b", "x" * 64])
    def test_invalid(self, text: str) -> None:
        with pytest.raises(ConfigError, match="option 'queue'") as err:
            D.parse_address(text)
        assert err.value.option == "queue"
        assert err.value.queue == (text.strip() or None)

    def test_nservicebus_name_limit(self) -> None:
        """PostgreSqlTransportInfrastructure.TableQueueNameLimit: the table part of a queue or
        <endpoint>.Delayed address, in UTF-8 bytes, over 55 stops an endpoint whose installers run."""
        assert D.nservicebus_name_problem(QueueAddress("x" * 55, "s" * 63)) is None
        problem = D.nservicebus_name_problem(QueueAddress("é" * 28))
        assert problem is not None and "56 bytes" in problem and "55 bytes" in problem and "é" * 28 in problem

    def test_claim_table_name_too_long(self) -> None:
        with pytest.raises(ConfigError, match="its table .*Claims"):
            D.claims_table(QueueAddress("x" * 60))


class TestServerAdaptation:
    """The dialect is immutable: what depends on the server found is a configured copy."""

    CLAIMS = QueueAddress("Sales.Claims", "billing")

    def test_frozen(self) -> None:
        d = PostgresDialect()
        with pytest.raises(AttributeError):
            d.helper_schema = "public"  # type: ignore[misc]
        with pytest.raises(AttributeError):
            d.force_helper = True  # type: ignore[misc]

    def test_new_server_checks_headers_builtin(self) -> None:
        base = PostgresDialect()
        d, problem = base.adapt_to_server(170004, self.CLAIMS)
        assert problem is None and d.helper_schema is None and d == base
        assert d.create_helpers(self.CLAIMS) == [] and d.helpers_exist(self.CLAIMS) is None
        failures = d.failure_stats(QueueAddress("error"), limit=10)  # sqlqueue metrics: FailedQ of valid JSON only
        assert "CASE WHEN pg_input_is_valid(headers, 'jsonb') THEN headers::jsonb" in failures.sql
        assert "pg_input_is_valid" in d.claim(QueueAddress("Sales"), self.CLAIMS, QueueAddress("error"), consumer="c",
                                              limit=1, after=0, upto=None)[-1].sql

    @pytest.mark.parametrize(("version", "force"), [(150000, False), (130000, False), (170000, True)])
    def test_helper_where_needed_or_forced(self, version: int, force: bool) -> None:
        base = PostgresDialect(force_helper=force)
        d, problem = base.adapt_to_server(version, self.CLAIMS)
        assert problem is None and d.helper_schema == "billing" and d.force_helper is force
        assert base.helper_schema is None  # the original is unchanged
        claim = d.claim(QueueAddress("Sales"), self.CLAIMS, QueueAddress("error"), consumer="c", limit=1, after=0,
                        upto=None)[-1].sql
        assert ('"billing".sqlqueue_poison_headers(replace(headers, chr(92) || \'u0000\', chr(92) || \'u0001\'))' in claim
                and "pg_input_is_valid" not in claim)
        assert d.create_helpers(self.CLAIMS) and d.helpers_exist(self.CLAIMS) is not None
        failures = d.failure_stats(QueueAddress("error"), limit=10)  # matched in the text: nothing to fail
        assert "substring(headers from %(pattern)s)" in failures.sql and "::jsonb" not in failures.sql
        assert d.failed_q_value('\\"public\\".\\"Caf\\u00e9\\"') == '"public"."Café"'

    def test_too_old(self) -> None:
        base = PostgresDialect()
        d, problem = base.adapt_to_server(120000, self.CLAIMS)
        assert d is base and problem is not None and "PostgreSQL 12 is too old" in problem


class TestStatements:
    EVIL = "evil'; DROP TABLE x; --"

    def test_values_are_parameters(self) -> None:
        q, c, e = QueueAddress("Sales"), QueueAddress("Sales.Claims"), QueueAddress("error")
        stmts = [
            *D.claim(q, c, e, consumer=self.EVIL, limit=10, after=0, upto=5),
            D.max_claim(c, self.EVIL),
            D.nth_claim(c, self.EVIL, after=0, n=5),
            D.read_claims(c, self.EVIL, after=1, upto=2),
            D.ack_claims(c, self.EVIL, upto=3, batch=4),
            D.try_lock_consumer(c, self.EVIL),
            D.unlock_consumer(c, self.EVIL),
        ]
        for stmt in stmts:
            assert self.EVIL not in stmt.sql
            assert "DROP TABLE" not in stmt.sql

    def test_claim_skips_locked_rows_in_order(self) -> None:
        *hints, claim = D.claim(QueueAddress("Sales"), QueueAddress("Sales.Claims"), QueueAddress("error"),
                                consumer="c", limit=10, after=0, upto=None)
        assert [h.sql for h in hints] == ["SET LOCAL enable_seqscan = off", "SET LOCAL enable_bitmapscan = off"]
        assert "FOR UPDATE SKIP LOCKED" in claim.sql and "ORDER BY seq" in claim.sql
        assert "AS MATERIALIZED" in claim.sql
        assert "work_mem" not in claim.sql  # bodies are never materialized: no spill to tune away


    def test_insert_message(self) -> None:
        """One message with a time to be received (monitoring reports): values bound, Expires the
        UTC wall clock plus the time to be received, as the dispatch writes it."""
        stmt = D.insert_message(QueueAddress("Particular.Monitoring"), headers=self.EVIL, body=b"\x00\x01", ttbr_ms=5)
        assert stmt.sql == (
            'INSERT INTO "public"."Particular.Monitoring" (id, expires, headers, body) VALUES (gen_random_uuid(),'
            " CASE WHEN %(ttbr)s::bigint IS NULL THEN NULL ELSE (now() AT TIME ZONE 'UTC') + %(ttbr)s::bigint"
            " * interval '1 millisecond' END, %(headers)s, %(body)s)")
        assert stmt.params == {"ttbr": 5, "headers": self.EVIL, "body": b"\x00\x01"}
        assert "m.ttbr_ms * interval '1 millisecond'" in D.dispatch(
            QueueAddress("S.Staging"), QueueAddress("B"), attempts=[], route=None, publish_routes=[]).sql
        assert D.insert_message(QueueAddress("q"), headers="{}", body=b"", ttbr_ms=None).params["ttbr"] is None

    def test_delayed_due_is_the_one_nservicebus_stores_and_compares(self) -> None:
        """Due is NServiceBus's (StoreDelayedMessageText: the UTC wall clock read in the session's
        TimeZone) and due means `Due < now() AT TIME ZONE 'UTC'` (MoveDueDelayedMessageText) in
        every statement on it: a bare now() is an instant, an hour off on a Berlin server."""
        delayed = QueueAddress("Sales.Delayed")
        store = D.dispatch_delayed(QueueAddress("Sales.Staging"), delayed, attempts=["a"]).sql
        assert "timestamptz (now() AT TIME ZONE 'UTC') + (m.delay_ms / 86400000) * interval '1 day'" in store
        assert "timestamptz (m.due AT TIME ZONE 'UTC')" in store
        reads = [D.any_due(delayed).sql, D.due_delayed(delayed, limit=5).sql, D.delayed_stats(delayed).sql]
        assert all("due < (now() AT TIME ZONE 'UTC')" in sql for sql in reads)
        for sql in [store, *reads]:
            assert "now()" not in re.sub(r"now\(\) AT TIME ZONE 'UTC'", "", sql), sql


class TestScripts:
    @pytest.mark.parametrize("name", list(SCRIPTS))
    def test_script_files(self, name: str) -> None:
        assert_matches_file(SQL_DIR / name, _script_file(name))

    def test_scripts_run_twice(self, pg: Backend) -> None:
        with pg.connect() as conn:
            conn.execute('DROP TABLE IF EXISTS "Sales", "Sales.Claims", "Sales.Staging", "Sales.Outbox", '
                         '"Sales.Delayed", "SubscriptionRouting"')
        for _ in range(2):  # idempotent
            for name in SCRIPTS:
                with pg.connect(autocommit=False) as conn:
                    conn.execute((SQL_DIR / name).read_text(encoding="utf-8"))
                    conn.commit()
        with pg.connect() as conn:
            cols = conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'Sales' ORDER BY ordinal_position"
            ).fetchall()
            conn.execute('DROP TABLE "Sales", "Sales.Claims", "Sales.Staging", "Sales.Outbox", "Sales.Delayed", '
                         '"SubscriptionRouting"')
        assert cols == [("id", "uuid"), ("expires", "timestamp without time zone"), ("headers", "text"),
                        ("body", "bytea"), ("seq", "bigint")]
