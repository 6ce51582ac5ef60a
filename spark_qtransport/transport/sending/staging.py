"""Staging's moving parts on executors: the task's rows kept for a retry and bulk-write chunks,
and the small task's rows handed whole to the driver. `dispatch.stage_partition` puts them
together with the worker's cached connection (`transport.executor`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from .messages import StagedRow

__all__ = ["STAGE_CHUNK", "STAGE_BYTES", "STAGE_RETRY_BYTES", "InputFailed", "TaskRows"]

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
    """A task's staged rows, read once from `source`. Those read so far are kept while they fit
    in `STAGE_RETRY_BYTES`, so that an attempt after a transient fault can write them again."""

    def __init__(self, source: Iterator[StagedRow]) -> None:
        self._source = source
        self._kept: list[StagedRow] | None = []
        self._kept_bytes = 0
        self._head: list[StagedRow] = []  # read by `within` but not kept: written first

    def within(self, limit: int) -> list[StagedRow] | None:
        """Every row of the task if they total at most `limit` bytes; else None, and the rows read
        so far are written first by `chunks`."""
        taken: list[StagedRow] = []
        size = 0
        for row in self._fresh():
            taken.append(row)
            size += row.size
            if size > limit:
                if self._kept is None:  # outgrew the retry budget too
                    self._head = taken
                return None
        return taken

    @property
    def replayable(self) -> bool:
        """Whether every row read so far is kept (false once they outgrew the budget)."""
        return self._kept is not None

    def chunks(self, attempt: str) -> Iterator[list[StagedRow]]:
        """The rows read so far, retagged with `attempt`, then the rest of the input, in bulk
        writes of at most `STAGE_CHUNK` rows and about `STAGE_BYTES` bytes."""
        chunk: list[StagedRow] = []
        size = 0
        read, self._head = self._head or [row._replace(attempt=attempt) for row in self._kept or ()], []
        for row in itertools.chain(read, self._fresh()):
            chunk.append(row)
            size += row.size
            if len(chunk) >= STAGE_CHUNK or size >= STAGE_BYTES:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk

    def _fresh(self) -> Iterator[StagedRow]:
        source = self._source
        while True:
            try:
                row = next(source)
            except StopIteration:
                return
            except Exception as exc:
                raise InputFailed from exc
            if self._kept is not None:
                self._kept.append(row)
                self._kept_bytes += row.size
                if self._kept_bytes > STAGE_RETRY_BYTES:
                    self._kept = None
            yield row
