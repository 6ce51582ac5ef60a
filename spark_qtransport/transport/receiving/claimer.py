"""Claim: one short READ COMMITTED transaction moves the oldest unlocked, unexpired queue rows into
the claim table, tagged with this consumer, server-side (bodies never pass through the driver).
Expired rows are deleted and counted; poison rows go raw to the error queue in the same
transaction (where the dialect judges headers at claim time: `ReceiveSql.poison_at_claim`;
otherwise poison is judged by the read and the acknowledgement), rows with a value no reader could take (no id, an Expires beyond year 9999) with
failure headers naming it; rows carrying a ForwardDestination are forwarded before it commits."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ...dialects import ClaimFailures, ClaimResult
from .. import session as db
from ..routing import Router
from ..session import Session
from .background import Background
from .forward import ForwardResult, forward_claimed
from .setup import Endpoint

__all__ = ["ClaimOutcome", "ClaimRequest", "Claimer"]


@dataclass(frozen=True)
class ClaimRequest:
    """One claim as planned: at most `limit` rows with a queue sequence above `after` (the
    low-water mark, 0 for the queue head) and at most `upto` (Trigger.AvailableNow's target)."""

    limit: int
    after: int
    upto: int | None
    planned_at: float  # the clock when planned: when a new low-water mark was set


@dataclass(frozen=True)
class ClaimOutcome:
    """What one claim did. `result` is None when the peek found nothing to claim."""

    request: ClaimRequest
    result: ClaimResult | None = None
    forwarded: ForwardResult = field(default_factory=ForwardResult)
    scanned_from: int = 0  # the queue sequence the claim scanned from (0: the head)

    @property
    def full(self) -> bool:
        """The claim took all it could: more is probably waiting."""
        return self.result is not None and self.result.deleted >= self.request.limit


class Claimer:
    """Runs claims, on the main session or, ahead of Spark, on the background one. Changes no
    state of its own: each claim returns a `ClaimOutcome` for the planner to apply."""

    def __init__(self, endpoint: Endpoint, main: Session, ahead: Session, background: Background) -> None:
        self.endpoint = endpoint
        self._main, self._ahead, self._background = main, ahead, background

    def generations(self) -> tuple[int, int]:
        """Connections opened and dropped so far by both sessions: a claim whose commit went
        unanswered dropped its connection (`Session.generation`)."""
        return self._main.generation, self._ahead.generation

    def claim(self, request: ClaimRequest) -> ClaimOutcome:
        """Claim now, on the main session."""
        return self._claim(self._main, request)

    def claim_ahead(self, request: ClaimRequest) -> Future[ClaimOutcome]:
        """Claim on the background thread (after any acknowledgement in flight)."""
        return self._background.submit(self._claim, self._ahead, request)

    def _claim(self, session: Session, request: ClaimRequest) -> ClaimOutcome:
        return session.run(lambda conn: self._transaction(conn, request), self.endpoint.what("claim"))

    def _transaction(self, conn: Any, request: ClaimRequest) -> ClaimOutcome:
        """One peek-then-claim transaction."""
        d, o = self.endpoint.dialect, self.endpoint.options
        cur = conn.cursor()
        after = request.after
        if db.first(cur, d.peek(o.queue, after=after, upto=request.upto)) is None:
            if after == 0:
                return ClaimOutcome(request)
            # nothing above the low-water mark: look once more from the queue head
            after = 0
            if db.first(cur, d.peek(o.queue, after=0, upto=request.upto)) is None:
                return ClaimOutcome(request)
        claims = self.endpoint.claims
        failures = ClaimFailures.build(failed_q=d.format_address(o.queue), endpoint=o.consumer)
        for stmt in d.claim(o.queue, claims, o.error_queue, consumer=o.consumer,
                            limit=request.limit, after=after, upto=request.upto, failures=failures):
            db.execute(cur, stmt)
        row = db.results(cur).fetchone()
        names = [str(column[0]).lower() for column in cur.description]
        values: dict[str, Any] = {name: None if v is None else int(v) for name, v in zip(names, row, strict=True)}
        claim = ClaimResult(**values)
        forwarded = ForwardResult()
        if claim.forward and claim.min_claim is not None and claim.max_claim is not None:
            forwarded = forward_claimed(
                d, cur, router=Router(d, o.routing), queue=o.queue, claims=claims, consumer=o.consumer,
                error_queue=o.error_queue, lo=claim.min_claim, hi=claim.max_claim)
        return ClaimOutcome(request, claim, forwarded, after)
