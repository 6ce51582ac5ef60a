"""Delayed delivery: move due messages from ``<endpoint>.Delayed`` to their destinations.

NServiceBus stores a deferred message in the sending endpoint's delayed table with the header
``NServiceBus.SqlServer.ForwardDestination``; every endpoint instance polls it with a back-off of
up to a minute. Here one mover at a time per table (a transaction-scoped advisory lock / applock)
runs whenever the reader plans a trigger, the sink commits a batch, or the CLI asks, and moves due
rows in bounded batches straight to their destination with that header removed. A row without the
header belongs to the endpoint's own input queue. A row whose destination does not exist goes to
the error queue with NServiceBus's failure headers. Bodies never leave the server.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..dialects import Dialect, QueueAddress
from ..errors import ConfigError
from ..wire import H, decode_headers, encode_headers, failure_headers
from . import _db as db

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
    _exists: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)

    def _columns(self, cur: Any, address: QueueAddress) -> dict[str, str]:
        key = self.dialect.qualified(address)
        cols = self._exists.get(key)
        if not cols:
            cols = db.columns(cur, self.dialect.queue_columns(address))
            if cols:
                self._exists[key] = cols
        return cols

    def move(self, conn: Any, *, max_batches: int = 20) -> MoveResult:
        """Move due rows, at most `max_batches` transactions of `batch` rows. Commits each."""
        # Destinations' columns are looked up afresh each call: a queue may have been created,
        # dropped, or lost or regained its Recoverable column since (SQL Server).
        self._exists.clear()
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
            rows = cur.execute(*db.args(self.dialect.due_delayed(self.delayed, limit=self.batch))).fetchall()
            done = MoveResult()
            try:
                self._move_rows(cur, rows, done)
            except Exception as exc:
                if not (self.dialect.is_undefined_table(exc) and self._exists):
                    raise
                # a queue this mover saw earlier was dropped since: look again, route its rows to errors
                conn.rollback()
                self._exists.clear()
                continue
            conn.commit()
            result.moved += done.moved
            result.failed += done.failed
            for name, n in done.destinations.items():
                result.destinations[name] = result.destinations.get(name, 0) + n
            if len(rows) < self.batch:
                break
        if result.moved or result.failed:
            log.info("moved %d due delayed message(s) from %s (%d to the error queue)",
                     result.moved, self.dialect.qualified(self.delayed), result.failed)
        return result

    def _move_rows(self, cur: Any, rows: list[Any], result: MoveResult) -> None:
        d = self.dialect
        groups: dict[str, tuple[QueueAddress, list[str], list[str]]] = {}
        failed_keys: list[str] = []
        failed_headers: list[str] = []
        for key, text in rows:
            key = str(key)
            headers = decode_headers(text)
            if headers is None:  # not ours to repair: the error queue gets it as it was
                failed_keys.append(key)
                failed_headers.append(text)
                continue
            target_text = headers.pop(H.FORWARD_DESTINATION, None)
            problem = None
            target = self.endpoint
            if target_text:
                try:
                    target = d.parse_address(target_text, option=H.FORWARD_DESTINATION)
                except ConfigError as exc:
                    problem = str(exc)
            if problem is None and not self._columns(cur, target):
                problem = f"queue {target_text or d.format_address(target)} does not exist"
            if problem is not None:
                failed_keys.append(key)
                failed_headers.append(encode_headers(self._failure(headers, target_text, problem)))
                continue
            name = d.qualified(target)
            group = groups.setdefault(name, (target, [], []))
            group[1].append(key)
            group[2].append(encode_headers(headers))
        for name, (target, keys, headers_list) in groups.items():
            recoverable = "recoverable" in self._columns(cur, target)
            db.execute(cur, d.move_delayed(self.delayed, target, keys=keys, headers=headers_list, recoverable=recoverable))
            result.moved += len(keys)
            result.destinations[name] = result.destinations.get(name, 0) + len(keys)
        if failed_keys:
            if not self._columns(cur, self.error_queue):
                raise ConfigError(
                    f"delayed messages in {d.qualified(self.delayed)} cannot be delivered and the error queue "
                    f"{d.format_address(self.error_queue)} does not exist; create it (option 'errorQueue')"
                )
            recoverable = "recoverable" in self._columns(cur, self.error_queue)
            db.execute(cur, d.move_delayed(self.delayed, self.error_queue, keys=failed_keys,
                                           headers=failed_headers, recoverable=recoverable))
            result.failed += len(failed_keys)
            log.warning("%d delayed message(s) could not be delivered; moved to %s",
                        len(failed_keys), d.format_address(self.error_queue))
        all_keys = [k for _, keys, _ in groups.values() for k in keys] + failed_keys
        if all_keys:
            db.execute(cur, d.delete_delayed(self.delayed, keys=all_keys))

    def _failure(self, headers: dict[str, Any], target: str | None, problem: str) -> dict[str, Any]:
        return failure_headers(
            headers, failed_q=target or self.dialect.format_address(self.endpoint),
            exception_type="spark_qtransport.QueueNotFoundError", message=problem,
            source="spark_qtransport.delayed", endpoint=self.endpoint.table,
        )
