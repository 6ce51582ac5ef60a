"""Forwarding: claimed messages that carry ``NServiceBus.SqlServer.ForwardDestination``. Dialect-free.

NServiceBus's delayed-message mover puts due messages into the *endpoint's own* input queue with
that header still on; the receiving endpoint then forwards each to the queue the header names, in
its receive transaction, with the header removed, a new native id and no expiry. A message
whose header names the input queue itself just loses the header and is processed; one whose
destination does not exist goes to the error queue with the failure headers and ``FailedQ`` set
to that destination (NServiceBus's ``ProcessStrategy.TryHandleDelayedMessage``). Destinations go
through the one routing path (`transport.routing`): a header naming a table that is not a queue, a
system table or a table outside the allow-list sends that message to the error queue, and the claim
goes on.

Our own mover delivers straight to the destination, but an NServiceBus instance of the same
endpoint (or an older mover) may share the delayed table, so the reader does what an endpoint
does: the claim transaction flags rows whose headers text mentions the header, and `forward`
settles them before the claim commits. A batch never shows such a row to Spark.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...dialects import Cursor, Dialect, QueueAddress
from ...wire import H, decode_headers, encode_headers
from .. import session as db
from ..routing import Item, Router, route_rows

__all__ = ["ForwardResult", "forward_claimed"]

log = logging.getLogger("spark_qtransport.forward")


@dataclass
class ForwardResult:
    forwarded: int = 0  # moved to another queue
    local: int = 0  # addressed to the input queue itself: header removed, delivered to Spark
    failed: int = 0  # destination missing, refused or not an address: moved to the error queue


def forward_claimed(
    dialect: Dialect,
    cur: Cursor,
    *,
    router: Router,
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
    items: list[Item] = []
    for seq, text in db.rows(cur, d.forward_candidates(claims, consumer, lo=lo, hi=hi)):
        headers = decode_headers(text)
        if headers is None or H.FORWARD_DESTINATION not in headers:
            continue  # the name appears in a value, or a poison check let it through: deliver as is
        target = headers.pop(H.FORWARD_DESTINATION)
        if not target or _names(d, target, own):
            local[0].append(int(seq))
            local[1].append(encode_headers(headers))
        else:
            items.append(Item(int(seq), headers, target))
    if local[0]:
        db.execute(cur, d.set_claim_headers(claims, consumer, keys=local[0], headers=local[1]))
        result.local = len(local[0])
    if items:
        routed = route_rows(
            cur, router, items,
            insert=lambda t, keys, headers: d.forward_claims(claims, consumer, t.address, keys=keys, headers=headers),
            delete=lambda keys: d.drop_claims(claims, consumer, keys=keys),
            error_queue=lambda: router.configured(cur, error_queue, field="error_queue"),
            source="spark_qtransport.forward", endpoint=queue.table,
        )
        result.forwarded, result.failed = sum(routed.moved.values()), routed.failed
    if result.forwarded or result.failed:
        log.info("queue %s: forwarded %d message(s) to their ForwardDestination, %d to %s",
                 d.format_address(queue), result.forwarded, result.failed, d.format_address(error_queue))
    return result


def _names(d: Dialect, text: str, own: str) -> bool:
    """Does the header name the input queue itself (however it is spelled)?"""
    try:
        return d.qualified(d.parse_address(text, option=H.FORWARD_DESTINATION)) == own
    except Exception:  # noqa: BLE001 - not an address at all: the routing path says why
        return False
