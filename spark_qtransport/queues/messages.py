"""Outgoing messages: input rows -> staged rows with NServiceBus headers. Runs on executors; no SQL.

One `MessageBuilder` per Spark task turns the sink's input columns (see `INPUT_COLUMNS`) into
tuples in `STAGED_COLUMNS` order. Every check happens here, before anything is written, and every
error names the column and the message at fault.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ..dialects import QueueAddress, dialect_named
from ..errors import ConfigError
from ..wire import INTENTS, H, encode_headers, outgoing_headers

__all__ = ["INPUT_COLUMNS", "SEND", "PUBLISH", "DELAYED", "SendPlan", "MessageBuilder", "check_columns", "topics_of"]

#: kinds of staged rows
SEND, PUBLISH, DELAYED = "s", "p", "d"

#: input column -> what it may hold (Spark simpleString prefixes), for clear errors at start
INPUT_COLUMNS: dict[str, tuple[str, ...]] = {
    "body": ("binary", "string"),
    "destination": ("string",),
    "headers": ("map<string,string>",),
    "message_id": ("string",),
    "message_type": ("string",),
    "intent": ("string",),
    "correlation_id": ("string",),
    "reply_to": ("string",),
    "time_to_be_received": ("int", "bigint", "smallint", "tinyint", "double", "float", "decimal", "interval"),
    "deliver_at": ("timestamp", "timestamp_ntz"),
    "delay": ("int", "bigint", "smallint", "tinyint", "double", "float", "decimal", "interval"),
}

TTBR_HEADER = "NServiceBus.TimeToBeReceived"


def check_columns(fields: Sequence[tuple[str, str]]) -> None:
    """Check the input schema, given as (name, Spark simpleString) pairs: `body` present, no
    unknown column, every column of a usable type. Runs on the driver when the query starts."""
    names = [n for n, _ in fields]
    unknown = [n for n in names if n not in INPUT_COLUMNS]
    if unknown:
        raise ConfigError(
            f"unknown column(s) {', '.join(repr(u) for u in unknown)} for the sqlqueue sink; "
            f"it takes: {', '.join(INPUT_COLUMNS)} (drop or rename the others)"
        )
    if "body" not in names:
        raise ConfigError("the sqlqueue sink needs a 'body' column (binary or string)")
    if "deliver_at" in names and "delay" in names:
        raise ConfigError("columns 'deliver_at' and 'delay' both given: use one of them")
    for name, typ in fields:
        typ = typ.replace(" ", "").lower()
        if not any(typ == t or typ.startswith(t + "(") or typ.startswith(t + " ") or (t == "interval" and "interval" in typ)
                   for t in INPUT_COLUMNS[name]):
            raise ConfigError(f"column {name!r} has type {typ}; expected {' or '.join(INPUT_COLUMNS[name])}")


def topics_of(message_types: str) -> list[str]:
    """Subscription topics of an EnclosedMessageTypes value: each type's full name, without its
    assembly (``Sales.OrderPlaced, Sales, Version=1.0.0.0`` -> ``Sales.OrderPlaced``)."""
    out = []
    for entry in message_types.split(";"):
        name = entry.split(",", 1)[0].strip()
        if name and name not in out:
            out.append(name)
    return out


def _timespan(seconds: float) -> str:
    """A .NET TimeSpan in its constant ("c") format: ``[d.]hh:mm:ss[.fffffff]``."""
    ticks = round(seconds * 10_000_000)
    days, rest = divmod(ticks, 86_400 * 10_000_000)
    hours, rest = divmod(rest, 3600 * 10_000_000)
    minutes, rest = divmod(rest, 60 * 10_000_000)
    secs, frac = divmod(rest, 10_000_000)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    if days:
        text = f"{days}.{text}"
    if frac:
        text += f".{frac:07d}"
    return text


def _seconds(value: Any, column: str, message_id: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"column {column!r} of message {message_id}: {value!r} is not a number of seconds") from None


@dataclass(frozen=True)
class SendPlan:
    """What a Spark task needs to stage its rows (pickled to executors). No password in repr."""

    dialect: str
    endpoint: str  # the endpoint's name, for OriginatingEndpoint
    default_destination: QueueAddress | None
    reply_to: str | None  # ReplyToAddress for messages without one (the endpoint's input queue)
    content_type: str
    sink: str


class MessageBuilder:
    """Turns input rows into staged rows for one task attempt."""

    def __init__(self, plan: SendPlan, *, batch_id: int, attempt: str) -> None:
        self.plan = plan
        self.dialect = dialect_named(plan.dialect)
        self.batch_id = batch_id
        self.attempt = attempt
        self.machine = socket.gethostname()
        self._routes: dict[str | None, str] = {}
        self.counts: dict[tuple[str, str], int] = {}

    def route(self, destination: str | None, message_id: str) -> str:
        """The canonical address of a destination (parsed once per distinct value)."""
        route = self._routes.get(destination)
        if route is None:
            if destination is None:
                if self.plan.default_destination is None:
                    raise ConfigError(
                        f"message {message_id} has no destination: fill the 'destination' column "
                        "or set option 'destination'"
                    )
                address = self.plan.default_destination
            else:
                address = self.dialect.parse_address(destination, option=f"destination of message {message_id}")
            route = self.dialect.format_address(address)
            self._routes[destination] = route
        return route

    def build(self, row: Mapping[str, Any], now: datetime | str) -> tuple[Any, ...]:
        """One input row (column name -> Python value) -> one staged row. `now`: the send time
        (or its text in NServiceBus's format, formatted once per task)."""
        get = row.get
        message_id = get("message_id") or str(uuid.uuid4())
        intent = (get("intent") or "send").strip().lower()
        if intent not in INTENTS:
            raise ConfigError(f"column 'intent' of message {message_id}: {get('intent')!r} is not one of send, publish, reply")
        body = get("body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        given = get("headers")
        if given is not None and not isinstance(given, Mapping):
            given = dict(given)  # Arrow maps arrive as (key, value) pairs
        given = {k: v for k, v in (given or {}).items() if v is not None}
        ttbr = _seconds(get("time_to_be_received"), "time_to_be_received", message_id)
        delay = _seconds(get("delay"), "delay", message_id)
        deliver_at = get("deliver_at")
        if deliver_at is not None and deliver_at.tzinfo is None:
            deliver_at = deliver_at.replace(tzinfo=timezone.utc)
        deferred = deliver_at is not None or (delay is not None and delay > 0)
        if ttbr is not None:
            if ttbr <= 0:
                raise ConfigError(f"column 'time_to_be_received' of message {message_id} must be positive, not {ttbr}")
            if deferred:
                raise ConfigError(
                    f"message {message_id} is delayed and has a time to be received: NServiceBus refuses "
                    "delayed messages that can expire; drop one of them"
                )
            given.setdefault(TTBR_HEADER, _timespan(ttbr))
        try:
            headers = outgoing_headers(
                message_id=message_id,
                endpoint=self.plan.endpoint,
                machine=self.machine,
                intent=intent,
                message_type=get("message_type"),
                content_type=self.plan.content_type,
                correlation_id=get("correlation_id"),
                reply_to_address=get("reply_to") or self.plan.reply_to,
                headers=given,
                now=now,
            )
        except ValueError as exc:
            raise ConfigError(f"message {message_id}: {exc}") from None
        destination = get("destination")
        if intent == "publish":
            if destination is not None:
                raise ConfigError(
                    f"message {message_id} is published and has a destination ({destination!r}): "
                    "published events go to their subscribers; send it instead, or clear the destination"
                )
            if deferred:
                raise ConfigError(f"message {message_id}: delaying a published event is not supported; send it delayed")
            kind, route = PUBLISH, headers[H.ENCLOSED_MESSAGE_TYPES] or ""
        elif intent == "reply" and destination is None:
            raise ConfigError(
                f"reply {message_id} has no destination: set it to the ReplyToAddress of the message replied to "
                "(spark_qtransport.reply() does)"
            )
        else:
            route = self.route(destination, message_id)
            kind = DELAYED if deferred else SEND
            if deferred:
                headers[H.FORWARD_DESTINATION] = route
        key = (kind, route)
        self.counts[key] = self.counts.get(key, 0) + 1
        return (
            self.plan.sink, self.batch_id, self.attempt, kind, route, message_id, encode_headers(headers), body,
            None if ttbr is None else round(ttbr * 1000),
            None if delay is None or deliver_at is not None else max(round(delay * 1000), 0),
            deliver_at,
        )
