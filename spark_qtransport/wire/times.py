"""NServiceBus's wire format for times (DateTimeOffsetHelper), in UTC."""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["as_utc", "format_time", "parse_time"]


_TIME_FORMAT = "%Y-%m-%d %H:%M:%S:%f Z"


def as_utc(moment: datetime) -> datetime:
    """`moment` as an aware UTC time; a naive one is UTC already (the transport's clocks are UTC)."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def format_time(moment: datetime) -> str:
    """``2025-11-28 00:05:18:653833 Z``: NServiceBus's DateTimeOffsetHelper wire format (UTC)."""
    return as_utc(moment).strftime(_TIME_FORMAT)


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
