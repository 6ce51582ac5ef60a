"""Table privileges are enough once the tables exist: a role that owns nothing and may create
nothing runs the stream an owner started, from the same checkpoint, and the CLI; ``sqlqueue ddl
--grant-to`` prints exactly the grants it needs; ``doctor`` names what a role lacks; only tables
the role may vacuum are vacuumed.

Each test puts its tables in a schema of its own, created by the superuser, so `public` stays
as other tests expect it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from click.testing import CliRunner

from backends import Backend, nsb_headers, receive_batch
from spark_qtransport.cli import main
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.wire import H, decode_headers

PARTS = ("--part", "queue", "--part", "claims", "--part", "sender", "--part", "delayed")


@dataclass
class Role:
    name: str
    password: str
    url: str  # the test database's URL with this role's credentials
    schema: str  # the test's own schema, owned by the superuser

    def address(self, table: str) -> str:
        # quoted: the CLI reads an unquoted dotted name as NServiceBus does, as one table name
        return f'"{self.schema}"."{table}"'


def cli(url: str, *args: str, ok: bool = True) -> Any:
    result = CliRunner().invoke(main, list(args), env={"SQLQUEUE_URL": url})
    if ok:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


def _sql(text: str, *args: Any) -> Any:
    from psycopg import sql

    return sql.SQL(text).format(*args)


def _new_role(pg: Backend, name: str, schema: str) -> Role:
    from psycopg import sql

    password = uuid.uuid4().hex
    with pg.connect() as c:
        c.execute(_sql("CREATE ROLE {} LOGIN PASSWORD {}", sql.Identifier(name), sql.Literal(password)))
    parts = urlsplit(pg.url)
    netloc = f"{quote(name, safe='')}:{password}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return Role(name, password, urlunsplit(parts._replace(netloc=netloc)), schema)


def _drop_role(pg: Backend, role: Role) -> None:
    from psycopg import sql

    with pg.connect() as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role.name,))
        c.execute(_sql("DROP OWNED BY {}", sql.Identifier(role.name)))
        c.execute(_sql("DROP ROLE {}", sql.Identifier(role.name)))


@pytest.fixture
def schema(pg: Backend, names: Any) -> str:
    from psycopg import sql

    name = names("privs")
    with pg.connect() as c:
        c.execute(_sql("CREATE SCHEMA {}", sql.Identifier(name)))
    return name


@pytest.fixture
def app(pg: Backend, names: Any, schema: str) -> Iterator[Role]:
    """A login role that owns nothing and may create nothing in the test's schema."""
    role = _new_role(pg, names("app"), schema)
    yield role
    _drop_role(pg, role)


def grant_printed(pg: Backend, role: Role, *args: str) -> str:
    """Run, as the superuser, exactly what ``sqlqueue ddl --grant-to`` prints (no connection needed)."""
    script = cli("", "ddl", "--grant-to", role.name, *args).output
    with pg.connect() as c:
        c.execute(script)
    return script


def assert_restricted(pg: Backend, role: Role) -> None:
    with pg.connect() as c:
        owned, create_here, create_public, create_db = c.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relowner = r.oid) + (SELECT count(*) FROM pg_proc WHERE proowner = r.oid),"
            " has_schema_privilege(r.oid, %s, 'CREATE'), has_schema_privilege(r.oid, 'public', 'CREATE'),"
            " has_database_privilege(r.oid, current_database(), 'CREATE')"
            " FROM pg_roles r WHERE r.rolname = %s", (role.schema, role.name)).fetchone()
    assert (owned, create_here, create_public, create_db) == (0, False, False, False)


