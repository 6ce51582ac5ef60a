"""Receive: claim (driver), read a slice (executors), acknowledge (driver). Dialect-free.

How a message travels:

1. **Claim** (`Receiver.latest`): one short READ COMMITTED transaction moves at most `limit` of the
   oldest unlocked, unexpired queue rows into the queue's claim table, tagged with this consumer,
   server-side (bodies never pass through the driver). Expired rows are deleted and counted;
   poison rows (headers not a flat JSON object of strings) go raw to the error queue in the same
   transaction, or, where the dialect does not judge headers at claim time (PostgreSQL), are
   claimed, left out by the read and moved to the error queue by their batch's acknowledgement.
   The claim sequence is the Spark offset.
2. **Read** (`read_slice`): each Spark task selects its claim-sequence slice, in order. Reading
   changes nothing, so Spark can replay a batch after a crash.
3. **Acknowledge** (`Receiver.ack`): once Spark commits a batch, its claims are deleted in bounded
   batches. Idempotent: a repeated ack deletes nothing.

A crash anywhere loses nothing: rows are either in the queue or in the claim table until their
batch is acknowledged. Claims that no checkpoint knows about (the driver died between the claim
commit and Spark's offset log write, or the checkpoint was deleted) are found by `latest` and
delivered again.

The pieces, one job each: `setup` (checks, claim table, consumer lock), `planner` (offsets, the
claim state, slices), `claimer` (claim transactions, now or ahead), `acker` (acknowledgements),
`mover` (the endpoint's due delayed messages), `slices` (the executors' reads). `Receiver` composes
them for the Spark reader.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...dialects import Connection, Dialect, QueueAddress
from .. import session as db
from .. import settled
from ..platform.after import AfterProcessing, BatchTimes
from ..platform.monitoring import Monitor
from ..session import Session
from .acker import Acker
from .claimer import Claimer
from .ledger import Ledger
from .mover import DueDelayed
from .planner import ClaimOffset, ClaimSlice, Planner
from .prepared import Prepared
from .sessions import StreamSessions
from .setup import Endpoint, EndpointSetUp
from .slices import pack, read_batches, read_chunks, read_slice
from .stats import ReceiveStats
from .warden import Warden

if TYPE_CHECKING:
    from ..settings import ReceiveSettings

__all__ = ["ClaimOffset", "ClaimSlice", "Receiver", "pack", "read_batches", "read_chunks", "read_slice", "ReceiveStats", "REPORTED"]

log = logging.getLogger("spark_qtransport.receive")

#: seconds the first progress report of a run waits for the backlog's estimate (`reported_backlog`)
FIRST_ESTIMATE_WAIT = 2.0
#: the counters a receiver reports in progress: by their name there, of `ReceiveStats`' field
REPORTED = {"claimed": "claimed", "expired": "expired", "poison": "poison", "forwarded": "forwarded",
            "forwardFailed": "forward_failed", "deadLettered": "dead_lettered", "takenOver": "taken_over"}


@dataclass(frozen=True)
class _TakeoverLook:
    """What the takeover check reads (`Receiver._warn_of_takeover`): the highest claim a settled
    batch read (0: none, or not read) and the claim table's consumers (name, claims, oldest)."""

    settled: int
    consumers: list[tuple[str, int, Any]]


