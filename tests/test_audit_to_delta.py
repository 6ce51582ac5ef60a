"""jobs/audit_to_delta.py end to end: audit copies and failed messages as NServiceBus endpoints write
them, real queues, the job as its own process (as spark-submit starts it), real Delta tables."""

from __future__ import annotations

from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from platform_data import JOB, generate_platform_tables, job_module, traffic

from backends import Backend
from processes import START, Job, wait_for

#: the Delta tables' columns (the shared contract of the platform tables)
CONTRACT = ("queue string, message_id string, message_type string, headers map<string,string>, body binary, "
            "time_sent timestamp, processing_started timestamp, processing_ended timestamp, processing_time double, "
            "critical_time double, delivery_time double, originating_endpoint string, processing_endpoint string, "
            "message_intent string, retries int, failed_q string, exception_type string, exception_message string, "
            "time_of_failure timestamp, unique_message_id string, day date")


def day_of(text: str) -> date:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S:%f Z").replace(tzinfo=timezone.utc).date()


@pytest.mark.slow(reason="the audit_to_delta job as a process, killed and run again")
def test_audit_and_failures_exactly_once_across_a_kill(spark: Any, pg: Backend, names: Any, tmp_path: Path) -> None:
    from pyspark.sql.types import _parse_datatype_string

    audit_q, error_q = pg.create_queue(names("audit")), pg.create_queue(names("error"))
    audit, failures = traffic(400, 80, ack_queue=error_q)
    tables, ckpt, log = tmp_path / "platform", tmp_path / "ckpt", tmp_path / "job.log"
    args = ["--url", pg.url, "--audit-queue", audit_q, "--error-queue", error_q, "--table-dir", str(tables),
            "--checkpoint", str(ckpt), "--job-id", "platform-test"]
    pg.send_many(audit_q, audit[:300])  # type: ignore[arg-type]
    pg.send_many(error_q, failures[:60])  # type: ignore[arg-type]
    job = Job(JOB, [*args, "--trigger", "200ms", "--max-messages", "50"], log=log)
    wait_for(lambda: any((tables / "audit" / "_delta_log").glob("*.json")), START, "a Delta commit", job)
    job.kill()  # SIGKILL driver, JVM and workers mid-stream
    pg.send_many(audit_q, audit[300:])  # type: ignore[arg-type]
    pg.send_many(error_q, failures[60:])  # type: ignore[arg-type]
    again = Job(JOB, [*args, "--trigger", "available-now", "--max-messages", "1000"], log=log)
    assert again.wait(300) == 0, log.read_text()[-3000:]

    got_audit = spark.read.format("delta").load(str(tables / "audit"))
    got_failures = spark.read.format("delta").load(str(tables / "failures"))
    for got, sent in ((got_audit, audit), (got_failures, failures)):
        assert got.schema.simpleString() == _parse_datatype_string(CONTRACT).simpleString()
        ids = sorted(r.message_id for r in got.select("message_id").collect())
        assert ids == sorted(h["NServiceBus.MessageId"] for h, _ in sent)  # none lost, none twice
    # the partition: the UTC day of ProcessingEnded (audit) and of TimeOfFailure (failures)
    days = {r.message_id: r.day for r in got_audit.union(got_failures).select("message_id", "day").collect()}
    assert days == {**{h["NServiceBus.MessageId"]: day_of(h["NServiceBus.ProcessingEnded"]) for h, _ in audit},
                    **{h["NServiceBus.MessageId"]: day_of(h["NServiceBus.TimeOfFailure"]) for h, _ in failures}}
    assert {r.queue for r in got_failures.select("queue").distinct().collect()} == {pg.dialect.format_address(pg.address(error_q))}
    # every queue drained and acknowledged; no ServicePulse retry acknowledged again; nothing poison
    poison = pg.dialect.format_address(pg.dialect.companion(pg.address(error_q), "Poison"))
    assert [pg.count(q) for q in (audit_q, error_q, poison, pg.claims(audit_q), pg.claims(error_q))] == [0] * 5


