"""sqlqueue metrics: Prometheus metrics of queues, served over HTTP by a real exporter process
against the embedded PostgreSQL, parsed with prometheus_client's own parser and checked against
`sqlqueue stats --json` and the counts the test made."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from backends import Backend, nsb_headers
from spark_qtransport.cli import main
from spark_qtransport.cli.db import open_db
from spark_qtransport.cli.snapshot import NO_FAILED_Q, failures

SQLQUEUE = [sys.executable, "-m", "spark_qtransport.cli"]

#: labels -> value of every sample, per sample name
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


class Exporter:
    """`sqlqueue metrics --listen 127.0.0.1:0` in its own process; `scrape()` reads it over HTTP."""

    def __init__(self, url: str, *args: str) -> None:
        self.proc = subprocess.Popen([*SQLQUEUE, "metrics", *args, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "SQLQUEUE_URL": url, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:"), (line, self.stop())
        self.address = line.split()[1]

    def scrape(self) -> Samples:
        with urllib.request.urlopen(self.address, timeout=60) as response:
            assert response.status == 200
            return parse(response.read().decode())

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0 and "Traceback" not in err, err
        return err


@pytest.fixture
def exporters(pg: Backend) -> Iterator[Any]:
    started: list[Exporter] = []

    def start(*args: str, url: str | None = None) -> Exporter:
        started.append(Exporter(url or pg.url, *args))
        return started[-1]

    yield start
    for e in started:
        if e.proc.poll() is None:
            e.stop()


def cli(pg: Backend, *args: str, ok: bool = True) -> Any:
    result = CliRunner().invoke(main, list(args), env={"SQLQUEUE_URL": pg.url})
    if ok:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


@pytest.fixture
def world(pg: Backend, names: Any) -> dict[str, str]:
    """Sales: 3 messages (1 expired), 2 claimed by Sales.Spark, delayed 2 due and 1 pending, 1
    outbox record; Empty: nothing; an error queue: 3 failures of Sales, 2 of Billing, 1 of a queue
    named with a quote and an accent (escaped in the JSON), 1 poison row."""
    from spark_qtransport.transport.receiving.receiver import Receiver
    from spark_qtransport.transport.settings import ReceiveSettings

    q, empty, e = pg.create_queue(names("Sales")), pg.create_queue(names("Empty")), pg.create_queue(names("error"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(4)])
    r = Receiver(ReceiveSettings.create(pg.url, q, error_queue=e, consumer="Sales.Spark", claim_ahead=False))
    try:
        r.latest(r.initial_offset(), 2)  # claimed, never acknowledged
    finally:
        r.close()
    pg.send(q, nsb_headers("old"), b"{}", ttbr_ms=1)
    cli(pg, "create-queue", q, "--delayed")
    cli(pg, "send", q, "--endpoint", q, "--type", "T", "--body", "later", "--delay", "1h")  # pending + outbox record
    with pg.connect() as conn:
        for _ in range(2):
            conn.execute(f'INSERT INTO "{q}.Delayed" (headers, body, due) VALUES (%s, %s,'
                         " timestamptz (now() AT TIME ZONE 'UTC') - interval '1 hour')", (json.dumps(nsb_headers()), b"{}"))
    odd = '"public"."Café"'
    rows: list[tuple[dict[str, str] | str, bytes]] = [(nsb_headers(**{"NServiceBus.FailedQ": q}), b"x")] * 3
    rows += [(nsb_headers(**{"NServiceBus.FailedQ": "Billing"}), b"x")] * 2
    rows += [(json.dumps(nsb_headers(**{"NServiceBus.FailedQ": odd})), b"x"), ("<not json", b"x")]
    pg.send_many(e, rows)
    return {"q": q, "empty": empty, "e": e, "odd": odd}


def canonical(name: str) -> str:
    return f'"public"."{name}"'


def test_metrics_match_stats_and_known_counts(pg: Backend, world: dict[str, str], exporters: Any) -> None:
    q, empty, e = world["q"], world["empty"], world["e"]
    exporter = exporters(q, empty, "--error-queue", e)
    samples = exporter.scrape()
    stats = {r["queue"]: r for r in json.loads(cli(pg, "stats", q, empty, "--json").output)}
    Q, EMPTY = canonical(q), canonical(empty)
    assert value(samples, "sqlqueue_up") == 1
    for name, row in stats.items():
        assert value(samples, "sqlqueue_queue_messages", queue=name) == row["messages"]
        assert value(samples, "sqlqueue_queue_expired_messages", queue=name) == row["expired"]
    assert (stats[Q]["messages"], stats[Q]["expired"], stats[EMPTY]["messages"]) == (3, 1, 0)
    age = value(samples, "sqlqueue_queue_oldest_message_age_seconds", queue=Q)
    assert age > 86_400 and abs(age - stats[Q]["oldest_age_s"]) < 60  # TimeSent 2025-11-28
    assert value(samples, "sqlqueue_queue_oldest_message_age_seconds", queue=EMPTY) == 0
    assert samples["sqlqueue_claimed_messages"] == {(("consumer", "Sales.Spark"), ("queue", Q)): 2}
    assert stats[Q]["claimed"] == {"Sales.Spark": 2}
    assert samples["sqlqueue_delayed_messages"] == {(("queue", Q), ("state", "due")): 2,
                                                    (("queue", Q), ("state", "pending")): 1}
    assert (stats[Q]["delayed_due"], stats[Q]["delayed_pending"]) == (2, 1)
    assert samples["sqlqueue_outbox_records"] == {(("queue", Q),): stats[Q]["outbox"]} and stats[Q]["outbox"] == 1
    E = canonical(e)
    assert {dict(k)["failed_q"]: v for k, v in samples["sqlqueue_error_queue_failures"].items()} == {
        Q: 3, canonical("Billing"): 2, world["odd"]: 1, NO_FAILED_Q: 1}
    assert {dict(k)["error_queue"] for k in samples["sqlqueue_error_queue_failures"]} == {E}
    assert value(samples, "sqlqueue_scrape_rounds_total") == 1 and value(samples, "sqlqueue_scrape_errors_total") == 0
    assert value(samples, "sqlqueue_scrape_duration_seconds") > 0
    exporter.stop()


def test_scrapes_within_the_cache_window_share_one_round(pg: Backend, names: Any, exporters: Any) -> None:
    q = pg.create_queue(names("Sales"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(3)])
    cached = exporters(q, "--cache-seconds", "300")
    together: list[Samples] = []
    threads = [threading.Thread(target=lambda: together.append(cached.scrape())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pg.send(q, nsb_headers("later"), b"{}")
    later = cached.scrape()
    for samples in [*together, later]:  # four at once and one later: one round, its numbers
        assert value(samples, "sqlqueue_scrape_rounds_total") == 1
        assert value(samples, "sqlqueue_queue_messages", queue=canonical(q)) == 3
    assert len({value(s, "sqlqueue_scrape_timestamp_seconds") for s in [*together, later]}) == 1
    fresh = exporters(q, "--cache-seconds", "0")
    first, second = fresh.scrape(), fresh.scrape()
    assert [value(s, "sqlqueue_scrape_rounds_total") for s in (first, second)] == [1, 2]
    assert value(second, "sqlqueue_queue_messages", queue=canonical(q)) == 4


def test_a_database_that_cannot_be_read_gives_up_0_and_the_exporter_goes_on(pg: Backend, names: Any,
                                                                           exporters: Any) -> None:
    """A database that does not exist yet: up 0 and an error per round, no numbers; once it is
    created the next round reads it. Nothing listening at all: --once prints up 0, exit 1."""
    dbname = names("metrics_db").lower()
    url = pg.url.rsplit("/", 1)[0] + "/" + dbname
    exporter = exporters("--cache-seconds", "0", url=url)
    down = [exporter.scrape(), exporter.scrape()]
    assert [value(s, "sqlqueue_up") for s in down] == [0, 0]
    assert [value(s, "sqlqueue_scrape_errors_total") for s in down] == [1, 2]
    assert "sqlqueue_queue_messages" not in down[1]
    admin = psycopg.connect(**pg.parsed.psycopg_kwargs(), autocommit=True)
    try:
        admin.execute(f'CREATE DATABASE "{dbname}"')
        up = exporter.scrape()
        assert value(up, "sqlqueue_up") == 1 and value(up, "sqlqueue_scrape_errors_total") == 2
        err = exporter.stop()
        assert err.count("error: sqlqueue metrics") == 2 and "sqlqueue metrics: sqlqueue metrics" not in err and dbname in err, err
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.close()
    port = _free_port()  # nothing listens there
    result = subprocess.run([*SQLQUEUE, "metrics", "--once"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "SQLQUEUE_URL": f"postgresql://postgres@127.0.0.1:{port}/postgres"})
    assert result.returncode == 1 and "error: sqlqueue metrics" in result.stderr, result
    once = parse(result.stdout)
    assert value(once, "sqlqueue_up") == 0 and value(once, "sqlqueue_scrape_errors_total") == 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_once_prints_one_exposition(pg: Backend, world: dict[str, str]) -> None:
    result = cli(pg, "metrics", world["q"], "--error-queue", world["e"], "--once")
    samples = parse(result.output)
    assert value(samples, "sqlqueue_up") == 1
    assert value(samples, "sqlqueue_queue_messages", queue=canonical(world["q"])) == 3
    assert sum(samples["sqlqueue_error_queue_failures"].values()) == 7


def test_failures_limit_counts_the_oldest_rows(pg: Backend, world: dict[str, str]) -> None:
    with open_db(pg.url) as s:
        address = s.queue(world["e"])
        assert failures(s, s.d, address, limit=4) == {canonical(world["q"]): 3, canonical("Billing"): 1}


def test_failures_without_pg_input_is_valid_read_the_same(pg: Backend, world: dict[str, str]) -> None:
    """PostgreSQL 13 to 15 (no pg_input_is_valid): the FailedQ is matched in the text, its JSON
    escapes decoded; the poison row counts under (none) as well."""
    with open_db(pg.url) as s:
        address = s.queue(world["e"])
        old = dataclasses.replace(s.d, helper_schema="public")  # type: ignore[type-var]
        assert "pg_input_is_valid" not in old.failure_stats(address, limit=10).sql
        assert failures(s, old, address, limit=100) == failures(s, s.d, address, limit=100) == {
            canonical(world["q"]): 3, canonical("Billing"): 2, world["odd"]: 1, NO_FAILED_Q: 1}


def test_usage_and_a_missing_extra(pg: Backend) -> None:
    assert cli(pg, "metrics", ok=False).exit_code == 2  # neither --listen nor --once
    assert "HOST:PORT" in cli(pg, "metrics", "--listen", "nope", ok=False).output
    code = ("import sys; sys.modules['prometheus_client'] = None; from spark_qtransport.cli import main;"
            " main(['metrics', '--once'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "SQLQUEUE_URL": pg.url})
    assert result.returncode == 1 and "pip install 'spark-qtransport[metrics]'" in result.stderr, result
