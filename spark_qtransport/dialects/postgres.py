"""PostgreSQL: every SQL statement and identifier rule of the NServiceBus PostgreSQL transport tables.

Queue tables (NServiceBus ``CreateQueueText``): ``id uuid PRIMARY KEY, expires timestamp (UTC wall
clock), headers text, body bytea, seq serial UNIQUE``. Tables we create use a 64-bit sequence;
tables NServiceBus created (int4 ``seq``) work unchanged. Columns are always named explicitly, so an
added ``BodyString`` column does not matter.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..connections import mask
from ..errors import ConfigError
from .base import STAGED_COLUMNS, Dialect, QueueAddress, Statement, check_name, check_privileges, one_line

__all__ = ["PostgresDialect"]

_UTC_NOW = "(now() AT TIME ZONE 'UTC')"

# -- errors: one classification, behind `PostgresDialect.is_transient` ------------------------
#
# A server error carries its SQLSTATE: transient are those below and class 08 (connection
# exception); everything else (28P01/28000 authentication, 3D000 no database, 42501 permission,
# 42P01/42703 undefined table/column, 23514 check violation, 42602/3F000/42704 bad names...)
# is permanent and fails at once. Errors raised while connecting, and by libpq or psycopg
# themselves, have no SQLSTATE (psycopg 3 leaves it None): they are judged by libpq's message,
# permanent fragments first, and are permanent unless a fragment says the connection was lost,
# refused or timed out, or the server is starting, stopping or full.
_TRANSIENT_STATES = frozenset({
    "40001",  # serialization failure
    "40P01",  # deadlock detected
    "55P03",  # lock not available (lock_timeout)
    "53300",  # too many connections
    "57P01",  # terminating connection due to administrator command
    "57P02",  # crash shutdown
    "57P03",  # cannot connect now (starting up, shutting down)
    "57P05",  # terminating connection due to idle-session timeout
})
_PERMANENT_MESSAGES = (
    "password authentication failed",  # 28P01
    "authentication failed",  # 28000 (ident, peer, ldap...)
    "no password supplied",
    "no pg_hba.conf entry",  # 28000
    "is not permitted to log in",  # 28000
    "does not exist",  # 3D000 database, 28000 role
    "permission denied",  # 42501
    "could not translate host name",  # unknown host (libpq)
    "name or service not known",  # unknown host (getaddrinfo, glibc)
    "nodename nor servname",  # unknown host (getaddrinfo, BSD / macOS)
    "no address associated with hostname",
    "failed to resolve host",  # psycopg's own resolver, whatever the reason
    "invalid connection option",
    "invalid dsn",
    "certificate",  # TLS verification failed
)
_TRANSIENT_MESSAGES = (
    "connection refused",
    "server closed the connection unexpectedly",
    "terminating connection",
    "timeout expired",  # libpq connect_timeout, psycopg's "connection timeout expired"
    "connection timed out",
    "connection reset",
    "broken pipe",
    "could not receive data from server",
    "could not send data to server",
    "ssl syscall error",
    "ssl connection has been closed unexpectedly",
    "no connection to the server",
    "the connection is closed",
    "the connection is lost",
    "connection is bad",
    "consuming input failed",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "sorry, too many clients already",  # 53300
    "too many connections",  # 53300 (per role, per database)
    "remaining connection slots are reserved",  # 53300
    "network is unreachable",
    "no route to host",
    "temporary failure in name resolution",  # the resolver, not the name, failed
)


def _is_psycopg_error(exc: BaseException) -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the postgres extra is not installed
        return False
    return isinstance(exc, psycopg.Error)


def _classify(exc: BaseException) -> str:
    """``"transient"`` (worth a retry on a new connection) or ``"permanent"`` (fail at once)."""
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        sqlstate = sqlstate.upper()
        return "transient" if sqlstate in _TRANSIENT_STATES or sqlstate.startswith("08") else "permanent"
    if not _is_psycopg_error(exc):
        return "permanent"
    text = str(exc).lower()
    if any(m in text for m in _PERMANENT_MESSAGES):
        return "permanent"
    if any(m in text for m in _TRANSIENT_MESSAGES):
        return "transient"
    return "permanent"


#: a claimed row that may carry NServiceBus.SqlServer.ForwardDestination (checked exactly in Python)
FORWARD_LIKE = "%NServiceBus.SqlServer.ForwardDestination%"

_POISON_PATH = "'strict $.* ? (@.type() != \"string\" && @.type() != \"null\")'"


def _is_poison(col: str) -> str:
    # Poison unless the text is a flat JSON object whose values are strings or null. The text is
    # parsed once (OFFSET 0 keeps the planner from copying the cast into each test); the cast only
    # runs on valid JSON and the silent jsonpath never raises, so no evaluation order matters.
    return (
        "(SELECT j IS NULL OR jsonb_typeof(j) <> 'object'"
        f" OR jsonb_path_exists(j, {_POISON_PATH}, '{{}}', true)"
        f" FROM (SELECT CASE WHEN pg_input_is_valid({col}, 'jsonb') THEN {col}::jsonb END AS j OFFSET 0) AS parsed)"
    )


#: PostgreSQL 13 to 15 have no pg_input_is_valid: a PL/pgSQL helper catches the cast's error
#: instead (one subtransaction per message, so slower). Created beside the claim table.
HELPER_FUNCTION = "sqlqueue_poison_headers"
MIN_VERSION = 130000  # gen_random_uuid (jsonb_path_exists: 12)
FAST_VERSION = 160000  # pg_input_is_valid


def _literal(value: Any) -> str:
    # For scripts people read and run; the connector itself always binds parameters.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


#: Bounded deletes pick their rows once, by physical address, then delete exactly those
#: (`DELETE ... WHERE ctid = ANY(ARRAY(SELECT ctid ... LIMIT n))`): the array is computed once,
#: before the scan, whatever the statistics say. The common `WHERE key IN (SELECT key ... LIMIT n)`
#: is planned as a semi join, and on a table whose statistics say "one row" (last vacuumed empty)
#: as a nested loop that runs the LIMIT query again for every row: 290 s to acknowledge 10,000
#: claims. The delete is then a TID scan. Rows here are only inserted and deleted, never updated,
#: and a tuple our snapshot sees cannot be vacuumed away, so each ctid still names the row picked.
_ROWS_OF = "ctid = ANY(ARRAY"

class PostgresDialect(Dialect):
    name = "postgres"
    default_schema = "public"
    max_table_bytes = 63
    system_schemas = frozenset({"pg_catalog", "information_schema", "pg_toast"})

    def is_system_schema(self, schema: str) -> bool:
        # pg_temp_N, pg_toast_temp_N and any future pg_ schema are the server's (names starting
        # with pg_ are reserved: CREATE SCHEMA refuses them)
        return super().is_system_schema(schema) or schema.lower().startswith("pg_")

    # -- addresses ----------------------------------------------------------------------------

    def quote(self, name: str) -> str:
        check_name("table", name, max_bytes=self.max_table_bytes)
        return '"' + name.replace('"', '""') + '"'

    @staticmethod
    def _unquote(part: str) -> str:
        if len(part) >= 2 and part.startswith('"') and part.endswith('"'):
            return part[1:-1].replace('""', '"')
        return part

    def parse_address(self, text: str, *, option: str = "queue") -> QueueAddress:
        """``table``, ``schema.table``, ``"schema"."table"``: split at the first unquoted dot."""
        if text is None or not str(text).strip():
            raise ConfigError(f"option '{option}' is empty: give a queue name such as 'Sales'")
        text = str(text).strip()
        quotes = 0
        schema: str | None = None
        table = text
        for i, ch in enumerate(text):
            if ch == '"':
                quotes += 1
            elif ch == "." and quotes % 2 == 0:
                schema, table = self._unquote(text[:i]), self._unquote(text[i + 1 :])
                break
        else:
            table = self._unquote(text)
        try:
            check_name("table", table, max_bytes=self.max_table_bytes)
            if schema is not None:
                check_name("schema", schema, max_bytes=63)
        except ConfigError as exc:
            raise ConfigError(f"option '{option}': invalid queue address {text!r}: {exc}") from None
        return QueueAddress(table, schema or None)

    def schema_and_tables(self, schema: str, tables: list[str]) -> Statement | None:
        return Statement(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s),"
            " ARRAY(SELECT c.relname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %(default)s AND c.relname = ANY(%(names)s)"
            " ORDER BY length(c.relname), c.relname)",
            {"schema": schema, "default": self.default_schema, "names": list(tables)},
        )

    def format_address(self, address: QueueAddress) -> str:
        schema = address.schema or self.default_schema
        return f"{self.quote(schema)}.{self.quote(address.table)}"

    # -- installers ---------------------------------------------------------------------------

    def _ddl_lock(self, table: QueueAddress) -> Statement:
        # CREATE TABLE IF NOT EXISTS races with itself (both see "absent", one fails on pg_type);
        # a transaction-scoped advisory lock on the name serialises concurrent installers.
        return Statement(
            "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(%(key)s, 0))",
            {"key": f"sqlqueue ddl {self.qualified(table)}"},
        )

    def create_queue(self, queue: QueueAddress, *, seq_bits: int = 64) -> list[Statement]:
        seq_type = {32: "serial", 64: "bigserial"}.get(seq_bits)
        if seq_type is None:
            raise ConfigError(f"seq_bits must be 32 or 64, not {seq_bits!r}")
        t = self.qualified(queue)
        stmts = [
            self._ddl_lock(queue),
            Statement(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "    id uuid NOT NULL PRIMARY KEY,\n"
                "    expires timestamp,\n"
                "    headers text NOT NULL,\n"
                "    body bytea,\n"
                f"    seq {seq_type} NOT NULL UNIQUE\n"
                ")"
            ),
        ]
        if queue.schema:
            stmts.insert(1, Statement(f"CREATE SCHEMA IF NOT EXISTS {self.quote(queue.schema)}"))
        return stmts

    def create_claims(self, claims: QueueAddress) -> list[Statement]:
        t = self.qualified(claims)
        return [
            self._ddl_lock(claims),
            Statement(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "    consumer text NOT NULL,\n"
                "    claim_seq bigint GENERATED ALWAYS AS IDENTITY,\n"
                "    id uuid NOT NULL,\n"
                "    expires timestamp,\n"
                "    headers text NOT NULL,\n"
                "    body bytea,\n"
                "    source_seq bigint NOT NULL,\n"
                "    claimed_at timestamptz NOT NULL DEFAULT now(),\n"
                "    PRIMARY KEY (consumer, claim_seq)\n"
                ")"
            )
        ]

    def script(self, statements: list[Statement]) -> str:
        out = []
        for stmt in statements:
            params = stmt.params or {}
            text = re.sub(r"%\((\w+)\)s", lambda m, p=params: _literal(p[m.group(1)]), stmt.sql)
            out.append(text.replace("%%", "%").strip() + ";\n")
        return "\n".join(out)

    # -- receive ------------------------------------------------------------------------------

    def _regclass(self, table: QueueAddress) -> tuple[str, dict[str, Any]]:
        return "to_regclass(%(rel)s)", {"rel": self.qualified(table)}

    def table_id(self, table: QueueAddress) -> Statement:
        expr, params = self._regclass(table)
        return Statement(f"SELECT {expr}::oid::text", params)

    #: set by adapt_to_server on PostgreSQL < 16: check headers with the PL/pgSQL helper there
    helper_schema: str | None = None
    #: use the helper even where pg_input_is_valid exists (tests of the PostgreSQL 13-15 path)
    force_helper = False

    def server_check(self) -> Statement:
        return Statement("SELECT current_setting('server_version_num')::int")

    def adapt_to_server(self, version: int, claims: QueueAddress) -> str | None:
        if version < MIN_VERSION:
            return f"PostgreSQL {version // 10000} is too old: spark-qtransport needs PostgreSQL 13 or newer"
        if version < FAST_VERSION or self.force_helper:
            self.helper_schema = claims.schema or self.default_schema
        return None

    def _poison(self, col: str) -> str:
        if self.helper_schema is None:
            return _is_poison(col)
        return f"{self.quote(self.helper_schema)}.{HELPER_FUNCTION}({col})"

    def create_helpers(self, claims: QueueAddress) -> list[Statement]:
        if self.helper_schema is None:
            return []
        schema = self.quote(self.helper_schema)
        return [
            self._ddl_lock(claims.with_table(HELPER_FUNCTION)),
            Statement(
                f"CREATE OR REPLACE FUNCTION {schema}.{HELPER_FUNCTION}(h text) RETURNS boolean\n"
                "LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$\n"
                "DECLARE j jsonb;\n"
                "BEGIN\n"
                "    BEGIN\n"
                "        j := h::jsonb;\n"
                "    EXCEPTION WHEN others THEN\n"
                "        RETURN true;  -- not JSON at all\n"
                "    END;\n"
                f"    RETURN jsonb_typeof(j) <> 'object' OR jsonb_path_exists(j, {_POISON_PATH}, '{{}}', true);\n"
                "END\n"
                "$fn$"
            ),
        ]

    def helpers_exist(self, claims: QueueAddress) -> Statement | None:
        if self.helper_schema is None:
            return None
        return Statement("SELECT pg_catalog.to_regprocedure(%(fn)s) IS NOT NULL",
                         {"fn": f"{self.quote(self.helper_schema)}.{HELPER_FUNCTION}(text)"})

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

    def _lock_key(self, claims: QueueAddress, consumer: str) -> tuple[str, dict[str, Any]]:
        # Keyed by the claim table's oid, not by its spelling: `Sales`, `public.Sales` and
        # `"public"."Sales"` are one table, so one lock. The oid is digits, so the text
        # "sqlqueue consumer <oid> <consumer>" cannot be read two ways.
        expr, params = self._regclass(claims)
        key = f"pg_catalog.hashtextextended('sqlqueue consumer ' || {expr}::oid::text || ' ' || %(consumer)s, 0)"
        return key, {**params, "consumer": consumer}

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
    ) -> list[Statement]:
        q, c, e = self.qualified(queue), self.qualified(claims), self.qualified(error)
        cond, params = self._range(after, upto)
        params = {**params, "limit": int(limit), "consumer": consumer, "forward_like": FORWARD_LIKE}
        # One statement, one transaction, same snapshot for every part. `picked` locks the oldest
        # unlocked rows and classifies them from their small columns; it is MATERIALIZED so it
        # runs once (a re-evaluated LIMIT ... SKIP LOCKED can return more rows than asked for).
        # The INSERTs read id/headers/body straight from the queue rows that `gone` deletes in
        # the same statement (all parts see the rows as they were when it began), joined in
        # seq order, so bodies are never copied into CTE storage nor sorted.
        sql = f"""
