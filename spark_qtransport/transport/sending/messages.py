"""Outgoing messages: the sink's input columns (`INPUT_COLUMNS`), the staged row (`StagedRow`, the
staging table's columns in the order they are written) and the values' checks. `builder.py`
turns input rows into staged rows, one `MessageBuilder` per Spark task. No SQL.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from ...dialects import QueueAddress
from ...errors import ConfigError, MessageError
from .recovery import check_failure_type

__all__ = ["INPUT_COLUMNS", "SEND", "PUBLISH", "DELAYED", "StagedRow", "RowGroup", "InputColumns", "SendPlan",
           "check_columns", "topics_of"]

#: kinds of staged rows
SEND, PUBLISH, DELAYED = "s", "p", "d"

#: input column -> what it may hold (Spark simpleString prefixes), for clear errors at start
INPUT_COLUMNS: dict[str, tuple[str, ...]] = {
    "body": ("binary", "string"),
    "destination": ("string",),
    "headers": ("map<string,string>",),
    "message_id": ("string",),
    "message_type": ("string",),
    "intent": ("string",),
    "correlation_id": ("string",),
    "reply_to": ("string",),
    "time_to_be_received": ("int", "bigint", "smallint", "tinyint", "double", "float", "decimal", "interval"),
    "deliver_at": ("timestamp", "timestamp_ntz"),
    "delay": ("int", "bigint", "smallint", "tinyint", "double", "float", "decimal", "interval"),
    "failure": ("struct",),  # of intents fail and retry: `recovery.FAILURE_FIELDS`
}

#: Spark's YearMonthIntervalType (simpleString without spaces: ``intervalyeartomonth``, ``intervalmonth``)
_YEAR_MONTH = ("intervalyear", "intervalmonth")
_DURATIONS = ("delay", "time_to_be_received")


class StagedRow(NamedTuple):
    """One message as staged: the staging table's columns, in the order executors bulk-write them
    (the dialects' `STAGED_COLUMNS` names the same fields)."""

    sink: str
    batch_id: int
    attempt: str  # the task attempt that staged it; only reported attempts are dispatched
    kind: str  # SEND, PUBLISH or DELAYED
    route: str  # canonical destination address; for PUBLISH the EnclosedMessageTypes value
    message_id: str
    headers: str  # JSON text
    body: bytes | None
    ttbr_ms: int | None  # time to be received
    delay_ms: int | None  # delay from the dispatch (None with `due`)
    due: datetime | None  # deliver_at

    @property
    def size(self) -> int:
        """Headers and body bytes: what a row costs in memory and on the wire."""
        return len(self.headers) + len(self.body or b"")


#: `StagedRow` fields a `RowGroup` carries, column by column (the rest are the group's, or the driver's)
GROUPED_FROM = StagedRow._fields.index("message_id")
_new_staged_row = functools.partial(tuple.__new__, StagedRow)


class RowGroup(NamedTuple):
    """Messages of one (kind, route), column by column: `StagedRow`'s fields from ``message_id``
    on, one sequence each. How a task hands its messages to the driver (a commit message pickles
    a few sequences of strings and bytes rather than an object per message), and how the builder
    makes the rows that take its column-wise path (`MessageBuilder.build_columns`)."""

    kind: str
    route: str
    columns: tuple[Sequence[Any], ...]

    def rows(self, sink: str, batch_id: int, attempt: str) -> list[StagedRow]:
        fixed = (sink, batch_id, attempt, self.kind, self.route)
        return list(map(_new_staged_row, map(fixed.__add__, zip(*self.columns, strict=True))))

    @property
    def size(self) -> int:
        """Headers and body bytes of its messages (`StagedRow.size` summed)."""
        _, headers, bodies = self.columns[:3]
        return sum(map(len, headers)) + sum(map(len, filter(None, bodies)))


class InputColumns:
    """A slice of a task's input, column by column: the column names and one list of Python
    values per column, all of one length. Iterating it gives its rows, each a dict (column name
    -> value), as the builder's row-wise path takes them."""

    __slots__ = ("names", "columns")

    def __init__(self, names: Sequence[str], columns: Sequence[list[Any]]) -> None:
        self.names = list(names)
        self.columns = list(columns)

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        names = self.names
        return (dict(zip(names, values, strict=True)) for values in zip(*self.columns, strict=True))

    def row(self, i: int) -> dict[str, Any]:
        return dict(zip(self.names, (column[i] for column in self.columns), strict=True))

    @classmethod
    def of(cls, rows: Sequence[dict[str, Any]]) -> InputColumns:
        """Rows (dicts) as columns: every column any row has, None where a row has none."""
        names = list(dict.fromkeys(itertools.chain.from_iterable(rows)))
        return cls(names, [[row.get(name) for row in rows] for name in names])


def check_columns(fields: Sequence[tuple[str, str]]) -> None:
    """Check the input schema, given as (name, Spark simpleString) pairs: `body` present, no
    unknown column, every column of a usable type. Runs on the driver when the query starts."""
    names = [n for n, _ in fields]
    unknown = [n for n in names if n not in INPUT_COLUMNS]
    if unknown:
        raise ConfigError(
            f"unknown column(s) {', '.join(repr(u) for u in unknown)} for the sqlqueue sink; "
            f"it takes: {', '.join(INPUT_COLUMNS)} (drop or rename the others)"
        )
    if "body" not in names:
        raise ConfigError("the sqlqueue sink needs a 'body' column (binary or string)")
    if "deliver_at" in names and "delay" in names:
        raise ConfigError("columns 'deliver_at' and 'delay' both given: use one of them")
    for name, given in fields:
        typ = given.replace(" ", "").lower()
        if name == "failure":
            problem = check_failure_type(typ)
            if problem is not None:
                raise ConfigError(f"column 'failure' has type {given}: {problem}", column=name)
            continue
        if name in _DURATIONS and typ.startswith(_YEAR_MONTH):
            raise MessageError(
                f"column {name!r} has type {given}: a year-month interval has no "
                "fixed length in seconds; use a day-time interval (INTERVAL '30' DAY) or a number of seconds",
                column=name,
            )
        if not any(typ == t or typ.startswith(t + "(") or typ.startswith(t + " ") or (t == "interval" and "interval" in typ)
                   for t in INPUT_COLUMNS[name]):
            raise ConfigError(f"column {name!r} has type {typ}; expected {' or '.join(INPUT_COLUMNS[name])}",
                              column=name)


def _full_name(type_name: str) -> str:
    """A .NET type's FullName from its assembly-qualified name: the text before the first comma
    outside square brackets. A generic type's FullName holds its arguments' assembly-qualified
    names (``Envelope`1[[Sales.OrderPlaced, Sales, Version=1.0.0.0]]``); a backslash escapes the
    next character (.NET's type name syntax: ``\\,``, ``\\[``)."""
    depth = 0
    escaped = False
    for i, ch in enumerate(type_name):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            return type_name[:i].strip()
    return type_name.strip()


def topics_of(message_types: str) -> list[str]:
    """Subscription topics of an EnclosedMessageTypes value: each type's FullName (NServiceBus's
    TopicName.From), its assembly cut off (``Sales.OrderPlaced, Sales, Version=1.0.0.0`` ->
    ``Sales.OrderPlaced``; a generic type keeps its bracketed arguments whole)."""
    out = []
    for entry in message_types.split(";"):
        name = _full_name(entry)
        if name and name not in out:
            out.append(name)
    return out


@dataclass(frozen=True)
class SendPlan:
    """What a Spark task needs to stage its rows (pickled to executors). No password in repr."""

    dialect: str
    endpoint: str  # the endpoint's name, for OriginatingEndpoint
    default_destination: QueueAddress | None
    reply_to: str | None  # ReplyToAddress for messages without one (the endpoint's input queue)
    content_type: str
    sink: str
    #: the endpoint's address: NServiceBus.FailedQ of an error copy whose row names no usable
    #: destination (otherwise FailedQ is the destination, so a retry delivers it there; default `endpoint`)
    failed_q: str | None = None
    #: the sink's error queue (canonical address): where fail() and retry_later() rows go, and the
    #: error copies of rows the sink cannot build (`invalid_to`)
    error_queue: str | None = None
    #: a row the sink cannot build fails the task instead (invalidRows=fail)
    invalid_fail: bool = False

    @property
    def invalid_to(self) -> str | None:
        """Where rows the sink cannot build go, as error copies; None: such a row fails the task."""
        return None if self.invalid_fail else self.error_queue
