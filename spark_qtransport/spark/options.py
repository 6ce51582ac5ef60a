"""Options of the ``sqlqueue`` source and sink: declared once, read case-insensitively, validated at
load(), parsed into the transport's settings (`ReceiveSettings`, `SendSettings`).

Every error names the option at fault. Queue addresses are parsed by the dialect the URL selects.
Only this module knows option names; the transport takes settings.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

from ..connections import ConnectionURL, parse_url
from ..dialects import Dialect, QueueAddress, dialect_for
from ..errors import ConfigError
from ..transport import settings as defaults
from ..transport.delayed import DEFAULT_DELAYED_SUFFIX, DelayedTableRule
from ..transport.routing import RoutingPolicy
from ..transport.selection import QueuePattern, QueueSelection, check_distinct, split_queue_list
from ..transport.settings import ReceiveSettings, SendSettings, StreamSettings

__all__ = ["ReaderOptions", "WriterOptions", "OPTIONS", "WRITER_OPTIONS", "URL_ENV", "parse_duration"]

#: environment variable read when no `url` option is given (on the driver, at load())
URL_ENV = "SQLQUEUE_URL"

OPT_URL = "url"
OPT_USER = "user"
OPT_PASSWORD = "password"
OPT_QUEUE = "queue"
OPT_ENDPOINT = "endpoint"
OPT_ERROR_QUEUE = "errorqueue"
OPT_MAX_MESSAGES = "maxmessagespertrigger"
OPT_NUM_PARTITIONS = "numpartitions"
OPT_CREATE_QUEUES = "createqueues"
OPT_ACK_BATCH = "ackbatchsize"
OPT_CLAIM_AHEAD = "claimahead"
OPT_RETRY_ACKS = "retryacknowledgements"
OPT_DELAYED_TABLE = "delayedtable"
OPT_DELAYED_SUFFIX = "delayedtablesuffix"

#: where NServiceBus puts a delayed table that the default (`<queue>.<suffix>` beside the queue) misses
_DELAYED_ELSEWHERE = ("when NServiceBus's differs: an input queue not named after its endpoint, or one placed by "
                      "`UseSchemaForQueue` (the delayed table stays in the default schema); e.g. `public.\"Sales.Delayed\"`")
_DELAYED_SUFFIX = ("NServiceBus's `DelayedDelivery.TableSuffix`: the delayed table is `<{}>.<suffix>`; "
                   "no destination from data may name a table `*.<suffix>`")

#: the allow-list for queue addresses that come from message data (see `transport.routing`)
ALLOW_OPTIONS: dict[str, tuple[str, str]] = {
    "allowedSchemas": ("any but system schemas", "comma-separated schemas that ADDRESSES may name; others go to the error queue"),
    "allowedQueues": ("any", "comma-separated name patterns (`Sales*`, `*.Replies`) that ADDRESSES may name; others go to the error queue"),
}

#: how the database is waited for: the reader's and the sink's (driver and executors alike)
WAIT_OPTIONS: dict[str, tuple[str, str]] = {
    "outageTimeout": ("2m", "how long a database outage (server restarting, failover, every session terminated) is ridden through before the query fails: claims, reads, acknowledgements, staging and dispatch wait and retry with backoff, one WARNING when it starts and one INFO when it ends (`30s`, `5m`; `0`: fail at the first fault), as NServiceBus's receive circuit breaker"),
    "responseTimeout": ("30s", "a transaction without an answer this long: the server is asked, on a connection of its own, whether it is still running it; if not, or if it cannot be asked, the connection is taken for lost (a failover that left it hanging) and the work retried on a new one (SQL Server: the driver's query timeout, four times this)"),
}

#: option key (as documented) -> (default shown in docs, meaning)
OPTIONS: dict[str, tuple[str, str]] = {
    "url": (f"${URL_ENV}", "postgresql://, sqlserver:// (mssql://) URL or odbc:<connection string>"),
    "user": ("from url", "database user; overrides the URL's"),
    "password": ("from url", "database password; overrides the URL's (Spark redacts options named password)"),
    **WAIT_OPTIONS,
    "queue": ("required (or queuePattern)", "queue address to receive from, NServiceBus syntax; several, comma-separated (`Sales, Billing`), are read in one stream, each with its own claims, consumer lock and FIFO order, and the `queue` column says where each row came from"),
    "queuePattern": ("none", "instead of `queue`: every queue table whose schema and name match this pattern (`*`, `?`; e.g. `\"tenant_*\".\"audit\"`, `*.Replies`; without a schema, the default one), resolved again at each trigger as Kafka's subscribePattern is: a queue that appears joins from its head, one that disappears is read to the end of what was claimed from it and then dropped. Never matches the stream's error, audit, forwardTo or monitoring queue, nor the transport's own tables"),
    "endpoint": ("the queue's table name", "consumer identity: owns its claims; one running query per endpoint and queue; give each job its own (a new checkpoint takes over the claims its endpoint holds)"),
    "errorQueue": (defaults.DEFAULT_ERROR_QUEUE, "queue address that receives poison messages"),
    "maxMessagesPerTrigger": (str(defaults.DEFAULT_MAX_MESSAGES), "most messages claimed per micro-batch (Trigger.Once, which reads all, claims in chunks of this size); over several queues it is shared fairly: a queue wanting less than an equal share gets all it wants, the others share the rest"),
    "minMessagesPerTrigger": ("none", "as Kafka's minOffsetsPerTrigger: a micro-batch starts only once this many messages are waiting (over all the stream's queues), or `maxTriggerDelay` after the last one; not applied with Trigger.AvailableNow or Once"),
    "maxTriggerDelay": ("15m", "with `minMessagesPerTrigger`: the longest wait for a micro-batch after the last one (`5s`, `15m`)"),
    "numPartitions": (f"one per {defaults.PARTITION_TARGET_ROWS:,} claimed, at most {defaults.MAX_AUTO_PARTITIONS}", "Spark partitions a micro-batch is read with"),
    "createQueues": ("false", "create the queue and error queue if missing (our installer, 64-bit seq)"),
    "ackBatchSize": (str(defaults.DEFAULT_ACK_BATCH), "claims deleted per statement when a batch is acknowledged"),
    "claimAhead": ("true", "while a backlog remains, claim the next batch while Spark processes this one"),
    "claimMode": ("auto", "where a claim is held until its batch is acknowledged: `prepared` (PostgreSQL: the claim's DELETE is held by a prepared transaction, so each message is written once; needs `max_prepared_transactions` above 0), `table` (the claim table: a second write of every message; the only form on SQL Server), or `auto`: prepared where the server leaves room, else the claim table, with one INFO line saying why"),
    "preparedClaimTimeout": ("60s", "the longest a prepared claim holds vacuum back: an older one (a stream idle, stopped or stuck) is moved into the claim table (`claimMode` prepared)"),
    "delayedTable": ("`<queue>.<delayedTableSuffix>`", f"address of the delayed table of the queue's endpoint, whose due messages the reader moves each trigger, {_DELAYED_ELSEWHERE}"),
    "delayedTableSuffix": (DEFAULT_DELAYED_SUFFIX, _DELAYED_SUFFIX.format("queue")),
    **{k: (v[0], v[1].replace("ADDRESSES", "ForwardDestination headers and ServiceControl's retry acknowledgement queues")) for k, v in ALLOW_OPTIONS.items()},
    "auditQueue": ("none (no auditing)", "queue address (ServiceControl Audit reads `audit`) that gets a copy of every message whose batch is acknowledged, with NServiceBus's audit headers (ProcessingStarted/Ended, ProcessingEndpoint/Machine, host ids), in the acknowledgement's transaction: exactly once"),
    "auditTimeToBeReceived": ("none", "time to be received of the audit copies (`30s`, `12h`, `7d`): their Expires"),
    "forwardTo": ("none", "queue address that gets an unchanged copy (headers and body) of every message whose batch is acknowledged, in the acknowledgement's transaction"),
    "monitoringQueue": ("none (no monitoring)", "queue address of ServiceControl.Monitoring (`Particular.Monitoring`) to send ServicePulse's metrics to: processing time, critical time and retries per message type, and the endpoint's metadata; best-effort, outside any transaction"),
    "monitoringInterval": (f"{defaults.DEFAULT_MONITORING_INTERVAL:.0f}s", "how often monitoring reports are sent"),
    "retryAcknowledgements": ("true", "false: a ServicePulse retry (a message with `ServiceControl.Retry.AcknowledgementQueue`) is acknowledged like any other message, without the acknowledgement to that queue; for readers of the platform's own queues (audit, error), whose messages an endpoint processed already"),
}
_KNOWN = {k.lower() for k in OPTIONS}

#: the largest values the integer options take: far above any useful setting, far below 2^63 - 1
MAX_MAX_MESSAGES = 10_000_000
MAX_NUM_PARTITIONS = 10_000
MAX_ACK_BATCH = 1_000_000
MAX_RETENTION_SECONDS = 3650 * 86400  # ten years (SQL Server's DATEADD takes an int of seconds)
MAX_INLINE_BYTES = 2**30


def _int(
    opts: Mapping[str, str], key: str, name: str, default: int | None, *, minimum: int = 1, maximum: int = 2**63 - 1
) -> int | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option '{name}' must be a whole number, not {str(raw)[:40]!r}", option=name) from None
    if value < minimum:
        raise ConfigError(f"option '{name}' must be at least {minimum}, not {value}", option=name)
    if value > min(maximum, 2**63 - 1):
        raise ConfigError(f"option '{name}' must be at most {min(maximum, 2**63 - 1):,}, not {str(value)[:40]}", option=name)
    return value


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"option '{name}' must be true or false, not {raw!r}", option=name)


def _choice(opts: Mapping[str, str], key: str, name: str, choices: tuple[str, ...], default: str) -> str:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in choices:
        raise ConfigError(f"option '{name}' must be {' or '.join(choices)}, not {str(raw)[:40]!r}", option=name)
    return text


def _known_options(options: Mapping[str, str], known: set[str], documented: Mapping[str, object],
                   what: str) -> dict[str, str]:
    """The options with lower-cased keys (Spark's are case-insensitive); an unknown one fails,
    naming every unknown key and the documented ones."""
    opts = {str(k).lower(): v for k, v in options.items()}
    unknown = sorted(k for k in opts if k not in known)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(repr(u) for u in unknown)} for {what}; known: {', '.join(documented)}",
            option=unknown[0],
        )
    for name in documented:  # ours; not the ones Spark adds (checkpointLocation, path)
        if name.lower() in opts:
            _no_control(name, opts[name.lower()])
    return opts


#: option values that are secrets (or may hold one): an error names the option, never a character
_SECRET = {"password", "url"}
_CONTROL_NAMES = {0: "NUL", 7: "BEL", 8: "BS", 9: "TAB", 10: "LF", 13: "CR", 27: "ESC", 127: "DEL"}


def _no_control(name: str, value: object) -> None:
    """No option value holds a control character (C0, DEL, C1: NUL, ESC, BEL, a newline...): each
    ends up in an address, a header, an identity or a log line, where it would break or deceive."""
    text = str(value)
    bad = next((c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if bad is None:
        return
    code = ord(bad)
    label = f"{_CONTROL_NAMES[code]}, " if code in _CONTROL_NAMES else ""
    which = "" if name.lower() in _SECRET else f" ({label}U+{code:04X}, at position {text.index(bad)})"
    raise ConfigError(f"option '{name}': the value contains a control character{which}", option=name)


def routing_policy(opts: Mapping[str, str]) -> RoutingPolicy:
    """The allow-list options (keys already lower-cased)."""
    return RoutingPolicy.parse(opts.get("allowedschemas"), opts.get("allowedqueues"))


def delayed_rule(opts: Mapping[str, str], dialect: Dialect) -> DelayedTableRule:
    """The delayed-table options (keys already lower-cased), checked."""
    table = opts.get(OPT_DELAYED_TABLE)
    suffix = opts.get(OPT_DELAYED_SUFFIX)
    return DelayedTableRule.create(
        dialect,
        table=None if table is None else dialect.parse_address(table, option="delayedTable"),
        suffix=None if suffix is None else str(suffix),
    )


def resolve_url(opts: Mapping[str, str]) -> ConnectionURL:
    raw = opts.get(OPT_URL) or os.environ.get(URL_ENV)
    if not raw:
        raise ConfigError(f"option 'url' is required (or set {URL_ENV}): e.g. postgresql://user@host:5432/db", option="url")
    url = parse_url(raw, option="url")
    outage, response = (None if opts.get(k.lower()) in (None, "") else parse_duration(opts[k.lower()], option=k)
                        for k in WAIT_OPTIONS)
    if response is not None and response < 1:
        raise ConfigError("option 'responseTimeout' must be at least 1s", option="responseTimeout")
    return url.with_credentials(opts.get(OPT_USER), opts.get(OPT_PASSWORD)).waiting(outage=outage, response=response)


class ReaderOptions:
    """The reader's options (`OPTIONS`), parsed into `StreamSettings` (which queues, when a batch
    starts) and, per queue, `ReceiveSettings`."""

    @staticmethod
    def parse(options: Mapping[str, str]) -> ReceiveSettings:
        """The settings of a one-queue stream (`stream` for any)."""
        stream = ReaderOptions.stream(options)
        if stream.single is None:
            raise ConfigError("option 'queue' names several queues (or 'queuePattern' is set): this needs the "
                              "settings of the whole stream", option="queue")
        return stream.single

    @staticmethod
    def stream(options: Mapping[str, str]) -> StreamSettings:
        opts = _known_options(options, _KNOWN, OPTIONS, "format 'sqlqueue'")
        url = resolve_url(opts)
        dialect = dialect_for(url)
        selection = _selection(opts, dialect)
        settings_for = functools.partial(_queue_settings, opts, url)
        for queue in selection.queues:  # each listed queue's settings, checked at load()
            settings_for(queue)
        common = _common(opts, url, dialect)
        min_messages = _int(opts, "minmessagespertrigger", "minMessagesPerTrigger", None, maximum=MAX_MAX_MESSAGES)
        delay = opts.get("maxtriggerdelay")
        return StreamSettings(
            url=url,
            selection=selection,
            settings_for=settings_for,
            excluded=(common["error_queue"], *(a for a in (common["audit_queue"], common["forward_to"],
                                                            common["monitoring_queue"]) if a is not None)),
            routing=common["routing"],
            max_messages=common["max_messages"],
            min_messages=min_messages,
            max_trigger_delay=(defaults.DEFAULT_MAX_TRIGGER_DELAY if delay is None
                               else parse_duration(delay, option="maxTriggerDelay")),
        )


def _selection(opts: Mapping[str, str], dialect: Dialect) -> QueueSelection:
    """Options 'queue' (one address, or several comma-separated) and 'queuePattern': exactly one."""
    queue, pattern = opts.get(OPT_QUEUE), opts.get("queuepattern")
    if queue is not None and pattern is not None:
        raise ConfigError("options 'queue' and 'queuePattern' exclude each other: give one", option="queuePattern")
    if pattern is not None:
        return QueueSelection(pattern=QueuePattern.parse(dialect, str(pattern)))
    if queue is None:
        raise ConfigError("option 'queue' is required: the queue to receive from, e.g. .option('queue', 'Sales') "
                          "(or several: 'Sales, Billing'; or .option('queuePattern', '*.Replies'))", option="queue")
    texts = split_queue_list(str(queue))
    if len(texts) == 1:
        texts = [str(queue)]  # one address, as given (SQL Server keeps white space around a name)
    addresses = [dialect.parse_address(t, option="queue") for t in texts]
    check_distinct(dialect, addresses)
    return QueueSelection(queues=tuple(addresses))


def _queue_settings(opts: Mapping[str, str], url: ConnectionURL, queue: QueueAddress) -> ReceiveSettings:
    """One queue's `ReceiveSettings` from the stream's options (keys lower-cased)."""
    dialect = dialect_for(url)
    endpoint = opts.get(OPT_ENDPOINT)
    if endpoint is not None and not str(endpoint).strip():
        raise ConfigError("option 'endpoint' is empty", option="endpoint")
    consumer = str(endpoint).strip() if endpoint else queue.table
    return ReceiveSettings(url=url, queue=queue, consumer=consumer, **_common(opts, url, dialect))


def _common(opts: Mapping[str, str], url: ConnectionURL, dialect: Dialect) -> dict[str, Any]:
    """The settings every queue of a stream shares."""
    return dict(
        error_queue=dialect.parse_address(opts.get(OPT_ERROR_QUEUE) or defaults.DEFAULT_ERROR_QUEUE,
                                          option="errorQueue"),
        max_messages=_int(opts, OPT_MAX_MESSAGES, "maxMessagesPerTrigger", defaults.DEFAULT_MAX_MESSAGES,
                          maximum=MAX_MAX_MESSAGES) or defaults.DEFAULT_MAX_MESSAGES,
        num_partitions=_int(opts, OPT_NUM_PARTITIONS, "numPartitions", None, maximum=MAX_NUM_PARTITIONS),
        create_queues=_bool(opts, OPT_CREATE_QUEUES, "createQueues", False),
        ack_batch=_int(opts, OPT_ACK_BATCH, "ackBatchSize", defaults.DEFAULT_ACK_BATCH,
                       maximum=MAX_ACK_BATCH) or defaults.DEFAULT_ACK_BATCH,
        claim_ahead=_bool(opts, OPT_CLAIM_AHEAD, "claimAhead", True),
        **_claim_mode(opts, dialect),
        acknowledge_retries=_bool(opts, OPT_RETRY_ACKS, "retryAcknowledgements", True),
        routing=routing_policy(opts),
        delayed_rule=delayed_rule(opts, dialect),
        **_platform(opts, dialect),
    )


def _claim_mode(opts: Mapping[str, str], dialect: Dialect) -> dict[str, Any]:
    """`claimMode` and `preparedClaimTimeout`."""
    raw = str(opts.get("claimmode") or defaults.CLAIM_AUTO).strip().lower()
    if raw not in defaults.CLAIM_MODES:
        raise ConfigError(f"option 'claimMode' must be one of {', '.join(defaults.CLAIM_MODES)}, not {raw[:40]!r}",
                          option="claimMode")
    if raw == defaults.CLAIM_PREPARED and not dialect.prepared_claims:
        raise ConfigError(f"option 'claimMode': {dialect.name} has no prepared transactions a claim could be held "
                          "by; use 'table' or 'auto'", option="claimMode")
    timeout = opts.get("preparedclaimtimeout")
    seconds = (defaults.DEFAULT_PREPARED_TIMEOUT if timeout in (None, "")
               else parse_duration(str(timeout), option="preparedClaimTimeout"))
    if not 1 <= seconds <= 86_400:
        raise ConfigError("option 'preparedClaimTimeout' must be between 1s and 1d", option="preparedClaimTimeout")
    return {"claim_mode": raw, "prepared_timeout": seconds}


def _platform(opts: Mapping[str, str], dialect: Dialect) -> dict[str, Any]:
    """The reader's Particular platform options (auditing, forwardTo, monitoring)."""
    def address(key: str, option: str) -> Any:
        raw = opts.get(key)
        return None if raw is None or not str(raw).strip() else dialect.parse_address(str(raw), option=option)

    ttbr = opts.get("audittimetobereceived")
    interval = opts.get("monitoringinterval")
    return {
        "audit_queue": address("auditqueue", "auditQueue"),
        "audit_ttbr_seconds": None if ttbr is None else parse_duration(ttbr, option="auditTimeToBeReceived"),
        "forward_to": address("forwardto", "forwardTo"),
        "monitoring_queue": address("monitoringqueue", "monitoringQueue"),
        "monitoring_interval": (defaults.DEFAULT_MONITORING_INTERVAL if interval is None
                                else parse_duration(interval, option="monitoringInterval")),
    }


