"""Delayed delivery: moving due messages from ``<endpoint>.Delayed`` to their queues."""

from __future__ import annotations

from abc import abstractmethod

from .addressing import AddressingSql
from .values import QueueAddress, Statement


class DelayedSql(AddressingSql):
    """The SQL of the delayed mover."""

    @abstractmethod
    def any_due(self, delayed: QueueAddress) -> Statement:
        """Zero or one row: is any delayed message due? A read, no lock: an idle check costs no write."""

    @abstractmethod
    def lock_mover(self, delayed: QueueAddress) -> Statement:
        """One row, one boolean: this transaction is the delayed table's only mover (xact-scoped)."""

    @abstractmethod
    def due_delayed(self, delayed: QueueAddress, *, limit: int) -> Statement:
        """Lock and return at most `limit` due rows (key text, headers), oldest due first, skipping
        rows other transactions hold."""

    @abstractmethod
    def move_delayed(
        self, delayed: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
    ) -> Statement:
        """INSERT the delayed rows `keys` (in that order) into `destination` with new ids and the
        given headers (ForwardDestination removed), bodies copied server-side."""

    @abstractmethod
    def delete_delayed(self, delayed: QueueAddress, *, keys: list[str]) -> Statement:
        """Delete the delayed rows `keys`."""
