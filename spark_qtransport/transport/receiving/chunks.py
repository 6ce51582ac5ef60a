"""One chunk of an acknowledgement, one transaction: read what the step needs of the claims,
dead-letter the poison among them, leave out what the sink failed, have the platform's copies made
(`platform.after`), delete. The acknowledgement (`acker`) runs chunks until one comes short.

**Only what succeeded.** A message the pipeline failed or retried (`fail()`, `retry_later()`)
through the sink of the same query was not processed: the sink's dispatch marked its claim
failed (`settled.note_failed`, in the transaction that sent its error or retry copy, before Spark
commits the batch), and its chunk takes the marks of its range (`settled.take_failed`) and makes no
audit or forwardTo copy, no retry acknowledgement and no monitoring timing for them, as
NServiceBus audits only what its handlers processed; the same mark whether the claim is held in
the claim table or by a prepared transaction. A stream whose output goes elsewhere (a
``foreachBatch`` without `QueueSink`) marks nothing: all it acknowledges is audited.

Each chunk reads its claims' headers (never bodies), writes the copies and deletes the claims in
one transaction, so each message is audited, forwarded and acknowledged exactly once however the
driver dies: a repeated acknowledgement finds no claims. Expired messages never reach the claim
table, so they are never audited.

**Prepared claims** (`claimMode`): the acknowledgement is a COMMIT PREPARED, which can write
nothing. Each chunk (`Chunks.held`) reads the held rows' headers, writes the copies from the rows
the claim holds, and records how far the claim's copies got (`prepared.note_progress`: a row of the
claim table) in one transaction, before the commit; an acknowledgement that finds the record goes
on after it, and parking copies only the rows after it. Where this run made the claim and judged it
free of poison, and monitoring needs no headers, no header is parsed (`AfterProcessing.write_appended`).

**Poison claims.** Where the claim does not judge headers (`ReceiveSql.poison_at_claim`: PostgreSQL),
a claimed message whose headers are not a flat JSON object of strings (`wire.decode_headers`) was
never delivered (reads leave it out); its chunk moves it raw to the error queue
(`dead_letter_claims`) in the transaction that deletes the rest, so it is moved exactly once, and
never audited, forwarded or timed. A plain acknowledgement (nothing to copy) reads each chunk's
headers for that, unlocked (`Chunks.plain`).
"""

from __future__ import annotations

from typing import NamedTuple

from ...dialects import Cursor
from ...wire import H, decode_header_texts, decode_headers
from .. import session as db
from .. import settled
from ..platform.after import AfterProcessing, Copy
from . import prepared
from .judge import judged
from .prepared import PreparedClaim
from .setup import Endpoint

__all__ = ["Chunk", "Chunks"]


class Chunk(NamedTuple):
    """One chunk of an acknowledgement: the claims gone, the last claim sequence it read (the next
    chunk reads after it), and the poison claims it moved to the error queue."""

    gone: int
    last: int
    poison: int = 0


