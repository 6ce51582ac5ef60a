"""NServiceBus wire format: header names, the headers JSON column and the transport's timestamps."""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import orjson

__all__ = [
    "H",
    "INTENTS",
    "RESERVED",
    "decode_headers",
    "decode_header_texts",
    "encode_headers",
    "FAILURE_HEADERS",
    "failure_headers",
    "as_utc",
    "format_time",
    "retries_performed",
    "host_id",
    "machine",
    "RETRY_COUNTERS",
    "outgoing_headers",
    "parse_time",
    "SentHeaderText",
    "uuid4s",
    "uuid4_list",
    "uuid4_texts",
    "given_texts",
    "NOT_GIVEN_TEXT",
]


class H:
    """Header names, as NServiceBus spells them."""

    MESSAGE_ID = "NServiceBus.MessageId"
    CORRELATION_ID = "NServiceBus.CorrelationId"
    CONVERSATION_ID = "NServiceBus.ConversationId"
    ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"
    CONTENT_TYPE = "NServiceBus.ContentType"
    MESSAGE_INTENT = "NServiceBus.MessageIntent"
    REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
    TIME_SENT = "NServiceBus.TimeSent"
    ORIGINATING_ENDPOINT = "NServiceBus.OriginatingEndpoint"
    ORIGINATING_MACHINE = "NServiceBus.OriginatingMachine"
    RELATED_TO = "NServiceBus.RelatedTo"
    VERSION = "NServiceBus.Version"
    FORWARD_DESTINATION = "NServiceBus.SqlServer.ForwardDestination"
    FAILED_Q = "NServiceBus.FailedQ"
    TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"
    CONTROL_MESSAGE = "NServiceBus.ControlMessage"
    DELIVER_AT = "NServiceBus.DeliverAt"
    PROCESSING_STARTED = "NServiceBus.ProcessingStarted"
    PROCESSING_ENDED = "NServiceBus.ProcessingEnded"
    PROCESSING_ENDPOINT = "NServiceBus.ProcessingEndpoint"
    PROCESSING_MACHINE = "NServiceBus.ProcessingMachine"
    HOST_ID = "$.diagnostics.hostid"
    HOST_DISPLAY_NAME = "$.diagnostics.hostdisplayname"
    ORIGINATING_HOST_ID = "$.diagnostics.originating.hostid"
    RETRIES = "NServiceBus.Retries"  # delayed retries performed (Headers.DelayedRetries)
    RETRIES_TIMESTAMP = "NServiceBus.Retries.Timestamp"
    FL_RETRIES = "NServiceBus.FLRetries"  # immediate retries (Headers.ImmediateRetries)
    EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
    EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"
    EXCEPTION_SOURCE = "NServiceBus.ExceptionInfo.Source"
    EXCEPTION_STACK_TRACE = "NServiceBus.ExceptionInfo.StackTrace"
    # ServiceControl's retries (NServiceBus.Core ServicePlatform/Retries)
    RETRY_UNIQUE_MESSAGE_ID = "ServiceControl.Retry.UniqueMessageId"
    RETRY_ACK_QUEUE = "ServiceControl.Retry.AcknowledgementQueue"
    RETRY_SUCCESSFUL = "ServiceControl.Retry.Successful"
    RETRY_ACK_SENT = "ServiceControl.Retry.AcknowledgementSent"


#: intent column values -> the NServiceBus.MessageIntent header
INTENTS = {"send": "Send", "publish": "Publish", "reply": "Reply"}

#: headers a sender must never set: the transport and NServiceBus own them
RESERVED = (H.FORWARD_DESTINATION, H.CONTROL_MESSAGE)


def decode_headers(text: str | None) -> dict[str, str | None] | None:
    """Parse the Headers column; None when it is poison: not a flat JSON object of strings (or
    nulls). ``''`` is no headers (``{}``), as NServiceBus reads it (`Message`:
    ``string.IsNullOrEmpty``); white space alone is not JSON, so None. An escaped lone UTF-16
    surrogate (``\\ud800`` alone) is poison too: NServiceBus's System.Text.Json cannot read it
    as a string, and PostgreSQL's jsonb refuses it.

    This is the rule that decides which claimed messages are poison (`decode_header_texts`), and
    the one other paths (peek, the CLI, tests) read headers by.
    """
    if text is None:
        return None
    if text == "":
        return {}
    try:
        value = orjson.loads(text)
    except (TypeError, ValueError):
        # orjson refuses lone surrogates and numbers beyond a double (1e999): the standard
        # library decides, told to refuse what jsonb refuses: a lone surrogate anywhere in the
        # text (even in a value a repeated key then replaces), NaN and Infinity
        if _lone_surrogate(text):
            return None
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            return None
    return value if _flat(value) else None


