"""The test tiers (tests/conftest.py): a test's tier comes from the fixtures it uses, and a unit-tier
test cannot reach a database."""

from __future__ import annotations

import psycopg
import pytest


def test_a_test_without_spark_or_database_fixtures_is_a_unit_test(request: pytest.FixtureRequest) -> None:
    markers = {m.name for m in request.node.iter_markers()}
    assert "unit" in markers and not markers & {"db", "spark"}


def test_a_unit_test_that_opens_a_connection_fails_naming_it() -> None:
    with pytest.raises(pytest.fail.Exception, match="reached a PostgreSQL connection"):
        psycopg.connect("postgresql://nobody@127.0.0.1:1/none", connect_timeout=1)


def test_a_unit_test_that_starts_a_server_fails_naming_it(tmp_path: object) -> None:
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    with pytest.raises(pytest.fail.Exception, match="reached an embedded PostgreSQL"):
        with EmbeddedPostgres(fsync=False):
            pass


def test_a_test_with_the_database_fixture_is_a_db_test(request: pytest.FixtureRequest, pg_url: str) -> None:
    markers = {m.name for m in request.node.iter_markers()}
    assert "db" in markers and "unit" not in markers and "spark" not in markers
    psycopg.connect(pg_url).close()  # and reaches it
