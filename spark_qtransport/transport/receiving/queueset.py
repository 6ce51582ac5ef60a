"""The queues of a stream: one `Receiver` per queue (its own claim table, consumer lock, FIFO
order, poison and expiry handling, platform work), composed for the Spark reader. Every stream is
a `QueueSet`; a one-queue stream is one of one (`QueueSet.single`): its checkpoint keeps the plain
`ClaimOffset` form it always had, and it plans from its receiver alone (nothing to share).

The offset holds one claim position per queue (`QueueSetOffset`). Each batch's rows are shared
among the queues by max-min fairness over their backlogs (`fair_shares`), so a small queue is
never starved by a large one; busy queues too many to give each a useful share take turns. With a
pattern the queues are resolved again at each trigger: a queue that appears joins from its head;
one that disappears (dropped, renamed, no longer matching) is read to the end of what was claimed
from it, then leaves the stream with one log line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ...dialects import Connection, Dialect, QueueAddress, Statement
from ...errors import DatabaseError, OffsetError, QueueNotFoundError
from .. import session as db
from ..selection import QueueSelection
from .acker import Forget, Joined, forget_together
from .admission import fair_shares, taking_turns
from .claimer import ClaimOutcome, ClaimRequest
from .planner import ClaimOffset, ClaimSlice
from .prepared import all_on_server
from .quiet import QuietQueues
from .receiver import REPORTED, Receiver
from .sessions import StreamSessions

T = TypeVar("T")

if TYPE_CHECKING:
    from ..settings import StreamSettings

__all__ = ["QueueSet", "QueueSetOffset"]

log = logging.getLogger("spark_qtransport.receive")

#: queues whose backlogs one statement reads, in a transaction of its own: its locks (two relations
#: a queue, held to its end) stay well inside the server's lock table, which all sessions share
#: (max_locks_per_transaction x max_connections: 1,920 entries at 30 connections)
BACKLOGS_PER_STATEMENT = 200
#: queues whose claims (or acknowledgements) one transaction makes: a claim locks five or so
#: relations of its queue to the transaction's end (the queue, the claim table, their indexes), so
#: 50 take about 300 of the lock table's entries; a transaction over a thousand queues would take
#: most of a default server's 6,400 (max_locks_per_transaction 64 x max_connections 100)
QUEUES_PER_TRANSACTION = 50
#: a pattern is resolved again at least this often (seconds), even when the catalog's version
#: (`Dialect.catalog_version`) says nothing changed
RESOLVE_AGAIN = 60.0


@dataclass(frozen=True)
class QueueSetOffset:
    """A Spark offset of a several-queue stream: each queue's `ClaimOffset`, by its canonical address.

    Each position is written as a pair, ``[claim, claimTable]``: Spark passes the offset between the
    JVM and the source's process at every trigger, through a 64 KB buffer, and a message larger
    than that can wait 40 ms for a delayed TCP acknowledgement. At 1,000 queues the pairs make
    about 40 KB where ``{"claim": ..., "claimTable": ...}`` made 66 KB. Checkpoints written with
    that earlier form are read as well."""

    queues: dict[str, ClaimOffset]

    def to_dict(self) -> dict[str, Any]:
        return {"queues": {k: [self.queues[k].claim, self.queues[k].table] for k in sorted(self.queues)}}

    @classmethod
    def from_dict(cls, d: Any) -> QueueSetOffset:
        if isinstance(d, dict) and isinstance(d.get("queues"), dict):
            return cls({str(k): _position(str(k), v) for k, v in d["queues"].items()})
        raise OffsetError(
            f"offset {json.dumps(d)[:200]} is not the offset of a several-queue sqlqueue stream; expected e.g. "
            '{"queues": {"public.Sales": [42, "16384"]}}. A checkpoint of a one-queue '
            "stream cannot be reused for several queues: start this stream from a new checkpoint"
        )


def _position(key: str, v: Any) -> ClaimOffset:
    """One queue's position in a several-queue offset: ``[claim, claimTable]``, or the
    ``{"claim": ..., "claimTable": ...}`` of checkpoints written before."""
    if isinstance(v, list) and len(v) == 2 and type(v[0]) is int and isinstance(v[1], str):
        return ClaimOffset(v[0], v[1])
    if isinstance(v, dict):
        with contextlib.suppress(OffsetError):
            return ClaimOffset.from_dict(v)
    raise OffsetError(f"queue {key} in offset: {json.dumps(v)[:100]} is not a position; expected e.g. "
                      '[42, "16384"] (claim, claim table)')


def _parts(items: list[T]) -> list[list[T]]:
    """`items` in parts of at most `QUEUES_PER_TRANSACTION`, a transaction each."""
    return [items[i:i + QUEUES_PER_TRANSACTION] for i in range(0, len(items), QUEUES_PER_TRANSACTION)]


def _ack_in(joined: list[tuple[Receiver, ClaimOffset]], conn: Connection) -> list[Joined]:
    """Joined acknowledgements in one transaction (`QueueSet._ack_part`): each queue's chunk, then
    the batches' records of them all forgotten together (`forget_together`)."""
    forgets: list[Forget] = []
    made = [r.acker.ack_in(conn, e, forgets) for r, e in joined]
    forget_together(conn.cursor(), forgets)
    return made


