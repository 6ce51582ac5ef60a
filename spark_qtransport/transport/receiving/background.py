"""The receiver's one background thread, opened when first needed."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["Background"]

T = TypeVar("T")


class Background:
    """One thread: claims ahead, acknowledgements and backlog estimates run one at a time, in the
    order submitted, on the stream's second connection (`StreamSessions.ahead`). Work on it returns its result through
    its Future; it never writes the receiver's state."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    @property
    def started(self) -> bool:
        return self._pool is not None

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlqueue-background")
        return self._pool.submit(fn, *args)

    def drain(self) -> None:
        """Wait for what was submitted so far; the thread stays."""
        if self._pool is not None:
            self._pool.submit(lambda: None).result()

    def shutdown(self) -> None:
        """Wait for what was submitted, then end the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
