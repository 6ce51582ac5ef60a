"""PostgreSQL DDL: queue, claim, staging, outbox, delayed and subscription tables, and the header
check helper of PostgreSQL 13 to 15."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..base import FAILED_TABLE, InstallSql, QueueAddress, Statement
from .receive import HELPER_FUNCTION, POISON_PATH
from .statements import literal

if TYPE_CHECKING:
    from typing_extensions import Self

MIN_VERSION = 130000  # gen_random_uuid (jsonb_path_exists: 12)

FAST_VERSION = 160000  # pg_input_is_valid


class PostgresInstall(InstallSql):
    """The PostgreSQL installers of the dialect."""

    seq_types = MappingProxyType({32: "serial", 64: "bigserial"})

    force_helper: bool
    helper_schema: str | None

    def _ddl_lock(self, table: QueueAddress) -> Statement:
        # CREATE TABLE IF NOT EXISTS races with itself (both see "absent", one fails on pg_type);
        # a transaction-scoped advisory lock on the name serialises concurrent installers.
        return Statement(
            "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(%(key)s, 0))",
            {"key": f"sqlqueue ddl {self.qualified(table)}"},
        )

    def create_queue(self, queue: QueueAddress, *, seq_bits: int = 64) -> list[Statement]:
        seq_type = self.seq_type(seq_bits)
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
            ),
        ]

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

    def create_batches(self, table: QueueAddress) -> list[Statement]:
        t = self.qualified(table)
        # a row per (query, batch, claim table, consumer) while its claims are held: small, and
        # found by the query's batch (the sink) or by the claim table and consumer (a takeover);
        # and the failed-claims table beside it
        return [
            self._ddl_lock(table),
            Statement(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "    query_id text NOT NULL,\n"
                "    batch_id bigint NOT NULL,\n"
                "    claims text NOT NULL,\n"
                "    consumer text NOT NULL,\n"
                "    table_id text NOT NULL,\n"
                "    after_claim bigint NOT NULL,\n"
                "    upto_claim bigint NOT NULL,\n"
                "    settled_at timestamptz,\n"
                "    read_at timestamptz NOT NULL DEFAULT now(),\n"
                "    PRIMARY KEY (query_id, batch_id, claims, consumer)\n"
                ")"
            ),
            Statement(f"CREATE INDEX IF NOT EXISTS {self.quote(self.index_name(table, 'claims'))} ON {t} "
                      "(claims, consumer, upto_claim)"),
            # beside it, the claims the sink failed: a row per failed message until its claim is
            # acknowledged (`dialects.base.settled`); the lock above covers both tables
            Statement(
                f"CREATE TABLE IF NOT EXISTS {self.qualified(table.with_table(FAILED_TABLE))} (\n"
                "    table_id text NOT NULL,\n"
                "    claim_seq bigint NOT NULL,\n"
                "    failed_at timestamptz NOT NULL DEFAULT now(),\n"
                "    PRIMARY KEY (table_id, claim_seq)\n"
                ")"
            ),
        ]

    def create_delayed(self, delayed: QueueAddress) -> list[Statement]:
        # NServiceBus's CreateDelayedMessageStoreText: the same columns and index (not unique) on
        # Due, named as its "<table>_Due" (shortened only past PostgreSQL's 63 bytes); without its
        # fillfactor=100, which is already a table's default.
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

    def script(self, statements: list[Statement]) -> str:
        out = []
        for stmt in statements:
            params: Mapping[str, Any] = stmt.params or {}

            def value(m: re.Match[str], p: Mapping[str, Any] = params) -> str:
                return literal(p[m.group(1)])

            text = re.sub(r"%\((\w+)\)s", value, stmt.sql)
            out.append(text.replace("%%", "%").strip() + ";\n")
        return "\n".join(out)

    def server_check(self) -> Statement:
        return Statement("SELECT current_setting('server_version_num')::int")

    def adapt_to_server(self, version: int, claims: QueueAddress) -> tuple[Self, str | None]:
        if version < MIN_VERSION:
            return self, f"PostgreSQL {version // 10000} is too old: spark-qtransport needs PostgreSQL 13 or newer"
        helper = version < FAST_VERSION or self.force_helper
        schema = (claims.schema or self.default_schema) if helper else None
        return dataclasses.replace(self, helper_schema=schema), None  # type: ignore[type-var]

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
                f"    RETURN jsonb_typeof(j) <> 'object' OR jsonb_path_exists(j, {POISON_PATH}, '{{}}', true);\n"
                "END\n"
                "$fn$"
            ),
        ]

    def helpers_exist(self, claims: QueueAddress) -> Statement | None:
        if self.helper_schema is None:
            return None
        return Statement("SELECT pg_catalog.to_regprocedure(%(fn)s) IS NOT NULL",
                         {"fn": f"{self.quote(self.helper_schema)}.{HELPER_FUNCTION}(text)"})
