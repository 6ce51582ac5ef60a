"""Acknowledge: once Spark commits a batch, its claims are deleted in chunks of a transaction each
(`chunks`), with the after-processing work of the Particular platform (audit and forwardTo copies,
ServiceControl retry acknowledgements: `transport.platform.after`) in the same transactions, and,
where the claim did not judge headers, the batch's poison claims moved to the error queue.
The ledger says what an acknowledgement up to an offset settles, piece by piece
(`Ledger.settled_by`): the claim table's part, deleted in chunks, then each prepared claim,
committed after its copies; nothing here asks which claim mode the run is in.
Idempotent: a repeated acknowledgement deletes nothing and copies nothing."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

from ...dialects import BatchRead, Connection, Cursor
from .. import session as db
from .. import settled
from ..platform.after import AfterProcessing
from ..session import Session
from . import prepared
from .background import Background
from .chunks import Chunk, Chunks
from .ledger import Piece
from .planner import ClaimOffset, Planner
from .setup import Endpoint
from .stats import ReceiveStats, dropped_note
from .vacuum import VACUUM_MIN_ROWS, vacuum_if_due

__all__ = ["Acker", "Forget", "Joined", "forget_together"]

log = logging.getLogger("spark_qtransport.receive")


class Acker:
    """Deletes this consumer's claims up to an offset: on the main session, or on the background
    one after any claim in flight."""

    def __init__(self, endpoint: Endpoint, main: Session, ahead: Session, background: Background,
                 stats: ReceiveStats, after: AfterProcessing, planner: Planner) -> None:
        self.endpoint, self.stats, self.after = endpoint, stats, after
        self.chunks = Chunks(endpoint, after)
        self.planner = planner
        self._main, self._ahead, self._background = main, ahead, background
        self._count = threading.Lock()  # the stats are added to from both threads
        self.failure: Exception | None = None
        self._serial = threading.Lock()
        #: (claim table id, claim sequence): this consumer's claims up to it are deleted
        self._gone: tuple[str, int] = ("", 0)
        #: told of each acknowledgement made (the stream's warden: `Receiver._watch`)
        self.on_acked: Callable[[ClaimOffset], None] | None = None
        self._deleted = 0  # claims deleted since the claim table's vacuum was last asked for (`_vacuum`)

    def done(self, table: str) -> int:
        """The claim sequence up to which this consumer's claims in `table` are deleted."""
        return self._gone[1] if self._gone[0] == table else 0

    def ack(self, end: ClaimOffset) -> int:
        """Acknowledge now; the number of claims deleted."""
        return self._ack(self._main, end)

    def ack_in_background(self, end: ClaimOffset) -> None:
        """Acknowledge on the background thread. Nothing waits on it, and a lost one is repaired
        by the next, which deletes everything up to its own end."""
        self._background.submit(self.ack_logged, end)

    def ack_logged(self, end: ClaimOffset) -> None:
        """Acknowledge on the background session (on the background thread); a failure is logged,
        and one that no acknowledgement can get past stops the query at its next trigger."""
        try:
            self._ack(self._ahead, end)
        except Exception as exc:  # noqa: BLE001 - the next acknowledgement covers these claims too
            d = self.endpoint.dialect
            log.warning("acknowledging claims up to %s on %s failed: %s", end.claim, self.endpoint.queue_text,
                        db.describe(d, exc))
            if self.after.copies and not d.is_transient(exc.__cause__ or exc):
                # an audit or forwardTo queue that refuses for good (a privilege revoked, a
                # trigger): no acknowledgement can succeed, so the query stops at its next trigger
                self.failure = exc

    def raise_failure(self) -> None:
        """Raise what made background acknowledgements fail for good, once (see `_ack_logged`)."""
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def _ack(self, session: Session, end: ClaimOffset) -> int:
        # One acknowledgement at a time: one made in the foreground (a run's first or last batch)
        # while the background thread still works through earlier ones would read the same claims
        # and copy them twice. (The chunk's read also locks its claims, for any other session.)
        with self._serial:
            return self._ack_serial(session, end)

    def _ack_serial(self, session: Session, end: ClaimOffset) -> int:
        # what the ledger holds up to `end`, read before the acknowledgement changes it
        pieces = self._pieces(end)
        total = sum(self._settle(session, end, piece) for piece in pieces)
        if self.endpoint.settling:  # the records of the batches acknowledged (`transport.settled`)
            e = self.endpoint
            session.run(lambda c: _forget(e, c.cursor(), end, pieces), e.what("forget acknowledged batches"))
        self._done(end)
        return total

    def _pieces(self, end: ClaimOffset) -> list[Piece]:
        return self.planner.ledger.settled_by(end.claim, whole_table=not self.planner.holds_prepared())

    def _done(self, end: ClaimOffset) -> None:
        """An acknowledgement up to `end` is made, and its batches' records forgotten."""
        self._gone = (end.table, max(self.done(end.table), end.claim))
        self.after.times.forget(end.claim)  # the batches' timings (ProcessingStarted) are done with
        if self.on_acked is not None:
            self.on_acked(end)

    # -- one of many queues' acknowledgements in one transaction (`QueueSet`) ---------------------

    def join(self, end: ClaimOffset) -> bool:
        """Whether this acknowledgement can be made in a transaction shared with other queues'
        (`QueueSet`): the claim table's claims only, nothing to copy, and no acknowledgement of this
        queue under way. If so, it is this queue's one until `joined` or `left` is called."""
        if self.after.copies or end.claim <= self.done(end.table) or not self._serial.acquire(blocking=False):
            return False
        pieces = self._pieces(end)
        if not pieces or any(p.claim is not None for p in pieces):
            self._serial.release()
            return False
        return True

    def ack_in(self, conn: Connection, end: ClaimOffset, forgets: list[Forget]) -> Joined:
        """A joined acknowledgement's statements, in the caller's transaction: what `_ack_plain` does
        in one chunk of each kind; the batches' records to forget are added to `forgets`, which the
        caller forgets with the other queues' (`forget_together`). A full chunk says more may be
        left: `joined` acknowledges the rest alone."""
        d, e = self.endpoint.dialect, self.endpoint
        o, cur, batch = e.options, conn.cursor(), e.options.ack_batch
        retried = 0
        if not d.poison_at_claim:  # the chunk reads the headers: its poison moved, its retries acknowledged
            chunk = self.chunks.plain(cur, upto=end.claim, batch=batch, after=self.done(end.table), table=end.table,
                                      retries=o.acknowledge_retries)
            gone, poison = chunk.gone, chunk.poison
        else:
            if o.acknowledge_retries:
                retried, seen = self.chunks.retried(cur, upto=end.claim, batch=batch, table=end.table)
                if seen >= batch:
                    return Joined(retried, 0, full=True)
            gone, poison = db.rowcount(cur, d.ack_claims(e.claims, o.consumer, upto=end.claim, batch=batch)), 0
        if gone >= batch:
            return Joined(retried + gone, poison, full=True)
        if e.settling:
            forgets.append(Forget(self, end))
        return Joined(retried + gone, poison, full=False)

    def forget_in(self, cur: Cursor, end: ClaimOffset) -> None:
        """In the caller's transaction: the records of the batches acknowledged up to `end`, and the
        failed marks they leave (`_forget`)."""
        _forget(self.endpoint, cur, end, self._pieces(end))

    def joined(self, session: Session, end: ClaimOffset, made: Joined) -> None:
        """The shared transaction committed `made`: the counts, the ledger; the rest alone if its
        chunk was full. Ends what `join` began."""
        try:
            self._committed()
            self._count_acked(made.gone, made.poison)
            self._vacuum(session, made.gone)
            if made.full:
                self._ack_serial(session, end)
            else:
                self.planner.ledger.acknowledged_table(end.claim)
                self._done(end)
        finally:
            self._serial.release()

    def left(self) -> None:
        """The shared transaction did not commit: this acknowledgement is not made (`join`)."""
        self._serial.release()

    def _settle(self, session: Session, end: ClaimOffset, piece: Piece) -> int:
        """Acknowledge one piece of the ledger up to `end`; the number of claims it settled. The
        claim table's part is deleted in chunks (`_ack_table`); a prepared claim is committed,
        after its copies (`_commit`)."""
        if piece.claim is not None:
            return self._commit(session, piece.claim)
        total = self._ack_table(session, end)
        self.planner.ledger.acknowledged_table(end.claim)
        return total

    def _commit(self, session: Session, claim: prepared.PreparedClaim) -> int:
        """A prepared claim: its after-processing, then its COMMIT PREPARED."""
        what = self.endpoint.what("acknowledge")
        if self.after.copies:
            self._after_held(session, claim)
        session.run(functools.partial(prepared.commit, endpoint=self.endpoint, claim=claim), what)
        if self.after.copies:
            session.run(functools.partial(prepared.forget_progress, endpoint=self.endpoint, claim=claim), what)
        self.planner.ledger.committed(claim)
        return claim.last - claim.first + 1

    def _after_held(self, session: Session, claim: prepared.PreparedClaim) -> None:
        """The after-processing of a prepared claim, in chunks of a transaction each, from where
        an earlier acknowledgement of it got to (`prepared.progress`): all of it is written
        before its COMMIT PREPARED."""
        after, what = self.after, self.endpoint.what("acknowledge")
        batch = after.chunk_size(self.endpoint.options.ack_batch)
        done = session.run(lambda c: prepared.progress(c.cursor(), self.endpoint, claim), what)
        while done < claim.last:
            chunk = functools.partial(_held_chunk, self.chunks, claim, done, batch)
            done = session.run(chunk, what).last
            self._committed()

    def park(self, session: Session, *, older_than: float | None) -> int:
        """Move this consumer's prepared claims older than `older_than` seconds (None: all of them)
        into the claim table (`prepared.park`), one at a time; the number moved. Serial with the
        acknowledgements: one of them commits what the other would copy."""
        d, what, moved = self.endpoint.dialect, self.endpoint.what("park prepared claims"), 0
        with self._serial:
            table = self.planner.table_id()
            # the server's list gives the ages; the planner's own list is left as it is, but for the
            # claims parked here (a claim made meanwhile on the other session is young, not listed)
            current = session.run(lambda c: prepared.listed(self.endpoint, c.cursor(), table), what)
            for claim in current:
                if older_than is not None and claim.age < older_than:
                    continue
                self.planner.ledger.parking(claim)
                session.run(functools.partial(prepared.park, endpoint=self.endpoint, claim=claim), what)
                self.planner.ledger.parked(claim)
                moved += 1
                log.info("queue %s: moved the prepared claim of numbers %d-%d (%.0fs old) into %s", self.endpoint.queue_text,
                         claim.first, claim.last, claim.age, d.qualified(self.endpoint.claims))
        return moved

    def _ack_table(self, session: Session, end: ClaimOffset) -> int:
        total, poison = self._ack_with_copies(session, end) if self.after.copies else self._ack_plain(session, end)
        self._count_acked(total, poison)
        self._vacuum(session, total)
        return total

    def _count_acked(self, total: int, poison: int) -> None:
        with self._count:
            self.stats.acked += total
            self.stats.poison += poison
        if poison:
            d, o = self.endpoint.dialect, self.endpoint.options
            log.warning("queue %s: acknowledged %d, %s", self.endpoint.queue_text, total - poison,
                        dropped_note(self.stats, expired=0, poison=poison, error_queue=d.format_address(o.error_queue)))

    def _vacuum(self, session: Session, deleted: int) -> None:
        """Vacuum the claim table if it is due (`vacuum_if_due`), asked once this run deleted
        `VACUUM_MIN_ROWS` claims since it last asked: a vacuum needs that many dead rows, and a
        stream over a thousand small queues must not ask each at every acknowledgement."""
        self._deleted += deleted
        if self._deleted >= VACUUM_MIN_ROWS and session.connected:
            self._deleted = 0
            vacuum_if_due(self.endpoint.dialect, session.connection(), self.endpoint.claims)

    def _committed(self) -> None:
        """A chunk committed: monitoring gets its timings, the stats what it copied and sent."""
        made = self.after.committed()
        with self._count:
            self.stats.copied(made)

    def _ack_with_copies(self, session: Session, end: ClaimOffset) -> tuple[int, int]:
        """Each chunk reads its claims' headers, writes the copies and deletes the claims, in one
        transaction. (claims deleted, poison moved)."""
        batch = self.after.chunk_size(self.endpoint.options.ack_batch)
        return self._chunks(session, end, batch,
                            lambda c, lo: self.chunks.table(c.cursor(), upto=end.claim, batch=batch, table=end.table,
                                                            after=lo),
                            committed=self._committed)

    def _chunks(self, session: Session, end: ClaimOffset, batch: int, chunk: Callable[[Connection, int], Chunk],
                committed: Callable[[], None] = lambda: None) -> tuple[int, int]:
        """Run `chunk` (one transaction each) until one finds fewer than `batch` claims; each reads
        after the last the one before read (and the first after where an earlier acknowledgement of
        this claim table got to: the claims before it are gone), never over their dead index entries.
        (claims deleted, poison moved)."""
        lo = self.done(end.table)
        what, total, poison = self.endpoint.what("acknowledge"), 0, 0
        while True:
            done = session.run(functools.partial(_after, chunk, lo), what)
            committed()
            total, poison = total + done.gone, poison + done.poison
            lo = max(lo, done.last)
            if done.gone < batch:
                return total, poison

    def _ack_plain(self, session: Session, end: ClaimOffset) -> tuple[int, int]:
        """ServicePulse retries first (their acknowledgements with their deletes: in each chunk, where
        the chunks read the headers), then plain deletes. (claims deleted, poison moved)."""
        d, o, what = self.endpoint.dialect, self.endpoint.options, self.endpoint.what("acknowledge")
        batch = o.ack_batch
        if not d.poison_at_claim:  # the claim did not judge headers: each chunk is read, its poison moved and
            # its retries acknowledged (`Chunks.plain`)
            return self._chunks(
                session, end, batch, lambda c, lo: self.chunks.plain(c.cursor(), upto=end.claim, batch=batch, after=lo,
                                                                     table=end.table, retries=o.acknowledge_retries),
                committed=self._committed)
        total = 0
        while o.acknowledge_retries:
            deleted, seen = session.run(
                lambda c: self.chunks.retried(c.cursor(), upto=end.claim, batch=batch, table=end.table), what)
            self._committed()
            total += deleted
            if seen < batch:
                break
        stmt = d.ack_claims(self.endpoint.claims, o.consumer, upto=end.claim, batch=batch)
        while True:
            n = session.run(lambda c: db.rowcount(c.cursor(), stmt), what)
            total += n
            if n < batch:
                return total, 0


