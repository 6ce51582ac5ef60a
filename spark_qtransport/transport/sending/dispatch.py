"""Send: tasks hand over or stage their rows (`staging.stage_partition`), then the driver
dispatches the batch atomically. Dialect-free.

**Dispatch** (`Dispatcher.dispatch`, driver): one transaction records the batch in
``<endpoint>.Outbox`` (a replay finds it and sends nothing), writes the rows small tasks handed
over straight into their queues (`inline`), moves the staged rows of the attempts Spark reports as
successful into their destination queues (due now) or ``<endpoint>.Delayed`` (due later), fans
published events out to the queues subscribed in ``SubscriptionRouting``, deletes the staged rows
and checks that every staged row was found. Rows of failed attempts are ignored and deleted.
In the same transaction it marks the claims of the received messages the batch failed or retried
(`recovery`: ``fail()``, ``retry_later()``; `transport.settled`: ``SqlQueue.Failed``), so the
reader's acknowledgement does not audit them,
and settles the claims the batch read (`transport.settled`: by Spark's query and batch id, also
for a batch with nothing to send), so no query of the endpoint delivers them again, whenever they
are acknowledged.

A crash before the dispatch commits sends nothing (Spark replays the batch and stages it again);
after it, the replay is skipped. Destinations come from data (the ``destination`` column, a
ReplyToAddress, subscription rows), so each goes through the routing path (`transport.routing`): a
message whose destination is missing, not a queue or outside the allow-list goes to the endpoint's
error queue with NServiceBus's failure headers, in the same transaction, and the rest is sent. A
missing static ``destination`` option fails at start instead, naming it.

Rows the tasks could not build into messages (a NaN delay, a NUL character: `builder`) arrive
as error copies staged for the error queue (named by an option: trusted, like the endpoint's own
queue, whatever the allow-list says); they are dispatched with the rest of the batch, exactly
once, and the batch's log line counts them (a WARNING naming the first one's error).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TypeVar

from ...dialects import Connection, Cursor, Dialect
from ...errors import ConfigError, DispatchError, MessageError, QueueNotFoundError
from ...wire import decode_headers
from .. import session as db
from .. import settled
from ..delayed import DelayedMover, MoveResult
from ..receiving.vacuum import vacuum_if_due
from ..routing import Item, Refusal, Router, insert_guarded, route_rows
from ..server import require_databases
from ..settings import INVALID_FAIL, INVALID_TO_ERROR_QUEUE, SendSettings
from .fanout import Destination, add_subscribers
from .inline import InlineRows, RowGroup, by_route
from .messages import DELAYED, PUBLISH, SEND, SendPlan
from .outbox import Outbox, fingerprint
from .staging import StageReport

__all__ = ["DispatchResult", "Dispatcher", "set_up_sender"]

log = logging.getLogger("spark_qtransport.send")

T = TypeVar("T")

#: claims marked failed per statement
_MARK_CHUNK = 10_000


@dataclass
class DispatchResult:
    batch_id: int
    skipped: bool = False  # dispatched before: a replay
    sent: int = 0
    delayed: int = 0
    published: int = 0
    failed: int = 0  # refused by the routing path: to the endpoint's error queue instead
    invalid: int = 0  # rows the tasks could not build: error copies to the error queue (counted in `sent`)
    marked: int = 0  # claims of received messages the batch failed or retried, marked: never audited
    settled: int = 0  # the queues whose claims the batch read, settled (`transport.settled`)
    destinations: dict[str, int] = field(default_factory=dict)
    moved: MoveResult | None = None


# -- set-up (driver) ------------------------------------------------------------------------------


def set_up_sender(options: SendSettings) -> SendPlan:
    """Create the endpoint's staging and outbox tables (ours, always) and, with createQueues,
    its delayed table, error queue and default destination, each only if missing (once they exist, table
    privileges are enough); find its input queue for ReplyToAddress. Returns the executors' plan."""
    d = options.dialect
    # (table, its DDL, whether NServiceBus uses it too: a queue or the delayed table)
    tables = [(options.staging, d.create_staging, False), (options.outbox, d.create_outbox, False)]
    if options.create_queues:  # names from options only, never names from message data
        tables += [(options.delayed, d.create_delayed, True), (options.error_queue, d.create_queue, True)]
        if options.destination is not None:
            tables.append((options.destination, d.create_queue, True))

    def set_up(conn: Connection) -> bool:
        cur = conn.cursor()
        require_databases(cur, d, [t for t, _, _ in tables])
        for table, create, shared in tables:
            if not db.columns(cur, d.queue_columns(table)):
                if shared:
                    db.warn_about_name(d, table)
                db.install(d, cur, create(table))  # idempotent: safe to run again after a fault
        conn.commit()
        if options.destination is not None:  # a wrong static destination fails at start, named
            Router(d, options.routing).configured(cur, options.destination, field="destination")
        return bool(db.columns(cur, d.queue_columns(options.endpoint)))

    session = db.Session(d, options.url, what=f"setting up the sender tables of endpoint {d.format_address(options.endpoint)}")
    try:
        has_input = session.run(set_up)
        session.run(lambda conn: settled.ensure(d, options.url, conn, settled.SINK))
    finally:
        session.close()
    return SendPlan(
        dialect=d.name,
        endpoint=options.endpoint.table,
        default_destination=options.destination,
        reply_to=d.format_address(options.endpoint) if has_input else None,
        content_type=options.content_type,
        sink=options.sink,
        failed_q=d.format_address(options.endpoint),
        error_queue=d.format_address(options.error_queue),
        invalid_fail=options.invalid_rows == INVALID_FAIL,
    )


