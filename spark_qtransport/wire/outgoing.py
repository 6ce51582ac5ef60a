"""The headers of a message we send, filled in as an NServiceBus endpoint fills them: as a dict
(`outgoing_headers`), or written straight as text on the sink's hot path (`SentHeaderText`)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone

from .encode import _encode_string, _encode_text, _escaped, _inner_all
from .names import INTENTS, RESERVED, H
from .times import format_time

__all__ = ["outgoing_headers", "SentHeaderText", "given_texts", "NOT_GIVEN_TEXT"]


def outgoing_headers(
    *,
    message_id: str,
    endpoint: str,
    machine: str,
    intent: str = "send",
    message_type: str | None = None,
    content_type: str = "application/json",
    correlation_id: str | None = None,
    reply_to_address: str | None = None,
    incoming: Mapping[str, str | None] | None = None,
    headers: Mapping[str, str | None] | None = None,
    now: datetime | str | None = None,
) -> dict[str, str | None]:
    """The headers of a message we send, filled in the way an NServiceBus endpoint fills them.

    Headers the caller gives win over the defaults, except `RESERVED` ones, which are refused.
    With `incoming` (the message being handled), the conversation continues: same
    ConversationId, RelatedTo = its MessageId, CorrelationId = its CorrelationId (else its
    MessageId), as NServiceBus's AttachCorrelationId and causation behaviours do. `now` is the
    send time, or its text already in NServiceBus's format (one per batch is enough).

    :raises ValueError: a reserved header, an unknown intent or a missing message type.
    """
    given = dict(headers or {})
    for name in RESERVED:
        if name in given:
            raise ValueError(f"header {name!r} is reserved for the transport and cannot be sent")
    if intent not in INTENTS:
        raise ValueError(f"intent {intent!r} is not one of {', '.join(INTENTS)}")
    enclosed = message_type or given.get(H.ENCLOSED_MESSAGE_TYPES)
    if not enclosed:
        raise ValueError(
            f"message {message_id!r} has no message type: set the message_type column "
            f"(a .NET type name) or the {H.ENCLOSED_MESSAGE_TYPES} header"
        )
    out: dict[str, str | None] = {
        H.MESSAGE_ID: message_id,
        H.MESSAGE_INTENT: INTENTS[intent],
        H.ENCLOSED_MESSAGE_TYPES: enclosed,
        H.CONTENT_TYPE: content_type,
        H.TIME_SENT: now if isinstance(now, str) else format_time(now or datetime.now(timezone.utc)),
        H.ORIGINATING_ENDPOINT: endpoint,
        H.ORIGINATING_MACHINE: machine,
    }
    if incoming is not None:
        incoming_id = incoming.get(H.MESSAGE_ID)
        out[H.CONVERSATION_ID] = incoming.get(H.CONVERSATION_ID) or str(uuid.uuid4())
        out[H.CORRELATION_ID] = incoming.get(H.CORRELATION_ID) or incoming_id or message_id
        if incoming_id:
            out[H.RELATED_TO] = incoming_id
    else:
        out[H.CONVERSATION_ID] = str(uuid.uuid4())
        out[H.CORRELATION_ID] = message_id
    if correlation_id:
        out[H.CORRELATION_ID] = correlation_id
    if reply_to_address:
        out[H.REPLY_TO_ADDRESS] = reply_to_address
    out.update(given)
    out[H.MESSAGE_ID] = message_id
    return out


def _key(name: str) -> str:
    return _encode_string(name) + ":"


_K_ID, _K_INTENT, _K_TYPES, _K_CONTENT, _K_SENT, _K_ENDPOINT, _K_MACHINE, _K_CONVERSATION, _K_CORRELATION = map(_key, (
    H.MESSAGE_ID, H.MESSAGE_INTENT, H.ENCLOSED_MESSAGE_TYPES, H.CONTENT_TYPE, H.TIME_SENT, H.ORIGINATING_ENDPOINT,
    H.ORIGINATING_MACHINE, H.CONVERSATION_ID, H.CORRELATION_ID))
_K_REPLY_TO, _K_FORWARD = _key(H.REPLY_TO_ADDRESS), _key(H.FORWARD_DESTINATION)
#: the headers `outgoing_headers` fills in (without `incoming`), in its order; then ReplyToAddress
_FILLED = frozenset((H.MESSAGE_ID, H.MESSAGE_INTENT, H.ENCLOSED_MESSAGE_TYPES, H.CONTENT_TYPE, H.TIME_SENT,
                     H.ORIGINATING_ENDPOINT, H.ORIGINATING_MACHINE, H.CONVERSATION_ID, H.CORRELATION_ID))
_FILLED_REPLY_TO = _FILLED | {H.REPLY_TO_ADDRESS}


class SentHeaderText:
    """The headers text of a message sent outside a handler, written straight from its values:
    exactly ``encode_headers(outgoing_headers(...))``, ForwardDestination last when given (as the
    sink adds it to a delayed message). The staging hot path: no dict of the headers is built, the
    fixed keys are written once, and the run of ContentType ... OriginatingMachine (the same for a
    task's messages) is kept as text.

    The caller has checked what `outgoing_headers` checks, and more: every value is `str`,
    `given` a dict of `str` to `str` (no None) without a `RESERVED` name; `intent` is the
    MessageIntent value (``Send``), `enclosed` and `correlation_id` the values before `given`
    (the message type, the correlation id or else the message id); a falsy `reply_to` adds none.
    """

    def __init__(self, *, endpoint: str, machine: str, content_type: str, new_id: Callable[[], str]) -> None:
        self._endpoint, self._machine, self._content_type = endpoint, machine, content_type
        self._new_id = new_id  # a new ConversationId, when `given` has none
        self._runs: dict[tuple[str, str, str, str], str] = {}

    def text(self, *, message_id: str, intent: str, enclosed: str, correlation_id: str, reply_to: str | None,
             time_sent: str, given: dict[str, str] | None, forward: str | None = None) -> str:
        content_type, endpoint, machine = self._content_type, self._endpoint, self._machine
        conversation = None
        rest = given
        with_reply_to = bool(reply_to)  # its place is kept whatever `given` puts there ("" too)
        if given:
            filled = _FILLED_REPLY_TO if with_reply_to else _FILLED
            common = filled.intersection(given)
            if common:  # given values win, in the filled-in header's place (the message id never)
                rest = {k: v for k, v in given.items() if k not in filled} if len(common) < len(given) else None
                get = given.get
                intent, enclosed, content_type = get(H.MESSAGE_INTENT, intent), get(H.ENCLOSED_MESSAGE_TYPES, enclosed), \
                    get(H.CONTENT_TYPE, content_type)
                time_sent, endpoint, machine = get(H.TIME_SENT, time_sent), get(H.ORIGINATING_ENDPOINT, endpoint), \
                    get(H.ORIGINATING_MACHINE, machine)
                conversation, correlation_id = get(H.CONVERSATION_ID), get(H.CORRELATION_ID, correlation_id)
                if with_reply_to:
                    reply_to = get(H.REPLY_TO_ADDRESS, reply_to)
        if conversation is None:
            conversation = self._new_id()
        e = _encode_string
        runs = self._runs
        run = runs.get((content_type, time_sent, endpoint, machine))
        if run is None:
            if len(runs) >= 64:
                runs.clear()
            run = runs[(content_type, time_sent, endpoint, machine)] = (
                f",{_K_CONTENT}{e(content_type)},{_K_SENT}{e(time_sent)},{_K_ENDPOINT}{e(endpoint)},{_K_MACHINE}{e(machine)}")
        text = (f"{{{_K_ID}{e(message_id)},{_K_INTENT}{e(intent)},{_K_TYPES}{e(enclosed)}{run},"
                f"{_K_CONVERSATION}{e(conversation)},{_K_CORRELATION}{e(correlation_id)}")
        if with_reply_to:
            text += f",{_K_REPLY_TO}{e(reply_to)}"  # type: ignore[arg-type]
        if rest:
            text += "," + _encode_text(rest)[1:-1]
        if forward is not None:
            text += f",{_K_FORWARD}{e(forward)}"
        return (text + "}").replace("/", "\\/")

    def texts(self, *, message_ids: Sequence[str], intent: str | Sequence[str], enclosed: str | Sequence[str],
              correlation_ids: Sequence[str | None] | None, reply_to: str | None | Sequence[str | None],
              time_sent: str, conversations: Sequence[str], given: Sequence[str] | None = None) -> list[str]:
        """`text` of many messages without `forward`, column by column: what `text` writes for
        each, with each value that is the same for every message (`intent`, `enclosed`,
        `reply_to`: one value for all, or one per message) escaped once. A falsy correlation id
        is the message id (None: every one's); `conversations` are the messages'
        ConversationIds (given, or new: `text` draws those from `new_id`); `given`: per message,
        the text of its given headers none of which `text` fills in (`given_texts`: what `text`
        writes of its `given` then; ConversationId is not one of them, it is in `conversations`)."""
        run = (f",{_K_CONTENT}{_escaped(self._content_type)},{_K_SENT}{_escaped(time_sent)},"
               f"{_K_ENDPOINT}{_escaped(self._endpoint)},{_K_MACHINE}{_escaped(self._machine)},{_K_CONVERSATION}")
        if isinstance(intent, str) and isinstance(enclosed, str):
            middles: Iterable[str] = itertools.repeat(f",{_K_INTENT}{_escaped(intent)},{_K_TYPES}{_escaped(enclosed)}{run}")
        else:
            pieces: dict[tuple[str, str], str] = {}
            middles = [pieces.get(k) or pieces.setdefault(k, f",{_K_INTENT}{_escaped(k[0])},{_K_TYPES}{_escaped(k[1])}{run}")
                       for k in zip(_each(intent), _each(enclosed), strict=False)]  # a value for all: repeated
        if reply_to is None or isinstance(reply_to, str):
            tails: Iterable[str] = itertools.repeat(f",{_K_REPLY_TO}{_escaped(reply_to)}}}" if reply_to else "}")
        else:
            ends = {r: f",{_K_REPLY_TO}{_escaped(r)}}}" if r else "}" for r in set(reply_to)}
            tails = map(ends.__getitem__, reply_to)
        if given is not None:
            tails = [f"{t[:-1]}{g}}}" if g else t for g, t in zip(given, tails, strict=False)]  # after ReplyToAddress
        ids = _inner_all(message_ids)
        correlations = ids if correlation_ids is None else [
            c if own else i
            for own, c, i in zip(correlation_ids, _inner_all([c or "" for c in correlation_ids]), ids, strict=True)]
        head, key = "{" + _K_ID, "," + _K_CORRELATION
        return [f'{head}"{i}"{m}"{c}"{key}"{k}"{t}'
                for i, m, c, k, t in zip(ids, middles, _inner_all(conversations), correlations, tails,
                                             strict=False)]  # a value for all: repeated


#: headers of `given` that `SentHeaderText.texts` writes where `text` writes them only through
#: its `given` text (`given_texts`): none it fills in, but the ConversationId (its `conversations`)
NOT_GIVEN_TEXT = (_FILLED_REPLY_TO - {H.CONVERSATION_ID}) | set(RESERVED)


def given_texts(names: Sequence[str], values: Sequence[Sequence[str]]) -> list[str]:
    """The text given headers add to `SentHeaderText.text`'s, for many messages with the same
    header names (`names`, none of `NOT_GIVEN_TEXT`, in their order; `values`: one column of
    text per name, a value per message): ``,"name":"value"...`` per message, escaped as
    `encode_headers` escapes."""
    columns = [[f"{key}{v}\"" for v in _inner_all(column)]
               for key, column in zip([f",{_escaped(name)}:\"" for name in names], values, strict=True)]
    if len(columns) == 1:
        return columns[0]
    return ["".join(parts) for parts in zip(*columns, strict=True)]


def _each(value: str | Sequence[str]) -> Iterable[str]:
    return itertools.repeat(value) if isinstance(value, str) else value
