"""Exceptions raised by spark_qtransport.

The hierarchy::

    QTransportError               root; picklable, so Spark can carry it from executors to the driver
     ├── ConfigError              a bad option, URL or queue address (names the option at fault)
     ├── QueueNotFoundError       a queue or one of our tables does not exist
     ├── SchemaError              a table exists but its columns do not fit the transport
     ├── ConsumerBusyError        another running query already uses this consumer identity
     ├── OffsetError              a checkpointed offset does not fit the tables it names
     ├── OutboxConflictError      a batch id was dispatched before by another query (checkpoint reset)
     ├── DispatchError            a batch could not be dispatched as staged (nothing was sent)
     └── DatabaseError            a database call failed for good (after retrying transient faults);
                                  names the operation and the queue, the driver's error is its cause
"""

from __future__ import annotations

__all__ = [
    "QTransportError",
    "ConfigError",
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

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Keep subclasses picklable whatever their __init__ signature: Spark pickles exceptions.
        return (self.__class__, self.args)


class ConfigError(QTransportError, ValueError):
    """An option, URL or queue address is missing or invalid."""


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


class DispatchError(QTransportError):
    """A batch could not be dispatched as its tasks staged it; nothing of it was sent."""


class DatabaseError(QTransportError):
    """A database call failed: a persistent fault, or a transient one that outlasted the retries."""
