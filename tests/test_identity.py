"""One identity per job, said out loud: a query that takes over another query's unacknowledged
claims (same endpoint, another checkpoint) warns; a restart of the same query does not; a finished
AvailableNow run leaves nothing claimed; the jobs' default endpoints differ."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from test_stream import Collect, reader, run_available_now

from backends import Backend, nsb_headers
from spark_qtransport.transport.receiving.receiver import Receiver
from spark_qtransport.transport.settings import ReceiveSettings

JOBS = Path(__file__).resolve().parent.parent / "jobs"
TAKEOVER = "takes over"

pytestmark = pytest.mark.usefixtures("spark")


def _taken_over(query: Any) -> int:
    """What the run's progress reports as taken over (the source's reported latestOffset)."""
    reported = [json.loads(p["sources"][0]["latestOffset"]) for p in query.recentProgress
                if p["sources"][0]["latestOffset"]]
    return max((r.get("takenOver", 0) for r in reported if isinstance(r, dict)), default=0)


def _fail_first_batch(spark: Any, df: Any, checkpoint: str) -> None:
    """A query whose first batch fails: its claims stay, unacknowledged."""

    def fail(batch: Any, batch_id: int) -> None:
        batch.collect()
        raise RuntimeError("the job died here")

    q = df.writeStream.foreachBatch(fail).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    with pytest.raises(Exception, match="the job died here"):
        q.awaitTermination(180)


def test_taking_over_another_querys_claims_warns_and_a_finished_run_leaves_nothing_claimed(
    spark: Any, pg: Backend, names: Any, tmp_path: Path
) -> None:
    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    pg.send_many(q, [(nsb_headers(f"m{i:02d}"), b"{}") for i in range(12)])
    first, second, other = (str(tmp_path / n) for n in ("first", "second", "other"))

    # the first job dies in its first batch: 5 claimed, never acknowledged
    _fail_first_batch(spark, reader(spark, pg, q, e, maxMessagesPerTrigger="5", claimAhead="false"), first)
    assert pg.held(q) == 5

    # a job with its own endpoint (queue_to_delta's default: its job id) leaves those claims alone
    bronze = Collect()
    bronze_query = run_available_now(spark, reader(spark, pg, q, e, endpoint="queue_to_delta"), other, bronze)
    assert _taken_over(bronze_query) == 0
    assert sorted(bronze.ids()) == [f"m{i:02d}" for i in range(5, 12)]
    assert pg.held(q) == 5

    # a job with the first one's endpoint and its own checkpoint takes them over, and says so
    taker = Collect()
    taker_query = run_available_now(spark, reader(spark, pg, q, e, maxMessagesPerTrigger="5"), second, taker)
    assert _taken_over(taker_query) == 5  # in its progress (the log line: the test below)
    assert sorted(taker.ids()) == [f"m{i:02d}" for i in range(5)]  # none of the other job's
    # AvailableNow's last batch is acknowledged before the run ends: nothing stays claimed
    assert pg.held(q) == 0 and pg.count(q) == 0

    # the first job restarts from its checkpoint: its own batch, replayed; no warning
    pg.send_many(q, [(nsb_headers(f"n{i}"), b"{}") for i in range(3)])
    again = Collect()
    again_query = run_available_now(spark, reader(spark, pg, q, e, maxMessagesPerTrigger="5"), first, again)
    assert _taken_over(again_query) == 0
    assert again.batches[0][0] == 0  # batch 0 again (its claims are gone: read empty)
    assert sorted(again.ids()) == ["n0", "n1", "n2"]
    assert pg.held(q) == 0


def test_queue_to_delta_does_not_share_the_quick_starts_endpoint() -> None:
    """The quick start reads `Sales` as endpoint `Sales` (the queue's name, the reader's default);
    queue_to_delta's default identity is its job id, so neither takes over the other's claims."""
    sys.path.insert(0, str(JOBS))
    import queue_to_delta

    args = queue_to_delta.arguments(["--url", "postgresql://u@127.0.0.1/db", "--queue", "Sales", "--table", "t",
                                     "--checkpoint", "c"])
    assert queue_to_delta.endpoint(args) == "queue_to_delta"
    guide = (JOBS.parent / "docs" / "getting-started.md").read_text()
    quick = guide[guide.index("## Quick start"):]
    assert '.option("queue", "Sales")' in quick and '.option("endpoint", "queue_to_delta")' not in quick
    args = queue_to_delta.arguments([*["--url", "postgresql://u@127.0.0.1/db", "--queue", "Sales", "--table", "t"],
                                     "--checkpoint", "c", "--endpoint", "Sales.Bronze"])
    assert queue_to_delta.endpoint(args) == "Sales.Bronze"


def test_the_takeover_is_logged_once_and_a_restart_is_not(pg: Backend, names: Any, caplog: pytest.LogCaptureFixture) -> None:
    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(7)])
    settings = ReceiveSettings.create(pg.url, q, error_queue=e, claim_ahead=False, max_messages=4)

    def run(start: Any, batches: int) -> Any:
        """One driver process planning `batches` batches from `start` (Spark's next planning
        means the last batch is committed), the last one never committed. Returns the first end."""
        r = Receiver(settings)
        try:
            ends = [r.latest(start if start is not None else r.initial_offset(), 4)]
            for _ in range(batches - 1):
                ends.append(r.latest(ends[-1], 4))
            return ends[0]
        finally:
            r.close()

    with caplog.at_level(logging.WARNING, logger="spark_qtransport.receive"):
        logged = run(None, 2)  # a query claims 7 in two batches; say its checkpoint logged the first only
        assert TAKEOVER not in caplog.text
        run(logged, 1)  # the same query again, from its checkpoint: the claims beyond are its own
        assert TAKEOVER not in caplog.text
        assert pg.count(pg.claims(q)) == 3
        run(None, 1)  # another query (a new checkpoint), same endpoint
    said = [r.getMessage() for r in caplog.records if TAKEOVER in r.getMessage()]
    assert len(said) == 1 and f"endpoint '{q}'" in said[0] and "3 message(s)" in said[0]
