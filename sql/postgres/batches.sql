-- The database's settled-batches table "public"."SqlQueue.Batches" (which claims each streaming batch read, and whether its sink settled it) and failed-claims table "public"."SqlQueue.Failed" (the claims its sink failed).
--
-- Generated from spark_qtransport.dialects.postgres.PostgresDialect.create_batches() and rendered with
-- PostgresDialect.script(): exactly what the connector runs, with its parameters written as
-- literals. tests/test_postgres_sql.py fails when this file and the code differ (regenerate with
-- SQLQUEUE_WRITE_SQL=1 pytest tests/test_postgres_sql.py -k script_files).
--
-- Idempotent: CREATE ... IF NOT EXISTS under a transaction-scoped advisory lock, so concurrent
-- runs of it never race. NServiceBus's installers take no lock: run at the same moment as one of
-- theirs it may fail with "already exists" (42P07, 42710, 23505); run it again. Run it inside a
-- transaction (psql -1 -f ...).

SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('sqlqueue ddl "public"."SqlQueue.Batches"', 0));

CREATE TABLE IF NOT EXISTS "public"."SqlQueue.Batches" (
    query_id text NOT NULL,
    batch_id bigint NOT NULL,
    claims text NOT NULL,
    consumer text NOT NULL,
    table_id text NOT NULL,
    after_claim bigint NOT NULL,
    upto_claim bigint NOT NULL,
    settled_at timestamptz,
    read_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, batch_id, claims, consumer)
);

CREATE INDEX IF NOT EXISTS "SqlQueue.Batches_claims" ON "public"."SqlQueue.Batches" (claims, consumer, upto_claim);

CREATE TABLE IF NOT EXISTS "public"."SqlQueue.Failed" (
    table_id text NOT NULL,
    claim_seq bigint NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_id, claim_seq)
);
