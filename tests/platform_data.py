"""Platform traffic as NServiceBus endpoints write it: audit copies of processed messages and
failed messages moved to the error queue (headers per the project's WIRE.md, "The Particular
platform"), and `generate_platform_tables`, which sends such traffic and runs
jobs/audit_to_delta.py over it: a small, realistic pair of Delta tables for notebooks and tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from backends import Backend, nsb_headers

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "audit_to_delta.py"

#: (message type, the endpoint that sends it, the endpoint that handles it, intent)
FLOWS = (
    ("Shop.Messages.PlaceOrder", "Shop.Web", "Sales", "Send"),
    ("Shop.Events.OrderPlaced", "Sales", "Billing", "Publish"),
    ("Shop.Messages.ChargeCard", "Billing", "Payments", "Send"),
    ("Shop.Events.OrderBilled", "Billing", "Shipping", "Publish"),
    ("Shop.Messages.ShipOrder", "Shipping", "Warehouse", "Send"),
)
EXCEPTIONS = (
    ("System.TimeoutException", "The operation has timed out."),
    ("System.InvalidOperationException", "Order {id} is not in a state that can be charged"),
    ("Npgsql.PostgresException", "40001: could not serialize access due to concurrent update"),
)
START = datetime(2025, 11, 26, 8, 0, tzinfo=timezone.utc)


def wire(moment: datetime) -> str:
    """NServiceBus's wire format of a UTC time (DateTimeOffsetHelper)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S:%f Z")


def sent(message_type: str, sender: str, intent: str, time_sent: datetime, message_id: str | None = None,
         **extra: str) -> dict[str, str]:
    """The headers of a message as its sending endpoint wrote them."""
    return nsb_headers(message_id, **{
        "NServiceBus.EnclosedMessageTypes": f"{message_type}, Shop.Messages, Version=1.0.0.0, Culture=neutral, "
                                            "PublicKeyToken=null",
        "NServiceBus.MessageIntent": intent,
        "NServiceBus.TimeSent": wire(time_sent),
        "NServiceBus.OriginatingEndpoint": sender,
        "NServiceBus.OriginatingMachine": f"{sender.lower().replace('.', '-')}-1",
        "NServiceBus.ReplyToAddress": sender,
        **extra,
    })


def audit_copy(headers: dict[str, str], endpoint: str, started: datetime, ended: datetime, **extra: str) -> dict[str, str]:
    """The audit copy an endpoint sends after processing the message with `headers` successfully."""
    return {**headers,
            "NServiceBus.ProcessingStarted": wire(started),
            "NServiceBus.ProcessingEnded": wire(ended),
            "NServiceBus.ProcessingEndpoint": endpoint,
            "NServiceBus.ProcessingMachine": f"{endpoint.lower()}-1",
            "$.diagnostics.hostid": uuid.uuid5(uuid.NAMESPACE_DNS, endpoint).hex,
            "$.diagnostics.hostdisplayname": f"{endpoint.lower()}-1",
            **extra}


def failure_copy(headers: dict[str, str], endpoint: str, failed: datetime, exception_type: str, message: str, *,
                 failed_q: str | None = None, **extra: str) -> dict[str, str]:
    """The copy recoverability moves to the error queue once every retry failed: the retry
    counters removed, the failure headers added. `failed_q`: the endpoint's input queue as a
    transport address (default: the endpoint's name)."""
    kept = {k: v for k, v in headers.items() if k not in ("NServiceBus.Retries", "NServiceBus.FLRetries")}
    return {**kept,
            "NServiceBus.FailedQ": failed_q or endpoint,
            "NServiceBus.ExceptionInfo.ExceptionType": exception_type,
            "NServiceBus.ExceptionInfo.HelpLink": "",
            "NServiceBus.ExceptionInfo.Message": message,
            "NServiceBus.ExceptionInfo.Source": exception_type.split(".")[0],
            "NServiceBus.ExceptionInfo.StackTrace": f"{exception_type}: {message}\n   at Handler.Handle()",
            "NServiceBus.TimeOfFailure": wire(failed),
            "NServiceBus.ProcessingEndpoint": endpoint,
            "NServiceBus.ProcessingMachine": f"{endpoint.lower()}-1",
            "$.diagnostics.hostid": uuid.uuid5(uuid.NAMESPACE_DNS, endpoint).hex,
            "$.diagnostics.hostdisplayname": f"{endpoint.lower()}-1",
            **extra}


