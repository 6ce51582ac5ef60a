"""Crash loop: queue -> Spark -> queue under a continuous NServiceBus producer, while the driver is
SIGKILLed at random moments, the connector's database sessions are terminated at random moments
(whatever they are doing: claim, read, acknowledge, stage, dispatch) and PostgreSQL itself is
killed (``pg_ctl stop -m immediate``) and started again after each outage of SQLQUEUE_CHAOS_OUTAGES
(seconds, comma-separated; ``past`` = longer than the job's outageTimeout): the job rides through the
shorter ones and fails with one line naming the database and the bound after the last. Runs alternate between tasks that hand their messages to the driver and
tasks that stage them (inlineBytes 0), so replays cross from one way to the other. Every seventh
message is rejected with ``fail()`` (FAIL_EVERY). After a final run every produced message is, exactly
once, at the output or (rejected) in the error queue, every message that was not rejected is in the
audit queue exactly once (the reader audits, ``auditQueue``; a rejected one never), and nothing is
left claimed or staged.

``make test`` runs a short version (SQLQUEUE_CHAOS_KILLS=2, a producer of about 250 msg/s, one
outage of 4 s); ``make chaos`` runs 20 kills under about 700 msg/s (SQLQUEUE_CHAOS_PAUSE=0.05) and
outages of 5 s, 60 s and past the 2-minute bound (SQLQUEUE_CHAOS_OUTAGES=5,60,past), and writes a
report section with a rate plot (SQLQUEUE_CHAOS_REPORT, see report.py). The random seed is
SQLQUEUE_CRASH_SEED (printed).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, server_settings
from processes import ROOT, Job
from report import Sampler, plot, section, table
from workload import Killer, Producer, memory_mb, rows

pytestmark = [pytest.mark.slow(reason="job processes SIGKILLed and restarted under a producer, the database stopped"), pytest.mark.db, pytest.mark.timeout(3600)]  # a server of its own

CHILD = ROOT / "tests" / "send_crash_child.py"
#: every message whose number is a multiple of this is rejected with fail(): to the error queue, never audited
FAIL_EVERY = 7


def test_crash_loop_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    kills = int(os.environ.get("SQLQUEUE_CHAOS_KILLS", "2"))
    seed = int(os.environ.get("SQLQUEUE_CRASH_SEED", "20261122"))
    print(f"crash loop: {kills} kills, SQLQUEUE_CRASH_SEED={seed}")
    rnd = random.Random(seed)
    outages = [o.strip() for o in os.environ.get("SQLQUEUE_CHAOS_OUTAGES", "4").split(",") if o.strip()]
    at = {(k + 1) * kills // (len(outages) + 1): o for k, o in enumerate(outages)}  # round -> outage
    # commits wait for their WAL: a killed server keeps what it confirmed (see tests/test_outages.py)
    with EmbeddedPostgres(fsync=False, settings=server_settings(synchronous_commit="on")) as server:
        pg = Backend(server.url)
        q, out, e, audit = (pg.create_queue(n) for n in ("Orders", "Out", "error", "audit"))
        url = server.url + "?options=-c%20client_connection_check_interval%3D200"
        log = tmp_path / "job.log"
        producer, killer = Producer(pg, q), Killer(pg, rnd)
        current: list[Job] = []

        def sample() -> dict[str, float]:
            with pg.connect() as c:
                delivered, claimed = rows(c, pg.q(out)), rows(c, pg.q(pg.claims(q)))
            memory = sum(memory_mb(current[-1]).values()) if current else 0.0
            return {"produced": producer.sent, "delivered": delivered, "claimed": claimed, "memory": memory}

        sampler = Sampler(sample)
        events: list[tuple[float, str]] = []
        producer.start()
        killer.start()
        sampler.start()
        rounds: list[dict[str, Any]] = []
        peak_memory = 0.0
        ridden: list[str] = []
        try:
            n = 0
            while sum(r["outcome"] == "killed" for r in rounds) < kills and n < 3 * kills:
                markers = tmp_path / f"markers-{n}"
                markers.mkdir()
                job = Job(CHILD, [url, q, out, e, str(tmp_path / "ckpt"), str(markers)], log=log,
                          env={"SQLQUEUE_CHILD_INLINE_BYTES": "0" if n % 2 else str(256 * 2**20),
                               "SQLQUEUE_CHILD_AUDIT_QUEUE": audit, "SQLQUEUE_CHILD_FAIL_EVERY": str(FAIL_EVERY)})
                current.append(job)
                deadline = time.monotonic() + 180
                while not any(markers.glob("batch-*")) and job.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                outage = at.pop(n, None) if job.proc.poll() is None else None
                if outage is not None:
                    ridden.append(outage_round(server, job, markers, outage, events, sampler, log))
                    if outage == "past":
                        rounds.append({"round": n, "batches": len(list(markers.glob("batch-*"))),
                                       "outcome": f"failed past the bound (exit {job.proc.returncode})"})
                        n += 1
                        continue
                time.sleep(rnd.uniform(0.5, 3.0))
                peak_memory = max(peak_memory, sum(memory_mb(job).values()))
                exited = job.proc.poll()
                job.kill()
                if exited is None:
                    events.append((sampler.now(), "kill"))
                rounds.append({"round": n, "batches": len(list(markers.glob("batch-*"))),
                               "outcome": "killed" if exited is None else f"failed on its own (exit {exited})"})
                n += 1
        finally:
            producer.stop()
            killer.stop()
        # drain the backlog in larger batches (the long run leaves a few hundred thousand), then
        # start once more on the empty queue: that run acknowledges the drain's last batch
        for name in ("final", "release"):
            (tmp_path / name).mkdir()
            events.append((sampler.now(), name))
            job = Job(CHILD, [url, q, out, e, str(tmp_path / "ckpt"), str(tmp_path / name), "available-now"],
                      log=log, env={"SQLQUEUE_CHILD_MAX_MESSAGES": "20000", "SQLQUEUE_CHILD_AUDIT_QUEUE": audit,
                                    "SQLQUEUE_CHILD_FAIL_EVERY": str(FAIL_EVERY)})
            current.append(job)
            assert job.wait(3000) == 0, log.read_text()[-3000:]
        samples = sampler.stop()

        with pg.connect() as c:
            ids = [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.MessageId' FROM {pg.q(out)}")]
            audited = [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.MessageId' FROM {pg.q(audit)}")]
            errors = [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.MessageId' FROM {pg.q(e)}")]
        rejected = {m for m in producer.ids() if int(m[len(producer.prefix):]) % FAIL_EVERY == 0}
        accepted = set(producer.ids()) - rejected
        expected = {f"{m}-out" for m in accepted}
        figures = dict(
            kills=sum(r["outcome"] == "killed" for r in rounds), failed=sum(r["outcome"] != "killed" for r in rounds),
            terminated=killer.terminated, sent=producer.sent, received=len(ids), lost=len(expected - set(ids)),
            duplicated=len(ids) - len(set(ids)), unexpected=len(set(ids) - expected),
            rejected=len(errors), error_lost=len(rejected - set(errors)), error_duplicated=len(errors) - len(set(errors)),
            error_unexpected=len(set(errors) - rejected),
            audited=len(audited), audit_lost=len(accepted - set(audited)),
            audit_duplicated=len(audited) - len(set(audited)), audit_unexpected=len(set(audited) - accepted),
            staged=pg.count(f'"{q}.Staging"'), claimed=pg.count(pg.claims(q)),
            peak_memory=max([peak_memory, *(s["memory"] for s in samples)]), producer_retries=producer.errors,
            seconds=sampler.now(), seed=seed, pause=producer.pause, rate=producer.sent / max(sampler.now(), 1),
        )
        figures["outages"] = ", ".join(ridden) or "none"
        write_section(rounds, samples, events, figures)
        assert figures["kills"] == kills, rounds
        assert len(ridden) == len(outages), f"every outage took place: {ridden}"
        assert figures["duplicated"] == 0 and figures["unexpected"] == 0, "no message was sent twice or wrongly"
        assert figures["lost"] == 0, "every accepted message was sent"
        assert (figures["error_duplicated"], figures["error_lost"], figures["error_unexpected"]) == (0, 0, 0), \
            "every rejected message is in the error queue once"
        assert (figures["audit_duplicated"], figures["audit_lost"], figures["audit_unexpected"]) == (0, 0, 0), \
            "every accepted message audited once, no rejected one"
        assert pg.count(q) == 0
        assert figures["staged"] == 0, "nothing is left staged"
        assert figures["claimed"] == 0, "nothing is left claimed"


#: seconds the job waits out an outage (its outageTimeout, the default)
BOUND = 120.0


def outage_round(server: Any, job: Job, markers: Path, outage: str, events: list[tuple[float, str]],
                 sampler: Sampler, log: Path) -> str:
    """Kill the server under a running job and start it again after `outage` seconds; the job rides
    through (a new micro-batch after the restart) or, past the bound, fails with one line naming
    the database and the bound. Returns what happened, for the report."""
    past = outage == "past"
    events.append((sampler.now(), f"PostgreSQL killed ({outage})"))
    server.crash()
    started = time.monotonic()
    if past:
        code = job.proc.wait(BOUND + 120)
        took = time.monotonic() - started
        server.start()
        tail = log.read_text(errors="replace")[-20000:]
        assert code != 0 and "longer than option 'outageTimeout' (2 min)" in tail, tail[-3000:]
        return f"past the bound: failed after {took:.0f} s"
    time.sleep(float(outage))
    server.start()
    events.append((sampler.now(), "PostgreSQL started"))
    before = set(markers.glob("batch-*"))
    deadline = time.monotonic() + 120
    while set(markers.glob("batch-*")) <= before and job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.proc.poll() is None, f"the job rode through a {outage} s outage: {log.read_text()[-3000:]}"
    assert set(markers.glob("batch-*")) > before, "micro-batches went on after the outage"
    return f"{outage} s: ridden through"


def write_section(rounds: list[dict[str, Any]], samples: list[dict[str, float]], events: list[tuple[float, str]],
                  f: dict[str, Any]) -> None:
    # purple lines: the PostgreSQL kills and starts, the start of the final drain and of the release run
    png = plot("crash-loop", samples, totals={"produced": "produced", "delivered": "at the output"},
               levels={"claimed": "claimed rows", "memory": "job memory (PSS, MB)"}, events=events,
               title=f"crash loop: {f['kills']} SIGKILLs, {f['terminated']} sessions terminated, outages {f['outages']}")
    lines = [
        "## Crash loop",
        "",
        "queue -> Spark -> queue (`writeStream.format(\"sqlqueue\")`), the reader auditing every message, every seventh rejected",
        "with `fail()` (to the error queue, never audited), a continuous NServiceBus producer,",
        "the job (driver, JVM, workers) SIGKILLed at random moments, the connector's sessions terminated",
        "at random moments, PostgreSQL killed (`pg_ctl stop -m immediate`) and started again after each outage; then a run that drains the queue and",
        "one more on the empty queue (it acknowledges the drain's last batch).",
        f"Reproduce: `SQLQUEUE_CRASH_SEED={f['seed']} SQLQUEUE_CHAOS_KILLS={f['kills']} SQLQUEUE_CHAOS_PAUSE={f['pause']} "
        f"SQLQUEUE_CHAOS_OUTAGES={os.environ.get('SQLQUEUE_CHAOS_OUTAGES', '4')} "
        "SQLQUEUE_CHAOS_REPORT=reports .venv/bin/python -m pytest -s tests/chaos/test_crash_loop.py`.",
        "",
        *table([
            ("job SIGKILLs while running", f["kills"]),
            ("runs that failed on their own (restarted)", f["failed"]),
            ("connector sessions terminated (`pg_terminate_backend`)", f["terminated"]),
            ("PostgreSQL outages (server killed, started again after)", f["outages"]),
            ("messages produced", f"{f['sent']:,} (about {f['rate']:.0f} msg/s over the run)"),
            ("messages at the output", f"{f['received']:,}"),
            ("lost", f["lost"]),
            ("duplicated", f["duplicated"]),
            ("rejected (`fail()`) in the error queue: lost / duplicated", f"{f['error_lost']} / {f['error_duplicated']}"),
            ("audit copies (`auditQueue`): lost / duplicated / of rejected ones",
             f"{f['audit_lost']} / {f['audit_duplicated']} / {f['audit_unexpected']}"),
            ("left staged", f["staged"]),
            ("left claimed", f["claimed"]),
            ("peak memory of the job (PSS of driver, JVM, workers)", f"{f['peak_memory']:.0f} MB"),
            ("producer transactions retried (server restarting)", f["producer_retries"]),
            ("wall clock", f"{f['seconds']:.0f} s"),
        ]),
        "",
        *([f"![rates over time]({png})", ""] if png else []),
        "| round | micro-batches before the kill | outcome |",
        "|---|---|---|",
        *(f"| {r['round']} | {r['batches']} | {r['outcome']} |" for r in rounds),
        "",
    ]
    section("crash-loop", lines, {k: v for k, v in f.items() if k != "rate"})
