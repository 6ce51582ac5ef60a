"""The jobs' progress lines: one per micro-batch, and a summary that counts every batch of the run."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

from backends import Backend, nsb_headers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))

import _progress  # noqa: E402


def test_a_line_per_batch_and_a_summary_of_every_batch(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(150)])
    df = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
          .option("maxMessagesPerTrigger", "20").load())
    query = (df.writeStream.foreachBatch(lambda batch, batch_id: batch.count())
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    out = io.StringIO()
    summary = _progress.follow(query, poll=0.2, out=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 8 == summary.batches  # 7 batches of 20, one of 10
    assert summary.messages == 150
    assert all(re.fullmatch(r"batch \d+: [\d,]+ messages? in \d+\.\d\d s \([\d,.]+ msg/s\), backlog \d+", ln) for ln in lines), lines
    assert sum(int(ln.split(": ")[1].split()[0]) for ln in lines) == 150
    assert re.fullmatch(r"150 messages in 8 micro-batches, [\d.]+ s \([\d,.]+ msg/s\)", str(summary))
