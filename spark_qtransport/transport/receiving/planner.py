"""Planning batches: Spark offsets (`ClaimOffset`), what this query has claimed and whether more
waits, how much to claim next, and the slices a batch is read in (`ClaimSlice`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from ...connections import ConnectionURL
from ...dialects import Connection, QueueAddress
from ...errors import OffsetError
from .. import session as db
from ..session import Session
from .claimer import Claimer, ClaimOutcome, ClaimRequest
from .ledger import Ledger
from .prepared import Prepared, listed
from .setup import Endpoint
from .stats import ReceiveStats, dropped_note

__all__ = ["ClaimOffset", "ClaimSlice", "PreparedRead", "LOW_WATER_TTL", "Planner", "STARTER_CLAIM"]

log = logging.getLogger("spark_qtransport.receive")

#: after this many seconds the low-water mark is forgotten and a claim scans from the queue head
#: again, picking up rows that committed late (a producer's sequence value is taken at INSERT,
#: its row becomes visible at COMMIT) or that a competing consumer released by rolling back.
LOW_WATER_TTL = 5.0
#: smallest claim made while Spark waits (see Planner._foreground_size)
STARTER_CLAIM = 1000
#: why a claim moved a row to the error queue, by the column at fault (`ClaimResult.dead_lettered`)
DEAD_REASONS = {"id": "without an id (id is NULL)", "expires": "with an Expires after year 9999"}


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
        if isinstance(d, dict) and "queues" in d:
            raise OffsetError("this checkpoint is of a stream over several queues; a checkpoint cannot switch "
                              "between one queue and several: start this stream from a new checkpoint")
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
    #: a slice of a claim held by a prepared transaction (`PreparedRead`); None: of the claim table
    prepared: PreparedRead | None = None
    #: the whole batch's claims of this queue, (after, upto], recorded by the read
    #: (`transport.settled`); None: the database has no table for it
    batch: tuple[int, int] | None = None

    def __repr__(self) -> str:  # shown in Spark's UI and logs: no URL here
        held = "" if self.prepared is None else f", prepared {self.prepared.xid}"
        return f"ClaimSlice({self.claims.table!r}, {self.consumer!r}, ({self.after}, {self.upto}]{held})"


@dataclass(frozen=True)
class PreparedRead:
    """Where a prepared claim's rows are read: the queue's rows its transaction deleted (`xid`),
    numbered `shift` + seq, expiry judged by the claim's clock; or, once the claim was parked,
    their copies in the claim table (`read_chunks` looks in the same snapshot)."""

    queue: QueueAddress
    xid: str
    shift: int
    claimed_at: str


@dataclass
class _LowWater:
    """The highest queue sequence a full claim saw: the next claim scans from there, not from the
    queue head, until `LOW_WATER_TTL` seconds after it was first set."""

    seq: int | None = None
    since: float = 0.0


class Planner:
    """Owns the claim state: where the last planned batch ended, whether more is waiting, the
    low-water mark, the AvailableNow target and the claim made ahead. Only the driver's thread
    changes it; a claim made ahead is applied when the next batch is planned."""

    def __init__(self, endpoint: Endpoint, claimer: Claimer, main: Session, stats: ReceiveStats,
                 *, clock: Callable[[], float] = time.monotonic, ledger: Ledger,
                 table: Callable[[], str] = lambda: "") -> None:
        self.endpoint, self.stats = endpoint, stats
        self._claimer, self._main, self._clock = claimer, main, clock
        #: the claims this consumer holds, in the claim table and prepared (`ledger.py`), and the
        #: claim table's id
        self.ledger = ledger
        self._table = table
        self.last_end: int | None = None
        self.target: int | None = None  # Trigger.AvailableNow: highest queue sequence to take
        self._more = False  # the last claim was full: more is probably waiting
        self._low_water = _LowWater()
        #: the highest queue sequence any claim of this run took, kept `LOW_WATER_TTL` seconds
        #: (`estimate_floor`)
        self._taken = _LowWater()
        self._ahead: Future[ClaimOutcome] | None = None
        #: (claim table, claim sequence): everything up to it is processed (`processed`), so no
        #: batch reads below it, even from a start below it (Spark 4.0/4.1: a run's first batch
        #: may end below the start Spark gave it, see `Receiver.first_batch`)
        self._floor: tuple[str, int] | None = None
        #: the highest claim sequence this consumer may hold, as last read or claimed since, and
        #: the sessions' generations then (`held_max`)
        self._held: int | None = None
        self._held_seen: tuple[int, int] | None = None

    def start_after(self, start: ClaimOffset | None, table_id: str) -> int | None:
        """The claim sequence a batch planned from `start` begins after (None: not known yet)."""
        if start is None:  # Spark 4.0/4.1: latestOffset() has no start
            return self.last_end
        if start.table != table_id:
            log.warning(
                "claim table %s was recreated (offset names table %s, now %s): reading it from its start",
                self.endpoint.dialect.qualified(self.endpoint.claims), start.table, table_id,
            )
            return 0
        return self._above_floor(start)

    def processed(self, upto: ClaimOffset) -> None:
        """Spark has processed every batch up to `upto`: no later batch reads at or below it.
        (Only a caller that knows it: Spark 4.0 asks for the slices of a batch it is about to
        replay with its end as start too, so a batch's start alone does not tell.)"""
        if self._floor is None or self._floor[0] != upto.table or self._floor[1] < upto.claim:
            self._floor = (upto.table, upto.claim)

    def _above_floor(self, start: ClaimOffset) -> int:
        floor = self._floor
        return max(start.claim, floor[1]) if floor is not None and floor[0] == start.table else start.claim

    def plan(self, after: int | None, limit: int | None, *, claim: bool = True, whole: bool = False) -> int:
        """The end of the next batch: claims held already, else claim at most `limit` (None: all).
        Without `claim` (a queue leaving the stream), only claims held already. With `whole` (a
        batch admitted by minMessagesPerTrigger: the messages are there), no smaller first claim.

        With claim-ahead on, while a backlog remains the next batch is claimed in the background
        as soon as this one is planned, so the claim overlaps Spark's processing of this batch.
        Its claims are ordinary held claims: found by the next call (or, after a crash, by the
        next query) exactly like claims whose planner died before Spark logged the offset.
        """
        o = self.endpoint.options
        held_max = self.held_max()
        if held_max is not None and (after is None or held_max > after):
            end = self._cap_held(after, held_max, limit)
        elif after is None:
            end = 0
        elif not claim:
            end = after
        elif limit is None:
            end = after
            while True:
                claimed, full = self._claim_now(o.max_messages, end)
                end = claimed or end
                if not full:
                    break
        else:
            claimed, _ = self._claim_now(limit if whole else self._foreground_size(limit), after)
            end = claimed or after
        self.last_end = end
        if claim:
            self._claim_ahead(after, end, limit)
        return end

    def at_rest(self, after: int) -> bool:
        """`plan(after, ..., claim=False)` without a call or a statement, when it is known to end at
        `after`: what is held is known and none of it lies beyond (an idle queue's trigger)."""
        if not self.held_known() or (self._held is not None and self._held > after):
            return False
        self.last_end = after
        return True

    def _claim_ahead(self, after: int | None, end: int, limit: int | None, *, least: int = 0) -> None:
        """Claim the batch after `end` in the background if the last claim was full (claim-ahead
        on), for a share of at least `least` messages."""
        o = self.endpoint.options
        if limit is not None and limit >= least and self._more and o.claim_ahead and after is not None:
            self._ahead = self._claimer.claim_ahead(self._request(limit, end))

    def claim_request(self, after: int | None, limit: int | None, *, whole: bool = False) -> ClaimRequest | None:
        """The one claim `plan(after, limit, whole=whole)` would make, for a caller that makes it in a
        transaction shared with other queues' claims (`QueueSet`) and gives its outcome to `planned`;
        None when this plan is not that one claim (claims held already, no limit, no numbers known
        yet, a claim to be prepared: its transaction is its own)."""
        held_max = self.held_max()
        if (after is None or limit is None or (held_max is not None and held_max > after)
                or self.endpoint.mode.prepares):
            return None
        return self._request(limit if whole else self._foreground_size(limit), after)

    def planned(self, after: int, outcome: ClaimOutcome, limit: int | None) -> int:
        """`plan`'s end for the claim `claim_request` asked for (at most `limit`), made by the
        caller (`outcome`). The next batch is claimed ahead only for a share of `STARTER_CLAIM` or
        more (`plan` claimed less while Spark waited): a thousand small queues' claims ahead would
        be a transaction each, and the next trigger claims for all of them in one."""
        claimed = self._apply(outcome).result
        end = (claimed.max_claim if claimed is not None else None) or after
        self.last_end = end
        self._claim_ahead(after, end, limit, least=STARTER_CLAIM)
        return end

    def held_max(self, *, fresh: bool = False) -> int | None:
        """The highest claim sequence this consumer holds (None: it holds none), or a bound above it.

        Read from the claim table once, then kept: the consumer lock makes this query the only one
        that adds claims of its consumer, so each claim's highest sequence keeps the bound, and an
        acknowledgement only deletes claims at or below a batch's start. Read again with `fresh`
        and after either session opened a new connection (a claim whose commit went unanswered
        may have committed). An idle queue so costs no statement per trigger."""
        if fresh or not self.held_known():
            self._main.run(self.read_held_in, self.endpoint.what("peek claims"))
        return self._held

    def held_known(self) -> bool:
        """Whether `held_max` knows what is held without a statement."""
        return self._held_seen is not None and self._held_seen == self._claimer.generations()

    def read_held_in(self, conn: Connection, *, server: list[Prepared] | None = None,
                     bounds: tuple[Any, Any] | None = None) -> None:
        """What this consumer holds, read from the server in the caller's transaction: claim-table
        claims and prepared ones (`held_max`; `Receiver.first_look`, many queues' in one). The
        server's prepared transactions from `server` if given (`prepared.all_on_server`); the claim
        table's (max, min) from `bounds` if given (`Dialect.max_claims`, read in that transaction)."""
        d, cur = self.endpoint.dialect, conn.cursor()
        high, low = bounds if bounds is not None else db.one(cur, d.max_claim(self.endpoint.claims,
                                                                             self.endpoint.options.consumer))
        self.ledger.replace_table(None if high is None else (int(low), int(high)))
        table = self._table()
        if self.endpoint.mode.possible and table:  # (no claim table known yet: no claim of this run either)
            self.ledger.replace_prepared(listed(self.endpoint, cur, table, server=server))
        self._held = self.ledger.highest()
        self._held_seen = self._claimer.generations()

    def may_hold_prepared(self, end: int) -> bool:
        """Whether claims up to `end` may be held by prepared transactions (`ClaimMode.may_hold`).
        Only then does an acknowledgement or a replay need the server's list (`held_max`) first: a
        stream in claim-table mode over hundreds of queues must not pay a statement per queue at
        its last commit (a run's end, where the runner may be ended before it finishes)."""
        return self.endpoint.mode.may_hold(end)

    def holds_prepared(self) -> bool:
        """This run holds (or may hold) claims in prepared transactions."""
        return self.endpoint.mode.holds(bool(self.ledger.prepared()))

    def _first(self, after: int | None) -> int | None:
        """Where the next claim's numbers begin (None: the claim table's identity numbers it)."""
        return self.endpoint.mode.first_number((after, self.last_end, self._held, self._floor[1] if self._floor else None))

    def settle_ahead(self) -> None:
        """Wait for the claim made ahead, if any, and apply it. A failed one is simply made again,
        in the foreground."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        try:
            self._apply(ahead.result())
        except Exception as exc:  # noqa: BLE001 - the claim is simply made again, in the foreground
            self._more = False
            log.warning("claiming ahead on %s failed (%s); claiming in the foreground", self.endpoint.options.queue,
                        db.describe(self.endpoint.dialect, exc))

    def _claim_now(self, limit: int, after: int) -> tuple[int | None, bool]:
        """Claim while Spark waits. Returns (highest claim sequence or None, the claim was full)."""
        outcome = self._apply(self._claimer.claim(self._request(limit, after)))
        return (outcome.result.max_claim if outcome.result else None), outcome.full

    def _request(self, limit: int, after: int | None) -> ClaimRequest:
        now = self._clock()
        if self._low_water.seq is not None and now - self._low_water.since > LOW_WATER_TTL:
            self._low_water = _LowWater()
        first = self._first(after)
        # a run's first claim numbers above the server's clock: the checkpoint's last numbers may be
        # unknown here and its claims all committed (`ClaimNumbering.clock_base`)
        return ClaimRequest(limit, self._low_water.seq or 0, self.target, now, first,
                            clock_floor=first is not None and self.last_end is None)

    def _apply(self, outcome: ClaimOutcome) -> ClaimOutcome:
        """Take in what a claim did: the counters, whether more waits, the low-water mark."""
        result = outcome.result
        self._more = outcome.full
        if result is None:
            self.stats.empty_peeks += 1
            self._low_water = _LowWater()
            return outcome
        self._record(outcome)
        if result.max_claim is not None and self._held_seen is not None:
            self._held = max(self._held or 0, result.max_claim)
        if outcome.prepared is not None:
            self.ledger.claimed_prepared(outcome.prepared)
        elif result.max_claim is not None and result.min_claim is not None:
            self.ledger.claimed_in_table(result.min_claim, result.max_claim)
        if result.max_source is not None and (self._taken.seq is None or result.max_source > self._taken.seq):
            fresh = self._taken.seq is not None and outcome.request.planned_at - self._taken.since <= LOW_WATER_TTL
            self._taken = _LowWater(result.max_source, self._taken.since if fresh else outcome.request.planned_at)
        if outcome.full and result.max_source is not None:
            since = self._low_water.since if outcome.scanned_from else outcome.request.planned_at
            self._low_water = _LowWater(result.max_source, since)
        else:
            self._low_water = _LowWater()
        return outcome

    def estimate_floor(self) -> int:
        """The queue sequence a backlog estimate looks above: the highest row this consumer's
        prepared claims hold, or that a claim of this run took less than `LOW_WATER_TTL` seconds
        ago. Below it stand rows our claims deleted, held or committed; while a prepared claim holds
        the server's xmin horizon back, the committed ones stay in the index and an estimate from
        the head steps over each (0.45 µs a row: 100,000 after a drain's last batch)."""
        taken = self._taken
        tops = [c.high for c in self.ledger.prepared()]
        tops.append(taken.seq if taken.seq is not None and self._clock() - taken.since <= LOW_WATER_TTL else 0)
        ahead = self._ahead  # made, not applied yet: the background thread estimates right after it
        if ahead is not None and ahead.done() and ahead.exception() is None:
            made = ahead.result().result
            tops.append(made.max_source or 0 if made is not None else 0)
        return max(tops)

    def _record(self, outcome: ClaimOutcome) -> None:
        assert outcome.result is not None
        r, f, s, d = outcome.result, outcome.forwarded, self.stats, self.endpoint.dialect
        s.claims += 1
        s.claimed += r.claimed - f.forwarded - f.failed
        s.expired += r.expired
        s.poison += r.poison
        s.forwarded += f.forwarded
        s.forward_failed += f.failed
        queue = self.endpoint.queue_text
        if r.expired or r.poison:
            log.warning("queue %s: claimed %d, %s", queue, r.claimed,
                        dropped_note(s, expired=r.expired, poison=r.poison,
                                     error_queue=d.format_address(self.endpoint.options.error_queue)))
        else:
            log.info("queue %s: claimed %d", queue, r.claimed)
        if r.dead_lettered:
            s.dead_lettered += sum(r.dead_lettered.values())
            log.warning(
                "queue %s: moved %d message(s) to %s with failure headers, a value no reader could take: %s",
                queue, sum(r.dead_lettered.values()), d.format_address(self.endpoint.options.error_queue),
                ", ".join(f"{n} {DEAD_REASONS[column]}" for column, n in r.dead_lettered.items()),
            )

    def table_id(self) -> str:
        return self._table()

    def _foreground_size(self, limit: int) -> int:
        """How much to claim while Spark waits. With claim-ahead, a large batch starts with a
        smaller claim, so the first rows flow sooner; full batches follow, claimed in the
        background while Spark works."""
        if not self.endpoint.options.claim_ahead:
            return limit
        return min(limit, max(STARTER_CLAIM, limit // 10))

    def _cap_held(self, after: int | None, held_max: int, limit: int | None) -> int:
        """Held claims beyond `after` form the batch, but no more than `limit` of them (a deleted
        checkpoint can find more: the last batch's and the one claimed ahead)."""
        if after is None or limit is None or held_max - after <= limit or self.ledger.prepared_within(after, held_max):
            return held_max  # claims held by prepared transactions are whole batches: not cut
        stmt = self.endpoint.dialect.nth_claim(self.endpoint.claims, self.endpoint.options.consumer, after=after, n=limit)
        (nth,) = self._main.run(lambda c: db.one(c.cursor(), stmt), self.endpoint.what("peek claims"))
        if nth is not None and int(nth) < held_max:
            self._more = True  # the rest of the held claims make the next batch
            return int(nth)
        return held_max

    def slices(self, start: ClaimOffset, end: ClaimOffset) -> list[ClaimSlice]:
        """The batch (start, end] cut into the slices Spark tasks read."""
        after = self._above_floor(start) if start.table == end.table else 0
        if end.claim <= after:
            return []
        if self.may_hold_prepared(end.claim):
            self.held_max()  # the prepared claims as the server has them, after any lost connection
        # the claims of the batch's claim table (a batch planned over a claim table made again
        # reads from its start, and the claims made since are of the new one), piece by piece
        o = self.endpoint.options
        parts = [part for piece in self.ledger.pieces(end.table, after, end.claim)
                 for part in self._cut(end.table, piece.after, piece.upto, None if piece.claim is None else PreparedRead(
                     o.queue, piece.claim.xid, piece.claim.shift, piece.claim.claimed_at))]
        if self.endpoint.settling:
            parts = [replace(p, batch=(after, end.claim)) for p in parts]
        return parts

    def _cut(self, table: str, after: int, upto: int, prepared: PreparedRead | None = None) -> list[ClaimSlice]:
        """(after, upto] cut into the slices Spark tasks read."""
        if upto <= after:
            return []
        o = self.endpoint.options
        span = upto - after
        n = min(o.partitions_for(span), span)
        bounds = [after + (span * i) // n for i in range(n + 1)]
        return [
            ClaimSlice(o.url, self.endpoint.dialect.name, self.endpoint.queue_text, self.endpoint.claims,
                       o.consumer, table, lo, hi, prepared)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
            if hi > lo
        ]
