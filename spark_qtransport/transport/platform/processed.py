"""`Processed`: one acknowledged message as monitoring sees it (no body, no header text)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["Processed"]


@dataclass(frozen=True)
class Processed:
    """A message whose batch was acknowledged.

    `message_types`: its ``NServiceBus.EnclosedMessageTypes`` ('' when absent), the tag of its
    metrics. `started`/`ended`: ``ProcessingStarted``/``ProcessingEnded`` as its audit copy carries
    them. `sent`: ``NServiceBus.DeliverAt`` if present, else ``NServiceBus.TimeSent`` (None when
    neither parses): the start of its critical time. `retries`: ``NServiceBus.Retries`` (0 when
    absent or not a number)."""

    message_types: str
    started: datetime
    ended: datetime
    sent: datetime | None
    retries: int

    @property
    def processing_ms(self) -> int:
        return max(int((self.ended - self.started).total_seconds() * 1000), 0)

    @property
    def critical_ms(self) -> int | None:
        if self.sent is None:
            return None
        return max(int((self.ended - self.sent).total_seconds() * 1000), 0)
