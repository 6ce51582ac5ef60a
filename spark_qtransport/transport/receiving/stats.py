"""One stream's running totals for one queue: what its claims took, dropped and moved, what its
acknowledgements deleted, and what they copied and sent for the Particular platform (counted when
each chunk's transaction commits: `AfterProcessing.committed`). Logs and progress reports read
them."""

from __future__ import annotations

from dataclasses import dataclass

from ..platform.after import Copies

__all__ = ["ReceiveStats", "dropped_note"]


@dataclass
class ReceiveStats:
    """Running totals of this query's driver, for logs and the reported latest offset."""

    claims: int = 0
    claimed: int = 0
    expired: int = 0
    poison: int = 0
    dead_lettered: int = 0  # moved to the error queue with failure headers for a value (no id, Expires)
    forwarded: int = 0  # to the queue their ForwardDestination header names
    forward_failed: int = 0  # that destination missing: to the error queue
    empty_peeks: int = 0
    acked: int = 0
    taken_over: int = 0  # claims another query of this endpoint left, found by a new checkpoint
    # the platform's copies and acknowledgements (`platform.after`), of chunks committed
    audited: int = 0
    forwarded_to: int = 0  # forwardTo copies
    retry_acks: int = 0
    retry_acks_refused: int = 0

    def copied(self, made: Copies) -> None:
        """Add what one committed chunk copied and sent for the platform."""
        self.audited += made.audited
        self.forwarded_to += made.forwarded_to
        self.retry_acks += made.retry_acks
        self.retry_acks_refused += made.retry_acks_refused


def dropped_note(s: ReceiveStats, *, expired: int, poison: int, error_queue: str) -> str:
    """What a claim or an acknowledgement dropped or moved, and this run's totals: one log line's end."""
    done = ([f"dropped {expired} expired"] if expired else []) + ([f"moved {poison} poison to {error_queue}"] if poison else [])
    return f"{', '.join(done)} (totals: {s.expired} expired, {s.poison} poison)"
