-- PostgreSQL 13 to 15 only: the header check the claim uses where pg_input_is_valid is missing.
--
-- Generated from spark_qtransport.dialects.postgres.PostgresDialect.create_helpers() and rendered with
-- PostgresDialect.script(): exactly what the connector runs, with its parameters written as
-- literals. tests/test_postgres_sql.py fails when this file and the code differ (regenerate with
-- SQLQUEUE_WRITE_SQL=1 pytest tests/test_postgres_sql.py -k script_files).
--
-- Idempotent: CREATE ... IF NOT EXISTS under a transaction-scoped advisory lock, so concurrent
-- runs of it never race. NServiceBus's installers take no lock: run at the same moment as one of
-- theirs it may fail with "already exists" (42P07, 42710, 23505); run it again. Run it inside a
-- transaction (psql -1 -f ...).

SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('sqlqueue ddl "public"."sqlqueue_poison_headers"', 0));

CREATE OR REPLACE FUNCTION "public".sqlqueue_poison_headers(h text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE j jsonb;
BEGIN
    BEGIN
        j := h::jsonb;
    EXCEPTION WHEN others THEN
        RETURN true;  -- not JSON at all
    END;
    RETURN jsonb_typeof(j) <> 'object' OR jsonb_path_exists(j, 'strict $.* ? (@.type() != "string" && @.type() != "null")', '{}', true);
END
$fn$;