def decode_header_texts(texts: Sequence[str]) -> list[dict[str, str | None] | None]:
    """`decode_headers` of many texts: orjson for each, the exact rule only for what it refuses."""
    loads = orjson.loads
    out: list[dict[str, str | None] | None] = []
    for text in texts:
        try:
            value = loads(text)
        except (TypeError, ValueError):
            out.append(decode_headers(text))
            continue
        out.append(value if _flat(value) else None)
    return out


def _flat(value: Any) -> bool:
    """A JSON value is a header set: an object whose values are strings or null."""
    return type(value) is dict and all(v is None or type(v) is str for v in value.values())


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def _lone_surrogate(text: str) -> bool:
    """Does the text hold a \\u escape of half a UTF-16 surrogate pair without its other half?"""
    high_end = -1  # where the escape of a high surrogate waiting for its low half ends
    for m in _ESCAPE.finditer(text):
        unit = int(m.group(1), 16) if m.group(1) else None
        if high_end >= 0:
            if m.start() == high_end and unit is not None and 0xDC00 <= unit <= 0xDFFF:
                high_end = -1
                continue
            return True
        if unit is not None and 0xD800 <= unit <= 0xDBFF:
            high_end = m.end()
        elif unit is not None and 0xDC00 <= unit <= 0xDFFF:
            return True
    return high_end >= 0


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def encode_headers(headers: Mapping[str, str | None]) -> str:
    """Serialize headers as NServiceBus does: a flat object, ``/`` escaped as ``\\/``, non-ASCII raw."""
    return json.dumps(dict(headers), ensure_ascii=False, separators=(",", ":")).replace("/", "\\/")


def _dumps(headers: dict[str, str]) -> str:
    return json.dumps(headers, ensure_ascii=False, separators=(",", ":"))


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _text_encoder() -> Callable[[dict[str, str]], str]:
    """`_dumps` without its per-call set-up: the C encoder `json.dumps` builds on each call, made
    once (no check for circular references: a flat dict of strings has none). Used only if it
    writes what `json.dumps` writes; else (another Python, no C accelerator) `json.dumps` itself."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _dumps
    try:
        encode = make(None, _refuse, json.encoder.encode_basestring, None, ":", ",", False, False, True)
        sample = {"a/b": "\u00fc\x01\"\\\u2028\U0001f600", "": "", "k\t": "v\n"}
        if "".join(encode(sample, 0)) != _dumps(sample):
            return _dumps
    except Exception:  # noqa: BLE001 - another signature: the plain way
        return _dumps
    join = "".join
    return lambda headers: join(encode(headers, 0))


_encode_text = _text_encoder()


#: NServiceBus keeps at most this many characters of an exception message in its header
MAX_EXCEPTION_MESSAGE = 16384


#: the headers NServiceBus's recoverability adds to a message it moves to the error queue
FAILURE_HEADERS = (
    H.FAILED_Q, H.EXCEPTION_TYPE, H.EXCEPTION_MESSAGE, H.EXCEPTION_SOURCE, H.EXCEPTION_STACK_TRACE,
    H.TIME_OF_FAILURE, H.PROCESSING_ENDPOINT, H.PROCESSING_MACHINE, H.HOST_ID, H.HOST_DISPLAY_NAME,
)

#: headers NServiceBus removes from a message it moves to the error queue (MoveToError.cs)
RETRY_COUNTERS = (H.RETRIES, H.FL_RETRIES)


def machine() -> str:
    """This host's name, as ProcessingMachine, OriginatingMachine and the host display name give it."""
    return socket.gethostname()


def host_id(endpoint: str) -> str:
    """``$.diagnostics.hostid``: a Guid in "N" format, derived from the endpoint's name, so the same
    endpoint is the same host in ServicePulse across restarts and whichever cluster node runs
    its driver (NServiceBus derives its own from the process's path and machine name:
    ``DeterministicGuid``; a Spark job's driver moves between machines, its endpoint does not)."""
    return uuid.uuid5(_HOST_NAMESPACE, endpoint).hex


_HOST_NAMESPACE = uuid.UUID("6f1c3b0e-7a52-4d0b-9d8e-2b8f3c5a9e41")


def failure_headers(
    headers: Mapping[str, str | None], *, failed_q: str, exception_type: str, message: str, source: str,
    endpoint: str, data: Mapping[str, str] | None = None, stack_trace: str = "",
) -> dict[str, str | None]:
    """`headers` as NServiceBus's recoverability moves a message to the error queue (MoveToError,
    FaultMetadataExtractor): the retry counters removed (`RETRY_COUNTERS`), then FailedQ,
    ExceptionInfo.* (the message cut at 16,384 characters), TimeOfFailure, Processing*, the host
    ids, and `data` as ``NServiceBus.ExceptionInfo.Data.<key>`` (the exception's Data). The one
    builder of failure headers: poison claims, routing refusals, invalid sink rows, fail(),
    retry_later() past its maximum."""
    values = (failed_q, exception_type, message[:MAX_EXCEPTION_MESSAGE], source, stack_trace,
              format_time(datetime.now(timezone.utc)), endpoint, machine(), host_id(endpoint), machine())
    out = {k: v for k, v in headers.items() if k not in RETRY_COUNTERS}
    out.update(zip(FAILURE_HEADERS, values, strict=True))
    for key, value in (data or {}).items():
        out[f"{EXCEPTION_DATA}{key}"] = value
    return out


