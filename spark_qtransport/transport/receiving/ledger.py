"""The ledger of one consumer's claims, as this run knows them: the claim table's span (the
lowest and highest number of the consumer's claims there) and the prepared claims (`prepared.py`),
each a whole batch numbered apart. One run can hold both: a ForwardDestination's or a retry
acknowledgement's claims, a parked claim, a run after a fallback from prepared claims.

Read from the server at the start and after any connection was lost (`replace_table`,
`replace_prepared`), then kept as claims are made (`claimed_in_table`, `claimed_prepared`),
acknowledged (`acknowledged_table`, `committed`) and parked (`parking`, `parked`: a prepared claim's
messages move into the claim table with their numbers). It cuts a batch into the pieces it is read
by (`pieces`) and says what an acknowledgement settles (`settled_by`). The planner (driver thread), the claimer
and the acknowledgements (background thread) share it; what it holds is changed under its lock."""

from __future__ import annotations

import threading
from typing import NamedTuple

from .prepared import PreparedClaim

__all__ = ["Ledger", "Piece"]


class Piece(NamedTuple):
    """Claims numbered in (after, upto]: a prepared claim's (`claim`), or the claim table's (None)."""

    after: int
    upto: int
    claim: PreparedClaim | None


class Ledger:
    """One consumer's claims (see the module's text)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: tuple[int, int] | None = None
        self._prepared: dict[str, PreparedClaim] = {}

    # -- what the server says ---------------------------------------------------------------------

    def replace_table(self, span: tuple[int, int] | None) -> None:
        """The claim table's span as the server has it (None: no claim there)."""
        with self._lock:
            self._table = span

    def replace_prepared(self, claims: list[PreparedClaim]) -> None:
        """The prepared claims as the server lists them."""
        with self._lock:
            self._prepared = {c.gid: c for c in claims}

    # -- what this run does -----------------------------------------------------------------------

    def claimed_in_table(self, low: int, high: int) -> None:
        """The claim table now holds claims of this consumer numbered within [low, high]."""
        with self._lock:
            span = self._table
            self._table = (low, high) if span is None else (min(span[0], low), max(span[1], high))

    def claimed_prepared(self, claim: PreparedClaim) -> None:
        with self._lock:
            self._prepared[claim.gid] = claim

    def acknowledged_table(self, end: int) -> None:
        """The claim table's claims up to `end` are acknowledged."""
        with self._lock:
            span = self._table
            if span is not None:
                self._table = None if span[1] <= end else (max(span[0], end + 1), span[1])

    def committed(self, claim: PreparedClaim) -> None:
        """A prepared claim was committed (acknowledged)."""
        with self._lock:
            self._prepared.pop(claim.gid, None)

    def parking(self, claim: PreparedClaim) -> None:
        """A prepared claim's messages are being moved into the claim table, with their numbers:
        from now on the table may hold them (the move may commit though its answer is lost)."""
        self.claimed_in_table(claim.first, claim.last)

    def parked(self, claim: PreparedClaim) -> None:
        """The move committed: the prepared claim is gone."""
        with self._lock:
            self._prepared.pop(claim.gid, None)

    # -- questions --------------------------------------------------------------------------------

    def prepared(self) -> list[PreparedClaim]:
        """The prepared claims, lowest numbers first."""
        with self._lock:
            return sorted(self._prepared.values(), key=lambda c: c.first)

    def prepared_upto(self, end: int) -> list[PreparedClaim]:
        return [c for c in self.prepared() if c.last <= end]

    def prepared_within(self, after: int, end: int) -> list[PreparedClaim]:
        return [c for c in self.prepared() if c.last > after and c.first <= end]

    def pieces(self, table: str, after: int, end: int) -> list[Piece]:
        """The claims numbered in (after, end] of claim table `table`, in number order: each
        prepared claim's part (`Piece.claim` it) and, between them, the claim table's parts where
        its span may hold claims (`Piece.claim` None). A batch is read piece by piece."""
        held = [c for c in self.prepared_within(after, end) if c.table == table]
        out: list[Piece] = []
        lo = after
        for claim in held:
            out += self._table_part(lo, min(claim.first - 1, end))
            out.append(Piece(max(lo, claim.first - 1), min(claim.last, end), claim))
            lo = max(lo, claim.last)
        if not held:
            return [Piece(after, end, None)] if end > after else []
        return [p for p in out + self._table_part(lo, end) if p.upto > p.after]

    def _table_part(self, after: int, end: int) -> list[Piece]:
        """The claim table's part of (after, end] between prepared claims: only where it may hold some."""
        span = self._table
        if span is None or end <= after or span[1] <= after or span[0] > end:
            return []
        return [Piece(max(after, span[0] - 1), min(end, span[1]), None)]

    def settled_by(self, end: int, *, whole_table: bool) -> list[Piece]:
        """What an acknowledgement up to `end` settles, in the order it settles it: the claim
        table's part, where its span may hold claims up to `end`, then each prepared claim up to
        `end`. With `whole_table` (a run that holds no prepared claim) the claim table's part is
        there whatever the span says: its acknowledgement deletes the consumer's claims up to `end`,
        known or not (a piece of no width where the ledger knows none)."""
        table = self._table_part(0, end) or ([Piece(end, end, None)] if whole_table else [])
        return table + [Piece(c.first - 1, c.last, c) for c in self.prepared_upto(end)]

    def highest(self) -> int | None:
        """The highest claim number held, in either form (None: nothing held)."""
        tops = [c.last for c in self.prepared()]
        span = self._table
        if span is not None:
            tops.append(span[1])
        return max(tops) if tops else None
