"""Crash loop: queue -> Spark -> queue under a continuous NServiceBus producer, while the driver is
SIGKILLed at random moments, the connector's database sessions are terminated at random moments
(whatever they are doing: claim, read, acknowledge, stage, dispatch) and PostgreSQL itself is
restarted once mid-stream. After a final run every produced message is at the output exactly once
and nothing is left staged.

``make test`` runs a short version (SQLQUEUE_CHAOS_KILLS=2, a producer of about 250 msg/s);
``make chaos`` runs 20 kills under about 1,000 msg/s (SQLQUEUE_CHAOS_PAUSE=0.05) and writes a
Markdown report (SQLQUEUE_CHAOS_REPORT). The random seed is SQLQUEUE_CRASH_SEED (printed).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest

from backends import PG_NSB_SEND, Backend, nsb_headers
from processes import ROOT, Job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

CHILD = ROOT / "tests" / "send_crash_child.py"
NAMESPACE = uuid.UUID("6f1c2b8e-0000-4000-8000-00000000c4a0")


class Producer(threading.Thread):
    """NServiceBus's send SQL, 50 messages a transaction, until stopped. Native ids derive from
    the message ids, so a transaction retried after an unknown outcome cannot send twice."""

    def __init__(self, pg: Backend, queue: str) -> None:
        super().__init__(daemon=True)
        self.pg, self.queue, self.sent, self.errors = pg, queue, 0, 0
        self.pause = float(os.environ.get("SQLQUEUE_CHAOS_PAUSE", "0.2"))  # between transactions of 50
        self.halt = threading.Event()

    def run(self) -> None:
        import psycopg

        while not self.halt.is_set():
            ids = [f"p{self.sent + i:07d}" for i in range(50)]
            try:
                with psycopg.connect(self.pg.url) as conn:
                    conn.cursor().executemany(PG_NSB_SEND.format(self.pg.q(self.queue)), [
                        (uuid.uuid5(NAMESPACE, m), json.dumps(nsb_headers(m)), b'{"n": 1}') for m in ids])
                self.sent += len(ids)
            except psycopg.errors.UniqueViolation:
                self.sent += len(ids)  # the earlier attempt committed after all
            except psycopg.Error:
                self.errors += 1  # server restarting: try the same ids again
            self.halt.wait(self.pause)


class Killer(threading.Thread):
    """Terminates every connector session (application_name spark-qtransport) at random moments."""

    def __init__(self, pg: Backend, rnd: random.Random) -> None:
        super().__init__(daemon=True)
        self.pg, self.rnd, self.terminated = pg, rnd, 0
        self.halt = threading.Event()

    def run(self) -> None:
        import psycopg

        while not self.halt.wait(self.rnd.uniform(1.5, 5.0)):
            try:
                with psycopg.connect(self.pg.url, autocommit=True) as c:
                    self.terminated += sum(1 for (ok,) in c.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE application_name = 'spark-qtransport' AND pid <> pg_backend_pid()") if ok)
            except psycopg.Error:
                pass  # the server is restarting


def rss_mb(job: Job) -> float:
    total = 0
    for p in job.processes():
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def test_crash_loop_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    from spark_qtransport.embedded import EmbeddedPostgres

    kills = int(os.environ.get("SQLQUEUE_CHAOS_KILLS", "2"))
    seed = int(os.environ.get("SQLQUEUE_CRASH_SEED", "20261122"))
    print(f"crash loop: {kills} kills, SQLQUEUE_CRASH_SEED={seed}")
    rnd = random.Random(seed)
    started = time.monotonic()
    with EmbeddedPostgres(fsync=False) as server:
        pg = Backend(server.url)
        q, out, e = (pg.create_queue(n) for n in ("Orders", "Out", "error"))
        url = server.url + "?options=-c%20client_connection_check_interval%3D200"
        log = tmp_path / "job.log"
        producer, killer = Producer(pg, q), Killer(pg, rnd)
        producer.start()
        killer.start()
        rounds: list[dict[str, Any]] = []
        restarted = False
        peak_rss = 0.0
        try:
            n = 0
            while sum(r["outcome"] == "killed" for r in rounds) < kills and n < 3 * kills:
                markers = tmp_path / f"markers-{n}"
                markers.mkdir()
                job = Job(CHILD, [url, q, out, e, str(tmp_path / "ckpt"), str(markers)], log=log)
                deadline = time.monotonic() + 180
                while not any(markers.glob("batch-*")) and job.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                if n == kills // 2 and not restarted:
                    restarted = True
                    server.restart()  # mid-stream: the job rides through it or fails and is restarted
                time.sleep(rnd.uniform(0.5, 3.0))
                peak_rss = max(peak_rss, rss_mb(job))
                exited = job.proc.poll()
                job.kill()
                rounds.append({"round": n, "batches": len(list(markers.glob("batch-*"))),
                               "outcome": "killed" if exited is None else f"failed on its own (exit {exited})"})
                n += 1
        finally:
            producer.halt.set()
            killer.halt.set()
            producer.join(10)
            killer.join(10)
        (tmp_path / "final").mkdir()
        # drain the backlog in larger batches (the long run leaves a few hundred thousand)
        final = Job(CHILD, [url, q, out, e, str(tmp_path / "ckpt"), str(tmp_path / "final"), "available-now"],
                    log=log, env={"SQLQUEUE_CHILD_MAX_MESSAGES": "20000"})
        assert final.wait(3000) == 0, log.read_text()[-3000:]

        with pg.connect() as c:
            ids = [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.MessageId' FROM {pg.q(out)}")]
        expected = {f"p{i:07d}-out" for i in range(producer.sent)}
        lost, duplicated = len(expected - set(ids)), len(ids) - len(set(ids))
        staged = pg.count(f'"{q}.Staging"')
        report(rounds=rounds, sent=producer.sent, received=len(ids), lost=lost, duplicated=duplicated,
               terminated=killer.terminated, producer_retries=producer.errors, staged=staged,
               claimed=pg.count(pg.claims(q)), peak_rss=peak_rss, seed=seed, seconds=time.monotonic() - started,
               kills=kills, pause=producer.pause)
        assert sum(r["outcome"] == "killed" for r in rounds) == kills, rounds
        assert duplicated == 0, "no message was sent twice"
        assert lost == 0, "every produced message was sent"
        assert pg.count(q) == 0 and pg.count(e) == 0
        assert staged == 0, "nothing is left staged"


def report(**figures: Any) -> None:
    """Print the figures; with SQLQUEUE_CHAOS_REPORT, also write them as a Markdown report."""
    rounds = figures.pop("rounds")
    print("crash loop:", json.dumps(figures))
    path = os.environ.get("SQLQUEUE_CHAOS_REPORT")
    if not path:
        return
    lines = [
        f"# Crash loop report, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        "queue -> Spark -> queue (`writeStream.format(\"sqlqueue\")`), a continuous NServiceBus producer,",
        "the driver SIGKILLed at random moments, the connector's sessions terminated at random moments,",
        "PostgreSQL restarted once mid-stream; then one clean run to the end.",
        f"Reproduce: `SQLQUEUE_CRASH_SEED={figures['seed']} SQLQUEUE_CHAOS_KILLS={figures['kills']} "
        f"SQLQUEUE_CHAOS_PAUSE={figures['pause']} SQLQUEUE_CHAOS_REPORT=reports/chaos.md "
        ".venv/bin/python -m pytest -s tests/chaos/test_crash_loop.py` (`make chaos`: 20 kills, pause 0.05).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| driver kills (SIGKILL of driver, JVM and workers while running) | {sum(r['outcome'] == 'killed' for r in rounds)} |",
        f"| runs that failed on their own (a terminated session under a task; restarted) | {sum(r['outcome'] != 'killed' for r in rounds)} |",
        f"| connector sessions terminated (`pg_terminate_backend`) | {figures['terminated']} |",
        "| PostgreSQL restarts | 1 |",
        f"| messages produced | {figures['sent']:,} |",
        f"| messages at the output | {figures['received']:,} |",
        f"| lost | {figures['lost']} |",
        f"| duplicated | {figures['duplicated']} |",
        f"| left staged | {figures['staged']} |",
        f"| left claimed (the last batch, acknowledged when a next run plans one) | {figures['claimed']} |",
        f"| peak RSS of the job (driver, JVM, workers) | {figures['peak_rss']:.0f} MB |",
        f"| producer transactions retried (server restarting) | {figures['producer_retries']} |",
        f"| wall clock | {figures['seconds']:.0f} s |",
        "",
        "| round | micro-batches before the kill | outcome |",
        "|---|---|---|",
        *(f"| {r['round']} | {r['batches']} | {r['outcome']} |" for r in rounds),
        "",
    ]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines))
