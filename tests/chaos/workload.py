"""What the chaos tests run beside the connector: an NServiceBus producer, a session killer, and
the resident memory of a job."""

from __future__ import annotations

import json
import os
import random
import threading
import uuid
from typing import Any

import psutil

from backends import PG_NSB_SEND, Backend, nsb_headers
from processes import Job

NAMESPACE = uuid.UUID("6f1c2b8e-0000-4000-8000-00000000c4a0")


class Producer(threading.Thread):
    """NServiceBus's send SQL, 50 messages a transaction, until stopped. Message ids are
    ``<prefix><n:07d>``; native ids derive from them, so a transaction retried after an unknown
    outcome cannot send twice."""

    def __init__(self, pg: Backend, queue: str, *, prefix: str = "p", pause: float | None = None) -> None:
        super().__init__(daemon=True)
        self.pg, self.queue, self.prefix, self.sent, self.errors = pg, queue, prefix, 0, 0
        # between transactions of 50
        self.pause = float(os.environ.get("SQLQUEUE_CHAOS_PAUSE", "0.2")) if pause is None else pause
        self.halt = threading.Event()

    def ids(self) -> list[str]:
        return [f"{self.prefix}{i:07d}" for i in range(self.sent)]

    def run(self) -> None:
        import psycopg

        while not self.halt.is_set():
            ids = [f"{self.prefix}{self.sent + i:07d}" for i in range(50)]
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

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


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

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


def memory_mb(job: Job) -> dict[str, float]:
    """Proportional set size (shared pages split between the processes that share them, so the
    forked Python workers are not counted many times) of a job's JVM and of its Python processes
    (the driver script, the stream reader's planner, the workers), in MiB."""
    mb = {"jvm": 0.0, "python": 0.0}
    for p in job.processes():
        try:
            mb["jvm" if "java" in p.name() else "python"] += p.memory_full_info().pss / 2**20
        except psutil.Error:
            pass
    return mb


def rows(conn: Any, qualified: str) -> int:
    """Rows in a table, 0 while it does not exist yet (the job creates it)."""
    if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (qualified,)).fetchone()[0]:
        return 0
    return int(conn.execute(f"SELECT count(*) FROM {qualified}").fetchone()[0])


def megabytes(conn: Any, qualified: str) -> float:
    """A table's size with its indexes and TOAST, 0 while it does not exist."""
    (n,) = conn.execute("SELECT coalesce(pg_total_relation_size(to_regclass(%s)), 0)", (qualified,)).fetchone()
    return int(n) / 2**20
