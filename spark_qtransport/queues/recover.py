"""Return failed messages from the error queue to the queues they failed in (``NServiceBus.FailedQ``).

What ServiceControl's retry does for NServiceBus endpoints, for a database without ServiceControl:
each message goes back with its headers, minus the failure headers recoverability added, under a
new native id, in one transaction with its removal from the error queue. A message that cannot go
back (no FailedQ, unreadable headers, a queue that no longer exists) stays where it is, reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..dialects import Dialect, QueueAddress
from ..errors import ConfigError
from ..wire import H, decode_headers, encode_headers
from . import _db as db

__all__ = ["RetryResult", "retry_failed", "is_failure_header"]

_EXCEPTION_PREFIX = "NServiceBus.ExceptionInfo."


def is_failure_header(name: str) -> bool:
    """Headers NServiceBus recoverability adds when it moves a message to the error queue."""
    return name in (H.FAILED_Q, H.TIME_OF_FAILURE) or name.startswith(_EXCEPTION_PREFIX)


@dataclass
class RetryResult:
    moved: dict[str, int] = field(default_factory=dict)  # destination -> messages
    kept: list[tuple[str, str]] = field(default_factory=list)  # (native id, why it stayed)


def retry_failed(
    conn: Any, dialect: Dialect, error_queue: QueueAddress, *, native_ids: list[str] | None, limit: int = 1000
) -> RetryResult:
    """Move failed messages (the given native ids, else the oldest `limit`) back; one transaction."""
    result = RetryResult()
    cur = conn.cursor()
    rows = cur.execute(*db.args(dialect.lock_messages(error_queue, native_ids=native_ids, limit=limit))).fetchall()
    groups: dict[str, tuple[QueueAddress, list[str], list[str]]] = {}
    columns: dict[str, dict[str, str]] = {}
    for key, native_id, text in rows:
        native_id = str(native_id).lower()
        headers = decode_headers(text)
        target_text = (headers or {}).get(H.FAILED_Q)
        if headers is None or not target_text:
            result.kept.append((native_id, "no NServiceBus.FailedQ header" if headers is not None else "headers are not a flat JSON object"))
            continue
        try:
            target = dialect.parse_address(target_text, option=H.FAILED_Q)
        except ConfigError as exc:
            result.kept.append((native_id, str(exc)))
            continue
        name = dialect.qualified(target)
        if name not in columns:
            columns[name] = db.columns(cur, dialect.queue_columns(target))
        if not columns[name]:
            result.kept.append((native_id, f"queue {target_text} does not exist"))
            continue
        group = groups.setdefault(name, (target, [], []))
        group[1].append(str(key))
        group[2].append(encode_headers({k: v for k, v in headers.items() if not is_failure_header(k)}))
    for name, (target, keys, headers_list) in groups.items():
        recoverable = "recoverable" in columns[name]
        db.execute(cur, dialect.move_messages(error_queue, target, keys=keys, headers=headers_list, recoverable=recoverable))
        result.moved[dialect.format_address(target)] = len(keys)
    moved_keys = [k for _, keys, _ in groups.values() for k in keys]
    if moved_keys:
        db.execute(cur, dialect.delete_messages(error_queue, keys=moved_keys))
    conn.commit()
    if native_ids is not None:
        found = {str(r[1]).lower() for r in rows}
        result.kept += [(i.lower(), "not in the error queue (or held by another session)") for i in native_ids
                        if i.lower() not in found]
    return result
