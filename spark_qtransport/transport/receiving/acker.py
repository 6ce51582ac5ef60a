"""Acknowledge: once Spark commits a batch, its claims are deleted in bounded batches.
Idempotent: a repeated acknowledgement deletes nothing."""

from __future__ import annotations

import logging
import threading

from .. import session as db
from ..session import Session
from .background import Background
from .planner import ClaimOffset, ReceiveStats
from .setup import Endpoint
from .vacuum import vacuum_if_due

__all__ = ["Acker"]

log = logging.getLogger("spark_qtransport.receive")


class Acker:
    """Deletes this consumer's claims up to an offset: on the main session, or on the background
    one after any claim in flight."""

    def __init__(self, endpoint: Endpoint, main: Session, ahead: Session, background: Background,
                 stats: ReceiveStats) -> None:
        self.endpoint, self.stats = endpoint, stats
        self._main, self._ahead, self._background = main, ahead, background
        self._count = threading.Lock()  # stats.acked is added to from both threads

    def ack(self, end: ClaimOffset) -> int:
        """Acknowledge now; the number of claims deleted."""
        return self._ack(self._main, end)

    def ack_in_background(self, end: ClaimOffset) -> None:
        """Acknowledge on the background thread. Nothing waits on it, and a lost one is repaired
        by the next, which deletes everything up to its own end."""
        self._background.submit(self._ack_logged, end)

    def _ack_logged(self, end: ClaimOffset) -> None:
        try:
            self._ack(self._ahead, end)
        except Exception as exc:  # noqa: BLE001 - the next acknowledgement covers these claims too
            log.warning("acknowledging claims up to %s on %s failed: %s", end.claim, self.endpoint.options.queue,
                        db.describe(self.endpoint.dialect, exc))

    def _ack(self, session: Session, end: ClaimOffset) -> int:
        d, o = self.endpoint.dialect, self.endpoint.options
        batch = o.ack_batch
        stmt = d.ack_claims(self.endpoint.claims, o.consumer, upto=end.claim, batch=batch)
        total = 0
        while True:
            n = session.run(lambda c: db.rowcount(c.cursor(), stmt), self.endpoint.what("acknowledge"))
            total += n
            if n < batch:
                break
        with self._count:
            self.stats.acked += total
        if total and session.connected:
            vacuum_if_due(d, session.connection(), self.endpoint.claims)
        return total