# -- the sink: writeStream.format("sqlqueue") and QueueSink --------------------------------------

#: option key (as documented) -> (default shown in docs, meaning)
WRITER_OPTIONS: dict[str, tuple[str, str]] = {
    "url": (f"${URL_ENV}", "as for reading"),
    "user": ("from url", "as for reading"),
    "password": ("from url", "as for reading"),
    **{k: (v[0], "as for reading") for k, v in WAIT_OPTIONS.items()},
    "endpoint": ("required", "sending endpoint, as its input queue's address (`Sales`, `\"billing\".\"Sales\"`): OriginatingEndpoint, default ReplyToAddress, owner of `<endpoint>.Staging`, `.Outbox` and its delayed table (`<endpoint>.Delayed`)"),
    "destination": ("none", "queue address for rows whose `destination` column is null or absent"),
    "sinkName": (defaults.DEFAULT_SINK, "tells apart several sinks of one endpoint; part of the outbox key (sink, batch id)"),
    "errorQueue": (defaults.DEFAULT_ERROR_QUEUE, "where messages go that cannot be delivered: a destination from data that is missing, not a queue or not allowed; due delayed messages likewise; and rows the sink cannot build (`invalidRows`)"),
    "invalidRows": (defaults.DEFAULT_INVALID_ROWS, "a row the sink cannot build into a message (a NaN or out-of-range `delay`, a NUL character, a bad `intent`, no destination): `error-queue` sends it, as the message it would have been, to `errorQueue` with NServiceBus's failure headers naming the column, the value and the reason, and sends the rest of the batch; `fail` fails the batch, naming the column and the message (for a reply, the message it answers)"),
    "createQueues": ("false", "create the `destination` and `errorQueue` queues, the endpoint's delayed table and `SubscriptionRouting` if missing; never a queue named by message data"),
    "subscriptionTable": (defaults.DEFAULT_SUBSCRIPTIONS, "table that routes published events to subscriber queues"),
    "deduplicationRetention": ("7d", "how long outbox records are kept (`30s`, `12h`, `7d`); replays older than this are sent again"),
    "contentType": (defaults.DEFAULT_CONTENT_TYPE, "`NServiceBus.ContentType` of messages without one"),
    "delayedTable": ("`<endpoint>.<delayedTableSuffix>`", f"address of the endpoint's delayed table, where deferred messages go and due ones move from, {_DELAYED_ELSEWHERE}"),
    "delayedTableSuffix": (DEFAULT_DELAYED_SUFFIX, _DELAYED_SUFFIX.format("endpoint")),
    "inlineBytes": (f"{defaults.DEFAULT_INLINE_BYTES:,} (256 MiB)", f"most bytes of messages a micro-batch's tasks hand to the driver, which writes them straight into their queues (PostgreSQL): each of the first {defaults.INLINE_TASKS} tasks hands its messages over when they total at most a {defaults.INLINE_TASKS}th of it; the others stage theirs. 0: every task stages. The driver holds them, and Spark counts them in `spark.driver.maxResultSize`"),
    **{k: (v[0], v[1].replace("ADDRESSES", "`destination` values (so replies' ReplyToAddress) and subscription rows")) for k, v in ALLOW_OPTIONS.items()},
}
_WRITER_KNOWN = {k.lower() for k in WRITER_OPTIONS}
#: options Spark adds itself, and the ones QueueSink passes to the batch writer
_WRITER_INTERNAL = {"checkpointlocation", "path", "queryname", "_batchid", "_queryid"}  # set by Spark

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(raw: str, *, option: str) -> float:
    """``500ms``, ``30s``, ``5m``, ``12h``, ``7d`` or plain seconds -> seconds."""
    m = _DURATION.match(str(raw))
    if not m:
        raise ConfigError(f"option '{option}' must be a duration such as 30s, 12h or 7d, not {raw!r}", option=option)
    return float(m.group(1)) * _UNIT_SECONDS[(m.group(2) or "").lower() or None]


