"""Claim: one short READ COMMITTED transaction moves the oldest unlocked, unexpired queue rows into
the claim table, tagged with this consumer, server-side (bodies never pass through the driver).
Expired rows are deleted and counted; poison rows go raw to the error queue in the same
transaction (where the dialect judges headers at claim time: `ReceiveSql.poison_at_claim`;
otherwise poison is judged by the read and the acknowledgement), rows with a value no reader could take (no id, an Expires beyond year 9999) with
failure headers naming it; rows carrying a ForwardDestination are forwarded before it commits.
A claim held by a prepared transaction (`claimMode`) deletes plain rows in one pass and reads their
headers as it does (`Claimer._take`): the headers come to the driver, never the bodies."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from ...dialects import (
    ClaimFailures,
    ClaimNumbering,
    ClaimResult,
    Connection,
    Cursor,
    Dialect,
    PickedRows,
    QueueAddress,
)
from ...wire import H
from .. import session as db
from ..routing import Router
from ..session import Session
from .background import Background
from .forward import ForwardResult, forward_claimed
from .judge import judged
from .ledger import Ledger
from .prepared import NUMBER_BASE, PreparedClaim, consumer_token
from .setup import Endpoint

__all__ = ["ClaimOutcome", "ClaimRequest", "Claimer", "pick"]

log = logging.getLogger("spark_qtransport.receive")

@dataclass(frozen=True)
class ClaimRequest:
    """One claim as planned: at most `limit` rows with a queue sequence above `after` (the
    low-water mark, 0 for the queue head) and at most `upto` (Trigger.AvailableNow's target)."""

    limit: int
    after: int
    upto: int | None
    planned_at: float  # the clock when planned: when a new low-water mark was set
    #: the claim numbers of ours begin here (`ClaimNumbering`); None: the claim table's identity
    first: int | None = None
    #: the run's first claim: its numbers begin above the server's clock too (`ClaimNumbering.clock_base`)
    clock_floor: bool = False


@dataclass(frozen=True)
class ClaimOutcome:
    """What one claim did. `result` is None when the peek found nothing to claim."""

    request: ClaimRequest
    result: ClaimResult | None = None
    forwarded: ForwardResult = field(default_factory=ForwardResult)
    scanned_from: int = 0  # the queue sequence the claim scanned from (0: the head)
    prepared: PreparedClaim | None = None  # the claim is held by this prepared transaction

    @property
    def full(self) -> bool:
        """The claim took all it could: more is probably waiting."""
        return self.result is not None and self.result.deleted >= self.request.limit


def pick(dialect: Dialect, cur: Cursor, queue: QueueAddress, *, after: int, upto: int | None, limit: int) -> PickedRows:
    """Lock at most `limit` of the oldest unlocked queue rows above `after` (`ReceiveSql.pick`) and
    judge their headers here (`judge.judged`): the claim's statement is then told which rows are
    poison instead of parsing every header itself."""
    seqs: list[int] = []
    poison: list[int] = []
    forward: list[int] = []
    special = odd = False
    for (seq, _, expired, unreadable), headers in judged(
            cur, lambda a, n: dialect.pick(queue, after=a, upto=upto, limit=n), after=after, limit=limit):
        seqs.append(int(seq))
        kind = _kind(headers, expired=expired, unreadable=unreadable)
        if kind == "poison":
            poison.append(int(seq))
        elif kind == "odd":
            odd = True
        elif kind == "forward":
            forward.append(int(seq))
            special = True
        elif kind == "retry":
            special = True
    return PickedRows(seqs, poison, forward, special, odd)


def _kind(headers: dict[str, str | None] | None, *, expired: bool, unreadable: bool) -> str:
    """What a claim does with a row it picked or took, by its judged headers (None: poison) and its
    small columns: "poison" (to the error queue raw; poison wins over expiry, as in NServiceBus),
    "expired" (dropped), "odd" (a value no reader could take: to the error queue with failure
    headers), "forward" (a ForwardDestination), "retry" (a ServiceControl retry acknowledgement) or
    "plain"."""
    if headers is None:
        return "poison"
    if expired:
        return "expired"
    if unreadable:
        return "odd"
    if H.FORWARD_DESTINATION in headers:
        return "forward"
    if H.RETRY_ACK_QUEUE in headers:
        return "retry"
    return "plain"


class Claimer:
    """Runs claims, on the main session or, ahead of Spark, on the background one. Changes no
    state of its own: each claim returns a `ClaimOutcome` for the planner to apply."""

    def __init__(self, endpoint: Endpoint, main: Session, ahead: Session, background: Background,
                 table: Callable[[], str], *, ledger: Ledger) -> None:
        self.endpoint = endpoint
        self._main, self._ahead, self._background = main, ahead, background
        self._table = table  # the claim table's id (a prepared claim's gid names it)
        self._ledger = ledger  # this consumer's claims: the planner's
        #: held by a claim on the main session and by a backlog estimate on the background thread
        #: (`Receiver._refresh_backlog`): the estimate locks the queue's first and last unlocked rows
        #: (`ReceiveSql.backlog`), and a claim beside it would skip the head row, out of FIFO order
        self.head = threading.Lock()

    def generations(self) -> tuple[int, int]:
        """Connections opened and dropped so far by both sessions: a claim whose commit went
        unanswered dropped its connection (`Session.generation`)."""
        return self._main.generation, self._ahead.generation

    def claim(self, request: ClaimRequest) -> ClaimOutcome:
        """Claim now, on the main session (after any backlog estimate in flight: `head`)."""
        with self.head:
            return self._claim(self._main, request)

    def claim_ahead(self, request: ClaimRequest) -> Future[ClaimOutcome]:
        """Claim on the background thread (after any acknowledgement in flight)."""
        return self._background.submit(self._claim, self._ahead, request)

    def claim_in(self, conn: Connection, request: ClaimRequest) -> ClaimOutcome:
        """Claim in the caller's transaction on `conn`, which it commits (`QueueSet`: one transaction
        for the claims of many queues). Not for a claim to be prepared: that ends its transaction."""
        assert not (self.endpoint.mode.prepares and request.first is not None)
        with self.head:
            return self._transaction(conn, request)

    def _claim(self, session: Session, request: ClaimRequest) -> ClaimOutcome:
        return session.run(lambda conn: self._transaction(conn, request), self.endpoint.what("claim"))

    def _transaction(self, conn: Connection, request: ClaimRequest, *, one_pass: bool = True) -> ClaimOutcome:
        """One peek-then-claim transaction. A prepared claim is taken in one pass (`_take`) unless
        `one_pass` is false or a row it took needs the claim's full statement: then it is rolled
        back and picked, then claimed."""
        d, o = self.endpoint.dialect, self.endpoint.options
        cur = conn.cursor()
        after = request.after
        if db.first(cur, d.peek(o.queue, after=after, upto=request.upto)) is None:
            # nothing above the low-water mark: look once more from the queue head
            head = self._head(cur, request.upto) if after != 0 else None
            if head is None:
                return ClaimOutcome(request)
            after = head
        claims = self.endpoint.claims
        failures = ClaimFailures.build(failed_q=d.format_address(o.queue), endpoint=o.consumer)
        prepared = self.endpoint.mode.prepares and request.first is not None
        numbering = None
        if prepared and one_pass:
            taken = self._take(conn, cur, request, after)
            if taken is not None:
                return taken
            db.rollback(conn)  # a poison, odd, forwarded or retry-acknowledging row: the full claim
            return self._transaction(conn, request, one_pass=False)
        if request.first is not None:
            picked = pick(d, cur, o.queue, after=after, upto=request.upto, limit=request.limit)
            if not picked.seqs:  # the peeked row is ours already: nothing else is left
                return ClaimOutcome(request)
            numbering = ClaimNumbering(request.first, prepared, picked, NUMBER_BASE if request.clock_floor else None)
        for stmt in d.claim(o.queue, claims, o.error_queue, consumer=o.consumer, limit=request.limit, after=after,
                            upto=request.upto, failures=failures, numbering=numbering):
            db.execute(cur, stmt)
        row = db.results(cur).fetchone()
        described = cur.description
        # the claim's LAST statement returns one row (`ReceiveSql.claim`): fetchone() raised otherwise
        assert row is not None and described is not None
        names = [str(column[0]).lower() for column in described]
        values: dict[str, Any] = dict(zip(names, row, strict=True))
        extra = {name: values.pop(name) for name in ("tabled", "low_source", "claimed_at", "xid") if name in values}
        claim = ClaimResult(**{name: None if v is None else int(v) for name, v in values.items()})  # type: ignore[arg-type]
        if numbering is not None and not claim.claimed:
            claim = replace(claim, max_claim=None, min_claim=None)  # nothing to deliver: committed now
        elif prepared and not extra["tabled"]:
            return self._hold(conn, cur, request, claim, after, low=int(extra["low_source"]),
                              clock=str(extra["claimed_at"]), xid=str(extra["xid"]),
                              clean=numbering is not None and not numbering.picked.poison)
        forwarded = ForwardResult()
        if claim.forward and claim.min_claim is not None and claim.max_claim is not None:
            forwarded = forward_claimed(
                d, cur, router=Router(d, o.routing), queue=o.queue, claims=claims, consumer=o.consumer,
                error_queue=o.error_queue, lo=claim.min_claim, hi=claim.max_claim)
        return ClaimOutcome(request, claim, forwarded, after)

    def _take(self, conn: Connection, cur: Cursor, request: ClaimRequest, after: int) -> ClaimOutcome | None:
        """A prepared claim in one pass over its rows: they are deleted as they are judged
        (`ReceiveSql.take`, a page at a time, `judge.judged`), numbered (`ReceiveSql.claim_numbers`),
        and the transaction prepared. What the pick-then-claim path does in two passes over the
        rows (one to lock and read their headers, one to delete them), for the common case: plain
        messages, expired ones among them. None, the transaction to be rolled back, when a row
        needs that path (poison goes to the error queue, an odd value is dead-lettered, a
        ForwardDestination or a retry acknowledgement needs the claim table)."""
        d, o = self.endpoint.dialect, self.endpoint.options
        assert request.first is not None
        seqs: list[int] = []
        expired = 0
        for (seq, _, is_expired, odd), headers in judged(
                cur, lambda a, n: d.take(o.queue, after=a, upto=request.upto, limit=n), after=after,
                limit=request.limit):
            kind = _kind(headers, expired=is_expired, unreadable=odd)
            if kind == "expired":
                expired += 1
            elif kind != "plain":
                return None
            seqs.append(int(seq))
        if not seqs:  # the peeked row is ours already: nothing else is left
            return ClaimOutcome(request)
        low, high = min(seqs), max(seqs)
        row = db.first(cur, d.claim_numbers(first=request.first,
                                            clock_base=NUMBER_BASE if request.clock_floor else None))
        assert row is not None  # one row, always
        first, clock, xid = int(row[0]), str(row[1]), str(row[2])
        claimed = len(seqs) - expired
        if not claimed:  # nothing to deliver: committed now
            return ClaimOutcome(request, ClaimResult(len(seqs), expired, 0, 0, None, high), scanned_from=after)
        result = ClaimResult(len(seqs), expired, 0, claimed, first + high - low, high, first)
        return self._hold(conn, cur, request, result, after, low=low, clock=clock, xid=xid, clean=True)

    def _hold(self, conn: Connection, cur: Cursor, request: ClaimRequest, claim: ClaimResult, after: int, *,
              low: int, clock: str, xid: str, clean: bool) -> ClaimOutcome:
        """End a numbered claim's transaction by preparing it (`PreparedClaim`: numbers
        [min_claim, max_claim], queue rows [low, max_source]); the server's slots taken, the claim
        is made again in the claim table (`_prepare` rolled it back)."""
        held = PreparedClaim(self._table(), int(claim.min_claim or 0), int(claim.max_claim or 0), low,
                             int(claim.max_source or 0), clock, consumer_token(self.endpoint.options.consumer), xid,
                             clean=clean)
        if not self._prepare(conn, cur, held):
            return self._transaction(conn, request)
        return ClaimOutcome(request, claim, ForwardResult(), after, held)

    def _head(self, cur: Cursor, upto: int | None) -> int | None:
        """Where a claim from the queue head begins (None: no row to claim): the first gap between
        the rows this consumer's prepared claims hold with an unlocked row in it. A peek steps over
        locked rows one by one, and ours stand at the head of the queue until committed: looking
        between them, not through them, spares the server a walk over two claims' rows."""
        d, o = self.endpoint.dialect, self.endpoint.options
        after = 0
        for claim in sorted(self._ledger.prepared(), key=lambda c: c.low):
            gap = d.peek(o.queue, after=after, upto=_lower(claim.low - 1, upto))
            if claim.low - 1 > after and db.first(cur, gap) is not None:
                return after
            after = max(after, claim.high)
        return after if db.first(cur, d.peek(o.queue, after=after, upto=upto)) is not None else None

    def _prepare(self, conn: Connection, cur: Cursor, claim: PreparedClaim) -> bool:
        """End the claim's transaction with PREPARE TRANSACTION (the session's commit is then a
        no-op). False when the server has no slot left (its `max_prepared_transactions` taken by
        other streams since the start): rolled back, and this run holds its claims in the claim
        table from now on, numbered as before."""
        d = self.endpoint.dialect
        try:
            db.execute(cur, d.prepare(claim.gid))
        except Exception as exc:
            if not d.is_out_of_prepared_slots(exc):
                raise
            db.rollback(conn)
            self.endpoint.mode.fall_back()
            log.warning("queue %s: the server has no prepared transaction left (max_prepared_transactions); this "
                        "stream holds its claims in the claim table from now on (%s)", self.endpoint.queue_text,
                        d.error_text(exc))
            return False
        return True


def _lower(a: int, b: int | None) -> int:
    return a if b is None else min(a, b)
