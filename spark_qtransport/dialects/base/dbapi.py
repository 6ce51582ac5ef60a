"""The DB-API surface (PEP 249) the connector uses, as structural types: what `DriverSupport.connect`
returns and what the dialect-free code in `spark_qtransport.transport` runs statements on.

Both drivers satisfy them as they are: psycopg 3's `Connection`/`Cursor` (checked by mypy where
`PostgresDriver.connect` returns one, and by tests/test_dbapi_protocols.py) and pyodbc's. Only
members the code outside a driver's own dialect package calls are here; what one driver alone has
(psycopg's `copy`, `info`, `fileno`, `Connection.execute`, `cursor(binary=True)`; pyodbc's
`executemany` with `fast_executemany`, `setinputsizes`, `timeout`) is reached inside that dialect's
package, on the driver's own type (see `postgres/driver.py`, `sqlserver/driver.py`).

A row is any sequence of column values: psycopg gives tuples, pyodbc its `Row`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Connection", "Cursor"]


@runtime_checkable
class Cursor(Protocol):
    """A DB-API cursor: runs statements and hands back their rows."""

    @property
    def description(self) -> Sequence[Sequence[Any]] | None:
        """None for a result without rows: `session.results` skips those; the claim reads column names."""

    @property
    def rowcount(self) -> int:
        """Rows the last statement wrote (`session.rowcount`: outbox insert, dispatch, deletes)."""

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ..., /) -> Cursor:
        """Every statement goes through it; both drivers return the cursor itself (a fetch may follow)."""

    def fetchone(self) -> Sequence[Any] | None:
        """One row or None (`session.first`, `session.one`)."""

    def fetchall(self) -> Sequence[Sequence[Any]]:
        """Every row (`session.rows`, a slice's page of rows)."""

    def fetchmany(self, size: int, /) -> Sequence[Sequence[Any]]:
        """The next `size` rows of a streaming cursor (a slice read without pages: SQL Server)."""

    def nextset(self) -> bool | None:
        """Move on to the next result of a batch (`session.results` passes row counts and warnings)."""

    def close(self) -> None:
        """Release the cursor (a slice's streaming or page cursor, once read)."""


@runtime_checkable
class Connection(Protocol):
    """A DB-API connection in manual-commit mode, as `DriverSupport.connect` opens it."""

    #: switched on briefly where a statement cannot run in a transaction (VACUUM, COMMIT PREPARED)
    autocommit: bool

    def cursor(self) -> Cursor:
        """A new cursor on this connection (plain: a driver's own kinds are asked of the dialect)."""

    def commit(self) -> None:
        """End the transaction: every unit of work (`session.retrying`) commits at its end."""

    def rollback(self) -> None:
        """Undo the transaction after a failure, and before switching `autocommit`."""

    def close(self) -> None:
        """Drop the connection (after a fault, or when its owner is done with it)."""
