"""Send: stage (executors), then dispatch atomically (driver). Dialect-free.

How a batch travels:

1. **Stage** (`stage_partition`, one Spark task): rows become messages (`MessageBuilder`) and are
   bulk-written to ``<endpoint>.Staging`` in one transaction, tagged with the sink, the batch id
   and a random attempt id. The task reports its attempt id and per-route counts.
2. **Dispatch** (`Dispatcher.dispatch`, driver): one transaction records the batch in
   ``<endpoint>.Outbox`` (a replay finds it and sends nothing), moves the staged rows of the
   attempts Spark reports as successful into their destination queues (due now) or
   ``<endpoint>.Delayed`` (due later), fans published events out to the queues subscribed in
   ``SubscriptionRouting``, deletes the staged rows and checks that every staged row was found.
   Rows of failed attempts are ignored and deleted.

A crash before the dispatch commits sends nothing (Spark replays the batch and stages it again);
after it, the replay is skipped. Destinations come from data (the ``destination`` column, a
ReplyToAddress, subscription rows), so each goes through the routing path (`queues.routing`): a
message whose destination is missing, not a queue or outside the allow-list goes to the endpoint's
error queue with NServiceBus's failure headers, in the same transaction, and the rest is sent. A
missing static ``destination`` option fails at start instead, naming it.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from ...connections import EXECUTOR_CONNECTIONS
from ...dialects import Dialect
from ...errors import DispatchError, QueueNotFoundError
from ...wire import decode_headers, format_time
from .. import session as db
from ..delayed import DelayedMover, MoveResult
from ..receiving.vacuum import vacuum_if_due
from ..routing import Item, Refusal, Router, Target, insert_guarded, route_rows
from ..settings import SendSettings
from .messages import DELAYED, PUBLISH, SEND, MessageBuilder, SendPlan, topics_of
from .outbox import Outbox, fingerprint

__all__ = ["StageReport", "DispatchResult", "Dispatcher", "stage_partition", "set_up_sender"]

log = logging.getLogger("spark_qtransport.send")

T = TypeVar("T")

#: rows per bulk write on executors
STAGE_CHUNK = 5000
#: headers and body bytes per bulk write: a chunk is written once it holds this many
STAGE_BYTES = 16 * 2**20
#: rows of one task kept in memory to stage again after a transient fault (headers + bodies)
STAGE_RETRY_BYTES = 64 * 2**20



@dataclass(frozen=True)
class StageReport:
    """What one successful task attempt staged (travels back to the driver)."""

    attempt: str
    rows: int
    routes: tuple[tuple[str, str, int], ...]  # (kind, route, count)
    batch_id: int
    query_id: str | None


@dataclass
class DispatchResult:
    batch_id: int
    skipped: bool = False  # dispatched before: a replay
    sent: int = 0
    delayed: int = 0
    published: int = 0
    failed: int = 0  # refused by the routing path: to the endpoint's error queue instead
    destinations: dict[str, int] = field(default_factory=dict)
    moved: MoveResult | None = None


# -- set-up (driver) ------------------------------------------------------------------------------


def set_up_sender(options: SendSettings) -> SendPlan:
    """Create the endpoint's staging and outbox tables (ours, always) and, with createQueues,
    its delayed table, error queue and default destination, each only if missing (once they exist, table
    privileges are enough); find its input queue for ReplyToAddress. Returns the executors' plan."""
    d = options.dialect
    tables = [(options.staging, d.create_staging), (options.outbox, d.create_outbox)]
    if options.create_queues:  # names from options only, never names from message data
        tables += [(options.delayed, d.create_delayed), (options.error_queue, d.create_queue)]
        if options.destination is not None:
            tables.append((options.destination, d.create_queue))
    conns: list[Any] = []

    def connect() -> Any:
        conns.append(d.connect(options.url))
        return conns[-1]

    def set_up(conn: Any) -> bool:
        cur = conn.cursor()
        for table, create in tables:
            if not db.columns(cur, d.queue_columns(table)):
                for stmt in create(table):  # idempotent installers: safe to run again after a fault
                    db.execute(cur, stmt)
        conn.commit()
        if options.destination is not None:  # a wrong static destination fails at start, named
            Router(d, options.routing).configured(cur, options.destination, option="destination")
        return bool(db.columns(cur, d.queue_columns(options.endpoint)))

    try:
        has_input = db.retrying(d, set_up, connection=connect, discard=db.close,
                                what=f"setting up the sender tables of endpoint {d.format_address(options.endpoint)}")
    finally:
        for conn in conns:
            db.close(conn)
    return SendPlan(
        dialect=d.name,
        endpoint=options.endpoint.table,
        default_destination=options.destination,
        reply_to=d.format_address(options.endpoint) if has_input else None,
        content_type=options.content_type,
        sink=options.sink,
    )


