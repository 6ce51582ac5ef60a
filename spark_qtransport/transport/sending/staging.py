"""A Spark task's part of sending (executors): its rows built into messages, then handed whole to
the driver when small (`StageReport.inline`) or staged in ``<endpoint>.Staging`` in one
transaction, tagged with the sink, the batch id and a random attempt id. The task reports its
attempt id and per-route counts; the driver dispatches (`dispatch.Dispatcher`)."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NamedTuple

from ...dialects import Connection
from ...wire import format_time
from .. import session as db
from ..executor import EXECUTOR_CONNECTIONS, cached_connection
from ..settings import SendSettings
from ..watchdog import WATCHDOG
from .builder import MessageBuilder
from .inline import hand_over
from .messages import InputColumns, RowGroup, SendPlan, StagedRow

__all__ = ["STAGE_CHUNK", "STAGE_BYTES", "STAGE_RETRY_BYTES", "InputFailed", "TaskRows", "RouteCount", "StageReport",
           "stage_partition"]

log = logging.getLogger("spark_qtransport.send")

#: rows per bulk write on executors
STAGE_CHUNK = 5000
#: headers and body bytes per bulk write: a chunk is written once it holds this many
STAGE_BYTES = 16 * 2**20
#: rows of one task kept in memory to stage again after a transient fault (headers + bodies)
STAGE_RETRY_BYTES = 64 * 2**20


class InputFailed(Exception):
    """Raised from the task's input rows (the upstream plan, a bad row); the original error is the
    cause. Not a database fault: never retried."""


class TaskRows:
    """A task's messages, read once from `source`: staged rows, and groups of them (`RowGroup`:
    the builder's column-wise path; their rows are made when written, tagged with `sink`,
    `batch_id` and the attempt). Those read so far are kept while they fit in
    `STAGE_RETRY_BYTES`, so that an attempt after a transient fault can write them again."""

    def __init__(self, source: Iterator[StagedRow | RowGroup], *, sink: str = "", batch_id: int = 0) -> None:
        self._source = source
        self._sink, self._batch_id = sink, batch_id
        self._kept: list[StagedRow | RowGroup] | None = []
        self._kept_bytes = 0
        self._head: list[StagedRow | RowGroup] = []  # read by `within` but not kept: written first

    def within(self, limit: int) -> list[StagedRow | RowGroup] | None:
        """Every message of the task if they total at most `limit` bytes; else None, and the
        messages read so far are written first by `chunks`."""
        taken: list[StagedRow | RowGroup] = []
        size = 0
        for item, item_size in self._fresh():
            taken.append(item)
            size += item_size
            if size > limit:
                if self._kept is None:  # outgrew the retry budget too
                    self._head = taken
                return None
        return taken

    @property
    def replayable(self) -> bool:
        """Whether every message read so far is kept (false once they outgrew the budget)."""
        return self._kept is not None

    def chunks(self, attempt: str) -> Iterator[list[StagedRow]]:
        """The rows read so far, retagged with `attempt`, then the rest of the input, in bulk
        writes of at most `STAGE_CHUNK` rows and about `STAGE_BYTES` bytes."""
        chunk: list[StagedRow] = []
        size = 0
        if self._head:
            read, self._head = self._rows(self._head, attempt), []
        else:
            read = self._rows(list(self._kept or ()), attempt, retag=True)
        for row in itertools.chain(read, self._rows((item for item, _ in self._fresh()), attempt)):
            chunk.append(row)
            size += row.size
            if len(chunk) >= STAGE_CHUNK or size >= STAGE_BYTES:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk

    def _rows(self, items: Iterable[StagedRow | RowGroup], attempt: str, *, retag: bool = False) -> Iterator[StagedRow]:
        """The staged rows of `items`: a group's tagged with `attempt`, a row as it is (`retag`:
        tagged with `attempt` too; a fresh row has the builder's attempt already)."""
        for item in items:
            if isinstance(item, RowGroup):
                yield from item.rows(self._sink, self._batch_id, attempt)
            else:
                yield item._replace(attempt=attempt) if retag else item

    def _fresh(self) -> Iterator[tuple[StagedRow | RowGroup, int]]:
        """The messages not read yet, each with its size."""
        source = self._source
        while True:
            try:
                item = next(source)
            except StopIteration:
                return
            except Exception as exc:
                raise InputFailed from exc
            size = item.size
            if self._kept is not None:
                self._kept.append(item)
                self._kept_bytes += size
                if self._kept_bytes > STAGE_RETRY_BYTES:
                    self._kept = None
            yield item, size


class RouteCount(NamedTuple):
    """How many messages of one kind a task staged (or handed over) for one route."""

    kind: str  # SEND, PUBLISH or DELAYED
    route: str
    messages: int


