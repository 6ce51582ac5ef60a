"""Admission control beyond a batch's maximum: when a batch may start (`TriggerGate`, Kafka's
``minOffsetsPerTrigger`` and ``maxTriggerDelay``) and how a batch's rows are shared among the
queues of one stream (`fair_shares`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ..settings import DEFAULT_MAX_TRIGGER_DELAY

__all__ = ["TriggerGate", "fair_shares"]


class TriggerGate:
    """A batch starts once `min_messages` are waiting or `max_delay` seconds have passed since
    the last batch started, as the Kafka source decides. Spark's ``ReadMinRows`` carries no delay
    for a Python source, so the source keeps this clock itself. The first trigger of a run is
    never held (Kafka's clock starts at zero)."""

    def __init__(self, min_messages: int, max_delay: float = DEFAULT_MAX_TRIGGER_DELAY,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_messages, self.max_delay = min_messages, max_delay
        self._clock = clock
        self._last: float | None = None
        self.held = 0  # triggers held back, for progress reports

    def admit(self, waiting: Callable[[], int], *, min_messages: int | None = None) -> bool:
        """Whether a batch may be planned now; `waiting` counts the messages (asked only when the
        delay has not passed)."""
        now = self._clock()
        if self._last is None or now - self._last >= self.max_delay:
            self._last = now
            return True
        if waiting() >= (self.min_messages if min_messages is None else min_messages):
            self._last = now
            return True
        self.held += 1
        return False


def fair_shares(demand: Mapping[str, int], limit: int) -> dict[str, int]:
    """Split `limit` rows among queues by max-min fairness: a queue that wants less than an equal
    share gets what it wants, the rest is shared equally by the others (a queue of 100 beside
    one of 100,000 is drained in one batch). Every queue gets at least 1, so a message that
    arrived after its estimate is still found; the shares add up to at most
    ``max(limit, len(demand))``."""
    shares: dict[str, int] = {}
    left = max(limit, len(demand))
    pending = sorted(demand, key=lambda k: (max(0, demand[k]), k))
    while pending:
        equal = left // len(pending)
        key = pending[0]
        want = max(1, demand[key])
        if want <= equal:
            shares[key] = want
            left -= want
            pending.pop(0)
            continue
        # every remaining queue wants more than an equal share: split what is left
        for i, k in enumerate(pending):
            shares[k] = max(1, equal + (1 if i < left - equal * len(pending) else 0))
        break
    return shares