class Receiver:
    """The driver side of one queue of a streaming query: claims, acknowledges, reports backlog.

    Two sessions (`StreamSessions`, shared by a stream's queues): `main` (set up by
    `EndpointSetUp`, holds the consumer lock) for what Spark waits on, `ahead` for the background
    thread's claims, acknowledgements and backlog estimates."""

    def __init__(self, options: ReceiveSettings, *, clock: Callable[[], float] = time.monotonic,
                 draining: bool = False, sessions: StreamSessions | None = None) -> None:
        self.options = options
        self.endpoint = Endpoint(options, options.dialect, options.dialect.claims_table(options.queue))
        self.stats = ReceiveStats()
        self.set_up = EndpointSetUp(self.endpoint, clock=clock, draining=draining)
        #: the stream's connections and background thread: its own for a one-queue stream, else the
        #: `QueueSet`'s, shared by every queue of the stream (`sessions.py`)
        self._owns_sessions = sessions is None
        self.sessions = sessions if sessions is not None else StreamSessions(
            self.dialect, options.url, what=self.endpoint.what("connecting"))
        self.sessions.join(self.set_up)
        self.main, self.ahead, self.background = self.sessions.main, self.sessions.ahead, self.sessions.background
        table = self._known_table_id
        ledger = Ledger()  # the claims this consumer holds: the planner's, seen by the claimer
        self.claimer = Claimer(self.endpoint, self.main, self.ahead, self.background, table, ledger=ledger)
        self.planner = Planner(self.endpoint, self.claimer, self.main, self.stats, clock=clock, table=table, ledger=ledger)
        self.times = BatchTimes()
        self.monitor = (Monitor(options, reports=self.sessions.reports(options))
                        if options.monitoring_queue is not None else None)
        self.after = AfterProcessing(options, self.dialect, self.times,
                                     observe=None if self.monitor is None else self.monitor.observe)
        self.acker = Acker(self.endpoint, self.main, self.ahead, self.background, self.stats, self.after, self.planner)
        self.delayed = DueDelayed(self.endpoint, self.main, clock=clock)
        self._released = False  # claims up to the first planned start (a previous run's last batch)
        self._acked = 0  # the highest end acknowledged (or handed to the background thread)
        self._takeover_checked = False
        self._look: _TakeoverLook | None = None  # what `first_look` read for `_warn_of_takeover`
        self._available_now = False  # Trigger.AvailableNow: the run ends when nothing new is found
        self._backlog: int | None = None
        self._backlog_refresh: Future[int | None] | None = None
        self._closed = threading.Event()  # stops the timer that parks old prepared claims
        self._watched = False  # the stream's warden was told of this queue
        self._timed = False  # the timer that parks old prepared claims runs

    def _known_table_id(self) -> str:
        return self.set_up.table_id or ""

    @property
    def holds_prepared(self) -> bool:
        """This run holds (or may hold) claims in prepared transactions."""
        return self.planner.holds_prepared()

    @property
    def draining(self) -> bool:
        """A queue leaving a stream (`QueueSet`): its held claims are delivered, nothing more is
        claimed, and its set-up needs only the claim table (`EndpointSetUp.draining`)."""
        return self.set_up.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.set_up.draining = value

    @property
    def claimed(self) -> int:
        """Messages this query's claims took so far (`ReceiveStats.claimed`)."""
        return self.stats.claimed

    @property
    def dialect(self) -> Dialect:
        return self.endpoint.dialect

    @property
    def claims(self) -> QueueAddress:
        return self.endpoint.claims

    @property
    def table_id(self) -> str:
        table = self._set_up_table()
        if table is None:
            # through the session: a failure to connect or set up (a wrong password, a missing
            # database) is our DatabaseError naming the queue, a transient one is retried. A new
            # connection ran the set-up already; a queue joining a stream's open one runs it here.
            self.main.run(self.set_up.ensure)
            table = self.set_up.table_id
        assert table is not None
        return table

    def _set_up_table(self) -> str | None:
        """The claim table's id if the set-up ran on the main session's open connection, else None."""
        up = self.set_up
        return up.table_id if up.conn is self.main.current else None

    # -- offsets ------------------------------------------------------------------------------

    def initial_offset(self) -> ClaimOffset:
        # Claim sequences are > 0. Starting below all of them means a new checkpoint first gets
        # the claims this consumer already holds (claimed but never acknowledged): no loss.
        return ClaimOffset(0, self.table_id)

    def latest(self, start: ClaimOffset | None, limit: int | None, *, whole: bool = False,
               counted: bool = False, idle: bool = False) -> ClaimOffset:
        """Plan the next batch: claims it holds already, else claim at most `limit` (None: all).
        See `Planner.plan` (and `whole`); a claim made ahead for this batch is applied first.
        `counted`: `waiting` (or the stream's count of every queue) ran in this trigger, and did
        its housekeeping. `idle`: that count found nothing waiting, so no claim is tried."""
        after = self.begin_plan(start, counted=counted)
        end = self.planner.plan(after, limit, claim=not (self.draining or idle), whole=whole)
        return self.end_plan(after, end)

    def begin_plan(self, start: ClaimOffset | None, *, counted: bool = False) -> int | None:
        """What planning a batch from `start` does before the claim (`latest`, and `QueueSet` when it
        claims for several queues in one transaction): the trigger's housekeeping unless `counted`,
        a run's first acknowledgement and takeover check, monitoring and the warden started. The
        claim sequence the batch begins after."""
        if not counted:
            self.housekeeping()
        after = self.planner.start_after(start, self.table_id)  # after the set-up (`table_id`)
        if not self.draining:
            self._start_monitoring()
        self._release_previous_run(start, after)
        self._warn_of_takeover(start, after)
        self._watch()
        return after

    def at_rest(self, start: ClaimOffset) -> bool:
        """Whether an idle trigger's planning from `start` (nothing waiting, housekeeping done: see
        `QueueSet.latest`) ends at `start` with nothing to do, known without a statement: the run's
        first planning is behind it (acknowledged, takeover checked, watched), the set-up is that of
        the open connection, nothing is held beyond `start`, no prepared claim waits for its timer.
        Then the plan is made here (`Planner.at_rest`) and `start` is the batch's end: a thousand
        idle queues cost a few microseconds each a trigger, not a plan each."""
        table = self._set_up_table()
        if (self.draining or self._available_now or not (self._released and self._takeover_checked and self._watched)
                or table is None or start.table != table or self.planner.start_after(start, table) != start.claim
                or self._prepared_untimed()):
            return False
        self._start_monitoring()
        return self.planner.at_rest(start.claim)

    def end_plan(self, after: int | None, end: int, *,
                 hand: Callable[[Receiver, ClaimOffset], None] | None = None) -> ClaimOffset:
        """What planning does once the batch's end is known (see `latest`). An AvailableNow run's
        last acknowledgement goes to `hand` if given (`QueueSet`: many queues' in one transaction),
        which makes it in the foreground, then calls `run_ended`."""
        self._time_prepared()
        if self._available_now and after and end == after:
            # Nothing new in an AvailableNow run: Spark stops here without sending commit(start).
            # It asks for the next offset only once `start` is in its commit log, so those claims
            # are processed: acknowledge them, so a finished run leaves nothing claimed. In the
            # foreground, after any made in the background (`committed`): the run ends here.
            last = ClaimOffset(after, self.table_id)
            if hand is None:
                self.ack(last)
            elif self._acking(last):
                hand(self, last)
                return ClaimOffset(end, self.table_id)
            self.run_ended()
        return ClaimOffset(end, self.table_id)

    def run_ended(self) -> None:
        """An AvailableNow run's last batch is acknowledged: the run ends here, and Spark may end
        this process without the source's stop(), so monitoring's last reports go now (bounded
        wait), not at the next interval."""
        if self.monitor is not None:
            self.monitor.flush()

    def first_batch(self, *, fresh: bool) -> ClaimOffset:
        """Spark 4.0/4.1, the first batch of a run (`SqlQueueStreamReader._first_batch`): the
        claims held and every message waiting now, up to the queue's highest sequence at this
        moment (a producer that keeps sending does not make it endless). `fresh`: a new
        checkpoint, which takes over what this endpoint holds (`_warn_of_takeover`).

        Its end may lie below the start Spark gives it (nothing held and nothing waiting): the
        batch is then empty, and `processed` (told that start) keeps later batches above it."""
        self.housekeeping()
        table = self.table_id
        if not self.draining:
            self._start_monitoring()
        self._watch()
        if fresh:
            self._warn_of_takeover(ClaimOffset(0, table), 0)
        self._takeover_checked = True
        # the previous run's last batch is acknowledged by Spark's commit() of this batch's start;
        # this run's batches stay replayable until Spark commits them (`_release_previous_run`)
        self._released = True
        held = self.planner.held_max() or 0  # read at this run's start (or by `first_look` just now)
        if self.draining:
            return ClaimOffset(held, table)
        saved, self.planner.target = self.planner.target, self._high_water()
        try:
            end = self.planner.plan(held, None)
        finally:
            self.planner.target = saved
        return ClaimOffset(max(end, held), table)

    def housekeeping(self) -> None:
        """What every trigger does before planning: apply the claim made ahead, stop on a failed
        acknowledgement, move due delayed messages (after the set-up)."""
        self.planner.settle_ahead()
        self.acker.raise_failure()
        if not self.draining:
            self.move_delayed()

    def _park_old_claims(self) -> None:
        """A prepared claim holds vacuum back for the whole server: one older than the bound
        (`preparedClaimTimeout`: the last batch of a stream gone idle, a batch stuck in the sink
        while Spark plans nothing) is moved into the claim table. A timer checks four times a
        bound, on the background thread (serial with the acknowledgements), whatever Spark does."""
        bound = self.options.prepared_timeout
        try:
            self.acker.park(self.ahead, older_than=bound * 3 / 4)
        except Exception as exc:  # noqa: BLE001 - tried again at the next tick; the warden is there too
            log.warning("queue %s: moving old prepared claims into %s failed: %s", self.endpoint.queue_text,
                        self.dialect.qualified(self.claims), db.describe(self.dialect, exc))

    def _tick(self) -> None:
        while not self._closed.wait(self.options.prepared_timeout / 4):
            try:
                self.background.submit(self._park_old_claims)
            except RuntimeError:  # the background thread was shut down: the stream is closing
                return

    def waiting(self, start: ClaimOffset | None) -> int:
        """Messages a batch planned now from `start` could take: claims held beyond it (a claim
        made ahead, a previous run's) and the queue's backlog estimate. Does the trigger's
        housekeeping first, so a held-back trigger still moves due delayed messages."""
        self.housekeeping()
        # not kept as the reported backlog: that is the estimate after this trigger's claim
        return self.held_beyond(start) + (0 if self.draining else self.estimate(self.main))

    def held_beyond(self, start: ClaimOffset | None) -> int:
        """Claims held beyond `start` (a claim made ahead, a previous run's); no statement once
        the claim state is known (`Planner.held_max`)."""
        after = self.planner.start_after(start, self.table_id) or 0
        held_max = self.planner.held_max()
        return max(0, held_max - after) if held_max is not None else 0

    def _start_monitoring(self) -> None:
        """Start ServicePulse's reporter (it sends every interval from now on). The set-up checked
        its queue with the other platform queues (`EndpointSetUp`), before the first claim."""
        if self.monitor is not None:
            self.monitor.start()

    @property
    def takeover_checked(self) -> bool:
        """This run's check for claims to take over is behind it (or was not needed)."""
        return self._takeover_checked

    def takeover_due(self, start: ClaimOffset | None) -> bool:
        """Whether planning from `start` is this run's first from a new checkpoint (claim 0: nothing
        logged yet), which checks for claims to take over (`_warn_of_takeover`)."""
        return (not self._takeover_checked and start is not None
                and self.planner.start_after(start, self.table_id) == 0)

    def first_look(self, conn: Connection, *, takeover: bool, server: list[Prepared] | None = None,
                   bounds: tuple[Any, Any] | None = None) -> None:
        """In the caller's transaction (`QueueSet`: many queues' first looks in one): what this
        consumer holds (`Planner.read_held_in`) and, with `takeover`, what the takeover check reads
        (the settled batches' highest claim, the claim table's consumers). `_warn_of_takeover`
        uses it instead of a transaction of its own. `server`: the server's prepared transactions,
        read once for many queues (`prepared.all_on_server`); `bounds`: this consumer's claims'
        (max, min), read in one statement for many queues (`Dialect.max_claims`)."""
        if takeover:
            self._look = self._takeover_look(conn, settled_too=True, server=server, bounds=bounds)
        else:
            self.planner.read_held_in(conn, server=server, bounds=bounds)

    def _takeover_look(self, conn: Connection, *, settled_too: bool, server: list[Prepared] | None = None,
                       bounds: tuple[Any, Any] | None = None) -> _TakeoverLook:
        # what this consumer holds first: holding nothing (a start's usual case), it has nothing to
        # take over or acknowledge, and the other two statements are not needed
        self.planner.read_held_in(conn, server=server, bounds=bounds)
        if self.planner.ledger.highest() is None:
            return _TakeoverLook(0, [])
        cur = conn.cursor()
        upto = (settled.settled_upto(self.dialect, cur, self.claims, self.options.consumer, self.table_id)
                if settled_too and self.endpoint.settling else 0)
        rows = db.rows(cur, self.dialect.claim_stats(self.claims))
        return _TakeoverLook(upto, [(str(who), int(n), oldest) for who, n, oldest in rows])

    def _warn_of_takeover(self, start: ClaimOffset | None, after: int | None) -> None:
        """Once per run: a query planning its first batch from a new checkpoint (claim 0: nothing
        logged yet) that finds claims of its endpoint takes over what another query claimed and
        never acknowledged. They are delivered again, here; if that query handled them, twice.
        What it reads was read by `first_look` if that ran; claims a settled batch read are
        acknowledged first (`ack_settled`), and what is held read again after."""
        if self._takeover_checked or start is None or after != 0:
            return
        self._takeover_checked = True
        look, self._look = self._look, None
        if look is None:
            look = self.main.run(functools.partial(self._takeover_look, settled_too=True),
                                 self.endpoint.what("peek claims"))
        if look.settled > self.acker.done(self.table_id):
            self.ack_settled()
            look = self.main.run(functools.partial(self._takeover_look, settled_too=False),
                                 self.endpoint.what("peek claims"))
        consumer = self.options.consumer
        held = next(((n, oldest) for who, n, oldest in look.consumers if who == consumer and n), None)
        ours = self.planner.ledger.prepared()
        if ours:
            n = (held[0] if held else 0) + sum(c.last - c.first + 1 for c in ours)
            held = (n, held[1] if held else f"{ours[0].claimed_at} UTC (a prepared transaction)")
        if held is not None:
            self.stats.taken_over = held[0]
            log.warning(
                "endpoint %r on queue %s: this query starts from a new checkpoint and takes over %d message(s) that "
                "another query with the same endpoint (or this one, before its checkpoint logged a batch) claimed, "
                "oldest at %s, and never acknowledged; they are delivered again. If that query handled them, they "
                "are handled twice: give each job its own endpoint (consumer identity)",
                consumer, self.endpoint.queue_text, held[0], held[1],
            )

    def committed(self, upto: ClaimOffset, *, hand: Callable[[Receiver, ClaimOffset], None] | None = None) -> None:
        """Every batch up to `upto` is in Spark's commit log (it asks for the next offset):
        acknowledge up to it in the background, idle queue or not, or `hand` the acknowledgement to
        the caller, who makes it on the background thread (`QueueSet`: many queues' in one
        transaction). A run's first planning acknowledges the previous run's last batch itself, in
        the foreground (`_release_previous_run`); an acknowledgement already made costs no statement."""
        if not self._released or upto.claim <= self._acked or upto.table != self.table_id:
            return
        if hand is None:
            self.ack(upto, background=True)
        elif self._acking(upto):
            hand(self, upto)

    def settled_upto(self) -> int:
        """The highest claim of this consumer that a settled batch read (`transport.settled`): the
        sink's dispatch committed that batch's output, and Spark runs a query's batches in order."""
        if not self.endpoint.settling:
            return 0
        table = self.table_id
        return self.main.run(lambda c: settled.settled_upto(self.dialect, c.cursor(), self.claims, self.options.consumer,
                                                            table), self.endpoint.what("settled batches"))

    def ack_settled(self) -> int:
        """Acknowledge (in the foreground) the claims the sink settled that are still held: a query
        gone before Spark told it the batch was committed left them. None is delivered again."""
        upto = self.settled_upto()
        if upto <= self.acker.done(self.table_id):
            return 0
        log.info("queue %s: acknowledging the claims up to %d that a batch of endpoint %r settled in its sink",
                 self.endpoint.queue_text, upto, self.options.consumer)
        return self.ack(ClaimOffset(upto, self.table_id))

    def _release_previous_run(self, start: ClaimOffset | None, after: int | None) -> None:
        """Acknowledge the batch a previous run of this checkpoint ended with.

        Spark sends ``commit(end)`` only when it plans a batch after ``end``, so a run's last batch
        stays claimed after it stops, and would stay so while the queue is empty. Spark asks for
        the next offset only once every batch up to ``start`` is in the commit log (a restart
        first replays an uncommitted batch), so this run's first planning acknowledges up to
        ``start``, in the foreground. Later triggers do so in the background (`committed`); in an
        AvailableNow run `latest` acknowledges a later ``start`` when it finds nothing new (the
        run ends there).
        """
        if self._released or start is None:
            return
        self._released = True
        if after:  # in the foreground: Spark may end this run's process without waiting on a thread
            self.ack(ClaimOffset(after, self.table_id))

    def _watch(self) -> None:
        """From its first planning on, the stream's warden knows the queue: Spark ends a query's
        source process without a word (`query.stop()`, the end of an AvailableNow run, an exit, a
        kill), and the warden then acknowledges what Spark committed and parks what is still
        prepared (`warden.py`)."""
        if not self._watched:
            self._watched = True
            warden = self.sessions.warden(self.options.prepared_timeout)
            warden.watch(self.options)
            self.acker.on_acked = lambda end: warden.acked(self.options, end.table, end.claim)

    def _warden(self) -> Warden | None:
        return self.sessions.warden(self.options.prepared_timeout) if self._watched else None

    def _prepared_untimed(self) -> bool:
        """This run holds a prepared claim and the timer that parks old ones is not running yet."""
        return not self._timed and bool(self.planner.ledger.prepared())

    def _time_prepared(self) -> None:
        """Once this run holds a prepared claim, a timer parks the ones older than their bound."""
        if self._prepared_untimed():
            self._timed = True
            warden = self._warden()
            if warden is not None:
                warden.prepared(self.options)
            threading.Thread(target=self._tick, name="sqlqueue-prepared-bound", daemon=True).start()

    def _park_all(self) -> None:
        """A stopping stream leaves no prepared transaction behind: its claims (the last batch, one
        claimed ahead) move into the claim table, where the next run finds them."""
        if not self.holds_prepared:
            return
        self.background.drain()  # an acknowledgement in flight commits first what it can
        try:
            self.acker.park(self.main, older_than=None)
        except Exception as exc:  # noqa: BLE001 - the warden, or the next run, parks them
            self.sessions.finished = False
            log.warning("queue %s: could not move its prepared claims into %s on stop (%s); the next run of this "
                        "endpoint does", self.endpoint.queue_text, self.dialect.qualified(self.claims),
                        db.describe(self.dialect, exc))

    def move_delayed(self) -> None:
        """Deliver the due messages of ``<queue>.Delayed``, if that table exists (see `DueDelayed`).
        The set-up first (`table_id`): a missing queue is that error, not a failed delayed move."""
        _ = self.table_id
        self.delayed.move()

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: take only what is in the queue now, then finish. Delayed
        messages due by now are moved in first: they are available now too."""
        self._available_now = True
        self.move_delayed()
        self.planner.target = self._high_water()

    def _high_water(self) -> int:
        """The queue's highest sequence now (0 when empty): what a run that takes "what is there
        now" claims up to (AvailableNow; Spark 4.0/4.1's first batch of a run)."""
        stmt = self.dialect.max_source_seq(self.options.queue)
        (high,) = self.main.run(lambda c: db.one(c.cursor(), stmt), self.endpoint.what("queue high-water mark"))
        return int(high) if high is not None else 0

    # -- progress -----------------------------------------------------------------------------

    def backlog(self) -> int:
        """Messages waiting, estimated from the span of unlocked sequences (skips held rows)."""
        self._backlog = self.estimate(self.main)
        return self._backlog

    def estimate(self, session: Session) -> int:
        stmt = self.dialect.backlog(self.options.queue, above=self.planner.estimate_floor())
        (n,) = session.run(lambda c: db.one(c.cursor(), stmt), self.endpoint.what("backlog"))
        return int(n or 0)

    def report(self) -> dict[str, Any]:
        """The last planned end offset and this run's counters, for progress reports."""
        return {**self.position(), **self.counters()}

    def position(self) -> dict[str, Any]:
        """The last planned end offset, as progress reports show it."""
        return ClaimOffset(self.planner.last_end or 0, self.table_id).to_dict()

    def counters(self, *, compact: bool = False) -> dict[str, int]:
        """This run's counters (`REPORTED`, the platform's where configured); `compact`: only those
        that are not 0 (an entry of a several-queue stream's report)."""
        s = self.stats
        counters = {name: getattr(s, field) for name, field in REPORTED.items()}
        counters.update(self._platform_report())
        return {k: v for k, v in counters.items() if v} if compact else counters

    def _platform_report(self) -> dict[str, int]:
        a, o = self.stats, self.options
        report = {}
        if o.audit_queue is not None:
            report["audited"] = a.audited
        if o.forward_to is not None:
            report["forwardedTo"] = a.forwarded_to
        if a.retry_acks or a.retry_acks_refused:
            report.update(retryAcknowledged=a.retry_acks, retryAcknowledgementsRefused=a.retry_acks_refused)
        return report

    def reported_backlog(self) -> int | None:
        """The backlog for progress reports, without racing our own claim-ahead; None before the
        first estimate.

        The estimate briefly locks the queue's first and last rows (SKIP LOCKED); run beside a
        claim-ahead it would make that claim skip the head row. So while the background thread
        exists the estimate is made there, after the claim, and the last one finished is returned;
        a claim on the main session waits for one in flight (`Claimer.head`). The first report
        waits for its estimate (at most `FIRST_ESTIMATE_WAIT`): it said 0 with 27,000 messages
        waiting.
        """
        if not self.background.started:
            return self.backlog()
        done = self._backlog_refresh
        if done is None and self._backlog is None:
            done = self.background.submit(self._refresh_backlog)
            try:
                done.result(timeout=FIRST_ESTIMATE_WAIT)
            except FutureTimeout:  # a slow estimate: this report goes without, the next has it
                self._backlog_refresh = done
                return None
        estimate = done.result() if done is not None and done.done() else None
        if estimate is not None:
            self._backlog = estimate
        self._backlog_refresh = self.background.submit(self._refresh_backlog)
        return self._backlog

    def _refresh_backlog(self) -> int | None:
        try:
            with self.claimer.head:  # never beside a claim on the main session (`Claimer.head`)
                return self.estimate(self.ahead)
        except Exception as exc:  # noqa: BLE001 - a progress metric must not fail the query
            log.info("backlog estimate for %s failed: %s", self.options.queue, db.describe(self.dialect, exc))
            return None

    # -- partitions and acknowledgement -------------------------------------------------------

    def processed(self, upto: ClaimOffset) -> None:
        """Every batch up to `upto` is processed (`Planner.processed`)."""
        self.planner.processed(upto)

    def slices(self, start: ClaimOffset, end: ClaimOffset) -> list[ClaimSlice]:
        self.times.planned(end.claim)  # the batch's planning: its messages' ProcessingStarted
        _ = self.table_id  # the set-up first: a replayed batch (Spark 4.0/4.1) is sliced before any planning
        parts = self.planner.slices(start, end)
        warden = self._warden()
        if parts and warden is not None:  # held until acknowledged: the warden finishes it if this process cannot
            warden.planned(self.options, end.table, end.claim)
        return parts

    def ack(self, end: ClaimOffset, *, background: bool = False) -> int:
        """Delete this consumer's claims up to `end` in bounded batches. Idempotent.

        With `background`, the deletes run on the background thread (after any claim in flight)
        and this returns at once: nothing waits on an acknowledgement, and a lost one is repaired
        by the next, which deletes everything up to its own end.
        """
        if not self._acking(end):
            return 0
        if background:
            self.acker.ack_in_background(end)
            return 0
        return self.acker.ack(end)

    def _acking(self, end: ClaimOffset) -> bool:
        """Whether an acknowledgement up to `end` is to be made; if so, the warden is told and what
        is held where is known (the ledger), before it is made."""
        if end.table != self.table_id:
            log.info("not acknowledging offset of a claim table that no longer exists: %s", end)
            return False
        if end.claim <= self.acker.done(end.table):
            return False  # acknowledged already: an idle queue's repeated commit costs no statement
        self._acked = max(self._acked, end.claim)
        warden = self._warden()
        if warden is not None:  # Spark committed it: the warden finishes it if this process cannot
            warden.committed(self.options, end.table, end.claim)
        if self.planner.may_hold_prepared(end.claim):
            self.planner.held_max()  # what is held where (prepared, claim table), known before the ack
        return True

    def close(self) -> None:
        self._closed.set()
        # A claim-ahead in flight finishes first: its rows are then held claims, delivered later.
        try:
            self.planner.settle_ahead()
            self._park_all()
        finally:
            self.background.drain()  # the last acknowledgement's timings reach monitoring first
            if self._acked > self.acker.done(self._known_table_id()):
                self.sessions.finished = False  # an acknowledgement failed: the warden makes it
            if self.monitor is not None:
                self.monitor.close()
            self.sessions.leave(self.set_up)
            if self._owns_sessions:
                self.sessions.close()