def test_a_role_with_table_privileges_only_continues_the_owners_stream(
    spark: Any, pg: Backend, app: Role, checkpoint: str
) -> None:
    from pyspark.sql import functions as F

    a, b, error, audit = app.address("A"), app.address("B"), app.address("error"), app.address("audit")
    # the DBA's set-up: the queues (and A's delayed table) exist before anything runs
    cli(pg.url, "create-queue", a, "--delayed")
    cli(pg.url, "create-queue", b, error, audit)

    def run(**credentials: str) -> Any:
        received = (spark.readStream.format("sqlqueue").option("url", pg.url).options(**credentials)
                    .option("queue", a).option("errorQueue", error).option("auditQueue", audit).load())
        out = received.select("body", F.lit("Billing.Messages.Invoice").alias("message_type"),
                              F.concat(F.col("message_id"), F.lit("-fwd")).alias("message_id"))
        query = (out.writeStream.format("sqlqueue").option("url", pg.url).options(**credentials)
                 .option("endpoint", a).option("destination", b).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert not query.isActive and query.exception() is None, query.exception()
        return query

    # one batch run by the owner: it creates A.Claims, A.Staging and A.Outbox
    pg.send_many(a, [(nsb_headers(f"m{i:02d}"), b"{}") for i in range(5)])
    first = run()
    assert [p["numInputRows"] for p in first.recentProgress if p["numInputRows"]] == [5]

    # the DBA grants exactly what `sqlqueue ddl --grant-to` prints, and nothing else
    script = grant_printed(pg, app, "--queue", a, "--destination", b, "--error-queue", error, "--audit-queue", audit,
                           *PARTS)
    assert "CREATE" not in script and "SEQUENCE" in script
    assert_restricted(pg, app)
    with pg.connect() as c:  # the identity columns of our tables need no grant on their sequences
        held = c.execute(
            "SELECT bool_or(has_sequence_privilege(%s, s.oid, 'USAGE, SELECT, UPDATE')) FROM pg_class s"
            " JOIN pg_depend d ON d.objid = s.oid AND d.deptype = 'i'"
            " WHERE s.relkind = 'S' AND d.refobjid IN (to_regclass(%s), to_regclass(%s))",
            (app.name, pg.q(f'{app.schema}."A.Claims"'), pg.q(f'{app.schema}."A.Staging"'))).fetchone()[0]
    assert held is False

    # the same stream, same checkpoint, now as the restricted role (user/password options)
    pg.send_many(a, [(nsb_headers(f"m{i:02d}"), b"{}") for i in range(5, 12)])
    cli(app.url, "send", b, "--endpoint", a, "--type", "Billing.Messages.Invoice", "--body", "{}", "--id", "cli-1")
    second = run(user=app.name, password=app.password)
    assert sum(p["numInputRows"] for p in second.recentProgress) == 7

    ids = [(decode_headers(h) or {})[H.MESSAGE_ID] for _, h, _ in pg.rows(b)]
    assert sorted(ids) == sorted([f"m{i:02d}-fwd" for i in range(12)] + ["cli-1"])  # each exactly once
    assert pg.count(a) == 0 and pg.count(error) == 0
    assert pg.count(audit) == 12  # audit copies written with table privileges only

    # the restricted role runs the CLI's read side too
    peeked = json.loads(cli(app.url, "peek", b, "-n", "50", "--json").output)
    assert len(peeked) == 13
    stats = {r["queue"]: r for r in json.loads(cli(app.url, "stats", a, b, "--json").output)}
    assert stats[pg.dialect.format_address(pg.address(b))]["messages"] == 13
    assert stats[pg.dialect.format_address(pg.address(a))]["messages"] == 0
    doctor = json.loads(cli(app.url, "doctor", a, "--json").output)
    assert [f["level"] for f in doctor if f["level"] in ("error", "warning")] == [], doctor
    assert_restricted(pg, app)


def test_the_postgres_13_to_15_helper_is_created_only_when_missing(pg: Backend, app: Role) -> None:
    from spark_qtransport.transport.receiving.receiver import Receiver
    from spark_qtransport.transport.settings import ReceiveSettings

    a, error = app.address("A"), app.address("error")
    pg.create_queue(a)
    pg.create_queue(error)

    def start(url: str) -> None:
        r = Receiver(ReceiveSettings.create(url, a, error_queue=error, claim_ahead=False))
        r.endpoint.dialect = PostgresDialect(force_helper=True)
        try:
            assert r.table_id  # set up: claim table, helper function, consumer lock
        finally:
            r.close()

    start(pg.url)  # the owner creates the claim table and the helper function
    grant_printed(pg, app, "--queue", a, "--error-queue", error, "--for", "receiving", "--part", "queue",
                  "--part", "claims")
    start(app.url)  # both exist: no DDL
    with pg.connect() as c:
        assert c.execute("SELECT to_regprocedure(%s) IS NOT NULL",
                         (f'"{app.schema}".sqlqueue_poison_headers(text)',)).fetchone()[0]
    assert_restricted(pg, app)


def test_claim_tables_of_earlier_versions_are_used_as_they_are(pg: Backend, app: Role) -> None:
    """Claim tables an earlier version made: before its ``failed`` column, and with it (the sink
    marked the claims it failed there; now it marks them in ``SqlQueue.Failed``). A role with table
    privileges only reads from both as they are: no DDL, no finding of doctor's, and the column
    stays untouched."""
    a, b, error = app.address("A"), app.address("B"), app.address("error")
    for q in (a, b, error):
        pg.create_queue(q)
    for table, failed in (("A.Claims", ""), ("B.Claims", ", failed boolean")):  # as earlier versions made them
        with pg.connect() as c:
            c.execute(f'CREATE TABLE "{app.schema}"."{table}" (consumer text NOT NULL, claim_seq bigint GENERATED'
                      " ALWAYS AS IDENTITY, id uuid NOT NULL, expires timestamp, headers text NOT NULL, body bytea,"
                      f" source_seq bigint NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now(){failed},"
                      " PRIMARY KEY (consumer, claim_seq))")
    for q in (a, b):
        grant_printed(pg, app, "--queue", q, "--error-queue", error, "--for", "receiving", "--part", "queue",
                      "--part", "claims")
        pg.send_many(q, [(nsb_headers(f"{q}-{i}"), b"x") for i in range(3)])

    def columns(table: str) -> list[str]:
        with pg.connect() as c:
            return [r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
                                            " AND table_name = %s ORDER BY ordinal_position", (app.schema, table))]

    before = {t: columns(t) for t in ("A.Claims", "B.Claims")}
    for q, claims in ((a, '"A.Claims"'), (b, '"B.Claims"')):
        doctor = json.loads(cli(pg.url, "doctor", q, "--json").output)
        assert [f["level"] for f in doctor if f["table"].endswith(claims)] == ["info"], doctor  # "present"
        rows = receive_batch(Backend(app.url), q, error)
        assert sorted(row.message_id for row in rows) == [f"{q}-{i}" for i in range(3)]
        assert pg.count(q) == 0 and pg.held(q) == 0
    assert {t: columns(t) for t in ("A.Claims", "B.Claims")} == before
    assert_restricted(pg, app)


