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
fault), ``column`` (an input column), ``sqlstate`` (the driver's code) and ``operation`` (what was
being done). Code that handles errors reads the fields; people read the message.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
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
    FIELDS = ("queue", "option", "column", "sqlstate", "operation")
    #: worth running the transaction again (the retry policy, `transport.session`, retries it)
    transient: ClassVar[bool] = False

    def __init__(
        self,
        message: str = "",
        *,
        queue: str | None = None,
        option: str | None = None,
        column: str | None = None,
        sqlstate: str | None = None,
        operation: str | None = None,
    ) -> None:
        super().__init__(message)
        self.queue = queue
        self.option = option
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
