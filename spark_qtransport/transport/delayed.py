"""Delayed delivery: move due messages from ``<endpoint>.Delayed`` to their destinations.

NServiceBus stores a deferred message in the sending endpoint's delayed table with the header
``NServiceBus.SqlServer.ForwardDestination``; every endpoint instance polls it with a back-off of
up to a minute. Here one mover at a time per table (a transaction-scoped advisory lock / applock)
runs whenever the reader plans a trigger, the sink commits a batch, or the CLI asks, and moves due
rows in bounded batches straight to their destination with that header removed. A row without the
header belongs to the endpoint's own input queue. Destinations go through the one routing path
(`transport.routing`): a row whose destination does not exist, is not a queue or is outside the
allow-list goes to the error queue with NServiceBus's failure headers. Bodies never leave the server.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..dialects import Dialect, QueueAddress
from ..wire import H, decode_headers
from . import session as db
from .routing import Item, Router, RoutingPolicy, route_rows

__all__ = ["DelayedMover", "MoveResult", "MOVE_BATCH"]

log = logging.getLogger("spark_qtransport.delayed")

#: rows moved per transaction
MOVE_BATCH = 1000


@dataclass
class MoveResult:
    moved: int = 0
    failed: int = 0  # sent to the error queue
    busy: bool = False  # another mover held the table
    destinations: dict[str, int] = field(default_factory=dict)


@dataclass
class DelayedMover:
    """Moves due messages of one delayed table. Not thread-safe; one per connection user."""

    dialect: Dialect
    delayed: QueueAddress
    endpoint: QueueAddress  # the endpoint's input queue: destination of rows without the header
    error_queue: QueueAddress
    batch: int = MOVE_BATCH
    policy: RoutingPolicy | None = None

    def move(self, conn: Any, *, max_batches: int = 20) -> MoveResult:
        """Move due rows, at most `max_batches` transactions of `batch` rows. Commits each."""
        result = MoveResult()
        cur = conn.cursor()
        for _ in range(max_batches):
            if db.first(cur, self.dialect.any_due(self.delayed)) is None:
                conn.commit()
                break
            (locked,) = db.one(cur, self.dialect.lock_mover(self.delayed))
            if not locked:
                conn.rollback()
                result.busy = True
                break
            rows = db.rows(cur, self.dialect.due_delayed(self.delayed, limit=self.batch))
            self._move_rows(cur, rows, result)
            conn.commit()
            if len(rows) < self.batch:
                break
        if result.moved or result.failed:
            log.info("moved %d due delayed message(s) from %s (%d to the error queue)",
                     result.moved, self.dialect.qualified(self.delayed), result.failed)
        return result

    def _move_rows(self, cur: Any, rows: list[Any], result: MoveResult) -> None:
        d = self.dialect
        # Destinations are looked up afresh in each transaction: a queue may have been created,
        # dropped, or lost or regained its Recoverable column since (SQL Server).
        router = Router(d, self.policy)
        own = None
        items = []
        for key, text in rows:
            headers = decode_headers(text)
            if headers is None:  # not ours to repair: the error queue gets it as it was
                items.append(Item(str(key), None, None, raw=text))
                continue
            target = headers.pop(H.FORWARD_DESTINATION, None)
            if target is None:  # no header: the endpoint's own input queue ("" is refused)
                own = own or router.trusted(cur, self.endpoint)
            items.append(Item(str(key), headers, own if target is None else target))
        if not items:
            return
        routed = route_rows(
            cur, router, items,
            insert=lambda t, keys, headers: d.move_delayed(self.delayed, t.address, keys=keys, headers=headers),
            delete=lambda keys: d.delete_delayed(self.delayed, keys=keys),
            error_queue=lambda: router.configured(cur, self.error_queue, option="errorQueue"),
            source="spark_qtransport.delayed", endpoint=self.endpoint.table,
        )
        result.moved += sum(routed.moved.values())
        result.failed += routed.failed
        for name, n in routed.moved.items():
            result.destinations[name] = result.destinations.get(name, 0) + n
        if routed.failed:
            log.warning("%d delayed message(s) could not be delivered; moved to %s",
                        routed.failed, d.format_address(self.error_queue))