def dotnet_guid(text: str) -> str:
    """ServiceControl's DeterministicGuid.MakeId: MD5 of the UTF-8 text read as a .NET Guid."""
    return str(uuid.UUID(bytes_le=hashlib.md5(text.encode("utf-8")).digest()))


def retry_confirmation(unique_id: str, at: datetime) -> dict[str, str]:
    """The control message an endpoint sends to the error queue (the retry's AcknowledgementQueue)
    once it processed a ServicePulse retry: RetryAcknowledgementBehavior's headers, empty body."""
    return {"ServiceControl.Retry.Successful": wire(at), "ServiceControl.Retry.UniqueMessageId": unique_id,
            "NServiceBus.ControlMessage": "True"}


Traffic = list[tuple[dict[str, str], bytes]]


def traffic(n_audit: int, n_failures: int, *, seed: int = 7, ack_queue: str = "error",
            confirmations: bool = False) -> tuple[Traffic, Traffic]:
    """(audit copies, error queue rows): `n_audit` audit copies and `n_failures` failed messages
    over three days of `FLOWS`, some delayed (DeliverAt), some processed at a delayed retry
    (Retries). One audit copy in 25 is a ServicePulse retry of one of the failures that then
    succeeded: same MessageId, ServiceControl.Retry.UniqueMessageId = that failure's unique id,
    acknowledged to `ack_queue`. With `confirmations`, the error queue rows also hold the
    acknowledgement each of those retries sent (`retry_confirmation`), after the failures.
    Deterministic for a seed."""
    rnd = random.Random(seed)
    audit: Traffic = []
    failures: Traffic = []
    originals: list[tuple[dict[str, str], str, datetime, bytes]] = []  # a failure's message, handler, time
    for i in range(n_audit + n_failures):
        message_type, sender, handler, intent = FLOWS[i % len(FLOWS)]
        at = START + timedelta(seconds=rnd.uniform(0, 3 * 86400))
        extra: dict[str, str] = {}
        start = at
        if i % 10 == 3:  # a deferred message: delivered at DeliverAt
            start = at + timedelta(seconds=rnd.uniform(30, 600))
            extra["NServiceBus.DeliverAt"] = wire(start)
        message_id = str(uuid.UUID(int=rnd.getrandbits(128), version=4))
        body = json.dumps({"OrderId": 1000 + i, "Amount": round(rnd.uniform(5, 500), 2)}).encode()
        if i < n_audit:
            if i % 7 == 5:  # processed at its second delayed retry
                extra["NServiceBus.Retries"] = "2"
                extra["NServiceBus.Retries.Timestamp"] = wire(start)
            started = start + timedelta(seconds=rnd.expovariate(1 / 0.8))  # waiting in the queue
            ended = started + timedelta(seconds=rnd.expovariate(1 / 0.15) + 0.002)  # the handler
            audit.append((audit_copy(sent(message_type, sender, intent, at, message_id, **extra), handler, started,
                                     ended), body))
        else:
            exception_type, text = EXCEPTIONS[i % len(EXCEPTIONS)]
            failed = start + timedelta(seconds=rnd.uniform(1, 70))
            message = sent(message_type, sender, intent, at, message_id, **extra)
            originals.append((message, handler, failed, body))
            failures.append((failure_copy(message, handler, failed, exception_type, text.format(id=1000 + i)), body))
    acks: Traffic = []
    for j in range(11, n_audit, 25) if originals else ():  # ServicePulse retries that succeeded
        message, handler, failed, body = originals[(j // 25) % len(originals)]
        unique = dotnet_guid(message["NServiceBus.MessageId"] + handler)
        started = failed + timedelta(seconds=rnd.uniform(300, 7200))  # someone pressed Retry
        ended = started + timedelta(seconds=rnd.expovariate(1 / 0.15) + 0.002)
        audit[j] = (audit_copy({**message, "ServiceControl.Retry.UniqueMessageId": unique,
                                "ServiceControl.Retry.AcknowledgementQueue": ack_queue}, handler, started, ended,
                               **{"ServiceControl.Retry.AcknowledgementSent": "true"}), body)
        acks.append((retry_confirmation(unique, ended), b""))
    return audit, failures + (acks if confirmations else [])


def job_module() -> Any:
    """jobs/audit_to_delta.py as a module (its `run` drives the job on a session of the caller's)."""
    if str(JOB.parent) not in sys.path:
        sys.path.insert(0, str(JOB.parent))
    import audit_to_delta

    return audit_to_delta


def generate_platform_tables(spark_or_none: Any, pg_url: str, names: Any, out_dir: str | Path, *,
                             n_audit: int = 200, n_failures: int = 40, seed: int = 7,
                             confirmations: bool = False) -> dict[str, Any]:
    """Send `n_audit` audit copies and `n_failures` failed messages (`traffic`: five message
    types over six endpoints, three days from 2025-11-26; one audit copy in 25 is the successful
    ServicePulse retry of a failure, with that failure's unique_message_id) to two new queues,
    ``names("audit")`` and ``names("error")`` (with `confirmations`, the error queue also gets the
    retry acknowledgement each of those retries sent, one more failures row each, with failed_q
    NULL), and run jobs/audit_to_delta.py over them with Trigger.AvailableNow: with
    `spark_or_none`, in this process on that session (which must be Delta-enabled, as the tests'
    ``spark`` fixture is); with None, as its own process (its own Spark, about 20 s more).

    Writes ``<out_dir>/audit`` and ``<out_dir>/failures`` (the checkpoint is
    ``<out_dir>/_checkpoint``). Returns::

        {"audit_table": str, "failures_table": str,   # the Delta tables' paths
         "audit_count": int, "failures_count": int,   # rows the job appended to each
         "audit_queue": str, "error_queue": str,      # the queues it drained
         "checkpoint": str, "argv": list[str]}        # to run the job again: audit_to_delta.py *argv
    """
    pg = Backend(pg_url)
    out = Path(out_dir)
    audit_queue, error_queue = pg.create_queue(names("audit")), pg.create_queue(names("error"))
    audit, failures = traffic(n_audit, n_failures, seed=seed, ack_queue=error_queue, confirmations=confirmations)
    pg.send_many(audit_queue, audit)  # type: ignore[arg-type]
    pg.send_many(error_queue, failures)  # type: ignore[arg-type]
    argv = ["--url", pg_url, "--audit-queue", audit_queue, "--error-queue", error_queue, "--table-dir", str(out),
            "--checkpoint", str(out / "_checkpoint"), "--trigger", "available-now",
            "--job-id", "platform-tables"]
    if spark_or_none is not None:
        job = job_module()
        added = job.run(spark_or_none, job.arguments(argv))
    else:
        done = subprocess.run([sys.executable, str(JOB), *argv], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode != 0:
            raise AssertionError(f"audit_to_delta failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        found = re.search(r"audit \+(\d+) rows, failures \+(\d+) rows", done.stdout)
        if found is None:
            raise AssertionError(f"audit_to_delta printed no summary:\n{done.stdout[-3000:]}")
        added = {"audit": int(found[1]), "failures": int(found[2])}
    return {"audit_table": str(out / "audit"), "failures_table": str(out / "failures"),
            "audit_count": added["audit"], "failures_count": added["failures"],
            "audit_queue": audit_queue, "error_queue": error_queue, "checkpoint": str(out / "_checkpoint"),
            "argv": argv}
