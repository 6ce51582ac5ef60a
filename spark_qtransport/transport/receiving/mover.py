"""The endpoint's delayed messages: the endpoint receiving from queue Q owns a delayed table
(``Q.Delayed`` unless the options say otherwise: `DelayedTableRule`), so a reader delivers its due
messages every trigger."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...dialects import QueueAddress
from .. import session as db
from ..delayed import DelayedMover
from ..session import Session
from .setup import Endpoint

__all__ = ["DELAYED_RECHECK", "DueDelayed"]

log = logging.getLogger("spark_qtransport.receive")

#: how often a reader looks again whether its endpoint's delayed table exists
DELAYED_RECHECK = 30.0


class DueDelayed:
    """Moves the due messages of the queue's delayed table on the main session, if it exists."""

    def __init__(self, endpoint: Endpoint, main: Session, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoint, self._main, self._clock = endpoint, main, clock
        # None: a queue name too long to have a delayed table (NServiceBus allows 55 bytes)
        self._delayed: QueueAddress | None = endpoint.options.delayed
        self._checked_at: float | None = None
        self._mover: DelayedMover | None = None  # made once the table is found: with the set-up dialect

    def move(self) -> None:
        """Every trigger, so a due message waits at most one trigger interval. Costs one indexed
        read when none is due. A failure is logged, never fails the query: the next trigger tries
        again."""
        if self._delayed is None:
            return
        d = self.endpoint.dialect
        try:
            if (delayed := self.to_check()) is not None:
                self._find(delayed)
            if self._mover is not None:
                self._mover.move(self._main.connection())
        except Exception as exc:  # noqa: BLE001
            if self._main.connected:
                db.rollback(self._main.connection())
            log.warning("moving due delayed messages of %s failed: %s", self.endpoint.options.queue,
                        db.describe(d, exc))

    def to_check(self) -> QueueAddress | None:
        """The delayed table, if it is time to look again whether it exists (a stream over many
        queues looks for all of theirs in one statement, then tells each `found`)."""
        if self._delayed is None:
            return None
        if self._checked_at is not None and self._clock() - self._checked_at <= DELAYED_RECHECK:
            return None
        return self._delayed

    def found(self, exists: bool) -> None:
        """Whether the delayed table exists, as looked up just now."""
        d, o = self.endpoint.dialect, self.endpoint.options
        assert self._delayed is not None
        self._mover = (self._mover or DelayedMover(d, self._delayed, o.queue, o.error_queue, policy=o.routing)) \
            if exists else None
        self._checked_at = self._clock()

    def _find(self, delayed: QueueAddress) -> None:
        """Look whether the delayed table exists (`found`)."""
        d = self.endpoint.dialect
        cols = self._main.run(lambda c: db.columns(c.cursor(), d.queue_columns(delayed)),
                              self.endpoint.what("find delayed table"))
        self.found(bool(cols))