class Forget(NamedTuple):
    """A joined acknowledgement's records to forget (`Acker.ack_in`, `forget_together`)."""

    acker: Acker
    end: ClaimOffset


def forget_together(cur: Cursor, forgets: list[Forget]) -> None:
    """In the caller's transaction: the records of many queues' joined acknowledgements forgotten in
    one statement (`settled.forget_many`), and each queue whose claim table holds a failed mark then
    forgets on its own (`Acker.forget_in`: which marks no claim needs is the claim table's to say).
    At a thousand queues, a statement a transaction rather than one a queue."""
    if not forgets:
        return
    e = forgets[0].acker.endpoint
    d = e.dialect
    reads = [BatchRead(d.qualified(f.acker.endpoint.claims), f.acker.endpoint.options.consumer, f.end.table, 0,
                       f.end.claim) for f in forgets]
    marked = settled.forget_many(d, cur, reads)
    for f in forgets:
        if marked is None or f.end.table in marked:
            f.acker.forget_in(cur, f.end)


class Joined(NamedTuple):
    """What an acknowledgement made in a shared transaction did (`Acker.ack_in`): claims deleted,
    poison moved, and whether a chunk was full (more may be left)."""

    gone: int
    poison: int
    full: bool


def _forget(endpoint: Endpoint, cur: Cursor, end: ClaimOffset, pieces: list[Piece]) -> None:
    """The records of the batches acknowledged up to `end` (`settled.forget`), with the ranges of
    our numbers its `pieces` covered: it takes the sink's marks of them that no chunk took."""
    e = endpoint
    spans = [(p.after, p.upto) for p in pieces if p.upto > p.after and e.mode.ours(p.upto)]
    settled.forget(e.dialect, cur, e.claims, e.options.consumer, end.claim, end.table, spans)


def _held_chunk(chunks: Chunks, claim: prepared.PreparedClaim, lo: int, batch: int, conn: Connection) -> Chunk:
    return chunks.held(conn.cursor(), claim, after=lo, batch=batch)


def _after(chunk: Callable[[Connection, int], Chunk], lo: int, conn: Connection) -> Chunk:
    return chunk(conn, lo)
