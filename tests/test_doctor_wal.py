"""`sqlqueue doctor`'s advice on PostgreSQL's WAL settings: after each checkpoint the next change to
every queue and claim page writes the whole page to WAL, so checkpoints close together cost WAL per
message. The decision is tested with given values; the values as read from real servers (the test
server, and a durable embedded one, which must pass its own doctor)."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from backends import Backend
from spark_qtransport.cli import main
from spark_qtransport.cli.embedded import EmbeddedPostgres
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.transport import session as db
from spark_qtransport.transport.operations.doctor import (
    Finding,
    WalSettings,
    check_server,
    read_wal_settings,
    setting_value,
    wal_advice,
)

D = PostgresDialect()
GB = 1024**3


@pytest.mark.parametrize(("setting", "unit", "value"), [
    ("300", "s", 300), ("1800", "s", 1800), ("250", "ms", 0.25), ("2048", "MB", 2 * GB),
    ("128", "16MB", 2 * GB), ("8192", "8kB", 64 * 1024**2), ("16777216", "B", 16 * 1024**2), ("on", None, None),
    ("3", None, 3), ("5", "parsecs", None),
])
def test_a_setting_is_read_in_its_unit(setting: str, unit: str | None, value: float | None) -> None:
    assert setting_value(setting, unit) == value


def test_the_advice_for_given_settings() -> None:
    good = WalSettings(checkpoint_timeout=1800, max_wal_size=4 * GB, methods=("pglz",))
    assert wal_advice(good) == []
    (short,) = wal_advice(replace(good, checkpoint_timeout=300))
    assert short.level == "info" and short.table == "(server)"
    assert short.message.startswith("checkpoint_timeout is 5min: after each checkpoint the next change to every queue")
    assert "about 2 KB more WAL per message" in short.message and "15min to 30min" in short.message
    assert "crash recovery" in short.message and "wal_compression with pglz" in short.message  # the only method: mentioned
    (both,) = wal_advice(replace(good, checkpoint_timeout=900 - 1, max_wal_size=GB))
    assert both.message.startswith("checkpoint_timeout is 899s and max_wal_size is 1GB:")
    assert "pglz" not in wal_advice(replace(good, max_wal_size=2 * GB, wal_compression="pglz"))[0].message
    # lz4 or zstd built in: advised apart, whatever the checkpoints; pglz only beside short checkpoints
    both_methods = replace(good, methods=("pglz", "lz4", "zstd"))
    (lz4,) = wal_advice(both_methods)
    assert lz4 == Finding("info", "(server)", (
        "wal_compression is off: the whole pages written to WAL after each checkpoint (full_page_writes) go "
        "uncompressed; this server was built with lz4 and zstd: set wal_compression = lz4 (pglz costs much more CPU)"))
    assert "set wal_compression = zstd" in wal_advice(replace(good, methods=("pglz", "zstd")))[0].message
    assert wal_advice(replace(both_methods, wal_compression="lz4")) == []
    short_lz4 = wal_advice(replace(both_methods, checkpoint_timeout=300))
    assert len(short_lz4) == 2 and "pglz" not in short_lz4[0].message
    # no page images, nothing to advise
    assert wal_advice(WalSettings(checkpoint_timeout=60, max_wal_size=GB, full_page_writes=False,
                                  methods=("lz4",))) == []
    # settings not read (an old or unusual server): not judged
    assert wal_advice(WalSettings()) == []


def test_the_test_servers_settings_as_the_doctor_reads_them(pg: Backend) -> None:
    with pg.connect() as conn:
        cur = conn.cursor()
        s = read_wal_settings(db.rows(cur, D.wal_settings()))
        timeout, size, pages = conn.execute(
            "SELECT pg_catalog.date_part('epoch', pg_catalog.current_setting('checkpoint_timeout')::interval),"
            " pg_catalog.pg_size_bytes(pg_catalog.current_setting('max_wal_size')),"
            " pg_catalog.current_setting('full_page_writes')").fetchone()
        server = check_server(cur, D, [])
    assert (s.checkpoint_timeout, s.max_wal_size, s.full_page_writes) == (timeout, size, pages == "on")
    assert "pglz" in s.methods and "off" not in s.methods and "on" not in s.methods
    # the doctor judges what it read (the embedded test server writes no page images: no advice)
    assert [f for f in server if f.level == "info"] == wal_advice(s)
    # its values, with page images: advice exactly when its checkpoints are closer than advised
    advice = [f for f in wal_advice(replace(s, full_page_writes=True)) if "checkpoint_timeout is" in f.message
              or "max_wal_size is" in f.message]
    assert bool(advice) == (timeout < 15 * 60 or size < 4 * GB)


@pytest.mark.db  # a durable server of its own
def test_the_durable_embedded_server_passes_its_own_doctor() -> None:
    """Its checkpoints 30 minutes apart with 4 GB of WAL; with 5 minutes, the advice; read by a
    role that is not a superuser as well."""
    def doctor(url: str) -> list[dict[str, Any]]:
        queue = Backend(url).create_queue(f"Sales_{uuid.uuid4().hex[:8]}")
        result = CliRunner().invoke(main, ["doctor", queue, "--json"], env={"SQLQUEUE_URL": url})
        assert result.exit_code == 0, result.output
        return list(json.loads(result.output))

    with EmbeddedPostgres(settings={"checkpoint_timeout": "5min"}) as server:
        short, table = doctor(server.url)
        assert (short["level"], short["table"], table["level"]) == ("info", "(server)", "ok")
        assert short["finding"].startswith("checkpoint_timeout is 5min: after each checkpoint")
        server.settings = {}
        server.restart()
        assert [f["level"] for f in doctor(server.url)] == ["ok"]
        with Backend(server.url).connect() as conn:
            conn.execute("CREATE ROLE plain LOGIN NOSUPERUSER")
        with Backend(server.url.replace("postgres@", "plain@")).connect() as conn:
            cur = conn.cursor()
            s = read_wal_settings(db.rows(cur, D.wal_settings()))
            assert check_server(cur, D, []) == []
        assert (s.checkpoint_timeout, s.max_wal_size, s.full_page_writes, s.wal_compression) == (1800, 4 * GB, True, "off")
