"""Admission control beyond a batch's maximum: when a batch may start (`TriggerGate`, Kafka's
``minOffsetsPerTrigger`` and ``maxTriggerDelay``) and how a batch's rows are shared among the
queues of one stream (`fair_shares`), in turns when there are too many busy queues to give each a
useful share (`TURN`)."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping

from ..settings import DEFAULT_MAX_TRIGGER_DELAY

__all__ = ["TURN", "TriggerGate", "fair_shares", "taking_turns"]

#: the messages a busy queue's turn takes (all it has, if fewer) when a batch cannot give every busy
#: queue as many (`fair_shares`): each queue's claim, read and acknowledgement are statements on tables
#: of its own, which cost the server about as much for 100 rows as for 5, so a thousand queues sharing
#: a batch of 5,000 take turns of 100 rather than 5 each at every batch
TURN = 100


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


def taking_turns(demand: Mapping[str, int], limit: int, turn: int = TURN) -> bool:
    """Whether `limit` is too small to give every queue of `demand` a `turn`'s messages, or all it
    wants if fewer (`fair_shares` then serves them in turns)."""
    return sum(min(max(1, n), turn) for n in demand.values()) > max(limit, len(demand))


def fair_shares(demand: Mapping[str, int], limit: int, *, after: str | None = None,
                turn: int = TURN) -> dict[str, int]:
    """Split `limit` rows among queues by max-min fairness: a queue that wants less than an equal
    share gets what it wants, the rest is shared equally by the others (a queue of 100 beside
    one of 100,000 is drained in one batch). Every queue gets at least 1, so a message that
    arrived after its estimate is still found; the shares add up to at most
    ``max(limit, len(demand))``.

    When that would give some queue less than a `turn`'s messages, or all it wants if fewer
    (`taking_turns`), the queues take turns instead: in the order of their keys from the first after
    `after` (the last queue the batch before served), each gets a turn's messages, or all it wants if
    fewer, until `limit` is spent (the last one what is left); the others get no share (they are not
    in the result) and come first in the batches after. Each queue's statements then take a turn's
    rows, not ``limit / len(demand)``: 1,000 queues of 20 messages and a batch of 5,000 are 250
    queues' 20 messages a batch, not every queue's 5."""
    if not taking_turns(demand, limit, turn):
        return _max_min(demand, limit)
    keys = sorted(demand)
    first = bisect.bisect_right(keys, after) if after is not None else 0
    shares: dict[str, int] = {}
    left = limit
    for k in keys[first:] + keys[:first]:
        if left <= 0:
            break
        shares[k] = min(max(1, demand[k]), turn, left)
        left -= shares[k]
    return shares


def _max_min(demand: Mapping[str, int], limit: int) -> dict[str, int]:
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
