"""PostgreSQL: every SQL statement and identifier rule of the NServiceBus PostgreSQL transport tables.

Queue tables (NServiceBus ``CreateQueueText``): ``id uuid PRIMARY KEY, expires timestamp (UTC wall
clock), headers text, body bytea, seq serial UNIQUE``. Tables we create use a 64-bit sequence;
tables NServiceBus created (int4 ``seq``) work unchanged. Columns are always named explicitly, so an
added ``BodyString`` column does not matter. One module per feature; `PostgresDialect` is all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import Dialect
from .addressing import PostgresAddressing
from .delayed import PostgresDelayed
from .driver import PostgresDriver
from .install import FAST_VERSION, MIN_VERSION, PostgresInstall
from .operations import PostgresOperations
from .prepared import PostgresPrepared
from .receive import FORWARD_NAME, HELPER_FUNCTION, PostgresReceive
from .send import PostgresSend
from .settled import PostgresSettled

__all__ = ["PostgresDialect", "FORWARD_NAME", "HELPER_FUNCTION", "MIN_VERSION", "FAST_VERSION"]


@dataclass(frozen=True)
class PostgresDialect(
    PostgresInstall, PostgresReceive, PostgresPrepared, PostgresSend, PostgresSettled, PostgresDelayed, PostgresOperations, PostgresAddressing,
    PostgresDriver, Dialect,
):
    """The PostgreSQL dialect. Immutable: `adapt_to_server` returns a configured copy."""

    #: use the helper even where pg_input_is_valid exists (tests of the PostgreSQL 13-15 path)
    force_helper: bool = False
    #: the schema of the PL/pgSQL header check (set by `adapt_to_server` on PostgreSQL < 16, or
    #: with `force_helper`); None: the claim checks headers with pg_input_is_valid
    helper_schema: str | None = None
