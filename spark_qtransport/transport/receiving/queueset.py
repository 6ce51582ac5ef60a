"""Several queues in one stream: one `Receiver` per queue (its own claim table, consumer lock,
FIFO order, poison and expiry handling, platform work), composed for the Spark reader.

The offset holds one claim position per queue (`QueueSetOffset`). Each batch's rows are shared
among the queues by max-min fairness over their backlogs (`fair_shares`), so a small queue is
never starved by a large one. With a pattern the queues are resolved again at each trigger: a
queue that appears joins from its head; one that disappears (dropped, renamed, no longer
matching) is read to the end of what was claimed from it, then leaves the stream with one log line.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ...dialects import Dialect, QueueAddress
from ...errors import OffsetError, QueueNotFoundError
from ..selection import QueueSelection
from ..session import Session
from .admission import fair_shares
from .planner import ClaimOffset, ClaimSlice
from .receiver import Receiver

T = TypeVar("T")

if TYPE_CHECKING:
    from ..settings import StreamSettings

__all__ = ["QueueSet", "QueueSetOffset"]

log = logging.getLogger("spark_qtransport.receive")


@dataclass(frozen=True)
class QueueSetOffset:
    """A Spark offset of a several-queue stream: each queue's `ClaimOffset`, by its canonical address."""

    queues: dict[str, ClaimOffset]

    def to_dict(self) -> dict[str, Any]:
        return {"queues": {k: self.queues[k].to_dict() for k in sorted(self.queues)}}

    @classmethod
    def from_dict(cls, d: Any) -> QueueSetOffset:
        if isinstance(d, dict) and isinstance(d.get("queues"), dict):
            return cls({str(k): ClaimOffset.from_dict(v) for k, v in d["queues"].items()})
        raise OffsetError(
            f"offset {json.dumps(d)[:200]} is not the offset of a several-queue sqlqueue stream; expected e.g. "
            '{"queues": {"public.Sales": {"claim": 42, "claimTable": "16384"}}}. A checkpoint of a one-queue '
            "stream cannot be reused for several queues: start this stream from a new checkpoint"
        )


