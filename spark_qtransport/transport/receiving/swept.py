"""Where this run's claims took every row: ranges of queue sequences a scan from the queue head
steps over.

A claim usually scans from the low-water mark (`planner._LowWater`), above the rows the last one
took. Every `LOW_WATER_TTL` seconds, and whenever a claim was not full, it scans from the queue head
instead, for rows that appeared below the mark: a sender's row that committed after a later one
(its number was taken first), a row a competing consumer released by rolling back. Below the mark
lie the rows our claims deleted. PostgreSQL keeps their index entries until vacuum, and while a
prepared claim holds the server's xmin horizon the newest of them cannot even be marked dead, so a
scan from the head walked over every one of them again: at 16,000 messages a second that was
hundreds of milliseconds a scan, and the pages' hint bits (checksums on) wrote WAL as much as a
quarter of the messages' own.

Such a row can only appear where our claims left a gap. A claim that took every sequence number of
its range, (after, highest], left none: the column is unique, so no other row has those numbers,
and a row that shows up later was numbered elsewhere. `Swept` keeps those ranges for `SWEPT_TTL`
seconds, and the scan from the head looks only between them (`Claimer._head`), as it already looked
only between the rows our prepared claims hold. What could still appear inside one is a row inserted
with a number of its own choosing (no NServiceBus sender does that) or the rows of a prepared claim
someone rolled back by hand: each range is forgotten after `SWEPT_TTL` seconds, so they are claimed
within that time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

__all__ = ["SWEPT_TTL", "Swept"]

#: how long a range our claims took whole is stepped over by scans from the queue head (seconds)
SWEPT_TTL = 30.0
#: the ranges kept at most (the lowest go first, mostly the oldest): a claim a trigger for the whole TTL
MAX_RANGES = 1000


class Swept:
    """Ranges (after, upto] of queue sequences one claim of this run took whole, each kept for
    `SWEPT_TTL` seconds. Written by the planner (driver thread), read by claims on either thread:
    the ranges are replaced, never changed in place."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, ttl: float = SWEPT_TTL) -> None:
        self._clock, self._ttl = clock, ttl
        self._ranges: tuple[tuple[int, int, float], ...] = ()  # (after, upto, when), by `after`

    def took(self, after: int, upto: int) -> None:
        """A claim took every row numbered in (after, upto]."""
        if upto <= after:
            return
        now = self._clock()
        kept = [r for r in self._ranges if now - r[2] < self._ttl][-(MAX_RANGES - 1):]
        self._ranges = tuple(sorted([*kept, (after, upto, now)]))

    def covered(self, also: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int]]:
        """The ranges (after, upto] still kept, and `also`'s (the rows our prepared claims hold),
        merged where they meet or overlap, in order."""
        now = self._clock()
        spans = sorted([*((a, u) for a, u, when in self._ranges if now - when < self._ttl), *also])
        merged: list[tuple[int, int]] = []
        for a, u in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], u))
            else:
                merged.append((a, u))
        return merged