class Chunks:
    """The chunks of one queue's acknowledgements (see the module's text); each method runs in the
    caller's transaction."""

    def __init__(self, endpoint: Endpoint, after: AfterProcessing) -> None:
        self.endpoint, self.after = endpoint, after

    def table(self, cur: Cursor, *, upto: int, batch: int, table: str, after: int = 0) -> Chunk:
        """Copy and delete the consumer's first `batch` claims of the claim table (its id: `table`)
        in (after, upto]."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        self.after.begin()
        rows = db.rows(cur, d.ack_rows(e.claims, o.consumer, upto=upto, batch=batch, after=after))
        if not rows:
            return Chunk(0, after)
        gone, last = len(rows), int(rows[-1][0])
        parsed = decode_header_texts([text for _, text, _ in rows])
        poison = 0
        if not d.poison_at_claim and None in parsed:
            keys = [int(seq) for (seq, *_), h in zip(rows, parsed, strict=True) if h is None]
            poison = self._dead_letter(cur, keys)
            rows, parsed = [r for r, h in zip(rows, parsed, strict=True) if h is not None], [h for h in parsed if h is not None]
            if not rows:
                return Chunk(gone, last, poison)
        failed = self._failed(cur, table, keys=[int(seq) for seq, _, _ in rows])
        ok = [int(seq) not in failed for seq, _, _ in rows]
        self.after.write(cur, [(int(seq), text, at) for (seq, text, at), keep in zip(rows, ok, strict=True) if keep],
                         [h for h, keep in zip(parsed, ok, strict=True) if keep],
                         lambda target, keys, headers, ttbr: d.forward_claims(e.claims, o.consumer, target, keys=keys,
                                                                              headers=headers, ttbr_ms=ttbr))
        db.execute(cur, d.drop_claims(e.claims, o.consumer, keys=[int(seq) for seq, *_ in rows]))
        return Chunk(gone, last, poison)

    def held(self, cur: Cursor, claim: PreparedClaim, *, after: int, batch: int) -> Chunk:
        """The copies of a prepared claim's first `batch` rows numbered above `after`, and its
        progress noted (`prepared.note_progress`), in one transaction: the copies are written
        before the claim's COMMIT PREPARED, which cannot carry them, and the progress says which
        are written, so a driver dying between the two (or between two chunks) copies nothing
        twice (the next run commits the claim, or parks only the rest). The claim moved its
        poison to the error queue already: they are not copied again. Chunk(rows looked at, the
        last number done)."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        self.after.begin()
        if claim.clean and not self.after.timed:
            return self._held_appended(cur, claim, after=after, batch=batch)
        found = list(judged(cur, lambda a, n: d.prepared_headers(
            o.queue, xid=claim.xid, after=a, high=claim.high, claimed_at=claim.claimed_at, limit=n),
            after=max(claim.low - 1, after - claim.shift), limit=batch))
        done = claim.last if len(found) < batch else claim.shift + int(found[-1][0][0])
        failed = self._failed(cur, claim.table, after=after, upto=done)
        kept = [(claim.shift + int(row[0]), str(row[1]), h) for row, h in found
                if h is not None and claim.shift + int(row[0]) not in failed]
        if kept:
            self.after.write(cur, [(key, text, claim.claimed) for key, text, _ in kept], [h for *_, h in kept],
                             self._held_copy(claim))
        prepared.note_progress(cur, e, claim, done)
        return Chunk(len(found), done)

    def _held_appended(self, cur: Cursor, claim: PreparedClaim, *, after: int, batch: int) -> Chunk:
        """`held` for a claim this run judged free of poison, when nothing needs each message's
        headers decoded (no monitoring): the chunk's numbers (after, upto] end at their batch's
        end, so one ProcessingStarted serves them (`AfterProcessing.write_appended`)."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        upto = min(claim.last, after + batch)
        end = self.after.times.next_end(after)
        if end is not None:
            upto = min(upto, end)
        failed = self._failed(cur, claim.table, after=after, upto=upto)
        rows: list[tuple[int, str]] = []
        if o.audit_queue is not None:
            for seq, text in db.rows(cur, db.prefixed(cur, d.prepared_headers(
                    o.queue, xid=claim.xid, after=after - claim.shift, high=upto - claim.shift,
                    claimed_at=claim.claimed_at, limit=upto - after))):
                if (key := claim.shift + int(seq)) not in failed:
                    rows.append((key, str(text)))
        copied = self.after.write_appended(
            cur, rows, upto=upto, claimed=claim.claimed,
            copy=self._held_copy(claim),
            forward=lambda target: d.copy_held_range(o.queue, target, xid=claim.xid, shift=claim.shift,
                                              claimed_at=claim.claimed_at, after=after, upto=upto, skip=sorted(failed)))
        prepared.note_progress(cur, e, claim, upto)
        return Chunk(copied, upto)

    def _held_copy(self, claim: PreparedClaim) -> Copy:
        """The statements that copy messages of a prepared claim from the rows it holds."""
        d, queue = self.endpoint.dialect, self.endpoint.options.queue
        return lambda target, keys, headers, ttbr: d.copy_held(
            queue, target, xid=claim.xid, shift=claim.shift, claimed_at=claim.claimed_at, keys=keys, headers=headers,
            ttbr_ms=ttbr)

    def plain(self, cur: Cursor, *, upto: int, batch: int, after: int = 0, table: str = "",
              retries: bool = False) -> Chunk:
        """Without copies to make, where the claim did not judge headers: move the poison among
        the consumer's first `batch` claims in (after, upto] to the error queue, delete the rest.
        With `retries`, the ServicePulse retries among them (their headers name the acknowledgement
        queue) are acknowledged first (`retried`, which locks and deletes them, and any it finds
        after this chunk's last claim, counted here): the headers this chunk reads anyway tell
        whether that is needed, so a chunk of no retry costs no statement more."""
        d, e = self.endpoint.dialect, self.endpoint
        rows = db.rows(cur, d.ack_headers(e.claims, e.options.consumer, upto=upto, batch=batch, after=after))
        if not rows:
            return Chunk(0, after)
        gone, last = len(rows), int(rows[-1][0])
        if retries and any(H.RETRY_ACK_QUEUE in text for _, text in rows):
            gone += sum(1 for key in self._retried(cur, upto=upto, batch=batch, table=table)[0] if key > last)
        parsed = decode_header_texts([text for _, text in rows])
        poison = 0
        if None in parsed:
            keys = [int(seq) for (seq, _), h in zip(rows, parsed, strict=True) if h is None]
            poison = self._dead_letter(cur, keys, drop=False)
        db.execute(cur, d.drop_claim_range(e.claims, e.options.consumer, lo=int(rows[0][0]), hi=last))
        return Chunk(gone, last, poison)

    def retried(self, cur: Cursor, *, upto: int, batch: int, table: str) -> tuple[int, int]:
        """Without copies to make: acknowledge the ServicePulse retries among the first `batch`
        of the consumer's claims <= upto whose headers mention one, and delete those claims.
        (claims deleted, claims looked at): a full page means the caller asks again. The rest
        are deleted by the plain acknowledgement."""
        keys, seen = self._retried(cur, upto=upto, batch=batch, table=table)
        return len(keys), seen

    def _retried(self, cur: Cursor, *, upto: int, batch: int, table: str) -> tuple[list[int], int]:
        """`retried`: (the claims acknowledged and deleted, claims looked at)."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        self.after.begin()
        found = db.rows(cur, d.claims_with_header(e.claims, o.consumer, upto=upto, header=H.RETRY_ACK_QUEUE, limit=batch))
        # a retry the pipeline failed again did not succeed: no acknowledgement; the plain delete
        # takes its claim, `settled.forget` its mark
        failed = settled.failed_among(d, cur, table, [int(seq) for seq, _ in found]) if e.settling else set()
        keyed = [(int(seq), h) for seq, text in found
                 if int(seq) not in failed and (h := decode_headers(text)) is not None]
        retried, _ = self.after.acknowledge_retries(cur, keyed, self.after.now())
        if retried:
            db.execute(cur, d.drop_claims(e.claims, o.consumer, keys=retried))
        return retried, len(found)

    def _failed(self, cur: Cursor, table: str, *, keys: list[int] | None = None, after: int = 0,
                upto: int = 0) -> set[int]:
        """Of the chunk's claims (`keys`, or a prepared claim's numbers in (after, upto]) of the
        claim table `table`, those the sink marked failed, their marks deleted
        (`settled.take_failed`): read once, in the transaction that acknowledges them. None where
        the failed-claims table is not usable (the sink marks nothing then)."""
        e = self.endpoint
        if not e.settling:
            return set()
        return settled.take_failed(e.dialect, cur, table, keys=keys, after=after, upto=upto)

    def _dead_letter(self, cur: Cursor, keys: list[int], *, drop: bool = True) -> int:
        """Move the poison claims `keys` raw to the error queue, and delete them (`drop`; not when
        the caller deletes their whole range next); how many."""
        d, e = self.endpoint.dialect, self.endpoint
        o = e.options
        db.execute(cur, d.dead_letter_claims(e.claims, o.consumer, o.error_queue, keys=keys))
        if drop:
            db.execute(cur, d.drop_claims(e.claims, o.consumer, keys=keys))
        return len(keys)
