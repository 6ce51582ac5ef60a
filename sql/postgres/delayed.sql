-- Delayed-delivery table "public"."Sales.Delayed" of endpoint 'Sales', as NServiceBus lays it out.
--
-- Generated from spark_qtransport.dialects.postgres.PostgresDialect.create_delayed() and rendered with
-- PostgresDialect.script(): exactly what the connector runs, with its parameters written as
-- literals. tests/test_postgres_sql.py fails when this file and the code differ (regenerate with
-- SQLQUEUE_WRITE_SQL=1 pytest tests/test_postgres_sql.py -k script_files).
--
-- Idempotent: CREATE ... IF NOT EXISTS under a transaction-scoped advisory lock, so concurrent
-- runs of it never race. NServiceBus's installers take no lock: run at the same moment as one of
-- theirs it may fail with "already exists" (42P07, 42710, 23505); run it again. Run it inside a
-- transaction (psql -1 -f ...).

SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('sqlqueue ddl "public"."Sales.Delayed"', 0));

CREATE TABLE IF NOT EXISTS "public"."Sales.Delayed" (
    id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    headers text NOT NULL,
    body bytea,
    due timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS "Sales.Delayed_Due" ON "public"."Sales.Delayed" (due);
