"""What a server must offer beyond the tables: the one check every entry point runs (a receiver
starting, a sender starting, ``sqlqueue doctor``) before it relies on the dialect's SQL."""

from __future__ import annotations

from collections.abc import Iterable

from ..dialects import Cursor, Dialect, QueueAddress
from ..errors import SchemaError, field_error
from . import session as db

__all__ = ["database_problems", "require_databases"]


def database_problems(cur: Cursor, d: Dialect, tables: Iterable[QueueAddress]) -> list[str]:
    """Why the databases of `tables` (and the connection's own, where every batch runs) cannot run
    the dialect's SQL, one line each with the fix: SQL Server databases below compatibility level
    130 have no OPENJSON, which the claim, the dispatch and the mover use. Empty when they can."""
    stmt = d.database_levels(sorted({t.catalog for t in tables if t.catalog}))
    if stmt is None:
        return []
    found = (d.level_problem(str(name), int(level)) for name, level in db.rows(cur, stmt))
    return [p for p in found if p]


def require_databases(cur: Cursor, d: Dialect, tables: Iterable[QueueAddress], *, queue: str | None = None) -> None:
    """`database_problems`, refused at start: a `SchemaError` naming the `url` and the first
    problem (a receiver names its queue)."""
    for problem in database_problems(cur, d, tables):
        raise field_error("url", problem, kind=SchemaError, **({} if queue is None else {"queue": queue}))
