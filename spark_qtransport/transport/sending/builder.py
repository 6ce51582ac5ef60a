"""Input rows -> staged rows with NServiceBus headers: one `MessageBuilder` per Spark task. Runs on
executors; no SQL. A task's input arrives column by column (`InputColumns`): its plain rows are
built together (`MessageBuilder.build_columns`), the others one by one (`MessageBuilder.build`). Every check happens here, before anything is written. A row that fails one is
refused with a `MessageError` naming the column, the value, the reason and the message (its
``message_id``, else the message a reply answers: `MessageBuilder.error`); unless the sink fails
on such rows (option invalidRows=fail), the row becomes an error copy instead: the message it would
have been, with NServiceBus's failure headers, staged for the sink's error queue (`_error_copy`),
so it travels, exactly once, with the rest of its batch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from ...dialects import dialect_named
from ...errors import ConfigError, MessageError
from ...wire import (
    INTENTS,
    NOT_GIVEN_TEXT,
    RESERVED,
    H,
    SentHeaderText,
    encode_headers,
    failure_headers,
    format_time,
    given_texts,
    machine,
    outgoing_headers,
    uuid4_list,
    uuid4_texts,
)
from .messages import DELAYED, PUBLISH, SEND, InputColumns, RowGroup, SendPlan, StagedRow
from .recovery import RECOVERY, RETRY, InvalidFailure, claim_of, failed_q_of, failure_of, next_attempt, retried_headers
from .recovery import SOURCE as RECOVERY_SOURCE

__all__ = ["MessageBuilder", "INVALID_TYPE"]

TTBR_HEADER = "NServiceBus.TimeToBeReceived"
#: NServiceBus.ExceptionInfo.ExceptionType of the error copy of a row the sink could not build
INVALID_TYPE = "spark_qtransport.MessageError"
#: ExceptionInfo.Source of those error copies
SOURCE = "spark_qtransport.send"
#: how much of a refused value an error shows (its repr: control characters escaped)
SHOWN_CHARS = 200


def _shown(value: Any) -> str:
    """A value as an error shows it: its repr (NUL and control characters escaped), at most
    `SHOWN_CHARS` characters of it."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an object without a usable repr
        text = f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


class _Refused(Exception):  # noqa: N818 - internal: becomes a MessageError (`MessageBuilder.error`)
    """A row refused by a check: the column (and the part of it, `field`), why, and the message
    id the row was being built with (given, or generated for it)."""

    def __init__(self, column: str, reason: str, message_id: Any, *, field: str | None = None,
                 setting: str | None = None) -> None:
        super().__init__(reason)
        self.column, self.reason, self.message_id, self.field, self.setting = column, reason, message_id, field, setting


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
        raise _Refused(column, f"{_shown(value)} is not a number of seconds", message_id) from None
    if not math.isfinite(seconds):
        raise _Refused(column, f"{_shown(value)} is not a finite number of seconds", message_id)
    if seconds > limit:
        raise _Refused(column, f"{_shown(value)} is too long ({seconds:.0f} s; at most {limit:.0f} s, about "
                               f"{limit / (365.25 * 86_400):.0f} years)", message_id)
    return seconds


def _no_nul(value: Any, column: str, message_id: str, *, field: str | None = None) -> None:
    """PostgreSQL text cannot hold a NUL character: refuse it here, naming the message. `field`:
    the part of the column named in the message (a header), when not the whole column."""
    if isinstance(value, str) and "\x00" in value:
        raise _Refused(column, f"{_shown(value)} contains a NUL character (\\x00)", message_id, field=field)


