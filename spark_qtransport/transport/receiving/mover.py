"""The endpoint's delayed messages: NServiceBus's convention is that the endpoint receiving from
queue Q owns ``Q.Delayed``, so a reader delivers its due messages every trigger."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...dialects import QueueAddress
from ...errors import ConfigError
from .. import session as db
from ..delayed import DelayedMover
from ..session import Session
from .setup import Endpoint

__all__ = ["DELAYED_RECHECK", "DueDelayed"]

log = logging.getLogger("spark_qtransport.receive")

#: how often a reader looks again whether its endpoint's delayed table exists
DELAYED_RECHECK = 30.0


class DueDelayed:
    """Moves the due messages of ``<queue>.Delayed`` on the main session, if that table exists."""

    def __init__(self, endpoint: Endpoint, main: Session, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoint, self._main, self._clock = endpoint, main, clock
        self._delayed: QueueAddress | None = None
        o = endpoint.options
        try:
            self._delayed = endpoint.dialect.companion(o.queue, "Delayed")
        except ConfigError:  # a queue name too long to have a delayed table (its name would pass the database's limit)
            pass
        self._checked_at: float | None = None
        self._mover: DelayedMover | None = None  # made once the table is found: with the set-up dialect

    def move(self) -> None:
        """Every trigger, so a due message waits at most one trigger interval. Costs one indexed
        read when none is due. A failure is logged, never fails the query: the next trigger tries
        again."""
        if self._delayed is None:
            return
        d, now = self.endpoint.dialect, self._clock()
        try:
            if self._checked_at is None or now - self._checked_at > DELAYED_RECHECK:
                self._mover = self._find(self._delayed)
                self._checked_at = now
            if self._mover is not None:
                self._mover.move(self._main.connection())
        except Exception as exc:  # noqa: BLE001
            if self._main.connected:
                db.rollback(self._main.connection())
            log.warning("moving due delayed messages of %s failed: %s", self.endpoint.options.queue,
                        db.describe(d, exc))

    def _find(self, delayed: QueueAddress) -> DelayedMover | None:
        """The mover of the delayed table, if it exists."""
        d, o = self.endpoint.dialect, self.endpoint.options
        cols = self._main.run(lambda c: db.columns(c.cursor(), d.queue_columns(delayed)),
                              self.endpoint.what("find delayed table"))
        if not cols:
            return None
        return self._mover or DelayedMover(d, delayed, o.queue, o.error_queue, policy=o.routing)
