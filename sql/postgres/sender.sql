-- Staging and outbox tables "public"."Sales.Staging" and "public"."Sales.Outbox" of sending endpoint 'Sales': what spark-qtransport sinks stage and dispatch.
--
-- Generated from spark_qtransport.dialects.postgres.PostgresDialect.create_staging, create_outbox() and rendered with
-- PostgresDialect.script(): exactly what the connector runs, with its parameters written as
-- literals. tests/test_postgres_sql.py fails when this file and the code differ (regenerate with
-- SQLQUEUE_WRITE_SQL=1 pytest tests/test_postgres_sql.py -k script_files).
--
-- Idempotent: CREATE ... IF NOT EXISTS under a transaction-scoped advisory lock, so concurrent
-- runs of it never race. NServiceBus's installers take no lock: run at the same moment as one of
-- theirs it may fail with "already exists" (42P07, 42710, 23505); run it again. Run it inside a
-- transaction (psql -1 -f ...).

SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('sqlqueue ddl "public"."Sales.Staging"', 0));

CREATE UNLOGGED TABLE IF NOT EXISTS "public"."Sales.Staging" (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink text NOT NULL,
    batch_id bigint NOT NULL,
    attempt text NOT NULL,
    kind text NOT NULL,
    route text NOT NULL,
    message_id text NOT NULL,
    headers text NOT NULL,
    body bytea,
    ttbr_ms bigint,
    delay_ms bigint,
    due timestamptz,
    staged_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS "Sales.Staging_route" ON "public"."Sales.Staging" (kind, route);

SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('sqlqueue ddl "public"."Sales.Outbox"', 0));

CREATE TABLE IF NOT EXISTS "public"."Sales.Outbox" (
    sink text NOT NULL,
    batch_id bigint NOT NULL,
    fingerprint text NOT NULL,
    sent integer,
    delayed integer,
    published integer,
    dispatched_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink, batch_id)
);

CREATE INDEX IF NOT EXISTS "Sales.Outbox_dispatched" ON "public"."Sales.Outbox" (dispatched_at);
