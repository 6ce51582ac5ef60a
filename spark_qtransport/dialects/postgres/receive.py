"""PostgreSQL receive: the consumer lock, the claim transaction, slices, acknowledgements, vacuum."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ...wire import RETRY_COUNTERS
from ..base import (
    LATEST_TIME,
    NUMBERS_PER_MICROSECOND,
    ClaimFailures,
    ClaimNumbering,
    QueueAddress,
    ReceiveSql,
    Statement,
)
from .addressing import PostgresAddressing
from .statements import BY_INDEX, ROWS_OF, UTC_NOW, copies, page

#: a claimed row whose headers text holds this may carry NServiceBus.SqlServer.ForwardDestination
#: (checked exactly in Python). Found by strpos: a third of LIKE '%...%''s cost, on every claimed row.
FORWARD_NAME = "NServiceBus.SqlServer.ForwardDestination"

POISON_PATH = "'strict $.* ? (@.type() != \"string\" && @.type() != \"null\")'"


def _is_poison(text: str) -> str:
    # Poison unless the text is a flat JSON object whose values are strings or null. The text is
    # parsed once (OFFSET 0 keeps the planner from copying the cast into each test); the cast only
    # runs on valid JSON and the silent jsonpath never raises, so no evaluation order matters.
    return (
        "(SELECT j IS NULL OR jsonb_typeof(j) <> 'object'"
        f" OR jsonb_path_exists(j, {POISON_PATH}, '{{}}', true)"
        " FROM (SELECT CASE WHEN pg_input_is_valid(t.h, 'jsonb') THEN t.h::jsonb END AS j"
        f" FROM (SELECT {text} AS h) AS t OFFSET 0) AS parsed)"
    )


def _jsonb_checkable(col: str) -> str:
    """`col` as jsonb can judge it: the escape \\u0000 (a NUL, which NServiceBus writes and reads
    back, but jsonb refuses: text cannot hold it) read as \\u0001. That changes no structure and
    no type: what was a NUL in a string stays a character in that string; an escaped backslash
    before "u0000" stays a backslash and plain characters. chr(92), not a backslash literal, so
    standard_conforming_strings does not matter."""
    return f"replace({col}, chr(92) || 'u0000', chr(92) || 'u0001')"


#: what a numbered claim's pick or one-pass take returns of a row after its seq: the headers text
#: ('' for NULL), expired (by the transaction's clock, as the claim and its reads judge it), odd (no
#: id, or an Expires beyond LATEST_TIME)
_JUDGED = (f"COALESCE(headers, ''), (expires IS NOT NULL AND expires <= {UTC_NOW}),"
           f" (id IS NULL OR (expires > TIMESTAMP '{LATEST_TIME}' AND isfinite(expires)))")
#: a numbered claim's first number: the one asked for, or above the server's clock on a run's first
#: claim (`ClaimNumbering.clock_base`)
_FIRST_NUMBER = ("greatest(%(first)s::bigint, COALESCE(%(clock_base)s::bigint"
                 " + (extract(epoch FROM clock_timestamp()) * 1000000)::bigint * %(per_us)s::bigint, 0))")
#: a claim's UTC clock as 20 digits and its transaction's id: with its numbers, what names a prepared claim
_CLAIMED_AT = f"to_char({UTC_NOW}, 'YYYYMMDDHH24MISSUS')"
_XID = "mod(pg_catalog.pg_current_xact_id()::text::numeric, 4294967296)::text"

#: PostgreSQL 13 to 15 have no pg_input_is_valid: a PL/pgSQL helper catches the cast's error
#: instead (one subtransaction per message, so slower). Created beside the claim table.
HELPER_FUNCTION = "sqlqueue_poison_headers"


class PostgresReceive(PostgresAddressing, ReceiveSql):
    """The PostgreSQL receive of the dialect."""

    #: jsonb parses a header text about ten times slower than the read's orjson does (8-9 µs of the
    #: server's CPU for 800 bytes of NServiceBus headers, 40% of a claim): the claim judges only
    #: the rows it does not claim, the acknowledgement the rest (`ReceiveSql.poison_at_claim`)
    poison_at_claim = False

    #: A server-side cursor costs the server nearly twice what the same rows cost as plain queries
    #: (1 KB bodies with NServiceBus's headers: 3.8 against 2.0 µs a row, the plan alike; measured
    #: 2026-11-28, bench/README.md): a slice is read as queries of a page each, each after the last
    #: row read, sized as the fetches of a cursor would be
    read_in_pages = True

    #: set by adapt_to_server on PostgreSQL < 16: check headers with the PL/pgSQL helper there
    helper_schema: str | None

    def _poison(self, col: str) -> str:
        # '' is no headers, not corrupted: NServiceBus's Message parses only a non-empty text
        # (string.IsNullOrEmpty; white space alone fails its JSON parse, so it is poison). Checked
        # here, not in the helper, so helpers already installed on PostgreSQL 13-15 agree.
        # NULL is no headers too (MessageRow.GetHeaders: DBNull -> null -> []): never NULL here.
        text = _jsonb_checkable(col)
        check = _is_poison(text) if self.helper_schema is None else f"{self.quote(self.helper_schema)}.{HELPER_FUNCTION}({text})"
        return f"({col} IS NOT NULL AND {col} <> '' AND {check})"

    def table_id(self, table: QueueAddress) -> Statement:
        expr, params = self._regclass(table)
        return Statement(f"SELECT {expr}::oid::text", params)

    def queue_columns(self, table: QueueAddress) -> Statement:
        expr, params = self._regclass(table)
        # ordinary and partitioned tables only: a view (rules, INSTEAD OF triggers) or a foreign
        # table is never written to as a queue
        return Statement(
            "SELECT lower(a.attname), format_type(a.atttypid, a.atttypmod)"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid AND c.relkind IN ('r', 'p')"
            f" WHERE a.attrelid = {expr} AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            params,
        )

    def columns_of(self, tables: Sequence[QueueAddress]) -> Statement:
        # `queue_columns` and `table_id` of each table, by the same to_regclass of the same text
        return Statement(
            "SELECT t.i - 1, lower(a.attname), pg_catalog.format_type(a.atttypid, a.atttypmod), c.oid::text"
            " FROM pg_catalog.unnest(%(names)s::text[]) WITH ORDINALITY AS t(name, i)"
            " JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(t.name) AND c.relkind IN ('r', 'p')"
            " JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
            " ORDER BY t.i, a.attnum",
            {"names": [self.qualified(t) for t in tables]},
        )

    @staticmethod
    def _lock_key_of(regclass: str, consumer: str) -> str:
        # Keyed by the claim table's oid, not by its spelling: `Sales`, `public.Sales` and
        # `"public"."Sales"` are one table, so one lock. The oid is digits, so the text
        # "sqlqueue consumer <oid> <consumer>" cannot be read two ways. The one key of
        # `try_lock_consumer`, `try_lock_consumers` and `unlock_consumer`.
        return f"pg_catalog.hashtextextended('sqlqueue consumer ' || {regclass}::oid::text || ' ' || {consumer}, 0)"

    def _lock_key(self, claims: QueueAddress, consumer: str) -> tuple[str, dict[str, Any]]:
        expr, params = self._regclass(claims)
        return self._lock_key_of(expr, "%(consumer)s"), {**params, "consumer": consumer}

    def try_lock_consumers(self, pairs: Sequence[tuple[QueueAddress, str]]) -> Statement:
        key = self._lock_key_of("pg_catalog.to_regclass(t.name)", "t.consumer")
        return Statement(
            f"SELECT t.i - 1, pg_catalog.pg_try_advisory_lock({key})"
            " FROM ROWS FROM (pg_catalog.unnest(%(names)s::text[]), pg_catalog.unnest(%(consumers)s::text[]))"
            " WITH ORDINALITY AS t(name, consumer, i)",
            {"names": [self.qualified(c) for c, _ in pairs], "consumers": [consumer for _, consumer in pairs]},
        )

    def try_lock_consumer(self, claims: QueueAddress, consumer: str) -> Statement:
        key, params = self._lock_key(claims, consumer)
        return Statement(f"SELECT pg_catalog.pg_try_advisory_lock({key})", params)

    def unlock_consumer(self, claims: QueueAddress, consumer: str) -> Statement:
        key, params = self._lock_key(claims, consumer)
        return Statement(f"SELECT pg_catalog.pg_advisory_unlock({key})", params)

    @staticmethod
    def _range(after: int, upto: int | None) -> tuple[str, dict[str, Any]]:
        if upto is None:
            return "seq > %(after)s", {"after": after}
        return "seq > %(after)s AND seq <= %(upto)s", {"after": after, "upto": upto}

    def peek(self, queue: QueueAddress, *, after: int, upto: int | None) -> Statement:
        cond, params = self._range(after, upto)
        # FOR UPDATE SKIP LOCKED: a row another consumer holds is not work for us (a plain min()
        # would count it and start a storm of empty DELETEs). On an empty queue nothing is locked.
        return Statement(
            f"SELECT seq FROM {self.qualified(queue)} WHERE {cond} ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED",
            params,
        )

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
        q, c, e = self.qualified(queue), self.qualified(claims), self.qualified(error)
        failures = failures or ClaimFailures.build(failed_q=self.format_address(queue), endpoint=queue.table)
        cond, params = self._range(after, upto)
        params = {**params, "limit": int(limit), "consumer": consumer, "forward_name": FORWARD_NAME,
                  "fail_id": failures.null_id, "fail_expires": failures.far_expires, "slot": failures.slot,
                  "nul_mark": uuid.uuid4().hex}
        if numbering is not None:
            return self._numbered_claim(q, c, e, params, numbering)
        # One statement, one transaction, same snapshot for every part. `picked` locks the oldest
        # unlocked rows and classifies them from their small columns; it is MATERIALIZED so it
        # runs once (a re-evaluated LIMIT ... SKIP LOCKED can return more rows than asked for).
        # Poison rows go to the error queue whether expired or not: NServiceBus dead-letters a row
        # whose headers it cannot read before it looks at Expires (MessageRow.TryParse, then
        # ProcessWithNativeTransaction's IsPoison); only readable expired rows are dropped
        # (-infinity and years BC among them). Of the rest, a row no reader could take (`odd`: no
        # id, or an Expires after LATEST_TIME that Python and Spark cannot hold) goes to the
        # error queue with failure headers naming the column; NServiceBus itself would fail its
        # receive on a NULL id at every attempt. An Expires of infinity never expires: claimed as
        # NULL. NULL headers are no headers, claimed as ''. The headers of a row that is claimed
        # are not judged here (`poison_at_claim`): a poison one among them is never delivered and
        # goes raw to the error queue with its batch's acknowledgement.
        # The INSERTs read id/headers/body straight from the queue rows that `gone` deletes in
        # the same statement (all parts see the rows as they were when it began), joined in
        # seq order, so bodies are never copied into CTE storage nor sorted.
        sql = f"""
