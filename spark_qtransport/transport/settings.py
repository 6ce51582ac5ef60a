"""What a receiver and a sender are configured with: plain, validated values, no Spark.

Spark's option strings are parsed into these by `spark_qtransport.options.parse`; the CLI and the
tests build them with `ReceiveSettings.create` / `SendSettings.create`. Each holds its dialect,
made once from its URL. Defaults are written here once; the option documentation shows them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ..connections import ConnectionURL, parse_url
from ..dialects import Dialect, QueueAddress, dialect_for
from ..errors import ConfigError, field_error
from .delayed import NSERVICEBUS_DELAYED, DelayedTableRule
from .routing import RoutingPolicy
from .selection import QueueSelection

__all__ = ["ReceiveSettings", "StreamSettings", "SendSettings", "DEFAULT_MAX_MESSAGES", "DEFAULT_ACK_BATCH", "DEFAULT_RETENTION_SECONDS",
           "INVALID_ROWS", "INVALID_FAIL", "INVALID_TO_ERROR_QUEUE"]

DEFAULT_MAX_MESSAGES = 10_000
#: Kafka's default for maxTriggerDelay (with minMessagesPerTrigger)
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0
DEFAULT_ACK_BATCH = 10_000
#: how often ServicePulse monitoring reports are sent (NServiceBus.Metrics.ServiceControl has no
#: default: its interval is a required argument)
DEFAULT_MONITORING_INTERVAL = 10.0
DEFAULT_RETENTION_SECONDS = 7 * 86400
DEFAULT_ERROR_QUEUE = "error"
DEFAULT_SUBSCRIPTIONS = "SubscriptionRouting"
DEFAULT_CONTENT_TYPE = "application/json"
DEFAULT_SINK = "default"
#: what the sink does with a row it cannot build into a message (a NaN delay, a NUL byte, ...):
#: send it, as the message it would have been, to the error queue with NServiceBus's failure
#: headers (the rest of the batch is sent), or fail the batch naming the column and the message
INVALID_TO_ERROR_QUEUE = "error-queue"
INVALID_FAIL = "fail"
INVALID_ROWS = (INVALID_TO_ERROR_QUEUE, INVALID_FAIL)
DEFAULT_INVALID_ROWS = INVALID_TO_ERROR_QUEUE
#: most bytes of messages (headers and bodies) a micro-batch's sink tasks hand to the driver, which
#: writes them straight into their queues in the batch's dispatch transaction: each of the first
#: INLINE_TASKS tasks (by partition) hands its messages over when they total at most its share
DEFAULT_INLINE_BYTES = 256 * 2**20
INLINE_TASKS = 4
#: where a claim is held until its batch is acknowledged (option `claimMode`): a prepared
#: transaction (PostgreSQL), the claim table, or the first where the server allows it
CLAIM_AUTO, CLAIM_PREPARED, CLAIM_TABLE = "auto", "prepared", "table"
CLAIM_MODES = (CLAIM_AUTO, CLAIM_PREPARED, CLAIM_TABLE)
#: seconds a prepared claim may hold vacuum back before it is moved into the claim table
DEFAULT_PREPARED_TIMEOUT = 60.0
#: a micro-batch is read with one Spark partition per this many claimed rows, at most MAX_AUTO_PARTITIONS
PARTITION_TARGET_ROWS = 25_000
MAX_AUTO_PARTITIONS = 16


def _url(url: ConnectionURL | str) -> ConnectionURL:
    return url if isinstance(url, ConnectionURL) else parse_url(url)


@dataclass(frozen=True)
class ReceiveSettings:
    """A receiver: which queue, as which consumer, how much per batch."""

    url: ConnectionURL
    queue: QueueAddress
    error_queue: QueueAddress
    consumer: str
    max_messages: int = DEFAULT_MAX_MESSAGES
    num_partitions: int | None = None
    create_queues: bool = False
    ack_batch: int = DEFAULT_ACK_BATCH
    claim_ahead: bool = True
    #: where claims are held (`CLAIM_MODES`) and how long a prepared one may live, in seconds
    claim_mode: str = CLAIM_AUTO
    prepared_timeout: float = DEFAULT_PREPARED_TIMEOUT
    routing: RoutingPolicy = RoutingPolicy()
    #: which table holds the delayed messages of the queue's endpoint (the reader moves due ones)
    delayed_rule: DelayedTableRule = NSERVICEBUS_DELAYED
    #: the Particular platform (`transport.platform`): a copy of every acknowledged message with
    #: NServiceBus's audit headers (None: no auditing, NServiceBus's default), its time to be received
    audit_queue: QueueAddress | None = None
    audit_ttbr_seconds: float | None = None
    #: an unchanged copy of every acknowledged message (None: none)
    forward_to: QueueAddress | None = None
    #: ServicePulse monitoring reports (None: none) and how often they are sent, in seconds
    monitoring_queue: QueueAddress | None = None
    monitoring_interval: float = DEFAULT_MONITORING_INTERVAL
    #: acknowledge ServicePulse retries to their AcknowledgementQueue (False: a platform queue's reader)
    acknowledge_retries: bool = True
    dialect: Dialect = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d = dialect_for(self.url)
        object.__setattr__(self, "dialect", d)
        if d.qualified(self.error_queue) == d.qualified(self.queue):
            raise field_error("error_queue", "must name another queue than `queue`")
        for name, target in self.platform_queues().items():
            if d.qualified(target) == d.qualified(self.queue):
                raise field_error(name, "must name another queue than `queue`: every message would come back")
        if self.audit_ttbr_seconds is not None and not 0 < self.audit_ttbr_seconds <= d.max_interval_seconds:
            raise field_error("audit_ttbr_seconds", "must be a positive duration of at most "
                              f"{d.max_interval_seconds:.0f} seconds")
        if not 0.1 <= self.monitoring_interval <= 86_400:
            raise field_error("monitoring_interval", "must be between 100ms and 1d")
        try:
            d.claims_table(self.queue)  # fails early when the claim table name would be too long
        except ConfigError as exc:
            raise field_error("queue", str(exc)) from None
        rule = self.delayed_rule
        if rule.table is not None or rule.custom_suffix:  # a table asked for must be one (see `delayed`)
            rule.table_for(d, self.queue)
        rule.check(d, self.queue, {"error_queue": self.error_queue})
        object.__setattr__(self, "routing", self.routing.reserving(suffix=rule.suffix, table=rule.table))

    @classmethod
    def create(cls, url: ConnectionURL | str, queue: str, *, error_queue: str = DEFAULT_ERROR_QUEUE,
               consumer: str | None = None, **values: object) -> ReceiveSettings:
        """Settings from addresses as text (NServiceBus syntax), for code that is not Spark's."""
        url = _url(url)
        d = dialect_for(url)
        address = d.parse_address(queue, field="queue")
        return cls(url=url, queue=address, error_queue=d.parse_address(error_queue, field="error_queue"),
                   consumer=consumer or address.table, **values)  # type: ignore[arg-type]

    @property
    def delayed(self) -> QueueAddress | None:
        """The delayed table of the queue's endpoint (`DelayedTableRule`); None for a queue whose
        name is too long to have ``<queue>.Delayed`` (NServiceBus allows 55 bytes on PostgreSQL)."""
        try:
            return self.delayed_rule.table_for(self.dialect, self.queue)
        except ConfigError:
            return None

    def platform_queues(self) -> dict[str, QueueAddress]:
        """The platform's queues, by settings field: each must exist at start."""
        named = {"audit_queue": self.audit_queue, "forward_to": self.forward_to, "monitoring_queue": self.monitoring_queue}
        return {name: address for name, address in named.items() if address is not None}

    def partitions_for(self, rows: int) -> int:
        if self.num_partitions:
            return self.num_partitions
        return max(1, min(MAX_AUTO_PARTITIONS, -(-rows // PARTITION_TARGET_ROWS)))


@dataclass(frozen=True)
class StreamSettings:
    """What one stream reads and when a batch may start: one queue, several listed, or the queues a
    pattern matches (`QueueSelection`), each received with its own `ReceiveSettings`
    (`settings_for`: the stream's options with that queue)."""

    url: ConnectionURL
    selection: QueueSelection
    settings_for: Callable[[QueueAddress], ReceiveSettings]
    #: queues a pattern never matches: the stream's error queue and platform queues
    excluded: tuple[QueueAddress, ...] = ()
    routing: RoutingPolicy = RoutingPolicy()
    max_messages: int = DEFAULT_MAX_MESSAGES
    #: Kafka's minOffsetsPerTrigger / maxTriggerDelay (`TriggerGate`); None: a batch whenever one message waits
    min_messages: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY
    dialect: Dialect = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dialect", dialect_for(self.url))
        if not 0 < self.max_trigger_delay <= 86_400 * 365:
            raise field_error("max_trigger_delay", "must be a positive duration of at most 365d")

    @classmethod
    def of(cls, settings: ReceiveSettings) -> StreamSettings:
        """The stream of one queue received with `settings`."""
        return cls(url=settings.url, selection=QueueSelection(queues=(settings.queue,)),
                   settings_for=functools.partial(_always, settings), routing=settings.routing,
                   max_messages=settings.max_messages)

    @property
    def single(self) -> ReceiveSettings | None:
        """The settings of a one-queue stream (its offsets are the plain `ClaimOffset`), else None."""
        queue = self.selection.single
        return None if queue is None else self.settings_for(queue)

    def describe(self) -> str:
        return self.selection.describe(self.dialect)


def _always(settings: ReceiveSettings, queue: QueueAddress) -> ReceiveSettings:
    return settings


@dataclass(frozen=True)
class SendSettings:
    """A sender: the sending endpoint (owner of `<endpoint>.Staging`, `.Outbox` and its delayed
    table, `delayed`), where rows without a destination go, and how long outbox records are kept."""

    url: ConnectionURL
    endpoint: QueueAddress
    error_queue: QueueAddress
    subscriptions: QueueAddress
    destination: QueueAddress | None = None
    sink: str = DEFAULT_SINK
    create_queues: bool = False
    retention_seconds: int = DEFAULT_RETENTION_SECONDS
    content_type: str = DEFAULT_CONTENT_TYPE
    batch_id: int | None = None  # given by QueueSink (foreachBatch); streams get it from Spark
    query_id: str | None = None
    #: the dispatch settles the claims its batch read (`transport.settled`): the stream writer's
    #: always (its commit ends the batch); a QueueSink's when told it is the batch's last output
    settles: bool = False
    routing: RoutingPolicy = RoutingPolicy()
    inline_bytes: int = DEFAULT_INLINE_BYTES  # per batch; 0: every task stages its rows
    #: which table holds the endpoint's delayed messages
    delayed_rule: DelayedTableRule = NSERVICEBUS_DELAYED
    #: rows the sink cannot build: `INVALID_TO_ERROR_QUEUE` (to `error_queue`) or `INVALID_FAIL`
    invalid_rows: str = DEFAULT_INVALID_ROWS
    #: `invalid_rows` was chosen, not left at its default: a one-off write (no stream, nobody to
    #: look at an error queue) with rows it cannot build then sends them there; else it fails
    invalid_rows_chosen: bool = False
    dialect: Dialect = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d = dialect_for(self.url)
        object.__setattr__(self, "dialect", d)
        if self.invalid_rows not in INVALID_ROWS:
            raise field_error("invalid_rows", f"must be {' or '.join(INVALID_ROWS)}, not {self.invalid_rows[:40]!r}")
        rule = self.delayed_rule
        for suffix in ("Staging", "Outbox"):  # fail early when a name would be too long
            try:
                d.companion(self.endpoint, suffix)  # (index names are derived to fit: `index_name`)
            except ConfigError as exc:
                raise field_error("endpoint", str(exc)) from None
        try:
            rule.table_for(d, self.endpoint)
        except ConfigError as exc:
            if exc.field is not None:  # the suffix's
                raise
            raise field_error("endpoint", str(exc)) from None
        others = {"error_queue": self.error_queue, "subscriptions": self.subscriptions}
        if self.destination is not None:
            others["destination"] = self.destination
        rule.check(d, self.endpoint, others)
        object.__setattr__(self, "routing", self.routing.reserving(suffix=rule.suffix, table=rule.table))

    @classmethod
    def create(cls, url: ConnectionURL | str, endpoint: str, *, destination: str | None = None,
               error_queue: str = DEFAULT_ERROR_QUEUE, subscriptions: str = DEFAULT_SUBSCRIPTIONS,
               **values: object) -> SendSettings:
        """Settings from addresses as text (NServiceBus syntax), for code that is not Spark's."""
        url = _url(url)
        d = dialect_for(url)
        return cls(url=url, endpoint=d.parse_address(endpoint, field="endpoint"),
                   error_queue=d.parse_address(error_queue, field="error_queue"),
                   subscriptions=d.parse_address(subscriptions, field="subscriptions"),
                   destination=d.parse_address(destination, field="destination") if destination else None,
                   **values)  # type: ignore[arg-type]

    def inline_limit(self, partition: int) -> int:
        """Most bytes the task of `partition` hands to the driver (0: it stages its rows)."""
        if partition >= INLINE_TASKS or not self.dialect.sends_inline:
            return 0
        return self.inline_bytes // INLINE_TASKS

    @property
    def staging(self) -> QueueAddress:
        return self.dialect.companion(self.endpoint, "Staging")

    @property
    def outbox(self) -> QueueAddress:
        return self.dialect.companion(self.endpoint, "Outbox")

    @property
    def delayed(self) -> QueueAddress:
        """The endpoint's delayed table (`DelayedTableRule`)."""
        return self.delayed_rule.table_for(self.dialect, self.endpoint)
