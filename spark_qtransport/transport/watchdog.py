"""Connections that hang: a transaction that has had no answer for `responseTimeout`.

A failover, a dead load balancer or a network partition can leave a connection open with nobody
answering at the other end: the statement's read waits forever, no error ever comes, and the
outage policy (`session.with_retries`) never gets a fault to ride through. TCP keepalives do not
help when something in between still acknowledges packets (a proxy, a NAT).

So every watched transaction has a deadline. When it passes, the watchdog asks the server on a
connection of its own whether it is still running a statement of that session (a long statement
is legitimate: the deadline moves on). If the server says no, or cannot be asked (the probe's
connect times out), the watched connection's socket is cut: the blocked read fails at once as a
lost connection, and the policy retries the work on a new one.

One daemon thread per process; nothing runs while nothing is watched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..dialects import Connection, Dialect

__all__ = ["WATCHDOG", "Watchdog"]

log = logging.getLogger("spark_qtransport.db")


@dataclass
class _Watch:
    dialect: Dialect
    url: Any
    conn: Connection
    backend: Any
    what: str
    deadline: float


class Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watched: dict[int, _Watch] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, dialect: Dialect, url: Any, conn: Connection, what: str) -> Iterator[None]:
        """Watch `conn` while the block runs (one transaction, or one round trip): the block must
        not wait on anything but the server (a watched connection idle in its transaction for
        `responseTimeout` is taken for a lost one)."""
        seconds = float(getattr(url, "response", 0) or 0)
        backend = dialect.backend_of(conn) if seconds > 0 else None
        if backend is None:
            yield
            return
        with self._cond:
            key = self._next = self._next + 1
            self._watched[key] = _Watch(dialect, url, conn, backend, what, time.monotonic() + seconds)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sqlqueue-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._watched.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [(k, w) for k, w in self._watched.items() if w.deadline <= now]
                if not due:
                    later = min((w.deadline for w in self._watched.values()), default=now + 60.0)
                    self._cond.wait(max(later - now, 0.05))
                    continue
            for key, watch in due:
                self._check(key, watch)

    def _check(self, key: int, watch: _Watch) -> None:
        working, reason = False, "its server says it is not working on it"
        try:
            probe = watch.dialect.connect(watch.url)
            try:
                working = watch.dialect.is_working(probe, watch.backend)
            finally:
                probe.close()
        except Exception as exc:  # noqa: BLE001 - a server that cannot be asked is no answer either
            reason = f"its server cannot be asked ({watch.dialect.error_text(exc)})"
        with self._cond:
            if self._watched.get(key) is not watch:
                return  # answered meanwhile
            if working:
                watch.deadline = time.monotonic() + float(watch.url.response)
                return
            self._watched.pop(key, None)
        log.warning("%s: no answer for %.0f s and %s: its connection is cut and the work retried on a new one "
                    "(responseTimeout)", watch.what, watch.url.response, reason)
        try:
            watch.dialect.cut(watch.conn)
        except Exception as exc:  # noqa: BLE001 - closed meanwhile: nothing left to cut
            log.debug("cutting a connection failed: %s", exc)


#: this process's watchdog
WATCHDOG = Watchdog()
