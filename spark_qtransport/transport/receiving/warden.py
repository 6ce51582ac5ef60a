"""The warden: a small process that outlives a driver killed with prepared claims outstanding.

A prepared transaction outlives the session that prepared it, and holds vacuum back for the whole
server until someone commits it. A stream that stops parks its claims itself (`Receiver.close`);
one killed (SIGKILL, a lost machine, the scheduler's kill) cannot. So a stream holding prepared
claims starts a warden: a process in a session of its own, with a minimal environment (no
secrets, nothing a process manager finds the job by), told the stream's queues over a pipe. When
the pipe closes without a goodbye, the driver is gone: the warden waits until the claims are half
their bound old (a quick restart takes them over as they are), then, for each queue whose consumer
lock it can take (no new run holds it), parks its consumer's prepared claims into the claim table
(`prepared.park`) and exits. A restarted run that holds the lock first does that itself.

    python -m spark_qtransport.transport.receiving.warden   (reads its orders on stdin, JSON lines)
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Warden"]

log = logging.getLogger("spark_qtransport.receive")

GOODBYE = "bye"


@dataclass
class Warden:
    """The driver's end of the pipe: `watch` each queue once its claims are prepared, `release` when
    the stream stops."""

    url: Any  # ConnectionURL
    bound: float
    _proc: subprocess.Popen[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def watch(self, queue: str, consumer: str) -> None:
        with self._lock:
            try:
                if self._proc is None:
                    self._proc = self._start()
                assert self._proc.stdin is not None
                self._proc.stdin.write(json.dumps({"queue": queue, "consumer": consumer}) + "\n")
                self._proc.stdin.flush()
            except OSError as exc:  # the stream goes on; its own stop and restart park as well
                log.warning("the warden of prepared claims could not be told of queue %s: %s", queue, exc)

    def _start(self) -> subprocess.Popen[str]:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.Popen([sys.executable, "-m", "spark_qtransport.transport.receiving.warden"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, start_new_session=True, text=True)
        assert proc.stdin is not None
        # the URL (its password) goes through the pipe, never an argument or the environment
        url = base64.b64encode(pickle.dumps(self.url)).decode("ascii")
        proc.stdin.write(json.dumps({"url": url, "bound": self.bound}) + "\n")
        proc.stdin.flush()
        return proc

    def release(self, *, parked: bool) -> None:
        """The stream stops: `parked`, its claims are all in the claim table (the warden just
        exits); else the warden parks what is left, as after a crash."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None or proc.stdin is None:
            return
        try:
            if parked:
                proc.stdin.write(GOODBYE + "\n")
            proc.stdin.close()
        except OSError:
            pass


def _park_orphans(url: Any, bound: float, queues: list[tuple[str, str]]) -> None:
    """Park the prepared claims the dead driver's consumers left, queue by queue, once they are
    half their bound old; skip a queue whose lock a new run holds. Returns when none is left."""
    from .. import session as db
    from ..settings import ReceiveSettings
    from . import prepared
    from .setup import Endpoint

    left = list(queues)
    deadline = time.monotonic() + max(bound * 4, 600)
    while left and time.monotonic() < deadline:
        time.sleep(max(bound / 8, 0.5))
        for queue, consumer in list(left):
            o = ReceiveSettings.create(url, queue, consumer=consumer)
            d = o.dialect
            endpoint = Endpoint(o, d, d.claims_table(o.queue))
            try:
                conn = d.connect(o.url)
            except Exception:  # noqa: BLE001 - the server may be away: try again later
                continue
            try:
                cur = conn.cursor()
                (locked,) = db.one(cur, d.try_lock_consumer(endpoint.claims, consumer))
                conn.commit()
                if not locked:  # a new run holds the queue: its claims are its own business
                    left.remove((queue, consumer))
                    continue
                (table,) = db.one(cur, d.table_id(endpoint.claims))
                conn.commit()
                held = prepared.listed(endpoint, cur, str(table))
                conn.commit()
                if not held:
                    left.remove((queue, consumer))
                for claim in held:
                    if claim.age >= bound / 2:
                        prepared.park(conn, endpoint, claim)
            except Exception:  # noqa: BLE001 - tried again at the next round
                pass
            finally:
                db.close(conn)


def main() -> int:
    orders = sys.stdin.readline()
    if not orders:
        return 0
    first = json.loads(orders)
    queues: list[tuple[str, str]] = []
    for line in sys.stdin:  # until the driver closes the pipe: dies, or says goodbye first
        line = line.strip()
        if line == GOODBYE:
            return 0
        if line:
            order = json.loads(line)
            if (order["queue"], order["consumer"]) not in queues:
                queues.append((order["queue"], order["consumer"]))
    url = pickle.loads(base64.b64decode(first["url"]))  # noqa: S301 - our own parent's, over a pipe
    _park_orphans(url, float(first["bound"]), queues)
    return 0


if __name__ == "__main__":
    sys.exit(main())
