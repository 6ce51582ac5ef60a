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
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...dialects import Connection, Dialect, QueueAddress
from ...wire import uuid4s
from ..routing import Target, insert_guarded
from .fanout import Destination
from .messages import GROUPED_FROM, SEND, RowGroup, StagedRow

__all__ = ["RowGroup", "hand_over", "by_route", "InlineRows"]

#: the queue columns `Dialect.send_rows` writes
QUEUE_COLUMNS = frozenset({"id", "expires", "headers", "body"})
MESSAGE_ID, HEADERS, BODY, TTBR_MS = range(4)


def hand_over(items: list[StagedRow | RowGroup]) -> list[RowGroup]:
    """A task's messages as its commit message carries them: one group per (kind, route), its
    messages in the order they came (rows one by one, or groups the builder made column-wise)."""
    pieces: dict[tuple[str, str], list[list[StagedRow] | RowGroup]] = {}
    open_rows: dict[tuple[str, str], list[StagedRow]] = {}  # the rows after a key's last group
    for item in items:
        key = (item.kind, item.route)
        if type(item) is RowGroup:
            open_rows.pop(key, None)
            pieces.setdefault(key, []).append(item)
            continue
        rows = open_rows.get(key)
        if rows is None:
            rows = open_rows[key] = []
            pieces.setdefault(key, []).append(rows)
        rows.append(item)  # type: ignore[arg-type]
    return [RowGroup(kind, route, _columns(parts)) for (kind, route), parts in pieces.items()]


def _columns(parts: list[list[StagedRow] | RowGroup]) -> tuple[Any, ...]:
    """One key's messages column by column (`RowGroup.columns`)."""
    columns = [p.columns if isinstance(p, RowGroup) else tuple(zip(*p, strict=True))[GROUPED_FROM:] for p in parts]
    if len(columns) == 1:
        return columns[0]
    return tuple(list(itertools.chain.from_iterable(c[i] for c in columns)) for i in range(len(columns[0])))


def by_route(tasks: list[list[RowGroup]]) -> dict[tuple[str, str], list[RowGroup]]:
    """The groups the tasks of a batch handed over, by (kind, route), in task order."""
    groups: dict[tuple[str, str], list[RowGroup]] = {}
    for task in tasks:
        for group in task:
            groups.setdefault((group.kind, group.route), []).append(group)
    return groups


@dataclass
class InlineRows:
    """One dispatch transaction's handed-over rows, by (kind, route), and what became of them
    (a retried transaction starts again from a fresh one)."""

    groups: dict[tuple[str, str], list[RowGroup]]  # the tasks' groups, in task order
    attempt: str = field(default_factory=lambda: f"inline-{uuid.uuid4().hex}")
    #: destination (its key in the dispatch's destinations) -> (address text, messages written straight in)
    sent: dict[str, tuple[str, int]] = field(default_factory=dict)
    staged: int = 0

    def __bool__(self) -> bool:
        return bool(self.groups)

    def send(self, conn: Connection, d: Dialect, destinations: dict[str, Destination],
             staged_routes: set[tuple[str, str]]) -> None:
        """Write the rows of each queue only these rows go to straight into it (`sent`)."""
        cur = conn.cursor()
        for name, dest in destinations.items():
            key = (SEND, dest.route or "")
            to = dest.to
            if (not isinstance(to, Target) or dest.route is None or dest.publish_routes or key in staged_routes
                    or key not in self.groups or not QUEUE_COLUMNS <= set(to.columns)):
                continue
            ids, ttbr, headers, bodies = (_column(self.groups[key], c) for c in (MESSAGE_ID, TTBR_MS, HEADERS, BODY))
            values = list(zip(uuid4s(len(ids)), ttbr, headers, bodies, strict=True))
            first = _first_per_message_id(ids)
            if first is not None:
                values = [values[i] for i in first]
            n, problem = insert_guarded(cur, d, functools.partial(d.send_rows, conn, to.address, values))
            if problem is None:  # else staged below: the staged way routes it to the error queue
                del self.groups[key]
                self.sent[name] = (to.text, n)

    def stage_rest(self, conn: Connection, d: Dialect, staging: QueueAddress, *, sink: str, batch_id: int) -> None:
        """Stage the rows `send` did not write, under `attempt` (`staged` counts them)."""
        for groups in self.groups.values():
            for group in groups:
                rows = group.rows(sink, batch_id, self.attempt)
                d.stage_rows(conn, staging, rows)
                self.staged += len(rows)
        self.groups.clear()


def _column(groups: list[RowGroup], column: int) -> list[Any]:
    return list(itertools.chain.from_iterable(g.columns[column] for g in groups))


def _first_per_message_id(ids: list[str]) -> list[int] | None:
    """The positions of the first of each message id, None when every id is distinct (a queue
    gets a message id once per batch, as from the dispatch statement and NServiceBus's dispatcher)."""
    if len(set(ids)) == len(ids):
        return None
    seen: dict[str, int] = {}
    for i, message_id in enumerate(ids):
        seen.setdefault(message_id, i)
    return list(seen.values())