@dataclass(frozen=True)
class StageReport:
    """What one successful task attempt staged, or the messages themselves when it handed them
    over (`inline`); travels back to the driver in the task's commit message."""

    attempt: str
    rows: int
    routes: tuple[RouteCount, ...]
    batch_id: int
    query_id: str | None
    inline: list[RowGroup] | None = None  # a small task's rows, handed to the driver (nothing staged)
    invalid: int = 0  # rows the builder refused, staged as error copies for the error queue (in `rows`)
    invalid_reason: str | None = None  # the first one's error
    #: the claims its fail and retry rows came from, (queue as the rows name it, claim sequences)
    failed_claims: tuple[tuple[str, tuple[int, ...]], ...] = ()


# -- the task ---------------------------------------------------------------------------


def _check(conn: Connection) -> None:
    """A trivial statement: a connection the server dropped since the last task fails here."""
    conn.cursor().execute("SELECT 1").fetchall()
    conn.rollback()


def stage_partition(
    options: SendSettings,
    plan: SendPlan,
    batches: Iterable[Iterable[Mapping[str, Any]] | InputColumns],
    *,
    batch_id: int,
    query_id: str | None,
    partition: int = 0,
) -> StageReport:
    """One task's part of sending; returns what the driver needs to dispatch. `batches`: the
    task's input, each an iterable of row dicts or, column by column, `InputColumns` (built
    column-wise: `MessageBuilder.build_all`). Rows totalling at
    most the task's share of `SendSettings.inline_bytes` (`inline_limit`, by its `partition`)
    travel in the report itself and nothing is written; otherwise every row is staged in one
    transaction (`_stage`)."""
    builder = MessageBuilder(plan, batch_id=batch_id, attempt=uuid.uuid4().hex)
    now = format_time(datetime.now(timezone.utc))  # TimeSent: one value per task
    rows = TaskRows(builder.build_all(batches, now), sink=plan.sink, batch_id=batch_id)
    try:
        limit = options.inline_limit(partition)
        if limit:
            inline = rows.within(limit)
            if inline is not None:
                groups = hand_over(inline)
                return StageReport(builder.attempt, sum(len(g.columns[0]) for g in groups), _routes(builder), batch_id,
                                   query_id, groups, builder.invalid, builder.invalid_reason, _failed(builder))
        staged = _stage(options, plan, builder, rows, batch_id)
    except InputFailed as failed:  # our input failed: not ours to retry, and no database fault
        raise failed.__cause__ from None  # type: ignore[misc]
    return StageReport(builder.attempt, staged, _routes(builder), batch_id, query_id, None, builder.invalid,
                       builder.invalid_reason, _failed(builder))


def _stage(options: SendSettings, plan: SendPlan, builder: MessageBuilder, rows: TaskRows, batch_id: int) -> int:
    """Stage the task's rows in one transaction. A transient fault (the session terminated, the
    server restarting) stages again on a new connection under a new attempt id, from the rows
    kept so far (up to `STAGE_RETRY_BYTES`; a larger task fails, and Spark's task retry or the
    query's restart stages it again). If the failed attempt's commit landed after all, its rows
    are never sent: the driver dispatches only the attempts tasks report and deletes the rest of
    the batch's staged rows."""
    dialect = options.dialect
    what = f"staging batch {batch_id} of endpoint {plan.endpoint!r} into {dialect.qualified(options.staging)}"

    def attempt(_: int) -> int:
        conn = None
        try:
            conn, _checked = cached_connection(dialect, options.url, _check, what=what, log=log)
            staged = 0
            for chunk in rows.chunks(builder.attempt):
                with WATCHDOG.watching(dialect, options.url, conn, what):
                    dialect.stage_rows(conn, options.staging, chunk)
                staged += len(chunk)
            with WATCHDOG.watching(dialect, options.url, conn, what):
                conn.commit()
        except BaseException:
            if conn is not None:
                db.rollback(conn)
                db.close(conn)
            raise
        EXECUTOR_CONNECTIONS.put(options.url, conn)
        return staged

    def again(exc: BaseException) -> None:
        if not rows.replayable:  # too large to keep: Spark's task retry stages it again
            raise db.explain(dialect, what, exc) from exc  # type: ignore[arg-type]
        builder.attempt = uuid.uuid4().hex

    return db.with_retries(dialect, what, attempt, after_failure=again, backoff=db.Backoff.of(options.url))


def _routes(builder: MessageBuilder) -> tuple[RouteCount, ...]:
    return tuple(RouteCount(kind, route, n) for (kind, route), n in sorted(builder.counts.items()))


def _failed(builder: MessageBuilder) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((queue, tuple(sorted(seqs))) for queue, seqs in sorted(builder.failed_claims.items()))
