"""The column-wise build's pieces (`MessageBuilder.build_columns`): which columns it reads, the
given headers of a batch as text (`given_columns`), intents, and rows grouped by (kind, route).
Runs on executors; no SQL."""

from __future__ import annotations

from typing import Any

from ...wire import INTENTS, NOT_GIVEN_TEXT, H, given_texts

__all__ = ["TEXT_COLUMNS", "ROW_WISE_COLUMNS", "TEXT_TYPES", "BODY_TYPES", "Keys", "RowByRow", "given_columns",
           "intent_of", "intents_of", "groups"]


#: the columns `build_columns` reads; it ignores any other, as `_fast` does (``failure``: only
#: intents fail and retry read it, and their rows are built by `build`)
TEXT_COLUMNS = ("message_id", "message_type", "correlation_id", "reply_to", "destination", "intent")
#: columns whose rows `build` builds when they hold a value
ROW_WISE_COLUMNS = ("time_to_be_received", "delay", "deliver_at")
TEXT_TYPES = frozenset((str, type(None)))
BODY_TYPES = frozenset((bytes, str, type(None)))
#: (kind, route) of every row, or one per row (a route None: not known yet, or refused)
Keys = tuple[str, Any] | list[tuple[str, Any]]


class RowByRow(Exception):  # noqa: N818 - `build_columns` leaves the batch to `build`
    """A batch whose rows are better built by `build` (`given_columns`: forwarded messages)."""


def given_columns(headers: list[Any] | None, n: int, odd: set[int]) -> tuple[list[str], list[str | None]] | tuple[None, None]:
    """The ``headers`` column as `build_columns` takes it: per row, the text of its given headers
    (`given_texts`) and its given ConversationId (None: a new one), for rows whose headers are
    (key, value) pairs of text without NUL, each key once, none of `NOT_GIVEN_TEXT` (else the
    row is added to `odd`). Rows with the same keys are done together. (None, None): no headers.
    Raises `RowByRow` when the first row with headers has one that `_fast` fills in (a
    forwarded message's MessageId, say): its batch is likely all such rows, not worth a pass."""
    if headers is None or headers.count(None) == n:
        return None, None
    first = next(filter(None, headers), None)  # forwarded messages' headers (a MessageId...): all row by row, unread
    if first is None:
        return None, None  # empty maps: as none
    if type(first) is not list or not NOT_GIVEN_TEXT.isdisjoint(name for name, _ in first):
        raise RowByRow
    by_names: dict[tuple[Any, ...], list[int]] = {}
    for i, pairs in enumerate(headers):
        if pairs:
            if type(pairs) is not list:
                odd.add(i)
                continue
            try:
                by_names.setdefault(tuple([name for name, _ in pairs]), []).append(i)
            except (TypeError, ValueError):
                odd.add(i)
    texts: list[str] = [""] * n
    conversations: list[str | None] = [None] * n
    for names, rows in by_names.items():
        if (not all(type(name) is str for name in names) or len(set(names)) < len(names)
                or "\x00" in "".join(names) or not NOT_GIVEN_TEXT.isdisjoint(names)):
            odd.update(rows)
            continue
        values = [[headers[i][j][1] for i in rows] for j in range(len(names))]
        bad = {r for column in values for r, v in enumerate(column) if type(v) is not str or "\x00" in v}
        if bad:
            odd.update(rows[r] for r in bad)
            rows = [i for r, i in enumerate(rows) if r not in bad]
            values = [[v for r, v in enumerate(column) if r not in bad] for column in values]
        if not rows:
            continue
        if H.CONVERSATION_ID in names:
            for i, value in zip(rows, values[names.index(H.CONVERSATION_ID)], strict=True):
                conversations[i] = value
        rest = [(name, column) for name, column in zip(names, values, strict=True) if name != H.CONVERSATION_ID]
        if rest:
            for i, text in zip(rows, given_texts([name for name, _ in rest], [column for _, column in rest]), strict=True):
                texts[i] = text
    return texts, conversations


def intent_of(value: str | None) -> str | None:
    """The MessageIntent of an intent column's value, as `_fast` reads it (None: not one it takes)."""
    return INTENTS.get((value or "send").strip().lower())


def intents_of(values: list[str | None]) -> dict[str | None, str]:
    """The MessageIntent of each distinct value of a plain rows' intent column."""
    return {value: INTENTS[(value or "send").strip().lower()] for value in set(values)}


def groups(keys: Keys, start: int, end: int, *columns: list[Any]) -> list[tuple[tuple[str, str], list[list[Any]]]]:
    """Rows ``start`` to ``end`` of `columns`, by (kind, route) (`keys`: one for all, or one each),
    each key's in order."""
    if isinstance(keys, tuple):
        return [(keys, [c[start:end] for c in columns])]
    if len(set(keys[start:end])) == 1:
        return [(keys[start], [c[start:end] for c in columns])]
    rows: dict[tuple[str, str], list[int]] = {}
    for i in range(start, end):
        rows.setdefault(keys[i], []).append(i)
    return [(key, [[c[i] for i in picked] for c in columns]) for key, picked in rows.items()]