def test_vacuum_is_left_to_autovacuum_where_the_role_may_not_vacuum(
    pg: Backend, app: Role, caplog: pytest.LogCaptureFixture
) -> None:
    from psycopg import sql

    from spark_qtransport.transport.receiving import vacuum

    a, error = pg.create_queue(app.address("Vac")), pg.create_queue(app.address("error"))
    pg.send_many(a, [(nsb_headers(f"v{i}"), b"x") for i in range(20)])
    assert len(receive_batch(pg, a, error)) == 20  # the owner's run: the claim table has dead rows
    grant_printed(pg, app, "--queue", a, "--error-queue", error, "--for", "receiving", "--part", "queue",
                  "--part", "claims")
    claims = pg.address(pg.claims(a))
    role = Backend(app.url)
    caplog.set_level(logging.INFO, logger="spark_qtransport.vacuum")
    with role.connect(autocommit=False) as conn:
        for _ in range(3):
            assert not vacuum.vacuum_if_due(role.dialect, conn, claims, every=0, min_rows=0)
        conn.execute("SELECT 1")  # left usable, outside autocommit
        assert conn.autocommit is False
    said = [r for r in caplog.records if "autovacuum is relied on" in r.getMessage()]
    assert len(said) == 1 and pg.dialect.qualified(claims) in said[0].getMessage()
    with pg.connect(autocommit=False) as conn:  # the owner may
        assert vacuum.vacuum_if_due(pg.dialect, conn, claims, every=0, min_rows=0)
    with pg.connect() as c:  # PostgreSQL 17+: so may a role granted MAINTAIN
        if int(c.execute("SHOW server_version_num").fetchone()[0]) >= 170000:
            c.execute(_sql("GRANT MAINTAIN ON TABLE {}.{} TO {}", sql.Identifier(app.schema),
                           sql.Identifier(claims.table), sql.Identifier(app.name)))
            with role.connect(autocommit=False) as conn:
                assert vacuum.vacuum_if_due(role.dialect, conn, claims, every=0, min_rows=0)