class MessageBuilder:
    """Turns input rows into staged rows for one task attempt."""

    def __init__(self, plan: SendPlan, *, batch_id: int, attempt: str) -> None:
        self.plan = plan
        self.dialect = dialect_named(plan.dialect)
        self.batch_id = batch_id
        self.attempt = attempt
        self.machine = machine()
        self._now = datetime.now(timezone.utc)  # for the range of deliver_at: once per task is close enough
        self._max_seconds = min(MAX_SECONDS, self.dialect.max_interval_seconds)
        self._routes: dict[str | None, str] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self.invalid = 0  # rows refused and staged as error copies (counted in `counts` too)
        self.invalid_reason: str | None = None  # the first one's error
        #: claims the rows of intent fail and retry came from: queue (as the row names it) -> claim
        #: sequences; the dispatch marks them failed (`recovery`: not audited)
        self.failed_claims: dict[str, set[int]] = {}
        self._ids = uuid4_texts()
        self._id_block = uuid4_list  # n new ids at once, for the column-wise path (`build_columns`)
        self._text = SentHeaderText(endpoint=plan.endpoint, machine=self.machine, content_type=plan.content_type,
                                    new_id=lambda: next(self._ids))
        # the fast path (`_fast`) needs text for every header it fills in; else every row takes
        # the general path (`_build`)
        self._plain = all(type(v) is str for v in (plan.endpoint, plan.content_type, plan.sink, self.machine)) and (
            plan.reply_to is None or type(plan.reply_to) is str)

    def route(self, destination: str | None, message_id: str) -> str:
        """The canonical address of a destination (parsed once per distinct value). A value that
        is not an address is kept as it is: the dispatch's routing path sends its messages to the
        error queue (an address from data never fails the batch)."""
        route = self._routes.get(destination)
        if route is None:
            if destination is None:
                if self.plan.default_destination is None:
                    raise _Refused("destination", "no destination: fill the 'destination' column or set "
                                   "`destination`", message_id, setting="destination")
                address = self.plan.default_destination
            else:
                try:
                    address = self.dialect.parse_address(destination, field="destination")
                except ConfigError:  # kept for the error queue's FailedQ; a NUL is no text to store
                    route = self._routes[destination] = destination.replace("\x00", "\\x00")
                    return route
            route = self.dialect.format_address(address)
            self._routes[destination] = route
        return route

    def build(self, row: Mapping[str, Any], now: datetime | str) -> StagedRow:
        """One input row (column name -> Python value) -> one staged row. `now`: the send time
        (or its text in NServiceBus's format, formatted once per task). A row refused by a check
        becomes its error copy for the error queue (`_error_copy`), or with invalidRows=fail
        (`SendPlan.invalid_to` None) raises the `MessageError` naming it (`error`)."""
        try:
            return self._fast(row, now)
        except _Refused as refused:
            error = self.error(row, refused)
            if self.plan.invalid_to is None:
                raise error from None
            return self._error_copy(row, now, refused.message_id, error)

    def build_all(self, batches: Iterable[Iterable[Mapping[str, Any]] | InputColumns], now: datetime | str) -> Iterator[StagedRow | RowGroup]:
        """A task's input, batch by batch: `InputColumns` column-wise (`build_columns`), any other
        batch (row dicts) row by row (`build`). Yields staged rows and groups of them."""
        for batch in batches:
            if type(batch) is InputColumns:
                yield from self.build_columns(batch, now)
            else:
                yield from map(self.build, batch, itertools.repeat(now))

    def build_columns(self, batch: InputColumns, now: datetime | str) -> Iterator[StagedRow | RowGroup]:
        """`build` of every row of `batch`, the plain ones column by column: a row that `_fast`
        would build from its text columns and headers alone (no time to be received, delay or
        deliver_at; text without NUL; a message type; a known intent; a destination it routes;
        headers, if any, of text, none that `_fast` fills in but the ConversationId:
        `_given_columns`) is built with the batch's other such rows, a few operations per column rather than some
        per row, into `RowGroup`s of the staged rows `build` makes of them
        (tests/test_stage_columns.py keeps the two equal); any other row is built by `build`, in
        its turn. The rows of one (kind, route) come in the batch's order."""
        n = len(batch)
        plan = self._columns_plan(batch, now) if n else None
        if plan is None:
            yield from map(self.build, batch, itertools.repeat(now))
            return
        odd, keys, message_ids, texts, bodies = plan
        counts = self.counts
        done = start = 0  # plain rows yielded; the batch's first row not yielded
        for stop in [*odd, n]:
            if stop > start:
                end = done + stop - start
                for key, columns in _groups(keys, done, end, message_ids, texts, bodies):
                    size = len(columns[0])
                    counts[key] = counts.get(key, 0) + size
                    nothing = (None,) * size  # ttbr_ms, delay_ms, due
                    yield RowGroup(key[0], key[1], (*columns, nothing, nothing, nothing))
                done = end
            if stop < n:
                yield self.build(batch.row(stop), now)
            start = stop + 1

    def _columns_plan(self, batch: InputColumns, now: datetime | str) -> tuple[list[int], _Keys, list[str], list[str],
                                                                               list[Any]] | None:
        """What `build_columns` needs: the rows it leaves to `build` (in order), then the (kind,
        route) of the others (one for all, or a list: one each), their message ids, headers texts
        and bodies, in order. None: every row to `build`."""
        n = len(batch)
        if not self._plain or not isinstance(now, str):
            return None
        columns = dict(zip(batch.names, batch.columns, strict=True))
        odd: set[int] = set()
        for name in _ROW_WISE_COLUMNS:
            column = columns.get(name)
            if column is not None and column.count(None) != n:
                odd.update(i for i, v in enumerate(column) if v is not None)
        if len(odd) == n:
            return None
        text: dict[str, list[Any]] = {}
        for name in _TEXT_COLUMNS:
            column = columns.get(name)
            if column is None or column.count(None) == n:
                continue  # as if absent
            if not set(map(type, column)) <= _TEXT_TYPES:
                return None
            if "\x00" in "".join(filter(None, column)):
                odd.update(i for i, v in enumerate(column) if v and "\x00" in v)
            text[name] = column
        message_types = text.get("message_type")
        if message_types is None:
            return None  # no row has a message type: refused, or given by its headers
        if "" in message_types or None in message_types:
            odd.update(i for i, v in enumerate(message_types) if not v)
        bodies = columns.get("body")
        if bodies is None:
            bodies = [None] * n
        else:
            types = set(map(type, bodies))
            if not types <= _BODY_TYPES:
                return None
            if str in types:
                bodies = list(bodies)
                for i, body in enumerate(bodies):
                    if type(body) is str:
                        try:
                            bodies[i] = body.encode("utf-8")
                        except UnicodeError:  # raised by `build`, in its turn
                            odd.add(i)
        try:
            extra, conversations = _given_columns(columns.get("headers"), n, odd)
        except Exception:  # noqa: BLE001 - `_RowByRow`, or headers not (key, value) pairs: `build` builds them
            return None
        intents, destinations = text.get("intent"), text.get("destination")
        keys: _Keys
        if intents is None and destinations is None:
            key = self._key("Send", None)
            if key is None:
                return None
            keys = key
        else:  # one per row: (kind, route), (PUBLISH, None) for an event (routed by its type), None: `build`'s
            pairs = list(zip(intents or itertools.repeat(None, n), destinations or itertools.repeat(None, n),
                             strict=True))
            known = {(intent, destination): self._key(_intent(intent), destination) for intent, destination in set(pairs)}
            keys = list(map(known.__getitem__, pairs))  # type: ignore[arg-type]
            if None in known.values():
                odd.update(i for i, key in enumerate(keys) if key is None)
        if len(odd) == n:
            return None
        if odd:  # the plain rows' columns
            plain = [i for i in range(n) if i not in odd]
            text = {name: [column[i] for i in plain] for name, column in text.items()}
            bodies = [bodies[i] for i in plain]
            if isinstance(keys, list):
                keys = [keys[i] for i in plain]
            if extra is not None and conversations is not None:
                extra, conversations = [extra[i] for i in plain], [conversations[i] for i in plain]
            message_types, intents = text["message_type"], text.get("intent")
        if isinstance(keys, list) and (PUBLISH, None) in keys:
            keys = [(PUBLISH, t) if k[1] is None else k for k, t in zip(keys, message_types, strict=True)]
        m = n - len(odd)
        given = text.get("message_id")
        if given is None:
            message_ids = self._id_block(m)
        else:
            missing = m - sum(map(bool, given))
            new = iter(self._id_block(missing))
            message_ids = [v or next(new) for v in given] if missing else given
        if conversations is None:
            new_conversations = self._id_block(m)
        else:  # given, or new
            new = iter(self._id_block(conversations.count(None)))
            new_conversations = [next(new) if c is None else c for c in conversations]
        reply_to, default = text.get("reply_to"), self.plan.reply_to
        one_type = message_types[0] if len(set(message_types)) == 1 else None
        texts = self._text.texts(
            message_ids=message_ids,
            intent="Send" if intents is None else list(map(_intents(intents).__getitem__, intents)),
            enclosed=one_type if one_type is not None else message_types,
            correlation_ids=text.get("correlation_id"),
            reply_to=default if reply_to is None else [r or default for r in reply_to],
            time_sent=now, conversations=new_conversations, given=extra,
        )
        return sorted(odd), keys, message_ids, texts, bodies

    def _key(self, intent: str | None, destination: str | None) -> tuple[str, str | None] | None:
        """(kind, route) of a plain row with this MessageIntent and destination, as `_fast`
        routes it; (PUBLISH, None) for a published event (routed by its message type); None
        when `build` would refuse (or fail) the row."""
        if intent is None:
            return None
        if intent == "Publish":
            return None if destination is not None else (PUBLISH, None)
        if intent == "Reply" and destination is None:
            return (SEND, "")
        try:
            return (SEND, self.route(destination, ""))
        except Exception:  # noqa: BLE001 - refused, or failing, in its turn by `build`
            return None

    def error(self, row: Mapping[str, Any], refused: _Refused) -> MessageError:
        """The error of a refused row: the column, the message, why. The message is named by
        what stays the same when the batch runs again: its ``message_id`` if the row gives one;
        else, for a reply (or any message carrying ``NServiceBus.RelatedTo``), the message it
        answers; only else the id generated for it in this run."""
        shown = refused.field or refused.column
        given = row.get("message_id")
        if given:
            who = f"message {_shown(given)}"
        else:
            related = _related_to(row.get("headers"))
            intent = row.get("intent")
            if related is not None:
                kind = "reply to" if isinstance(intent, str) and intent.strip().lower() == "reply" else "message related to"
                who = f"the {kind} message {_shown(related)} (NServiceBus.RelatedTo)"
            else:
                who = f"message {_shown(refused.message_id)} (an id generated in this run: no message_id column)"
        return MessageError(f"column {shown!r} of {who}: {refused.reason}", column=refused.column,
                            field=refused.setting)

    def _error_copy(self, row: Mapping[str, Any], now: datetime | str, message_id: Any, error: MessageError) -> StagedRow:
        """A refused row as the message it would have been (its body, the headers it would have
        had as far as they can be built, NUL characters escaped as ``\\x00``) plus NServiceBus's
        failure headers (ExceptionInfo.Message: `error`), staged for the error queue. Never raises."""
        plan = self.plan
        message_id = _clean(message_id) or next(self._ids)
        given = _loose_headers(row.get("headers"))
        raw_intent = row.get("intent")
        intent = (raw_intent if isinstance(raw_intent, str) else "send").strip().lower() or "send"
        recovering = intent in RECOVERY
        if recovering:  # a received message (fail, retry): its headers as they came
            self._note_failed(row)
            headers: dict[str, str | None] = {**given, H.MESSAGE_ID: message_id}
        else:
            headers = self._copy_headers(row, message_id, intent, given, now)
        # FailedQ: where the message was going (as for a refused route), so that a retry from the
        # error queue (ServicePulse, `sqlqueue error retry`) delivers it there; the endpoint's own
        # queue only when the row names no destination or the destination is what was refused.
        failed_q = plan.failed_q or plan.endpoint
        destination = row.get("destination")
        if recovering and destination is None:  # where it was received
            destination = failed_q_of(row.get("failure"))
        if error.column != "destination" and intent != "publish" and (destination is None or isinstance(destination, str)):
            try:
                failed_q = self.route(destination, message_id) or failed_q
            except _Refused:  # no destination at all
                pass
        headers = failure_headers(
            headers, failed_q=failed_q, exception_type=INVALID_TYPE,
            message=str(error),
            source=SOURCE, endpoint=plan.endpoint, data={"Column": error.column or ""},
        )
        body = row.get("body")
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogatepass")
        elif body is not None and not isinstance(body, bytes):
            body = bytes(body) if isinstance(body, (bytearray, memoryview)) else _shown(body).encode("utf-8")
        route = plan.invalid_to or ""
        self.counts[(SEND, route)] = self.counts.get((SEND, route), 0) + 1
        self.invalid += 1
        if self.invalid_reason is None:
            self.invalid_reason = str(error)
        return StagedRow(sink=plan.sink, batch_id=self.batch_id, attempt=self.attempt, kind=SEND, route=route,
                         message_id=message_id, headers=encode_headers(headers), body=body, ttbr_ms=None,
                         delay_ms=None, due=None)

    def _copy_headers(self, row: Mapping[str, Any], message_id: str, intent: str, given: dict[str, str],
                      now: datetime | str) -> dict[str, str | None]:
        """The headers an error copy of a refused row carries (before the failure headers): those
        the message would have had, as far as they can be built."""
        plan = self.plan
        try:
            headers = outgoing_headers(
                message_id=message_id, endpoint=plan.endpoint, machine=self.machine,
                intent=intent if intent in INTENTS else "send", message_type=_clean(row.get("message_type")),
                content_type=plan.content_type, correlation_id=_clean(row.get("correlation_id")),
                reply_to_address=_clean(row.get("reply_to")) or plan.reply_to, headers=given, now=now,
            )
            if intent not in INTENTS and H.MESSAGE_INTENT not in given:
                del headers[H.MESSAGE_INTENT]  # not known: not guessed
        except ValueError:  # no message type: the headers given, and who sent it when
            headers = {H.MESSAGE_ID: message_id, H.TIME_SENT: now if isinstance(now, str) else format_time(now),
                       H.ORIGINATING_ENDPOINT: plan.endpoint, H.ORIGINATING_MACHINE: self.machine, **given}
            headers[H.MESSAGE_ID] = message_id  # the row's id, whatever the headers say (as `outgoing_headers`)
        return headers

    def _fast(self, row: Mapping[str, Any], now: datetime | str) -> StagedRow:
        """`build` without the error copies: the staging hot path. A row whose text columns and
        headers are plain text without NUL, with a known intent and a message type, is built
        here in few Python calls; any other row (one that may be refused, or holds values of
        other types) takes `_build`, the general path, which refuses it the same way (or builds
        the same staged row: the two are kept equal by tests/test_stage_fast.py)."""
        if not self._plain:
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
        if intent in RECOVERY:
            return self._recover(row, intent, now)
        if intent not in INTENTS:
            raise _Refused("intent", f"{_shown(get('intent'))} is not one of send, publish, reply, fail, retry",
                           message_id)
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

    def _recover(self, row: Mapping[str, Any], intent: str, now: datetime | str) -> StagedRow:
        """A received message the pipeline rejected (`recovery`): intent ``fail`` -> the error
        queue with failure headers; ``retry`` -> its own queue through delayed delivery, with the
        retry headers, or the error queue once its retries are spent. Same MessageId, headers
        (without the transport's ForwardDestination) and body as received."""
        plan, get = self.plan, row.get
        self._note_failed(row)
        message_id = get("message_id")
        if not message_id or not isinstance(message_id, str):
            raise _Refused("message_id", f"{intent} needs the received message's id (column message_id), not "
                           f"{_shown(message_id)}", next(self._ids))
        try:
            failure = failure_of(get("failure"), intent, self._max_seconds)
        except InvalidFailure as bad:
            raise _Refused("failure", bad.reason, message_id, field=f"failure.{bad.field}") from None
        given = get("headers")
        try:
            received = dict(given.items() if isinstance(given, Mapping) else given or ())
        except (TypeError, ValueError):
            raise _Refused("headers", f"{_shown(given)} is not a map", message_id) from None
        received.pop(H.FORWARD_DESTINATION, None)
        received[H.MESSAGE_ID] = message_id
        body = get("body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        moment = now if isinstance(now, datetime) else datetime.now(timezone.utc)
        attempt = next_attempt(failure, received, moment) if intent == RETRY else None
        delay_ms = None
        if attempt is None:
            failed_q = (self.route(failure.failed_q, message_id) if failure.failed_q
                        else plan.failed_q or plan.endpoint)
            headers = failure_headers(received, failed_q=failed_q, exception_type=failure.exception_type,
                                      message=failure.message, source=RECOVERY_SOURCE, endpoint=plan.endpoint,
                                      stack_trace=failure.stack_trace)
            kind, route = SEND, plan.error_queue or plan.invalid_to or ""
        else:  # back to its queue (a destination from data: routed like any, when due)
            route = self.route(get("destination") or failure.failed_q, message_id)
            headers = retried_headers(received, attempt, now)
            delay_ms = round(failure.delay * attempt * 1000)
            kind = DELAYED if delay_ms > 0 else SEND
            if kind == DELAYED:
                headers[H.FORWARD_DESTINATION] = route
            else:
                delay_ms = None
        self.counts[(kind, route)] = self.counts.get((kind, route), 0) + 1
        return StagedRow(sink=plan.sink, batch_id=self.batch_id, attempt=self.attempt, kind=kind, route=route,
                         message_id=message_id, headers=encode_headers(headers), body=body, ttbr_ms=None,
                         delay_ms=delay_ms, due=None)

    def _note_failed(self, row: Mapping[str, Any]) -> None:
        """Keep the claim a fail or retry row names (its ``failure``'s ``failed_q`` and
        ``claim_seq``), whatever becomes of the row: a refused one goes to the error queue too."""
        failure = row.get("failure")
        queue, seq = failed_q_of(failure), claim_of(failure)
        if queue is not None and seq is not None:
            self.failed_claims.setdefault(queue, set()).add(seq)

    def _timing(self, row: Mapping[str, Any], message_id: str) -> _Timing:
        """The row's time to be received, delay and deliver_at, checked. A deliver_at in the past
        (a minute or two thousand years ago) is due now: a delay of 0, counted from the
        database's clock at dispatch, as a negative delay is."""
        ttbr = _seconds(row.get("time_to_be_received"), "time_to_be_received", message_id, self._max_seconds)
        delay = _seconds(row.get("delay"), "delay", message_id, self._max_seconds)
        if delay is not None and delay < 0:
            delay = 0.0  # a negative delay: due now
        deliver_at = row.get("deliver_at")
        due_now = False
        if deliver_at is not None:
            if not isinstance(deliver_at, datetime):
                raise _Refused("deliver_at", f"{_shown(deliver_at)} is not a timestamp", message_id)
            if deliver_at.tzinfo is None:
                deliver_at = deliver_at.replace(tzinfo=timezone.utc)
            ahead = (deliver_at - self._now).total_seconds()
            if ahead > MAX_SECONDS:
                raise _Refused("deliver_at", f"{deliver_at.isoformat()} is more than 100 years from now", message_id)
            if ahead <= 0:
                deliver_at, delay, due_now = None, 0.0, True
        timing = _Timing(ttbr, delay, deliver_at, due_now)
        if ttbr is not None:
            if ttbr <= 0:
                raise _Refused("time_to_be_received", f"must be positive, not {ttbr}", message_id)
            if timing.deferred:
                raise _Refused("time_to_be_received", "it is delayed and has a time to be received: NServiceBus "
                               "refuses delayed messages that can expire; drop one of them", message_id)
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
            raise _Refused(column, str(exc), message_id) from None

    def _kind_and_route(self, destination: str | None, message_id: str, intent: str, deferred: bool,
                        headers: dict[str, str | None]) -> tuple[str, str]:
        """Where the message goes: (SEND, DELAYED or PUBLISH, canonical address or published types)."""
        if intent == "publish":
            if destination is not None:
                raise _Refused("destination", f"it is published and has a destination ({_shown(destination)}): "
                               "published events go to their subscribers; send it instead, or clear the destination",
                               message_id)
            if deferred:
                raise _Refused("intent", "delaying a published event is not supported; send it delayed", message_id)
            return PUBLISH, headers[H.ENCLOSED_MESSAGE_TYPES] or ""
        # a reply to a message without a ReplyToAddress has no destination: route "" is refused at
        # dispatch, and the reply goes to the error queue
        route = "" if intent == "reply" and destination is None else self.route(destination, message_id)
        if deferred:
            headers[H.FORWARD_DESTINATION] = route
            return DELAYED, route
        return SEND, route


#: the columns `build_columns` reads; it ignores any other, as `_fast` does (``failure``: only
#: intents fail and retry read it, and their rows are built by `build`)
_TEXT_COLUMNS = ("message_id", "message_type", "correlation_id", "reply_to", "destination", "intent")
#: columns whose rows `build` builds when they hold a value
_ROW_WISE_COLUMNS = ("time_to_be_received", "delay", "deliver_at")
_TEXT_TYPES = frozenset((str, type(None)))
_BODY_TYPES = frozenset((bytes, str, type(None)))
#: (kind, route) of every row, or one per row (a route None: not known yet, or refused)
_Keys = tuple[str, Any] | list[tuple[str, Any]]


class _RowByRow(Exception):  # noqa: N818 - internal: `build_columns` leaves the batch to `build`
    """A batch whose rows are better built by `build` (`_given_columns`: forwarded messages)."""


def _given_columns(headers: list[Any] | None, n: int, odd: set[int]) -> tuple[list[str], list[str | None]] | tuple[None, None]:
    """The ``headers`` column as `build_columns` takes it: per row, the text of its given headers
    (`given_texts`) and its given ConversationId (None: a new one), for rows whose headers are
    (key, value) pairs of text without NUL, each key once, none of `NOT_GIVEN_TEXT` (else the
    row is added to `odd`). Rows with the same keys are done together. (None, None): no headers.
    Raises `_RowByRow` when the first row with headers has one that `_fast` fills in (a
    forwarded message's MessageId, say): its batch is likely all such rows, not worth a pass."""
    if headers is None or headers.count(None) == n:
        return None, None
    first = next(filter(None, headers), None)  # forwarded messages' headers (a MessageId...): all row by row, unread
    if first is None:
        return None, None  # empty maps: as none
    if type(first) is not list or not NOT_GIVEN_TEXT.isdisjoint(name for name, _ in first):
        raise _RowByRow
    by_names: dict[tuple[Any, ...], list[int]] = {}
    for i, pairs in enumerate(headers):
        if pairs:
            if type(pairs) is not list:
                odd.add(i)
                continue
            try:
                by_names.setdefault(tuple([name for name, _ in pairs]), []).append(i)
            except (TypeError, ValueError):
                odd.add(i)
    texts: list[str] = [""] * n
    conversations: list[str | None] = [None] * n
    for names, rows in by_names.items():
        if (not all(type(name) is str for name in names) or len(set(names)) < len(names)
                or "\x00" in "".join(names) or not NOT_GIVEN_TEXT.isdisjoint(names)):
            odd.update(rows)
            continue
        values = [[headers[i][j][1] for i in rows] for j in range(len(names))]
        bad = {r for column in values for r, v in enumerate(column) if type(v) is not str or "\x00" in v}
        if bad:
            odd.update(rows[r] for r in bad)
            rows = [i for r, i in enumerate(rows) if r not in bad]
            values = [[v for r, v in enumerate(column) if r not in bad] for column in values]
        if not rows:
            continue
        if H.CONVERSATION_ID in names:
            for i, value in zip(rows, values[names.index(H.CONVERSATION_ID)], strict=True):
                conversations[i] = value
        rest = [(name, column) for name, column in zip(names, values, strict=True) if name != H.CONVERSATION_ID]
        if rest:
            for i, text in zip(rows, given_texts([name for name, _ in rest], [column for _, column in rest]), strict=True):
                texts[i] = text
    return texts, conversations


def _intent(value: str | None) -> str | None:
    """The MessageIntent of an intent column's value, as `_fast` reads it (None: not one it takes)."""
    return INTENTS.get((value or "send").strip().lower())


def _intents(values: list[str | None]) -> dict[str | None, str]:
    """The MessageIntent of each distinct value of a plain rows' intent column."""
    return {value: INTENTS[(value or "send").strip().lower()] for value in set(values)}


def _groups(keys: _Keys, start: int, end: int, *columns: list[Any]) -> list[tuple[tuple[str, str], list[list[Any]]]]:
    """Rows ``start`` to ``end`` of `columns`, by (kind, route) (`keys`: one for all, or one each),
    each key's in order."""
    if isinstance(keys, tuple):
        return [(keys, [c[start:end] for c in columns])]
    if len(set(keys[start:end])) == 1:
        return [(keys[start], [c[start:end] for c in columns])]
    rows: dict[tuple[str, str], list[int]] = {}
    for i in range(start, end):
        rows.setdefault(keys[i], []).append(i)
    return [(key, [[c[i] for i in picked] for c in columns]) for key, picked in rows.items()]


_ENCLOSED = H.ENCLOSED_MESSAGE_TYPES
_FORWARD, _CONTROL = RESERVED
_new_row = tuple.__new__

class _Timing(NamedTuple):
    ttbr: float | None  # seconds
    delay: float | None  # seconds, not negative
    deliver_at: datetime | None  # aware, in the future
    due_now: bool = False  # deliver_at was in the past: delayed by 0

    @property
    def deferred(self) -> bool:
        return self.deliver_at is not None or self.due_now or (self.delay is not None and self.delay > 0)


def _given_headers(given: Any, message_id: str) -> dict[str, Any]:
    """The headers column as a dict without null values, refusing NUL characters."""
    if given is not None and not isinstance(given, Mapping):
        given = dict(given)  # Arrow maps arrive as (key, value) pairs
    headers = {k: v for k, v in (given or {}).items() if v is not None}
    for key, value in headers.items():
        _no_nul(key, "headers", message_id)
        _no_nul(value, "headers", message_id, field=f"headers[{key!r}]")
    return headers


def _related_to(given: Any) -> str | None:
    """The NServiceBus.RelatedTo header of a headers column, if it has one (text)."""
    try:
        value = (given if isinstance(given, Mapping) else dict(given or ())).get(H.RELATED_TO)
    except Exception:  # noqa: BLE001 - not a map: no related message
        return None
    return value if isinstance(value, str) and value else None


def _clean(value: Any) -> str | None:
    """Text a header of an error copy can hold: NUL escaped (PostgreSQL text cannot hold it);
    None for no value."""
    if value is None or value == "":
        return None
    return (value if isinstance(value, str) else _shown(value)).replace("\x00", "\\x00")


def _loose_headers(given: Any) -> dict[str, str]:
    """The headers column of a refused row, as an error copy carries them: text, NUL escaped,
    without null values or the transport's reserved headers. Never raises."""
    try:
        pairs = list((given if isinstance(given, Mapping) else dict(given or ())).items())
    except Exception:  # noqa: BLE001 - not a map: none
        return {}
    out: dict[str, str] = {}
    for key, value in pairs:
        name, text = _clean(key), _clean(value)
        if name is not None and text is not None and name not in RESERVED:
            out[name] = text
    return out
