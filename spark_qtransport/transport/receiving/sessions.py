"""The driver's connections of one stream, shared by all its queues.

A stream over one queue or a thousand holds the same few server connections on the driver:

- `main`: what Spark waits on (pattern resolution, backlogs, claims, a run's first and last
  acknowledgements, due delayed messages). It holds every queue's consumer lock: each new
  connection runs the set-up of every queue of the stream (`SetUps`), and a queue that joins runs
  its own set-up on the connection open then (`EndpointSetUp.ensure`).
- `ahead`: the one background thread's (`Background`): claims ahead, acknowledgements, the
  backlog a one-queue stream reports in progress. One thread for every queue: their work runs in
  the order given.

Monitoring reports have a session of their own (`reports`: best-effort, its own retry policy),
also one for the stream, shared by every queue's monitor. So a stream holds at most three
connections on the driver whatever it reads, plus one per executor read task. Made and closed by
the stream's owner: `QueueSet` for a stream over several queues, `Receiver` for one over a single
queue.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...dialects import Connection, Dialect
from ...errors import QueueNotFoundError
from .. import session as db
from ..platform.monitoring import ReportSession
from ..session import Session
from .background import Background
from .setup import ConnectionFacts, PreparedSlots, look_ahead
from .warden import Warden

if TYPE_CHECKING:
    from ..settings import ReceiveSettings
    from .setup import EndpointSetUp

__all__ = ["SetUps", "StreamSessions"]

log = logging.getLogger("spark_qtransport.receive")


class SetUps:
    """`on_connect` of a stream's main session: every queue's set-up (checks, claim table, consumer
    lock) on each new connection. A queue whose tables are gone is skipped here (its own receiver
    meets the error when it next runs, and leaves a pattern's stream): one dropped tenant must not
    cost the others their connection."""

    def __init__(self) -> None:
        self._set_ups: dict[int, EndpointSetUp] = {}

    def add(self, set_up: EndpointSetUp) -> None:
        self._set_ups[id(set_up)] = set_up

    def remove(self, set_up: EndpointSetUp) -> None:
        self._set_ups.pop(id(set_up), None)

    def __call__(self, conn: Connection) -> None:
        several = len(self._set_ups) > 1
        look_ahead(conn, list(self._set_ups.values()))
        for set_up in list(self._set_ups.values()):
            try:
                set_up(conn)
            except QueueNotFoundError as exc:
                if not several:
                    raise
                log.info("set-up of %s skipped on a new connection: %s", set_up.endpoint.queue_text, exc)


class StreamSessions:
    """The main and background sessions and the background thread of one stream (see the module)."""

    def __init__(self, dialect: Dialect, url: Any, *, what: str) -> None:
        self.set_ups = SetUps()
        self.slots = PreparedSlots()
        self.facts = ConnectionFacts()
        self.dialect = dialect
        self.main = Session(dialect, url, what=what, on_connect=self._connected)
        self.ahead = Session(dialect, url, what=what)
        self.background = Background()
        self._reports: ReportSession | None = None
        #: the whole stream is closing: a queue leaving keeps its lock until the connection closes
        self.closing = False
        self._warden: Warden | None = None
        #: every queue acknowledged what Spark committed and parked its prepared claims on stop
        #: (else the warden does)
        self.finished = True

    def warden(self, bound: float) -> Warden:
        """The warden that finishes the stream once its process is gone (`warden.py`), started
        when first told of a queue."""
        if self._warden is None:
            self._warden = Warden(bound)
        return self._warden

    def reports(self, settings: ReceiveSettings) -> ReportSession:
        """The session every queue's monitor sends its reports on (opened on the first report)."""
        if self._reports is None:
            self._reports = ReportSession(settings)
        return self._reports

    def _connected(self, conn: Connection) -> None:
        """A new main connection: note the server's connection limit (named if it is ever
        reached: `session.CONNECTION_LIMITS`), then every queue's set-up."""
        (limit,) = db.one(conn.cursor(), self.dialect.connection_limit())
        conn.commit()
        if limit is not None:
            db.CONNECTION_LIMITS[self.main.backoff.database] = int(limit)
        self.set_ups(conn)

    def join(self, set_up: EndpointSetUp) -> None:
        """A queue's set-up runs on every new main connection from now on."""
        set_up.slots, set_up.facts = self.slots, self.facts
        self.set_ups.add(set_up)

    def set_up_together(self, set_ups: list[EndpointSetUp]) -> None:
        """Before queues that joined the stream run their set-ups on the open main connection (its
        first planning: each queue's `ensure`), read what they will ask in a few statements
        (`look_ahead`). Opening the connection here runs every set-up (`SetUps`) instead."""
        current = self.main.current
        if current is not None and sum(s.conn is not current for s in set_ups) < 2:
            return
        self.main.run(lambda conn: look_ahead(conn, set_ups), "setting up the queues of a stream")

    def leave(self, set_up: EndpointSetUp) -> None:
        """A queue leaves the stream: its consumer lock is released, the connection stays."""
        self.set_ups.remove(set_up)
        if self.main.connected and not self.closing:
            set_up.unlock(self.main.connection())

    def close(self) -> None:
        """Wait for the background work, then close both connections (releasing every lock)."""
        try:
            self.background.shutdown()
        finally:
            self.ahead.close()
            self.main.close()
            if self._reports is not None:
                self._reports.close()
            if self._warden is not None:
                self._warden.release(finished=self.finished)
