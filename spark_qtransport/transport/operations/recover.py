"""Return failed messages from the error queue to the queues they failed in (``NServiceBus.FailedQ``).

What ServiceControl's retry does for NServiceBus endpoints, for a database without ServiceControl:
each message goes back with its headers, minus the failure headers recoverability added, under a
new native id, in one transaction with its removal from the error queue. A message that cannot go
back (no FailedQ, unreadable headers, a queue that no longer exists, an address the routing path
refuses: see `transport.routing`) stays where it is, reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...dialects import Connection, Dialect, QueueAddress
from ...wire import H, decode_headers
from .. import session as db
from ..routing import Item, Router, RoutingPolicy, route_rows

__all__ = ["RetryResult", "retry_failed", "is_failure_header"]

_EXCEPTION_PREFIX = "NServiceBus.ExceptionInfo."


def is_failure_header(name: str) -> bool:
    """Headers NServiceBus recoverability adds when it moves a message to the error queue."""
    return name in (H.FAILED_Q, H.TIME_OF_FAILURE) or name.startswith(_EXCEPTION_PREFIX)


@dataclass
class RetryResult:
    moved: dict[str, int] = field(default_factory=dict)  # destination -> messages
    kept: list[tuple[str, str]] = field(default_factory=list)  # (native id, why it stayed)


def retry_failed(
    conn: Connection, dialect: Dialect, error_queue: QueueAddress, *, native_ids: list[str] | None, limit: int = 1000,
    policy: RoutingPolicy | None = None,
) -> RetryResult:
    """Move failed messages (the given native ids, else the oldest `limit`) back; one transaction."""
    result = RetryResult()
    cur = conn.cursor()
    rows = db.rows(cur, dialect.lock_messages(error_queue, native_ids=native_ids, limit=limit))
    items: list[Item] = []
    ids: dict[str, str] = {}  # key -> native id
    for key, native_id, text in rows:
        ids[str(key)] = native_id = str(native_id).lower()
        headers = decode_headers(text)
        if headers is None:
            result.kept.append((native_id, "headers are not a flat JSON object"))
        elif not headers.get(H.FAILED_Q):
            result.kept.append((native_id, "no NServiceBus.FailedQ header"))
        else:
            kept = {k: v for k, v in headers.items() if not is_failure_header(k)}
            items.append(Item(str(key), kept, headers[H.FAILED_Q]))
    routed = route_rows(
        cur, Router(dialect, policy), items,
        insert=lambda t, keys, headers: dialect.move_messages(error_queue, t.address, keys=keys, headers=headers),
        delete=lambda keys: dialect.delete_messages(error_queue, keys=keys),
        error_queue=None, source="sqlqueue error retry", endpoint="",
    )
    result.moved = routed.moved
    result.kept += [(ids[key], reason) for key, reason in routed.kept]
    conn.commit()
    if native_ids is not None:
        found = set(ids.values())
        result.kept += [(i.lower(), "not in the error queue (or held by another session)") for i in native_ids
                        if i.lower() not in found]
    return result
