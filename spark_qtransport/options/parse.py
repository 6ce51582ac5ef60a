"""Options of the ``sqlqueue`` source and sink, parsed into the transport's settings
(`ReceiveSettings`, `StreamSettings`, `SendSettings`) from the one registry (`registry.REGISTRY`):
read case-insensitively, validated at load().

Every error names the option at fault: the registry's own checks (type, bounds), and the errors
the transport raises naming a settings field, which get the option's name here (`registry.name_fields`).
Queue addresses are parsed by the dialect the URL selects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping
from typing import Any

from ..connections import ConnectionURL
from ..dialects import Dialect, QueueAddress, dialect_for
from ..errors import ConfigError, QTransportError
from ..transport import settings as defaults
from ..transport.delayed import DelayedTableRule
from ..transport.routing import RoutingPolicy
from ..transport.selection import QueueSelection
from ..transport.settings import ReceiveSettings, SendSettings, StreamSettings
from .registry import (
    MAX_INLINE_BYTES,
    READ,
    REGISTRY,
    URL_ENV,
    WRITE,
    Option,
    for_side,
    name_fields,
    parse_duration,
)

__all__ = ["ReaderOptions", "WriterOptions", "OPTIONS", "WRITER_OPTIONS", "URL_ENV", "parse_duration", "Given",
           "naming", "MAX_INLINE_BYTES"]


def _table(side: str) -> dict[str, tuple[str, str]]:
    return {o.name: (o.shown, o.meaning) for o in REGISTRY if side in o.applies}


#: option (as documented) -> (default shown, meaning): the source's and the sink's, from the registry
OPTIONS = _table(READ)
WRITER_OPTIONS = _table(WRITE)
#: options Spark adds itself, and the ones QueueSink passes to the batch writer
_WRITER_INTERNAL = {"checkpointlocation", "path", "queryname", "_batchid", "_queryid", "_settles"}


@contextlib.contextmanager
def naming() -> Iterator[None]:
    """Errors of the transport that name a settings field leave naming the option instead."""
    try:
        yield
    except QTransportError as exc:
        renamed = name_fields(exc)
        if renamed is exc:
            raise
        raise renamed from None


class Given:
    """The options given to the source or the sink: keys lower-cased (Spark's are case-insensitive),
    an unknown one refused naming every unknown key and the documented ones, no control character
    in a value; each read as the registry says (queue addresses by `dialect`, once the URL chose it)."""

    def __init__(self, options: Mapping[str, Any], side: str, *, internal: frozenset[str] = frozenset()) -> None:
        self.side = side
        self.known: dict[str, Option] = for_side(side)
        self.raw = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(k for k in self.raw if k not in self.known and k not in internal)
        if unknown:
            what = "format 'sqlqueue'" if side == READ else "writing to format 'sqlqueue'"
            documented = ", ".join(dict.fromkeys(o.name for o in self.known.values()))
            raise ConfigError(f"unknown option(s) {', '.join(repr(u) for u in unknown)} for {what}; known: "
                              f"{documented}", option=unknown[0])
        for key, option in self.known.items():  # ours; not the ones Spark adds (checkpointLocation, path)
            if key in self.raw:
                _no_control(option, self.raw[key])
        #: the dialect of the URL (`resolve_url`), which parses the queue addresses
        self.dialect: Dialect | None = None

    def parser(self) -> Dialect:
        """The dialect that parses the options' queue addresses (the URL is resolved first)."""
        if self.dialect is None:
            raise RuntimeError("the options' URL is resolved before any queue address is read")
        return self.dialect

    def __getitem__(self, name: str) -> Any:
        """The value of option `name`: as given, parsed and checked, else its default."""
        return self.known[name.lower()].parse(self.raw.get(name.lower()), dialect=self.dialect)

    def text(self, name: str) -> str | None:
        """The value as given (None when absent)."""
        raw = self.raw.get(name.lower())
        return None if raw is None else str(raw)

    def settings(self, into: type, *, leave: tuple[str, ...] = (), **built: Any) -> dict[str, Any]:
        """The arguments of the settings class `into`: each of its fields an option of this side
        sets (the option's `field`), parsed, and the fields `built` from several options or
        checked first, as they are; not the fields `leave` names (the caller's to give)."""
        fields = {f.name for f in dataclasses.fields(into) if f.init and f.name not in leave}
        parsed = {o.field: self[o.name] for o in self.known.values()
                  if o.field in fields and o.field not in built}
        return {**parsed, **built}


_CONTROL_NAMES = {0: "NUL", 7: "BEL", 8: "BS", 9: "TAB", 10: "LF", 13: "CR", 27: "ESC", 127: "DEL"}


def _no_control(option: Option, value: object) -> None:
    """No option value holds a control character (C0, DEL, C1: NUL, ESC, BEL, a newline...): each
    ends up in an address, a header, an identity or a log line, where it would break or deceive.
    A secret's error names the option, never a character."""
    text = str(value)
    bad = next((c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if bad is None:
        return
    code = ord(bad)
    label = f"{_CONTROL_NAMES[code]}, " if code in _CONTROL_NAMES else ""
    which = "" if option.secret else f" ({label}U+{code:04X}, at position {text.index(bad)})"
    raise ConfigError(f"option '{option.name}': the value contains a control character{which}", option=option.name)


def routing_policy(given: Given) -> RoutingPolicy:
    """The allow-list options."""
    return RoutingPolicy.allowing(given["allowedSchemas"], given["allowedQueues"])


def delayed_rule(given: Given) -> DelayedTableRule:
    """The delayed-table options, checked (a `delayedTable` given empty fails: it has no default)."""
    return DelayedTableRule.create(given.parser(), suffix=given.text("delayedTableSuffix"), table=given["delayedTable"])


def resolve_url(given: Given) -> ConnectionURL:
    """The URL (option or environment), with the credentials and timeouts the options give; sets
    the dialect that parses the options' queue addresses."""
    raw = given.text("url") or os.environ.get(URL_ENV)
    if not raw:
        raise ConfigError(f"option 'url' is required (or set {URL_ENV}): e.g. postgresql://user@host:5432/db", option="url")
    url = given.known["url"].parse(raw)
    given.dialect = dialect_for(url)
    return url.with_credentials(given.text("user"), given.text("password")).waiting(
        outage=given["outageTimeout"], response=given["responseTimeout"])


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
        with naming():
            given = Given(options, READ)
            url = resolve_url(given)
            selection = _selection(given)
            common = _common(given)  # parsed and checked once for the stream, whatever queues a pattern finds
            settings_for = functools.partial(_queue_settings, _endpoint(given), url, common)
            for queue in selection.queues:  # each listed queue's settings, checked at load()
                settings_for(queue)
            excluded = tuple(a for a in (common["error_queue"], common["audit_queue"], common["forward_to"],
                                         common["monitoring_queue"]) if a is not None)
            return StreamSettings(**given.settings(StreamSettings, url=url, selection=selection,
                                                   settings_for=settings_for, excluded=excluded,
                                                   routing=common["routing"]))


def _selection(given: Given) -> QueueSelection:
    """Options 'queue' (one address, or several comma-separated) and 'queuePattern': exactly one."""
    queue, pattern = given.text("queue"), given.text("queuePattern")
    if queue is not None and pattern is not None:
        raise ConfigError("options 'queue' and 'queuePattern' exclude each other: give one", option="queuePattern")
    if pattern is not None:
        return QueueSelection(pattern=given["queuePattern"])
    if queue is None:
        raise ConfigError("option 'queue' is required: the queue to receive from, e.g. .option('queue', 'Sales') "
                          "(or several: 'Sales, Billing'; or .option('queuePattern', '*.Replies'))", option="queue")
    return QueueSelection(queues=given["queue"])


def _endpoint(given: Given) -> str | None:
    """Option 'endpoint': the consumer every queue of the stream claims as (None: each queue's name)."""
    endpoint = given.text("endpoint")
    if endpoint is not None and not endpoint.strip():
        raise ConfigError("option 'endpoint' is empty", option="endpoint")
    return endpoint.strip() if endpoint else None


def _queue_settings(endpoint: str | None, url: ConnectionURL, common: dict[str, Any],
                    queue: QueueAddress) -> ReceiveSettings:
    """One queue's `ReceiveSettings`: the stream's `common` ones, and the queue's own."""
    with naming():
        return ReceiveSettings(url=url, queue=queue, consumer=endpoint or queue.table, **common)


#: the fields of `ReceiveSettings` that are one queue's, not the stream's
_PER_QUEUE = ("url", "queue", "consumer")


def _common(given: Given) -> dict[str, Any]:
    """The settings every queue of a stream shares: the registry's options by their fields."""
    dialect = given.parser()
    mode = given["claimMode"]
    if mode == defaults.CLAIM_PREPARED and not dialect.prepared_claims:
        raise ConfigError(f"option 'claimMode': {dialect.name} has no prepared transactions a claim could be held "
                          "by; use 'table' or 'auto'", option="claimMode")
    return given.settings(ReceiveSettings, leave=_PER_QUEUE, claim_mode=mode, routing=routing_policy(given),
                          delayed_rule=delayed_rule(given))


# -- the sink: writeStream.format("sqlqueue") and QueueSink --------------------------------------


class WriterOptions:
    """The sink's options (`WRITER_OPTIONS`), parsed into `SendSettings`."""

    @staticmethod
    def parse(options: Mapping[str, str]) -> SendSettings:
        with naming():
            given = Given(options, WRITE, internal=frozenset(_WRITER_INTERNAL))
            url = resolve_url(given)
            if not (given.text("endpoint") or "").strip():
                raise ConfigError("option 'endpoint' is required to send: the sending endpoint's name, e.g. "
                                  ".option('endpoint', 'Sales')", option="endpoint")
            batch_id = given.text("_batchId")
            return SendSettings(**given.settings(
                SendSettings,
                url=url,
                retention_seconds=int(given["deduplicationRetention"]),
                content_type=str(given["contentType"]),
                batch_id=int(batch_id) if batch_id not in (None, "") else None,
                query_id=given.text("_queryId") or None,
                settles=given.text("_settles") == "true",
                routing=routing_policy(given),
                delayed_rule=delayed_rule(given),
                invalid_rows_chosen=given.text("invalidRows") is not None,
            ))
