"""Receive: the consumer lock, claims, the slices executors read, acknowledgements."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

from .addressing import AddressingSql
from .values import ClaimFailures, ClaimNumbering, QueueAddress, Statement


class ReceiveSql(AddressingSql):
    """The SQL of the streaming source (docs/contributing/contract.md, Receive)."""

    #: Does the claim judge every row's headers (poison rows go to the error queue there)? When
    #: not, it judges only the rows it does not claim (expired, odd), claims the rest whatever
    #: their headers, and the poison among them are never delivered (reads leave them out) and go
    #: to the error queue with the acknowledgement of their batch (`ack_headers`,
    #: `dead_letter_claims`): the read parses every header anyway, and the database is spared a
    #: parse of each (see the PostgreSQL dialect).
    poison_at_claim: bool = True

    #: Does a slice's read fetch a page at a time (`read_claims` and `read_prepared` with `limit`:
    #: a query per page, each after the last row the one before returned) instead of streaming
    #: one query's rows through a cursor? See the PostgreSQL dialect for why.
    read_in_pages: bool = False

    @abstractmethod
    def table_id(self, table: QueueAddress) -> Statement:
        """One row, one column: an id that changes when the table is dropped and created again
        (NULL when it does not exist)."""

    @abstractmethod
    def queue_columns(self, table: QueueAddress) -> Statement:
        """Rows of (lower-cased column name, type name) of an ordinary table; none if there is no
        such table (a view, a foreign table or a system object has none either)."""

    @abstractmethod
    def try_lock_consumer(self, claims: QueueAddress, consumer: str) -> Statement:
        """One row, one boolean: a session-level lock on (claim table, consumer) was taken."""

    @abstractmethod
    def unlock_consumer(self, claims: QueueAddress, consumer: str) -> Statement:
        """Release the lock taken by `try_lock_consumer`."""

    def columns_of(self, tables: Sequence[QueueAddress]) -> Statement | None:
        """One statement for `queue_columns` of several tables (a stream's set-ups on a new
        connection): rows of (i, lower-cased column name, type name, `table_id`), i the table's
        index in `tables`, in each table's column order; none for a table `queue_columns` finds
        none of. None: the dialect has no such statement, and each set-up asks for its own."""
        return None

    def try_lock_consumers(self, pairs: Sequence[tuple[QueueAddress, str]]) -> Statement | None:
        """One statement for `try_lock_consumer` of several (claim table, consumer) pairs: a row
        (i, taken) per pair, the very lock `try_lock_consumer` takes. None: each set-up takes its own."""
        return None

    @abstractmethod
    def peek(self, queue: QueueAddress, *, after: int, upto: int | None) -> Statement:
        """One row, one column: the lowest unlocked queue sequence > after (and <= upto), or NULL.

        Skips rows locked by other consumers and never blocks on them; takes no lock when the
        queue is empty, so an idle queue costs no write."""

    @abstractmethod
    def claim(
        self,
        queue: QueueAddress,
        claims: QueueAddress,
        error: QueueAddress,
        *,
        consumer: str,
        limit: int,
        after: int,
        upto: int | None,
        failures: ClaimFailures | None = None,
        numbering: ClaimNumbering | None = None,
    ) -> list[Statement]:
        """Move at most `limit` of the oldest unlocked queue rows (sequence > after, <= upto) into
        the claim table, dropping expired ones and moving poison ones raw to the error queue.
        Nothing odd is claimed and no value fails the claim: NULL headers are claimed as '' (no
        headers, as NServiceBus reads them); a row without an id, or whose Expires is beyond
        `LATEST_TIME`, goes to the error queue with `failures`' headers merged into its own (None:
        built for `queue`); an Expires of infinity is claimed as NULL (never expires).
        The LAST statement returns one row whose columns are named as `ClaimResult`'s fields.
        With `numbering` (dialects with `prepared_claims` only): the rows `numbering.picked` names
        (`pick`, in this transaction), numbered ours, poison as the driver judged it, and more columns: `tabled` (rows written to the claim table) and
        `low_source`, `claimed_at`, `xid` (the lowest queue sequence picked, the claim's UTC clock as
        20 digits, its transaction's id): what names a prepared claim (`PreparedClaim`)."""

    def pick(self, queue: QueueAddress, *, after: int, upto: int | None, limit: int) -> list[Statement]:
        """The first step of a numbered claim (`ClaimNumbering.picked`): lock at most `limit` of the
        oldest unlocked queue rows (sequence > after, <= upto), skipping rows others hold. The LAST
        statement returns their rows (seq, headers text, '' for NULL, expired, odd: no id or an
        Expires beyond `LATEST_TIME`), in order, expiry judged by the transaction's clock as the
        claim judges it. Dialects with `prepared_claims` only."""
        raise NotImplementedError(f"{type(self).__name__} numbers no claims")

    def take(self, queue: QueueAddress, *, after: int, upto: int | None, limit: int) -> list[Statement]:
        """A prepared claim of plain rows in one pass (`claimer.Claimer._take`): delete at most
        `limit` of the oldest unlocked queue rows (sequence > after, <= upto), skipping rows others
        hold. The LAST statement returns the rows deleted as `pick` does (seq, headers text,
        expired, odd), in no given order. Dialects with `prepared_claims` only."""
        raise NotImplementedError(f"{type(self).__name__} numbers no claims")

    def claim_numbers(self, *, first: int, clock_base: int | None) -> Statement:
        """One row (first number, the claim's UTC clock as 20 digits, its transaction's id) for a
        claim `take` made: the columns `min_claim`, `claimed_at` and `xid` of a numbered `claim`,
        the first number chosen by the same rule (`ClaimNumbering.clock_base`). Dialects with
        `prepared_claims` only."""
        raise NotImplementedError(f"{type(self).__name__} numbers no claims")

    @abstractmethod
    def forward_candidates(self, claims: QueueAddress, consumer: str, *, lo: int, hi: int) -> Statement:
        """Rows (claim_seq, headers) of the consumer's claims in [lo, hi] whose headers text
        contains the ForwardDestination header name (decoded and checked by the caller)."""

    @abstractmethod
    def claims_with_header(self, claims: QueueAddress, consumer: str, *, upto: int, header: str,
                           limit: int) -> Statement:
        """Rows (claim_seq, headers) of at most `limit` of the consumer's claims <= upto whose
        headers text contains `header` (a header name of ours: letters and dots), by claim_seq,
        locked until the transaction ends (a concurrent acknowledgement waits, then skips them)."""

    @abstractmethod
    def ack_rows(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int, after: int = 0) -> Statement:
        """Rows (claim_seq, headers, claimed_at as UTC) of the consumer's first `batch` claims in
        (after, upto], by claim_seq, locked until the transaction ends: the chunk an acknowledgement
        with after-processing work copies and deletes (a concurrent one waits, then skips them).
        `after`: where the consumer's claims are known to be deleted up to, so the read does not
        walk their dead index entries (until a vacuum, every earlier chunk's)."""

    @abstractmethod
    def forward_claims(
        self, claims: QueueAddress, consumer: str, destination: QueueAddress, *, keys: list[int],
        headers: list[str] | None, ttbr_ms: int | None = None,
    ) -> Statement:
        """Insert the consumer's claims `keys` (claim sequences) into `destination` with the given
        headers (None: their own, unchanged), in that order: a new native id, body copied
        server-side, Expires NULL or the database's UTC clock plus `ttbr_ms`. NServiceBus forwards
        so (its receiver sends a new row: MessageRow.From, Guid.NewGuid()); audit copies likewise."""

    @abstractmethod
    def control_messages(self, destination: QueueAddress, *, headers: list[str]) -> Statement:
        """Insert one control message per headers text into `destination`, in that order: a new
        native id, no expiry, an empty body (NServiceBus's ServiceControl retry acknowledgement)."""

    @abstractmethod
    def set_claim_headers(self, claims: QueueAddress, consumer: str, *, keys: list[int], headers: list[str]) -> Statement:
        """Replace the headers of the consumer's claims `keys`."""

    @abstractmethod
    def drop_claims(self, claims: QueueAddress, consumer: str, *, keys: list[int]) -> Statement:
        """Delete the consumer's claims `keys` (forwarded elsewhere in the same transaction)."""

    @abstractmethod
    def backlog(self, queue: QueueAddress, *, above: int = 0) -> Statement:
        """One row, one column: an estimate of the messages waiting (span of unlocked sequences),
        the lowest looked for above `above` (the highest queue sequence this stream's prepared
        claims hold: dialects with `prepared_claims` only)."""

    @abstractmethod
    def tables_exist(self, tables: Sequence[QueueAddress]) -> Statement:
        """One statement: a row (i, 1 or 0) per table of `tables`, whether that ordinary table
        exists (a stream looking for its queues' delayed tables at once)."""

    @abstractmethod
    def backlogs(self, queues: Sequence[QueueAddress]) -> Statement:
        """One statement for several queues' backlogs (a stream's idle check): a row (i, estimate)
        per queue, i its index in `queues`; the estimate the span of sequences. Reads only: no
        row locks, no writes, nothing that blocks on a competing consumer. An empty queue reads
        as 0; a queue some rows of which other consumers hold may read above what a claim finds."""

    def sequences_of(self, queues: Sequence[QueueAddress]) -> Statement | None:
        """A row (i, sequence oid, table oid) per queue of `queues` whose FIFO column draws from a
        sequence; i its index in `queues`. None: the dialect has no such hint, and a stream peeks
        every queue at each trigger (`receiving/quiet.py`)."""
        return None

    def sequence_values(self, sequences: Sequence[int]) -> Statement | None:
        """Rows (i, the value last given out, 0 if none) for those of `sequences` (oids from
        `sequences_of`) that still exist, give out one number at a time (no cache) and may be read;
        i the index in `sequences`. None: the dialect has no such hint."""
        return None

    def tables_written(self, tables: Sequence[int]) -> Statement | None:
        """Rows (i) for those of `tables` (oids from `sequences_of`) that a transaction holds (or
        waits for) a lock on that more than reads them: one that may insert. None: no such hint."""
        return None

    @abstractmethod
    def max_claim(self, claims: QueueAddress, consumer: str) -> Statement:
        """One row: (max claim sequence or NULL, min claim sequence or NULL) for the consumer."""

    def max_claims(self, pairs: Sequence[tuple[QueueAddress, str]]) -> Statement | None:
        """One statement for `max_claim` of several (claim table, consumer) pairs: a row (i, max,
        min) per pair, i its index in `pairs`. None: each queue asks alone."""
        return None

    @abstractmethod
    def nth_claim(self, claims: QueueAddress, consumer: str, *, after: int, n: int) -> Statement:
        """One row (or none): the n-th (1-based) claim sequence of the consumer after `after`."""

    @abstractmethod
    def read_claims(self, claims: QueueAddress, consumer: str, *, after: int, upto: int,
                    limit: int | None = None) -> Statement:
        """Rows (claim_seq, native_id text, expires, headers, body, source_seq, claimed_at) ordered
        by claim_seq, for claim_seq in (after, upto]; the first `limit` of them (dialects that
        `read_in_pages` only). No value the driver cannot load reaches it: an expires beyond
        `LATEST_TIME` (infinity, as claims of older versions may hold) is NULL, one before year 1
        is year 1."""

    def ack_headers(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int, after: int = 0) -> Statement:
        """Rows (claim_seq, headers) of the consumer's first `batch` claims in (after, upto] (`after`
        as for `ack_rows`), by claim_seq,
        unlocked (the consumer lock keeps other sessions off them): the chunk a plain
        acknowledgement judges for poison, then deletes. Dialects without `poison_at_claim` only."""
        raise NotImplementedError(f"{type(self).__name__} judges headers in the claim")

    def drop_claim_range(self, claims: QueueAddress, consumer: str, *, lo: int, hi: int) -> Statement:
        """Delete the consumer's claims in [lo, hi] (a chunk `ack_headers` read: the consumer
        claims one transaction at a time, so no claim can join that range later). Dialects
        without `poison_at_claim` only."""
        raise NotImplementedError(f"{type(self).__name__} judges headers in the claim")

    def dead_letter_claims(self, claims: QueueAddress, consumer: str, error: QueueAddress, *,
                           keys: list[int]) -> Statement:
        """Insert the consumer's claims `keys` raw into `error` (headers and body as they are, no
        expiry), as the claim moves poison rows: the same native id, or a new one where the error
        queue holds that id already (or two of these share it). The caller deletes the claims.
        Dialects without `poison_at_claim` only."""
        raise NotImplementedError(f"{type(self).__name__} judges headers in the claim")

    @abstractmethod
    def ack_claims(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int) -> Statement:
        """Delete at most `batch` claims of the consumer with claim_seq <= upto (rowcount = deleted)."""

    def vacuum_due(self, table: QueueAddress, *, every_seconds: float, min_rows: int) -> Statement | None:
        """One row, two columns: (due, allowed). Due: `table` holds at least `min_rows` deleted
        rows and was not vacuumed in the last `every_seconds`. Allowed: the current role may vacuum
        it (owns it; PostgreSQL 17+: or holds MAINTAIN); a role with table privileges only leaves
        it to autovacuum. No row when there is no such table. None when the database reclaims the
        space of deleted rows by itself (SQL Server's ghost cleanup)."""
        return None

    def vacuum(self, table: QueueAddress) -> Statement | None:
        """Run outside any transaction: make the space of deleted rows reusable (see `vacuum_due`)."""
        return None

    @abstractmethod
    def max_source_seq(self, queue: QueueAddress) -> Statement:
        """One row, one column: the highest sequence in the queue (NULL when empty)."""
