"""Input rows -> staged rows with NServiceBus headers: one `MessageBuilder` per Spark task. Runs on
executors; no SQL. Every check happens here, before anything is written, and every error
(`MessageError`) names the column and the message at fault.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from ...dialects import dialect_named
from ...errors import ConfigError, MessageError
from ...wire import INTENTS, RESERVED, H, SentHeaderText, encode_headers, format_time, outgoing_headers, uuid4_texts
from .messages import DELAYED, PUBLISH, SEND, SendPlan, StagedRow

__all__ = ["MessageBuilder"]

TTBR_HEADER = "NServiceBus.TimeToBeReceived"


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


#: the longest delay or time to be received, and how far from now deliver_at may be (less where
#: the dialect's date arithmetic takes less: `max_interval_seconds`)
MAX_SECONDS = 100 * 365.25 * 86_400


def _seconds(value: Any, column: str, message_id: str, limit: float = MAX_SECONDS) -> float | None:
    """A duration column in seconds: finite and at most `limit` (negative values are the caller's)."""
    if value is None:
        return None
    try:
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise MessageError(f"column {column!r} of message {message_id!r}: {value!r} is not a number of seconds",
                           column=column) from None
    if not math.isfinite(seconds):
        raise MessageError(f"column {column!r} of message {message_id!r}: {value!r} is not a finite number of seconds",
                           column=column)
    if seconds > limit:
        raise MessageError(
            f"column {column!r} of message {message_id!r}: {value!r} is too long ({seconds:.0f} s; "
            f"at most {limit:.0f} s, about {limit / (365.25 * 86_400):.0f} years)",
            column=column,
        )
    return seconds


def _no_nul(value: Any, column: str, message_id: str, *, field: str | None = None) -> None:
    """PostgreSQL text cannot hold a NUL character: refuse it here, naming the message. `field`:
    the part of the column named in the message (a header), when not the whole column."""
    if isinstance(value, str) and "\x00" in value:
        shown = repr(value) if len(value) <= 200 else repr(value[:200]) + "..."
        raise MessageError(f"column {field or column!r} of message {message_id!r}: {shown} contains a NUL character (\\x00)",
                           column=column)


class MessageBuilder:
    """Turns input rows into staged rows for one task attempt."""

    def __init__(self, plan: SendPlan, *, batch_id: int, attempt: str) -> None:
        self.plan = plan
        self.dialect = dialect_named(plan.dialect)
        self.batch_id = batch_id
        self.attempt = attempt
        self.machine = socket.gethostname()
        self._now = datetime.now(timezone.utc)  # for the range of deliver_at: once per task is close enough
        self._max_seconds = min(MAX_SECONDS, self.dialect.max_interval_seconds)
        self._routes: dict[str | None, str] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self._ids = uuid4_texts()
        self._text = SentHeaderText(endpoint=plan.endpoint, machine=self.machine, content_type=plan.content_type,
                                    new_id=lambda: next(self._ids))
        # `build`'s fast path needs text for every header it fills in; else every row takes the
        # general path (`_build`)
        self._fast = all(type(v) is str for v in (plan.endpoint, plan.content_type, plan.sink, self.machine)) and (
            plan.reply_to is None or type(plan.reply_to) is str)

    def route(self, destination: str | None, message_id: str) -> str:
        """The canonical address of a destination (parsed once per distinct value). A value that
        is not an address is kept as it is: the dispatch's routing path sends its messages to the
        error queue (an address from data never fails the batch)."""
        route = self._routes.get(destination)
        if route is None:
            if destination is None:
                if self.plan.default_destination is None:
                    raise MessageError(
                        f"message {message_id} has no destination: fill the 'destination' column "
                        "or set option 'destination'",
                        column="destination", option="destination",
                    )
                address = self.plan.default_destination
            else:
                try:
                    address = self.dialect.parse_address(destination, option="destination")
                except ConfigError:  # kept for the error queue's FailedQ; a NUL is no text to store
                    route = self._routes[destination] = destination.replace("\x00", "\\x00")
                    return route
            route = self.dialect.format_address(address)
            self._routes[destination] = route
        return route

    def build(self, row: Mapping[str, Any], now: datetime | str) -> StagedRow:
        """One input row (column name -> Python value) -> one staged row. `now`: the send time
        (or its text in NServiceBus's format, formatted once per task).

        The staging hot path. A row whose text columns and headers are plain text without NUL,
        with a known intent and a message type, is built here in few Python calls; any other row
        (one that may be refused, or holds values of other types) takes `_build`, the general
        path, which refuses it with the same `MessageError` (or builds the same staged row: the
        two are kept equal by tests/test_stage_fast.py)."""
        if not self._fast:
            return self._build(row, now)
        get = row.get
        message_id = get("message_id") or next(self._ids)
        correlation_id = get("correlation_id")
        message_type = get("message_type")
        reply_to = get("reply_to")
        intent = get("intent")
        given = get("headers")
        if (type(message_id) is not str or "\x00" in message_id
                or (correlation_id is not None and (type(correlation_id) is not str or "\x00" in correlation_id))
                or (message_type is not None and (type(message_type) is not str or "\x00" in message_type))
                or (reply_to is not None and (type(reply_to) is not str or "\x00" in reply_to))):
            return self._build(row, now)
        intent = (intent or "send").strip().lower()
        if intent not in INTENTS:
            return self._build(row, now)
        if given is not None:
            if type(given) is not dict:
                if isinstance(given, Mapping):
                    return self._build(row, now)
                try:
                    given = dict(given)  # Arrow maps arrive as (key, value) pairs
                except Exception:  # noqa: BLE001 - refused there, in its turn (after the body)
                    return self._build(row, now)
            try:  # keys and values all text (no None) without NUL, nothing reserved
                if "\x00" in "".join(given) or "\x00" in "".join(given.values()):
                    return self._build(row, now)
            except TypeError:
                return self._build(row, now)
            if _FORWARD in given or _CONTROL in given:
                return self._build(row, now)
            enclosed = message_type or given.get(_ENCLOSED)
        else:
            enclosed = message_type
        if not enclosed:
            return self._build(row, now)  # refused there: no message type
        body = get("body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        ttbr = delay = deliver_at = None
        deferred = False
        if get("time_to_be_received") is not None or get("delay") is not None or get("deliver_at") is not None:
            timing = self._timing(row, message_id)
            ttbr, delay, deliver_at, deferred = timing.ttbr, timing.delay, timing.deliver_at, timing.deferred
            if ttbr is not None and (given is None or TTBR_HEADER not in given):
                given = {**(given or {}), TTBR_HEADER: _timespan(ttbr)}
        destination = get("destination")
        forward = None
        if intent == "send":
            route = self._routes.get(destination)
            if route is None:
                route = self.route(destination, message_id)
        elif intent == "publish":
            if destination is not None or deferred:
                return self._build(row, now)  # refused there
            route = given[_ENCLOSED] if given and _ENCLOSED in given else enclosed  # the header's value
        else:  # a reply without a destination: route "" is refused at dispatch (see _kind_and_route)
            route = "" if destination is None else self.route(destination, message_id)
        if deferred:
            kind = DELAYED
            forward = route
        else:
            kind = PUBLISH if intent == "publish" else SEND
        headers = self._text.text(
            message_id=message_id, intent=INTENTS[intent], enclosed=enclosed,
            correlation_id=correlation_id or message_id, reply_to=reply_to or self.plan.reply_to,
            time_sent=now if isinstance(now, str) else format_time(now or datetime.now(timezone.utc)),
            given=given, forward=forward,
        )
        key = (kind, route)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        return _new_row(StagedRow, (
            self.plan.sink, self.batch_id, self.attempt, kind, route, message_id, headers, body,
            None if ttbr is None else round(ttbr * 1000),
            None if delay is None or deliver_at is not None else max(round(delay * 1000), 0),
            deliver_at,
        ))

    def _build(self, row: Mapping[str, Any], now: datetime | str) -> StagedRow:
        """`build`, the general path: every row, every check in order."""
        get = row.get
        message_id = get("message_id") or next(self._ids)
        _no_nul(message_id, "message_id", message_id)
        for column in ("correlation_id", "message_type", "reply_to"):
            _no_nul(get(column), column, message_id)
        intent = (get("intent") or "send").strip().lower()
        if intent not in INTENTS:
            raise MessageError(f"column 'intent' of message {message_id}: {get('intent')!r} is not one of send, "
                               "publish, reply", column="intent")
        body = get("body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        given = _given_headers(get("headers"), message_id)
        timing = self._timing(row, message_id)
        if timing.ttbr is not None:
            given.setdefault(TTBR_HEADER, _timespan(timing.ttbr))
        headers = self._headers(row, message_id, intent, given, now)
        kind, route = self._kind_and_route(get("destination"), message_id, intent, timing.deferred, headers)
        key = (kind, route)
        self.counts[key] = self.counts.get(key, 0) + 1
        return StagedRow(
            sink=self.plan.sink, batch_id=self.batch_id, attempt=self.attempt, kind=kind, route=route,
            message_id=message_id, headers=encode_headers(headers), body=body,
            ttbr_ms=None if timing.ttbr is None else round(timing.ttbr * 1000),
            delay_ms=None if timing.delay is None or timing.deliver_at is not None else max(round(timing.delay * 1000), 0),
            due=timing.deliver_at,
        )

    def _timing(self, row: Mapping[str, Any], message_id: str) -> _Timing:
        """The row's time to be received, delay and deliver_at, checked."""
        ttbr = _seconds(row.get("time_to_be_received"), "time_to_be_received", message_id, self._max_seconds)
        delay = _seconds(row.get("delay"), "delay", message_id, self._max_seconds)
        if delay is not None and delay < 0:
            delay = 0.0  # a negative delay: due now
        deliver_at = row.get("deliver_at")
        if deliver_at is not None:
            if not isinstance(deliver_at, datetime):
                raise MessageError(f"column 'deliver_at' of message {message_id!r}: {deliver_at!r} is not a timestamp",
                                   column="deliver_at")
            if deliver_at.tzinfo is None:
                deliver_at = deliver_at.replace(tzinfo=timezone.utc)
            if abs((deliver_at - self._now).total_seconds()) > MAX_SECONDS:
                raise MessageError(
                    f"column 'deliver_at' of message {message_id!r}: {deliver_at.isoformat()} is more than 100 years "
                    "from now",
                    column="deliver_at",
                )
        timing = _Timing(ttbr, delay, deliver_at)
        if ttbr is not None:
            if ttbr <= 0:
                raise MessageError(f"column 'time_to_be_received' of message {message_id} must be positive, not {ttbr}",
                                   column="time_to_be_received")
            if timing.deferred:
                raise MessageError(
                    f"message {message_id} is delayed and has a time to be received: NServiceBus refuses "
                    "delayed messages that can expire; drop one of them",
                    column="time_to_be_received",
                )
        return timing

    def _headers(self, row: Mapping[str, Any], message_id: str, intent: str, given: dict[str, Any],
                 now: datetime | str) -> dict[str, str | None]:
        """The message's NServiceBus headers: the given ones and the defaults an endpoint fills in."""
        try:
            return outgoing_headers(
                message_id=message_id,
                endpoint=self.plan.endpoint,
                machine=self.machine,
                intent=intent,
                message_type=row.get("message_type"),
                content_type=self.plan.content_type,
                correlation_id=row.get("correlation_id"),
                reply_to_address=row.get("reply_to") or self.plan.reply_to,
                headers=given,
                now=now,
            )
        except ValueError as exc:  # a reserved header given, or no message type in column or header
            column = "headers" if any(name in given for name in RESERVED) else "message_type"
            raise MessageError(f"message {message_id}: {exc}", column=column) from None

    def _kind_and_route(self, destination: str | None, message_id: str, intent: str, deferred: bool,
                        headers: dict[str, str | None]) -> tuple[str, str]:
        """Where the message goes: (SEND, DELAYED or PUBLISH, canonical address or published types)."""
        if intent == "publish":
            if destination is not None:
                raise MessageError(
                    f"message {message_id} is published and has a destination ({destination!r}): "
                    "published events go to their subscribers; send it instead, or clear the destination",
                    column="destination",
                )
            if deferred:
                raise MessageError(f"message {message_id}: delaying a published event is not supported; send it delayed",
                                   column="intent")
            return PUBLISH, headers[H.ENCLOSED_MESSAGE_TYPES] or ""
        # a reply to a message without a ReplyToAddress has no destination: route "" is refused at
        # dispatch, and the reply goes to the error queue
        route = "" if intent == "reply" and destination is None else self.route(destination, message_id)
        if deferred:
            headers[H.FORWARD_DESTINATION] = route
            return DELAYED, route
        return SEND, route


_ENCLOSED = H.ENCLOSED_MESSAGE_TYPES
_FORWARD, _CONTROL = RESERVED
_new_row = tuple.__new__

class _Timing(NamedTuple):
    ttbr: float | None  # seconds
    delay: float | None  # seconds, not negative
    deliver_at: datetime | None  # aware

    @property
    def deferred(self) -> bool:
        return self.deliver_at is not None or (self.delay is not None and self.delay > 0)


def _given_headers(given: Any, message_id: str) -> dict[str, Any]:
    """The headers column as a dict without null values, refusing NUL characters."""
    if given is not None and not isinstance(given, Mapping):
        given = dict(given)  # Arrow maps arrive as (key, value) pairs
    headers = {k: v for k, v in (given or {}).items() if v is not None}
    for key, value in headers.items():
        _no_nul(key, "headers", message_id)
        _no_nul(value, "headers", message_id, field=f"headers[{key!r}]")
    return headers
