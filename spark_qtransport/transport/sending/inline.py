"""The rows small tasks hand the driver (`StageReport.inline`), sent in the dispatch transaction.

A task whose messages total at most ``SendSettings.inline_bytes`` writes nothing: its rows travel
to the driver in its commit message. In the batch's one dispatch transaction the driver then
writes the rows for a queue straight into it with the dialect's bulk path (COPY), so each body is
written once instead of three times (staging, then the queue, then deleted from staging). The
batch stays atomic and its outbox record is written in the same transaction, as for staged rows.

Everything else goes the staged way, staged by the driver in the same transaction under an
attempt id of its own: published events (fanned out by the dispatch statements), delayed
messages, rows for a destination the routing path refused (to the error queue, with failure
headers), for a queue other tasks of the batch staged rows for too (the dispatch statement
deduplicates message ids per queue across them), and for a table that refused the bulk write.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...dialects import Dialect, QueueAddress
from ..routing import Target, insert_guarded
from .fanout import Destination
from .messages import SEND, StagedRow

__all__ = ["InlineRows", "row_ids"]

#: the queue columns `Dialect.send_rows` writes
QUEUE_COLUMNS = frozenset({"id", "expires", "headers", "body"})


@dataclass
class InlineRows:
    """The inline rows of one batch, by (kind, route), and what became of them."""

    groups: dict[tuple[str, str], list[StagedRow]]
    attempt: str = field(default_factory=lambda: f"inline-{uuid.uuid4().hex}")
    #: destination (its key in the dispatch's destinations) -> (address text, messages written straight in)
    sent: dict[str, tuple[str, int]] = field(default_factory=dict)
    staged: int = 0

    @classmethod
    def of(cls, rows: list[list[StagedRow]]) -> InlineRows:
        groups: dict[tuple[str, str], list[StagedRow]] = {}
        for task in rows:
            for row in task:
                key = (row.kind, row.route)
                group = groups.get(key)
                if group is None:
                    group = groups[key] = []
                group.append(row)
        return cls(groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def send(self, conn: Any, d: Dialect, destinations: dict[str, Destination],
             staged_routes: set[tuple[str, str]]) -> None:
        """Write the rows of each queue only these rows go to straight into it (`sent`)."""
        cur = conn.cursor()
        for name, dest in destinations.items():
            key = (SEND, dest.route or "")
            to = dest.to
            if (not isinstance(to, Target) or dest.route is None or dest.publish_routes or key in staged_routes
                    or key not in self.groups or not QUEUE_COLUMNS <= set(to.columns)):
                continue
            rows = _first_per_message_id(self.groups[key])
            values = [(i, r.ttbr_ms, r.headers, r.body) for i, r in zip(row_ids(len(rows)), rows, strict=True)]
            n, problem = insert_guarded(cur, d, functools.partial(d.send_rows, conn, to.address, values))
            if problem is None:  # else staged below: the staged way routes it to the error queue
                del self.groups[key]
                self.sent[name] = (to.text, n)

    def stage_rest(self, conn: Any, d: Dialect, staging: QueueAddress) -> None:
        """Stage the rows `send` did not write, under `attempt` (`staged` counts them)."""
        for rows in self.groups.values():
            d.stage_rows(conn, staging, [r._replace(attempt=self.attempt) for r in rows])
            self.staged += len(rows)
        self.groups.clear()


def _first_per_message_id(rows: list[StagedRow]) -> list[StagedRow]:
    """One row per message id, the first (a queue gets a message id once per batch, as from the
    dispatch statement and NServiceBus's dispatcher)."""
    seen: dict[str, StagedRow] = {}
    for row in rows:
        seen.setdefault(row.message_id, row)
    return rows if len(seen) == len(rows) else list(seen.values())


def row_ids(n: int) -> Iterator[bytes]:
    """`n` random version-4 UUIDs as 16 bytes each, from one `os.urandom` read."""
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = bytes((b & 0x0F) | 0x40 for b in raw[6::16])
    raw[8::16] = bytes((b & 0x3F) | 0x80 for b in raw[8::16])
    return (bytes(raw[i:i + 16]) for i in range(0, 16 * n, 16))
