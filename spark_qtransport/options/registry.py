"""The one registry of the connector's options: for each, its name, type, default, bounds, where it
applies (the source, the sink, the ``sqlqueue`` command's flag that takes the same value) and its
meaning in one line.

The source and the sink (`options.ReaderOptions`, `options.WriterOptions`, and `QueueSink`, which
hands its options to the sink), the command line (`cli.app`) and the documentation's option tables
(``docs/_hooks/options.py``) all read it. It parses a value of every kind (numbers, durations,
choices, texts, URLs, lists; queue addresses, lists of them and patterns by the URL's dialect), the
settings are built from its options by their fields (`options.parse.Given.settings`), and it raises
the error that names the option (or the flag) at fault. The transport below never spells an option's name: it raises with
the settings field at fault (``ConfigError.field``), and `name_fields` gives the error the name a
front end knows it by.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..connections import OUTAGE_TIMEOUT, RESPONSE_TIMEOUT, parse_url
from ..dialects import Dialect
from ..errors import ConfigError, QTransportError, named
from ..transport import settings as defaults
from ..transport.delayed import DEFAULT_DELAYED_SUFFIX
from ..transport.routing import allow_list
from ..transport.selection import QueuePattern, parse_queue_list

__all__ = ["Option", "REGISTRY", "READ", "WRITE", "URL_ENV", "OUTAGE_ENV", "for_side", "flag", "by_name", "parse_duration",
           "name_fields"]

#: environment variable read when no `url` option is given (on the driver, at load())
URL_ENV = "SQLQUEUE_URL"
#: environment variable of the command line's --outage-timeout
OUTAGE_ENV = "SQLQUEUE_OUTAGE_TIMEOUT"

READ, WRITE = "read", "write"
TEXT, INT, BOOL, DURATION, ADDRESS, ADDRESSES, PATTERN, CHOICE, URL, LIST = (
    "text", "whole number", "true or false", "duration", "queue address", "queue addresses", "queue pattern",
    "one of", "URL", "comma-separated list")

#: the largest values the integer options take: far above any useful setting, far below 2^63 - 1
MAX_MAX_MESSAGES = 10_000_000
MAX_NUM_PARTITIONS = 10_000
MAX_ACK_BATCH = 1_000_000
MAX_RETENTION_SECONDS = 3650 * 86400  # ten years (SQL Server's DATEADD takes an int of seconds)
MAX_INLINE_BYTES = 2**30


@dataclass(frozen=True)
class Option:
    """One option of the source or the sink (or both)."""

    name: str
    kind: str
    meaning: str
    applies: frozenset[str]
    #: the value when the option is not given (None: none), and as the documentation shows it
    default: Any = None
    shown: str = "none"
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    #: the settings field the transport names in its errors (`ConfigError.field`)
    field: str | None = None
    #: the ``sqlqueue`` flag that takes the same value, and its environment variable
    cli: str | None = None
    env: str | None = None
    secret: bool = False
    #: a queue address given blank (empty or white space) is none, as if left out (else: the
    #: default where there is one, an error where there is none)
    blank_is_none: bool = False

    @property
    def key(self) -> str:
        return self.name.lower()

    def type_text(self) -> str:
        """The type and bounds, as the documentation shows them: ``whole number, 1 to 10,000``."""
        if self.kind == CHOICE:
            return f"one of {', '.join(f'`{c}`' for c in self.choices)}"
        low, high = self.minimum, self.maximum
        if self.kind == DURATION:
            bounds = [_duration_text(v) for v in (low, high)]
        elif self.kind == INT:
            bounds = [None if v is None else f"{int(v):,}" for v in (low, high)]
        elif self.kind == TEXT and high is not None:
            return f"text, {int(low or 0)} to {int(high)} characters"
        else:
            return self.kind
        if bounds[0] is not None and bounds[1] is not None:
            return f"{self.kind}, {bounds[0]} to {bounds[1]}"
        return f"{self.kind}, at least {bounds[0]}" if bounds[0] is not None else self.kind

    def parse(self, raw: object, *, flag: bool = False, dialect: Dialect | None = None) -> Any:
        """The value `raw` (as given: text, or None when absent) stands for, checked against the
        type and bounds; an error names the option (``flag``: the command line's flag). Queue
        addresses, lists of them and patterns are parsed by `dialect`."""
        name = self.cli if flag and self.cli else self.name
        if self.kind in _PARSED_WHOLE:
            return self._parse_whole(raw, name, dialect)
        if raw is None or str(raw) == "" or (self.kind != TEXT and not str(raw).strip()):
            return self.default  # given empty: as if not given
        where = name if name.startswith("-") else f"option '{name}'"
        text = str(raw).strip()
        if self.kind == INT:
            try:
                value: Any = int(text)
            except ValueError:
                raise ConfigError(f"{where} must be a whole number, not {text[:40]!r}", option=name) from None
        elif self.kind == BOOL:
            if text.lower() not in _BOOLS:
                raise ConfigError(f"{where} must be true or false, not {str(raw)[:40]!r}", option=name)
            return _BOOLS[text.lower()]
        elif self.kind == CHOICE:
            if text.lower() not in self.choices:
                raise ConfigError(f"{where} must be {' or '.join(self.choices)}, not {text[:40]!r}", option=name)
            return text.lower()
        elif self.kind == DURATION:
            value = parse_duration(text, option=name)
        elif self.kind == TEXT and self.maximum is not None:
            value = text
            if not (self.minimum or 0) <= len(text) <= self.maximum:
                raise ConfigError(f"{where} must be {int(self.minimum or 0)} to {int(self.maximum)} characters",
                                  option=name)
            return value
        else:
            return raw
        low, high = self.minimum, self.maximum
        show = _duration_text if self.kind == DURATION else (lambda v: f"{int(v):,}")
        if low is not None and value < low:
            raise ConfigError(f"{where} must be at least {show(low)}, not {text[:40]}", option=name)
        if high is not None and value > high:
            raise ConfigError(f"{where} must be at most {show(high)}, not {text[:40]}", option=name)
        return value

    def _parse_whole(self, raw: object, name: str, dialect: Dialect | None) -> Any:
        """A URL, a list, a queue address, several or a pattern. Given blank, an address is its
        default, or none (`blank_is_none`), or else the address parser's error; the others are
        checked as given (an empty list or pattern is an error, not a default)."""
        if self.kind == ADDRESS and raw is not None and not str(raw).strip() and (
                self.blank_is_none or self.default is not None):
            raw = None
        if raw is None:
            if self.default is None:
                return None
            raw = self.default
        text = str(raw)
        if self.kind == URL:
            return parse_url(text, option=name)
        if self.kind == LIST:
            return allow_list(text, self.field or self.key)
        if dialect is None:
            raise TypeError(f"option {self.name!r}: a {self.kind} is parsed by a dialect")
        if self.kind == ADDRESS:
            return dialect.parse_address(text, option=name)
        if self.kind == PATTERN:
            return QueuePattern.parse(dialect, text)
        return parse_queue_list(dialect, text, option=name)


_PARSED_WHOLE = frozenset((URL, LIST, ADDRESS, ADDRESSES, PATTERN))
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(raw: str, *, option: str) -> float:
    """``500ms``, ``30s``, ``5m``, ``12h``, ``7d`` or plain seconds -> seconds."""
    m = _DURATION.match(str(raw))
    if not m:
        where = option if option.startswith("-") else f"option '{option}'"
        raise ConfigError(f"{where} must be a duration such as 30s, 12h or 7d, not {raw!r}", option=option)
    return float(m.group(1)) * _UNIT_SECONDS[(m.group(2) or "").lower() or None]


def _duration_text(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", 0.001)):
        if seconds >= size and abs(seconds / size - round(seconds / size)) < 1e-9:
            return f"{round(seconds / size)}{unit}"
    return f"{seconds}s"


BOTH, READ_ONLY, WRITE_ONLY = frozenset((READ, WRITE)), frozenset((READ,)), frozenset((WRITE,))

#: where NServiceBus puts a delayed table that the default (`<queue>.<suffix>` beside the queue) misses
_DELAYED_ELSEWHERE = ("when NServiceBus's differs: an input queue not named after its endpoint, or one placed by "
                      "`UseSchemaForQueue` (the delayed table stays in the default schema); e.g. `public.\"Sales.Delayed\"`")
_DELAYED_SUFFIX = ("NServiceBus's `DelayedDelivery.TableSuffix`: the delayed table is `<{}>.<suffix>`; "
                   "no destination from data may name a table `*.<suffix>`")
_ALLOWED_SCHEMAS = "comma-separated schemas that {} may name; others go to the error queue"
_ALLOWED_QUEUES = "comma-separated name patterns (`Sales*`, `*.Replies`) that {} may name; others go to the error queue"
_READ_ADDRESSES = "ForwardDestination headers and ServiceControl's retry acknowledgement queues"
_WRITE_ADDRESSES = "`destination` values (so replies' ReplyToAddress) and subscription rows"

#: every option, in the order the documentation lists them; an option whose type or meaning differs
#: between the source and the sink has an entry for each
REGISTRY: tuple[Option, ...] = (
    Option("url", URL, "postgresql://, sqlserver:// (mssql://) URL or odbc:<connection string>", BOTH,
           shown=f"${URL_ENV}", field="url", cli="--url", env=URL_ENV, secret=True),
    Option("user", TEXT, "database user; overrides the URL's", BOTH, shown="from url"),
    Option("password", TEXT, "database password; overrides the URL's (Spark redacts options named password)", BOTH,
           shown="from url", secret=True),
    Option("outageTimeout", DURATION, "how long a database outage (server restarting, failover, every session "
           "terminated) is ridden through before the query fails: claims, reads, acknowledgements, staging and "
           "dispatch wait and retry with backoff, one WARNING when it starts and one INFO when it ends (`30s`, `5m`; "
           "`0`: fail at the first fault), as NServiceBus's receive circuit breaker", BOTH,
           shown=str(_duration_text(OUTAGE_TIMEOUT)), minimum=0, field="outage_timeout", cli="--outage-timeout",
           env=OUTAGE_ENV),
    Option("responseTimeout", DURATION, "a transaction without an answer this long: the server is asked, on a "
           "connection of its own, whether it is still running it; if not, or if it cannot be asked, the connection "
           "is taken for lost (a failover that left it hanging) and the work retried on a new one (SQL Server: the "
           "driver's query timeout, four times this)", BOTH, shown=str(_duration_text(RESPONSE_TIMEOUT)), minimum=1,
           field="response_timeout"),
    # -- the source
    Option("queue", ADDRESSES, "queue address to receive from, NServiceBus syntax; several, comma-separated (`Sales, "
           "Billing`), are read in one stream, each with its own claims, consumer lock and FIFO order, and the `queue` "
           "column says where each row came from", READ_ONLY, shown="required (or queuePattern)", field="queue"),
    Option("queuePattern", PATTERN, "instead of `queue`: every queue table whose schema and name match this pattern "
           "(`*`, `?`; e.g. `\"tenant_*\".\"audit\"`, `*.Replies`; without a schema, the default one), resolved again "
           "at each trigger as Kafka's subscribePattern is: a queue that appears joins from its head, one that "
           "disappears is read to the end of what was claimed from it and then dropped. Never matches the stream's "
           "error, audit, forwardTo or monitoring queue, nor the transport's own tables", READ_ONLY,
           field="queue_pattern"),
    Option("endpoint", TEXT, "consumer identity: owns its claims; one running query per endpoint and queue; give each "
           "job its own (a new checkpoint takes over the claims its endpoint holds)", READ_ONLY,
           shown="the queue's table name", field="consumer"),
    Option("errorQueue", ADDRESS, "queue address that receives poison messages", READ_ONLY,
           default=defaults.DEFAULT_ERROR_QUEUE, shown=defaults.DEFAULT_ERROR_QUEUE, field="error_queue",
           cli="--error-queue"),
    Option("maxMessagesPerTrigger", INT, "most messages claimed per micro-batch (Trigger.Once, which reads all, "
           "claims in chunks of this size); over several queues it is shared fairly: a queue wanting less than an "
           "equal share gets all it wants, the others share the rest; busy queues it cannot give 100 each take "
           "turns of 100", READ_ONLY,
           default=defaults.DEFAULT_MAX_MESSAGES, shown=str(defaults.DEFAULT_MAX_MESSAGES), minimum=1,
           maximum=MAX_MAX_MESSAGES, field="max_messages"),
    Option("minMessagesPerTrigger", INT, "as Kafka's minOffsetsPerTrigger: a micro-batch starts only once this many "
           "messages are waiting (over all the stream's queues), or `maxTriggerDelay` after the last one; not applied "
           "with Trigger.AvailableNow or Once", READ_ONLY, minimum=1, maximum=MAX_MAX_MESSAGES, field="min_messages"),
    Option("maxTriggerDelay", DURATION, "with `minMessagesPerTrigger`: the longest wait for a micro-batch after the "
           "last one (`5s`, `15m`)", READ_ONLY, default=defaults.DEFAULT_MAX_TRIGGER_DELAY, shown="15m", minimum=0,
           field="max_trigger_delay"),
    Option("numPartitions", INT, "Spark partitions a micro-batch is read with", READ_ONLY,
           shown=f"one per {defaults.PARTITION_TARGET_ROWS:,} claimed, at most {defaults.MAX_AUTO_PARTITIONS}",
           minimum=1, maximum=MAX_NUM_PARTITIONS, field="num_partitions"),
    Option("createQueues", BOOL, "create the queue and error queue if missing (our installer, 64-bit seq)", READ_ONLY,
           default=False, shown="false", field="create_queues"),
    Option("ackBatchSize", INT, "claims deleted per statement when a batch is acknowledged", READ_ONLY,
           default=defaults.DEFAULT_ACK_BATCH, shown=str(defaults.DEFAULT_ACK_BATCH), minimum=1, maximum=MAX_ACK_BATCH,
           field="ack_batch"),
    Option("claimAhead", BOOL, "while a backlog remains, claim the next batch while Spark processes this one",
           READ_ONLY, default=True, shown="true", field="claim_ahead"),
    Option("claimMode", CHOICE, "where a claim is held until its batch is acknowledged: `prepared` (PostgreSQL: the "
           "claim's DELETE is held by a prepared transaction, so each message is written once; needs "
           "`max_prepared_transactions` above 0), `table` (the claim table: a second write of every message; the only "
           "form on SQL Server), or `auto`: prepared where the server leaves room, else the claim table, with one "
           "INFO line saying why", READ_ONLY, default=defaults.CLAIM_AUTO, shown=defaults.CLAIM_AUTO,
           choices=defaults.CLAIM_MODES, field="claim_mode"),
    Option("preparedClaimTimeout", DURATION, "the longest a prepared claim holds vacuum back: an older one (a stream "
           "idle, stopped or stuck) is moved into the claim table (`claimMode` prepared)", READ_ONLY,
           default=defaults.DEFAULT_PREPARED_TIMEOUT, shown="60s", minimum=1, maximum=86_400,
           field="prepared_timeout", cli="--prepared-timeout"),
    Option("delayedTable", ADDRESS, "address of the delayed table of the queue's endpoint, whose due messages the "
           f"reader moves each trigger, {_DELAYED_ELSEWHERE}", READ_ONLY,
           shown="`<queue>.<delayedTableSuffix>`", field="delayed_table", cli="--delayed-table"),
    Option("delayedTableSuffix", TEXT, _DELAYED_SUFFIX.format("queue"), READ_ONLY, shown=DEFAULT_DELAYED_SUFFIX,
           field="delayed_suffix", cli="--delayed-suffix", env="SQLQUEUE_DELAYED_SUFFIX"),
    Option("allowedSchemas", LIST, _ALLOWED_SCHEMAS.format(_READ_ADDRESSES), READ_ONLY,
           shown="any but system schemas", field="allowed_schemas", cli="--allowed-schemas",
           env="SQLQUEUE_ALLOWED_SCHEMAS"),
    Option("allowedQueues", LIST, _ALLOWED_QUEUES.format(_READ_ADDRESSES), READ_ONLY, shown="any",
           field="allowed_queues", cli="--allowed-queues", env="SQLQUEUE_ALLOWED_QUEUES"),
    Option("auditQueue", ADDRESS, "queue address (ServiceControl Audit reads `audit`) that gets a copy of every "
           "message whose batch is acknowledged, with NServiceBus's audit headers (ProcessingStarted/Ended, "
           "ProcessingEndpoint/Machine, host ids), in the acknowledgement's transaction: exactly once", READ_ONLY,
           shown="none (no auditing)", field="audit_queue", cli="--audit-queue", blank_is_none=True),
    Option("auditTimeToBeReceived", DURATION, "time to be received of the audit copies (`30s`, `12h`, `7d`): their "
           "Expires", READ_ONLY, minimum=0, field="audit_ttbr_seconds"),
    Option("forwardTo", ADDRESS, "queue address that gets an unchanged copy (headers and body) of every message whose "
           "batch is acknowledged, in the acknowledgement's transaction", READ_ONLY, field="forward_to",
           cli="--forward-to", blank_is_none=True),
    Option("monitoringQueue", ADDRESS, "queue address of ServiceControl.Monitoring (`Particular.Monitoring`) to send "
           "ServicePulse's metrics to: processing time, critical time and retries per message type, and the "
           "endpoint's metadata; best-effort, outside any transaction", READ_ONLY, shown="none (no monitoring)",
           field="monitoring_queue", cli="--monitoring-queue", blank_is_none=True),
    Option("monitoringInterval", DURATION, "how often monitoring reports are sent", READ_ONLY,
           default=defaults.DEFAULT_MONITORING_INTERVAL, shown=f"{defaults.DEFAULT_MONITORING_INTERVAL:.0f}s",
           minimum=0.1, maximum=86_400, field="monitoring_interval"),
    Option("retryAcknowledgements", BOOL, "false: a ServicePulse retry (a message with "
           "`ServiceControl.Retry.AcknowledgementQueue`) is acknowledged like any other message, without the "
           "acknowledgement to that queue; for readers of the platform's own queues (audit, error), whose messages "
           "an endpoint processed already", READ_ONLY, default=True, shown="true", field="acknowledge_retries"),
    # -- the sink
    Option("endpoint", ADDRESS, "sending endpoint, as its input queue's address (`Sales`, `\"billing\".\"Sales\"`): "
           "OriginatingEndpoint, default ReplyToAddress, owner of `<endpoint>.Staging`, `.Outbox` and its delayed "
           "table (`<endpoint>.Delayed`)", WRITE_ONLY, shown="required", field="endpoint", cli="--endpoint",
           env="SQLQUEUE_ENDPOINT"),
    Option("destination", ADDRESS, "queue address for rows whose `destination` column is null or absent", WRITE_ONLY,
           field="destination"),
    Option("sinkName", TEXT, "tells apart several sinks of one endpoint; part of the outbox key (sink, batch id)",
           WRITE_ONLY, default=defaults.DEFAULT_SINK, shown=defaults.DEFAULT_SINK, minimum=1, maximum=200,
           field="sink"),
    Option("errorQueue", ADDRESS, "where messages go that cannot be delivered: a destination from data that is "
           "missing, not a queue or not allowed; due delayed messages likewise; and rows the sink cannot build "
           "(`invalidRows`)", WRITE_ONLY, default=defaults.DEFAULT_ERROR_QUEUE, shown=defaults.DEFAULT_ERROR_QUEUE,
           field="error_queue", cli="--error-queue"),
    Option("invalidRows", CHOICE, "a row the sink cannot build into a message (a NaN or out-of-range `delay`, a NUL "
           "character, a bad `intent`, no destination): `error-queue` sends it, as the message it would have been, to "
           "`errorQueue` with NServiceBus's failure headers naming the column, the value and the reason, and sends "
           "the rest of the batch; `fail` fails the batch, naming the column and the message (for a reply, the "
           "message it answers). A one-off write (`df.write`) left at the default sends nothing and fails, naming the "
           "column and how many rows: choose `error-queue` to send them there", WRITE_ONLY, default=defaults.DEFAULT_INVALID_ROWS,
           shown=defaults.DEFAULT_INVALID_ROWS, choices=defaults.INVALID_ROWS, field="invalid_rows"),
    Option("createQueues", BOOL, "create the `destination` and `errorQueue` queues, the endpoint's delayed table and "
           "`SubscriptionRouting` if missing; never a queue named by message data", WRITE_ONLY, default=False,
           shown="false", field="create_queues"),
    Option("subscriptionTable", ADDRESS, "table that routes published events to subscriber queues", WRITE_ONLY,
           default=defaults.DEFAULT_SUBSCRIPTIONS, shown=defaults.DEFAULT_SUBSCRIPTIONS, field="subscriptions"),
    Option("deduplicationRetention", DURATION, "how long outbox records are kept (`30s`, `12h`, `7d`); replays older "
           "than this are sent again", WRITE_ONLY, default=float(defaults.DEFAULT_RETENTION_SECONDS), shown="7d",
           minimum=1, maximum=MAX_RETENTION_SECONDS, field="retention_seconds"),
    Option("contentType", TEXT, "`NServiceBus.ContentType` of messages without one", WRITE_ONLY,
           default=defaults.DEFAULT_CONTENT_TYPE, shown=defaults.DEFAULT_CONTENT_TYPE, field="content_type"),
    Option("delayedTable", ADDRESS, "address of the endpoint's delayed table, where deferred messages go and due ones "
           f"move from, {_DELAYED_ELSEWHERE}", WRITE_ONLY, shown="`<endpoint>.<delayedTableSuffix>`",
           field="delayed_table", cli="--delayed-table"),
    Option("delayedTableSuffix", TEXT, _DELAYED_SUFFIX.format("endpoint"), WRITE_ONLY, shown=DEFAULT_DELAYED_SUFFIX,
           field="delayed_suffix", cli="--delayed-suffix", env="SQLQUEUE_DELAYED_SUFFIX"),
    Option("inlineBytes", INT, "most bytes of messages a micro-batch's tasks hand to the driver, which writes them "
           f"straight into their queues (PostgreSQL): each of the first {defaults.INLINE_TASKS} tasks hands its "
           f"messages over when they total at most a {defaults.INLINE_TASKS}th of it; the others stage theirs. 0: "
           "every task stages. The driver holds them, and Spark counts them in `spark.driver.maxResultSize`",
           WRITE_ONLY, default=defaults.DEFAULT_INLINE_BYTES,
           shown=f"{defaults.DEFAULT_INLINE_BYTES:,} (256 MiB)", minimum=0, maximum=MAX_INLINE_BYTES,
           field="inline_bytes"),
    Option("allowedSchemas", LIST, _ALLOWED_SCHEMAS.format(_WRITE_ADDRESSES), WRITE_ONLY,
           shown="any but system schemas", field="allowed_schemas", cli="--allowed-schemas",
           env="SQLQUEUE_ALLOWED_SCHEMAS"),
    Option("allowedQueues", LIST, _ALLOWED_QUEUES.format(_WRITE_ADDRESSES), WRITE_ONLY, shown="any",
           field="allowed_queues", cli="--allowed-queues", env="SQLQUEUE_ALLOWED_QUEUES"),
)


def for_side(side: str) -> dict[str, Option]:
    """The options of the source (`READ`) or the sink (`WRITE`), by lower-cased name, in order."""
    return {o.key: o for o in REGISTRY if side in o.applies}


def flag(cli: str) -> Option:
    """The option the command line's flag `cli` takes the value of (the first, where both sides have it)."""
    return next(o for o in REGISTRY if o.cli == cli)


def by_name(name: str) -> Option:
    """The option called `name` (the first, where both sides have it)."""
    return next(o for o in REGISTRY if o.name == name)


def name_fields(exc: QTransportError, *, cli: Mapping[str, str] | None = None) -> QTransportError:
    """`exc` with the settings fields it names called what the front end calls them: the source's
    and the sink's option names, or (`cli`: the command's own flags besides) the command line's flags."""
    if cli is None:
        return named(exc, spark_names())
    return named(exc, {**cli_names(), **cli}, called=str)


def spark_names() -> dict[str, str]:
    """Settings field -> option name (a field has one name on both sides: tests/test_options.py)."""
    return {o.field: o.name for o in REGISTRY if o.field}


def cli_names() -> dict[str, str]:
    """Settings field -> the command line's flag, where one takes it."""
    return {o.field: o.cli for o in REGISTRY if o.field and o.cli}


def _check_registry() -> Iterator[str]:
    """What is wrong with the registry itself (tests/test_options.py runs it)."""
    seen: dict[tuple[str, str], Option] = {}
    for o in REGISTRY:
        for side in o.applies:
            if (o.key, side) in seen:
                yield f"{o.name} is listed twice for {side}"
            seen[(o.key, side)] = o
        if o.kind == CHOICE and o.default not in o.choices:
            yield f"{o.name}: default {o.default!r} is not a choice"
