"""Where one queue's claims are held (`claimMode`): in the claim table, or by prepared
transactions. Decided once, when the set-up first connects (`EndpointSetUp`), and changed at most
once more, when the server runs out of prepared transactions (`Claimer`: the claim table from then
on). The one place that says what the mode means for a claim, an acknowledgement or a read: the
rest of the receive side asks it and tests no flag of its own.

A claim numbered by us (`NUMBER_BASE` and above, `ClaimNumbering`) may be held by a prepared
transaction of this run or of an earlier one, whatever this run's mode: a stream in claim-table mode
may follow one that prepared."""

from __future__ import annotations

from ...dialects import NUMBER_BASE

__all__ = ["ClaimMode"]


class ClaimMode:
    """One queue's claim mode (see the module's text)."""

    def __init__(self, possible: bool) -> None:
        #: the dialect can hold claims by prepared transactions (PostgreSQL)
        self.possible = possible
        #: this run's new claims are prepared
        self.prepares = False

    def start_preparing(self) -> None:
        """The set-up took the server's prepared transactions for this queue."""
        self.prepares = self.possible

    def fall_back(self) -> None:
        """The server had no prepared transaction left: new claims go to the claim table."""
        self.prepares = False

    def ours(self, number: int | None) -> bool:
        """Whether a claim number is one of ours, so may be (or have been) held by a prepared
        transaction."""
        return self.possible and number is not None and number >= NUMBER_BASE

    def may_hold(self, number: int | None) -> bool:
        """Whether claims up to `number` may be held by prepared transactions: this run prepares
        its claims, or the number is ours."""
        return self.possible and (self.prepares or self.ours(number))

    def holds(self, listed: bool) -> bool:
        """Whether this run holds (or may hold) prepared claims: it prepares them, or the server
        listed some of this consumer's (`listed`)."""
        return self.possible and (self.prepares or listed)

    def first_number(self, known: tuple[int | None, ...]) -> int | None:
        """Where the next claim's numbers begin, given the numbers this run knows (its checkpoint,
        its claims): after the highest when this run prepares or any of them is ours (a table claim
        numbered by the claim table's identity would fall below them); None: the claim table's
        identity numbers it."""
        if not (self.prepares or any(v is not None and v >= NUMBER_BASE for v in known)):
            return None
        return max(v for v in (NUMBER_BASE, *known) if v is not None) + 1
