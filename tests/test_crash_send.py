"""Crash tests of the send side: queue -> Spark -> queue, SIGKILLed while tasks stage (a run whose
tasks stage: inlineBytes 0), inside the dispatch transaction of rows the tasks handed the driver
(before and after the COPY into the destination), after the dispatch committed but before Spark's
checkpoint commit, and at random moments; after each kill the job restarts from its checkpoint,
staging or not as the next run is set, so replays cross from one way to the other. At the end every output
message is in the destination queue exactly once and nothing is left staged.

The job is stopped at each point by a database trigger that sleeps, on the table that point
writes; the test kills the job while the trigger sleeps, then drops the trigger.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from backends import Backend, nsb_headers
from processes import START, Job, run_to_end, wait_for
from spark_qtransport.cli import main

pytestmark = pytest.mark.slow(reason="job processes SIGKILLed at points of the send side, then restarted")

CHILD = Path(__file__).with_name("send_crash_child.py")
#: the kill test rejects every FAIL_EVERY-th message with fail()
FAIL_EVERY = 7

#: worker kills per mode of the worker test (tasks that hand their rows over, tasks that stage)
ROUNDS = 3
#: point -> (table suffix or "out", trigger timing, level, the job's inlineBytes)
POINTS = {
    "while staging": ("Staging", "BEFORE INSERT", "FOR EACH STATEMENT", "0"),
    "after the tasks, dispatch begun": ("Outbox", "BEFORE INSERT", "FOR EACH ROW", "268435456"),
    "inside dispatch, after the COPY into the destination": ("out", "AFTER INSERT", "FOR EACH STATEMENT", "268435456"),
    "after dispatch commit, before checkpoint commit": ("Outbox", "BEFORE DELETE", "FOR EACH STATEMENT", "0"),
}


def test_sigkill_while_sending_loses_and_duplicates_nothing(pg: Backend, names: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every seventh message is rejected with fail() and the reader audits: after every kill, each
    rejected message is in the error queue once and never audited, each other one sent and
    audited once (the dispatch marks the claims it failed in its own transaction)."""
    q, out, e = pg.create_queue(names("Orders")), pg.create_queue(names("Out")), pg.create_queue(names("error"))
    audit = pg.create_queue(names("audit"))
    monkeypatch.setenv("SQLQUEUE_CHILD_AUDIT_QUEUE", audit)
    monkeypatch.setenv("SQLQUEUE_CHILD_FAIL_EVERY", str(FAIL_EVERY))
    markers, log = tmp_path / "markers", tmp_path / "job.log"
    markers.mkdir()
    url = pg.url + "?options=-c%20client_connection_check_interval%3D200"
    args = [url, q, out, e, str(tmp_path / "ckpt"), str(markers)]
    sent = 0

    def produce(n: int) -> None:
        nonlocal sent
        pg.send_many(q, [(nsb_headers(f"m{sent + i:06d}"), b'{"n": 1}') for i in range(n)])
        sent += n

    def stalled() -> bool:
        with pg.connect() as c:
            return bool(c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'").fetchone()[0])

    with pg.connect() as c:
        c.execute("CREATE OR REPLACE FUNCTION sqlqueue_test_stall() RETURNS trigger LANGUAGE plpgsql AS "
                  "$$ BEGIN PERFORM pg_sleep(600); RETURN NULL; END $$")
    # the endpoint's tables the stalls need, as a DBA creates them (the final run covers a clean run)
    produce(300)
    created = CliRunner().invoke(main, ["create-outbox", q], env={"SQLQUEUE_URL": pg.url})
    assert created.exit_code == 0, created.output
    kills = []
    for point, (table, timing, level, inline_bytes) in POINTS.items():
        produce(400)
        target = f'"{out}"' if table == "out" else f'"{q}.{table}"'
        if timing == "BEFORE INSERT" and level == "FOR EACH ROW":
            # a BEFORE ROW trigger returning NULL would skip the row: sleep, then let it through
            body = "$$ BEGIN PERFORM pg_sleep(600); RETURN NEW; END $$"
            with pg.connect() as c:
                c.execute("CREATE OR REPLACE FUNCTION sqlqueue_test_stall_row() RETURNS trigger LANGUAGE plpgsql AS " + body)
            function = "sqlqueue_test_stall_row"
        else:
            function = "sqlqueue_test_stall"
        with pg.connect() as c:
            c.execute(f"CREATE TRIGGER stall {timing} ON {target} {level} EXECUTE FUNCTION {function}()")
        job = Job(CHILD, args, log=log, env={"SQLQUEUE_CHILD_INLINE_BYTES": inline_bytes})
        try:
            wait_for(stalled, START, f"the job to stall {point}", job)
        finally:
            job.kill()
            # A killed client's statement runs on until it next talks to the client (a COPY in
            # progress is not interrupted by client_connection_check_interval): end it the way
            # the statement's own end would, rolling its transaction back.
            with pg.connect() as c:
                c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
                c.execute(f"DROP TRIGGER stall ON {target}")
        kills.append(point)

    # random kills of this job under a producer: tests/chaos/test_crash_loop.py (twice in make test)

    produce(200)
    run_to_end(CHILD, args, log=log)

    def ids_in(table: str) -> list[str]:
        with pg.connect() as c:
            return [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.MessageId' FROM \"{table}\" ORDER BY 1")]

    ids, failed, audited = ids_in(out), ids_in(e), ids_in(audit)
    assert len(kills) == len(POINTS)
    assert len(ids) == len(set(ids)), "no message was sent twice"
    assert ids == [f"m{i:06d}-out" for i in range(sent) if i % FAIL_EVERY], "every message was sent"
    assert failed == [f"m{i:06d}" for i in range(0, sent, FAIL_EVERY)], "every rejected message failed once"
    assert audited == [f"m{i:06d}" for i in range(sent) if i % FAIL_EVERY], "only what succeeded is audited, once"
    assert pg.count(q) == 0
    assert pg.count(f'"{q}.Staging"') == 0, "nothing is left staged"


def _task_workers(job: Job) -> list[psutil.Process]:
    """The job's Python workers that run tasks (read and write): the children pyspark.daemon forks."""
    found = []
    for p in job.processes():
        try:
            if p.cmdline()[-2:] == ["pyspark.daemon", "pyspark.worker"] and p.parent().cmdline()[-1:] == ["pyspark.worker"]:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _retried(log: Path) -> int:
    """How many times Spark has met a task's Python worker dead so far."""
    return log.read_text(errors="replace").count("Python worker exited unexpectedly") if log.exists() else 0


def _busy_first(workers: list[psutil.Process]) -> list[psutil.Process]:
    """The workers that used CPU in the last 0.2 s, or all of them when none did: a kill must hit a
    running task to be retried, and an idle reused worker's death is met by no task."""
    for w in workers:
        with contextlib.suppress(psutil.Error):
            w.cpu_percent(None)
    time.sleep(0.2)
    busy = []
    for w in workers:
        with contextlib.suppress(psutil.Error):
            if w.cpu_percent(None) > 0:
                busy.append(w)
    return busy or workers


def _last_batch(markers: Path) -> int:
    return max((int(m.name.split("-")[1]) for m in markers.glob("batch-*")), default=-1)


def _wait_for_batch_after(batch: int, markers: Path, job: Job, what: str) -> None:
    wait_for(lambda: _last_batch(markers) > batch, START, what, job)


def test_killed_task_workers_are_retried_and_nothing_is_lost_or_sent_twice(
        pg: Backend, names: Any, tmp_path: Path) -> None:
    """A cluster loses executors' Python workers at any moment, the driver lives on. With task
    retries (``local[2,8]``, as a cluster's spark.task.maxFailures) Spark runs a killed read or write
    again: a retried read gives the same slice, a killed writer's staged rows are never dispatched,
    and a killed small task has handed nothing over. The query lives through every kill."""
    q, out, e = pg.create_queue(names("Orders")), pg.create_queue(names("Out")), pg.create_queue(names("error"))
    markers, log = tmp_path / "markers", tmp_path / "job.log"
    markers.mkdir()
    args = [pg.url, q, out, e, str(tmp_path / "ckpt"), str(markers)]
    sent = 0

    def produce(n: int) -> None:
        nonlocal sent
        pg.send_many(q, [(nsb_headers(f"m{sent + i:06d}"), b'{"n": 1}') for i in range(n)])
        sent += n

    seed = int(os.environ.get("SQLQUEUE_CRASH_SEED", "20261123"))
    print(f"worker kills: SQLQUEUE_CRASH_SEED={seed}")
    rnd = random.Random(seed)
    killed = 0
    for inline_bytes in ("268435456", "0"):  # tasks that hand their rows over, then tasks that stage
        produce(500)
        before = _last_batch(markers)
        job = Job(CHILD, args, log=log, env={"SQLQUEUE_CHILD_MASTER": "local[2,8]",
                                             "SQLQUEUE_CHILD_MAX_MESSAGES": "1000",
                                             "SQLQUEUE_CHILD_INLINE_BYTES": inline_bytes})
        try:
            _wait_for_batch_after(before, markers, job, "the job to run a batch")
            retried_before = _retried(log)
            round_ = 0
            # ROUNDS kills, and more (up to 3 * ROUNDS) until one of them has met a running task
            while round_ < ROUNDS or (_retried(log) == retried_before and round_ < 3 * ROUNDS):
                round_ += 1
                produce(2000)  # two batches or more: the workers are busy most of the time
                time.sleep(rnd.uniform(0.1, 1.0))
                workers = _busy_first(_task_workers(job))
                if workers:
                    rnd.choice(workers).kill()
                    killed += 1
                # a batch ends after each kill: a task fails once at most, never spark.task.maxFailures times
                at_kill = _last_batch(markers)
                produce(50)
                _wait_for_batch_after(at_kill, markers, job, f"a batch after kill {round_}")
            wait_for(lambda: pg.count(q) == 0 and pg.count(out) == sent, START, "the query to catch up", job)
            assert job.proc.poll() is None, "the query lived through every kill"
        finally:
            job.kill()
    run_to_end(CHILD, args, log=log)

    with pg.connect() as c:
        ids = [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.MessageId' FROM \"{out}\" ORDER BY 1")]
    assert killed >= ROUNDS and _retried(log) > 0, "tasks were retried"
    assert len(ids) == len(set(ids)), "no message was sent twice"
    assert ids == [f"m{i:06d}-out" for i in range(sent)], "every message was sent"
    assert pg.count(q) == 0 and pg.count(e) == 0
    assert pg.count(f'"{q}.Staging"') == 0, "nothing is left staged"
