"""After processing: what an acknowledgement writes besides deleting claims. Dialect-free.

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

**Only what succeeded.** A message the pipeline failed or retried (`fail()`, `retry_later()`)
through the sink of the same query was not processed: the sink's dispatch marked its claim
failed (`mark_failed`, in the transaction that sent its error or retry copy, before Spark commits
the batch), and its acknowledgement makes no audit or forwardTo copy, no retry acknowledgement and
no monitoring timing, as NServiceBus audits only what its handlers processed. A stream whose
output goes elsewhere (a ``foreachBatch`` without `QueueSink`) marks nothing: all it acknowledges
is audited.

Each chunk of an acknowledgement reads its claims' headers (never bodies), writes the copies and
deletes the claims in one transaction, so each message is audited, forwarded and acknowledged
exactly once however the driver dies: a repeated acknowledgement finds no claims. Expired messages
never reach the claim table, so they are never audited.

**Prepared claims** (`claimMode`): the acknowledgement is a COMMIT PREPARED, which can write
nothing. Each chunk (`ack_held_chunk`) reads the held rows' headers, writes the copies from the rows
the claim holds, and records how far the claim's copies got (`prepared.note_progress`: a row of the
claim table) in one transaction, before the commit; an acknowledgement that finds the record goes
on after it, and parking copies only the rows after it. Where this run made the claim and judged it
free of poison, and monitoring needs no headers, no header is parsed: the audit headers are appended
to each text (`with_audit`), and forwardTo copies read none (`_held_chunk_appended`). The sink notes a prepared claim it failed as
a row of its own (`mark_failed`: the claim is in no table to mark), which the chunk reads and
deletes (`_failed_marks`).

**Poison claims.** Where the claim does not judge headers (`ReceiveSql.poison_at_claim`: PostgreSQL),
a claimed message whose headers are not a flat JSON object of strings (`wire.decode_headers`) was
never delivered (reads leave it out); its batch's acknowledgement moves it raw to the error queue
(`dead_letter_claims`) in the transaction that deletes the rest of its chunk, so it is moved
exactly once, and never audited, forwarded or timed. A plain acknowledgement (nothing to copy)
reads each chunk's headers for that, unlocked (`ack_plain_chunk`).

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
from typing import TYPE_CHECKING, Any, NamedTuple

from ...dialects import NUMBER_BASE, Cursor, QueueAddress, Statement
from ...wire import (
    H,
    as_utc,
    decode_header_texts,
    decode_headers,
    encode_headers,
    format_time,
    host_id,
    machine,
    parse_time,
    retries_performed,
)
from .. import session as db
from ..receiving import prepared
from ..receiving.judge import judged
from ..receiving.prepared import PreparedClaim
from ..routing import Item, Router, route_rows
from .processed import Processed

if TYPE_CHECKING:
    from ..receiving.setup import Endpoint

__all__ = ["AfterProcessing", "BatchTimes", "audit_headers", "retry_acknowledgement"]

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


class Chunk(NamedTuple):
    """One chunk of an acknowledgement: the claims gone, and the last claim sequence it read (the
    next chunk reads after it)."""

    gone: int
    last: int


@dataclass
class AfterStats:
    audited: int = 0
    forwarded: int = 0  # forwardTo copies
    retry_acks: int = 0
    retry_acks_refused: int = 0
    poison: int = 0  # claims moved to the error queue by acknowledgements


class AfterProcessing:
    """The acknowledgement's after-processing work for one receiver (see the module's text)."""

    def __init__(self, endpoint: Endpoint, times: BatchTimes, *,
                 observe: Callable[[Sequence[Processed]], None] | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.endpoint, self.times, self.stats = endpoint, times, AfterStats()
        self._observe = observe
        self._clock = clock or (lambda: datetime.now(timezone.utc))
        self._processed: list[Processed] = []
        self._count = threading.Lock()

    @property
    def copies(self) -> bool:
        """Whether each acknowledged message's headers are read: to audit, forward or time it."""
        o = self.endpoint.options
        return o.audit_queue is not None or o.forward_to is not None or self._observe is not None

    @property
    def _audit_ttbr_ms(self) -> int | None:
        """The audit copies' time to be received in ms (`auditTimeToBeReceived`), or None."""
        seconds = self.endpoint.options.audit_ttbr_seconds
        return None if seconds is None else int(seconds * 1000)

    def chunk_size(self, ack_batch: int) -> int:
        """Claims per chunk: the acknowledgement's batch, within what one transaction should copy."""
        return max(1, min(ack_batch, 10_000))

    # -- one chunk, in the caller's transaction ---------------------------------------------------

    def ack_chunk(self, cur: Cursor, *, upto: int, batch: int, after: int = 0) -> Chunk:
        """Copy and delete the consumer's first `batch` claims in (after, upto]."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        rows = db.rows(cur, d.ack_rows(e.claims, o.consumer, upto=upto, batch=batch, after=after))
        self._processed = []
        if not rows:
            return Chunk(0, after)
        chunk = Chunk(len(rows), int(rows[-1][0]))
        parsed = decode_header_texts([text for _, text, _, _ in rows])
        if not d.poison_at_claim and None in parsed:
            poison = [int(seq) for (seq, *_), h in zip(rows, parsed, strict=True) if h is None]
            self._dead_letter(cur, poison)
            rows, parsed = [r for r, h in zip(rows, parsed, strict=True) if h is not None], [h for h in parsed if h is not None]
            if not rows:
                return chunk
        failed = self._failed_marks(cur, int(rows[0][0]) - 1, chunk.last)  # the chunk's own numbers
        self._after(cur, [(int(seq), text, at, bool(f) or int(seq) in failed) for seq, text, at, f in rows], parsed,
                    lambda target, keys, headers, ttbr: d.forward_claims(e.claims, o.consumer, target, keys=keys,
                                                                         headers=headers, ttbr_ms=ttbr))
        db.execute(cur, d.drop_claims(e.claims, o.consumer, keys=[int(seq) for seq, *_ in rows]))
        return chunk

    def ack_held_chunk(self, cur: Cursor, claim: PreparedClaim, *, after: int, batch: int) -> Chunk:
        """The after-processing of a prepared claim's first `batch` rows numbered above `after`,
        and its progress noted (`prepared.note_progress`), in one transaction: the copies are
        written before the claim's COMMIT PREPARED, which cannot carry them, and the progress
        says which are written, so a driver dying between the two (or between two chunks) copies
        nothing twice (the next run commits the claim, or parks only the rest). The claim moved
        its poison to the error queue already: they are not copied again. Chunk(rows looked at,
        the last number done)."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        self._processed = []
        if claim.clean and self._observe is None:
            return self._held_chunk_appended(cur, claim, after=after, batch=batch)
        found = list(judged(cur, lambda a, n: d.prepared_headers(
            o.queue, xid=claim.xid, after=a, high=claim.high, claimed_at=claim.claimed_at, limit=n),
            after=max(claim.low - 1, after - claim.shift), limit=batch))
        done = claim.last if len(found) < batch else claim.shift + int(found[-1][0][0])
        failed = self._failed_marks(cur, after, done)
        kept = [(row, h) for row, h in found if h is not None]
        if kept:
            self._after(cur, [(claim.shift + int(row[0]), str(row[1]), claim.claimed, claim.shift + int(row[0]) in failed)
                              for row, _ in kept], [h for _, h in kept],
                        lambda target, keys, headers, ttbr: d.copy_held(
                            o.queue, target, xid=claim.xid, shift=claim.shift, claimed_at=claim.claimed_at, keys=keys,
                            headers=headers, ttbr_ms=ttbr))
        prepared.note_progress(cur, e, claim, done)
        return Chunk(len(found), done)

    def _held_chunk_appended(self, cur: Cursor, claim: PreparedClaim, *, after: int, batch: int) -> Chunk:
        """`ack_held_chunk` for a claim this run judged free of poison, when nothing needs each
        message's headers decoded (no monitoring): the chunk's numbers (after, upto] end at their
        batch's end, so one ProcessingStarted serves them, and NServiceBus's audit headers are
        appended to each message's headers text as members before its closing brace
        (`with_audit`): no JSON is parsed or written again, but for a message that names an audit
        header already (replaced, not repeated). forwardTo copies are made on the server, no
        header read. (Appending on the server instead cost the database 2.7x the plain copy's
        CPU a row: headers are stored compressed, and a changed text is decompressed, copied and
        compressed again.)"""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        upto = min(claim.last, after + batch)
        end = self.times.next_end(after)
        if end is not None:
            upto = min(upto, end)
        failed = self._failed_marks(cur, after, upto)
        audited = forwarded = 0
        if o.audit_queue is not None:
            ended = self._clock()
            started = self._started(upto, claim.claimed, ended)
            members = encode_headers(audit_headers({}, started=started, ended=ended, endpoint=o.consumer,
                                                   acknowledged=False))[1:-1]
            keys, texts = [], []
            for seq, text in db.rows(cur, db.prefixed(cur, d.prepared_headers(
                    o.queue, xid=claim.xid, after=after - claim.shift, high=upto - claim.shift,
                    claimed_at=claim.claimed_at, limit=upto - after))):
                if (key := claim.shift + int(seq)) not in failed:
                    keys.append(key)
                    texts.append(with_audit(str(text), members, started=started, ended=ended, endpoint=o.consumer))
            if keys:
                db.execute(cur, d.copy_held(o.queue, o.audit_queue, xid=claim.xid, shift=claim.shift,
                                            claimed_at=claim.claimed_at, keys=keys, headers=texts,
                                            ttbr_ms=self._audit_ttbr_ms))
            audited = len(keys)
        if o.forward_to is not None:
            forwarded = db.rowcount(cur, db.prefixed(cur, d.copy_held_range(
                o.queue, o.forward_to, xid=claim.xid, shift=claim.shift, claimed_at=claim.claimed_at, after=after,
                upto=upto, skip=sorted(failed))))
        prepared.note_progress(cur, e, claim, upto)
        with self._count:
            self.stats.audited += audited
            self.stats.forwarded += forwarded
        return Chunk(max(audited, forwarded), upto)

    def _failed_marks(self, cur: Cursor, after: int, upto: int) -> set[int]:
        """The numbers in (after, upto] the sink marked failed while their claims were held by
        prepared transactions (`mark_failed`), deleted here: read once, in the transaction that
        acknowledges them. Only claims numbered by us can have one."""
        d, e = self.endpoint.dialect, self.endpoint
        if not d.prepared_claims or upto < NUMBER_BASE:
            return set()
        failed = {int(k) for (k,) in db.rows(cur, d.failed_marks(e.claims, after=after, upto=upto))}
        if failed:
            db.execute(cur, d.drop_failed_marks(e.claims, after=after, upto=upto))
        return failed

    def _after(self, cur: Cursor, rows: list[tuple[int, str, Any, bool]], parsed: Sequence[dict[str, str | None] | None],
               copy: Callable[[QueueAddress, list[int], list[str] | None, int | None], Statement]) -> None:
        """The after-processing of acknowledged messages, rows (number, headers text, claimed at,
        failed) with their decoded headers (None: the claim judged them, and an audit copy keeps
        the text as it is): `copy(target, numbers, headers or None, ttbr ms)` makes the statement
        that copies them."""
        o = self.endpoint.options
        # the messages the pipeline failed or retried (the sink marked their claims): processing
        # did not succeed, so no audit or forwardTo copy, no retry acknowledgement, no timing
        if any(failed for *_, failed in rows):
            ok = [not failed for *_, failed in rows]
            rows = [r for r, keep in zip(rows, ok, strict=True) if keep]
            parsed = [h for h, keep in zip(parsed, ok, strict=True) if keep]
        ended = self._clock()
        kept = [key for key, *_ in rows]
        _, acked = self._acknowledge_retries(
            cur, [(k, h) for k, h in zip(kept, parsed, strict=True) if h is not None], ended)
        starts = [self._started(key, claimed_at, ended) for key, _, claimed_at, _ in rows]
        if o.audit_queue is not None and kept:
            texts = [text if h is None else encode_headers(audit_headers(
                h, started=start, ended=ended, endpoint=o.consumer, acknowledged=key in acked))
                for (key, text, _, _), h, start in zip(rows, parsed, starts, strict=True)]
            db.execute(cur, copy(o.audit_queue, kept, texts, self._audit_ttbr_ms))
        if o.forward_to is not None and kept:
            db.execute(cur, copy(o.forward_to, kept, None, None))
        if self._observe is not None:
            self._processed = [self._timed(h or {}, start, ended) for h, start in zip(parsed, starts, strict=True)]
        with self._count:
            self.stats.audited += len(kept) if o.audit_queue is not None else 0
            self.stats.forwarded += len(kept) if o.forward_to is not None else 0

    def ack_plain_chunk(self, cur: Cursor, *, upto: int, batch: int, after: int = 0) -> Chunk:
        """Without copies to make, where the claim did not judge headers: move the poison among
        the consumer's first `batch` claims in (after, upto] to the error queue, delete the rest."""
        d, e = self.endpoint.dialect, self.endpoint
        rows = db.rows(cur, d.ack_headers(e.claims, e.options.consumer, upto=upto, batch=batch, after=after))
        if not rows:
            return Chunk(0, after)
        parsed = decode_header_texts([text for _, text in rows])
        if None in parsed:
            self._dead_letter(cur, [int(seq) for (seq, _), h in zip(rows, parsed, strict=True) if h is None], drop=False)
        db.execute(cur, d.drop_claim_range(e.claims, e.options.consumer, lo=int(rows[0][0]), hi=int(rows[-1][0])))
        return Chunk(len(rows), int(rows[-1][0]))

    def _dead_letter(self, cur: Cursor, keys: list[int], *, drop: bool = True) -> None:
        """Move the poison claims `keys` raw to the error queue, and delete them (`drop`; not when
        the caller deletes their whole range next)."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        db.execute(cur, d.dead_letter_claims(e.claims, o.consumer, o.error_queue, keys=keys))
        if drop:
            db.execute(cur, d.drop_claims(e.claims, o.consumer, keys=keys))
        with self._count:
            self.stats.poison += len(keys)

    def committed(self) -> None:
        """The last `ack_chunk` committed: hand its messages to monitoring."""
        processed, self._processed = self._processed, []
        if processed and self._observe is not None:
            try:
                self._observe(processed)
            except Exception as exc:  # noqa: BLE001 - monitoring is best-effort
                log.warning("monitoring could not take %d processed message(s): %s", len(processed), exc)

    def ack_retried(self, cur: Cursor, *, upto: int, batch: int) -> tuple[int, int]:
        """Without copies to make: acknowledge the ServicePulse retries among the first `batch`
        of the consumer's claims <= upto whose headers mention one, and delete those claims.
        (claims deleted, claims looked at): a full page means the caller asks again. The rest
        are deleted by the plain acknowledgement."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        found = db.rows(cur, d.claims_with_header(e.claims, o.consumer, upto=upto, header=H.RETRY_ACK_QUEUE, limit=batch))
        keyed = [(int(seq), h) for seq, text in found if (h := decode_headers(text)) is not None]
        retried, _ = self._acknowledge_retries(cur, keyed, self._clock())
        if retried:
            db.execute(cur, d.drop_claims(e.claims, o.consumer, keys=retried))
        return len(retried), len(found)

    # -- pieces -----------------------------------------------------------------------------------

    def _started(self, seq: int, claimed_at: Any, ended: datetime) -> datetime:
        claimed = as_utc(claimed_at) if isinstance(claimed_at, datetime) else ended
        planned = self.times.started(seq)
        start = claimed if planned is None else max(claimed, planned)
        return min(start, ended)

    def _acknowledge_retries(self, cur: Cursor, rows: list[tuple[int, dict[str, str | None]]],
                             now: datetime) -> tuple[list[int], set[int]]:
        """Send the retry acknowledgements of these claims: (the claims that are ServicePulse
        retries, those whose acknowledgement went)."""
        if not self.endpoint.options.acknowledge_retries:
            return [], set()
        items = []
        for key, headers in rows:
            ack = retry_acknowledgement(headers, now)
            if ack is not None:
                items.append(Item(key, ack[1], ack[0]))
        if not items:
            return [], set()
        d, e = self.endpoint.dialect, self.endpoint
        router = Router(d, e.options.routing)
        routed = route_rows(
            cur, router, items,
            insert=lambda target, keys, headers: d.control_messages(target.address, headers=headers),
            delete=None, error_queue=None, source="spark_qtransport.retry_acknowledgement", endpoint=e.options.consumer,
        )
        kept = {key for key, _ in routed.kept}
        for key, reason in routed.kept[:1]:
            log.warning("queue %s: no ServiceControl retry acknowledgement for %d message(s) (e.g. claim %s): %s; "
                        "ServiceControl Audit acknowledges retries it sees audited without one",
                        e.queue_text, len(routed.kept), key, reason)
        with self._count:
            self.stats.retry_acks += len(items) - len(kept)
            self.stats.retry_acks_refused += len(kept)
        return [i.key for i in items], {i.key for i in items} - kept

    def _timed(self, headers: dict[str, str | None], started: datetime, ended: datetime) -> Processed:
        sent = parse_time(headers.get(H.DELIVER_AT)) or parse_time(headers.get(H.TIME_SENT))
        return Processed(message_types=headers.get(H.ENCLOSED_MESSAGE_TYPES) or "", started=started, ended=ended,
                         sent=sent, retries=retries_performed(headers))