class QueueSet:
    """The driver side of a stream over several queues: the `Receiver` API, per queue."""

    def __init__(self, stream: StreamSettings) -> None:
        self.stream = stream
        self.selection: QueueSelection = stream.selection
        self.dialect: Dialect = stream.dialect
        self.receivers: dict[str, Receiver] = {}
        self._lister = Session(self.dialect, stream.url, what=f"resolving {stream.describe()}")
        self._frozen: list[QueueAddress] | None = None  # AvailableNow: the queues at its start
        self._now: dict[str, QueueAddress] | None = None  # the last resolution
        self._gone: set[str] = set()  # queues that left the stream, read to their end
        #: each queue's messages waiting, as `waiting` last counted them (`latest(counted=True)` uses them)
        self._demand: dict[str, int] | None = None

    @property
    def claimed(self) -> int:
        """Messages this query's claims took so far, over every queue."""
        return sum(r.claimed for r in self.receivers.values())

    # -- queues ---------------------------------------------------------------------------------

    def key(self, address: QueueAddress) -> str:
        """A queue's canonical address text, its key in offsets (the default schema spelled out)."""
        d = self.dialect
        return d.format_address(QueueAddress(address.table, address.schema or d.default_schema, address.catalog))

    def current(self) -> dict[str, QueueAddress]:
        """The queues the stream reads now (a pattern resolved again; AvailableNow: as at its start)."""
        if self._frozen is not None:
            found = self._frozen
        elif self.selection.pattern is None:
            found = list(self.selection.queues)
        else:
            o = self.stream
            found = self._lister.run(
                lambda c: self.selection.resolve(c.cursor(), self.dialect, excluded=o.excluded,
                                                 own_table=lambda a: o.routing.is_own_table(self.dialect, a)),
                f"resolving {o.describe()}",
            )
        queues = {self.key(a): a for a in found}
        if not queues and (self._now is None or self._now):
            log.warning("%s matches no queue table (yet): nothing to read", self.stream.describe())
        if self._now is not None:
            for k in sorted(queues.keys() - self._now.keys()):
                log.info("queue %s joins the stream of %s (from its head)", k, self.selection.describe(self.dialect))
        self._now = queues
        self._gone -= queues.keys()  # a queue created again joins again
        return queues

    def receiver(self, key: str, address: QueueAddress | None = None, *, draining: bool | None = None) -> Receiver:
        """The queue's receiver, made on first use. `draining` None: whether the queue has left the
        stream (is not in the last resolution)."""
        if draining is None:
            now = self._now if self._now is not None else self.current()
            draining = key not in now
            address = address or now.get(key)
        r = self.receivers.get(key)
        if r is None:
            target = address if address is not None else self.dialect.parse_address(key, option="queue")
            r = self.receivers[key] = Receiver(self.stream.settings_for(target), draining=draining)
        else:  # it may have left the stream, or come back (a dropped queue created again)
            r.draining = draining
        return r

    # -- offsets ------------------------------------------------------------------------------

    def initial_offset(self) -> QueueSetOffset:
        return QueueSetOffset({k: self.receiver(k, a, draining=False).initial_offset()
                               for k, a in sorted(self.current().items())})

    def prepare_available_now(self) -> None:
        now = self.current()
        self._frozen = list(now.values())
        for k, a in now.items():
            self.receiver(k, a, draining=False).prepare_available_now()

    def first_batch(self, *, fresh: bool) -> QueueSetOffset:
        """Spark 4.0/4.1, the first batch of a run: every queue's held claims and waiting messages
        (`Receiver.first_batch`); no shares, as that batch takes all."""
        ends: dict[str, ClaimOffset] = {}
        for k, a in sorted(self.current().items()):
            r = self.receiver(k, a, draining=False)
            end = self._vanishing(k, functools.partial(r.first_batch, fresh=fresh), None)
            if end is not None:
                ends[k] = end
        return QueueSetOffset(ends)

    def waiting(self, start: QueueSetOffset | None) -> int:
        """Messages a batch planned now could take, over every queue (`Receiver.waiting`)."""
        starts = start.queues if start is not None else {}
        demand: dict[str, int] = {}
        for k, a in self.current().items():
            r = self.receiver(k, a, draining=False)
            demand[k] = self._vanishing(k, functools.partial(r.waiting, starts.get(k)), 0)
        self._demand = demand
        return sum(demand.values())

    def _vanishing(self, key: str, work: Callable[[], T], gone: T) -> T:
        """`work` for a queue a pattern matched at this trigger's start; `gone` if it was dropped
        since (it leaves the stream at the next trigger, its held claims read to the end then)."""
        try:
            return work()
        except QueueNotFoundError:
            if self.selection.pattern is None:
                raise
            log.info("queue %s was dropped during this trigger; it leaves %s at the next", key, self.stream.describe())
            return gone

    def latest(self, start: QueueSetOffset | None, limit: int | None, *, whole: bool = False,
               counted: bool = False) -> QueueSetOffset:
        """Plan the next batch over every queue: each queue's share of `limit` (None: all), the
        held claims of leaving queues; a leaving queue with nothing left leaves the offset.
        `counted`: `waiting` ran in this trigger; its counts make the shares."""
        starts = dict(start.queues) if start is not None else {}
        now = self.current()
        ends: dict[str, ClaimOffset] = {}
        active = {k: self.receiver(k, a, draining=False) for k, a in now.items()}
        demand = self._demand if counted else None
        self._demand = None
        shares = self._shares(active, starts, limit, demand)
        for k, r in active.items():
            plan = functools.partial(self._latest_of, k, r, starts, shares.get(k), whole, demand is not None and k in demand)
            end: ClaimOffset | None = self._vanishing(k, plan, None)
            if end is not None:
                ends[k] = end
            elif k in starts:
                ends[k] = starts[k]
        for k in sorted((starts.keys() | self.receivers.keys()) - now.keys() - (self._gone - starts.keys())):
            end = self._drain(k, starts.get(k), limit)
            if end is not None:
                ends[k] = end
        return QueueSetOffset(ends)

    def _latest_of(self, key: str, r: Receiver, starts: dict[str, ClaimOffset], share: int | None, whole: bool,
                   counted: bool) -> ClaimOffset | None:
        return r.latest(self._start_for(key, r, starts), share, whole=whole, counted=counted)

    def _waiting_of(self, key: str, r: Receiver, starts: dict[str, ClaimOffset]) -> int:
        return r.waiting(self._start_for(key, r, starts))

    def _start_for(self, key: str, r: Receiver, starts: dict[str, ClaimOffset]) -> ClaimOffset:
        """A queue's start: its position in the offset, or its claim table's beginning (joining)."""
        return starts.get(key) or r.initial_offset()

    def _shares(self, active: dict[str, Receiver], starts: dict[str, ClaimOffset], limit: int | None,
                counted: dict[str, int] | None) -> dict[str, int]:
        """Each queue's rows of `limit` (none: no limit). `counted`: what `waiting` counted in this
        trigger (minMessagesPerTrigger asked first), used rather than counted again."""
        if limit is None or not active:
            return {}
        if len(active) == 1:
            return dict.fromkeys(active, limit)
        demand = {k: counted[k] if counted is not None and k in counted
                  else self._vanishing(k, functools.partial(self._waiting_of, k, r, starts), 0)
                  for k, r in active.items()}
        return fair_shares(demand, limit)

    def _drain(self, key: str, start: ClaimOffset | None, limit: int | None) -> ClaimOffset | None:
        """A queue that left the selection: its held claims form batches until none is left, then
        it leaves the stream (None)."""
        try:
            r = self.receiver(key, draining=True)
            begin = start or r.initial_offset()
            end = r.latest(begin, limit)
            if end != begin:
                return end
            # Spark plans a batch only once the one ending at `begin` is processed: acknowledge it
            # here, as its commit() may come after the queue has left (then it is ignored)
            r.ack(begin)
        except QueueNotFoundError:  # its claim table is gone too: nothing left to deliver
            pass
        gone = self.receivers.pop(key, None)
        self._gone.add(key)
        if gone is not None:
            gone.close()
        log.warning("queue %s left %s: read to the end of what was claimed from it; dropped from the stream",
                    key, self.stream.describe())
        return None

    # -- progress -----------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        queues = {k: {**r.report(), "backlog": r.reported_backlog()} for k, r in sorted(self.receivers.items())}
        return {"queues": queues, "backlog": sum(q["backlog"] for q in queues.values())}

    # -- partitions and acknowledgement -------------------------------------------------------

    def processed(self, upto: QueueSetOffset) -> None:
        """Every batch up to `upto` is processed, in each queue (`Receiver.processed`)."""
        for k, e in upto.queues.items():
            if k in self.receivers:
                self.receivers[k].processed(e)

    def slices(self, start: QueueSetOffset, end: QueueSetOffset) -> list[ClaimSlice]:
        parts: list[ClaimSlice] = []
        for k, e in sorted(end.queues.items()):
            s = start.queues.get(k) or ClaimOffset(0, e.table)
            if s == e:
                continue
            parts += self.receiver(k).slices(s, e)
        return parts

    def ack(self, end: QueueSetOffset, *, background: bool = False) -> None:
        for k, e in end.queues.items():
            if k in self._gone:  # acknowledged when it left the stream
                continue
            try:
                self.receiver(k).ack(e, background=background)
            except QueueNotFoundError:
                log.info("not acknowledging queue %s: its claim table no longer exists", k)

    def close(self) -> None:
        errors = []
        for r in self.receivers.values():
            try:
                r.close()
            except Exception as exc:  # noqa: BLE001 - close every queue's receiver, then report
                errors.append(exc)
        self.receivers.clear()
        self._lister.close()
        if errors:
            raise errors[0]

