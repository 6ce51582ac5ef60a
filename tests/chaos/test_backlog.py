"""Backlog: a large queue drained by queue -> Spark -> queue with Trigger.AvailableNow, while the
job's memory and the connector's own tables are sampled every second.

Checks: every message at the output exactly once; the claim table never holds more than the
batches in flight (the one being acknowledged, the running one, the one claimed ahead) and the
staging table never more than one batch; the Python processes' memory (the driver script, the stream reader's planner, the workers)
does not grow with the backlog. ``make test`` drains 50,000 messages; ``make chaos`` 1,000,000
(SQLQUEUE_CHAOS_BACKLOG) and writes a report section with a plot.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from backends import Backend, nsb_headers, prepared_slots, server_settings
from processes import ROOT, Job
from report import Sampler, plot, section, table
from workload import megabytes, memory_mb, rows

pytestmark = [pytest.mark.slow(reason="a large backlog drained and its memory sampled"), pytest.mark.db, pytest.mark.timeout(7200)]  # a server of its own

CHILD = ROOT / "tests" / "send_crash_child.py"


def load(pg: Backend, queue: str, n: int) -> None:
    """n NServiceBus-shaped messages (ids bk0000001...), written by the server in 100,000s."""
    template = json.dumps(nsb_headers("@ID@"))
    with pg.connect() as c:
        for lo in range(1, n + 1, 100_000):
            c.execute(
                f"INSERT INTO {pg.q(queue)} (id, expires, headers, body)"
                " SELECT md5('bk' || g)::uuid, NULL, replace(%s, '@ID@', 'bk' || lpad(g::text, 7, '0')),"
                " convert_to('{\"OrderId\": ' || g || '}', 'UTF8')"
                " FROM generate_series(%s::int, %s::int) g",
                (template, lo, min(lo + 99_999, n)),
            )


def test_a_large_backlog_drains_in_flat_memory(tmp_path: Path) -> None:
    from spark_qtransport.cli.embedded import EmbeddedPostgres
    from spark_qtransport.transport.receiving.vacuum import VACUUM_EVERY

    n = int(os.environ.get("SQLQUEUE_CHAOS_BACKLOG", "50000"))
    per_batch = max(1000, min(20_000, n // 25))  # enough batches to see a trend
    with EmbeddedPostgres(fsync=False, settings=server_settings()) as server:
        pg = Backend(server.url)
        q, out, e = (pg.create_queue(name) for name in ("Backlog", "Out", "error"))
        load(pg, q, n)
        log = tmp_path / "job.log"
        (tmp_path / "markers").mkdir()
        job = Job(CHILD, [server.url, q, out, e, str(tmp_path / "ckpt"), str(tmp_path / "markers"), "available-now"],
                  log=log, env={"SQLQUEUE_CHILD_MAX_MESSAGES": str(per_batch)})

        claims, staging = pg.q(pg.claims(q)), pg.q(f'"{q}.Staging"')

        def sample() -> dict[str, float]:
            with pg.connect() as c:
                (held,) = c.execute("SELECT count(*) FROM pg_catalog.pg_prepared_xacts").fetchone()
                return {"delivered": rows(c, pg.q(out)), "claimed": rows(c, claims), "staged": rows(c, staging),
                        "prepared": int(held),
                        "claims_mb": megabytes(c, claims), "staging_mb": megabytes(c, staging), **memory_mb(job)}

        sampler = Sampler(sample, every=0.5 if n <= 100_000 else 1.0)  # a short drain lasts a few seconds
        sampler.start()
        try:
            code = job.wait(6000)
        finally:
            samples = sampler.stop()
        assert code == 0, log.read_text()[-3000:]

        with pg.connect() as c:
            total, distinct, in_range = c.execute(
                "SELECT count(*), count(DISTINCT m), count(DISTINCT m) FILTER (WHERE m ~ '^bk[0-9]{7}-out$'"
                " AND substr(m, 3, 7)::int BETWEEN 1 AND %s)"
                f" FROM (SELECT headers::json->>'NServiceBus.MessageId' m FROM {pg.q(out)}) o", (n,)).fetchone()
            c.execute("SELECT pg_stat_force_next_flush()")
            vacuums = {t: c.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = to_regclass(%s)",
                                    (t,)).fetchone()[0] for t in (claims, staging)}
            (written,) = c.execute("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = to_regclass(%s)",
                                   (claims,)).fetchone()

    during = [s for s in samples if 0 < s["delivered"] < n]
    assert len(during) >= 8, f"the drain was sampled ({len(during)} samples)"
    quarter = len(during) // 4
    early, late = during[quarter:2 * quarter], during[-quarter:]  # the second quarter: past the warm-up

    def peak(part: list[dict[str, float]], key: str) -> float:
        return max(s[key] for s in part)

    started = next(s["t"] for s in samples if s["delivered"] > 0)
    finished = next((s["t"] for s in samples if s["delivered"] >= n), samples[-1]["t"])
    figures = {
        "messages": f"{n:,}", "at the output": f"{total:,}", "duplicated": total - distinct, "lost": n - in_range,
        "drain rate (first to last message at the output)": f"{n / max(finished - started, 1):,.0f} msg/s",
        "wall clock, Spark's start included": f"{samples[-1]['t']:.0f} s",
        "claims held by": "prepared transactions" if prepared_slots() else "the claim table",
        "most rows claimed at once (claim table)": f"{peak(samples, 'claimed'):,.0f}",
        "most prepared claims at once": f"{peak(samples, 'prepared'):,.0f}",
        "rows ever written to the claim table": f"{written:,}",
        "most rows staged at once": f"{peak(samples, 'staged'):,.0f}",
        "claim table size, 2nd / last quarter of the drain (max)": f"{peak(early, 'claims_mb'):.0f} / {peak(late, 'claims_mb'):.0f} MB",
        "staging table size, 2nd / last quarter (max)": f"{peak(early, 'staging_mb'):.0f} / {peak(late, 'staging_mb'):.0f} MB",
        "Python processes' PSS, 2nd / last quarter (max)": f"{peak(early, 'python'):.0f} / {peak(late, 'python'):.0f} MB",
        "JVM PSS, 2nd / last quarter (max)": f"{peak(early, 'jvm'):.0f} / {peak(late, 'jvm'):.0f} MB",
    }
    png = plot("backlog", samples, totals={"delivered": "at the output"},
               levels={"claimed": "claimed rows", "claims_mb": "claim table (MB)", "staging_mb": "staging table (MB)",
                       "python": "Python PSS (MB)", "jvm": "JVM PSS (MB)"},
               title=f"draining a backlog of {n:,} messages")
    section("backlog", [
        "## Backlog",
        "",
        f"{n:,} messages in one queue, drained by queue -> Spark -> queue with Trigger.AvailableNow",
        f"({per_batch:,} a batch). Reproduce: `SQLQUEUE_CHAOS_BACKLOG={n} SQLQUEUE_CHAOS_REPORT=reports",
        ".venv/bin/python -m pytest -s tests/chaos/test_backlog.py`.",
        "",
        *table(list(figures.items())),
        "",
        *([f"![backlog drain]({png})", ""] if png else []),
    ], figures)
    assert (total, distinct, in_range) == (n, n, n), "every message at the output exactly once"
    # the batch being acknowledged (in the background), the running one and the one claimed ahead
    assert peak(samples, "claimed") <= 3 * per_batch
    assert peak(samples, "staged") <= per_batch
    # no growth with the backlog: what the last quarter of the drain needs, the second needed too
    assert peak(late, "python") <= peak(early, "python") * 1.25 + 50, "the Python processes' memory is flat"
    assert peak(late, "jvm") <= peak(early, "jvm") * 1.5 + 100, "the JVM's memory is flat"
    # the connector vacuums both tables (at most every VACUUM_EVERY seconds): between two vacuums
    # they grow by that much traffic, so a plateau shows only in a drain of several cycles
    # (`make chaos`: 1,000,000 messages); `make test`'s short drain is over within about one
    # (the staging table only where tasks staged: small tasks hand their messages to the driver)
    if prepared_slots():  # claims held by prepared transactions: the claim table is never written
        assert written == 0, f"{written} rows written to the claim table"
        # each batch is a claim: the one acknowledged (in the background), the running one, the one ahead
        assert peak(samples, "prepared") <= 3
    else:
        assert vacuums[claims] >= 1, f"the claim table was vacuumed: {vacuums}"
    assert vacuums[staging] >= 1 or peak(samples, "staged") == 0, f"the staging table was vacuumed: {vacuums}"
    if finished - started >= 3 * VACUUM_EVERY:
        assert peak(late, "claims_mb") <= peak(early, "claims_mb") * 1.5 + 16, "the claim table does not grow"
        assert peak(late, "staging_mb") <= peak(early, "staging_mb") * 1.5 + 16, "the staging table does not grow"

