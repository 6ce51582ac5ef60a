"""Queues known to be empty without looking at them: a stream's idle check at many queues.

A stream counts every queue's backlog at each trigger (`QueueSet.count`), an index probe of each
queue table; at a thousand queues that is most of an idle trigger, and most of what idle tenants
cost the server. A queue's rows draw their FIFO numbers from a sequence that only moves forward,
and whoever inserts a row moves it first (NServiceBus, our sink, the delayed mover: none names
`seq`). So one statement reads every queue's sequence (`Dialect.sequence_values`) and a queue is
not peeked while its sequence stands where it stood when the queue was known to be empty.

Known to be empty, not merely seen empty: a peek cannot see the row of a sender whose transaction
took its number before the peek and commits after it. So the sequences are read first, then which
queue tables a transaction holds a writer's lock on (an INSERT takes its lock before its number and
keeps it to its end), then the peek. A queue whose peek found nothing, with no writer between its
sequence's reading and the peek, is known to be empty up to that number: each sender that took one
had ended before the peek, which saw its row if it committed. A row that reappears (a competing
consumer's DELETE rolled back) was never invisible to a peek, which reads rows whatever their locks.
Each such queue is still peeked every `RECHECK` seconds (spread out), in case a row arrives without
its number (an INSERT naming `seq`).

A queue whose sequence cannot be read (no sequence found, a cached sequence, no SELECT or USAGE on
it, a dialect without the hint) is peeked at every trigger, as before.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...dialects import Connection, Dialect, QueueAddress
from ...errors import DatabaseError
from .. import session as db

__all__ = ["QuietQueues", "RECHECK"]

log = logging.getLogger("spark_qtransport.receive")

#: a queue judged empty by its sequence is still peeked at least this often (seconds; each queue
#: at a random point of the second half of the interval, so the peeks spread over the triggers)
RECHECK = 30.0
#: a queue whose sequence was not found is looked for again after this long (seconds)
LOOK_AGAIN = 60.0
#: sequences read in one transaction: reading one locks it to the transaction's end, and the
#: server's lock table is shared by all sessions (`queueset.BACKLOGS_PER_STATEMENT`: 400 entries too)
SEQUENCES_PER_TRANSACTION = 400

#: `Session.run`: a function of a connection run in a transaction, retried; its operation's name
Run = Callable[[Callable[[Connection], Any], str], Any]


@dataclass
class _Queue:
    """What is known of one queue's sequence."""

    sequence: int | None  # its oid; None: none usable (looked for at `looked`)
    table: int | None  # the queue table's oid
    looked: float
    value: int | None = None  # the sequence's value when the queue was known to be empty (module doc)
    recheck: float = 0.0  # when such a queue is peeked anyway


class QuietQueues:
    """Per queue of a stream, whether its backlog can be taken as 0 without a peek this trigger.

    Each trigger: `read` (a transaction per `SEQUENCES_PER_TRANSACTION` queues: their sequences,
    and in the last, after them, the writers' locks on the tables of all those to be peeked; one
    more statement first for queues not looked up yet), then `quiet(key)` for each queue, then
    `peeked(key, estimate)` for each queue peeked."""

    def __init__(self, dialect: Dialect, *, clock: Callable[[], float] = time.monotonic,
                 recheck: float = RECHECK) -> None:
        self.dialect = dialect
        #: the dialect has the hint (`Dialect.sequence_values`); without it every queue is peeked
        self.enabled = dialect.sequence_values([]) is not None
        self._clock, self._recheck = clock, recheck
        self._queues: dict[str, _Queue] = {}
        self._values: dict[str, int] = {}  # this trigger's readings
        self._quiet: set[str] = set()  # this trigger's queues known to be empty: not peeked
        self._written: set[str] = set()  # queues a writer held a lock on after their reading

    def read(self, run: Run, queues: Mapping[str, QueueAddress]) -> None:
        """This trigger's readings of `queues`' sequences (a failure only means every queue is peeked)."""
        self._values, self._quiet, self._written = {}, set(), set()
        if not self.enabled or not queues:
            return
        for gone in self._queues.keys() - queues.keys():
            del self._queues[gone]
        try:
            self._look_up(run, queues)
            keys = sorted(k for k in queues if self._queues[k].sequence is not None)
            peeked: list[str] = []  # the earlier parts' queues to be peeked
            for start in range(0, len(keys), SEQUENCES_PER_TRANSACTION):
                part = keys[start:start + SEQUENCES_PER_TRANSACTION]
                last = start + SEQUENCES_PER_TRANSACTION >= len(keys)
                values, quiet, mine, written = run(functools.partial(self._read, part, peeked if last else None),
                                                   "reading the queues' sequences")
                self._values.update((part[i], v) for i, v in values)
                self._quiet.update(part[i] for i in quiet)
                peeked += mine
                self._written.update(written)
        except DatabaseError as exc:  # e.g. a queue dropped between the catalog and the sequence
            log.debug("queues' sequences not read (%s): every queue is peeked this trigger", exc)
            for q in self._queues.values():
                q.sequence = None
            self._values, self._quiet, self._written = {}, set(), set()
            return
        for k in keys:  # no row: the sequence is gone, cached or not ours to read: look again later
            if k not in self._values:
                self._queues[k].sequence = None

    def _read(self, keys: list[str], earlier: list[str] | None,
              conn: Connection) -> tuple[list[tuple[int, int]], set[int], list[str], set[str]]:
        """The sequences of `keys`; which of them are known to be empty by them; the others, to be
        peeked; and in the last part (`earlier`: the other parts' queues to be peeked), after every
        sequence (module doc), which of the queues to be peeked a writer holds a lock on: one
        statement a trigger."""
        d, cur, now = self.dialect, conn.cursor(), self._clock()
        stmt = d.sequence_values([self._queues[k].sequence or 0 for k in keys])
        assert stmt is not None
        values = [(int(i), int(v)) for i, v in db.rows(cur, stmt)]
        quiet = {i for i, v in values if self._queues[keys[i]].value == v and now < self._queues[keys[i]].recheck}
        mine = [keys[i] for i, _ in values if i not in quiet]
        peeked = [] if earlier is None else earlier + mine
        if not peeked:
            return values, quiet, mine, set()
        stmt = d.tables_written([self._queues[k].table or 0 for k in peeked])
        assert stmt is not None
        return values, quiet, mine, {peeked[int(j)] for (j,) in db.rows(cur, stmt)}

    def _look_up(self, run: Run, queues: Mapping[str, QueueAddress]) -> None:
        now = self._clock()
        keys = sorted(k for k in queues if (q := self._queues.get(k)) is None
                      or (q.sequence is None and now - q.looked >= LOOK_AGAIN))
        if not keys:
            return
        stmt = self.dialect.sequences_of([queues[k] for k in keys])
        assert stmt is not None
        rows = run(lambda c: db.rows(c.cursor(), stmt), "looking up the queues' sequences")
        found = {int(i): (int(s), int(t)) for i, s, t in rows}
        for i, k in enumerate(keys):
            sequence, table = found.get(i, (None, None))
            self._queues[k] = _Queue(sequence, table, now)

    def quiet(self, key: str) -> bool:
        """Whether `key`'s queue is known to be empty without a peek this trigger."""
        return key in self._quiet

    def peeked(self, key: str, estimate: int) -> None:
        """A peek this trigger found `estimate` in `key`'s queue."""
        q, value = self._queues.get(key), self._values.get(key)
        if q is None:
            return
        if estimate or value is None or key in self._written:
            q.value = None
        else:
            q.value = value
            q.recheck = self._clock() + self._recheck * random.uniform(0.5, 1.0)
