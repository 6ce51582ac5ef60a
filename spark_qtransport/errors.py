"""Exceptions raised by spark_qtransport.

The hierarchy::

    QTransportError               root; picklable, so Spark can carry it from executors to the driver
     ├── ConfigError              a bad option, URL or queue address (names the option at fault)
     ├── MessageError             a row given to the sink cannot be a message (names the column and message id)
     ├── QueueNotFoundError       a queue or one of our tables does not exist
     ├── SchemaError              a table exists but its columns do not fit the transport
     ├── ConsumerBusyError        another running query already uses this consumer identity
     ├── OffsetError              a checkpointed offset does not fit the tables it names
     ├── OutboxConflictError      a batch id was dispatched before by another query (checkpoint reset)
     ├── OutboxRaceError          the outbox changed under a dispatch (a concurrent cleanup): transient, retried
     ├── DispatchError            a batch could not be dispatched as staged (nothing was sent)
     └── DatabaseError            a database call failed for good (after retrying transient faults);
                                  names the operation and the queue, the driver's error is its cause

Each error carries, besides its one-line message, the fields that say where it arose (those that
apply; the others are None): ``queue`` (the queue or table, as written), ``option`` (the option at
fault, as the front end that took it calls it), ``field`` (the settings field at fault: what the
transport names, below the front ends; its message then starts ``<field>: ``, and `named` gives it
the front end's name), ``column`` (an input column), ``sqlstate`` (the driver's code) and ``operation`` (what was
being done). Code that handles errors reads the fields; people read the message.

Through Spark the Python object does not arrive: Spark turns it into text inside its own exception
(`AnalysisException`, `StreamingQueryException`, `PythonException`, or a Spark Connect error). So an
error leaving a method Spark calls carries a tag at the end of its one line, ``[qtransport
{"error":"ConfigError","option":"queue"}]`` (the class and the set fields, ASCII JSON), and
`unwrap` reads it back: ``unwrap(exc)`` returns our error, with its class and fields, from any of
those exceptions (their causes included), or None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import ClassVar

__all__ = [
    "unwrap",
    "tagged",
    "named",
    "field_error",
    "QTransportError",
    "ConfigError",
    "MessageError",
    "OutboxRaceError",
    "QueueNotFoundError",
    "SchemaError",
    "ConsumerBusyError",
    "OffsetError",
    "OutboxConflictError",
    "DispatchError",
    "DatabaseError",
]


class QTransportError(Exception):
    """Base class of every error raised by spark_qtransport."""

    #: the fields an error may carry (keyword arguments of every subclass)
    FIELDS = ("queue", "option", "field", "column", "sqlstate", "operation")
    #: worth running the transaction again (the retry policy, `transport.session`, retries it)
    transient: ClassVar[bool] = False

    def __init__(
        self,
        message: str = "",
        *,
        queue: str | None = None,
        option: str | None = None,
        field: str | None = None,
        column: str | None = None,
        sqlstate: str | None = None,
        operation: str | None = None,
    ) -> None:
        super().__init__(message)
        self.queue = queue
        self.option = option
        self.field = field
        self.column = column
        self.sqlstate = sqlstate
        self.operation = operation

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def fields(self) -> dict[str, str]:
        """The fields that are set."""
        return {k: v for k in self.FIELDS if (v := getattr(self, k, None)) is not None}

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Picklable with its fields whatever the subclass: Spark pickles exceptions.
        return (_rebuild, (self.__class__, self.args, self.fields()))


def _rebuild(cls: type[QTransportError], args: tuple[object, ...], fields: dict[str, str]) -> QTransportError:
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    for key in QTransportError.FIELDS:
        setattr(exc, key, fields.get(key))
    return exc


class ConfigError(QTransportError, ValueError):
    """An option, URL or queue address is missing or invalid."""


class MessageError(QTransportError, ValueError):
    """A row given to the sink cannot be sent: a value out of range, a NUL byte, a bad intent.
    Names the column and the message (its message_id, else for a reply the message it answers).
    Raised with option invalidRows=fail (the batch fails and nothing of it is sent); by default
    the row goes to the sink's error queue instead, this error's text in its failure headers."""


class QueueNotFoundError(QTransportError):
    """A queue table (or a table of ours) does not exist."""


class SchemaError(QTransportError):
    """A table exists but does not have the columns the transport needs."""


class ConsumerBusyError(QTransportError):
    """Another running query already claims messages under this consumer identity."""


class OffsetError(QTransportError):
    """A checkpointed offset cannot be interpreted."""


class OutboxConflictError(QTransportError):
    """The outbox holds this batch id from another query: the checkpoint was reset or reused."""


class OutboxRaceError(QTransportError):
    """The outbox changed under a dispatch (its record vanished: a concurrent cleanup). Transient:
    the dispatch is retried, and finds the batch's record or writes it."""

    transient = True


class DispatchError(QTransportError):
    """A batch could not be dispatched as its tasks staged it; nothing of it was sent."""


