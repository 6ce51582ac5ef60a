"""NServiceBus wire format: header names, the headers JSON column and the transport's timestamps."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone

__all__ = [
    "H",
    "decode_headers",
    "encode_headers",
    "format_time",
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