WITH picked AS MATERIALIZED (
    SELECT seq,
           (expires IS NOT NULL AND expires <= {_UTC_NOW}) AS expired,
           {self._poison("headers")} AS poison,
           (headers LIKE %(forward_like)s) AS forward
    FROM {q} WHERE {cond} ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {q} WHERE seq IN (SELECT seq FROM picked) RETURNING seq
), to_error AS (
    INSERT INTO {e} (id, expires, headers, body)
    -- same id, as NServiceBus does; a new one only if the error queue holds that id already
    -- (its primary key would otherwise fail every claim and stall the stream)
    SELECT CASE WHEN EXISTS (SELECT 1 FROM {e} AS x WHERE x.id = m.id) THEN gen_random_uuid() ELSE m.id END,
           NULL, m.headers, m.body
    FROM (SELECT seq FROM picked WHERE poison AND NOT expired ORDER BY seq) AS p JOIN {q} AS m ON m.seq = p.seq
    ORDER BY p.seq
    RETURNING 1
), claimed AS (
    INSERT INTO {c} (consumer, id, expires, headers, body, source_seq)
    SELECT %(consumer)s, m.id, m.expires, m.headers, m.body, m.seq
    FROM (SELECT seq FROM picked WHERE NOT poison AND NOT expired ORDER BY seq) AS p JOIN {q} AS m ON m.seq = p.seq
    ORDER BY p.seq
    RETURNING claim_seq
)
SELECT (SELECT count(*) FROM gone),
       (SELECT count(*) FROM picked WHERE expired),
       (SELECT count(*) FROM to_error),
       (SELECT count(*) FROM claimed),
       (SELECT max(claim_seq) FROM claimed),
       (SELECT max(seq) FROM picked),
       (SELECT min(claim_seq) FROM claimed),
       (SELECT count(*) FROM picked WHERE forward AND NOT poison AND NOT expired)"""
        # The queue's statistics lag its backlog (a queue last analyzed empty and now holding a
        # million rows is estimated at a few thousand): left alone, the planner may then read and
        # classify every row above `after` and sort them, seconds per claim. Without bitmap and
        # sequential scans it walks the seq index in order and stops at the limit. LOCAL: this
        # transaction only.
        return [Statement("SET LOCAL enable_seqscan = off"), Statement("SET LOCAL enable_bitmapscan = off"),
                Statement(sql.strip(), params)]

    def forward_candidates(self, claims: QueueAddress, consumer: str, *, lo: int, hi: int) -> Statement:
        return Statement(
            f"SELECT claim_seq, headers FROM {self.qualified(claims)} WHERE consumer = %(consumer)s"
            f" AND claim_seq >= %(lo)s AND claim_seq <= %(hi)s AND headers LIKE %(forward_like)s ORDER BY claim_seq",
            {"consumer": consumer, "lo": int(lo), "hi": int(hi), "forward_like": FORWARD_LIKE},
        )

    def forward_claims(
        self, claims: QueueAddress, consumer: str, destination: QueueAddress, *, keys: list[int],
        headers: list[str], recoverable: bool = False,
    ) -> Statement:
        d = self.qualified(destination)
        # Same native id, as NServiceBus forwards; a new one only where the destination holds that
        # id already (its primary key would otherwise fail every claim and stall the stream).
        sql = (
            f"INSERT INTO {d} (id, expires, headers, body)"
            f" SELECT CASE WHEN EXISTS (SELECT 1 FROM {d} AS x WHERE x.id = c.id) THEN gen_random_uuid() ELSE c.id END,"
            " NULL, v.headers, c.body"
            " FROM unnest(%(keys)s::bigint[], %(headers)s::text[]) WITH ORDINALITY AS v(seq, headers, n)"
            f" JOIN {self.qualified(claims)} AS c ON c.consumer = %(consumer)s AND c.claim_seq = v.seq ORDER BY v.n"
        )
        return Statement(sql, {"consumer": consumer, "keys": [int(k) for k in keys], "headers": list(headers)})

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

    def backlog(self, queue: QueueAddress) -> Statement:
        q = self.qualified(queue)
        # The span of unlocked sequences: rows other consumers hold are not counted.
        return Statement(
            f"SELECT COALESCE((SELECT seq FROM {q} ORDER BY seq DESC LIMIT 1 FOR UPDATE SKIP LOCKED)"
            f" - (SELECT seq FROM {q} ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED) + 1, 0)"
        )

    def max_claim(self, claims: QueueAddress, consumer: str) -> Statement:
        c = self.qualified(claims)
        return Statement(
            f"SELECT (SELECT claim_seq FROM {c} WHERE consumer = %(consumer)s ORDER BY claim_seq DESC LIMIT 1),"
            f" (SELECT claim_seq FROM {c} WHERE consumer = %(consumer)s ORDER BY claim_seq LIMIT 1)",
            {"consumer": consumer},
        )

    def nth_claim(self, claims: QueueAddress, consumer: str, *, after: int, n: int) -> Statement:
        return Statement(
            f"SELECT claim_seq FROM {self.qualified(claims)} WHERE consumer = %(consumer)s AND claim_seq > %(after)s"
            " ORDER BY claim_seq OFFSET %(skip)s LIMIT 1",
            {"consumer": consumer, "after": int(after), "skip": max(int(n) - 1, 0)},
        )

    def read_claims(self, claims: QueueAddress, consumer: str, *, after: int, upto: int) -> Statement:
        return Statement(
            "SELECT claim_seq, id::text, expires, headers, body, source_seq, claimed_at"
            f" FROM {self.qualified(claims)}"
            " WHERE consumer = %(consumer)s AND claim_seq > %(after)s AND claim_seq <= %(upto)s"
            " ORDER BY claim_seq",
            {"consumer": consumer, "after": after, "upto": upto},
        )

    def dispatch_plans(self) -> list[Statement]:
        # LOCAL: this transaction only. Joins of staged rows become hash or merge joins, linear
        # in the batch (a nested loop is still used where nothing else can run).
        return [Statement("SET LOCAL enable_nestloop = off")]

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

    def ack_claims(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int) -> Statement:
        c = self.qualified(claims)
        return Statement(
            f"DELETE FROM {c} WHERE {_ROWS_OF}("
            f"SELECT ctid FROM {c} WHERE consumer = %(consumer)s AND claim_seq <= %(upto)s"
            " ORDER BY claim_seq LIMIT %(batch)s))",
            {"consumer": consumer, "upto": upto, "batch": int(batch)},
        )

    def max_source_seq(self, queue: QueueAddress) -> Statement:
        return Statement(f"SELECT max(seq) FROM {self.qualified(queue)}")

    # -- operations ------------------------------------------------------------------------------

    def peek_messages(self, queue: QueueAddress, *, limit: int) -> Statement:
        # A plain SELECT: MVCC never waits for other sessions and takes no row lock.
        return Statement(
            f"SELECT id::text, expires, headers, body, seq FROM {self.qualified(queue)} ORDER BY seq LIMIT %(limit)s",
            {"limit": int(limit)},
        )

    def list_queues(self) -> Statement:
        return Statement(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%%'"
            " AND (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
            " AND lower(a.attname) IN ('id', 'headers', 'body', 'expires', 'seq')) = 5"
            " ORDER BY 1, 2"
        )

    def queue_stats(self, queue: QueueAddress) -> Statement:
        return Statement(
            f"SELECT count(*), count(*) FILTER (WHERE expires <= {_UTC_NOW}), min(seq), max(seq)"
            f" FROM {self.qualified(queue)}"
        )

    def delayed_stats(self, delayed: QueueAddress) -> Statement:
        return Statement(
            "SELECT count(*) FILTER (WHERE due <= now()), count(*) FILTER (WHERE due > now()),"
            f" min(due) FILTER (WHERE due > now()) FROM {self.qualified(delayed)}"
        )

    def claim_stats(self, claims: QueueAddress) -> Statement:
        return Statement(
            f"SELECT consumer, count(*), min(claimed_at) FROM {self.qualified(claims)} GROUP BY consumer ORDER BY consumer"
        )

    def count_rows(self, table: QueueAddress) -> Statement:
        return Statement(f"SELECT count(*) FROM {self.qualified(table)}")

    def purge_expired(self, queue: QueueAddress, *, limit: int) -> Statement:
        q = self.qualified(queue)
        return Statement(
            f"DELETE FROM {q} WHERE {_ROWS_OF}(SELECT ctid FROM {q} WHERE expires <= {_UTC_NOW}"
            " ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED))",
            {"limit": int(limit)},
        )

    def subscribe(self, table: QueueAddress, *, queue_address: str, endpoint: str, topic: str) -> Statement:
        return Statement(
            f"INSERT INTO {self.qualified(table)} (QueueAddress, Topic, Endpoint) VALUES (%(queue)s, %(topic)s, %(endpoint)s)"
            " ON CONFLICT (Endpoint, Topic) DO UPDATE SET QueueAddress = EXCLUDED.QueueAddress",
            {"queue": queue_address, "topic": topic, "endpoint": endpoint},
        )

    def unsubscribe(self, table: QueueAddress, *, endpoint: str, topic: str) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(table)} WHERE Endpoint = %(endpoint)s AND Topic = %(topic)s",
            {"endpoint": endpoint, "topic": topic},
        )

    def lock_messages(self, queue: QueueAddress, *, native_ids: list[str] | None, limit: int) -> Statement:
        q = self.qualified(queue)
        if native_ids is None:
            return Statement(
                f"SELECT id::text, id::text, headers FROM {q} ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
                {"limit": int(limit)},
            )
        return Statement(
            f"SELECT id::text, id::text, headers FROM {q} WHERE id = ANY(%(ids)s::uuid[])"
            " ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
            {"ids": list(native_ids), "limit": int(limit)},
        )

    def move_messages(
        self, queue: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
        recoverable: bool = False,
    ) -> Statement:
        # Queue and delayed tables both key their rows by id uuid.
        sql = (
            f"INSERT INTO {self.qualified(destination)} (id, expires, headers, body)"
            " SELECT gen_random_uuid(), NULL, v.headers, m.body"
            " FROM unnest(%(keys)s::uuid[], %(headers)s::text[]) WITH ORDINALITY AS v(id, headers, n)"
            f" JOIN {self.qualified(queue)} AS m ON m.id = v.id ORDER BY v.n"
        )
        return Statement(sql, {"keys": list(keys), "headers": list(headers)})

    def delete_messages(self, queue: QueueAddress, *, keys: list[str]) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(queue)} WHERE id = ANY(%(keys)s::uuid[])", {"keys": list(keys)}
        )

    def indexes(self, table: QueueAddress) -> Statement:
        expr, params = self._regclass(table)
        return Statement(
            "SELECT i.relname, string_agg(lower(a.attname), ',' ORDER BY k.n), ix.indisclustered, ix.indisunique,"
            " pg_get_expr(ix.indpred, ix.indrelid)"
            " FROM pg_index ix JOIN pg_class i ON i.oid = ix.indexrelid"
            " CROSS JOIN LATERAL unnest(ix.indkey) WITH ORDINALITY AS k(attnum, n)"
            " JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum"
            f" WHERE ix.indrelid = {expr}"
            " GROUP BY i.relname, ix.indisclustered, ix.indisunique, ix.indpred, ix.indrelid ORDER BY i.relname",
            params,
        )

    # -- privileges -------------------------------------------------------------------------------

    def grants(
        self, role: str, tables: Mapping[QueueAddress, Sequence[str]], *, queues: Collection[QueueAddress] = ()
    ) -> list[Statement]:
        grantee = '"' + check_name("role", role, max_bytes=63).replace('"', '""') + '"'
        schemas = dict.fromkeys(t.schema or self.default_schema for t in tables)
        out = [Statement(f"GRANT USAGE ON SCHEMA {self.quote(s)} TO {grantee}") for s in schemas]
        for table, privileges in tables.items():
            granted = check_privileges(privileges)
            out.append(Statement(f"GRANT {', '.join(granted)} ON TABLE {self.qualified(table)} TO {grantee}"))
            if table in queues and "INSERT" in granted:
                # The sequence's name is PostgreSQL's choice (truncated, numbered on a clash), so
                # it is looked up where the grant runs. A DO block takes no parameters: literals.
                out.append(Statement(
                    "DO $grant$\n"
                    f"DECLARE seq text := pg_catalog.pg_get_serial_sequence({_literal(self.qualified(table))}, 'seq');\n"
                    "BEGIN\n"
                    "    IF seq IS NOT NULL THEN\n"
                    f"        EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE %s TO %I', seq, {_literal(role)});\n"
                    "    END IF;\n"
                    "END\n"
                    "$grant$"
                ))
        return out

    def privileges(self, table: QueueAddress, privileges: Sequence[str]) -> Statement:
        wanted = check_privileges(privileges)
        # Found by name in the catalogs, not with to_regclass (which fails without USAGE on the
        # schema); has_*_privilege by oid checks the object's own privileges only.
        rel = "pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        this = "n.nspname = %(schema)s AND c.relname = %(table)s AND c.relkind IN ('r', 'p')"
        sql = (
            "SELECT 'USAGE ON SCHEMA ' || pg_catalog.quote_ident(n.nspname), pg_catalog.has_schema_privilege(n.oid, 'USAGE')"
            " FROM pg_catalog.pg_namespace n WHERE n.nspname = %(schema)s"
            " UNION ALL SELECT p.p, pg_catalog.has_table_privilege(c.oid, p.p)"
            f" FROM pg_catalog.unnest(%(privileges)s::text[]) AS p(p), {rel} WHERE {this}"
        )
        if "INSERT" in wanted:
            # serial columns (dependency 'a'); an identity column's sequence (dependency 'i') is
            # advanced by INSERT without any privilege on it
            sql += (
                " UNION ALL SELECT 'USAGE ON SEQUENCE ' || pg_catalog.quote_ident(sn.nspname) || '.'"
                " || pg_catalog.quote_ident(s.relname), pg_catalog.has_sequence_privilege(s.oid, 'USAGE, UPDATE')"
                f" FROM {rel}"
                " JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass"
                " AND d.refobjid = c.oid AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype = 'a'"
                " JOIN pg_catalog.pg_class s ON s.oid = d.objid AND s.relkind = 'S'"
                " JOIN pg_catalog.pg_namespace sn ON sn.oid = s.relnamespace"
                f" WHERE {this}"
            )
        return Statement(sql, {"schema": table.schema or self.default_schema, "table": table.table,
                               "privileges": list(wanted)})

    # -- connections --------------------------------------------------------------------------

    def streaming_cursor(self, conn: Any) -> Any:
        # A server-side cursor: a slice of large bodies never sits whole in an executor's memory.
        # Binary results: bytea bodies arrive as bytes, not as hex text twice their size.
        return conn.cursor(name="sqlqueue_read", binary=True)

    def connect(self, url: Any) -> Any:
        import psycopg

        conn = psycopg.connect(**url.psycopg_kwargs(), autocommit=False)
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        try:
            # Every function, operator and type the connector names resolves to the catalog: a
            # role with CREATE on a schema in the search path could otherwise plant a better
            # match (public.hashtextextended(text, integer) beats the catalog's with its implicit
            # cast). Every table we touch is schema-qualified. pg_temp last: never searched first.
            conn.execute("SET search_path = pg_catalog, pg_temp")
            conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def is_driver_error(self, exc: BaseException) -> bool:
        return _is_psycopg_error(exc)

    def sqlstate(self, exc: BaseException) -> str | None:
        state = getattr(exc, "sqlstate", None)
        return state.upper() if isinstance(state, str) and state else None

    def is_transient(self, exc: BaseException) -> bool:
        return _classify(exc) == "transient"

    def is_undefined_table(self, exc: BaseException) -> bool:
        return getattr(exc, "sqlstate", None) == "42P01"

    def error_text(self, exc: BaseException) -> str:
        # The primary message only: DETAIL ("Key (b)=(...) already exists", "Failing row
        # contains (...)"), CONTEXT and HINT may copy row contents, the LINE lines the statement.
        diag = getattr(exc, "diag", None)
        primary = getattr(diag, "message_primary", None) if diag is not None else None
        if primary:
            return one_line(primary)
        if _is_psycopg_error(exc):  # raised by libpq or psycopg itself: no row in it; keep every line
            return mask(" ".join(str(exc).split())) or type(exc).__name__
        return super().error_text(exc)

    # -- send: installers -----------------------------------------------------------------------

    def create_staging(self, staging: QueueAddress) -> list[Statement]:
        t = self.qualified(staging)
        # UNLOGGED: staged rows matter only until their batch is dispatched. A server crash
        # empties the table; the dispatch then finds fewer rows than the tasks reported, fails,
        # and the batch is staged again when the query restarts. Nothing is sent twice or lost.
        return [
            self._ddl_lock(staging),
            Statement(
                f"CREATE UNLOGGED TABLE IF NOT EXISTS {t} (\n"
                "    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n"
                "    sink text NOT NULL,\n"
                "    batch_id bigint NOT NULL,\n"
                "    attempt text NOT NULL,\n"
                "    kind text NOT NULL,\n"
                "    route text NOT NULL,\n"
                "    message_id text NOT NULL,\n"
                "    headers text NOT NULL,\n"
                "    body bytea,\n"
                "    ttbr_ms bigint,\n"
                "    delay_ms bigint,\n"
                "    due timestamptz,\n"
                "    staged_at timestamptz NOT NULL DEFAULT now()\n"
                ")"
            ),
            Statement(f"CREATE INDEX IF NOT EXISTS {self.quote(self.index_name(staging, 'route'))} ON {t} (kind, route)"),
        ]

    def create_outbox(self, outbox: QueueAddress) -> list[Statement]:
        t = self.qualified(outbox)
        return [
            self._ddl_lock(outbox),
            Statement(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "    sink text NOT NULL,\n"
                "    batch_id bigint NOT NULL,\n"
                "    fingerprint text NOT NULL,\n"
                "    sent integer,\n"
                "    delayed integer,\n"
                "    published integer,\n"
                "    dispatched_at timestamptz NOT NULL DEFAULT now(),\n"
                "    PRIMARY KEY (sink, batch_id)\n"
                ")"
            ),
            Statement(
                f"CREATE INDEX IF NOT EXISTS {self.quote(self.index_name(outbox, 'dispatched'))} ON {t} (dispatched_at)"
            ),
        ]

    def create_delayed(self, delayed: QueueAddress) -> list[Statement]:
        # NServiceBus's CreateDelayedMessageStoreText, except that the index on Due is not unique
        # (theirs is: two messages due in the same microsecond cannot both be stored).
        t = self.qualified(delayed)
        return [
            self._ddl_lock(delayed),
            Statement(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "    id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,\n"
                "    headers text NOT NULL,\n"
                "    body bytea,\n"
                "    due timestamptz NOT NULL\n"
                ")"
            ),
            Statement(f"CREATE INDEX IF NOT EXISTS {self.quote(self.index_name(delayed, 'Due'))} ON {t} (due)"),
        ]

    def create_subscriptions(self, table: QueueAddress) -> list[Statement]:
        t = self.qualified(table)
        return [
            self._ddl_lock(table),
            Statement(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "    QueueAddress varchar(200) NOT NULL,\n"
                "    Endpoint varchar(200) NOT NULL,\n"
                "    Topic varchar(200) NOT NULL,\n"
                "    PRIMARY KEY (Endpoint, Topic)\n"
                ")"
            ),
        ]

    # -- send: staging --------------------------------------------------------------------------

    def stage_rows(self, conn: Any, staging: QueueAddress, rows: list[tuple[Any, ...]]) -> None:
        cols = ", ".join(STAGED_COLUMNS)
        with conn.cursor() as cur:
            with cur.copy(f"COPY {self.qualified(staging)} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(
                    ["text", "int8", "text", "text", "text", "text", "text", "bytea", "int8", "int8", "timestamptz"]
                )
                for row in rows:
                    copy.write_row(row)

    # -- send: dispatch ---------------------------------------------------------------------------

    def outbox_insert(self, outbox: QueueAddress, *, sink: str, batch_id: int, fingerprint: str) -> Statement:
        return Statement(
            f"INSERT INTO {self.qualified(outbox)} (sink, batch_id, fingerprint)"
            " VALUES (%(sink)s, %(batch)s, %(fp)s) ON CONFLICT (sink, batch_id) DO NOTHING",
            {"sink": sink, "batch": int(batch_id), "fp": fingerprint},
        )

    def outbox_get(self, outbox: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        return Statement(
            f"SELECT fingerprint, dispatched_at, sent, delayed, published FROM {self.qualified(outbox)}"
            " WHERE sink = %(sink)s AND batch_id = %(batch)s",
            {"sink": sink, "batch": int(batch_id)},
        )

    def outbox_finish(
        self, outbox: QueueAddress, *, sink: str, batch_id: int, sent: int, delayed: int, published: int
    ) -> Statement:
        return Statement(
            f"UPDATE {self.qualified(outbox)} SET sent = %(sent)s, delayed = %(delayed)s, published = %(published)s"
            " WHERE sink = %(sink)s AND batch_id = %(batch)s",
            {"sink": sink, "batch": int(batch_id), "sent": sent, "delayed": delayed, "published": published},
        )

    def subscribers(self, table: QueueAddress, topics: list[str]) -> Statement:
        return Statement(
            f"SELECT DISTINCT queueaddress, topic FROM {self.qualified(table)} WHERE topic = ANY(%(topics)s)",
            {"topics": list(topics)},
        )

    def dispatch(
        self,
        staging: QueueAddress,
        destination: QueueAddress,
        *,
        attempts: list[str],
        route: str | None,
        publish_routes: list[str],
        recoverable: bool = False,
    ) -> Statement:
        s, d = self.qualified(staging), self.qualified(destination)
        # `first` picks one staged row per message id (NServiceBus's dispatcher deduplicates on
        # (message id, destination) too) from the small columns; the outer join then reads each
        # picked row by primary key in staging order, so bodies are never sorted.
        sql = f"""
