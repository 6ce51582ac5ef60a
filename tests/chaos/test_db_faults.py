"""Database faults aimed at each phase of a queue -> Spark -> queue pipeline.

The connector's session is terminated by the server (``pg_terminate_backend``, what a failover or
an administrator does) at one chosen moment:

- claim:    inside the claim transaction (driver), when it inserts into ``<queue>.Claims``
- read:     while an executor reads its slice (between two pages of its read transaction)
- ack:      inside an acknowledgement (driver), when it deletes from ``<queue>.Claims``
- staging:  inside a task's staging transaction (executor), when it copies into ``<endpoint>.Staging``
- dispatch: inside the dispatch transaction (driver), when it inserts into the destination queue

Every phase retries on a new connection, so the query rides through: it finishes without an error,
and every message is at the output exactly once, nothing is left claimed or staged.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest

from backends import Backend, nsb_headers
from report import section

pytestmark = [pytest.mark.slow(reason="a session terminated in each phase, ridden through each time"), pytest.mark.usefixtures("spark")]

#: messages sent before each run: one batch a run; for the read, one slice of 6,000 rows, which it
#: reads in pages (1, 4, 16, ... 5,000 rows), so that the watcher finds its transaction open between two
MESSAGES = {"read": 6000}


class ReadKiller(threading.Thread):
    """A read has no trigger to hook: watch for a session in the middle of a slice's read (a page
    of the claim table's or a prepared claim's rows read, its transaction still open) and
    terminate it, once."""

    def __init__(self, pg: Backend) -> None:
        super().__init__(daemon=True)
        self.pg, self.done, self.terminated = pg, threading.Event(), 0

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.pg.url, autocommit=True) as c:
            while not self.done.is_set() and not self.terminated:
                self.terminated = sum(1 for (ok,) in c.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = 'spark-qtransport' AND state <> 'idle'"
                    " AND (query LIKE 'SELECT claim_seq, id::text%' OR query LIKE 'SELECT $1 + q.seq%')"
                    " LIMIT 1") if ok)
                time.sleep(0.002)


def arm(pg: Backend, table: str, event: str, tag: str) -> str:
    """A statement trigger on `table` that terminates the connector session firing it, once.
    Returns the sequence that counts the connector's statements there (1: the fault fired)."""
    seq, fn = f"fault_seq_{tag}", f"fault_fn_{tag}"
    with pg.connect() as c:
        c.execute(f"CREATE SEQUENCE {seq}")
        c.execute(
            f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF current_setting('application_name') = 'spark-qtransport' "
            f"AND nextval('public.{seq}') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF; "
            "RETURN NULL; END $$"
        )
        c.execute(f"CREATE TRIGGER fault_{tag} AFTER {event} ON {pg.q(table)} FOR EACH STATEMENT EXECUTE FUNCTION {fn}()")
    return seq


def pipeline(spark: Any, pg: Backend, q: str, out: str, e: str, checkpoint: str, *, per_batch: int, slices: int,
             inline_bytes: int = 256 * 2**20, claim_mode: str = "auto") -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
        .option("maxMessagesPerTrigger", str(per_batch)).option("numPartitions", str(slices))
        .option("claimAhead", "false").option("claimMode", claim_mode).load()
        .select("body", F.concat("message_id", F.lit("-out")).alias("message_id"),
                F.lit("Faults.Out").alias("message_type"))
        .writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", q).option("destination", out)
        .option("checkpointLocation", checkpoint).option("inlineBytes", str(inline_bytes))
        .trigger(availableNow=True).start()
    )


PHASES = ["claim", "read", "ack", "staging", "dispatch"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_session_terminated_in_each_phase_is_ridden_through(
    spark: Any, pg: Backend, names: Any, checkpoint: str, phase: str
) -> None:
    n = MESSAGES.get(phase, 2000)
    run = functools.partial(pipeline, spark, pg, q := pg.create_queue(names("Faults")), out := pg.create_queue(names("Out")),
                            e := pg.create_queue(names("error")), checkpoint, per_batch=n, slices=1 if phase == "read" else 2,
                            inline_bytes=0 if phase == "staging" else 256 * 2**20,  # staging: tasks that stage
                            # the claim's INSERT into the claim table and the acknowledgement's DELETE
                            # from it, which a trigger can fault (a prepared claim writes only its queue,
                            # and its acknowledgement is COMMIT PREPARED, no statement a trigger sees:
                            # test_prepared kills the job around them)
                            claim_mode="table" if phase in ("claim", "ack") else "auto")
    pg.send_many(q, [(nsb_headers(f"m{i:05d}"), b"x" * 512) for i in range(n)])
    # the first query creates the claim and staging tables; the fault is armed on them before the second
    first = run()
    first.awaitTermination(300)
    assert first.exception() is None, first.exception()
    pg.send_many(q, [(nsb_headers(f"n{i:05d}"), b"y" * 512) for i in range(n)])

    killer, seq = None, None
    if phase == "read":
        killer = ReadKiller(pg)
        killer.start()
    else:
        table, event = {"claim": (pg.claims(q), "INSERT"), "ack": (pg.claims(q), "DELETE"),
                        "staging": (f'"{q}.Staging"', "INSERT"), "dispatch": (out, "INSERT")}[phase]
        seq = arm(pg, table, event, names.tag)
    try:
        query = run()
        query.awaitTermination(300)
    finally:
        if killer is not None:
            killer.done.set()
            killer.join(10)
    assert not query.isActive
    assert query.exception() is None, f"the query did not ride through a fault in {phase}: {query.exception()}"

    fired = 0
    if killer is not None:
        assert killer.terminated == 1, "a read was caught and terminated"
    else:
        with pg.connect() as c:
            fired, called = c.execute(f"SELECT last_value, is_called FROM {seq}").fetchone()
        assert called and fired >= 2, f"the {phase} fault fired once and the phase ran again ({fired})"

    again = run()  # releases the last batch's claims
    again.awaitTermination(300)
    assert again.exception() is None, again.exception()
    with pg.connect() as c:
        ids = [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.MessageId' FROM {pg.q(out)}")]
    expected = {f"{p}{i:05d}-out" for p in "mn" for i in range(n)}
    figures = {"phase": phase, "terminated": killer.terminated if killer else int(fired >= 2), "ridden through": "yes",
               "messages": len(expected), "lost": len(expected - set(ids)), "duplicated": len(ids) - len(set(ids)),
               "left claimed": pg.count(pg.claims(q)), "left staged": pg.count(f'"{q}.Staging"')}
    section("db-faults-", [
        "## Database faults aimed at each phase",
        "",
        "queue -> Spark -> queue; the connector's session is terminated once inside the phase (a statement",
        "trigger calling `pg_terminate_backend(pg_backend_pid())`; for the read, a watcher that finds the",
        "slice's cursor open between two fetches). Reproduce: `.venv/bin/python -m pytest tests/chaos/test_db_faults.py`.",
        "",
        "| phase | sessions terminated | query rode through | messages | lost | duplicated | left claimed | left staged |",
        "|---|---|---|---|---|---|---|---|",
    ], {})
    section(f"db-faults-{PHASES.index(phase)}-{phase}", ["| " + " | ".join(str(v) for v in figures.values()) + " |"], figures)
    assert len(ids) == len(set(ids)), "no message was sent twice"
    assert set(ids) == expected, "every message was sent"
    assert pg.count(q) == 0 and pg.count(e) == 0
    assert pg.count(pg.claims(q)) == 0, "nothing is left claimed"
    assert pg.count(f'"{q}.Staging"') == 0, "nothing is left staged"
