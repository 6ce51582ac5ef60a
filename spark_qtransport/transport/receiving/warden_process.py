"""The warden's process (`warden.py` says what it is for): reads the stream's orders on stdin until
the pipe closes, then finishes each queue the stream left unfinished, as the stream would have.

    python -m spark_qtransport.transport.receiving.warden_process   (reads its orders on stdin, JSON lines)
"""

from __future__ import annotations

import base64
import json
import pickle
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ...errors import ConfigError, ConsumerBusyError, QueueNotFoundError, SchemaError
from .planner import ClaimOffset
from .receiver import Receiver
from .warden import GOODBYE

if TYPE_CHECKING:
    from ..settings import ReceiveSettings

__all__ = ["LOCK_WAIT", "finish_queue", "main"]

#: how long the warden waits for a queue's consumer lock (the dead process's session may hold it a moment)
LOCK_WAIT = 3.0


@dataclass
class _Queue:
    settings: ReceiveSettings
    committed: tuple[str, int] | None = None  # (claim table id, claim sequence)
    planned: tuple[str, int] | None = None
    acked: tuple[str, int] | None = None
    prepared: bool = False

    @property
    def unfinished(self) -> bool:
        """A batch may hold claims not acknowledged (planned beyond the last acknowledgement: the
        sink may have settled it, Spark committed it), or prepared claims are to be parked."""
        if self.prepared:
            return True
        if self.planned is None:
            return False
        return self.acked is None or self.acked[0] != self.planned[0] or self.acked[1] < self.planned[1]


def finish_queue(settings: ReceiveSettings, committed: tuple[str, int] | None, *, lock_wait: float = LOCK_WAIT) -> bool:
    """Finish one queue of a stream that is gone: acknowledge its claims up to `committed`, park its
    prepared claims. False: try again later (the server is away, a park failed)."""
    # monitoring reports are best-effort and belong to the stream's own process
    r = Receiver(replace(settings, monitoring_queue=None), draining=True)
    r.set_up.lock_wait = lock_wait
    try:
        try:
            table = r.table_id  # the set-up: the claim table, the consumer lock
        except ConsumerBusyError:
            return True  # a new run holds the queue: what is left is its business
        r.planner.held_max(fresh=True)  # which claims are prepared, which in the claim table
        if committed is not None and committed[0] == table:
            r.ack(ClaimOffset(committed[1], table))
        r.ack_settled()  # a last batch the sink settled before Spark said it committed it
    finally:
        r.close()  # parks what is still prepared, releases the lock
    return r.sessions.finished


def _finish(bound: float, queues: dict[str, _Queue]) -> None:
    left = dict(queues)
    deadline = time.monotonic() + max(bound * 4, 600)
    while True:
        for key, q in list(left.items()):
            try:
                if finish_queue(q.settings, q.committed):
                    del left[key]
            except (QueueNotFoundError, SchemaError, ConfigError):
                del left[key]  # the queue or its claim table is gone, or cannot be used: nothing to finish
            except Exception:  # noqa: BLE001 - the server may be away: tried again at the next round
                pass
        if not left or time.monotonic() >= deadline:
            return
        time.sleep(min(max(bound / 8, 0.5), 5.0))


def main() -> int:
    orders = sys.stdin.readline()
    if not orders:
        return 0
    bound = float(json.loads(orders)["bound"])
    queues: dict[str, _Queue] = {}
    for line in sys.stdin:  # until the stream closes the pipe: gone, or says goodbye first
        line = line.strip()
        if line == GOODBYE:
            return 0
        if not line:
            continue
        order = json.loads(line)
        if "watch" in order:
            if order["watch"] not in queues:
                settings = pickle.loads(base64.b64decode(order["settings"]))  # noqa: S301 - our own parent's, over a pipe
                queues[order["watch"]] = _Queue(settings)
        elif "prepared" in order and order["prepared"] in queues:
            queues[order["prepared"]].prepared = True
        else:
            for what in ("committed", "planned", "acked"):
                if what in order and order[what] in queues:
                    setattr(queues[order[what]], what, (str(order["table"]), int(order["claim"])))
    _finish(bound, {k: q for k, q in queues.items() if q.unfinished})
    return 0


if __name__ == "__main__":
    sys.exit(main())
