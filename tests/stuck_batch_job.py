"""A job whose foreachBatch function does not return (a Python call Spark cannot interrupt, as a
user's handler stuck on a lock or a network call is), stopped by a signal in that batch:
`tests/test_stops.py::test_a_batch_that_never_returns_still_ends_the_job_within_10_seconds`.

    python tests/stuck_batch_job.py URL QUEUE ERROR_QUEUE CHECKPOINT
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))

import _config  # noqa: E402
from _stops import STOPS  # noqa: E402


def main() -> int:
    url, queue, error_queue, checkpoint = sys.argv[1:5]
    from _progress import follow
    from _spark import session

    spark = session("sqlqueue-stuck-batch")

    def stuck(batch: Any, batch_id: int) -> None:
        print(f"batch {batch_id}: {batch.count()} message(s), handled forever", flush=True)
        time.sleep(600)

    query = (spark.readStream.format("sqlqueue").option("url", url).option("queue", queue)
             .option("errorQueue", error_queue).load()
             .writeStream.foreachBatch(STOPS.gated(stuck)).option("checkpointLocation", checkpoint)
             .trigger(processingTime="100 milliseconds").start())
    print(follow(query).outcome, flush=True)
    return 0


if __name__ == "__main__":
    _config.exit_with(main)