def test_doctor_names_the_privileges_a_role_lacks(pg: Backend, app: Role, names: Any) -> None:
    from psycopg import sql

    a, error = app.address("Doc"), app.address("error")
    cli(pg.url, "create-queue", a, error, "--delayed")
    cli(pg.url, "create-outbox", a)
    receive_batch(pg, a, error)  # the claim table
    with pg.connect() as c:
        c.execute(_sql("GRANT USAGE ON SCHEMA {} TO {}", sql.Identifier(app.schema), sql.Identifier(app.name)))
        c.execute(_sql("GRANT SELECT ON {}.{}, {}.{} TO {}", sql.Identifier(app.schema), sql.Identifier("Doc"),
                       sql.Identifier(app.schema), sql.Identifier("Doc.Claims"), sql.Identifier(app.name)))
    failing = cli(app.url, "doctor", a, "--json", ok=False)
    assert failing.exit_code == 1
    findings = {(f["level"], f["table"]): f["finding"] for f in json.loads(failing.output)}
    queue, claims = pg.q(a), pg.q(f'{app.schema}."Doc.Claims"')
    assert findings[("error", queue)].startswith("the current role lacks INSERT, UPDATE, DELETE, USAGE ON SEQUENCE")
    assert "sqlqueue ddl --grant-to" in findings[("error", queue)]
    assert findings[("warning", claims)].startswith("the current role lacks INSERT, UPDATE, DELETE (")
    for suffix in ("Delayed", "Staging", "Outbox"):
        assert findings[("warning", pg.q(f'{app.schema}."Doc.{suffix}"'))].startswith(
            "the current role lacks SELECT, INSERT, UPDATE, DELETE")

    stranger = _new_role(pg, names("stranger"), app.schema)  # not even USAGE on the schema
    try:
        out = cli(stranger.url, "doctor", a, "--json", ok=False)
        assert out.exit_code == 1
        assert json.loads(out.output) == [{"level": "error", "table": queue, "finding": (
            f'the current role lacks USAGE ON SCHEMA {app.schema} (an endpoint needs SELECT, INSERT, UPDATE, '
            "DELETE here; sqlqueue ddl --grant-to ROLE prints the grants)")}]
    finally:
        _drop_role(pg, stranger)

    grant_printed(pg, app, "--queue", a, "--error-queue", error, "--for", "receiving", "--part", "queue",
                  "--part", "claims", "--part", "delayed")
    grant_printed(pg, app, "--queue", a, "--error-queue", error, "--for", "sending", "--part", "sender")
    ok = json.loads(cli(app.url, "doctor", a, "--json").output)
    ok = [f for f in ok if not f["finding"].startswith("max_prepared_transactions")]  # the server's, as advice
    assert [f["level"] for f in ok] == ["ok", "info", "info"], ok


def test_ddl_grant_to_prints_the_grants_for_both_dialects() -> None:
    pg_out = cli("", "ddl", "--grant-to", "app_role", "--queue", "Sales", "--destination", "Billing").output
    for line in (
        'GRANT USAGE ON SCHEMA "public" TO "app_role";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."Sales" TO "app_role";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."Sales.Claims" TO "app_role";',
        'GRANT SELECT, INSERT, DELETE ON TABLE "public"."SqlQueue.Batches" TO "app_role";',
        'GRANT SELECT, DELETE ON TABLE "public"."SqlQueue.Failed" TO "app_role";',
        'GRANT SELECT, UPDATE ON TABLE "public"."SqlQueue.Batches" TO "app_role";',
        'GRANT SELECT, INSERT ON TABLE "public"."SqlQueue.Failed" TO "app_role";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."Sales.Delayed" TO "app_role";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."Sales.Staging" TO "app_role";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."Sales.Outbox" TO "app_role";',
        'GRANT SELECT, INSERT ON TABLE "public"."Billing" TO "app_role";',
        'GRANT SELECT, INSERT ON TABLE "public"."error" TO "app_role";',
        'GRANT SELECT ON TABLE "public"."SubscriptionRouting" TO "app_role";',
    ):
        assert line in pg_out.splitlines(), line
    assert "pg_catalog.pg_get_serial_sequence('\"public\".\"Billing\"', 'seq')" in pg_out
    assert pg_out.count("GRANT USAGE ON SEQUENCE") == 4  # Sales and error (receiving), Billing and error (sending)
    assert "receiving endpoint" in pg_out and "sending endpoint" in pg_out

    ms_out = cli("", "ddl", "--dialect", "sqlserver", "--grant-to", "app role", "--queue", "Sales@[shop]",
                 "--destination", "Billing", "--for", "sending").output
    statements = [s.strip() for s in ms_out.split("GO") if s.strip()]
    assert statements[0].splitlines()[-2:] == ["SET ANSI_NULLS ON;", "SET QUOTED_IDENTIFIER ON;"]  # sqlcmd's defaults
    assert [s.splitlines()[-1] for s in statements[1:]] == [
        "GRANT SELECT, INSERT, UPDATE, DELETE ON [shop].[Sales.Staging] TO [app role]",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON [shop].[Sales.Outbox] TO [app role]",
        "GRANT SELECT, UPDATE ON [dbo].[SqlQueue.Batches] TO [app role]",
        "GRANT SELECT, INSERT ON [dbo].[SqlQueue.Failed] TO [app role]",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON [shop].[Sales.Delayed] TO [app role]",
        "GRANT SELECT, INSERT ON [dbo].[Billing] TO [app role]",
        "GRANT SELECT ON [dbo].[SubscriptionRouting] TO [app role]",
        "GRANT SELECT, INSERT ON [dbo].[error] TO [app role]",
    ]
    assert "receiving" not in ms_out and "SCHEMA" not in ms_out and "SEQUENCE" not in ms_out
    # a role name cannot end a comment line or the quoting
    odd = cli("", "ddl", "--grant-to", 'x"; DROP TABLE t; --\nGRANT', "--for", "receiving", "--part", "claims").output
    assert 'TO "x""; DROP TABLE t; --\nGRANT";' in odd
    assert odd.splitlines()[0] == '-- grants for role x"; DROP TABLE t; -- GRANT: receiving endpoint "public"."Sales" (postgres)'
    assert cli("", "ddl", "--destination", "Billing", ok=False).exit_code == 2