#: the prefix of the headers holding an exception's Data entries
EXCEPTION_DATA = "NServiceBus.ExceptionInfo.Data."


_TIME_FORMAT = "%Y-%m-%d %H:%M:%S:%f Z"


def as_utc(moment: datetime) -> datetime:
    """`moment` as an aware UTC time; a naive one is UTC already (the transport's clocks are UTC)."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def format_time(moment: datetime) -> str:
    """``2025-11-28 00:05:18:653833 Z``: NServiceBus's DateTimeOffsetHelper wire format (UTC)."""
    return as_utc(moment).strftime(_TIME_FORMAT)


_INT32 = 2**31 - 1
_TRY_PARSE = re.compile(r"\s*[+-]?\d+\s*", re.ASCII)


def retries_performed(headers: Mapping[str, Any]) -> int:
    """Delayed retries performed so far: ``NServiceBus.Retries`` as .NET's ``int.TryParse``
    reads it (0 when absent or not a 32-bit whole number; a negative count as 0)."""
    text = headers.get(H.RETRIES)
    if not isinstance(text, str) or not _TRY_PARSE.fullmatch(text):
        return 0
    n = int(text)
    return n if 0 <= n <= _INT32 else 0


def parse_time(text: str | None) -> datetime | None:
    """Inverse of `format_time`; None for text in another format."""
    if not text:
        return None
    # "2025-11-28 00:05:18:653833 Z" -> ISO 8601, which the C parser reads fast
    if len(text) == 28 and text[19] == ":" and text.endswith(" Z"):
        try:
            return datetime.fromisoformat(f"{text[:10]}T{text[11:19]}.{text[20:26]}+00:00")
        except ValueError:
            return None
    try:
        return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


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


_encode_string: Callable[[str], str] = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) uses


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


def _escaped(value: str) -> str:
    """`value` as a headers text holds it: a JSON string (`encode_headers`), ``/`` as ``\\/``."""
    return _encode_string(value).replace("/", "\\/")


def _inner_all(values: Sequence[str]) -> Sequence[str]:
    """`_escaped` of each value without its quotes: `values` themselves when none has a
    character to escape (ids usually: the usual case costs one pass over their joined text)."""
    joined = "".join(values)
    if "/" not in joined and len(_encode_string(joined)) == len(joined) + 2:  # escaping adds characters
        return values
    return [_escaped(v)[1:-1] for v in values]


def _each(value: str | Sequence[str]) -> Iterable[str]:
    return itertools.repeat(value) if isinstance(value, str) else value


#: byte -> the byte with a version-4 UUID's version nibble (byte 6), and its variant bits (byte 8)
_VERSION_4 = bytes((b & 0x0F) | 0x40 for b in range(256))
_VARIANT = bytes((b & 0x3F) | 0x80 for b in range(256))


def uuid4s(n: int) -> Iterator[bytes]:
    """`n` random version-4 UUIDs as 16 bytes each: the bits of ``uuid.uuid4()`` (`os.urandom`)
    from one read, without a `uuid.UUID` object each."""
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = raw[6::16].translate(_VERSION_4)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    ids = bytes(raw)
    return (ids[i:i + 16] for i in range(0, 16 * n, 16))


#: where the 32 hex digits of a UUID's text go in its 36 characters (the rest are dashes)
_HEX_AT = [p for p in range(36) if p not in (8, 13, 18, 23)]


def uuid4_list(n: int) -> list[str]:
    """`n` values of ``str(uuid.uuid4())`` (the bits of `uuid4s`: one `os.urandom` read), made
    with a few operations over all of them rather than some per id: each hex digit's column is
    copied into its place in one text of ``n`` lines, which is split once."""
    if n <= 0:
        return []
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = raw[6::16].translate(_VERSION_4)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    digits = raw.hex().encode("ascii")
    out = bytearray(b"-" * (37 * n))
    out[36::37] = b"\n" * n
    for j, p in enumerate(_HEX_AT):
        out[p::37] = digits[j::32]
    del out[-1]
    return out.decode("ascii").split("\n")


def uuid4_texts() -> Iterator[str]:
    """``str(uuid.uuid4())`` values without end, 256 from each `uuid4_list`. Make one per task in
    the task's own process (never shared by forked workers)."""
    while True:
        yield from uuid4_list(256)
