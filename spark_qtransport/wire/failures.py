"""The headers NServiceBus's recoverability gives a message it moves to the error queue, and the
retry counters it reads."""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .names import H
from .times import format_time

__all__ = ["FAILURE_HEADERS", "RETRY_COUNTERS", "EXCEPTION_DATA", "MAX_EXCEPTION_MESSAGE", "failure_headers", "host_id",
           "machine", "retries_performed"]


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