def test_privilege_statements_of_both_dialects() -> None:
    import sqlglot

    from spark_qtransport.dialects.postgres import PostgresDialect
    from spark_qtransport.dialects.sqlserver import SqlServerDialect
    from spark_qtransport.errors import ConfigError

    ms = SqlServerDialect()
    stmt = ms.privileges(ms.parse_address("Sales@[shop]"), ["select", "INSERT"])
    assert stmt.params == ("[shop].[Sales]",) and "(N'SELECT'), (N'INSERT')" in stmt.sql
    sqlglot.parse_one(stmt.sql.replace("?", "N'x'"), read="tsql")
    pg = PostgresDialect()
    stmt = pg.privileges(pg.parse_address("Sales"), ["SELECT"])
    assert stmt.params == {"schema": "public", "table": "Sales", "privileges": ["SELECT"]}
    assert "SEQUENCE" not in stmt.sql and "SEQUENCE" in pg.privileges(pg.parse_address("Sales"), ["INSERT"]).sql
    for d in (pg, ms):
        with pytest.raises(ConfigError, match="table privileges"):
            d.privileges(d.parse_address("Sales"), ["SELECT; DROP TABLE x"])
        with pytest.raises(ConfigError, match="table privileges"):
            d.grants("r", {d.parse_address("Sales"): ["TRUNCATE"]})
    grants = ms.grants("r", {ms.parse_address("Sales@[s]@[other db]"): ["SELECT"]})
    assert [g.sql for g in grants] == ["EXEC [other db].sys.sp_executesql N'GRANT SELECT ON [s].[Sales] TO [r]'"]


def test_the_idle_hint_of_a_sequence_the_role_may_not_read_is_no_row(pg: Backend, app: Role) -> None:
    """A stream tells an idle queue by its sequence (`receiving/quiet.py`); a role with table
    privileges only may not read it: the hint gives no row for it, not an error, so the queue is
    peeked as before. Our own queues (64-bit identity) and NServiceBus's (serial) are both found."""
    import psycopg
    from psycopg import sql

    from backends import PG_NSB_CREATE_QUEUE

    d = PostgresDialect()
    nsb, ours, plain = (d.parse_address(app.address(t)) for t in ("nsb", "ours", "plain"))
    with pg.connect() as c:
        c.execute(PG_NSB_CREATE_QUEUE.format(d.qualified(nsb)))
        for stmt in d.create_queue(ours):
            c.execute(stmt.sql, stmt.params)
        c.execute(f"CREATE TABLE {d.qualified(plain)} (id uuid)")
        c.execute(_sql("GRANT SELECT, DELETE ON ALL TABLES IN SCHEMA {} TO {}",
                       sql.Identifier(app.schema), sql.Identifier(app.name)))
    found = d.sequences_of([nsb, ours, plain, d.parse_address(app.address("missing"))])
    with pg.connect() as c:
        rows = sorted(c.execute(found.sql, found.params).fetchall())
        assert [i for i, _, _ in rows] == [0, 1]
        values = d.sequence_values([s for _, s, _ in rows])
        assert sorted(c.execute(values.sql, values.params).fetchall()) == [(0, 0), (1, 0)]
    with psycopg.connect(app.url) as c:
        assert c.execute(values.sql, values.params).fetchall() == []
