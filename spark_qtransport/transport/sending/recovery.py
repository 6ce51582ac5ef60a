"""Recoverability for received messages the pipeline rejects: the sink's ``fail`` and ``retry``
intents (`spark.columns` fail() and retry_later()), as NServiceBus's recoverability treats a
message its handler could not process. No SQL; `builder.MessageBuilder` calls these per row.

- ``fail``: the received message (same MessageId, headers and body) to the sink's error queue,
  with the failure headers of `wire.failure_headers` (MoveToError, FaultMetadataExtractor).
- ``retry``: the received message back to the queue it came from, through the endpoint's delayed
  delivery, after ``delay x attempt`` seconds, with ``NServiceBus.Retries`` = attempt and
  ``NServiceBus.Retries.Timestamp`` = now (DelayedRetryExecutor); once ``max_retries`` delayed
  retries were performed, or the last one is more than a day old (DefaultRecoverabilityPolicy,
  HasReachedMaxTime), it fails instead.

The row's ``failure`` column holds the struct `FAILURE_FIELDS` describes. Its ``failed_q`` and
``claim_seq`` (the received row's ``queue`` and ``claim_seq``) name the claim: the dispatch that
sends the copy marks that claim failed in the same transaction, so the reader's acknowledgement
makes no audit copy, forwardTo copy or ServicePulse retry acknowledgement of it (NServiceBus audits
only what its handlers processed successfully).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from ...wire import H, format_time, parse_time, retries_performed

__all__ = ["FAIL", "RETRY", "RECOVERY", "FAILURE_FIELDS", "PROCESSING_FAILED", "SOURCE", "DEFAULT_DELAY",
           "DEFAULT_MAX_RETRIES", "MAX_AGE", "Failure", "InvalidFailure", "claim_of", "failed_q_of", "failure_of",
           "reached_max_time", "next_attempt", "retried_headers", "check_failure_type"]

FAIL, RETRY = "fail", "retry"
RECOVERY = (FAIL, RETRY)

#: the ``failure`` struct column: field -> Spark simpleString types it may have
FAILURE_FIELDS: dict[str, tuple[str, ...]] = {
    "exception_type": ("string",),
    "message": ("string",),
    "stack_trace": ("string",),
    "failed_q": ("string",),
    "max_retries": ("int", "bigint", "smallint", "tinyint"),
    "delay": ("double", "float", "int", "bigint", "smallint", "tinyint", "decimal"),
    # the received message's claim: the dispatch marks it failed, so it is not audited
    "claim_seq": ("bigint", "int"),
}

#: NServiceBus.ExceptionInfo.ExceptionType when none is given
PROCESSING_FAILED = "spark_qtransport.ProcessingFailed"
#: NServiceBus.ExceptionInfo.Source of fail() and retry_later() error copies
SOURCE = "spark_qtransport.pipeline"
#: NServiceBus's DefaultRecoverabilityPolicy: 3 delayed retries, 10 s x attempt
DEFAULT_DELAY, DEFAULT_MAX_RETRIES = 10.0, 3
#: no delayed retry once the last one is older than this (HasReachedMaxTime)
MAX_AGE = timedelta(days=1)



class Failure(NamedTuple):
    """A row's ``failure`` values, checked."""

    exception_type: str
    message: str
    stack_trace: str
    failed_q: str | None
    max_retries: int
    delay: float  # seconds per attempt
    claim_seq: int | None = None  # the received message's claim (None: not from a claim of ours)