WITH picked AS MATERIALIZED (
    SELECT seq, poison, expired,
           CASE WHEN poison OR expired THEN NULL WHEN id IS NULL THEN 'id' WHEN far THEN 'expires' END AS odd,
           forward
    FROM (
        SELECT seq, id,
               (expires IS NOT NULL AND expires <= {UTC_NOW}) AS expired,
               (expires > TIMESTAMP '{LATEST_TIME}' AND isfinite(expires)) AS far,
               -- headers are judged here only for rows not claimed (expired, odd): poison wins
               -- over both, as in NServiceBus; claimed rows are judged by the acknowledgement
               CASE WHEN (expires IS NOT NULL AND expires <= {UTC_NOW}) OR id IS NULL
                         OR (expires > TIMESTAMP '{LATEST_TIME}' AND isfinite(expires))
                    THEN {self._poison("headers")} ELSE false END AS poison,
               (strpos(headers, %(forward_name)s) > 0) AS forward
        FROM {q} WHERE {cond} ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ) AS r
), gone AS (
    DELETE FROM {q} WHERE seq IN (SELECT seq FROM picked) RETURNING seq
{self._to_error(q, e)}), claimed AS (
    INSERT INTO {c} (consumer, id, expires, headers, body, source_seq)
    SELECT %(consumer)s, m.id, NULLIF(m.expires, TIMESTAMP 'infinity'), COALESCE(m.headers, ''), m.body, m.seq
    FROM (SELECT seq FROM picked WHERE NOT poison AND NOT expired AND odd IS NULL ORDER BY seq) AS p
    JOIN {q} AS m ON m.seq = p.seq
    ORDER BY p.seq
    RETURNING claim_seq
)
SELECT (SELECT count(*) FROM gone) AS deleted,
       (SELECT count(*) FROM picked WHERE expired AND NOT poison) AS expired,
       (SELECT count(*) FROM to_error) AS poison,
       (SELECT count(*) FROM claimed) AS claimed,
       (SELECT max(claim_seq) FROM claimed) AS max_claim,
       (SELECT max(seq) FROM picked) AS max_source,
       (SELECT min(claim_seq) FROM claimed) AS min_claim,
       (SELECT count(*) FROM picked WHERE forward AND NOT poison AND NOT expired AND odd IS NULL) AS forward,
       (SELECT count(*) FROM picked WHERE odd = 'id') AS null_id,
       (SELECT count(*) FROM picked WHERE odd = 'expires') AS far_expires"""
        return [*BY_INDEX, Statement(sql.strip(), params)]

    def pick(self, queue: QueueAddress, *, after: int, upto: int | None, limit: int) -> list[Statement]:
        cond, params = self._range(after, upto)
        return [*BY_INDEX, Statement(
            f"SELECT seq, {_JUDGED} FROM {self.qualified(queue)} WHERE {cond}"
            " ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED", {**params, "limit": int(limit)})]

    def take(self, queue: QueueAddress, *, after: int, upto: int | None, limit: int) -> list[Statement]:
        cond, params = self._range(after, upto)
        q = self.qualified(queue)
        # `picked` runs once (MATERIALIZED: a re-evaluated LIMIT ... SKIP LOCKED can return more
        # rows than asked for); the DELETE walks the seq index between the picked rows' bounds
        # instead of probing it once per row
        return [*BY_INDEX, Statement(
            f"WITH picked AS MATERIALIZED (SELECT seq FROM {q} WHERE {cond}"
            " ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED),"
            " bounds AS MATERIALIZED (SELECT min(seq) AS lo, max(seq) AS hi FROM picked)"
            f" DELETE FROM {q} WHERE seq >= (SELECT lo FROM bounds) AND seq <= (SELECT hi FROM bounds)"
            " AND seq IN (SELECT seq FROM picked)"
            f" RETURNING seq, {_JUDGED}", {**params, "limit": int(limit)})]

    def claim_numbers(self, *, first: int, clock_base: int | None) -> Statement:
        return Statement(f"SELECT {_FIRST_NUMBER}, {_CLAIMED_AT}, {_XID}",
                         {"first": int(first), "clock_base": clock_base, "per_us": NUMBERS_PER_MICROSECOND})

    def _numbered_claim(self, q: str, c: str, e: str, params: dict[str, Any],
                        numbering: ClaimNumbering) -> list[Statement]:
        """The claim with numbers of ours (`ClaimNumbering`) of the rows `pick` locked in this
        transaction (`numbering.picked`): a row's claim number is ``first + (seq - the lowest seq
        picked)``, so a claim held by a prepared transaction maps its rows to numbers without
        writing them anywhere. The driver judged every row's headers (`PickedRows`): the poison go
        to the error queue in this transaction (a prepared claim's acknowledgement is its COMMIT
        PREPARED, which can add nothing). The claimable rows go into the claim table, with their
        numbers, when `numbering.prepared` is false or any of them is special (a ForwardDestination
        or a ServiceControl retry acknowledgement header: the work the claim table's machinery does
        at the claim and the acknowledgement); `tabled` says how many. A part with nothing to write
        is left out of the statement, so a prepared claim of plain messages names no table but the
        queue: its transaction holds no lock on the claim table or the error queue while prepared
        (DDL on those never waits for it)."""
        picked = numbering.picked
        tabled = not numbering.prepared or picked.special
        params = {**params, "first": int(numbering.first), "clock_base": numbering.clock_base,
                  "per_us": NUMBERS_PER_MICROSECOND, "seqs": picked.seqs, "lo": picked.seqs[0],
                  "hi": picked.seqs[-1], "poison": picked.poison, "forward": picked.forward}
        errors = self._to_error(q, e, poison=bool(picked.poison), odd=picked.odd)
        claimed = (f""", claimed AS (
    INSERT INTO {c} (claim_seq, consumer, id, expires, headers, body, source_seq) OVERRIDING SYSTEM VALUE
    SELECT (SELECT n FROM base) + (m.seq - (SELECT seq FROM low)), %(consumer)s, m.id, NULLIF(m.expires, TIMESTAMP 'infinity'),
           COALESCE(m.headers, ''), m.body, m.seq
    FROM (SELECT seq FROM picked WHERE NOT poison AND NOT expired AND odd IS NULL ORDER BY seq) AS p
    JOIN {q} AS m ON m.seq = p.seq
    ORDER BY p.seq
    RETURNING claim_seq
)""" if tabled else "")
        sql = f"""