# -- stage (executors) ---------------------------------------------------------------------------


def stage_partition(
    options: SendSettings,
    plan: SendPlan,
    batches: Iterable[Iterable[Mapping[str, Any]]],
    *,
    batch_id: int,
    query_id: str | None,
) -> StageReport:
    """Stage every row of one task in one transaction; returns what the driver needs to dispatch.

    A transient fault (the session terminated, the server restarting) stages again on a new
    connection under a new attempt id, from the rows kept so far (up to `STAGE_RETRY_BYTES`;
    a larger task fails, and Spark's task retry or the query's restart stages it again). If the
    failed attempt's commit landed after all, its rows are never sent: the driver dispatches only
    the attempts tasks report and deletes the rest of the batch's staged rows.
    """
    dialect = options.dialect
    builder = MessageBuilder(plan, batch_id=batch_id, attempt=uuid.uuid4().hex)
    now = format_time(datetime.now(timezone.utc))  # TimeSent: one value per task
    source = iter(builder.build(row, now) for batch in batches for row in batch)
    kept: list[tuple[Any, ...]] | None = []  # every row read so far, while small enough to keep
    kept_bytes, delay = 0, 0.2

    def fresh() -> Iterator[tuple[Any, ...]]:
        """The task's next input rows, kept for a retry while they fit in `STAGE_RETRY_BYTES`."""
        nonlocal kept, kept_bytes
        while (row := _next_input(source)) is not None:
            if kept is not None:
                kept.append(row)
                kept_bytes += _staged_bytes(row)
                if kept_bytes > STAGE_RETRY_BYTES:
                    kept = None
            yield row

    for attempt in range(1, db.RETRIES + 1):
        conn = None
        rows = 0
        try:
            conn = _connect(dialect, options)
            retried = [(*r[:2], builder.attempt, *r[3:]) for r in kept or ()]  # a retry: under this attempt's id
            for chunk in _chunks(itertools.chain(retried, fresh())):
                dialect.stage_rows(conn, options.staging, chunk)
                rows += len(chunk)
            conn.commit()
        except _InputFailed as failed:  # our input (the upstream plan, a bad row) failed: not ours to retry
            _discard(conn)
            raise failed.__cause__ from None  # type: ignore[misc]
        except Exception as exc:
            _discard(conn)
            what = f"staging batch {batch_id} of endpoint {plan.endpoint!r} into {dialect.qualified(options.staging)}"
            if dialect.is_undefined_table(exc):
                raise QueueNotFoundError(f"{what}: the staging table does not exist") from exc
            if not dialect.is_transient(exc) or attempt == db.RETRIES or kept is None:
                raise db.explain(dialect, what, exc) from exc
            log.warning("%s failed (%s); staging again in %.1fs", what, dialect.error_text(exc), delay)
            builder.attempt = uuid.uuid4().hex
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        EXECUTOR_CONNECTIONS.put(options.url, conn)
        routes = tuple((k, r, n) for (k, r), n in sorted(builder.counts.items()))
        return StageReport(builder.attempt, rows, routes, batch_id, query_id)
    raise AssertionError("unreachable")


def _staged_bytes(row: tuple[Any, ...]) -> int:
    """Headers and body bytes of one staged row (`STAGED_COLUMNS` order)."""
    return len(row[6]) + len(row[7] or b"")


