"""The sink's checks of an input row's values, and the text its errors and error copies show of
them: a refused row is a `Refused` (the column, the reason, the message), which the builder turns
into a `MessageError` or an error copy. Runs on executors; no SQL."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from ...wire import RESERVED, H

__all__ = ["Refused", "Timing", "MAX_SECONDS", "SHOWN_CHARS", "shown", "timespan", "seconds_of", "no_nul",
           "given_headers", "related_to", "clean", "loose_headers"]


#: how much of a refused value an error shows (its repr: control characters escaped)
SHOWN_CHARS = 200


def shown(value: Any) -> str:
    """A value as an error shows it: its repr (NUL and control characters escaped), at most
    `SHOWN_CHARS` characters of it."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an object without a usable repr
        text = f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


class Refused(Exception):  # noqa: N818 - becomes a MessageError (`MessageBuilder.error`)
    """A row refused by a check: the column (and the part of it, `field`), why, and the message
    id the row was being built with (given, or generated for it)."""

    def __init__(self, column: str, reason: str, message_id: Any, *, field: str | None = None,
                 setting: str | None = None) -> None:
        super().__init__(reason)
        self.column, self.reason, self.message_id, self.field, self.setting = column, reason, message_id, field, setting


def timespan(seconds: float) -> str:
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


def seconds_of(value: Any, column: str, message_id: str, limit: float = MAX_SECONDS) -> float | None:
    """A duration column in seconds: finite and at most `limit` (negative values are the caller's)."""
    if value is None:
        return None
    try:
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise Refused(column, f"{shown(value)} is not a number of seconds", message_id) from None
    if not math.isfinite(seconds):
        raise Refused(column, f"{shown(value)} is not a finite number of seconds", message_id)
    if seconds > limit:
        raise Refused(column, f"{shown(value)} is too long ({seconds:.0f} s; at most {limit:.0f} s, about "
                               f"{limit / (365.25 * 86_400):.0f} years)", message_id)
    return seconds


def no_nul(value: Any, column: str, message_id: str, *, field: str | None = None) -> None:
    """PostgreSQL text cannot hold a NUL character: refuse it here, naming the message. `field`:
    the part of the column named in the message (a header), when not the whole column."""
    if isinstance(value, str) and "\x00" in value:
        raise Refused(column, f"{shown(value)} contains a NUL character (\\x00)", message_id, field=field)


class Timing(NamedTuple):
    ttbr: float | None  # seconds
    delay: float | None  # seconds, not negative
    deliver_at: datetime | None  # aware, in the future
    due_now: bool = False  # deliver_at was in the past: delayed by 0

    @property
    def deferred(self) -> bool:
        return self.deliver_at is not None or self.due_now or (self.delay is not None and self.delay > 0)


def given_headers(given: Any, message_id: str) -> dict[str, Any]:
    """The headers column as a dict without null values, refusing NUL characters."""
    if given is not None and not isinstance(given, Mapping):
        given = dict(given)  # Arrow maps arrive as (key, value) pairs
    headers = {k: v for k, v in (given or {}).items() if v is not None}
    for key, value in headers.items():
        no_nul(key, "headers", message_id)
        no_nul(value, "headers", message_id, field=f"headers[{key!r}]")
    return headers


def related_to(given: Any) -> str | None:
    """The NServiceBus.RelatedTo header of a headers column, if it has one (text)."""
    try:
        value = (given if isinstance(given, Mapping) else dict(given or ())).get(H.RELATED_TO)
    except Exception:  # noqa: BLE001 - not a map: no related message
        return None
    return value if isinstance(value, str) and value else None


def clean(value: Any) -> str | None:
    """Text a header of an error copy can hold: NUL escaped (PostgreSQL text cannot hold it);
    None for no value."""
    if value is None or value == "":
        return None
    return (value if isinstance(value, str) else shown(value)).replace("\x00", "\\x00")


def loose_headers(given: Any) -> dict[str, str]:
    """The headers column of a refused row, as an error copy carries them: text, NUL escaped,
    without null values or the transport's reserved headers. Never raises."""
    try:
        pairs = list((given if isinstance(given, Mapping) else dict(given or ())).items())
    except Exception:  # noqa: BLE001 - not a map: none
        return {}
    out: dict[str, str] = {}
    for key, value in pairs:
        name, text = clean(key), clean(value)
        if name is not None and text is not None and name not in RESERVED:
            out[name] = text
    return out
