"""Delayed delivery: which table holds an endpoint's delayed messages (`DelayedTableRule`), and
moving its due messages to their destinations (`DelayedMover`).

NServiceBus stores a deferred message in the sending endpoint's delayed table with the header
``NServiceBus.SqlServer.ForwardDestination``; every endpoint instance polls it with a back-off of
up to a minute. Here one mover at a time per table (a transaction-scoped advisory lock / applock)
runs whenever the reader plans a trigger, the sink commits a batch, or the CLI asks, and moves due
rows in bounded batches straight to their destination with that header removed. A row without the
header belongs to the endpoint's own input queue. Destinations go through the one routing path
(`transport.routing`): a row whose destination does not exist, is not a queue or is outside the
allow-list goes to the error queue with NServiceBus's failure headers. Bodies never leave the server.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..dialects import Connection, Cursor, Dialect, QueueAddress
from ..errors import ConfigError, field_error
from ..wire import H, decode_headers
from . import session as db
from .routing import Item, Router, RoutingPolicy, route_rows

__all__ = ["DEFAULT_DELAYED_SUFFIX", "NSERVICEBUS_DELAYED", "DelayedMover", "DelayedTableRule", "MoveResult", "MOVE_BATCH"]

log = logging.getLogger("spark_qtransport.delayed")

#: rows moved per transaction
MOVE_BATCH = 1000

#: NServiceBus's default `DelayedDelivery.TableSuffix` (both transports)
DEFAULT_DELAYED_SUFFIX = "Delayed"
#: the other tables of ours beside a queue: a delayed table must never be one of them
_OURS = ("Claims", "Staging", "Outbox")


@dataclass(frozen=True)
class DelayedTableRule:
    """Which table holds an endpoint's delayed messages: the one place that decides it, for the
    sink, the reader's mover, the installers and every command.

    NServiceBus (both transports) names it ``<endpoint name>.<TableSuffix>`` (suffix ``Delayed``
    unless ``DelayedDelivery.TableSuffix`` says otherwise) and resolves it like a queue name of its
    own: in the transport's default schema and, on SQL Server, default catalog. NServiceBus refuses
    a schema for the local endpoint and points to ``DefaultSchema`` instead, which moves its queue
    and delayed table together. An endpoint is given here as its input queue's address, whose
    schema and catalog stand for those defaults, so the table is ``<input queue table>.<suffix>``
    beside the input queue. `table` names it outright
    (option ``delayedTable``) where NServiceBus's differs from that: an input queue not named
    after its endpoint (``OverrideLocalAddress``), or one moved by ``UseSchemaForQueue``, whose
    delayed table stays in the default schema.

    Errors name the fields ``delayed_table`` and ``delayed_suffix`` (`errors.field_error`): the
    front end that took them names its option or flag.
    """

    suffix: str = DEFAULT_DELAYED_SUFFIX
    table: QueueAddress | None = None

    @classmethod
    def create(cls, dialect: Dialect, *, table: QueueAddress | None = None, suffix: str | None = None) -> DelayedTableRule:
        """A rule from an explicit table (parsed already) and/or a suffix, checked: a suffix is
        one identifier part, never one of the other tables of ours (``Claims``, ...)."""
        if suffix is None:
            suffix = DEFAULT_DELAYED_SUFFIX
        else:
            try:
                dialect.check_name("delayed table suffix", suffix)
            except ConfigError as exc:
                raise field_error("delayed_suffix", str(exc)) from None
            if dialect.fold_name(suffix) in {dialect.fold_name(o) for o in _OURS}:
                raise field_error("delayed_suffix", f"{suffix!r} names a table of the transport's own "
                                  f"(<queue>.{suffix}), not a delayed table")
        return cls(suffix, table)

    @property
    def custom_suffix(self) -> bool:
        return self.suffix != DEFAULT_DELAYED_SUFFIX

    def table_for(self, dialect: Dialect, endpoint: QueueAddress) -> QueueAddress:
        """The delayed table of the endpoint whose input queue is `endpoint`. A name too long for
        the database fails, naming the suffix option when the suffix is not the default."""
        if self.table is not None:
            return self.table
        try:
            return dialect.companion(endpoint, self.suffix)
        except ConfigError as exc:
            if not self.custom_suffix:
                raise
            raise field_error("delayed_suffix", str(exc)) from None

    def check(self, dialect: Dialect, endpoint: QueueAddress, others: dict[str, QueueAddress]) -> None:
        """Refuse an explicit table that is another table of the endpoint: its queue, its tables
        of ours beside it, or one of `others` (settings field -> address: error_queue, ...)."""
        if self.table is None:
            return

        def key(a: QueueAddress) -> str:
            return dialect.fold_name(dialect.qualified(a))

        mine = key(self.table)
        taken: dict[str, str] = {key(endpoint): "the endpoint's queue"}
        for suffix in _OURS:
            try:
                taken.setdefault(key(dialect.companion(endpoint, suffix)), f"the endpoint's .{suffix} table")
            except ConfigError:
                continue
        for name, address in others.items():
            taken.setdefault(key(address), f"`{name}`")
        if mine in taken:
            raise field_error("delayed_table", f"{dialect.qualified(self.table)} is {taken[mine]}, not a delayed table")


#: NServiceBus's rule with its defaults: ``<endpoint>.Delayed`` beside the endpoint's queue
NSERVICEBUS_DELAYED = DelayedTableRule()


@dataclass
class MoveResult:
    moved: int = 0
    failed: int = 0  # sent to the error queue
    busy: bool = False  # another mover held the table
    destinations: dict[str, int] = field(default_factory=dict)


@dataclass
class DelayedMover:
    """Moves due messages of one delayed table. Not thread-safe; one per connection user."""

    dialect: Dialect
    delayed: QueueAddress
    endpoint: QueueAddress  # the endpoint's input queue: destination of rows without the header
    error_queue: QueueAddress
    batch: int = MOVE_BATCH
    policy: RoutingPolicy | None = None

    def move(self, conn: Connection, *, max_batches: int = 20) -> MoveResult:
        """Move due rows, at most `max_batches` transactions of `batch` rows. Commits each."""
        result = MoveResult()
        cur = conn.cursor()
        for _ in range(max_batches):
            if db.first(cur, self.dialect.any_due(self.delayed)) is None:
                conn.commit()
                break
            (locked,) = db.one(cur, self.dialect.lock_mover(self.delayed))
            if not locked:
                conn.rollback()
                result.busy = True
                break
            rows = db.rows(cur, self.dialect.due_delayed(self.delayed, limit=self.batch))
            self._move_rows(cur, rows, result)
            conn.commit()
            if len(rows) < self.batch:
                break
        if result.moved or result.failed:
            log.info("moved %d due delayed message(s) from %s (%d to the error queue)",
                     result.moved, self.dialect.qualified(self.delayed), result.failed)
        return result

    def _move_rows(self, cur: Cursor, rows: list[Any], result: MoveResult) -> None:
        d = self.dialect
        # Destinations are looked up afresh in each transaction: a queue may have been created,
        # dropped, or lost or regained its Recoverable column since (SQL Server).
        router = Router(d, self.policy)
        own = None
        items = []
        for key, text in rows:
            headers = decode_headers(text)
            if headers is None:  # not ours to repair: the error queue gets it as it was
                items.append(Item(str(key), None, None, raw=text))
                continue
            target = headers.pop(H.FORWARD_DESTINATION, None)
            if target is None:  # no header: the endpoint's own input queue ("" is refused)
                own = own or router.trusted(cur, self.endpoint)
            items.append(Item(str(key), headers, own if target is None else target))
        if not items:
            return
        routed = route_rows(
            cur, router, items,
            insert=lambda t, keys, headers: d.move_delayed(self.delayed, t.address, keys=keys, headers=headers),
            delete=lambda keys: d.delete_delayed(self.delayed, keys=keys),
            error_queue=lambda: router.configured(cur, self.error_queue, field="error_queue"),
            source="spark_qtransport.delayed", endpoint=self.endpoint.table,
        )
        result.moved += sum(routed.moved.values())
        result.failed += routed.failed
        for name, n in routed.moved.items():
            result.destinations[name] = result.destinations.get(name, 0) + n
        if routed.failed:
            log.warning("%d delayed message(s) could not be delivered; moved to %s",
                        routed.failed, d.format_address(self.error_queue))
