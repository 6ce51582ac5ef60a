"""Where a batch's messages go: its destinations, and the subscribers of the events it publishes
(NServiceBus's native publish: the ``SubscriptionRouting`` table maps topics to queues)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...dialects import Cursor, Dialect, QueueAddress
from ...errors import QueueNotFoundError, field_error
from .. import session as db
from ..routing import Refusal, Router, Target
from .messages import topics_of

__all__ = ["Destination", "add_subscribers"]


@dataclass
class Destination:
    """One queue a batch sends to: where (or why not), and which staged rows go there."""

    to: Target | Refusal
    route: str | None  # the SEND route staged for it, if any
    publish_routes: list[str] = field(default_factory=list)  # EnclosedMessageTypes values routed to it


def add_subscribers(cur: Cursor, dialect: Dialect, router: Router, subscriptions: QueueAddress, *, create: bool,
                    published: list[str], destinations: dict[str, Destination]) -> None:
    """Add each subscriber queue of the `published` EnclosedMessageTypes values to `destinations`
    (by canonical address), with the values routed to it. `create`: create a missing
    subscription table (`create_queues`) instead of failing."""
    d = dialect
    if not db.columns(cur, d.queue_columns(subscriptions)):
        if not create:
            raise field_error("subscriptions", f"this batch publishes events, but the subscription table "
                              f"{d.qualified(subscriptions)} does not exist; create it (`create_queues`, or the DDL in "
                              "sql/)", kind=QueueNotFoundError, queue=d.format_address(subscriptions))
        db.install(d, cur, d.create_subscriptions(subscriptions))
    by_topic: dict[str, list[str]] = {}
    for types in published:
        for topic in topics_of(types):
            by_topic.setdefault(topic, []).append(types)
    if not by_topic:
        return
    # The database matches each stored Topic to our topics with its own collation (on SQL
    # Server usually case-insensitive, trailing spaces ignored) and says which topic by its
    # position: the stored spelling may differ from ours and is never looked up here.
    topics = sorted(by_topic)
    for queue_text, i in db.rows(cur, d.subscribers(subscriptions, topics)):
        topic = topics[int(i)]
        to = router.resolve(cur, queue_text, source=f"subscriber of {topic} in {d.qualified(subscriptions)}")
        dest = destinations.setdefault(to.text if isinstance(to, Target) else f"\0{queue_text}", Destination(to, None))
        for types in by_topic[topic]:
            if types not in dest.publish_routes:
                dest.publish_routes.append(types)
