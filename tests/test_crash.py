"""Crash test: a queue -> Spark -> idempotent sink job is SIGKILLed at awkward points and restarted.

Every process the job started dies with it (driver, JVM, Python workers: pyspark.daemon moves
workers into their own process group, so they are found by an environment tag, not by group).
After each kill the job restarts from its checkpoint; at the end every message has reached the
sink exactly once and the queue is empty.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, nsb_headers
from processes import START, Job, kill_at_random, run_to_end, wait_for

pytestmark = pytest.mark.slow(reason="job processes SIGKILLed at awkward points, then restarted")

CHILD = Path(__file__).with_name("crash_child.py")


def unstall(pg: Backend, table: str, stalled: Any) -> None:
    """Drop the stalling trigger of `table` and wait until the killed job's stalled transaction is
    gone: the server notices the dead client within client_connection_check_interval."""
    with pg.connect() as c:
        c.execute(f"DROP TRIGGER stall ON {table}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and stalled():
        time.sleep(0.1)
    assert not stalled()


def test_sigkill_at_awkward_points_loses_and_duplicates_nothing(pg: Backend, names: Any, tmp_path: Path) -> None:
    q, e = pg.create_queue(names("Orders")), pg.create_queue(names("error"))
    sink = names("sink")
    claims = pg.claims(q)
    with pg.connect() as c:
        c.execute(f'CREATE TABLE "{sink}" (message_id text PRIMARY KEY, batch_id bigint)')
        c.execute(f'CREATE TABLE "{sink}_log" (message_id text, batch_id bigint)')
    checkpoint, markers, log = tmp_path / "ckpt", tmp_path / "markers", tmp_path / "job.log"
    markers.mkdir()
    # executors and the driver notice a dead peer quickly, so a killed claim rolls back at once
    url = pg.url + "?options=-c%20client_connection_check_interval%3D200"
    args = [url, q, e, str(checkpoint), sink, str(markers)]
    sent = 0

    def produce(n: int) -> None:
        nonlocal sent
        pg.send_many(q, [(nsb_headers(f"m{sent + i:06d}"), b'{"n": 1}') for i in range(n)])
        sent += n

    def delivered() -> int:
        with pg.connect() as c:
            return int(c.execute(f'SELECT count(*) FROM "{sink}"').fetchone()[0])

    produce(1500)
    kills: list[str] = []

    # 1. during the claim: a trigger holds the claim transaction after its DELETE ran (on the claim
    # table's insert: this run holds its claims there, whatever the server allows; the later runs
    # hold them where `claimMode` auto decides, and go on from this run's checkpoint)
    job = Job(CHILD, args, log=log, env={"CRASH_CLAIM_MODE": "table"})
    wait_for(lambda: delivered() > 0, START, "a first batch", job)
    with pg.connect() as c:
        c.execute(
            "CREATE OR REPLACE FUNCTION sqlqueue_test_stall() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(600); RETURN NEW; END $$"
        )
        c.execute(f"CREATE TRIGGER stall BEFORE INSERT ON {claims} FOR EACH ROW EXECUTE FUNCTION sqlqueue_test_stall()")

    def claim_stalled() -> bool:
        with pg.connect() as c:
            return bool(c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE '%%WITH picked%%'"
            ).fetchone()[0])

    wait_for(claim_stalled, START, "a stalled claim", job)
    queued_before = pg.count(q)
    job.kill()
    kills.append("during claim")
    unstall(pg, claims, claim_stalled)
    assert pg.count(q) == queued_before  # the killed claim rolled back: nothing left the queue

    # 2. during the read of a batch, in an executor
    produce(500)
    job = Job(CHILD, args, "during_read", log=log)
    wait_for(lambda: (markers / "during_read").exists(), START, "a read in progress", job)
    job.kill()
    kills.append("during read")

    # 3. after the sink committed a batch, before Spark's commit log entry
    produce(500)
    job = Job(CHILD, args, "after_sink", log=log)
    wait_for(lambda: (markers / "after_sink").exists(), START, "a written batch", job)
    job.kill()
    kills.append("after sink, before checkpoint commit")

    # 4. at a random moment while producers keep sending (tests/chaos/test_crash_loop.py kills at
    # random under a producer in its own right: twice in make test, 20 times in make chaos)
    kills += kill_at_random(CHILD, args, lambda: produce(500), log=log, markers=markers, times=1)

    # finally: restart and drain everything that is there
    produce(300)
    run_to_end(CHILD, args, log=log)

    with pg.connect() as c:
        ids = [r[0] for r in c.execute(f'SELECT message_id FROM "{sink}" ORDER BY message_id')]
        deliveries = int(c.execute(f'SELECT count(*) FROM "{sink}_log"').fetchone()[0])
    assert len(kills) == 4
    assert ids == [f"m{i:06d}" for i in range(sent)], "every message reached the sink exactly once"
    assert deliveries >= sent  # redeliveries happen (at-least-once) and the sink's key absorbs them
    assert pg.count(q) == 0
    assert pg.count(e) == 0
    assert pg.count(claims) <= 400  # only the last batch's claims, acknowledged on the next run


def test_killing_only_the_driver_process_and_restarting_at_once(pg: Backend, names: Any, tmp_path: Path) -> None:
    """The way an operator (or a scheduler) kills a job: SIGKILL to the driver's Python process
    only, and an immediate restart while the old JVM and workers may still be exiting."""
    q, e = pg.create_queue(names("Orders")), pg.create_queue(names("error"))
    sink = names("sink")
    with pg.connect() as c:
        c.execute(f'CREATE TABLE "{sink}" (message_id text PRIMARY KEY, batch_id bigint)')
        c.execute(f'CREATE TABLE "{sink}_log" (message_id text, batch_id bigint)')
    markers = tmp_path / "markers"
    markers.mkdir()
    args = [pg.url, q, e, str(tmp_path / "ckpt"), sink, str(markers)]
    pg.send_many(q, [(nsb_headers(f"m{i:05d}"), b"x") for i in range(2000)])
    first = Job(CHILD, args, "after_sink", log=tmp_path / "job.log")
    wait_for(lambda: (markers / "after_sink").exists(), START, "a written batch", first)
    os.kill(first.proc.pid, signal.SIGKILL)  # the driver only
    second = Job(CHILD, [*args, "available-now"], log=tmp_path / "job2.log")  # at once
    try:
        assert second.wait(300) == 0, (tmp_path / "job2.log").read_text()[-3000:]
    finally:
        first.kill()
    with pg.connect() as c:
        ids = [r[0] for r in c.execute(f'SELECT message_id FROM "{sink}" ORDER BY message_id')]
    assert ids == [f"m{i:05d}" for i in range(2000)]
    assert pg.count(q) == 0


def test_audit_copies_are_exactly_once_when_killed_during_acknowledgement(
    pg: Backend, names: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,800 NServiceBus-written messages (a few expired, one poison) through a job with
    ``auditQueue``, SIGKILLed while an acknowledgement writes its audit copies: every delivered
    message is audited exactly once, as it was, with NServiceBus's audit headers in order; no
    expired or poison message is audited."""
    import json
    from datetime import datetime, timezone

    from spark_qtransport.wire import H, format_time, parse_time

    q = pg.create_queue(names("Orders"), nsb=True)  # NServiceBus's own DDL
    e, audit = (pg.create_queue(names(n)) for n in ("error", "audit"))
    sink = names("sink")
    with pg.connect() as c:
        c.execute(f'CREATE TABLE "{sink}" (message_id text PRIMARY KEY, batch_id bigint)')
        c.execute(f'CREATE TABLE "{sink}_log" (message_id text, batch_id bigint)')
    markers, log = tmp_path / "markers", tmp_path / "job.log"
    markers.mkdir()
    monkeypatch.setenv("CRASH_AUDIT_QUEUE", audit)
    url = pg.url + "?options=-c%20client_connection_check_interval%3D200"
    args = [url, q, e, str(tmp_path / "ckpt"), sink, str(markers)]
    sent: dict[str, tuple[dict[str, str], bytes]] = {}

    def produce(n: int) -> None:
        base, now = len(sent), format_time(datetime.now(timezone.utc))
        batch = [(nsb_headers(f"m{base + i:06d}", **{H.TIME_SENT: now}), f'{{"n": {base + i}, "s": "\u00e9\\/"}}'.encode())
                 for i in range(n)]
        pg.send_many(q, batch)
        sent.update((h["NServiceBus.MessageId"], (h, b)) for h, b in batch)

    produce(1000)
    for i in range(3):
        pg.send(q, nsb_headers(f"expired{i}"), b"old", ttbr_ms=1)
    pg.send(q, "{poison", b"p")
    produce(600)

    # 1. while an acknowledgement writes its audit copies: the copies and the deletes roll back together
    with pg.connect() as c:
        c.execute("CREATE OR REPLACE FUNCTION sqlqueue_test_stall() RETURNS trigger LANGUAGE plpgsql AS "
                  "$$ BEGIN PERFORM pg_sleep(600); RETURN NEW; END $$")
    job = Job(CHILD, args, log=log)
    wait_for(lambda: any(markers.glob("batch-*")), START, "a first batch", job)
    with pg.connect() as c:
        c.execute(f"CREATE TRIGGER stall BEFORE INSERT ON {pg.q(audit)} FOR EACH ROW EXECUTE FUNCTION sqlqueue_test_stall()")

    def ack_stalled() -> bool:
        with pg.connect() as c:
            return bool(c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                                  " AND query LIKE '%%INSERT INTO%%'").fetchone()[0])

    wait_for(ack_stalled, START, "a stalled acknowledgement", job)
    job.kill()
    unstall(pg, pg.q(audit), ack_stalled)

    # 2. then drain to the end (audit copies under random kills: tests/chaos/test_crash_loop.py)
    produce(200)
    run_to_end(CHILD, args, log=log)

    with pg.connect() as c:
        delivered = [r[0] for r in c.execute(f'SELECT message_id FROM "{sink}" ORDER BY message_id')]
        rows = c.execute(f"SELECT headers, body FROM {pg.q(audit)}").fetchall()
    assert delivered == sorted(sent)
    audited = [(json.loads(h), bytes(b)) for h, b in rows]
    ids = [h[H.MESSAGE_ID] for h, _ in audited]
    # the run's last batch stays claimed until a next run acknowledges it (the crash test above)
    left = pg.count(pg.claims(q))
    assert len(ids) == len(set(ids)) == len(sent) - left, "each acknowledged message audited exactly once"
    assert pg.count(e) == 1  # the poison message, raw
    for headers, body in audited:
        original, original_body = sent[headers[H.MESSAGE_ID]]
        assert body == original_body
        assert {k: v for k, v in headers.items() if k in original} == original
        sent_at, started, ended = (parse_time(headers[k]) for k in (H.TIME_SENT, H.PROCESSING_STARTED, H.PROCESSING_ENDED))
        assert sent_at is not None and started is not None and ended is not None
        assert sent_at <= started <= ended and headers[H.PROCESSING_ENDPOINT] == q
