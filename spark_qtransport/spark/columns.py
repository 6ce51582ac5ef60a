"""Column helpers for the common sends: reply to a received message, publish an event.

They return column lists for ``select`` on a DataFrame read with ``format("sqlqueue")``::

    from spark_qtransport import reply, publish
    replies = received.select(*reply(body=F.to_json(F.struct("order_id")), message_type="Sales.OrderAccepted"))
    events = received.select(*publish(body=..., message_type="Sales.OrderPlaced"))
"""

from __future__ import annotations

from typing import Any

from ..wire import H

__all__ = ["reply", "publish"]


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
