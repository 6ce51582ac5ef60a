"""PostgreSQL operations: statistics, peeking, purging, subscriptions, moving messages, privileges."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence

from ...errors import ConfigError, field_error
from ..base import MARK, OperationsSql, QueueAddress, Statement, check_preview, check_privileges
from .addressing import PostgresAddressing
from .statements import ROWS_OF, UTC_NOW, instant_of, literal

#: a flat JSON object's "NServiceBus.FailedQ": "..." member, its string's content captured (escapes
#: kept): how `failure_stats` reads the header on servers without pg_input_is_valid
FAILED_Q_PATTERN = r'"NServiceBus\.FailedQ"\s*:\s*"((?:[^"\\]|\\.)*)"'


def _positive(limit: int) -> int:
    limit = int(limit)
    if limit < 1:
        raise field_error("limit", f"must be at least 1, not {limit}")
    return limit


class PostgresOperations(PostgresAddressing, OperationsSql):
    sequence_column = "seq"
    int32_sequence = "seq is a 32-bit serial"
    not_null_columns = ("id", "headers", "seq")  # NServiceBus's CreateQueueText
    helper_schema: str | None

    """The PostgreSQL operations of the dialect."""

    def server_time_zone(self) -> Statement | None:
        # The TimeZone this session got from the server (its postgresql.conf, ALTER DATABASE or
        # ALTER ROLE), unless the URL set one; two offsets, so a zone with daylight saving shows.
        return Statement(
            "SELECT pg_catalog.current_setting('TimeZone'), pg_catalog.date_part('timezone', pg_catalog.now())::int,"
            " pg_catalog.date_part('timezone', pg_catalog.now() + interval '6 months')::int"
        )

    def wal_settings(self) -> Statement | None:
        # pg_settings is readable by every role; a setting's `setting` is in its `unit` (s, MB, or
        # a multiple: 8kB); wal_compression's enumvals list only the methods this server was built
        # with (NULL before PostgreSQL 15, where it is a boolean: pglz only).
        return Statement(
            "SELECT name, setting, unit, pg_catalog.array_to_string(enumvals, ',')"
            " FROM pg_catalog.pg_settings"
            " WHERE name IN ('checkpoint_timeout', 'max_wal_size', 'full_page_writes', 'wal_compression')"
        )

    def peek_messages(self, queue: QueueAddress, *, limit: int, preview: int) -> Statement:
        # A plain SELECT: MVCC never waits for other sessions and takes no row lock. substring of
        # a bytea reads only the TOAST chunks it needs. Expires a day inside Python's datetime
        # range loads as a datetime whatever the session's time zone (a timestamptz column);
        # beyond it, and infinity, come as text.
        fits = "expires >= '0001-01-02' AND expires < '9999-12-31'"
        return Statement(
            f"SELECT id::text, CASE WHEN {fits} THEN expires END, CASE WHEN {fits} THEN NULL ELSE expires::text END,"
            " headers, substring(body from 1 for %(preview)s), octet_length(body), seq"
            f" FROM {self.qualified(queue)} ORDER BY seq LIMIT %(limit)s",
            {"limit": int(limit), "preview": check_preview(preview)},
        )

    def peek_delayed(self, delayed: QueueAddress, *, limit: int, preview: int) -> Statement:
        # NServiceBus reads the next due time as `SELECT now() AT TIME ZONE 'UTC', Due FROM t ORDER
        # BY Due LIMIT 1` (its MoveDueDelayedMessageText); this is that order without its row lock,
        # through the due index. Due is a UTC wall clock: shown as the instant it means.
        return Statement(
            f"SELECT {instant_of('due')}, headers, substring(body from 1 for %(preview)s), octet_length(body)"
            f" FROM {self.qualified(delayed)} ORDER BY due LIMIT %(limit)s",
            {"limit": int(limit), "preview": check_preview(preview)},
        )

    def catalog_version(self) -> Statement:
        # A new pg_class row (CREATE, and ALTER or RENAME, which write the relation's row anew)
        # has the highest xmin; a DROP lowers the count. One pass over pg_class (about 2 ms at a
        # thousand tenants, against 10 ms for list_queues' per-candidate column checks). An xid
        # that wrapped around and a DROP balanced by a CREATE together could hide a change: the
        # caller resolves again after a while whatever this says (`queueset.RESOLVE_AGAIN`).
        return Statement("SELECT count(*), max(c.xmin::text::bigint) FROM pg_catalog.pg_class c")

    def list_queues(self, *, like: tuple[str, str] | None = None) -> Statement:
        # Each table's schema by its oid (an index lookup a candidate), never a join: psycopg
        # prepares a statement run often, and a generic plan of a join filtered by names is a
        # nested loop over every schema (a thousand tenants: seconds instead of milliseconds).
        table = "" if like is None else " AND c.relname ILIKE %(table)s"
        schema = "" if like is None else " AND t.nspname ILIKE %(schema)s"
        return Statement(
            "WITH t AS MATERIALIZED (SELECT (SELECT n.nspname FROM pg_namespace n WHERE n.oid = c.relnamespace)"
            f" AS nspname, c.relname, c.oid FROM pg_class c WHERE c.relkind IN ('r', 'p'){table})"
            " SELECT t.nspname, t.relname FROM t"
            f" WHERE t.nspname <> 'information_schema' AND t.nspname NOT LIKE 'pg\\_%%'{schema}"
            " AND (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped"
            " AND lower(a.attname) IN ('id', 'headers', 'body', 'expires', 'seq')) = 5"
            " ORDER BY 1, 2",
            None if like is None else {"schema": like[0], "table": like[1]},
        )

    def queue_stats(self, queue: QueueAddress) -> Statement:
        return Statement(
            f"SELECT count(*), count(*) FILTER (WHERE expires <= {UTC_NOW}), min(seq), max(seq)"
            f" FROM {self.qualified(queue)}"
        )

    def nullable_columns(self, table: QueueAddress) -> Statement:
        expr, params = self._regclass(table)
        return Statement(
            "SELECT lower(a.attname) FROM pg_attribute a"
            f" WHERE a.attrelid = {expr} AND a.attnum > 0 AND NOT a.attisdropped AND NOT a.attnotnull ORDER BY a.attnum",
            params,
        )

    def oldest_headers(self, queue: QueueAddress) -> Statement:
        return Statement(f"SELECT headers FROM {self.qualified(queue)} ORDER BY seq LIMIT 1")

    def failure_stats(self, queue: QueueAddress, *, limit: int) -> Statement:
        # The oldest rows through the seq index, then grouped: a bounded read, headers only.
        # pg_input_is_valid (PostgreSQL 16) keeps a poison row's cast from failing the query; the
        # CASE evaluates the cast only where it is valid. Without it (13 to 15, `adapt_to_server`
        # sets helper_schema there) the value is matched in the text: a JSON string's content,
        # its escapes decoded by `failed_q_value`; no error is possible, and a row that is not JSON
        # but holds the pattern counts under what it names.
        if self.helper_schema is None:
            value = "CASE WHEN pg_input_is_valid(headers, 'jsonb') THEN headers::jsonb ->> 'NServiceBus.FailedQ' END"
            params: dict[str, object] = {}
        else:
            value = "substring(headers from %(pattern)s)"
            params = {"pattern": FAILED_Q_PATTERN}
        return Statement(
            f"SELECT f, count(*) FROM (SELECT {value} AS f FROM {self.qualified(queue)}"
            " ORDER BY seq LIMIT %(limit)s) AS t GROUP BY f ORDER BY f",
            {**params, "limit": _positive(limit)},
        )

    def failed_q_value(self, value: object) -> str | None:
        if value is None or self.helper_schema is None:
            return super().failed_q_value(value)
        text = str(value)
        try:  # the content of a JSON string, as the pattern matched it
            decoded = json.loads(f'"{text}"')
        except ValueError:
            return text
        return decoded if isinstance(decoded, str) else text

    def delayed_stats(self, delayed: QueueAddress) -> Statement:
        # due as the movers judge it (delayed.py); the next due time as the instant it means
        return Statement(
            f"SELECT count(*) FILTER (WHERE due < {UTC_NOW}), count(*) FILTER (WHERE due >= {UTC_NOW}),"
            f" {instant_of(f'min(due) FILTER (WHERE due >= {UTC_NOW})')} FROM {self.qualified(delayed)}"
        )

    def claim_stats(self, claims: QueueAddress) -> Statement:
        return Statement(
            f"SELECT consumer, count(*), min(claimed_at) FROM {self.qualified(claims)}"
            " WHERE left(consumer, 1) <> %(mark)s GROUP BY consumer ORDER BY consumer", {"mark": MARK}
        )

    def count_rows(self, table: QueueAddress) -> Statement:
        return Statement(f"SELECT count(*) FROM {self.qualified(table)}")

    def purge_expired(self, queue: QueueAddress, *, limit: int) -> Statement:
        q = self.qualified(queue)
        return Statement(
            f"DELETE FROM {q} WHERE {ROWS_OF}(SELECT ctid FROM {q} WHERE expires <= {UTC_NOW}"
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

    def grants(
        self, role: str, tables: Mapping[QueueAddress, Sequence[str]], *, queues: Collection[QueueAddress] = ()
    ) -> list[Statement]:
        try:
            grantee = '"' + self.check_name("role", role).replace('"', '""') + '"'
        except ConfigError as exc:
            raise field_error("role", str(exc)) from None
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
                    f"DECLARE seq text := pg_catalog.pg_get_serial_sequence({literal(self.qualified(table))}, 'seq');\n"
                    "BEGIN\n"
                    "    IF seq IS NOT NULL THEN\n"
                    f"        EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE %s TO %I', seq, {literal(role)});\n"
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
