"""Receive: claim (driver), read a slice (executors), acknowledge (driver). Dialect-free.

How a message travels:

1. **Claim** (`Receiver.latest`): one short READ COMMITTED transaction moves at most `limit` of the
   oldest unlocked, unexpired queue rows into the queue's claim table, tagged with this consumer,
   server-side (bodies never pass through the driver). Expired rows are deleted and counted;
   poison rows (headers not a flat JSON object of strings) go raw to the error queue in the same
   transaction. The claim sequence is the Spark offset.
2. **Read** (`read_slice`): each Spark task selects its claim-sequence slice, in order. Reading
   changes nothing, so Spark can replay a batch after a crash.
3. **Acknowledge** (`Receiver.ack`): once Spark commits a batch, its claims are deleted in bounded
   batches. Idempotent: a repeated ack deletes nothing.

A crash anywhere loses nothing: rows are either in the queue or in the claim table until their
batch is acknowledged. Claims that no checkpoint knows about (the driver died between the claim
commit and Spark's offset log write, or the checkpoint was deleted) are found by `latest` and
delivered again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from ...connections import EXECUTOR_CONNECTIONS, ConnectionURL
from ...dialects import ClaimResult, Dialect, QueueAddress, dialect_named
from ...errors import ConfigError, ConsumerBusyError, OffsetError, QTransportError, QueueNotFoundError, SchemaError
from ...spark.options import ReaderOptions
from ...wire import H, parse_time
from .. import session as db
from ..delayed import DelayedMover
from ..routing import Router, queue_shape_problem
from .forward import ForwardResult, forward_claimed
from .vacuum import vacuum_if_due

__all__ = ["ClaimOffset", "ClaimSlice", "Receiver", "output_row", "read_chunks", "read_slice", "ReceiveStats"]

log = logging.getLogger("spark_qtransport.receive")

T = TypeVar("T")

#: after this many seconds the low-water mark is forgotten and a claim scans from the queue head
#: again, picking up rows that committed late (a producer's sequence value is taken at INSERT,
#: its row becomes visible at COMMIT) or that a competing consumer released by rolling back.
LOW_WATER_TTL = 5.0
#: smallest claim made while Spark waits (see Receiver._foreground_size)
STARTER_CLAIM = 1000
#: how long a starting query waits for its endpoint's lock before ConsumerBusyError
LOCK_WAIT = 30.0
#: how often a reader looks again whether its endpoint's delayed table exists
DELAYED_RECHECK = 30.0


@dataclass(frozen=True)
class ClaimOffset:
    """A Spark offset: the highest claim sequence of the batch and the claim table's identity.

    ``claimTable`` changes when the claim table is dropped and created again, which makes older
    offsets meaningless; `Receiver` notices and starts from the new table's beginning.
    """

    claim: int
    table: str

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "claimTable": self.table}

    @classmethod
    def from_dict(cls, d: Any) -> ClaimOffset:
        try:
            return cls(int(d["claim"]), str(d["claimTable"]))
        except (KeyError, TypeError, ValueError):
            raise OffsetError(
                f'offset {json.dumps(d)} is not a sqlqueue offset; expected e.g. {{"claim": 42, "claimTable": "16384"}}'
            ) from None


@dataclass(frozen=True)
class ClaimSlice:
    """What one Spark task needs to read its part of a batch (pickled to executors)."""

    url: ConnectionURL
    dialect: str
    queue: str  # canonical address text, for the output column
    claims: QueueAddress
    consumer: str
    table: str
    after: int
    upto: int

    def __repr__(self) -> str:  # shown in Spark's UI and logs: no URL here
        return f"ClaimSlice({self.claims.table!r}, {self.consumer!r}, ({self.after}, {self.upto}])"


@dataclass
class ReceiveStats:
    """Running totals of this query's driver, for logs and the reported latest offset."""

    claims: int = 0
    claimed: int = 0
    expired: int = 0
    poison: int = 0
    forwarded: int = 0  # to the queue their ForwardDestination header names
    forward_failed: int = 0  # that destination missing: to the error queue
    empty_peeks: int = 0
    acked: int = 0