class InvalidFailure(ValueError):  # noqa: N818 - becomes the builder's refusal of the row
    """A ``failure`` value the sink refuses: the field, why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field, self.reason = field, reason


def check_failure_type(type_text: str) -> str | None:
    """Why a ``failure`` column of this Spark type (simpleString, spaces removed) is refused, or
    None: a struct of fields from `FAILURE_FIELDS`, each of a type it lists."""
    if not (type_text.startswith("struct<") and type_text.endswith(">")):
        return "expected a struct (fail() and retry_later() build it)"
    inner = type_text[len("struct<"):-1]
    for part in filter(None, re.split(r",(?![^(]*\))", inner)):  # decimal(10,2) keeps its comma
        name, _, typ = part.partition(":")
        if name not in FAILURE_FIELDS:
            return f"field {name!r} is not one of {', '.join(FAILURE_FIELDS)}"
        if not any(typ == t or typ.startswith(t + "(") for t in FAILURE_FIELDS[name]):
            return f"field {name!r} has type {typ}; expected {' or '.join(FAILURE_FIELDS[name])}"
    return None


def _text(value: Any, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidFailure(field, f"{value!r} is not text")
    return value


def failure_of(value: Any, intent: str, max_seconds: float) -> Failure:
    """The ``failure`` column's values, checked (`InvalidFailure` names the field). A missing
    column or null fields take the defaults: a NULL reason is an empty message."""
    if value is None:
        fields: Mapping[str, Any] = {}
    elif isinstance(value, Mapping):
        fields = value
    elif hasattr(value, "asDict"):  # a Spark Row
        fields = value.asDict()
    else:
        raise InvalidFailure("failure", f"{type(value).__name__} is not a struct")
    failed_q = fields.get("failed_q")
    if failed_q is not None and not isinstance(failed_q, str):
        raise InvalidFailure("failed_q", f"{failed_q!r} is not text")
    max_retries = fields.get("max_retries")
    if max_retries is None:
        max_retries = DEFAULT_MAX_RETRIES
    elif isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise InvalidFailure("max_retries", f"must be a whole number, 0 or more, not {max_retries!r}")
    delay = fields.get("delay")
    if delay is None:
        delay = DEFAULT_DELAY
    else:
        try:
            delay = float(delay)
        except (TypeError, ValueError, OverflowError):
            raise InvalidFailure("delay", f"{delay!r} is not a number of seconds") from None
        if not math.isfinite(delay) or delay < 0:
            raise InvalidFailure("delay", f"must be a finite number of seconds, 0 or more, not {delay!r}")
        if intent == RETRY and delay * max(max_retries, 1) > max_seconds:
            raise InvalidFailure("delay", f"{delay!r} s x {max_retries} retries is longer than {max_seconds:.0f} s")
    exception_type = _text(fields.get("exception_type"), "exception_type") or PROCESSING_FAILED
    return Failure(exception_type, _text(fields.get("message"), "message"),
                   _text(fields.get("stack_trace"), "stack_trace"), failed_q, max_retries, delay,
                   claim_of(fields))


def _field(failure: Any, name: str) -> Any:
    """One field of a ``failure`` value (a mapping, a Spark Row); None when it has none or is not
    a struct. Never raises: what `failure_of` would refuse reads as nothing here."""
    try:
        return (failure if isinstance(failure, Mapping) else failure.asDict()).get(name)
    except Exception:  # noqa: BLE001 - not a struct
        return None


def failed_q_of(failure: Any) -> str | None:
    """The ``failed_q`` of a ``failure`` value, if it holds text."""
    value = _field(failure, "failed_q")
    return value if isinstance(value, str) and value else None


def claim_of(failure: Any) -> int | None:
    """The ``claim_seq`` of a ``failure`` value, if it holds a whole number (an unreadable one
    marks nothing)."""
    seq = _field(failure, "claim_seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None


def reached_max_time(headers: Mapping[str, Any], now: datetime) -> bool:
    """HasReachedMaxTime: ``NServiceBus.Retries.Timestamp`` (set by every delayed retry, so the
    last one's time) is more than `MAX_AGE` before `now`; an absent or unreadable one is not."""
    text = headers.get(H.RETRIES_TIMESTAMP)
    stamp = parse_time(text) if isinstance(text, str) else None
    return stamp is not None and now > stamp + MAX_AGE


def next_attempt(failure: Failure, headers: Mapping[str, Any], now: datetime) -> int | None:
    """The delayed retry to make (1, 2, ...), or None: to the error queue."""
    performed = retries_performed(headers)
    if performed >= failure.max_retries or reached_max_time(headers, now):
        return None
    return performed + 1


def retried_headers(headers: Mapping[str, Any], attempt: int, now: datetime | str) -> dict[str, Any]:
    """The received headers with ``NServiceBus.Retries`` = attempt and its timestamp = now."""
    out = dict(headers)
    out[H.RETRIES] = str(attempt)
    out[H.RETRIES_TIMESTAMP] = now if isinstance(now, str) else format_time(now)
    return out
