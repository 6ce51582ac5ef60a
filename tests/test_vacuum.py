"""Vacuum of the connector's own tables (claims, staging) on a real PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import sqlglot

from backends import Backend, nsb_headers, receive_batch
from spark_qtransport.dialects.sqlserver import SqlServerDialect
from spark_qtransport.transport.receiving.vacuum import vacuum_if_due


def stats(pg: Backend, table: str) -> tuple[int, int]:
    """(dead rows, vacuums) of a table, from the server's statistics."""
    with pg.connect() as c:
        row = c.execute("SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relid = to_regclass(%s)",
                        (pg.q(table),)).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def wait_for_stats(pg: Backend, table: str, ok: Any) -> tuple[int, int]:
    deadline = time.monotonic() + 15  # statistics reach the view a moment after the transaction
    while not ok(s := stats(pg, table)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return s


def test_acknowledged_claims_are_vacuumed_when_enough_are_dead(pg: Backend, names: Any) -> None:
    q, e = pg.create_queue(names("Vac")), pg.create_queue(names("error"))
    pg.let_go_prepared()  # a prepared claim an earlier test left holds vacuum back (SQLQUEUE_TEST_PREPARED_SLOTS)
    pg.send_many(q, [(nsb_headers(f"v{i}"), b"x" * 100) for i in range(1500)])
    # claimed into the claim table, read, acknowledged: 1,500 dead claims (a prepared claim writes none)
    assert len(receive_batch(pg, q, e, limit=1500, claim_mode="table")) == 1500
    claims = pg.claims(q)
    dead, before = wait_for_stats(pg, claims, lambda s: s[0] >= 1500)
    assert dead >= 1500
    conn = pg.connect(autocommit=False)
    try:
        assert not vacuum_if_due(pg.dialect, conn, pg.address(claims), every=0, min_rows=2000), "too few dead rows"
        assert vacuum_if_due(pg.dialect, conn, pg.address(claims), every=0, min_rows=1000)
        dead, after = wait_for_stats(pg, claims, lambda s: s[1] > before)
        assert (dead, after) == (0, before + 1)
        assert not vacuum_if_due(pg.dialect, conn, pg.address(claims), every=3600, min_rows=0), "vacuumed just now"
        assert conn.autocommit is False  # the connection is left as it was found
        conn.execute("SELECT 1")
    finally:
        conn.close()


def test_a_failed_vacuum_is_logged_not_raised(pg: Backend, names: Any) -> None:
    with pg.connect(autocommit=False) as conn:
        assert not vacuum_if_due(pg.dialect, conn, pg.address(names("NoSuchTable")), every=0, min_rows=0)
        conn.close()
        assert not vacuum_if_due(pg.dialect, conn, pg.address(names("Closed")), every=0, min_rows=0)


def test_postgres_vacuum_sql() -> None:
    from spark_qtransport.dialects.postgres import PostgresDialect

    d = PostgresDialect()
    claims = d.claims_table(d.parse_address("Sales"))
    due = d.vacuum_due(claims, every_seconds=10, min_rows=1000)
    assert due is not None and due.params == {"rows": 1000, "every": 10.0, "table": '"public"."Sales.Claims"'}
    sqlglot.parse_one(due.sql.replace("%(", "(").replace(")s", ")"), read="postgres")
    assert d.vacuum(claims).sql == 'VACUUM (SKIP_LOCKED) "public"."Sales.Claims"'


def test_sql_server_reclaims_by_itself() -> None:
    d = SqlServerDialect()
    assert d.vacuum_due(d.parse_address("Sales"), every_seconds=0, min_rows=0) is None
    assert vacuum_if_due(d, object(), d.parse_address("Sales"), every=0, min_rows=0) is False