class Receiver:
    """The driver side of one streaming query: claims, acknowledges, reports backlog."""

    def __init__(self, options: ReaderOptions, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.dialect: Dialect = options.dialect
        self.claims = self.dialect.claims_table(options.queue)
        self.stats = ReceiveStats()
        self._clock = clock
        self._conns: dict[str, Any] = {}  # "main": set up, holds the consumer lock; "ahead": claim-ahead
        self._table_id: str | None = None
        self._low_water: int | None = None
        self._low_water_at = 0.0
        self._last_end: int | None = None
        self._target: int | None = None  # Trigger.AvailableNow: highest queue sequence to take
        self._more = False  # the last claim was full: more is probably waiting
        self._backlog = 0
        self._ahead: Future[tuple[int | None, bool]] | None = None
        self._released = False  # claims up to the first planned start (a previous run's last batch)
        self._pool: ThreadPoolExecutor | None = None
        # NServiceBus convention: the endpoint that receives from queue Q owns Q.Delayed
        self._mover: DelayedMover | None = None
        try:
            self._mover = DelayedMover(self.dialect, self.dialect.companion(options.queue, "Delayed"),
                                       options.queue, options.error_queue, policy=options.routing)
        except ConfigError:  # a queue name too long to have a delayed table (NServiceBus allows 55 bytes)
            pass
        self._delayed_checked_at: float | None = None
        self._delayed_exists = False

    # -- connection, retries, set-up ----------------------------------------------------------

    def _connection(self, slot: str = "main") -> Any:
        conn = self._conns.get(slot)
        if conn is None:
            conn = self.dialect.connect(self.options.url)
            if slot == "main":
                try:
                    self._set_up(conn)
                except BaseException:
                    db.close(conn)
                    raise
            self._conns[slot] = conn
        return conn

    def _run(self, what: str, fn: Callable[[Any], T], *, slot: str = "main") -> T:
        """Run `fn(conn)` in a transaction; on a transient fault reconnect and retry (bounded)."""

        def discard(conn: Any) -> None:
            db.close(conn)
            self._conns.pop(slot, None)

        return db.retrying(self.dialect, fn, connection=lambda: self._connection(slot), discard=discard,
                           what=f"{what} on queue {self.dialect.format_address(self.options.queue)}")

    def _set_up(self, conn: Any) -> None:
        """Check the queues, create our claim table, take the consumer lock (once per connection)."""
        d, o = self.dialect, self.options
        cur = conn.cursor()
        check = d.server_check()
        if check is not None:
            (version,) = db.one(cur, check)
            problem = d.adapt_to_server(int(version), self.claims)
            if problem:
                raise SchemaError(f"option 'url': {problem}")
        for option, address in (("queue", o.queue), ("errorQueue", o.error_queue)):
            cols = db.columns(cur, d.queue_columns(address))
            if not cols and o.create_queues:
                for stmt in d.create_queue(address):
                    db.execute(cur, stmt)
                conn.commit()
                cols = db.columns(cur, d.queue_columns(address))
            if not cols:
                raise QueueNotFoundError(
                    f"option '{option}': queue {d.format_address(address)} does not exist; create it "
                    "(the DDL in sql/, or .option('createQueues', 'true'))"
                )
            shape = queue_shape_problem(cols)  # the routing path's own check, for our own queues too
            if shape is not None:
                raise SchemaError(f"option '{option}': table {d.format_address(address)} {shape}")
        # DDL only for what is missing: once a DBA has created the tables (and, on PostgreSQL
        # 13-15, the helper function), table privileges are enough to run.
        ddl = [] if db.columns(cur, d.queue_columns(self.claims)) else d.create_claims(self.claims)
        helpers = d.helpers_exist(self.claims)
        if helpers is not None and not db.one(cur, helpers)[0]:
            ddl += d.create_helpers(self.claims)
        for stmt in ddl:
            db.execute(cur, stmt)
        conn.commit()
        self._lock_consumer(conn, cur)
        (table_id,) = db.one(cur, d.table_id(self.claims))
        conn.commit()
        if self._table_id is not None and table_id != self._table_id:
            log.warning("claim table %s was recreated while this query ran", d.qualified(self.claims))
        self._table_id = str(table_id)

    def _lock_consumer(self, conn: Any, cur: Any) -> None:
        """Take the session lock that makes this query the endpoint's only receiver on the queue.

        A driver that was just killed may leave a process that still holds it for a moment (its
        connection closes when that process notices), so wait a while before calling it busy.
        """
        d, o = self.dialect, self.options
        deadline = self._clock() + LOCK_WAIT
        warned = False
        while True:
            (locked,) = db.one(cur, d.try_lock_consumer(self.claims, o.consumer))
            conn.commit()
            if locked:
                return
            if self._clock() >= deadline:
                raise ConsumerBusyError(
                    f"endpoint {o.consumer!r} is already receiving from queue {d.format_address(o.queue)} "
                    f"in another running query (waited {LOCK_WAIT:.0f}s); give each query its own "
                    ".option('endpoint', ...)"
                )
            if not warned:
                log.warning("endpoint %r on %s is held by another session; waiting up to %.0fs",
                            o.consumer, d.format_address(o.queue), LOCK_WAIT)
                warned = True
            time.sleep(0.5)

    @property
    def table_id(self) -> str:
        if self._table_id is None:
            # through _run: a failure to connect or set up (a wrong password, a missing database)
            # is our DatabaseError naming the queue, a transient one is retried
            self._run("connecting", lambda conn: None)
        assert self._table_id is not None
        return self._table_id

    # -- offsets ------------------------------------------------------------------------------

    def initial_offset(self) -> ClaimOffset:
        # Claim sequences are > 0. Starting below all of them means a new checkpoint first gets
        # the claims this consumer already holds (claimed but never acknowledged): no loss.
        return ClaimOffset(0, self.table_id)

    def _start_after(self, start: ClaimOffset | None) -> int | None:
        if start is None:  # Spark 4.0/4.1: latestOffset() has no start
            return self._last_end
        if start.table != self.table_id:
            log.warning(
                "claim table %s was recreated (offset names table %s, now %s): reading it from its start",
                self.dialect.qualified(self.claims), start.table, self.table_id,
            )
            return 0
        return start.claim

    def latest(self, start: ClaimOffset | None, limit: int | None) -> ClaimOffset:
        """Plan the next batch: claims it holds already, else claim at most `limit` (None: all).

        With claim-ahead on, while a backlog remains the next batch is claimed in the background
        as soon as this one is planned, so the claim overlaps Spark's processing of this batch.
        Its claims are ordinary held claims: found by the next call (or, after a crash, by the
        next query) exactly like claims whose planner died before Spark logged the offset.
        """
        self._await_ahead()
        self.move_delayed()
        after = self._start_after(start)
        self._release_previous_run(start, after)
        held_max, _ = self._run("peek claims", lambda c: db.one(c.cursor(), self.dialect.max_claim(self.claims, self.options.consumer)))
        if held_max is not None and (after is None or held_max > after):
            end = self._cap_held(after, int(held_max), limit)
        elif after is None:
            end = 0
        elif limit is None:
            end = after
            while True:
                claimed, full = self._claim_once(self.options.max_messages)
                end = claimed or end
                if not full:
                    break
        else:
            claimed, _ = self._claim_once(self._foreground_size(limit))
            end = claimed or after
        self._last_end = end
        if limit is not None and self._more and self.options.claim_ahead and after is not None:
            self._claim_ahead(limit)
        return ClaimOffset(end, self.table_id)

    def _release_previous_run(self, start: ClaimOffset | None, after: int | None) -> None:
        """Acknowledge the batch a previous run of this checkpoint ended with.

        Spark sends ``commit(end)`` only when it plans a batch after ``end``, so a run's last batch
        stays claimed after it stops, and would stay so while the queue is empty. Spark asks for
        the next offset only once every batch up to ``start`` is in the commit log (a restart
        first replays an uncommitted batch), so this run's first planning may acknowledge up to
        ``start``. Only the first: this run's own last batch stays replayable until the next run
        (a manual replay after deleting ``commits/N`` finds its rows).
        """
        if self._released or start is None:
            return
        self._released = True
        if after:  # in the foreground: Spark may end this run's process without waiting on a thread
            self.ack(ClaimOffset(after, self.table_id))

    def move_delayed(self) -> None:
        """Deliver the due messages of ``<queue>.Delayed``, if that table exists: every trigger,
        so a due message waits at most one trigger interval. Costs one indexed read when none
        is due. A failure is logged, never fails the query: the next trigger tries again."""
        if self._mover is None:
            return
        now = self._clock()
        try:
            if self._delayed_checked_at is None or now - self._delayed_checked_at > DELAYED_RECHECK:
                cols = self._run("find delayed table", lambda c: db.columns(c.cursor(), self.dialect.queue_columns(self._mover.delayed)))
                self._delayed_exists, self._delayed_checked_at = bool(cols), now
            if self._delayed_exists:
                self._mover.move(self._connection("main"))
        except Exception as exc:  # noqa: BLE001
            db.rollback(self._connection("main"))
            log.warning("moving due delayed messages of %s failed: %s", self.options.queue, db.describe(self.dialect, exc))

    def _foreground_size(self, limit: int) -> int:
        """How much to claim while Spark waits. With claim-ahead, a large batch starts with a
        smaller claim, so the first rows flow sooner; full batches follow, claimed in the
        background while Spark works."""
        if not self.options.claim_ahead:
            return limit
        return min(limit, max(STARTER_CLAIM, limit // 10))

    def _cap_held(self, after: int | None, held_max: int, limit: int | None) -> int:
        """Held claims beyond `after` form the batch, but no more than `limit` of them (a deleted
        checkpoint can find more: the last batch's and the one claimed ahead)."""
        if after is None or limit is None or held_max - after <= limit:
            return held_max
        stmt = self.dialect.nth_claim(self.claims, self.options.consumer, after=after, n=limit)
        (nth,) = self._run("peek claims", lambda c: db.one(c.cursor(), stmt))
        if nth is not None and int(nth) < held_max:
            self._more = True  # the rest of the held claims make the next batch
            return int(nth)
        return held_max

    def _background(self) -> ThreadPoolExecutor:
        # One thread: claims ahead and acknowledgements run one at a time, in order.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlqueue-background")
        return self._pool

    def _claim_ahead(self, limit: int) -> None:
        self._ahead = self._background().submit(self._claim_once, limit, slot="ahead")

    def _await_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        try:
            ahead.result()
        except Exception as exc:  # noqa: BLE001 - the claim is simply made again, in the foreground
            self._more = False
            log.warning("claiming ahead on %s failed (%s); claiming in the foreground", self.options.queue,
                        db.describe(self.dialect, exc))

    def _claim_once(self, limit: int, *, slot: str = "main") -> tuple[int | None, bool]:
        """One peek-then-claim transaction. Returns (highest claim sequence or None, batch was full)."""
        now = self._clock()
        if self._low_water is not None and now - self._low_water_at > LOW_WATER_TTL:
            self._low_water = None
        d, o = self.dialect, self.options

        def work(conn: Any) -> tuple[ClaimResult, ForwardResult] | None:
            cur = conn.cursor()
            after = self._low_water or 0
            if db.first(cur, d.peek(o.queue, after=after, upto=self._target)) is None:
                if after == 0:
                    return None
                # nothing above the low-water mark: look once more from the queue head
                self._low_water, after = None, 0
                if db.first(cur, d.peek(o.queue, after=0, upto=self._target)) is None:
                    return None
            for stmt in d.claim(o.queue, self.claims, o.error_queue, consumer=o.consumer,
                                limit=limit, after=after, upto=self._target):
                cur.execute(*db.args(stmt))
            row = cur.fetchone()
            claim = ClaimResult(*(None if v is None else int(v) for v in row))
            forwarded = ForwardResult()
            if claim.forward and claim.min_claim is not None and claim.max_claim is not None:
                forwarded = forward_claimed(
                    d, cur, router=Router(d, o.routing), queue=o.queue, claims=self.claims, consumer=o.consumer,
                    error_queue=o.error_queue, lo=claim.min_claim, hi=claim.max_claim)
            return claim, forwarded

        outcome = self._run("claim", work, slot=slot)
        if outcome is None:
            self.stats.empty_peeks += 1
            self._more = False
            return None, False
        result, forwarded = outcome
        self._record(result, forwarded)
        full = result.deleted >= limit
        self._more = full
        if full and result.max_source is not None:
            if self._low_water is None:
                self._low_water_at = now
            self._low_water = result.max_source
        else:
            self._low_water = None
        return result.max_claim, full

    def _record(self, r: ClaimResult, f: ForwardResult) -> None:
        s = self.stats
        s.claims += 1
        s.claimed += r.claimed - f.forwarded - f.failed
        s.expired += r.expired
        s.poison += r.poison
        s.forwarded += f.forwarded
        s.forward_failed += f.failed
        if r.expired or r.poison:
            log.warning(
                "queue %s: claimed %d, dropped %d expired, moved %d poison to %s (totals: %d expired, %d poison)",
                self.dialect.format_address(self.options.queue), r.claimed, r.expired, r.poison,
                self.dialect.format_address(self.options.error_queue), s.expired, s.poison,
            )
        else:
            log.info("queue %s: claimed %d", self.dialect.format_address(self.options.queue), r.claimed)

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: take only what is in the queue now, then finish. Delayed
        messages due by now are moved in first: they are available now too."""
        self.move_delayed()
        (target,) = self._run("available-now target", lambda c: db.one(c.cursor(), self.dialect.max_source_seq(self.options.queue)))
        self._target = int(target) if target is not None else 0

    def backlog(self, *, slot: str = "main") -> int:
        """Messages waiting, estimated from the span of unlocked sequences (skips held rows)."""
        (n,) = self._run("backlog", lambda c: db.one(c.cursor(), self.dialect.backlog(self.options.queue)), slot=slot)
        self._backlog = int(n or 0)
        return self._backlog

    def report(self) -> dict[str, Any]:
        """The last planned end offset and this run's counters, for progress reports."""
        end = ClaimOffset(self._last_end or 0, self.table_id).to_dict()
        s = self.stats
        return {**end, "claimed": s.claimed, "expired": s.expired, "poison": s.poison,
                "forwarded": s.forwarded, "forwardFailed": s.forward_failed}

    def reported_backlog(self) -> int:
        """The backlog for progress reports, without racing our own claim-ahead.

        The estimate briefly locks the queue's first and last rows (SKIP LOCKED); run beside a
        claim-ahead it would make that claim skip the head row. So while the background thread
        exists the estimate is refreshed there, after the claim, and the last value is returned.
        """
        if self._pool is None:
            return self.backlog()
        self._pool.submit(self._refresh_backlog)
        return self._backlog

    def _refresh_backlog(self) -> None:
        try:
            self.backlog(slot="ahead")
        except Exception as exc:  # noqa: BLE001 - a progress metric must not fail the query
            log.info("backlog estimate for %s failed: %s", self.options.queue, db.describe(self.dialect, exc))

    # -- partitions and acknowledgement -------------------------------------------------------

    def slices(self, start: ClaimOffset, end: ClaimOffset) -> list[ClaimSlice]:
        after = start.claim if start.table == end.table else 0
        if end.claim <= after:
            return []
        span = end.claim - after
        n = min(self.options.partitions_for(span), span)
        bounds = [after + (span * i) // n for i in range(n + 1)]
        queue_text = self.dialect.format_address(self.options.queue)
        return [
            ClaimSlice(self.options.url, self.dialect.name, queue_text, self.claims,
                       self.options.consumer, end.table, lo, hi)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
            if hi > lo
        ]

    def ack(self, end: ClaimOffset, *, background: bool = False) -> int:
        """Delete this consumer's claims up to `end` in bounded batches. Idempotent.

        With `background`, the deletes run on the claim-ahead thread (after any claim in flight)
        and this returns at once: nothing waits on an acknowledgement, and a lost one is repaired
        by the next, which deletes everything up to its own end.
        """
        if end.table != self.table_id:
            log.info("not acknowledging offset of a claim table that no longer exists: %s", end)
            return 0
        if background:
            self._background().submit(self._ack_logged, end)
            return 0
        return self._ack(end, slot="main")

    def _ack_logged(self, end: ClaimOffset) -> None:
        try:
            self._ack(end, slot="ahead")
        except Exception as exc:  # noqa: BLE001 - the next acknowledgement covers these claims too
            log.warning("acknowledging claims up to %s on %s failed: %s", end.claim, self.options.queue,
                        db.describe(self.dialect, exc))

    def _ack(self, end: ClaimOffset, *, slot: str) -> int:
        batch = self.options.ack_batch
        stmt = self.dialect.ack_claims(self.claims, self.options.consumer, upto=end.claim, batch=batch)
        total = 0
        while True:
            n = self._run("acknowledge", lambda c: db.rowcount(c.cursor(), stmt), slot=slot)
            total += n
            if n < batch:
                break
        self.stats.acked += total
        if total and self._conns.get(slot) is not None:
            vacuum_if_due(self.dialect, self._conns[slot], self.claims)
        return total

    def close(self) -> None:
        # A claim-ahead in flight finishes first: its rows are then held claims, delivered later.
        try:
            self._await_ahead()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            ahead = self._conns.pop("ahead", None)
            if ahead is not None:
                db.close(ahead)
            conn = self._conns.pop("main", None)
            if conn is not None:
                try:
                    db.rollback(conn)
                    conn.cursor().execute(*db.args(self.dialect.unlock_consumer(self.claims, self.options.consumer)))
                    conn.commit()
                except Exception:  # noqa: BLE001 - closing the connection releases the lock anyway
                    pass
                db.close(conn)


# -- executors ----------------------------------------------------------------------------------

#: most rows one fetch asks for (small rows: one round trip per 5,000)
_FETCH = 5000
#: headers and body bytes one fetch aims at; the next fetch is sized from the largest row seen
FETCH_BYTES = 16 * 2**20


def read_chunks(
    part: ClaimSlice, *, chunk: int = _FETCH, budget: int = FETCH_BYTES
) -> Iterator[list[tuple[Any, ...]]]:
    """Yield the raw claim rows of one slice in order, a fetch at a time, on a reused connection.

    Fetches are bounded by bytes as well as rows: the first asks for one row, each next one for
    at most `budget` bytes' worth of the largest row seen so far (never more than `chunk` rows,
    and at most four times the previous fetch, so a run of large rows after small ones is met
    by a small fetch). 20 MB bodies come one at a time; 1 KB bodies still 5,000 at a time.

    Rows are (claim_seq, native_id text, expires, headers text, body, source_seq, claimed_at).
    A transient fault mid-slice (the session terminated, the server restarting) does not fail the
    task: the read resumes after the last claim sequence it yielded, on a new connection, with the
    waits of `_db.retrying`. Claims are not acknowledged before Spark commits this batch, so the
    rest of the slice is still there.
    """
    dialect = dialect_named(part.dialect)
    after, delay = part.after, 0.2
    size, largest = 1, 1  # rows to fetch next; bytes of the largest row seen
    for attempt in range(1, db.RETRIES + 1):
        try:
            conn, cur = _open_slice(dialect, part if after == part.after else replace(part, after=after))
        except Exception as exc:
            if attempt == db.RETRIES or not dialect.is_transient(exc):
                raise
            log.warning("reading %r failed (%s); retrying in %.1fs", part, db.describe(dialect, exc), delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        healthy = False
        try:
            while True:
                try:
                    rows = cur.fetchmany(size)
                    if not rows:
                        cur.close()
                        conn.commit()
                        healthy = True
                        return
                except Exception as exc:
                    if attempt == db.RETRIES or not dialect.is_transient(exc):
                        raise
                    log.warning("reading %r failed after claim %d (%s); resuming there in %.1fs",
                                part, after, db.describe(dialect, exc), delay)
                    break
                after = int(rows[-1][0])
                largest = max(largest, *(len(r[3] or "") + len(r[4] or b"") for r in rows))
                size = max(1, min(chunk, size * 4, budget // largest))
                yield rows
                rows = []  # the caller is done with them: not held during the next fetch
        finally:
            if healthy:
                EXECUTOR_CONNECTIONS.put(part.url, conn)
            else:
                db.close(conn)
        time.sleep(delay)
        delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


def _open_slice(dialect: Dialect, part: ClaimSlice) -> tuple[Any, Any]:
    """Check the claim table and start the slice's query. A cached connection the server has
    dropped since the last batch is replaced once (nothing has been read yet, so retrying is safe)."""
    for attempt in (1, 2):
        conn = EXECUTOR_CONNECTIONS.get(part.url, dialect.connect)
        try:
            (table_id,) = db.one(conn.cursor(), dialect.table_id(part.claims))
            if str(table_id) != part.table:
                raise OffsetError(
                    f"claim table {dialect.qualified(part.claims)} was dropped and created again after this "
                    f"batch was planned (offset names table {part.table}, now {table_id}); its claims are gone. "
                    "Start the query with a new checkpoint location to go on."
                )
            cur = dialect.streaming_cursor(conn)
            cur.execute(*db.args(dialect.read_claims(part.claims, part.consumer, after=part.after, upto=part.upto)))
            return conn, cur
        except Exception as exc:
            db.close(conn)
            if attempt == 2 or not dialect.is_transient(exc):
                raise
            log.info("reconnecting to read %r: %s", part, db.describe(dialect, exc))
    raise AssertionError("unreachable")


def read_slice(part: ClaimSlice) -> Iterator[tuple[Any, ...]]:
    """Yield the rows of one slice as output tuples (see `spark_qtransport.spark.reader.SCHEMA`)."""
    for rows in read_chunks(part):
        for row in rows:
            yield output_row(part.queue, row)


def _utc(v: datetime | None) -> datetime | None:
    if v is None:
        return None
    return v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v


def output_row(queue: str, row: Any) -> tuple[Any, ...]:
    """One raw claim row as an output tuple, in `spark_qtransport.spark.reader.SCHEMA` column order."""
    claim_seq, native_id, expires, headers_text, body, source_seq, claimed_at = row
    try:
        headers = json.loads(headers_text)
    except ValueError as exc:  # the claim transaction checked them; this is a bug, say which row
        raise QTransportError(f"claimed message {native_id} (claim {claim_seq}) has unreadable headers: {exc}") from exc
    native_id = str(native_id).lower()
    get = headers.get
    return (
        get(H.MESSAGE_ID) or native_id,
        native_id,
        headers,
        bytes(body) if body is not None else None,
        _utc(expires),
        get(H.ENCLOSED_MESSAGE_TYPES),
        get(H.CORRELATION_ID),
        get(H.CONVERSATION_ID),
        get(H.REPLY_TO_ADDRESS),
        get(H.MESSAGE_INTENT),
        parse_time(get(H.TIME_SENT)),
        queue,
        int(claim_seq),
        int(source_seq),
        _utc(claimed_at),
    )