INSERT INTO {d} (id, expires, headers, body)
SELECT gen_random_uuid(),
       CASE WHEN m.ttbr_ms IS NULL THEN NULL ELSE {_UTC_NOW} + m.ttbr_ms * interval '1 millisecond' END,
       m.headers, m.body
FROM (SELECT min(seq) AS seq FROM {s}
      WHERE {self._staged_selection()}
      GROUP BY message_id ORDER BY 1) AS first
JOIN {s} AS m ON m.seq = first.seq
ORDER BY first.seq"""
        return Statement(
            sql.strip(), {"attempts": list(attempts), "route": route, "published": list(publish_routes)}
        )

    @staticmethod
    def _staged_selection() -> str:
        return ("attempt = ANY(%(attempts)s)"
                " AND ((kind = 's' AND route = %(route)s) OR (kind = 'p' AND route = ANY(%(published)s)))")

    def staged_messages(
        self, staging: QueueAddress, *, attempts: list[str], route: str | None, publish_routes: list[str]
    ) -> Statement:
        s = self.qualified(staging)
        return Statement(
            f"SELECT m.seq, m.headers FROM (SELECT min(seq) AS seq FROM {s} WHERE {self._staged_selection()}"
            f" GROUP BY message_id) AS first JOIN {s} AS m ON m.seq = first.seq ORDER BY m.seq",
            {"attempts": list(attempts), "route": route, "published": list(publish_routes)},
        )

    def move_staged(
        self, staging: QueueAddress, destination: QueueAddress, *, keys: list[Any], headers: list[str],
        recoverable: bool = False,
    ) -> Statement:
        return Statement(
            f"INSERT INTO {self.qualified(destination)} (id, expires, headers, body)"
            " SELECT gen_random_uuid(), NULL, v.headers, m.body"
            " FROM unnest(%(keys)s::bigint[], %(headers)s::text[]) WITH ORDINALITY AS v(seq, headers, n)"
            f" JOIN {self.qualified(staging)} AS m ON m.seq = v.seq ORDER BY v.n",
            {"keys": [int(k) for k in keys], "headers": list(headers)},
        )

    def dispatch_delayed(self, staging: QueueAddress, delayed: QueueAddress, *, attempts: list[str]) -> Statement:
        s, d = self.qualified(staging), self.qualified(delayed)
        # `n` microseconds apart within a batch: tables NServiceBus created have a UNIQUE index on
        # Due, and every row of one transaction sees the same now().
        sql = f"""
