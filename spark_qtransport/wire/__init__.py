"""NServiceBus's wire format: header names (`names`), the Headers column read (`decode`: the poison
rule) and written (`encode`), failure headers (`failures`), times (`times`), the headers of what we
send (`outgoing`) and ids in bulk (`ids`). Everything public is importable from here."""

from __future__ import annotations

from .decode import decode_header_texts, decode_headers
from .encode import encode_headers
from .failures import (
    EXCEPTION_DATA,
    FAILURE_HEADERS,
    MAX_EXCEPTION_MESSAGE,
    RETRY_COUNTERS,
    failure_headers,
    host_id,
    machine,
    retries_performed,
)
from .ids import uuid4_list, uuid4_texts, uuid4s
from .names import INTENTS, RESERVED, H
from .outgoing import NOT_GIVEN_TEXT, SentHeaderText, given_texts, outgoing_headers
from .times import as_utc, format_time, parse_time

__all__ = [
    "H",
    "INTENTS",
    "RESERVED",
    "decode_headers",
    "decode_header_texts",
    "encode_headers",
    "FAILURE_HEADERS",
    "EXCEPTION_DATA",
    "MAX_EXCEPTION_MESSAGE",
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
