"""Column helpers for the common sends: reply to a received message, publish an event, and
NServiceBus's recoverability for a received message the pipeline rejects (fail, retry later).

They return column lists for ``select`` on a DataFrame read with ``format("sqlqueue")``::

    from spark_qtransport import reply, publish, fail, retry_later
    replies = received.select(*reply(body=F.to_json(F.struct("order_id")), message_type="Sales.OrderAccepted"))
    events = received.select(*publish(body=..., message_type="Sales.OrderPlaced"))
    rejected = received.where("...").select(*fail(reason=F.lit("no such product")))
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError
from ..transport.sending.recovery import DEFAULT_DELAY, DEFAULT_MAX_RETRIES, FAIL, PROCESSING_FAILED, RETRY
from ..wire import H

__all__ = ["reply", "publish", "fail", "retry_later"]


def _col(value: Any) -> Any:
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    if isinstance(value, Column):
        return value
    return F.lit(value)


def reply(*, body: Any, message_type: Any, headers: Any = None) -> list[Any]:
    """Columns of a reply to each received message, as NServiceBus replies: to its
    ReplyToAddress, CorrelationId = its CorrelationId (else its MessageId), same ConversationId,
    RelatedTo = its MessageId, intent Reply. `headers`: an optional map column merged in."""
    from pyspark.sql import functions as F

    conversation = F.create_map(
        F.lit(H.CONVERSATION_ID), F.col("conversation_id"),
        F.lit(H.RELATED_TO), F.col("message_id"),
    )
    return [
        _col(body).alias("body"),
        F.col("reply_to").alias("destination"),
        F.lit("reply").alias("intent"),
        _col(message_type).alias("message_type"),
        F.coalesce(F.col("correlation_id"), F.col("message_id")).alias("correlation_id"),
        (conversation if headers is None else F.map_concat(conversation, headers)).alias("headers"),
    ]


def publish(*, body: Any, message_type: Any, headers: Any = None, related: bool = True) -> list[Any]:
    """Columns of an event published for each received message (to every queue subscribed to
    its type in SubscriptionRouting). With `related`, it continues the received message's
    conversation (ConversationId, RelatedTo), as a publish from an NServiceBus handler does."""
    from pyspark.sql import functions as F

    cols = [_col(body).alias("body"), F.lit("publish").alias("intent"), _col(message_type).alias("message_type")]
    extra = None
    if related:
        extra = F.create_map(
            F.lit(H.CONVERSATION_ID), F.col("conversation_id"),
            F.lit(H.RELATED_TO), F.col("message_id"),
        )
    if headers is not None:
        extra = headers if extra is None else F.map_concat(extra, headers)
    if extra is not None:
        cols.append(extra.alias("headers"))
    return cols


def _received(intent: str, failure: list[Any], destination: Any = None) -> list[Any]:
    """The received message as it came (body, message_id, headers) with the intent and the
    ``failure`` struct (`transport.sending.recovery.FAILURE_FIELDS`)."""
    from pyspark.sql import functions as F

    cols = [F.col("body"), F.col("message_id"), F.col("headers"), F.lit(intent).alias("intent"),
            F.struct(*failure).alias("failure")]
    if destination is not None:
        cols.append(destination.alias("destination"))
    return cols


def _failure(reason: Any, exception_type: Any, stack_trace: Any, max_retries: Any, delay: Any) -> list[Any]:
    from pyspark.sql import functions as F

    return [
        _col(exception_type).cast("string").alias("exception_type"),
        _col(reason).cast("string").alias("message"),
        _col(stack_trace).cast("string").alias("stack_trace"),
        F.col("queue").alias("failed_q"),
        _col(max_retries).cast("int").alias("max_retries"),
        _col(delay).cast("double").alias("delay"),
        F.col("claim_seq").alias("claim_seq"),
    ]


def fail(reason: Any = None, exception_type: Any = PROCESSING_FAILED, stack_trace: Any = None) -> list[Any]:
    """Columns that move each received message to the sink's error queue, as NServiceBus's
    recoverability does: same MessageId, headers and body, ``NServiceBus.Retries`` and
    ``FLRetries`` removed, ``NServiceBus.FailedQ`` = the queue it was received from,
    ``ExceptionInfo.ExceptionType`` / ``.Message`` (`reason`, at most 16,384 characters) /
    ``.StackTrace``, TimeOfFailure, ProcessingEndpoint (the sink's endpoint), ProcessingMachine
    and the host ids. Each argument is a column or a literal; a NULL reason is an empty message.
    Reads the received row's ``body``, ``message_id``, ``headers``, ``queue`` and ``claim_seq``:
    the message is not audited by the reader's ``auditQueue`` (the sink marks its claim failed)."""
    return _received(FAIL, _failure(reason, exception_type, stack_trace, None, None))


def retry_later(reason: Any = None, exception_type: Any = PROCESSING_FAILED, stack_trace: Any = None,
                max_retries: Any = DEFAULT_MAX_RETRIES, delay: Any = DEFAULT_DELAY) -> list[Any]:
    """Columns that send each received message back to its own queue after ``delay x attempt``
    seconds (through the endpoint's delayed delivery), as NServiceBus's delayed retries do: same
    MessageId, headers and body, ``NServiceBus.Retries`` = attempt (1, 2, ...) and
    ``NServiceBus.Retries.Timestamp`` = now. Once `max_retries` retries were made, or the last one
    is more than a day old, the message goes to the error queue as `fail` sends it. Each argument
    is a column or a literal; literals are checked here, columns per row by the sink."""
    if not _is_column(max_retries) and max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0):
        raise ConfigError(f"retry_later(max_retries={max_retries!r}): must be a whole number, 0 or more")
    if not _is_column(delay) and delay is not None:
        try:
            seconds = float(delay)
        except (TypeError, ValueError):
            raise ConfigError(f"retry_later(delay={delay!r}): must be a number of seconds") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigError(f"retry_later(delay={delay!r}): must be a finite number of seconds, 0 or more")
    from pyspark.sql import functions as F

    return _received(RETRY, _failure(reason, exception_type, stack_trace, max_retries, delay), F.col("queue"))


def _is_column(value: Any) -> bool:
    from pyspark.sql import Column

    return isinstance(value, Column)
