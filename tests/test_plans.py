"""Plans of the claim and the dispatch stay linear in the batch when statistics lag the tables.

Queue and staging tables swing between empty and large faster than statistics follow. Seen on a
backlog of 1,000,000 messages: a claim that read and classified every row above the low-water
mark (5.6 s for 300,000 rows), and a dispatch that joined a staging table last vacuumed empty with
a nested loop over a full index scan (10 s for 12,000 rows). Both are checked here on their plans,
not on timings.
"""

from __future__ import annotations

from typing import Any

from backends import Backend, Sender
from spark_qtransport.transport import session as db


def plan(conn: Any, stmts: list[Any]) -> str:
    *hints, stmt = stmts
    for h in hints:
        db.execute(conn.cursor(), h)
    return "\n".join(r[0] for r in conn.execute("EXPLAIN " + stmt.sql, stmt.params).fetchall())


def test_a_claim_on_a_queue_with_stale_statistics_walks_the_index(pg: Backend, names: Any) -> None:
    q, e = pg.create_queue(names("Stale")), pg.create_queue(names("error"))
    with pg.connect() as c:
        c.execute(f"ANALYZE {pg.q(q)}")  # analyzed empty, then a backlog arrives
        c.execute(f"INSERT INTO {pg.q(q)} (id, headers, body) SELECT gen_random_uuid(), '{{}}', NULL"
                  " FROM generate_series(1, 50000)")
    d = pg.dialect
    claims = d.claims_table(pg.address(q))
    with pg.connect() as c:
        for stmt in d.create_claims(claims):
            db.execute(c.cursor(), stmt)
    with pg.connect(autocommit=False) as c:
        text = plan(c, d.claim(pg.address(q), claims, pg.address(e), consumer="x", limit=20000, after=100, upto=None))
        c.rollback()
    picked = text.split("CTE gone")[0]
    assert "Index Scan using" in picked and "Bitmap Heap Scan" not in picked and "Seq Scan" not in picked, text


def test_a_dispatch_after_the_staging_table_was_vacuumed_empty_joins_linearly(pg: Backend, names: Any) -> None:
    src, out = pg.create_queue(names("Src")), pg.create_queue(names("Out"))
    sender = Sender(pg, src, destination=out)
    staging = pg.q(f'"{src}.Staging"')
    first = sender.stage([{"body": b"x", "message_type": "T", "message_id": f"a{i}"} for i in range(3000)], 0)
    sender.dispatch(0, [first])
    with pg.connect() as c:
        c.execute(f"ALTER TABLE {staging} SET (vacuum_truncate = false)")  # as when the truncation lock is busy
        c.execute(f"VACUUM {staging}")  # statistics now say: no rows in all those pages
    report = sender.stage([{"body": b"x", "message_type": "T", "message_id": f"b{i}"} for i in range(3000)], 1)
    d = pg.dialect
    stmt = d.dispatch(sender.options.staging, pg.address(out), attempts=[report.attempt], route=report.routes[0][1],
                      publish_routes=[])
    with pg.connect(autocommit=False) as c:
        text = plan(c, [*d.dispatch_plans(), stmt])
        c.rollback()
    assert "Nested Loop" not in text, text
    assert sender.dispatch(1, [report]).sent == 3000


def test_acknowledging_claims_with_stale_statistics_deletes_by_row_address(pg: Backend, names: Any) -> None:
    """The claim table last vacuumed empty, then a batch claimed: the acknowledgement picks its
    rows once and deletes them by TID (a semi join here took 290 s for 10,000 claims)."""
    d = pg.dialect
    claims = d.claims_table(pg.address(names("Stale")))
    t = d.qualified(claims)
    with pg.connect() as c:
        for stmt in d.create_claims(claims):
            db.execute(c.cursor(), stmt)
        fill = f"INSERT INTO {t} (consumer, id, headers, body, source_seq) SELECT 'x', gen_random_uuid(), '{{}}', NULL, g FROM generate_series(1, %s) g"
        c.execute(fill, (2000,))
        c.execute(f"DELETE FROM {t}")
        c.execute(f"ALTER TABLE {t} SET (vacuum_truncate = false)")
        c.execute(f"VACUUM {t}")
        c.execute(fill, (5000,))
    with pg.connect() as c:
        first = c.execute(f"SELECT min(claim_seq) FROM {t}").fetchone()[0]
    ack = d.ack_claims(claims, "x", upto=first + 1499, batch=1000)
    with pg.connect(autocommit=False) as c:
        text = plan(c, [ack])
        deleted = c.execute(ack.sql, ack.params).rowcount
        left = c.execute(f"SELECT min(claim_seq) FROM {t}").fetchone()[0]
        c.rollback()
    assert "Tid Scan" in text and "Nested Loop" not in text, text
    assert (deleted, left) == (1000, first + 1000), "the oldest 1,000 claims, no more"