INSERT INTO {d} (headers, body, due)
SELECT m.headers, m.body,
       COALESCE(m.due, now() + m.delay_ms * interval '1 millisecond') + k.n * interval '1 microsecond'
FROM (SELECT seq, row_number() OVER (ORDER BY seq) - 1 AS n FROM {s}
      WHERE kind = 'd' AND attempt = ANY(%(attempts)s)) AS k
JOIN {s} AS m ON m.seq = k.seq
ORDER BY k.seq"""
        return Statement(sql.strip(), {"attempts": list(attempts)})

    def delete_staged(self, staging: QueueAddress, *, attempts: list[str]) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(staging)} WHERE attempt = ANY(%(attempts)s)", {"attempts": list(attempts)}
        )

    def delete_batch_leftovers(self, staging: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(staging)} WHERE sink = %(sink)s AND batch_id = %(batch)s",
            {"sink": sink, "batch": int(batch_id)},
        )

    def outbox_cleanup(self, outbox: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        t = self.qualified(outbox)
        return Statement(
            f"DELETE FROM {t} WHERE {_ROWS_OF}(SELECT ctid FROM {t}"
            " WHERE dispatched_at < now() - %(age)s * interval '1 second' LIMIT %(limit)s))",
            {"age": int(older_than_seconds), "limit": int(limit)},
        )

    def staging_cleanup(self, staging: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        t = self.qualified(staging)
        return Statement(
            f"DELETE FROM {t} WHERE {_ROWS_OF}(SELECT ctid FROM {t}"
            " WHERE staged_at < now() - %(age)s * interval '1 second' LIMIT %(limit)s))",
            {"age": int(older_than_seconds), "limit": int(limit)},
        )

    # -- delayed delivery ----------------------------------------------------------------------

    def any_due(self, delayed: QueueAddress) -> Statement:
        return Statement(f"SELECT 1 FROM {self.qualified(delayed)} WHERE due <= now() LIMIT 1")

    def lock_mover(self, delayed: QueueAddress) -> Statement:
        return Statement(
            "SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended(%(key)s, 0))",
            {"key": f"sqlqueue mover {self.qualified(delayed)}"},
        )

    def due_delayed(self, delayed: QueueAddress, *, limit: int) -> Statement:
        return Statement(
            f"SELECT id::text, headers FROM {self.qualified(delayed)} WHERE due <= now()"
            " ORDER BY due LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
            {"limit": int(limit)},
        )

    def move_delayed(
        self, delayed: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
        recoverable: bool = False,
    ) -> Statement:
        return self.move_messages(delayed, destination, keys=keys, headers=headers)

    def delete_delayed(self, delayed: QueueAddress, *, keys: list[str]) -> Statement:
        return self.delete_messages(delayed, keys=keys)
