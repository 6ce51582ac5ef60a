"""SQL Server: every SQL statement and identifier rule of the NServiceBus SQL Server transport tables.

Addresses are ``table@[schema]@[catalog]`` and are parsed exactly as NServiceBus's
``QueueAddress.Parse`` does: the table is everything up to the first ``@`` (taken literally, never
unquoted), then schema and catalog, each optionally bracket-quoted (and then allowed to contain
``@``, with ``]`` doubled). Identifiers are quoted ``[like]]this]`` (NServiceBus's ``NameHelper``).

Queue tables are NServiceBus's (``SqlServerConstants.CreateQueueText``): a heap with
``Index_RowVersion`` and a filtered ``Index_Expires``; ``RowVersion bigint IDENTITY`` is the FIFO
order. Columns are always named explicitly, so an added ``BodyString`` column does not matter, and
the legacy ``Recoverable`` column is written (1) exactly where the table has it, decided on the
server by each INSERT. The delayed table and ``SubscriptionRouting`` are NServiceBus's too;
``<endpoint>.Staging`` and ``<endpoint>.Outbox`` are ours. Lists of any length (task attempts, row
keys, native ids) travel as one JSON parameter read with OPENJSON (a request takes at most 2,100
parameters).

Statements are DB-API statements for pyodbc: ``?`` markers, parameters as a tuple in marker order.
A parameterized statement runs inside ``sp_executesql``/``sp_prepexec`` on the server, so the
``SET NOCOUNT``/``SET XACT_ABORT`` of a batch end with it and never leak into the session.
Parameters are never None (pyodbc would have to guess a NULL's type): optional parts of a
statement are left out of its text instead. SQL comments inside statements hold no quote or
question-mark characters, so no driver mistakes them for literals or parameter markers.

One module per feature; `SqlServerDialect` is all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import Dialect
from .addressing import MAX_NAME_CHARS, SqlServerAddressing
from .delayed import SqlServerDelayed
from .driver import SqlServerDriver
from .install import SCRIPT_SET_OPTIONS, SqlServerInstall
from .operations import SqlServerOperations
from .receive import CLAIM_CHUNK, SqlServerReceive
from .send import SqlServerSend
from .settled import SqlServerSettled
from .statements import placeholders

__all__ = ["SqlServerDialect", "CLAIM_CHUNK", "MAX_NAME_CHARS", "SCRIPT_SET_OPTIONS", "placeholders"]


@dataclass(frozen=True)
class SqlServerDialect(
    SqlServerInstall, SqlServerReceive, SqlServerSend, SqlServerSettled, SqlServerDelayed, SqlServerOperations, SqlServerAddressing,
    SqlServerDriver, Dialect,
):
    """The SQL Server dialect. Immutable, and nothing in it depends on the server found."""
