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
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

from ...dialects import dialect_named
from ...errors import ConfigError, MessageError
from ...wire import (
    INTENTS,
    RESERVED,
    H,
    SentHeaderText,
    encode_headers,
    failure_headers,
    format_time,
    machine,
    outgoing_headers,
    uuid4_list,
    uuid4_texts,
)
from .checks import (
    MAX_SECONDS,
    Refused,
    Timing,
    clean,
    given_headers,
    loose_headers,
    no_nul,
    related_to,
    seconds_of,
    shown,
    timespan,
)
from .columnwise import (
    BODY_TYPES,
    ROW_WISE_COLUMNS,
    TEXT_COLUMNS,
    TEXT_TYPES,
    Keys,
    given_columns,
    groups,
    intent_of,
    intents_of,
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
                    raise Refused("destination", "no destination: fill the 'destination' column or set "
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
        except Refused as refused:
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
        `given_columns`) is built with the batch's other such rows, a few operations per column rather than some
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
                for key, columns in groups(keys, done, end, message_ids, texts, bodies):
                    size = len(columns[0])
                    counts[key] = counts.get(key, 0) + size
                    nothing = (None,) * size  # ttbr_ms, delay_ms, due
                    yield RowGroup(key[0], key[1], (*columns, nothing, nothing, nothing))
                done = end
            if stop < n:
                yield self.build(batch.row(stop), now)
            start = stop + 1

    def _columns_plan(self, batch: InputColumns, now: datetime | str) -> tuple[list[int], Keys, list[str], list[str],
                                                                               list[Any]] | None:
        """What `build_columns` needs: the rows it leaves to `build` (in order), then the (kind,
        route) of the others (one for all, or a list: one each), their message ids, headers texts
        and bodies, in order. None: every row to `build`."""
        n = len(batch)
        if not self._plain or not isinstance(now, str):
            return None
        columns = dict(zip(batch.names, batch.columns, strict=True))
        odd: set[int] = set()
        for name in ROW_WISE_COLUMNS:
            column = columns.get(name)
            if column is not None and column.count(None) != n:
                odd.update(i for i, v in enumerate(column) if v is not None)
        if len(odd) == n:
            return None
        text: dict[str, list[Any]] = {}
        for name in TEXT_COLUMNS:
            column = columns.get(name)
            if column is None or column.count(None) == n:
                continue  # as if absent
            if not set(map(type, column)) <= TEXT_TYPES:
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
            if not types <= BODY_TYPES:
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
            extra, conversations = given_columns(columns.get("headers"), n, odd)
        except Exception:  # noqa: BLE001 - `RowByRow`, or headers not (key, value) pairs: `build` builds them
            return None
        intents, destinations = text.get("intent"), text.get("destination")
        keys: Keys
        if intents is None and destinations is None:
            key = self._key("Send", None)
            if key is None:
                return None
            keys = key
        else:  # one per row: (kind, route), (PUBLISH, None) for an event (routed by its type), None: `build`'s
            pairs = list(zip(intents or itertools.repeat(None, n), destinations or itertools.repeat(None, n),
                             strict=True))
            known = {(intent, destination): self._key(intent_of(intent), destination) for intent, destination in set(pairs)}
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
            intent="Send" if intents is None else list(map(intents_of(intents).__getitem__, intents)),
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

    def error(self, row: Mapping[str, Any], refused: Refused) -> MessageError:
        """The error of a refused row: the column, the message, why. The message is named by
        what stays the same when the batch runs again: its ``message_id`` if the row gives one;
        else, for a reply (or any message carrying ``NServiceBus.RelatedTo``), the message it
        answers; only else the id generated for it in this run."""
        part = refused.field or refused.column
        given = row.get("message_id")
        if given:
            who = f"message {shown(given)}"
        else:
            related = related_to(row.get("headers"))
            intent = row.get("intent")
            if related is not None:
                kind = "reply to" if isinstance(intent, str) and intent.strip().lower() == "reply" else "message related to"
                who = f"the {kind} message {shown(related)} (NServiceBus.RelatedTo)"
            else:
                who = f"message {shown(refused.message_id)} (an id generated in this run: no message_id column)"
        return MessageError(f"column {part!r} of {who}: {refused.reason}", column=refused.column,
                            field=refused.setting)

    def _error_copy(self, row: Mapping[str, Any], now: datetime | str, message_id: Any, error: MessageError) -> StagedRow:
        """A refused row as the message it would have been (its body, the headers it would have
        had as far as they can be built, NUL characters escaped as ``\\x00``) plus NServiceBus's
        failure headers (ExceptionInfo.Message: `error`), staged for the error queue. Never raises."""
        plan = self.plan
        message_id = clean(message_id) or next(self._ids)
        given = loose_headers(row.get("headers"))
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
            except Refused:  # no destination at all
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
            body = bytes(body) if isinstance(body, (bytearray, memoryview)) else shown(body).encode("utf-8")
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
                intent=intent if intent in INTENTS else "send", message_type=clean(row.get("message_type")),
                content_type=plan.content_type, correlation_id=clean(row.get("correlation_id")),
                reply_to_address=clean(row.get("reply_to")) or plan.reply_to, headers=given, now=now,
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
                given = {**(given or {}), TTBR_HEADER: timespan(ttbr)}
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
        no_nul(message_id, "message_id", message_id)
        for column in ("correlation_id", "message_type", "reply_to"):
            no_nul(get(column), column, message_id)
        intent = (get("intent") or "send").strip().lower()
        if intent in RECOVERY:
            return self._recover(row, intent, now)
        if intent not in INTENTS:
            raise Refused("intent", f"{shown(get('intent'))} is not one of send, publish, reply, fail, retry",
                           message_id)
        body = get("body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        given = given_headers(get("headers"), message_id)
        timing = self._timing(row, message_id)
        if timing.ttbr is not None:
            given.setdefault(TTBR_HEADER, timespan(timing.ttbr))
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
            raise Refused("message_id", f"{intent} needs the received message's id (column message_id), not "
                           f"{shown(message_id)}", next(self._ids))
        try:
            failure = failure_of(get("failure"), intent, self._max_seconds)
        except InvalidFailure as bad:
            raise Refused("failure", bad.reason, message_id, field=f"failure.{bad.field}") from None
        given = get("headers")
        try:
            received = dict(given.items() if isinstance(given, Mapping) else given or ())
        except (TypeError, ValueError):
            raise Refused("headers", f"{shown(given)} is not a map", message_id) from None
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

    def _timing(self, row: Mapping[str, Any], message_id: str) -> Timing:
        """The row's time to be received, delay and deliver_at, checked. A deliver_at in the past
        (a minute or two thousand years ago) is due now: a delay of 0, counted from the
        database's clock at dispatch, as a negative delay is."""
        ttbr = seconds_of(row.get("time_to_be_received"), "time_to_be_received", message_id, self._max_seconds)
        delay = seconds_of(row.get("delay"), "delay", message_id, self._max_seconds)
        if delay is not None and delay < 0:
            delay = 0.0  # a negative delay: due now
        deliver_at = row.get("deliver_at")
        due_now = False
        if deliver_at is not None:
            if not isinstance(deliver_at, datetime):
                raise Refused("deliver_at", f"{shown(deliver_at)} is not a timestamp", message_id)
            if deliver_at.tzinfo is None:
                deliver_at = deliver_at.replace(tzinfo=timezone.utc)
            ahead = (deliver_at - self._now).total_seconds()
            if ahead > MAX_SECONDS:
                raise Refused("deliver_at", f"{deliver_at.isoformat()} is more than 100 years from now", message_id)
            if ahead <= 0:
                deliver_at, delay, due_now = None, 0.0, True
        timing = Timing(ttbr, delay, deliver_at, due_now)
        if ttbr is not None:
            if ttbr <= 0:
                raise Refused("time_to_be_received", f"must be positive, not {ttbr}", message_id)
            if timing.deferred:
                raise Refused("time_to_be_received", "it is delayed and has a time to be received: NServiceBus "
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
            raise Refused(column, str(exc), message_id) from None

    def _kind_and_route(self, destination: str | None, message_id: str, intent: str, deferred: bool,
                        headers: dict[str, str | None]) -> tuple[str, str]:
        """Where the message goes: (SEND, DELAYED or PUBLISH, canonical address or published types)."""
        if intent == "publish":
            if destination is not None:
                raise Refused("destination", f"it is published and has a destination ({shown(destination)}): "
                               "published events go to their subscribers; send it instead, or clear the destination",
                               message_id)
            if deferred:
                raise Refused("intent", "delaying a published event is not supported; send it delayed", message_id)
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