class WriterOptions:
    """The sink's options (`WRITER_OPTIONS`), parsed into `SendSettings`."""

    @staticmethod
    def parse(options: Mapping[str, str]) -> SendSettings:
        opts = _known_options(options, _WRITER_KNOWN | _WRITER_INTERNAL, WRITER_OPTIONS, "writing to format 'sqlqueue'")
        url = resolve_url(opts)
        dialect = dialect_for(url)
        if not opts.get("endpoint") or not str(opts["endpoint"]).strip():
            raise ConfigError(
                "option 'endpoint' is required to send: the sending endpoint's name, e.g. .option('endpoint', 'Sales')",
                option="endpoint",
            )
        endpoint = dialect.parse_address(opts["endpoint"], option="endpoint")
        destination = opts.get("destination")
        sink = str(opts.get("sinkname") or defaults.DEFAULT_SINK).strip()
        if not sink or len(sink) > 200:
            raise ConfigError("option 'sinkName' must be 1 to 200 characters", option="sinkName")
        retention = parse_duration(opts.get("deduplicationretention") or "7d", option="deduplicationRetention")
        if retention < 1:
            raise ConfigError("option 'deduplicationRetention' must be at least 1s", option="deduplicationRetention")
        if retention > MAX_RETENTION_SECONDS:
            raise ConfigError(f"option 'deduplicationRetention' must be at most {MAX_RETENTION_SECONDS // 86400}d", option="deduplicationRetention")
        batch_id = opts.get("_batchid")
        return SendSettings(
            url=url,
            endpoint=endpoint,
            destination=dialect.parse_address(destination, option="destination") if destination else None,
            sink=sink,
            error_queue=dialect.parse_address(opts.get("errorqueue") or defaults.DEFAULT_ERROR_QUEUE, option="errorQueue"),
            create_queues=_bool(opts, "createqueues", "createQueues", False),
            subscriptions=dialect.parse_address(opts.get("subscriptiontable") or defaults.DEFAULT_SUBSCRIPTIONS,
                                                option="subscriptionTable"),
            retention_seconds=int(retention),
            content_type=str(opts.get("contenttype") or defaults.DEFAULT_CONTENT_TYPE),
            batch_id=int(batch_id) if batch_id not in (None, "") else None,
            query_id=opts.get("_queryid") or None,
            routing=routing_policy(opts),
            inline_bytes=_int(opts, "inlinebytes", "inlineBytes", defaults.DEFAULT_INLINE_BYTES, minimum=0,
                              maximum=MAX_INLINE_BYTES) or 0,
            delayed_rule=delayed_rule(opts, dialect),
            invalid_rows=_choice(opts, "invalidrows", "invalidRows", defaults.INVALID_ROWS, defaults.DEFAULT_INVALID_ROWS),
        )