def test_generated_tables_for_notebooks_and_a_rerun_adds_nothing(spark: Any, pg_url: str, names: Any,
                                                                  tmp_path: Path) -> None:
    audit_to_delta = job_module()
    got = generate_platform_tables(spark, pg_url, names, tmp_path / "platform", n_audit=60, n_failures=10,
                                   confirmations=True)
    # 60 audit copies (two of them ServicePulse retries of failures), 10 failures + 2 confirmations
    assert (got["audit_count"], got["failures_count"]) == (60, 12)
    audit = spark.read.format("delta").load(got["audit_table"])
    failures = spark.read.format("delta").load(got["failures_table"])
    assert (audit.count(), failures.count()) == (60, 12)
    assert audit.where("processing_time IS NULL OR critical_time < processing_time").count() == 0
    assert failures.where("failed_q IS NOT NULL AND (exception_type IS NULL OR time_of_failure IS NULL)").count() == 0
    assert audit.select("processing_endpoint").distinct().count() == 5
    # a retried failure and its successful retry share ServiceControl's unique id; so does the confirmation
    failed = failures.where("failed_q IS NOT NULL").select("unique_message_id", "message_id")
    confirmed = failures.where("failed_q IS NULL").select("unique_message_id")
    resolved = audit.where("headers['ServiceControl.Retry.UniqueMessageId'] IS NOT NULL").join(
        failed, ["unique_message_id", "message_id"])
    assert resolved.count() == 2 and confirmed.join(failed, "unique_message_id").count() == 2
    assert audit_to_delta.run(spark, audit_to_delta.arguments(got["argv"])) == {"audit": 0, "failures": 0}
    assert (audit.count(), failures.count()) == (60, 12)


def test_the_config_file_and_bad_flags(capsys: Any) -> None:
    audit_to_delta = job_module()
    url = ["--url", "postgresql://u@localhost/db"]
    args = audit_to_delta.arguments(["--config", str(JOB.parent.parent / "conf" / "audit_to_delta.toml"), *url])
    assert audit_to_delta.tables(args) == {"audit": "/tmp/sqlqueue/platform/audit",
                                           "failures": "/tmp/sqlqueue/platform/failures"}
    assert audit_to_delta.queues(args) == (['"public"."audit"'], ['"public"."error"'], '"public"."error.Poison"')
    given = audit_to_delta.arguments([*url, "--checkpoint", "c", "--audit-table", "a", "--failures-table", "f",
                                      "--audit-queue", "a1, a2", "--error-queue", "e", "--poison-queue", "p"])
    assert audit_to_delta.tables(given) == {"audit": "a", "failures": "f"}
    assert audit_to_delta.queues(given) == (['"public"."a1"', '"public"."a2"'], ['"public"."e"'], '"public"."p"')
    for flags, message in [
        (["--checkpoint", "c"], "missing --table-dir or --audit-table"),
        (["--table-dir", "t"], "missing --checkpoint"),
        (["--checkpoint", "c", "--table-dir", "t", "--audit-queue", "x", "--error-queue", "public.x"],
         "--audit-queue and --error-queue name the same queue"),
        (["--checkpoint", "c", "--table-dir", "t", "--poison-queue", "audit"], "--poison-queue must be another queue"),
        (["--checkpoint", "c", "--table-dir", "t", "--error-queue", " , "], "--error-queue names no queue"),
    ]:
        with pytest.raises(SystemExit):
            audit_to_delta.arguments([*url, *flags])
        assert message in capsys.readouterr().err, flags


def test_a_missing_queue_ends_the_job_with_one_line(spark: Any, pg: Backend, names: Any, tmp_path: Path,
                                                     capsys: Any) -> None:
    audit_to_delta = job_module()
    import _config

    error_q = pg.create_queue(names("error"))
    args = audit_to_delta.arguments(["--url", pg.url, "--audit-queue", names("Nowhere"), "--error-queue", error_q,
                                     "--table-dir", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "c"),
                                     "--trigger", "available-now"])
    with pytest.raises(SystemExit) as exited:
        _config.exit_with(lambda: audit_to_delta.run(spark, args))
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and names("Nowhere") in err and "does not exist" in err, err
    assert "Traceback" not in err and "delayed" not in err, err
    assert spark.range(3).count() == 3  # the session the job was lent is still the caller's, running
