"""NServiceBus wire format: header names, the headers JSON column and the transport's timestamps."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timezone

__all__ = [
    "H",
    "INTENTS",
    "RESERVED",
    "decode_headers",
    "encode_headers",
    "encode_text_headers",
    "FAILURE_HEADERS",
    "failure_headers",
    "format_time",
    "outgoing_headers",
    "parse_time",
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


#: intent column values -> the NServiceBus.MessageIntent header
INTENTS = {"send": "Send", "publish": "Publish", "reply": "Reply"}

#: headers a sender must never set: the transport and NServiceBus own them
RESERVED = (H.FORWARD_DESTINATION, H.CONTROL_MESSAGE)


def decode_headers(text: str | None) -> dict[str, str | None] | None:
    """Parse the Headers column; None when it is not a flat JSON object of strings (or nulls).

    The claim transaction already sends such rows to the error queue; this is the same rule in
    Python, for rows read by other paths (peek, CLI) and for tests.
    """
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    for v in value.values():
        if v is not None and not isinstance(v, str):
            return None
    return value


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


def encode_text_headers(headers: dict[str, str]) -> str:
    """`encode_headers` for a plain dict whose keys and values are all `str` (no None): the same
    text, written faster (the staging hot path; other values are the caller's to avoid)."""
    return _encode_text(headers).replace("/", "\\/")


#: NServiceBus keeps at most this many characters of an exception message in its header
MAX_EXCEPTION_MESSAGE = 16384


#: the headers NServiceBus's recoverability adds to a message it moves to the error queue
FAILURE_HEADERS = (
    H.FAILED_Q, "NServiceBus.ExceptionInfo.ExceptionType", "NServiceBus.ExceptionInfo.Message",
    "NServiceBus.ExceptionInfo.Source", "NServiceBus.ExceptionInfo.StackTrace", H.TIME_OF_FAILURE,
    "NServiceBus.ProcessingEndpoint", "NServiceBus.ProcessingMachine",
)


def failure_headers(
    headers: Mapping[str, str | None], *, failed_q: str, exception_type: str, message: str, source: str,
    endpoint: str,
) -> dict[str, str | None]:
    """`headers` plus the failure headers NServiceBus's recoverability adds before it moves a
    message to the error queue (FailedQ, ExceptionInfo.*, TimeOfFailure, Processing*)."""
    values = (failed_q, exception_type, message[:MAX_EXCEPTION_MESSAGE], source, "",
              format_time(datetime.now(timezone.utc)), endpoint, socket.gethostname())
    return {**headers, **dict(zip(FAILURE_HEADERS, values, strict=True))}


_TIME_FORMAT = "%Y-%m-%d %H:%M:%S:%f Z"


def format_time(moment: datetime) -> str:
    """``2025-11-28 00:05:18:653833 Z``: NServiceBus's DateTimeOffsetHelper wire format (UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime(_TIME_FORMAT)


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