# -- dispatch (driver) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Batch:
    """The batch being dispatched, as its successful tasks reported it."""

    batch_id: int
    attempts: list[str]  # of the tasks that staged rows
    expected: int  # rows staged
    routes: dict[tuple[str, str], int]  # (kind, route) -> rows, staged and inline
    staged_routes: set[tuple[str, str]]  # (kind, route) that staged rows have
    handed: dict[tuple[str, str], list[RowGroup]]  # the rows tasks handed over, by (kind, route)
    invalid: int = 0  # of `rows`: error copies of rows the tasks could not build
    invalid_reason: str | None = None  # the first one's error
    #: the claims its fail and retry rows came from: queue (as the rows name it) -> claim sequences
    failed_claims: dict[str, set[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, batch_id: int, reports: list[StageReport]) -> _Batch:
        routes: dict[tuple[str, str], int] = {}
        staged_routes: set[tuple[str, str]] = set()
        for report in reports:
            for r in report.routes:
                routes[(r.kind, r.route)] = routes.get((r.kind, r.route), 0) + r.messages
                if report.inline is None:
                    staged_routes.add((r.kind, r.route))
        staged = [r for r in reports if r.inline is None]
        failed: dict[str, set[int]] = {}
        for report in reports:
            for queue, seqs in report.failed_claims:
                failed.setdefault(queue, set()).update(seqs)
        return cls(batch_id, [r.attempt for r in staged], sum(r.rows for r in staged), routes, staged_routes,
                   by_route([r.inline for r in reports if r.inline is not None]), sum(r.invalid for r in reports),
                   next((r.invalid_reason for r in reports if r.invalid_reason), None), failed)

    @property
    def rows(self) -> int:
        return sum(self.routes.values())

    @property
    def invalid_share(self) -> str:
        """How many of its rows could not be built, as a sentence says it."""
        return f"all {self.rows} rows" if self.invalid >= self.rows else f"{self.invalid} of {self.rows} rows"

    def count(self, kind: str) -> int:
        return sum(n for (k, _), n in self.routes.items() if k == kind)


class Dispatcher:
    """The driver side of the sink: dispatches staged batches, moves due delayed messages."""

    def __init__(self, options: SendSettings) -> None:
        self.options = options
        self.dialect: Dialect = options.dialect
        self.outbox = Outbox(self.dialect, options.outbox, options.staging, options.endpoint.table, options.sink)
        self.mover = DelayedMover(self.dialect, options.delayed, options.endpoint, options.error_queue,
                                  policy=options.routing)
        self.session = db.Session(self.dialect, options.url)

    def _what(self, what: str) -> str:
        return f"{what} for endpoint {self.options.endpoint}"

    def dispatch(self, batch_id: int, reports: list[StageReport | None], *, query_id: str | None = None,
                 settles: bool = False, one_off: bool = False) -> DispatchResult:
        """Dispatch one batch from its successful tasks' reports (idempotent per batch id).
        `settles`: this dispatch ends the batch (the stream writer's; a QueueSink's when told): it
        settles the claims the batch read. `one_off`: a write outside any stream
        (`_refuse_invalid`)."""
        done = [r for r in reports if r is not None]
        query_id = query_id or next((r.query_id for r in done if r.query_id), None)
        fp = fingerprint(query_id, uuid.uuid4().hex)
        batch = _Batch.of(batch_id, done)
        if one_off:
            self._refuse_invalid(batch)
        # whether the claims the batch read can be settled and those it failed marked (the tables'
        # check is made once per process)
        settles = settles and bool(query_id)
        ledger = (settles or bool(batch.failed_claims)) and self.session.run(
            lambda conn: settled.exists(self.dialect, self.options.url, conn, settled.SINK), self._what("set-up"))
        settle_as = query_id if settles and ledger else None
        # the session retries a transient fault, and an OutboxRaceError (a concurrent cleanup deleted
        # the batch's record between two statements)
        result = self.session.run(lambda conn: self._dispatch(conn, batch, fp, settle_as, marks=ledger),
                                  self._what("dispatch"))
        if result.skipped:
            log.info("batch %d of endpoint %s was dispatched before; nothing sent again", batch_id, self.options.endpoint)
        else:
            log.info("batch %d of endpoint %s: sent %d, delayed %d, published %d%s",
                     batch_id, self.options.endpoint, result.sent, result.delayed, result.published,
                     f", of them {result.invalid} invalid rows to the error queue" if result.invalid else "")
            if result.invalid:
                self._warn_invalid(batch)
        try:
            result.moved = self.move_due()
            self.outbox.cleanup(self.session.connection(), self.options.retention_seconds)
            vacuum_if_due(self.dialect, self.session.connection(), self.options.staging)
        except Exception as exc:  # noqa: BLE001 - the batch is sent; these run again next time
            if self.session.connected:
                db.rollback(self.session.connection())
            log.warning("after dispatching batch %d of %s: %s", batch_id, self.options.endpoint,
                        db.describe(self.dialect, exc))
        return result

    def _dispatch(self, conn: Connection, batch: _Batch, fp: str, settle_as: str | None, *, marks: bool) -> DispatchResult:
        """The dispatch transaction (see the module's docstring); committed by the caller.
        `settle_as`: the query id whose batch's reads it settles (None: it settles none); `marks`:
        the claims it failed are marked (the failed-claims table is usable)."""
        cur = conn.cursor()
        result = self._send_batch(conn, cur, batch, fp, marks=marks)
        result.settled = settled.settle(self.dialect, cur, query_id=settle_as, batch_id=batch.batch_id)
        return result

    def _send_batch(self, conn: Connection, cur: Cursor, batch: _Batch, fp: str, *, marks: bool) -> DispatchResult:
        d, o = self.dialect, self.options
        result = DispatchResult(batch.batch_id, invalid=batch.invalid)
        if batch.rows == 0:
            self._delete_leftovers(cur, batch.batch_id)
            return result
        for stmt in d.dispatch_plans():
            db.execute(cur, stmt)
        if self.outbox.begin(cur, batch.batch_id, fp) is not None:
            result.skipped = True
            db.execute(cur, d.delete_staged(o.staging, attempts=batch.attempts))
            self._delete_leftovers(cur, batch.batch_id)
            return result
        router = Router(d, o.routing)
        destinations = self._destinations(cur, router, batch)
        attempts, expected = batch.attempts, batch.expected
        inline = InlineRows(dict(batch.handed))
        if inline:
            inline.send(conn, d, destinations, batch.staged_routes)
            for name, (text, n) in inline.sent.items():
                del destinations[name]
                result.destinations[text] = result.destinations.get(text, 0) + n
                result.sent += n
            inline.stage_rest(conn, d, o.staging, sink=o.sink, batch_id=batch.batch_id)
            attempts, expected = [*attempts, inline.attempt], expected + inline.staged
        self._send(cur, router, attempts, destinations, result)
        result.published = batch.count(PUBLISH)
        self._store_delayed(cur, batch, attempts, result)
        found = db.rowcount(cur, d.delete_staged(o.staging, attempts=attempts)) if expected else 0
        if found != expected:
            # UNLOGGED staging emptied by a server restart, or rows deleted by hand: do not send
            # part of a batch. Spark stages the batch again when the query restarts.
            raise DispatchError(
                f"batch {batch.batch_id} of endpoint {o.endpoint}: the tasks staged {expected} messages but "
                f"{found} are in {d.qualified(o.staging)} (database restarted?). Nothing was sent; "
                "restart the query to stage the batch again",
                queue=d.format_address(o.staging), operation="dispatch",
            )
        self._delete_leftovers(cur, batch.batch_id)
        if marks:
            result.marked = sum(self._mark_failed(cur, queue, sorted(seqs)) for queue, seqs in batch.failed_claims.items())
        self.outbox.finish(cur, batch.batch_id, sent=result.sent, delayed=result.delayed, published=result.published)
        return result

    def _mark_failed(self, cur: Cursor, queue: str, seqs: list[int]) -> int:
        """Mark the claims of `queue` that this batch failed or retried, in its transaction
        (`settled.note_failed`): the reader's acknowledgement, which comes after Spark commits the
        batch, then makes no audit copy of them (`recovery`). The queue is the one the rows name;
        one that is not an address, or has no claim table, marks nothing. A refusal costs only the
        marks: logged, and the batch goes on; those messages are audited as before."""
        d = self.dialect
        try:
            claims = d.claims_table(d.parse_address(queue))
        except ConfigError:
            return 0
        marked = 0
        for i in range(0, len(seqs), _MARK_CHUNK):
            n, problem = insert_guarded(cur, d, settled.note_failed(d, claims, seqs[i:i + _MARK_CHUNK]))
            if problem is not None:
                log.warning("could not mark %d failed message(s) of queue %s in %s (%s): the reader audits them",
                            len(seqs), queue, d.qualified(d.failed_table()), problem)
                return marked
            marked += n
        return marked

    def _destinations(self, cur: Cursor, router: Router, batch: _Batch) -> dict[str, Destination]:
        """The queues the batch goes to, by canonical address (or why not): its SEND routes and
        the subscribers of the events it publishes."""
        o = self.options
        destinations: dict[str, Destination] = {}
        error_queue = self.dialect.format_address(o.error_queue)
        for kind, route in batch.routes:
            if kind == SEND:
                to = (router.configured(cur, o.error_queue, field="error_queue") if route == error_queue
                      else router.resolve(cur, route, source="destination"))
                destinations[route] = Destination(to, route)
        published = [route for (kind, route) in batch.routes if kind == PUBLISH]
        if published:
            add_subscribers(cur, self.dialect, router, o.subscriptions, create=o.create_queues, published=published,
                            destinations=destinations)
        return destinations

    def _send(self, cur: Cursor, router: Router, attempts: list[str], destinations: dict[str, Destination],
              result: DispatchResult) -> None:
        """Move the staged messages due now to their queues (subscribers' for published ones);
        those whose destination is refused to the error queue."""
        d, o = self.dialect, self.options
        refused: list[Destination] = []
        for dest in destinations.values():
            to = dest.to
            if isinstance(to, Refusal):
                refused.append(dest)
                continue
            stmt = d.dispatch(o.staging, to.address, attempts=attempts, route=dest.route,
                              publish_routes=dest.publish_routes)
            n, problem = insert_guarded(cur, d, stmt)
            if problem is not None:  # the table refused the rows (privileges, a trigger...)
                refused.append(Destination(Refusal(to.text, f"writing to {to.name} failed: {problem}"),
                                            dest.route, dest.publish_routes))
                continue
            result.destinations[to.text] = result.destinations.get(to.text, 0) + n
            result.sent += n
        if refused:
            result.failed = self._to_error_queue(cur, router, attempts, refused)

    def _store_delayed(self, cur: Cursor, batch: _Batch, attempts: list[str], result: DispatchResult) -> None:
        """Move the batch's delayed messages into the endpoint's delayed table."""
        d, o = self.dialect, self.options
        delayed = batch.count(DELAYED)
        if not delayed:
            return
        self._check_delayed(cur)
        result.delayed = db.rowcount(cur, d.dispatch_delayed(o.staging, o.delayed, attempts=attempts))
        if result.delayed != delayed:
            raise DispatchError(f"batch {batch.batch_id}: {delayed} delayed messages staged, {result.delayed} stored",
                                queue=d.format_address(o.delayed), operation="dispatch")

    def _refuse_invalid(self, batch: _Batch) -> None:
        """A one-off write with rows the tasks could not build sends nothing and says so, unless
        option invalidRows was chosen: a stream's default (the error queue, where its endpoint's
        failed messages go) would hide a missing column of a script's write behind one log line.
        Spark then aborts the write, deleting what the tasks staged."""
        o = self.options
        if not batch.invalid or o.invalid_rows_chosen:
            return
        raise MessageError(
            f"nothing was sent: {batch.invalid_share} of this write could not be built into messages; the first: "
            f"{batch.invalid_reason or '?'}. Fix the rows, or set option invalidRows to '{INVALID_TO_ERROR_QUEUE}' to "
            f"send such rows to the error queue {self.dialect.format_address(o.error_queue)} and the rest on",
            operation="write", queue=self.dialect.format_address(o.endpoint))

    def _warn_invalid(self, batch: _Batch) -> None:
        """One WARNING per batch with rows the tasks could not build (sent to the error queue)."""
        o = self.options
        # a one-off write's batch id is a random negative number: not worth showing
        which = f"batch {batch.batch_id}" if batch.batch_id >= 0 else "a one-off write"
        log.warning("%s of endpoint %s: %s could not be built into messages and went to the error queue %s "
                    "(option invalidRows); the first: %s", which, o.endpoint, batch.invalid_share,
                    self.dialect.format_address(o.error_queue), batch.invalid_reason)

    def _delete_leftovers(self, cur: Cursor, batch_id: int) -> None:
        """Delete what failed attempts of a streaming batch staged (one-off writes have no batch
        id of their own in staging: theirs go with the retention cleanup)."""
        if batch_id >= 0:
            db.execute(cur, self.dialect.delete_batch_leftovers(self.options.staging, sink=self.options.sink, batch_id=batch_id))

    def _to_error_queue(self, cur: Cursor, router: Router, attempts: list[str], refused: list[Destination]) -> int:
        """Copy the staged messages of refused destinations to the endpoint's error queue, with
        NServiceBus's failure headers naming the destination and the reason."""
        d, o = self.dialect, self.options
        items = []
        for dest in refused:
            stmt = d.staged_messages(o.staging, attempts=attempts, route=dest.route, publish_routes=dest.publish_routes)
            items += [Item(key, decode_headers(text), dest.to, raw=text) for key, text in db.rows(cur, stmt)]
        routed = route_rows(
            cur, router, items,
            insert=lambda t, keys, headers: d.move_staged(o.staging, t.address, keys=keys, headers=headers),
            delete=None,  # the staged rows go with the rest of the batch's
            error_queue=lambda: router.configured(cur, o.error_queue, field="error_queue"),
            source="spark_qtransport.send", endpoint=o.endpoint.table,
        )
        return routed.failed

    def _check_delayed(self, cur: Cursor) -> None:
        d, o = self.dialect, self.options
        if db.columns(cur, d.queue_columns(o.delayed)):
            return
        if o.create_queues:
            db.warn_about_name(d, o.delayed)
            db.install(d, cur, d.create_delayed(o.delayed))
            return
        raise QueueNotFoundError(
            f"this batch has delayed messages but delayed delivery is not set up for endpoint {o.endpoint}: "
            f"table {d.qualified(o.delayed)} does not exist. Create it (the DDL in sql/, or "
            "set `create_queues`); nothing of this batch was sent",
            queue=d.format_address(o.delayed),
        )

    def move_due(self) -> MoveResult | None:
        """Move the endpoint's due delayed messages (no-op when its delayed table does not exist)."""
        def move(conn: Connection) -> MoveResult | None:
            if not db.columns(conn.cursor(), self.dialect.queue_columns(self.options.delayed)):
                return None
            return self.mover.move(conn)

        return self.session.run(move, self._what("moving due delayed messages"))

    def abort(self, reports: list[StageReport | None]) -> None:
        """Best effort: delete what the attempts of a failed batch staged."""
        attempts = [r.attempt for r in reports if r is not None and r.inline is None]
        if attempts:
            self.session.run(lambda c: db.rowcount(c.cursor(), self.dialect.delete_staged(self.options.staging,
                                                                                          attempts=attempts)),
                             self._what("abort"))

    def close(self) -> None:
        self.session.close()
