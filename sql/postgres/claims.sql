-- Claim table "public"."Sales.Claims" of queue "Sales": messages claimed by spark-qtransport readers.
--
-- Generated from spark_qtransport.dialects.postgres.PostgresDialect.create_claims() and rendered with
-- PostgresDialect.script(): exactly what the connector runs, with its parameters written as
-- literals. tests/test_postgres_sql.py fails when this file and the code differ (regenerate with
-- SQLQUEUE_WRITE_SQL=1 pytest tests/test_postgres_sql.py -k script_files).
--
-- Idempotent: CREATE ... IF NOT EXISTS under a transaction-scoped advisory lock, so concurrent
-- runs of it never race. NServiceBus's installers take no lock: run at the same moment as one of
-- theirs it may fail with "already exists" (42P07, 42710, 23505); run it again. Run it inside a
-- transaction (psql -1 -f ...).

SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('sqlqueue ddl "public"."Sales.Claims"', 0));

CREATE TABLE IF NOT EXISTS "public"."Sales.Claims" (
    consumer text NOT NULL,
    claim_seq bigint GENERATED ALWAYS AS IDENTITY,
    id uuid NOT NULL,
    expires timestamp,
    headers text NOT NULL,
    body bytea,
    source_seq bigint NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, claim_seq)
);
