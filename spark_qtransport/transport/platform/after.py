"""After processing: what an acknowledgement writes besides deleting claims. Dialect-free; imports
nothing from the receiving side.

A batch is processed when Spark commits it, and the reader learns that in ``commit(end)``. So, as
an NServiceBus endpoint commits its outgoing messages with the receive (native transactions),
everything "after processing" is written in the transaction that deletes the claims it concerns:

- **audit copies** (option ``auditQueue``): each message with its body, its headers and
  NServiceBus's audit headers (`audit_headers`), copied server-side from the claim table;
- **forwardTo copies** (option ``forwardTo``): each message unchanged;
- **ServiceControl retry acknowledgements**: a message that carries
  ``ServiceControl.Retry.UniqueMessageId`` and ``ServiceControl.Retry.AcknowledgementQueue`` (a
  ServicePulse retry) makes the control message NServiceBus's RetryAcknowledgementBehavior sends,
  to that queue (an address from data: it goes through the routing path), and its audit copy
  carries ``ServiceControl.Retry.AcknowledgementSent``. A refused queue sends no acknowledgement
  (logged): ServiceControl Audit then acknowledges on the endpoint's behalf when it sees the audit
  copy without that header.

The receiving side's acknowledgement (`receiving.chunks`) reads the claims a chunk at a time,
leaves out poison and what the sink failed or retried (not processed: NServiceBus audits only what
its handlers processed), and deletes; this module writes, in the same transaction, the copies of
what it hands over, so each message is audited, forwarded and acknowledged exactly once however
the driver dies. With prepared claims, the copies are written from the rows the claim holds,
before its COMMIT PREPARED (which can write nothing); where nothing needs each message's headers
decoded, NServiceBus's audit headers are appended to each headers text (`with_audit`).

Monitoring (`monitoring.Monitor`) gets a `Processed` per message once its chunk has committed.

**ProcessingStarted and ProcessingEnded for a micro-batch.** NServiceBus times one handler call.
Here ``ProcessingStarted`` is when the batch that delivered the message was planned on the driver
(`BatchTimes`: Spark asks for its partitions; a batch replayed after a restart counts from its
replay), and never earlier than the message's claim. ``ProcessingEnded`` is when the
acknowledgement's transaction is written. So processing time is the whole micro-batch's time
(read, the pipeline, the sink, and the wait for Spark's commit), the same for every message of a
batch, and critical time is from TimeSent (or DeliverAt) to that acknowledgement.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ...dialects import Cursor, Dialect, QueueAddress, Statement
from ...wire import (
    H,
    as_utc,
    decode_headers,
    encode_headers,
    format_time,
    host_id,
    machine,
    parse_time,
    retries_performed,
)
from .. import session as db
from ..routing import Item, Router, route_rows
from ..settings import ReceiveSettings
from .processed import Processed

__all__ = ["AfterProcessing", "BatchTimes", "Copies", "Copy", "audit_headers", "retry_acknowledgement"]

log = logging.getLogger("spark_qtransport.platform")


class BatchTimes:
    """When each batch was planned, by its end claim sequence (the driver's clock, UTC).

    Thread-safe: batches are planned on Spark's thread and acknowledged on ours."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or (lambda: datetime.now(timezone.utc))
        self._ends: list[int] = []
        self._times: dict[int, datetime] = {}
        self._lock = threading.Lock()

    def planned(self, end: int) -> None:
        """The batch ending at claim `end` is planned now (kept: a second call changes nothing)."""
        with self._lock:
            if end not in self._times:
                self._times[end] = self._clock()
                bisect.insort(self._ends, end)

    def started(self, seq: int) -> datetime | None:
        """When the batch delivering claim `seq` was planned; None when this process never planned it."""
        with self._lock:
            i = bisect.bisect_left(self._ends, seq)
            return self._times[self._ends[i]] if i < len(self._ends) else None

    def next_end(self, after: int) -> int | None:
        """The end of the first planned batch that delivers claims above `after` (None: none known)."""
        with self._lock:
            i = bisect.bisect_right(self._ends, after)
            return self._ends[i] if i < len(self._ends) else None

    def forget(self, upto: int) -> None:
        """Batches ending at or below `upto` are acknowledged."""
        with self._lock:
            i = bisect.bisect_right(self._ends, upto)
            for end in self._ends[:i]:
                del self._times[end]
            del self._ends[:i]


def audit_headers(headers: dict[str, str | None], *, started: datetime, ended: datetime, endpoint: str,
                  acknowledged: bool) -> dict[str, str | None]:
    """A message's headers on its audit copy: every incoming header kept, NServiceBus's audit
    metadata added or overwritten (AuditProcessingStatisticsBehavior, AuditHostInformationBehavior,
    MarkAsAcknowledgedBehavior)."""
    out = dict(headers)
    out[H.PROCESSING_STARTED] = format_time(started)
    out[H.PROCESSING_ENDED] = format_time(ended)
    out[H.HOST_ID] = host_id(endpoint)
    out[H.HOST_DISPLAY_NAME] = machine()
    out[H.PROCESSING_MACHINE] = machine()
    out[H.PROCESSING_ENDPOINT] = endpoint
    if acknowledged:
        out[H.RETRY_ACK_SENT] = "true"
    return out


def retry_acknowledgement(headers: dict[str, str | None], now: datetime) -> tuple[str, dict[str, str | None]] | None:
    """(acknowledgement queue, control message headers) for a ServicePulse retry; None for any
    other message. The headers are RetryAcknowledgementBehavior's, no more: its body is empty."""
    unique = headers.get(H.RETRY_UNIQUE_MESSAGE_ID)
    queue = headers.get(H.RETRY_ACK_QUEUE)
    if unique is None or queue is None:
        return None
    return queue, {H.RETRY_SUCCESSFUL: format_time(now), H.RETRY_UNIQUE_MESSAGE_ID: unique, H.CONTROL_MESSAGE: "True"}


#: what the headers text of a message that names an audit header holds (`with_audit`)
AUDIT_NEEDLES = ('"NServiceBus.Processing', '"$.diagnostics.host')

_JSON_SPACE = " \t\n\r"


def with_audit(text: str, members: str, *, started: datetime, ended: datetime, endpoint: str) -> str:
    """A message's headers text (a JSON object, or '' for none: judged at the claim) on its audit
    copy: `members` (`"k":"v",...`, `audit_headers` of nothing) appended before the closing
    brace, so the text is neither parsed nor written again. A text that may name an audit header
    already (`AUDIT_NEEDLES`) is decoded and its copy's headers built by `audit_headers`, so no
    key is written twice."""
    if any(needle in text for needle in AUDIT_NEEDLES):
        headers = decode_headers(text)
        if headers is not None:
            return encode_headers(audit_headers(headers, started=started, ended=ended, endpoint=endpoint,
                                                acknowledged=False))
    body = text.rstrip(_JSON_SPACE)
    if not body:
        return "{" + members + "}"
    inner = body[:-1]
    return inner + ("" if inner.rstrip(_JSON_SPACE).endswith("{") else ",") + members + "}"


#: makes the statement that copies the chunk's messages `keys` to `target`: with these headers texts
#: (None: each as it is) and this time to be received in ms (None: none). The receiving side gives
#: it per chunk (claim-table claims and prepared claims are copied by different statements).
Copy = Callable[[QueueAddress, list[int], "list[str] | None", "int | None"], Statement]


@dataclass
class Copies:
    """What one chunk had copied and sent for the platform. `AfterProcessing.committed` hands it
    over once the chunk's transaction committed; the receiving side adds it to its totals (a chunk
    rolled back and run again is counted once)."""

    audited: int = 0
    forwarded_to: int = 0  # forwardTo copies
    retry_acks: int = 0
    retry_acks_refused: int = 0  # retries whose acknowledgement could not be routed


class AfterProcessing:
    """The copies and timings an acknowledgement makes for the Particular platform (see the
    module's text), for one queue. The receiving side's chunks (`receiving.chunks`) read the
    claims, leave out poison and what the sink failed, and delete; this writes, in their
    transaction, what the messages they hand over need."""

    def __init__(self, options: ReceiveSettings, dialect: Dialect, times: BatchTimes, *,
                 observe: Callable[[Sequence[Processed]], None] | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.options, self.dialect, self.times = options, dialect, times
        self._observe = observe
        self._clock = clock or (lambda: datetime.now(timezone.utc))
        self._processed: list[Processed] = []
        self._made = Copies()

    @property
    def copies(self) -> bool:
        """Whether each acknowledged message's headers are read: to audit, forward or time it."""
        o = self.options
        return o.audit_queue is not None or o.forward_to is not None or self.timed

    @property
    def timed(self) -> bool:
        """Whether monitoring times each message (its headers must be decoded)."""
        return self._observe is not None

    @property
    def _audit_ttbr_ms(self) -> int | None:
        """The audit copies' time to be received in ms (`auditTimeToBeReceived`), or None."""
        seconds = self.options.audit_ttbr_seconds
        return None if seconds is None else int(seconds * 1000)

    def chunk_size(self, ack_batch: int) -> int:
        """Claims per chunk: the acknowledgement's batch, within what one transaction should copy."""
        return max(1, min(ack_batch, 10_000))

    def now(self) -> datetime:
        """The clock the copies' times come from (UTC)."""
        return self._clock()

    def begin(self) -> None:
        """A chunk begins: what the last one timed and copied is dropped unless `committed` took it."""
        self._processed, self._made = [], Copies()

    # -- the copies of one chunk, in the caller's transaction -------------------------------------

    def write(self, cur: Cursor, rows: list[tuple[int, str, Any]], parsed: Sequence[dict[str, str | None] | None],
              copy: Copy) -> None:
        """The copies and timings of processed messages, rows (number, headers text, claimed at)
        with their decoded headers (None: the claim judged them, and an audit copy keeps the text
        as it is), written by the statements `copy` makes. The caller left out what was not
        processed (poison, what the sink failed or retried)."""
        o = self.options
        ended = self._clock()
        kept = [key for key, *_ in rows]
        _, acked = self.acknowledge_retries(
            cur, [(k, h) for k, h in zip(kept, parsed, strict=True) if h is not None], ended)
        starts = [self._started(key, claimed_at, ended) for key, _, claimed_at in rows]
        if o.audit_queue is not None and kept:
            texts = [text if h is None else encode_headers(audit_headers(
                h, started=start, ended=ended, endpoint=o.consumer, acknowledged=key in acked))
                for (key, text, _), h, start in zip(rows, parsed, starts, strict=True)]
            db.execute(cur, copy(o.audit_queue, kept, texts, self._audit_ttbr_ms))
        if o.forward_to is not None and kept:
            db.execute(cur, copy(o.forward_to, kept, None, None))
        if self._observe is not None:
            self._processed = [self._timed(h or {}, start, ended) for h, start in zip(parsed, starts, strict=True)]
        self._made.audited += len(kept) if o.audit_queue is not None else 0
        self._made.forwarded_to += len(kept) if o.forward_to is not None else 0

    def write_appended(self, cur: Cursor, rows: list[tuple[int, str]], *, upto: int, claimed: Any, copy: Copy,
                       forward: Callable[[QueueAddress], list[Statement]]) -> int:
        """`write` for messages numbered up to `upto` whose batch ends at `upto` (one
        ProcessingStarted serves them), judged free of poison at their claim, with no monitoring:
        NServiceBus's audit headers are appended to each headers text as members before its closing
        brace (`with_audit`), so no JSON is parsed or written again, but for a text that names an
        audit header already (replaced, not repeated); forwardTo copies are made by `forward(target)`,
        statements that copy on the server and read no header. The copies made (the larger of
        audit and forwardTo). (Appending on the server instead cost the database 2.7x the plain
        copy's CPU a row: headers are stored compressed, and a changed text is decompressed, copied
        and compressed again.)"""
        o = self.options
        audited = forwarded = 0
        if o.audit_queue is not None:
            ended = self._clock()
            started = self._started(upto, claimed, ended)
            members = encode_headers(audit_headers({}, started=started, ended=ended, endpoint=o.consumer,
                                                   acknowledged=False))[1:-1]
            if rows:
                texts = [with_audit(text, members, started=started, ended=ended, endpoint=o.consumer) for _, text in rows]
                db.execute(cur, copy(o.audit_queue, [key for key, _ in rows], texts, self._audit_ttbr_ms))
            audited = len(rows)
        if o.forward_to is not None:
            forwarded = db.rowcount(cur, db.prefixed(cur, forward(o.forward_to)))
        self._made.audited += audited
        self._made.forwarded_to += forwarded
        return max(audited, forwarded)

    def committed(self) -> Copies:
        """The last chunk committed: hand its messages to monitoring; what it copied and sent."""
        processed, self._processed = self._processed, []
        made, self._made = self._made, Copies()
        if processed and self._observe is not None:
            try:
                self._observe(processed)
            except Exception as exc:  # noqa: BLE001 - monitoring is best-effort
                log.warning("monitoring could not take %d processed message(s): %s", len(processed), exc)
        return made

    # -- pieces -----------------------------------------------------------------------------------

    def _started(self, seq: int, claimed_at: Any, ended: datetime) -> datetime:
        claimed = as_utc(claimed_at) if isinstance(claimed_at, datetime) else ended
        planned = self.times.started(seq)
        start = claimed if planned is None else max(claimed, planned)
        return min(start, ended)

    def acknowledge_retries(self, cur: Cursor, rows: list[tuple[int, dict[str, str | None]]],
                             now: datetime) -> tuple[list[int], set[int]]:
        """Send the retry acknowledgements of these claims: (the claims that are ServicePulse
        retries, those whose acknowledgement went)."""
        if not self.options.acknowledge_retries:
            return [], set()
        items = []
        for key, headers in rows:
            ack = retry_acknowledgement(headers, now)
            if ack is not None:
                items.append(Item(key, ack[1], ack[0]))
        if not items:
            return [], set()
        d, o = self.dialect, self.options
        router = Router(d, o.routing)
        routed = route_rows(
            cur, router, items,
            insert=lambda target, keys, headers: d.control_messages(target.address, headers=headers),
            delete=None, error_queue=None, source="spark_qtransport.retry_acknowledgement", endpoint=o.consumer,
        )
        kept = {key for key, _ in routed.kept}
        for key, reason in routed.kept[:1]:
            log.warning("queue %s: no ServiceControl retry acknowledgement for %d message(s) (e.g. claim %s): %s; "
                        "ServiceControl Audit acknowledges retries it sees audited without one",
                        d.format_address(o.queue), len(routed.kept), key, reason)
        self._made.retry_acks += len(items) - len(kept)
        self._made.retry_acks_refused += len(kept)
        return [i.key for i in items], {i.key for i in items} - kept

    def _timed(self, headers: dict[str, str | None], started: datetime, ended: datetime) -> Processed:
        sent = parse_time(headers.get(H.DELIVER_AT)) or parse_time(headers.get(H.TIME_SENT))
        return Processed(message_types=headers.get(H.ENCLOSED_MESSAGE_TYPES) or "", started=started, ended=ended,
                         sent=sent, retries=retries_performed(headers))