WITH picked AS MATERIALIZED (
    SELECT seq, poison, expired,
           CASE WHEN poison OR expired THEN NULL WHEN id IS NULL THEN 'id' WHEN far THEN 'expires' END AS odd,
           forward
    FROM (
        SELECT seq, id,
               (expires IS NOT NULL AND expires <= {UTC_NOW}) AS expired,
               (expires > TIMESTAMP '{LATEST_TIME}' AND isfinite(expires)) AS far,
               seq = ANY(%(poison)s::bigint[]) AS poison,
               seq = ANY(%(forward)s::bigint[]) AS forward
        FROM {q} WHERE seq >= %(lo)s AND seq <= %(hi)s AND seq = ANY(%(seqs)s::bigint[])
    ) AS r
), low AS MATERIALIZED (
    SELECT min(seq) AS seq FROM picked
), base AS MATERIALIZED (
    -- the first number: the one asked for, or above the server's clock on a run's first claim
    SELECT {_FIRST_NUMBER} AS n
), gone AS (
    DELETE FROM {q} WHERE seq IN (SELECT seq FROM picked) RETURNING seq
{errors}){claimed}
SELECT (SELECT count(*) FROM gone) AS deleted,
       (SELECT count(*) FROM picked WHERE expired AND NOT poison) AS expired,
       {"(SELECT count(*) FROM to_error)" if picked.poison else "0"} AS poison,
       (SELECT count(*) FROM picked WHERE NOT poison AND NOT expired AND odd IS NULL) AS claimed,
       (SELECT n FROM base) + (SELECT max(seq) FROM picked) - (SELECT seq FROM low) AS max_claim,
       (SELECT max(seq) FROM picked) AS max_source,
       (SELECT n FROM base) AS min_claim,
       {"(SELECT count(*) FROM picked WHERE forward AND NOT poison AND NOT expired AND odd IS NULL)" if tabled else "0"}
         AS forward,
       (SELECT count(*) FROM picked WHERE odd = 'id') AS null_id,
       (SELECT count(*) FROM picked WHERE odd = 'expires') AS far_expires,
       {"(SELECT count(*) FROM claimed)" if tabled else "0"} AS tabled,
       (SELECT seq FROM low) AS low_source,
       {_CLAIMED_AT} AS claimed_at,
       {_XID} AS xid"""
        return [*BY_INDEX, Statement(sql.strip(), params)]

    def _to_error(self, q: str, e: str, *, poison: bool = True, odd: bool = True) -> str:
        """The claim's CTEs (each after a closing parenthesis) that move its `picked` rows to the
        error queue: poison ones raw (`to_error`), odd ones with failure headers (`to_dead`); a
        numbered claim leaves out those it knows have no row."""
        return (f"""), to_error AS (
    INSERT INTO {e} (id, expires, headers, body)
    -- same id, as NServiceBus does; a new one if there is none, or if the error queue holds that
    -- id already (its primary key would otherwise fail every claim and stall the stream)
    SELECT {self._error_id(e)}, NULL, m.headers, m.body
    FROM (SELECT seq FROM picked WHERE poison ORDER BY seq) AS p JOIN {q} AS m ON m.seq = p.seq
    ORDER BY p.seq
    RETURNING 1
""" if poison else "") + (f"""), to_dead AS (
    INSERT INTO {e} (id, expires, headers, body)
    SELECT {self._error_id(e)}, NULL, {self._with_failure("m.headers", "p.odd", "m.expires")}, m.body
    FROM (SELECT seq, odd FROM picked WHERE odd IS NOT NULL ORDER BY seq) AS p JOIN {q} AS m ON m.seq = p.seq
    ORDER BY p.seq
    RETURNING 1
""" if odd else "")

    @staticmethod
    def _error_id(e: str) -> str:
        return f"CASE WHEN m.id IS NULL OR EXISTS (SELECT 1 FROM {e} AS x WHERE x.id = m.id) THEN gen_random_uuid() ELSE m.id END"

    @staticmethod
    def _with_failure(headers: str, reason: str, expires: str) -> str:
        """A row's headers (NULL or '': none) with the failure headers of `reason` merged in, as
        text. Merged as jsonb (a key the row has already is replaced): the claim found the text a
        flat JSON object of strings. jsonb refuses the escape \\u0000 (a NUL, which NServiceBus
        writes and reads back), so each is marked first with a text no header holds (a random
        %(nul_mark)s after \\u0001) and put back after: no header is lost or changed. The retry
        counters go, as NServiceBus's MoveToError removes them (`wire.RETRY_COUNTERS`)."""
        nul, marked = "chr(92) || 'u0000'", "chr(92) || 'u0001' || %(nul_mark)s"
        failure = (f"CASE WHEN {reason} = 'id' THEN %(fail_id)s"
                   f" ELSE replace(%(fail_expires)s, %(slot)s, {expires}::text) END::jsonb")
        own = f"CASE WHEN COALESCE({headers}, '') = '' THEN '{{}}' ELSE replace({headers}, {nul}, {marked}) END::jsonb"
        drop = "".join(f" - '{name}'" for name in RETRY_COUNTERS)  # constants of ours: letters and dots
        return f"replace(({own}{drop} || {failure})::text, {marked}, {nul})"

    def forward_candidates(self, claims: QueueAddress, consumer: str, *, lo: int, hi: int) -> Statement:
        return Statement(
            f"SELECT claim_seq, headers FROM {self.qualified(claims)} WHERE consumer = %(consumer)s"
            f" AND claim_seq >= %(lo)s AND claim_seq <= %(hi)s AND strpos(headers, %(forward_name)s) > 0 ORDER BY claim_seq",
            {"consumer": consumer, "lo": int(lo), "hi": int(hi), "forward_name": FORWARD_NAME},
        )

    def claims_with_header(self, claims: QueueAddress, consumer: str, *, upto: int, header: str,
                           limit: int) -> Statement:
        return Statement(
            f"SELECT claim_seq, headers FROM {self.qualified(claims)} WHERE consumer = %(consumer)s"
            " AND claim_seq <= %(upto)s AND strpos(headers, %(header)s) > 0"
            " ORDER BY claim_seq LIMIT %(limit)s FOR UPDATE",
            {"consumer": consumer, "upto": int(upto), "header": header, "limit": int(limit)},
        )

    def ack_rows(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int, after: int = 0) -> Statement:
        return Statement(
            f"SELECT claim_seq, headers, claimed_at FROM {self.qualified(claims)}"
            " WHERE consumer = %(consumer)s AND claim_seq > %(after)s AND claim_seq <= %(upto)s"
            " ORDER BY claim_seq LIMIT %(batch)s FOR UPDATE",
            {"consumer": consumer, "after": int(after), "upto": int(upto), "batch": int(batch)},
        )

    def forward_claims(
        self, claims: QueueAddress, consumer: str, destination: QueueAddress, *, keys: list[int],
        headers: list[str] | None, ttbr_ms: int | None = None,
    ) -> Statement:
        return copies(self.qualified(destination),
                      f"JOIN {self.qualified(claims)} AS c ON c.consumer = %(consumer)s AND c.claim_seq = v.seq", "c",
                      {"consumer": consumer, "keys": [int(k) for k in keys]}, headers=headers, ttbr_ms=ttbr_ms)

    def control_messages(self, destination: QueueAddress, *, headers: list[str]) -> Statement:
        return Statement(
            f"INSERT INTO {self.qualified(destination)} (id, expires, headers, body)"
            " SELECT gen_random_uuid(), NULL, v.headers, ''::bytea"
            " FROM unnest(%(headers)s::text[]) WITH ORDINALITY AS v(headers, n) ORDER BY v.n",
            {"headers": list(headers)},
        )

    def set_claim_headers(self, claims: QueueAddress, consumer: str, *, keys: list[int], headers: list[str]) -> Statement:
        return Statement(
            f"UPDATE {self.qualified(claims)} AS c SET headers = v.headers"
            " FROM unnest(%(keys)s::bigint[], %(headers)s::text[]) AS v(seq, headers)"
            " WHERE c.consumer = %(consumer)s AND c.claim_seq = v.seq",
            {"consumer": consumer, "keys": [int(k) for k in keys], "headers": list(headers)},
        )

    def drop_claims(self, claims: QueueAddress, consumer: str, *, keys: list[int]) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(claims)} WHERE consumer = %(consumer)s AND claim_seq = ANY(%(keys)s::bigint[])",
            {"consumer": consumer, "keys": [int(k) for k in keys]},
        )

    def backlog(self, queue: QueueAddress, *, above: int = 0) -> Statement:
        q = self.qualified(queue)
        # The span of unlocked sequences: rows other consumers hold are not counted. Both ends are
        # looked for above the rows this stream's prepared claims hold: SKIP LOCKED steps over a
        # held row one by one, and they stand in the queue until committed (the current batch's
        # claim and the one made ahead, at the head and, near the end of a backlog, at the top:
        # every estimate walked 100,000 rows of two claims of 50,000, 0.14 s of the server's time).
        return Statement(
            f"SELECT COALESCE((SELECT seq FROM {q} WHERE seq > %(above)s ORDER BY seq DESC LIMIT 1 FOR UPDATE SKIP LOCKED)"
            f" - (SELECT seq FROM {q} WHERE seq > %(above)s ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED) + 1, 0)",
            {"above": int(above)},
        )

    def tables_exist(self, tables: Sequence[QueueAddress]) -> Statement:
        return Statement(
            "SELECT t.i - 1, EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass(t.name)"
            " AND c.relkind IN ('r', 'p'))::int"
            " FROM pg_catalog.unnest(%(names)s::text[]) WITH ORDINALITY AS t(name, i)",
            {"names": [self.qualified(t) for t in tables]},
        )

    def backlogs(self, queues: Sequence[QueueAddress]) -> Statement:
        # Each queue's two ends by its seq index (two index probes; a plain MVCC read, so it
        # neither locks the rows other consumers skip nor writes), one UNION ALL branch a queue.
        branches = []
        for i, queue in enumerate(queues):
            q = self.qualified(queue)
            branches.append(f"SELECT {int(i)}, COALESCE((SELECT seq FROM {q} ORDER BY seq DESC LIMIT 1)"
                            f" - (SELECT seq FROM {q} ORDER BY seq LIMIT 1) + 1, 0)")
        return Statement(" UNION ALL ".join(branches))

    def sequences_of(self, queues: Sequence[QueueAddress]) -> Statement:
        # The sequence that owns the table's seq column: a serial's ('a') or an identity's ('i')
        # dependency, as pg_get_serial_sequence finds it (which fails on a table without seq).
        return Statement(
            "SELECT t.i - 1, s.oid::bigint, a.attrelid::bigint"
            " FROM pg_catalog.unnest(%(names)s::text[]) WITH ORDINALITY AS t(name, i)"
            " JOIN pg_catalog.pg_attribute a ON a.attrelid = pg_catalog.to_regclass(t.name) AND a.attname = 'seq'"
            " AND NOT a.attisdropped"
            " JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass"
            " AND d.refobjid = a.attrelid AND d.refobjsubid = a.attnum"
            " AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype IN ('a', 'i')"
            " JOIN pg_catalog.pg_class s ON s.oid = d.objid AND s.relkind = 'S'",
            {"names": [self.qualified(q) for q in queues]},
        )

    def sequence_values(self, sequences: Sequence[int]) -> Statement:
        # pg_sequence_last_value reads the sequence's page as it is now, not as of a snapshot: a
        # nextval shows at once, committed or not. NULL until the first nextval (0 here). Without
        # SELECT or USAGE it fails before PostgreSQL 17 (NULL since): such a sequence gives no row.
        return Statement(
            "SELECT t.i - 1, COALESCE(pg_catalog.pg_sequence_last_value(s.seqrelid::pg_catalog.regclass), 0)"
            " FROM pg_catalog.unnest(%(oids)s::oid[]) WITH ORDINALITY AS t(oid, i)"
            " JOIN pg_catalog.pg_sequence s ON s.seqrelid = t.oid AND s.seqcache = 1"
            " WHERE pg_catalog.has_sequence_privilege(t.oid, 'SELECT, USAGE')",
            {"oids": [int(o) for o in sequences]},
        )

    def tables_written(self, tables: Sequence[int]) -> Statement:
        # pg_locks lists fast-path locks and prepared transactions' too; a plain read holds
        # AccessShareLock, any writer more (an INSERT RowExclusiveLock, from before its nextval).
        # IN, not a join: the planner cannot count pg_locks' rows and joins it by a nested loop,
        # which the locks of the sequences read just before (400, our own) made 9 ms at 400 queues.
        return Statement(
            "SELECT t.i - 1 FROM pg_catalog.unnest(%(oids)s::oid[]) WITH ORDINALITY AS t(oid, i)"
            " WHERE t.oid IN (SELECT l.relation FROM pg_catalog.pg_locks l WHERE l.locktype = 'relation'"
            " AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())"
            " AND l.mode <> 'AccessShareLock')",
            {"oids": [int(o) for o in tables]},
        )

    def max_claim(self, claims: QueueAddress, consumer: str) -> Statement:
        c = self.qualified(claims)
        return Statement(
            f"SELECT (SELECT claim_seq FROM {c} WHERE consumer = %(consumer)s ORDER BY claim_seq DESC LIMIT 1),"
            f" (SELECT claim_seq FROM {c} WHERE consumer = %(consumer)s ORDER BY claim_seq LIMIT 1)",
            {"consumer": consumer},
        )

    def max_claims(self, pairs: Sequence[tuple[QueueAddress, str]]) -> Statement:
        # `max_claim`'s two index probes a pair, one UNION ALL branch a pair
        branches, params = [], {}
        for i, (claims, consumer) in enumerate(pairs):
            c, name = self.qualified(claims), f"consumer{int(i)}"
            branches.append(f"SELECT {int(i)}, (SELECT claim_seq FROM {c} WHERE consumer = %({name})s ORDER BY claim_seq"
                            f" DESC LIMIT 1), (SELECT claim_seq FROM {c} WHERE consumer = %({name})s ORDER BY claim_seq LIMIT 1)")
            params[name] = consumer
        return Statement(" UNION ALL ".join(branches), params)

    def nth_claim(self, claims: QueueAddress, consumer: str, *, after: int, n: int) -> Statement:
        return Statement(
            f"SELECT claim_seq FROM {self.qualified(claims)} WHERE consumer = %(consumer)s AND claim_seq > %(after)s"
            " ORDER BY claim_seq OFFSET %(skip)s LIMIT 1",
            {"consumer": consumer, "after": int(after), "skip": max(int(n) - 1, 0)},
        )

    def read_claims(self, claims: QueueAddress, consumer: str, *, after: int, upto: int,
                    limit: int | None = None) -> Statement:
        # Claims made by older versions may hold an Expires of infinity (never expires): psycopg
        # cannot load it nor anything after year 9999 or before year 1, so those are mapped.
        expires = (f"CASE WHEN expires > TIMESTAMP '{LATEST_TIME}' THEN NULL"
                   " WHEN expires < TIMESTAMP '0001-01-01' THEN TIMESTAMP '0001-01-01' ELSE expires END")
        return Statement(
            f"SELECT claim_seq, id::text, {expires}, headers, body, source_seq, claimed_at"
            f" FROM {self.qualified(claims)}"
            " WHERE consumer = %(consumer)s AND claim_seq > %(after)s AND claim_seq <= %(upto)s"
            f" ORDER BY claim_seq{page(limit)}",
            {"consumer": consumer, "after": after, "upto": upto, "limit": limit},
        )

    def ack_headers(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int, after: int = 0) -> Statement:
        return Statement(
            f"SELECT claim_seq, headers FROM {self.qualified(claims)}"
            " WHERE consumer = %(consumer)s AND claim_seq > %(after)s AND claim_seq <= %(upto)s"
            " ORDER BY claim_seq LIMIT %(batch)s",
            {"consumer": consumer, "after": int(after), "upto": int(upto), "batch": int(batch)},
        )

    def drop_claim_range(self, claims: QueueAddress, consumer: str, *, lo: int, hi: int) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(claims)} WHERE consumer = %(consumer)s"
            " AND claim_seq >= %(lo)s AND claim_seq <= %(hi)s",
            {"consumer": consumer, "lo": int(lo), "hi": int(hi)},
        )

    def dead_letter_claims(self, claims: QueueAddress, consumer: str, error: QueueAddress, *,
                           keys: list[int]) -> Statement:
        e = self.qualified(error)
        # `again`: a second claim with the id in this statement (its EXISTS cannot see the first)
        return Statement(
            f"INSERT INTO {e} (id, expires, headers, body)"
            " SELECT CASE WHEN m.id IS NULL OR m.again OR EXISTS (SELECT 1 FROM"
            f" {e} AS x WHERE x.id = m.id) THEN gen_random_uuid() ELSE m.id END, NULL, m.headers, m.body"
            " FROM (SELECT c.id, c.headers, c.body, v.n,"
            " row_number() OVER (PARTITION BY c.id ORDER BY v.n) > 1 AS again"
            " FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS v(seq, n)"
            f" JOIN {self.qualified(claims)} AS c ON c.consumer = %(consumer)s AND c.claim_seq = v.seq) AS m"
            " ORDER BY m.n",
            {"consumer": consumer, "keys": [int(k) for k in keys]},
        )

    def ack_claims(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int) -> Statement:
        c = self.qualified(claims)
        return Statement(
            f"DELETE FROM {c} WHERE {ROWS_OF}("
            f"SELECT ctid FROM {c} WHERE consumer = %(consumer)s AND claim_seq <= %(upto)s"
            " ORDER BY claim_seq LIMIT %(batch)s))",
            {"consumer": consumer, "upto": upto, "batch": int(batch)},
        )

    def max_source_seq(self, queue: QueueAddress) -> Statement:
        return Statement(f"SELECT max(seq) FROM {self.qualified(queue)}")

    def vacuum_due(self, table: QueueAddress, *, every_seconds: float, min_rows: int) -> Statement | None:
        # Claim and staging tables see every message inserted and deleted once; autovacuum
        # wakes once a minute by default, so between its runs they would grow by a minute of traffic.
        # VACUUM needs ownership (pg_has_role USAGE: the owner, a member inheriting it, or a
        # superuser) or, from PostgreSQL 17, the MAINTAIN privilege (granted, or through
        # pg_maintain); it skips other tables with a warning. The CASE keeps 'MAINTAIN' from being
        # parsed on older servers, which do not know it.
        return Statement(
            "SELECT s.n_dead_tup >= %(rows)s AND coalesce(greatest(s.last_vacuum, s.last_autovacuum), '-infinity')"
            " < pg_catalog.now() - %(every)s * interval '1 second',"
            " pg_catalog.pg_has_role(c.relowner, 'USAGE')"
            " OR CASE WHEN pg_catalog.current_setting('server_version_num')::int >= 170000"
            " THEN pg_catalog.has_table_privilege(c.oid, 'MAINTAIN') ELSE false END"
            " FROM pg_catalog.pg_stat_user_tables s JOIN pg_catalog.pg_class c ON c.oid = s.relid"
            " WHERE s.relid = pg_catalog.to_regclass(%(table)s)",
            {"rows": int(min_rows), "every": float(every_seconds), "table": self.qualified(table)},
        )

    def vacuum(self, table: QueueAddress) -> Statement | None:
        # SKIP_LOCKED: another driver vacuuming the same table already does the work
        return Statement(f"VACUUM (SKIP_LOCKED) {self.qualified(table)}")