def _chunks(rows: Iterable[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    """Staged rows in bulk writes of at most `STAGE_CHUNK` rows and about `STAGE_BYTES` bytes."""
    chunk: list[tuple[Any, ...]] = []
    size = 0
    for row in rows:
        chunk.append(row)
        size += _staged_bytes(row)
        if len(chunk) >= STAGE_CHUNK or size >= STAGE_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _InputFailed(Exception):
    """Raised from the task's input rows; the original error is the cause."""


def _next_input(rows: Any) -> tuple[Any, ...] | None:
    try:
        return next(rows)  # type: ignore[no-any-return]
    except StopIteration:
        return None
    except Exception as exc:
        raise _InputFailed from exc


def _discard(conn: Any) -> None:
    if conn is not None:
        db.rollback(conn)
        db.close(conn)


def _connect(dialect: Dialect, options: SendSettings) -> Any:
    """A cached connection, checked with a trivial statement; a dropped one is replaced once."""
    for attempt in (1, 2):
        conn = EXECUTOR_CONNECTIONS.get(options.url, dialect.connect)
        try:
            conn.cursor().execute("SELECT 1").fetchall()
            conn.rollback()
            return conn
        except Exception as exc:
            db.close(conn)
            if attempt == 2 or not dialect.is_transient(exc):
                raise
    raise AssertionError("unreachable")


# -- dispatch (driver) -----------------------------------------------------------------------------


class Dispatcher:
    """The driver side of the sink: dispatches staged batches, moves due delayed messages."""

    def __init__(self, options: SendSettings) -> None:
        self.options = options
        self.dialect: Dialect = options.dialect
        self.outbox = Outbox(self.dialect, options.outbox, options.staging, options.endpoint.table, options.sink)
        self.mover = DelayedMover(self.dialect, options.delayed, options.endpoint, options.error_queue,
                                  policy=options.routing)
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self.dialect.connect(self.options.url)
        return self._conn

    def _run(self, what: str, fn: Callable[[Any], T]) -> T:
        """`fn(conn)` in a transaction, retried on a new connection after a transient fault.
        Safe for dispatch: a retry of a batch that did commit finds its outbox record."""

        def discard(conn: Any) -> None:
            db.close(conn)
            self._conn = None

        return db.retrying(self.dialect, fn, connection=self._connection, discard=discard,
                           what=f"{what} for endpoint {self.options.endpoint}")

    def dispatch(self, batch_id: int, reports: list[StageReport | None], *, query_id: str | None = None) -> DispatchResult:
        """Dispatch one batch from its successful tasks' reports (idempotent per batch id)."""
        done = [r for r in reports if r is not None]
        query_id = query_id or next((r.query_id for r in done if r.query_id), None)
        fp = fingerprint(query_id, uuid.uuid4().hex)
        result = self._run("dispatch", lambda conn: self._dispatch(conn, batch_id, done, fp))
        if result.skipped:
            log.info("batch %d of endpoint %s was dispatched before; nothing sent again", batch_id, self.options.endpoint)
        else:
            log.info("batch %d of endpoint %s: sent %d, delayed %d, published %d",
                     batch_id, self.options.endpoint, result.sent, result.delayed, result.published)
        try:
            result.moved = self.move_due()
            self.outbox.cleanup(self._connection(), self.options.retention_seconds)
            vacuum_if_due(self.dialect, self._connection(), self.options.staging)
        except Exception as exc:  # noqa: BLE001 - the batch is sent; these run again next time
            db.rollback(self._connection())
            log.warning("after dispatching batch %d of %s: %s", batch_id, self.options.endpoint,
                        db.describe(self.dialect, exc))
        return result

    def _dispatch(self, conn: Any, batch_id: int, reports: list[StageReport], fp: str) -> DispatchResult:
        d, o = self.dialect, self.options
        cur = conn.cursor()
        result = DispatchResult(batch_id)
        attempts = [r.attempt for r in reports]
        expected = sum(r.rows for r in reports)
        if expected == 0:
            self._delete_leftovers(cur, batch_id)
            return result
        for stmt in d.dispatch_plans():
            db.execute(cur, stmt)
        if self.outbox.begin(cur, batch_id, fp) is not None:
            result.skipped = True
            db.execute(cur, d.delete_staged(o.staging, attempts=attempts))
            self._delete_leftovers(cur, batch_id)
            return result
        routes: dict[tuple[str, str], int] = {}
        for r in reports:
            for kind, route, n in r.routes:
                routes[(kind, route)] = routes.get((kind, route), 0) + n
        router = Router(d, o.routing)
        # every destination: canonical address -> (target or why not, send route, published routes)
        targets: dict[str, tuple[Target | Refusal, str | None, list[str]]] = {}
        for kind, route in routes:
            if kind == SEND:
                targets[route] = (router.resolve(cur, route, option="destination"), route, [])
        published = [route for (kind, route) in routes if kind == PUBLISH]
        if published:
            self._route_publishes(cur, router, published, targets)
        refused: list[tuple[Refusal, str | None, list[str]]] = []
        for to, route, pub_routes in targets.values():
            if isinstance(to, Refusal):
                refused.append((to, route, pub_routes))
                continue
            stmt = d.dispatch(o.staging, to.address, attempts=attempts, route=route, publish_routes=pub_routes,
                              recoverable=to.recoverable)
            n, problem = insert_guarded(cur, d, stmt)
            if problem is not None:  # the table refused the rows (privileges, a trigger...)
                refused.append((Refusal(to.text, f"writing to {to.name} failed: {problem}"), route, pub_routes))
                continue
            result.destinations[to.text] = result.destinations.get(to.text, 0) + n
            result.sent += n
        if refused:
            result.failed = self._to_error_queue(cur, router, attempts, refused)
        result.published = sum(n for (kind, _), n in routes.items() if kind == PUBLISH)
        delayed = sum(n for (kind, _), n in routes.items() if kind == DELAYED)
        if delayed:
            self._check_delayed(cur)
            result.delayed = db.rowcount(cur, d.dispatch_delayed(o.staging, o.delayed, attempts=attempts))
            if result.delayed != delayed:
                raise DispatchError(f"batch {batch_id}: {delayed} delayed messages staged, {result.delayed} stored")
        found = db.rowcount(cur, d.delete_staged(o.staging, attempts=attempts))
        if found != expected:
            # UNLOGGED staging emptied by a server restart, or rows deleted by hand: do not send
            # part of a batch. Spark stages the batch again when the query restarts.
            raise DispatchError(
                f"batch {batch_id} of endpoint {o.endpoint}: the tasks staged {expected} messages but "
                f"{found} are in {d.qualified(o.staging)} (database restarted?). Nothing was sent; "
                "restart the query to stage the batch again"
            )
        self._delete_leftovers(cur, batch_id)
        self.outbox.finish(cur, batch_id, sent=result.sent, delayed=result.delayed, published=result.published)
        return result

    def _delete_leftovers(self, cur: Any, batch_id: int) -> None:
        """Delete what failed attempts of a streaming batch staged (one-off writes have no batch
        id of their own in staging: theirs go with the retention cleanup)."""
        if batch_id >= 0:
            db.execute(cur, self.dialect.delete_batch_leftovers(self.options.staging, sink=self.options.sink, batch_id=batch_id))

    def _to_error_queue(self, cur: Any, router: Router, attempts: list[str],
                        refused: list[tuple[Refusal, str | None, list[str]]]) -> int:
        """Copy the staged messages of refused destinations to the endpoint's error queue, with
        NServiceBus's failure headers naming the destination and the reason."""
        d, o = self.dialect, self.options
        items = []
        for refusal, route, pub_routes in refused:
            stmt = d.staged_messages(o.staging, attempts=attempts, route=route, publish_routes=pub_routes)
            items += [Item(key, decode_headers(text), refusal, raw=text) for key, text in db.rows(cur, stmt)]
        routed = route_rows(
            cur, router, items,
            insert=lambda t, keys, headers: d.move_staged(o.staging, t.address, keys=keys, headers=headers,
                                                         recoverable=t.recoverable),
            delete=None,  # the staged rows go with the rest of the batch's
            error_queue=lambda: router.configured(cur, o.error_queue, option="errorQueue"),
            source="spark_qtransport.send", endpoint=o.endpoint.table,
        )
        return routed.failed

    def _route_publishes(self, cur: Any, router: Router, published: list[str],
                         targets: dict[str, tuple[Target | Refusal, str | None, list[str]]]) -> None:
        """Add each subscriber queue with the EnclosedMessageTypes values routed to it."""
        d, o = self.dialect, self.options
        if not db.columns(cur, d.queue_columns(o.subscriptions)):
            if not o.create_queues:
                raise QueueNotFoundError(
                    f"this batch publishes events, but the subscription table {d.qualified(o.subscriptions)} "
                    "does not exist; create it (option 'createQueues', or the DDL in sql/)"
                )
            for stmt in d.create_subscriptions(o.subscriptions):
                db.execute(cur, stmt)
        by_topic: dict[str, list[str]] = {}
        for types in published:
            for topic in topics_of(types):
                by_topic.setdefault(topic, []).append(types)
        if not by_topic:
            return
        for queue_text, topic in db.rows(cur, d.subscribers(o.subscriptions, sorted(by_topic))):
            to = router.resolve(cur, queue_text, option=f"subscriber of {topic} in {d.qualified(o.subscriptions)}")
            entry = targets.setdefault(to.text if isinstance(to, Target) else f"\0{queue_text}", (to, None, []))
            for types in by_topic[topic]:
                if types not in entry[2]:
                    entry[2].append(types)

    def _check_delayed(self, cur: Any) -> None:
        d, o = self.dialect, self.options
        if db.columns(cur, d.queue_columns(o.delayed)):
            return
        if o.create_queues:
            for stmt in d.create_delayed(o.delayed):
                db.execute(cur, stmt)
            return
        raise QueueNotFoundError(
            f"this batch has delayed messages but delayed delivery is not set up for endpoint {o.endpoint}: "
            f"table {d.qualified(o.delayed)} does not exist. Create it (the DDL in sql/, or "
            ".option('createQueues', 'true')); nothing of this batch was sent"
        )

    def move_due(self) -> MoveResult | None:
        """Move the endpoint's due delayed messages (no-op when its delayed table does not exist)."""
        def move(conn: Any) -> MoveResult | None:
            if not db.columns(conn.cursor(), self.dialect.queue_columns(self.options.delayed)):
                return None
            return self.mover.move(conn)

        return self._run("moving due delayed messages", move)

    def abort(self, reports: list[StageReport | None]) -> None:
        """Best effort: delete what the attempts of a failed batch staged."""
        attempts = [r.attempt for r in reports if r is not None]
        if attempts:
            self._run("abort", lambda c: db.rowcount(c.cursor(), self.dialect.delete_staged(self.options.staging, attempts=attempts)))

    def close(self) -> None:
        if self._conn is not None:
            db.close(self._conn)
            self._conn = None