def _append_to(handed: list[tuple[Receiver, ClaimOffset]]) -> Callable[[Receiver, ClaimOffset], None]:
    return lambda r, e: handed.append((r, e))


@dataclass(frozen=True)
class _Claim:
    """One queue's claim of a trigger, made with the other queues' (`QueueSet._claim_together`)."""

    receiver: Receiver
    after: int
    share: int | None
    request: ClaimRequest


class QueueSet:
    """The driver side of a stream: the `Receiver` API, per queue."""

    def __init__(self, stream: StreamSettings) -> None:
        self.stream = stream
        self.selection: QueueSelection = stream.selection
        self.dialect: Dialect = stream.dialect
        self.receivers: dict[str, Receiver] = {}
        one = self.selection.single
        #: the key of a one-queue stream's queue, else None: its offsets are the plain `ClaimOffset`
        #: (`offset`, `encode`), and its batches need no count, as there is nothing to share (`latest`)
        self.single: str | None = None if one is None else self.key(one)
        what = (f"connecting for {stream.describe()}" if one is None
                else f"connecting on queue {self.dialect.format_address(one)}")
        #: the stream's few connections and its background thread, shared by every queue
        self.sessions = StreamSessions(self.dialect, stream.url, what=what)
        self._frozen: dict[str, QueueAddress] | None = None  # AvailableNow: the queues at its start
        self._now: dict[str, QueueAddress] | None = None  # the last resolution
        self._gone: set[str] = set()  # queues that left the stream, read to their end
        #: each queue's messages waiting, as `waiting` last counted them (`latest(counted=True)` uses them)
        self._demand: dict[str, int] | None = None
        #: the last queue a batch served while the busy queues took turns (`fair_shares`)
        self._turn: str | None = None
        #: each queue's backlog as the last count estimated it, and its claimed total then (`report`)
        self._backlogs: dict[str, tuple[int, int]] = {}
        #: the catalog rows the pattern was last judged on, and the queues it matched, by key
        self._matched: tuple[tuple[Any, ...], dict[str, QueueAddress]] | None = None
        #: the catalog's version at the last resolution (`_resolve`), and when that was (monotonic)
        self._catalog: tuple[Any, float] = (None, 0.0)
        #: the offset last read or encoded, and its dict: Spark hands the end of an idle trigger back
        #: as the next one's start, and the reader reads a start twice (at 1,000 queues 2 ms each)
        self._known: tuple[Any, QueueSetOffset] | None = None
        #: the backlog statement of each part of the queues (`_estimates`), kept while they stay
        self._backlog_sql: dict[tuple[str, ...], Statement] = {}
        #: the queues known to be empty by their sequences, not peeked at this trigger
        self._quiet = QuietQueues(self.dialect)

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
            queues = dict(self._frozen)
        elif self.selection.pattern is None:
            queues = self._keyed(self.selection.queues)
        else:
            queues = self._resolve()
        if not queues and (self._now is None or self._now):
            log.warning("%s matches no queue table (yet): nothing to read", self.stream.describe())
        if self._now is not None:
            for k in sorted(queues.keys() - self._now.keys()):
                log.info("queue %s joins the stream of %s (from its head)", k, self.selection.describe(self.dialect))
        self._now = queues
        self._gone -= queues.keys()  # a queue created again joins again
        return queues

    def _keyed(self, found: Iterable[QueueAddress]) -> dict[str, QueueAddress]:
        return {self.key(a): a for a in found}

    def _resolve(self) -> dict[str, QueueAddress]:
        """The queues the pattern matches now, by key: the catalog's version (`Dialect.catalog_version`),
        and only when it changed (or `RESOLVE_AGAIN` has passed) the catalog statement; its rows
        judged again only when they changed since the last trigger. The version is read first: a
        table created after it makes the next trigger's differ."""
        o, d = self.stream, self.dialect
        assert self.selection.pattern is not None
        stmt, version = d.list_queues(like=self.selection.pattern.like(d)), d.catalog_version()
        now = time.monotonic()

        def resolve(conn: Connection) -> tuple[Any, tuple[tuple[Any, ...], ...] | None]:
            cur = conn.cursor()
            seen = None if version is None else tuple(db.rows(cur, version)[0])
            if (seen is not None and self._matched is not None and seen == self._catalog[0]
                    and now - self._catalog[1] < RESOLVE_AGAIN):
                return seen, None
            return seen, tuple(tuple(r) for r in db.rows(cur, stmt))

        seen, rows = self.sessions.main.run(resolve, f"resolving {o.describe()}")
        if rows is None:
            assert self._matched is not None
            return dict(self._matched[1])
        self._catalog = (seen, now)
        if self._matched is None or self._matched[0] != rows:
            self._matched = (rows, self._keyed(self.selection.matching(
                rows, d, excluded=o.excluded, own_table=lambda a: o.routing.is_own_table(d, a))))
        return dict(self._matched[1])

    def receiver(self, key: str, address: QueueAddress | None = None, *, draining: bool | None = None) -> Receiver:
        """The queue's receiver, made on first use. `draining` None: whether the queue has left the
        stream (is not in the last resolution)."""
        if draining is None:
            now = self._now if self._now is not None else self.current()
            draining = key not in now
            address = address or now.get(key)
        r = self.receivers.get(key)
        if r is None:
            target = address if address is not None else self.dialect.parse_address(key, field="queue")
            r = self.receivers[key] = Receiver(self.stream.settings_for(target), draining=draining,
                                               sessions=self.sessions)
        else:  # it may have left the stream, or come back (a dropped queue created again)
            r.draining = draining
        return r

    # -- offsets ------------------------------------------------------------------------------

    def offset(self, d: Any) -> QueueSetOffset:
        """An offset from Spark's checkpoint: a one-queue stream's plain `ClaimOffset`, a
        several-queue stream's map (with or without Spark 4.0/4.1's ``run`` tag). A checkpoint
        cannot switch between the two."""
        known = self._known
        if known is not None and (d is known[0] or d == known[0]):
            return known[1]  # the offset given last, or read last (a trigger reads its start twice)
        if self.single is not None:
            parsed = QueueSetOffset({self.single: ClaimOffset.from_dict(d)})
        else:
            parsed = QueueSetOffset.from_dict(d)
        self._known = (d, parsed)
        return parsed

    def encode(self, offset: QueueSetOffset) -> dict[str, Any]:
        """`offset` as Spark keeps it: the form `offset` reads."""
        if self.single is not None:
            d = offset.queues[self.single].to_dict()
        else:
            d = offset.to_dict()
        self._known = (d, offset)
        return d

    def _one(self) -> Receiver:
        """A one-queue stream's receiver."""
        assert self.single is not None
        return self.receiver(self.single)

    def initial_offset(self) -> QueueSetOffset:
        active = self._active()
        return QueueSetOffset({k: active[k].initial_offset() for k in sorted(active)})

    def prepare_available_now(self) -> None:
        now = self.current()
        self._frozen = dict(now)
        for k, a in now.items():
            self.receiver(k, a, draining=False).prepare_available_now()

    def first_batch(self, *, fresh: bool) -> QueueSetOffset:
        """Spark 4.0/4.1, the first batch of a run: every queue's held claims and waiting messages
        (`Receiver.first_batch`); no shares, as that batch takes all."""
        ends: dict[str, ClaimOffset] = {}
        active = dict(sorted(self._active().items()))
        self._look_first({}, active, takeover=fresh)
        for k, r in active.items():
            end = self._vanishing(k, functools.partial(r.first_batch, fresh=fresh), None)
            if end is not None:
                ends[k] = end
        return QueueSetOffset(ends)

    def waiting(self, start: QueueSetOffset | None) -> int:
        """Messages a batch planned now could take, over every queue (`count`; a one-queue
        stream's from its receiver, `Receiver.waiting`)."""
        if self.single is not None:
            return self._one().waiting(start.queues.get(self.single) if start is not None else None)
        self._demand = self.count(start.queues if start is not None else {}, self._active())
        return sum(self._demand.values())

    def _active(self) -> dict[str, Receiver]:
        """The receivers of the queues the stream reads now; those not yet set up on the main
        connection read what their set-ups ask in a few statements first (`look_ahead`)."""
        active = {k: self.receiver(k, a, draining=False) for k, a in self.current().items()}
        if len(active) > 1:
            self.sessions.set_up_together([r.set_up for r in active.values()])
        return active

    def count(self, starts: dict[str, ClaimOffset], active: dict[str, Receiver]) -> dict[str, int]:
        """Each queue's messages a batch planned now could take: its claims held beyond its start
        (known without a statement) and its backlog, every queue's in one round trip
        (`Dialect.backlogs`, `BACKLOGS_PER_STATEMENT` queues a statement). Does each queue's
        housekeeping first (a claim made ahead applied, due delayed messages moved)."""
        self._find_delayed(active)
        self._look_first(starts, active)
        held: dict[str, int] = {}
        for k, r in active.items():
            held[k] = self._vanishing(k, functools.partial(self._held_of, k, r, starts), -1)
        live = {k: r for k, r in active.items() if held[k] >= 0}
        estimates = self._estimates(live)
        self._backlogs = {k: (estimates.get(k, 0), r.claimed) for k, r in live.items()}
        return {k: held[k] + estimates.get(k, 0) for k in live}

    def _backlog_statement(self, part: tuple[str, ...], receivers: dict[str, Receiver]) -> Statement:
        stmt = self._backlog_sql.get(part)
        if stmt is None:
            if len(self._backlog_sql) > 4 * (len(receivers) // BACKLOGS_PER_STATEMENT + 1):
                self._backlog_sql.clear()  # queues came and went: keep only what is used
            stmt = self._backlog_sql[part] = self.dialect.backlogs([receivers[k].options.queue for k in part])
        return stmt

    def _find_delayed(self, active: dict[str, Receiver]) -> None:
        """Whether the queues' delayed tables exist, looked up for all that are due in one
        statement (a queue alone looks every `DELAYED_RECHECK` seconds)."""
        due = {k: t for k, r in active.items() if (t := r.delayed.to_check()) is not None}
        if not due:
            return
        keys = sorted(due)
        stmt = self.dialect.tables_exist([due[k] for k in keys])
        rows = self.sessions.main.run(lambda c: db.rows(c.cursor(), stmt), f"delayed tables of {self.stream.describe()}")
        for i, exists in rows:
            active[keys[int(i)]].delayed.found(bool(exists))

    def _look_first(self, starts: dict[str, ClaimOffset], active: dict[str, Receiver], *,
                    takeover: bool = True) -> None:
        """The queues whose held claims are not known (a run's first trigger, a queue joining, a
        new connection) read them, and those planning their first batch from a new checkpoint (with
        `takeover`) what the takeover check reads (`Receiver.first_look`), in one transaction on the
        main session for every `QUEUES_PER_TRANSACTION` of them: a start over 1,000 queues is 20
        transactions, not 4,000. A part that fails is left to each queue's own reads, where a dropped queue is
        met and named as when it plans alone."""
        due: dict[str, tuple[Receiver, bool]] = {}
        for k, r in active.items():
            if r.takeover_checked and r.planner.held_known():
                continue  # every trigger after a queue's first: nothing to read
            check = takeover and self._vanishing(k, functools.partial(r.takeover_due, self._start_for(k, r, starts)),
                                                 False)
            if check or not r.planner.held_known():
                due[k] = (r, check)

        def look(conn: Connection, part: list[str]) -> None:
            possible = any(due[k][0].endpoint.mode.possible for k in part)
            server = all_on_server(self.dialect, conn.cursor()) if possible else None
            bounds: dict[str, tuple[Any, Any]] = {}
            both = self.dialect.max_claims([(due[k][0].claims, due[k][0].options.consumer) for k in part])
            if both is not None:  # every queue's held claims in one statement
                bounds = {part[int(i)]: (high, low) for i, high, low in db.rows(conn.cursor(), both)}
            for k in part:
                r, takeover = due[k]
                r.first_look(conn, takeover=takeover, server=server, bounds=bounds.get(k))

        self._in_parts(sorted(due), look, doing="reading the claims held in", alone="reads")

    def _held_of(self, key: str, r: Receiver, starts: dict[str, ClaimOffset]) -> int:
        r.housekeeping()
        return r.held_beyond(self._start_for(key, r, starts))

    def _estimates(self, receivers: dict[str, Receiver]) -> dict[str, int]:
        """The backlog estimates of `receivers`' queues: 0 for those known to be empty by their
        sequences (`QuietQueues`), the others peeked, a statement per `BACKLOGS_PER_STATEMENT`.
        A queue dropped meanwhile fails its statement: that part is estimated queue by queue."""
        session, quiet = self.sessions.main, self._quiet
        quiet.read(session.run, {k: r.options.queue for k, r in receivers.items()})
        found = {k: 0 for k in receivers if quiet.quiet(k)}
        keys = sorted(receivers.keys() - found.keys())
        for i in range(0, len(keys), BACKLOGS_PER_STATEMENT):
            part = keys[i:i + BACKLOGS_PER_STATEMENT]
            stmt = self._backlog_statement(tuple(part), receivers)
            try:
                got = session.run(lambda c, stmt=stmt: db.rows(c.cursor(), stmt),  # type: ignore[misc]
                                  f"backlog of {self.stream.describe()}")
            except QueueNotFoundError:
                for k in part:
                    found[k] = self._vanishing(k, functools.partial(receivers[k].estimate, session), 0)
                    quiet.peeked(k, found[k])
                continue
            for n, estimate in got:
                found[part[int(n)]] = int(estimate or 0)
                quiet.peeked(part[int(n)], found[part[int(n)]])
        return found

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
        Every queue is counted first (`count`: a statement for many queues); a queue with nothing
        waiting tries no claim. `counted`: `waiting` ran in this trigger; its counts are used.

        When the busy queues take turns (`fair_shares`: too many to give each a turn's messages) and
        none of this batch's turns moved its queue on (their counts were stale: another consumer took
        the messages), the next queues take theirs in the same trigger: a batch is planned while any
        queue has messages, and an AvailableNow run ends only when none has."""
        starts = dict(start.queues) if start is not None else {}
        if self.single is not None:  # nothing to share: the receiver plans (and counts) itself
            k = self.single
            return QueueSetOffset({k: self._one().latest(starts.get(k), limit, whole=whole, counted=counted)})
        active = self._active()
        demand = self._demand if counted and self._demand is not None else self.count(starts, active)
        self._demand = None
        # shared among the queues with something to take: the others plan without a claim (`_plan`)
        wanting = {k: n for k, n in demand.items() if n > 0 and k in active}
        sharing = limit is not None and len(active) > 1
        ends: dict[str, ClaimOffset] = {}
        last: list[tuple[Receiver, ClaimOffset]] = []  # an AvailableNow run's last acknowledgements
        rest = dict(active)
        while True:
            shares = fair_shares(wanting, limit, after=self._turn) if limit is not None and sharing and wanting else {}
            # taking turns: the queues not in `shares` have theirs in later batches
            turns = limit is not None and bool(shares) and taking_turns(wanting, limit)
            if turns:
                self._turn = list(shares)[-1]  # the next batch's turns begin after it
            group = {k: rest.pop(k) for k in (list(shares) if turns else list(rest))}
            self._plan_queues(group, starts, demand, shares, limit, whole, ends, last)
            if not turns or any(ends.get(k) != starts.get(k) for k in group):
                break
            wanting = {k: n for k, n in wanting.items() if k not in group}
        self._plan_queues(rest, starts, {}, {}, limit, whole, ends, last)  # their turn is not this batch's
        if last:  # the run ends here: every queue's last batch acknowledged now, in the foreground
            self._ack_together(last, foreground=True)
            for r, _ in last:
                r.run_ended()
        for k in sorted((starts.keys() | self.receivers.keys()) - active.keys() - (self._gone - starts.keys())):
            end = self._drain(k, starts.get(k), limit)
            if end is not None:
                ends[k] = end
        return QueueSetOffset(ends)

    def _plan_queues(self, queues: dict[str, Receiver], starts: dict[str, ClaimOffset], demand: dict[str, int],
                     shares: dict[str, int], limit: int | None, whole: bool, ends: dict[str, ClaimOffset],
                     last: list[tuple[Receiver, ClaimOffset]]) -> None:
        """Plan `queues`' batches into `ends` (`latest`): a queue `demand` counts messages in claims its
        share of `limit` (`shares`; all of `limit` without one), the claims of many in shared transactions
        (`_claim_together`); the others plan from what they hold, without a claim. An AvailableNow run's
        last acknowledgements go to `last`."""
        together: dict[str, _Claim] = {}  # the queues whose one claim is made in the shared transaction
        for k, r in queues.items():
            idle = not demand.get(k, 0)
            if idle and (begin := starts.get(k)) is not None and r.at_rest(begin):
                ends[k] = begin  # an idle queue with nothing to do (no statement, so no `_vanishing`)
                continue
            plan = functools.partial(self._plan, r, self._start_for(k, r, starts), shares.get(k, limit), whole=whole,
                                     idle=idle, together=functools.partial(together.__setitem__, k),
                                     hand=_append_to(last))
            end: ClaimOffset | None = self._vanishing(k, plan, None)
            if end is not None:
                ends[k] = end
            elif k in starts and k not in together:
                ends[k] = starts[k]
        outcomes = self._claim_together(together)
        failed: Exception | None = None
        for k, c in together.items():
            made = outcomes.get(k)
            finish = (functools.partial(c.receiver.planner.plan, c.after, c.share, whole=whole) if made is None
                      else functools.partial(c.receiver.planner.planned, c.after, made, c.share))
            try:  # every claim made is applied, whatever one claiming alone raises
                planned: int | None = self._vanishing(k, finish, None)
            except Exception as exc:
                failed = failed or exc
                continue
            if planned is not None:
                ends[k] = c.receiver.end_plan(c.after, planned, hand=_append_to(last))
            elif k in starts:
                ends[k] = starts[k]
        if failed is not None:
            raise failed

    @staticmethod
    def _plan(r: Receiver, start: ClaimOffset, share: int | None, *, whole: bool, idle: bool,
              together: Callable[[_Claim], None], hand: Callable[[Receiver, ClaimOffset], None]) -> ClaimOffset | None:
        """Plan one queue's batch (`Receiver.latest`), or, when it is one claim (`Planner.claim_request`),
        hand that claim to `together` (None) to be made with the other queues'. An AvailableNow
        run's last acknowledgement goes to `hand` (`Receiver.end_plan`)."""
        after = r.begin_plan(start, counted=True)
        request = None if idle or r.draining else r.planner.claim_request(after, share, whole=whole)
        if request is None:
            planned = r.planner.plan(after, share, claim=not (r.draining or idle), whole=whole)
            return r.end_plan(after, planned, hand=hand)
        assert after is not None  # (`claim_request` asks for no claim without it)
        together(_Claim(r, after, share, request))
        return None

    def _claim_together(self, together: dict[str, _Claim]) -> dict[str, ClaimOutcome]:
        """The claims of `together`'s queues in one transaction on the main session for every
        `QUEUES_PER_TRANSACTION` of them, one commit for each: a stream over hundreds of queues
        claims from each of them at every trigger. Nothing is applied until it has committed
        (`Planner.planned`); if one fails, nothing of it was claimed, and each of its queues claims
        alone (left out of what this returns), where a dropped queue or a refused statement is met
        and named as when it claims alone."""

        def claims(conn: Connection, part: list[str]) -> dict[str, ClaimOutcome]:
            return {k: together[k].receiver.claimer.claim_in(conn, together[k].request) for k in part}

        made: dict[str, ClaimOutcome] = {}
        for outcomes in self._in_parts(list(together), claims, doing="claiming from", alone="claims"):
            made.update(outcomes)
        return made

    def _in_parts(self, keys: list[str], work: Callable[[Connection, list[str]], T], *, doing: str,
                  alone: str) -> list[T]:
        """`work(conn, part)` in one transaction on the main session, one commit, for every
        `QUEUES_PER_TRANSACTION` of `keys`' queues; what each part returned. A part of one queue is
        left to that queue. A part that fails for good (a dropped queue, a refused statement) is
        logged and left to each of its queues alone, where the failure is met and named as when it
        works alone; a transient one is raised: the server is gone past its outage bound, and each
        queue alone would wait as long again. `doing`, `alone`: the log line's words."""
        done: list[T] = []
        for part in _parts(keys):
            if len(part) < 2:
                continue
            try:
                done.append(self.sessions.main.run(lambda conn, part=part: work(conn, part),  # type: ignore[misc]
                                                   f"{doing} {self.stream.describe()}"))
            except (QueueNotFoundError, DatabaseError) as exc:
                if self.dialect.is_transient(exc.__cause__ or exc):
                    raise
                log.info("%s %d queues of %s in one transaction failed (%s); each %s alone",
                         doing, len(part), self.stream.describe(), exc, alone)
        return done

    def _start_for(self, key: str, r: Receiver, starts: dict[str, ClaimOffset]) -> ClaimOffset:
        """A queue's start: its position in the offset, or its claim table's beginning (joining)."""
        return starts.get(key) or r.initial_offset()

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
        """Each queue's offset, counters and backlog: the backlog the trigger's count estimated
        (`count`), less what the trigger claimed from the queue since; no statement of its own.
        A queue's counters and backlog that are 0 are left out, and the totals over every queue
        come first: at a thousand idle queues the report is a third of the size (it passes from
        the source to Spark and into each progress event at every trigger). A one-queue stream's:
        its receiver's, every counter, with the backlog estimated after the trigger's claim
        (`Receiver.reported_backlog`)."""
        if self.single is not None:
            r = self._one()
            return {**r.report(), "backlog": r.reported_backlog(), "queue": r.endpoint.queue_text,
                    "endpoint": r.options.consumer}
        queues: dict[str, dict[str, Any]] = {}
        totals = dict.fromkeys(("backlog", *REPORTED), 0)  # the platform's counters once one is not 0
        for k, r in sorted(self.receivers.items()):
            estimate, claimed = self._backlogs.get(k, (0, r.claimed))
            try:
                position = r.position()
            except QueueNotFoundError:  # dropped: it leaves at the next trigger, and says so then
                continue
            counters = r.counters(compact=True)
            backlog = max(0, estimate - (r.claimed - claimed))
            if backlog:
                counters["backlog"] = backlog
            for name, n in counters.items():
                totals[name] = totals.get(name, 0) + n
            queues[k] = {**position, **counters}
        return {**totals, "queues": queues}

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

    def committed(self, upto: QueueSetOffset) -> None:
        """Every batch up to `upto` is in Spark's commit log: each queue of the stream
        acknowledges up to its position (`Receiver.committed`)."""
        handed: list[tuple[Receiver, ClaimOffset]] = []
        for k, e in upto.queues.items():
            r = self.receivers.get(k)
            if r is not None and k not in self._gone:
                try:
                    r.committed(e, hand=_append_to(handed))
                except QueueNotFoundError:
                    log.info("not acknowledging queue %s: its claim table no longer exists", k)
        if handed:
            self.sessions.background.submit(self._ack_together, handed)

    def _ack_together(self, handed: list[tuple[Receiver, ClaimOffset]], *, foreground: bool = False) -> None:
        """On the background thread (or, `foreground`, on the driver's, at an AvailableNow run's
        end): the acknowledgements Spark's commit asked for, those of the claim table with nothing
        to copy (`Acker.join`) in one transaction for every `QUEUES_PER_TRANSACTION` queues; the
        rest, or all of a transaction's if it fails for a reason of one queue (a dropped claim table, a refused
        statement), each alone (`Acker.ack_logged`, `Acker.ack`). A lost acknowledgement is
        repaired by the next, which deletes everything up to its own end."""
        for part in _parts(handed):
            self._ack_part(part, foreground=foreground)

    def _ack_part(self, handed: list[tuple[Receiver, ClaimOffset]], *, foreground: bool) -> None:
        """`_ack_together` for at most `QUEUES_PER_TRANSACTION` queues."""
        joined = [(r, e) for r, e in handed if len(handed) > 1 and r.acker.join(e)]
        alone = [(r, e) for r, e in handed if not any(r is j for j, _ in joined)]
        if joined:
            session = self.sessions.main if foreground else self.sessions.ahead
            try:
                made = session.run(functools.partial(_ack_in, joined), f"acknowledging for {self.stream.describe()}")
            except Exception as exc:  # noqa: BLE001 - nothing acknowledged: each alone, or the next does it
                for r, _ in joined:
                    r.acker.left()
                transient = self.dialect.is_transient(exc.__cause__ or exc)
                if transient and foreground:
                    raise  # past the outage bound: as the run's last acknowledgement alone would
                log.log(logging.WARNING if transient else logging.INFO,
                        "acknowledging %d queues of %s in one transaction failed (%s); %s", len(joined),
                        self.stream.describe(), db.describe(self.dialect, exc),
                        "the next acknowledgement makes it" if transient else "each acknowledges alone")
                if not transient:
                    alone = handed
            else:
                failed: Exception | None = None
                for (r, e), m in zip(joined, made, strict=True):
                    try:  # (every one, so each queue's acknowledgement ends: `Acker.joined`)
                        r.acker.joined(session, e, m)
                    except Exception as exc:  # noqa: BLE001 - as a failed acknowledgement alone: the next makes it
                        failed = failed or exc
                        log.warning("acknowledging claims up to %s on %s failed: %s", e.claim, r.endpoint.queue_text,
                                    db.describe(self.dialect, exc))
                if failed is not None and foreground:
                    raise failed
        for r, e in alone:
            if foreground:
                r.acker.ack(e)
            else:
                r.acker.ack_logged(e)

    def ack(self, end: QueueSetOffset, *, background: bool = False) -> None:
        for k, e in end.queues.items():
            if k in self._gone:  # acknowledged when it left the stream
                continue
            try:
                self.receiver(k).ack(e, background=background)
            except QueueNotFoundError:
                log.info("not acknowledging queue %s: its claim table no longer exists", k)

    def close(self) -> None:
        self.sessions.closing = True  # closing the connection releases every queue's lock at once
        errors = []
        for r in self.receivers.values():
            try:
                r.close()
            except Exception as exc:  # noqa: BLE001 - close every queue's receiver, then report
                errors.append(exc)
        self.receivers.clear()
        try:
            self.sessions.close()
        except Exception as exc:  # noqa: BLE001 - see above
            errors.append(exc)
        if errors:
            raise errors[0]

