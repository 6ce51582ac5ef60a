"""What a role needs once the tables exist: the tables each endpoint touches and its privileges
on each. Dialect-free; `Dialect.grants` writes them as GRANT statements (``sqlqueue ddl
--grant-to``) and `Dialect.privileges` reads what the current role holds (``sqlqueue doctor``).

Nothing here needs DDL rights: the connector creates a table only when it is missing (and, for
queues, only with ``createQueues``), so a role with table privileges runs once a DBA has created
the tables (``sqlqueue create-queue``, ``create-outbox``, ``create-subscriptions``, ``ddl``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...dialects import Dialect, QueueAddress, Statement
from .. import settled
from ..delayed import NSERVICEBUS_DELAYED, DelayedTableRule

__all__ = ["DML", "WRITE", "READ", "Need", "receiving", "sending", "grant_statements"]

#: tables the endpoint consumes or owns: claim (SELECT ... FOR UPDATE needs UPDATE), move, delete
DML = ("SELECT", "INSERT", "UPDATE", "DELETE")
#: queues the endpoint writes to: INSERT, and SELECT for the check that keeps native ids unique
WRITE = ("SELECT", "INSERT")
READ = ("SELECT",)


@dataclass(frozen=True)
class Need:
    """One table an endpoint uses, what it does there, and which ``sqlqueue ddl --part`` creates it."""

    table: QueueAddress
    privileges: tuple[str, ...]
    part: str  # queue | claims | batches | sender | delayed | subscriptions
    queue: bool = False  # a queue table: an INSERT advances its sequence (PostgreSQL serial)
    why: str = ""


#: what the reader writes to each queue its Particular platform options name (option -> why)
PLATFORM_WHY = {"auditQueue": "audit copies", "forwardTo": "forwarded copies", "monitoringQueue": "monitoring reports"}


def receiving(d: Dialect, queue: QueueAddress, *, error_queue: QueueAddress,
              delayed: DelayedTableRule = NSERVICEBUS_DELAYED,
              platform: Mapping[str, QueueAddress] | None = None) -> list[Need]:
    """A receiving endpoint (the source): its queue, the queue's claim table, the error queue
    (poison messages, and ServicePulse's retry acknowledgements, which go to the queue a retried
    message names: usually the error queue), the delayed table of the queue's endpoint (the reader
    moves due messages), and the queues of `platform` (`ReceiveSettings.platform_queues`)."""
    return [
        Need(queue, DML, "queue", True, "claims messages (deletes them), the delayed mover inserts"),
        Need(d.claims_table(queue), DML, "claims", False, "claimed messages until their batch commits"),
        *_ledger(d, settled.READER, {"batches": "which claims each batch read, until acknowledged",
                                     "failed": "the claims the sink failed, taken out of the audit"}),
        Need(error_queue, WRITE, "queue", True, "poison messages, retry acknowledgements"),
        Need(delayed.table_for(d, queue), DML, "delayed", False, "moves due delayed messages"),
        *(Need(address, WRITE, "queue", True, PLATFORM_WHY[option]) for option, address in (platform or {}).items()),
    ]


def sending(d: Dialect, endpoint: QueueAddress, *, destinations: list[QueueAddress], error_queue: QueueAddress,
            subscriptions: QueueAddress, delayed: DelayedTableRule = NSERVICEBUS_DELAYED) -> list[Need]:
    """A sending endpoint (the sink, ``sqlqueue send``): its staging, outbox and delayed tables,
    the destination queues, the subscription table (publish) and the error queue."""
    return [
        Need(d.companion(endpoint, "Staging"), DML, "sender", False, "staged rows until their batch is dispatched"),
        Need(d.companion(endpoint, "Outbox"), DML, "sender", False, "one record per dispatched batch"),
        *_ledger(d, settled.SINK, {"batches": "settles the claims a dispatched batch read",
                                   "failed": "marks the claims a dispatched batch failed"}),
        Need(delayed.table_for(d, endpoint), DML, "delayed", False, "delayed messages; moves due ones"),
        *(Need(q, WRITE, "queue", True, "destination") for q in destinations),
        Need(subscriptions, READ, "subscriptions", False, "subscribers of published events"),
        Need(error_queue, WRITE, "queue", True, "messages that cannot be delivered"),
    ]


def _ledger(d: Dialect, needs: settled.Needs, why: Mapping[str, str]) -> list[Need]:
    """The settled-batches and failed-claims tables (`transport.settled`), made by one DDL part."""
    tables = {"batches": d.batches_table(), "failed": d.failed_table()}
    return [Need(tables[name], privileges, "batches", False, why[name]) for name, privileges in needs]


def grant_statements(d: Dialect, role: str, needs: list[Need]) -> list[Statement]:
    """The GRANT statements for `needs` (privileges of a table named twice are joined)."""
    tables: dict[QueueAddress, tuple[str, ...]] = {}
    for n in needs:
        tables[n.table] = tuple(p for p in DML if p in {*tables.get(n.table, ()), *n.privileges})
    return d.grants(role, tables, queues=[n.table for n in needs if n.queue])