class DatabaseError(QTransportError):
    """A database call failed: a persistent fault, or a transient one that outlasted the retries."""


def field_error(field: str, detail: str, *, kind: type[QTransportError] | None = None, **fields: str) -> QTransportError:
    """The error of a settings field, ``<field>: <detail>``, for a front end to name (`named`). Other
    fields the detail refers to are written in backticks (``create_queues``): `named` names those too."""
    return (kind or ConfigError)(f"{field}: {detail}", field=field, **fields)


#: how a field's detail that goes on its name starts: ``option 'x' is empty`` (others: ``option 'x': invalid ...``)
_PREDICATES = ("is ", "must ", "names ", "contains ")


def _called(name: str) -> str:
    return name if name.startswith("-") else f"option '{name}'"


def named(exc: QTransportError, names: Mapping[str, str], *, called: Callable[[str], str] = _called) -> QTransportError:
    """`exc` with the settings fields it names called what a front end calls them (``names``:
    field -> an option's name, or a command line flag): the field at fault (`exc.field`; its message
    then starts ``option 'errorQueue': `` or ``--error-queue: `` and its ``option`` is set to the
    name) and every field any message refers to in backticks (``create_queues``); `called` says how a
    name reads in a sentence (an option: ``option 'x'``; a flag or argument as it is). Anything else as it is."""
    if exc.option is not None:
        return exc  # named already
    text = re.sub(r"`([a-z_]+)`", lambda m: called(names[m[1]]) if m[1] in names else m[0], exc.message)
    if exc.field is None or exc.field not in names:
        return exc if text == exc.message else _rebuild(type(exc), (text, *exc.args[1:]), exc.fields())
    prefix = f"{exc.field}: "
    name = names[exc.field]
    if exc.message.startswith(prefix):
        rest = text[len(prefix):]
        text = f"{called(name)}{' ' if rest.startswith(_PREDICATES) else ': '}{rest}"
    return _rebuild(type(exc), (text, *exc.args[1:]), {**exc.fields(), "option": name})


# -- through Spark: the tag, and reading it back -------------------------------------------------

#: what starts the tag at the end of an error's text (see the module's docstring)
TAG = "[qtransport "


def _classes() -> dict[str, type[QTransportError]]:
    found: dict[str, type[QTransportError]] = {}
    todo: list[type[QTransportError]] = [QTransportError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found


def _untag(text: str) -> str:
    at = text.find(TAG)
    return text if at < 0 else text[:at].rstrip()


def tagged(exc: QTransportError) -> QTransportError:
    """A copy of `exc` (same class and fields) whose message is one line ending with the tag
    `unwrap` reads back from a Spark exception's text."""
    if TAG in exc.message:
        return exc
    line = " ".join(exc.message.split("\n")).strip()
    tag = json.dumps({"error": type(exc).__name__, **exc.fields()}, ensure_ascii=True, separators=(",", ":"))
    return _rebuild(type(exc), (f"{line} {TAG}{tag}]",), exc.fields())


def _from_text(text: str) -> QTransportError | None:
    """Our error from the last well-formed tag in `text`; its message is the rest of the tag's line
    after the class's name (as Python prints an exception), else the line before the tag."""
    decoder = json.JSONDecoder()
    at = text.rfind(TAG)
    while at >= 0:
        try:
            data, _ = decoder.raw_decode(text, at + len(TAG))
        except ValueError:
            data = None
        cls = _classes().get(str(data.get("error"))) if isinstance(data, dict) else None
        if cls is not None and isinstance(data, dict):
            line = text[text.rfind("\n", 0, at) + 1:at].rstrip()
            name = f"{cls.__module__}.{cls.__qualname__}: "
            message = line[line.rfind(name) + len(name):] if name in line else line
            fields = {k: str(v) for k, v in data.items() if k in QTransportError.FIELDS and v is not None}
            return _rebuild(cls, (message,), fields)
        at = text.rfind(TAG, 0, at)
    return None


def _texts(exc: BaseException) -> list[str]:
    texts = [str(exc)]
    for name in ("getMessage", "desc"):  # pyspark's captured (classic) and Connect exceptions
        value = getattr(exc, name, None)
        try:
            value = value() if callable(value) else value
        except Exception:  # noqa: BLE001 - a JVM call that fails: the other texts remain
            value = None
        if isinstance(value, str):
            texts.append(value)
    return texts


def unwrap(exc: BaseException | None) -> QTransportError | None:
    """Our error behind `exc`: `exc` itself (or a cause) when it is one, else the one whose tag the
    text of a Spark exception carries (classic or Spark Connect, causes included); None when
    there is none. The returned error has its class, its message (without the tag) and fields."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, QTransportError):
            return e if TAG not in e.message else _rebuild(type(e), (_untag(e.message),), e.fields())
        for text in _texts(e):
            found = _from_text(text)
            if found is not None:
                return found
        todo += [e.__cause__, e.__context__]
    return None
