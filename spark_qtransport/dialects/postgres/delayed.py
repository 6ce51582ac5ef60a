"""PostgreSQL delayed delivery: due rows of ``<endpoint>.Delayed`` moved by one mover at a time.

A row is due as NServiceBus's MoveDueDelayedMessageText judges it, `Due < now() AT TIME ZONE
'UTC'` (see `statements.DUE_NOW`): the same rows whichever mover runs, on any server TimeZone.
"""

from __future__ import annotations

from ..base import DelayedSql, QueueAddress, Statement
from .operations import PostgresOperations
from .statements import UTC_NOW


class PostgresDelayed(PostgresOperations, DelayedSql):
    """The PostgreSQL delayed delivery of the dialect."""

    def any_due(self, delayed: QueueAddress) -> Statement:
        return Statement(f"SELECT 1 FROM {self.qualified(delayed)} WHERE due < {UTC_NOW} LIMIT 1")

    def lock_mover(self, delayed: QueueAddress) -> Statement:
        return Statement(
            "SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended(%(key)s, 0))",
            {"key": f"sqlqueue mover {self.qualified(delayed)}"},
        )

    def due_delayed(self, delayed: QueueAddress, *, limit: int) -> Statement:
        return Statement(
            f"SELECT id::text, headers FROM {self.qualified(delayed)} WHERE due < {UTC_NOW}"
            " ORDER BY due LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
            {"limit": int(limit)},
        )

    def move_delayed(
        self, delayed: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
    ) -> Statement:
        return self.move_messages(delayed, destination, keys=keys, headers=headers)

    def delete_delayed(self, delayed: QueueAddress, *, keys: list[str]) -> Statement:
        return self.delete_messages(delayed, keys=keys)
