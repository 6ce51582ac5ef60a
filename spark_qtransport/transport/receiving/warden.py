"""The warden: a small process that finishes a stream whose driver process is gone.

Spark ends a query's source process without calling its ``stop()``: after ``query.stop()``, at the
end of an AvailableNow run, at a clean exit, at Ctrl-C, as after a SIGKILL. So what a stream must
do at its end is done by a process that outlives it. Each stream starts one with its first batch:
a process in a session of its own, with a minimal environment (no secrets, nothing a process
manager finds the job by), told over a pipe each queue's settings and, as Spark commits batches,
how far each queue's claims are planned, committed (Spark asked for the next offset, or committed
the batch) and acknowledged. When the pipe closes without a goodbye, the stream is gone: at once,
for each queue with a batch not acknowledged or with prepared claims (an idle queue of a stream
over hundreds costs nothing), whose consumer lock it can take within `LOCK_WAIT` (a new run
holding it does all this itself), the warden

- acknowledges the claims up to the last committed offset it was told, and those of a batch the
  sink settled (`transport.settled`), with audit and forwardTo copies and retry acknowledgements,
  as the stream would have (`Receiver.ack`), so a stopped query leaves nothing it processed claimed, and
- moves the prepared claims left into the claim table (`prepared.park`): a prepared transaction
  holds vacuum back for the whole server and locks its queue against DDL,

then exits. A queue it cannot finish (the server away) is tried again every few seconds for as
long as the prepared claims' bound allows (at least 10 minutes).

The stream's end is here (`Warden`: the orders, down a pipe); the process's is
`warden_process.py`, which imports the receiver to finish what it must:

    python -m spark_qtransport.transport.receiving.warden_process   (reads its orders on stdin, JSON lines)
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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..settings import ReceiveSettings

__all__ = ["Warden", "GOODBYE"]

log = logging.getLogger("spark_qtransport.receive")

GOODBYE = "bye"


def _key(settings: ReceiveSettings) -> str:
    return json.dumps([settings.dialect.format_address(settings.queue), settings.consumer])


def _pickled(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


@dataclass
class Warden:
    """The stream's end of the pipe: `watch` each queue at its first planning (its settings go with
    the first order about it), tell it what Spark `committed`, `release` when the stream stops
    itself."""

    bound: float
    _proc: subprocess.Popen[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: (what, queue) -> the last (claim table, claim) told; under `_lock` (told from the background thread too)
    _told: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    #: queue -> its settings, watched but not sent yet (`watch`); under `_lock`
    _unsent: dict[str, ReceiveSettings] = field(default_factory=dict)

    def watch(self, settings: ReceiveSettings) -> None:
        """The warden learns of the queue, and is sent its settings with the first order about it:
        a queue that never holds a batch (most of a stream over hundreds of idle ones) is nothing
        the warden must finish, and costs the pipe nothing."""
        with self._lock:
            self._unsent.setdefault(_key(settings), settings)

    def committed(self, settings: ReceiveSettings, table: str, claim: int) -> None:
        """Every claim of the queue up to `claim` (in claim table `table`) is processed: Spark
        committed its batch. Told once per new position."""
        self._tell("committed", settings, table, claim)

    def planned(self, settings: ReceiveSettings, table: str, claim: int) -> None:
        """A batch reads the queue's claims up to `claim`: held until acknowledged."""
        self._tell("planned", settings, table, claim)

    def acked(self, settings: ReceiveSettings, table: str, claim: int) -> None:
        """The queue's claims up to `claim` are acknowledged."""
        self._tell("acked", settings, table, claim)

    def prepared(self, settings: ReceiveSettings) -> None:
        """The queue holds prepared claims: they are parked at the end, whatever else."""
        key = _key(settings)
        with self._lock:
            self._write(key, {"prepared": key})

    def _tell(self, what: str, settings: ReceiveSettings, table: str, claim: int) -> None:
        key = _key(settings)
        with self._lock:
            told = self._told.get((what, key))
            if told is not None and told[0] == table and told[1] >= claim:
                return
            self._told[(what, key)] = (table, claim)
            self._write(key, {what: key, "table": table, "claim": claim})

    def _write(self, key: str, order: dict[str, Any]) -> None:
        """Under `_lock`: one order about queue `key` down the pipe (the warden started first),
        after that queue's settings if they are not sent yet (`watch`)."""
        try:
            if self._proc is None:
                self._proc = self._start()
            assert self._proc.stdin is not None
            settings = self._unsent.get(key)
            if settings is not None:
                # the settings hold the URL (its password): through the pipe, never an argument or the environment
                self._proc.stdin.write(json.dumps({"watch": key, "settings": _pickled(settings)}) + "\n")
            self._proc.stdin.write(json.dumps(order) + "\n")
            self._proc.stdin.flush()
            self._unsent.pop(key, None)
        except OSError as exc:  # the stream goes on; a restart finishes what the warden could not
            log.warning("the stream's warden could not be told (%s): %s", next(iter(order)), exc)

    def _start(self) -> subprocess.Popen[str]:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.Popen([sys.executable, "-m", "spark_qtransport.transport.receiving.warden_process"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, start_new_session=True, text=True)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"bound": self.bound}) + "\n")
        proc.stdin.flush()
        return proc

    def release(self, *, finished: bool) -> None:
        """The stream stops itself: `finished`, every queue's committed claims are acknowledged and
        its prepared claims parked (the warden just exits); else the warden finishes them."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None or proc.stdin is None:
            return
        try:
            if finished:
                proc.stdin.write(GOODBYE + "\n")
            proc.stdin.close()
        except OSError:
            pass
