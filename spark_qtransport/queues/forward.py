"""Forwarding: claimed messages that carry ``NServiceBus.SqlServer.ForwardDestination``. Dialect-free.

NServiceBus's delayed-message mover puts due messages into the *endpoint's own* input queue with
that header still on; the receiving endpoint then forwards each to the queue the header names, in
its receive transaction, with the header removed, the same native id and no expiry. A message
whose header names the input queue itself just loses the header and is processed; one whose
destination does not exist goes to the error queue with the failure headers and ``FailedQ`` set
to that destination (NServiceBus's ``ProcessStrategy.TryHandleDelayedMessage``).

Our own mover delivers straight to the destination, but an NServiceBus instance of the same
endpoint (or an older mover) may share the delayed table, so the reader does what an endpoint
does: the claim transaction flags rows whose headers text mentions the header, and `forward`
settles them before the claim commits. A batch never shows such a row to Spark.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..dialects import Dialect, QueueAddress
from ..errors import ConfigError
from ..wire import H, decode_headers, encode_headers, failure_headers
from . import _db as db

__all__ = ["ForwardResult", "forward_claimed"]

log = logging.getLogger("spark_qtransport.forward")


@dataclass
class ForwardResult:
    forwarded: int = 0  # moved to another queue
    local: int = 0  # addressed to the input queue itself: header removed, delivered to Spark
    failed: int = 0  # destination missing or not an address: moved to the error queue


def forward_claimed(
    dialect: Dialect,
    cur: Any,
    *,
    queue: QueueAddress,
    claims: QueueAddress,
    consumer: str,
    error_queue: QueueAddress,
    lo: int,
    hi: int,
) -> ForwardResult:
    """Forward the consumer's claims in [lo, hi] that carry a ForwardDestination header, inside
    the caller's (claim) transaction. Rows that only look like it are left as they are."""
    d = dialect
    result = ForwardResult()
    own = d.qualified(queue)
    local: tuple[list[int], list[str]] = ([], [])
    groups: dict[str, tuple[QueueAddress, list[int], list[str]]] = {}
    columns: dict[str, dict[str, str]] = {}  # each destination's columns, looked up once

    def columns_of(address: QueueAddress) -> dict[str, str]:
        name = d.qualified(address)
        if name not in columns:
            columns[name] = db.columns(cur, d.queue_columns(address))
        return columns[name]

    for seq, text in cur.execute(*db.args(d.forward_candidates(claims, consumer, lo=lo, hi=hi))).fetchall():
        headers = decode_headers(text)
        if headers is None or H.FORWARD_DESTINATION not in headers:
            continue  # the name appears in a value, or a poison check let it through: deliver as is
        target_text = headers.pop(H.FORWARD_DESTINATION)
        problem = None
        target = queue
        if target_text:
            try:
                target = d.parse_address(target_text, option=H.FORWARD_DESTINATION)
            except ConfigError as exc:
                problem = str(exc)
        if problem is None and d.qualified(target) == own:
            local[0].append(int(seq))
            local[1].append(encode_headers(headers))
            continue
        if problem is None:
            if not columns_of(target):
                problem = f"queue {target_text} does not exist"
            else:
                group = groups.setdefault(d.qualified(target), (target, [], []))
                group[1].append(int(seq))
                group[2].append(encode_headers(headers))
                continue
        failed = failure_headers(
            headers, failed_q=str(target_text), exception_type="spark_qtransport.QueueNotFoundError",
            message=f"cannot forward the message to its destination: {problem}",
            source="spark_qtransport.forward", endpoint=queue.table,
        )
        group = groups.setdefault("", (error_queue, [], []))
        group[1].append(int(seq))
        group[2].append(encode_headers(failed))
    if local[0]:
        db.execute(cur, d.set_claim_headers(claims, consumer, keys=local[0], headers=local[1]))
        result.local = len(local[0])
    moved: list[int] = []
    for name, (target, keys, headers_list) in groups.items():
        recoverable = "recoverable" in columns_of(target)
        db.execute(cur, d.forward_claims(claims, consumer, target, keys=keys, headers=headers_list,
                                         recoverable=recoverable))
        moved += keys
        if name:
            result.forwarded += len(keys)
        else:
            result.failed += len(keys)
    if moved:
        db.execute(cur, d.drop_claims(claims, consumer, keys=moved))
    if result.forwarded or result.failed:
        log.info("queue %s: forwarded %d message(s) to their ForwardDestination, %d to %s",
                 d.format_address(queue), result.forwarded, result.failed, d.format_address(error_queue))
    return result
