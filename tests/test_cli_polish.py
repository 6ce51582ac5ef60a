"""sqlqueue details people meet first: dotted endpoint names, usage errors, pipes, stats columns,
--version and stats --watch (click's runner or a real process, a real database)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from click.testing import CliRunner

from backends import Backend, nsb_headers
from spark_qtransport import __version__
from spark_qtransport.cli import STATS_COLUMNS, main
from spark_qtransport.wire import H, decode_headers

SQLQUEUE = [sys.executable, "-m", "spark_qtransport.cli"]


@pytest.fixture
def run(pg: Backend) -> Any:
    runner = CliRunner()

    def invoke(*args: str, ok: bool = True, url: str | None = None) -> Any:
        result = runner.invoke(main, list(args), env={"SQLQUEUE_URL": pg.url if url is None else url})
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result

    return invoke


# -- dotted endpoint names --------------------------------------------------------------------------


def test_dotted_endpoint_is_one_table_in_the_default_schema(pg: Backend, names: Any, run: Any) -> None:
    billing, web = pg.create_queue(names("Billing")), f"{names('Shop')}.Web"
    out = run("send", billing, "--endpoint", web, "--type", "T", "--body", "{}", "--json").output
    assert json.loads(out) == [{"queue": f'"public"."{billing}"', "sent": 1}]
    [(_, headers, _)] = pg.rows(billing)
    assert decode_headers(headers)[H.ORIGINATING_ENDPOINT] == web  # type: ignore[index]
    assert pg.count(f'"{web}.Outbox"') == 1
    created = json.loads(run("create-queue", web, "--delayed", "--json").stdout)  # a note on stderr
    assert [r["table"] for r in created] == [f'"public"."{web}"', f'"public"."{web}.Delayed"']
    run("send", web, "--endpoint", web, "--type", "T", "--body", "later", "--delay", "1h")
    assert [r["queue"] for r in json.loads(run("stats", web, "--json").output)] == [f'"public"."{web}"']
    assert json.loads(run("peek", web, "--json").output) == []
    assert json.loads(run("move-delayed", web, "--json").output) == []
    assert json.loads(run("create-outbox", web, "--json").output)[1]["table"] == f'"public"."{web}.Outbox"'
    assert [f["level"] for f in json.loads(run("doctor", web, "--json").output)][0] == "ok"


def test_dotted_name_is_schema_and_table_where_the_schema_exists(pg: Backend, names: Any, run: Any) -> None:
    schema = names("billing")
    with pg.connect() as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
    created = json.loads(run("create-queue", f"{schema}.Invoices", "--json").output)
    assert created == [{"table": f'"{schema}"."Invoices"', "status": "ready"}]
    quoted = json.loads(run("create-queue", f'"{schema}.Invoices"', "--json").output)  # quoted: taken as written
    assert quoted == [{"table": f'"public"."{schema}.Invoices"', "status": "ready"}]
    # now both readings exist: the schema, and the table "public"."<schema>.Invoices"
    ambiguous = run("peek", f"{schema}.Invoices", ok=False)
    assert ambiguous.exit_code == 2, ambiguous.output
    assert f'\'"{schema}"."Invoices"\' or \'"public"."{schema}.Invoices"\'' in ambiguous.output
    assert "Traceback" not in ambiguous.output
    assert run("peek", f'"{schema}"."Invoices"').output.strip() == "(nothing)"


def test_ddl_reads_a_dotted_name_as_one_table_without_a_connection(run: Any) -> None:
    out = run("ddl", "--queue", "Shop.Web", "--part", "queue", "--part", "sender", url="").output
    assert 'CREATE TABLE IF NOT EXISTS "public"."Shop.Web"' in out and '"public"."Shop.Web.Outbox"' in out
    quoted = run("ddl", "--queue", '"billing"."Invoices"', "--part", "queue", url="").output
    assert 'CREATE TABLE IF NOT EXISTS "billing"."Invoices"' in quoted


def test_help_shows_a_dotted_endpoint_and_the_quoted_form(run: Any) -> None:
    for args in ([], ["send"]):
        text = run(*args, "--help", url="").output
        assert "--endpoint Shop.Web" in text and """'"Shop"."Web"'""" in text


# -- usage errors, pipes, --version -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "url", "message"),
    [
        (("send", "B", "--endpoint", "S", "--type", "T", "--body", "@no/such/file.json"), None,
         "Invalid value for '--body': cannot read 'no/such/file.json': No such file or directory"),
        (("peek", "Sales"), "postgres:/nowhere", "is not a valid URL"),
        (("stats",), "mysql://u@h/db", "unsupported scheme"),
        (("ddl",), "nonsense", "is not a valid URL"),
    ],
)
def test_usage_errors_exit_2_with_one_line(run: Any, args: tuple[str, ...], url: str | None, message: str) -> None:
    result = run(*args, ok=False, url=url)
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert message in error and "Traceback" not in result.output


def test_version(run: Any) -> None:
    assert run("--version", url="").output == f"sqlqueue {__version__}\n"


def test_a_closed_pipe_is_quiet() -> None:
    """`sqlqueue ddl | head -1`: the reader leaves early; no BrokenPipeError on stderr."""
    parts = ["--part", "queue", "--part", "sender"] * 300  # well beyond a pipe's buffer
    proc = subprocess.Popen([*SQLQUEUE, "ddl", *parts], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "SQLQUEUE_URL": ""})
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"-- queue")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) in (0, 141)
    assert err == b"", err
    shell = subprocess.run(["sh", "-c", f"{' '.join(SQLQUEUE)} ddl {' '.join(parts)} | head -1"],
                           capture_output=True, timeout=60, env={**os.environ, "SQLQUEUE_URL": ""})
    assert shell.stdout == b"-- queue: postgres\n" and shell.stderr == b"", shell.stderr


# -- stats ------------------------------------------------------------------------------------------


def test_stats_columns_are_always_the_same(pg: Backend, names: Any, run: Any) -> None:
    from spark_qtransport.transport.receiving.receiver import Receiver
    from spark_qtransport.transport.settings import ReceiveSettings

    bare, full, error = pg.create_queue(names("Bare")), pg.create_queue(names("Full")), pg.create_queue(names("error"))
    run("create-queue", full, "--delayed")
    pg.send_many(full, [(nsb_headers(f"m{i}"), b"{}") for i in range(5)])
    for endpoint, n in (("Sales.Analytics", 3), ("Other", 1)):
        r = Receiver(ReceiveSettings.create(pg.url, full, error_queue=error, consumer=endpoint, claim_ahead=False))
        try:
            r.latest(r.initial_offset(), n)
        finally:
            r.close()
    for qs in ([bare], [full], [bare, full], []):
        assert run("stats", *qs).output.splitlines()[0].split() == list(STATS_COLUMNS), qs
    table = run("stats", bare, full).output.splitlines()
    assert table[1].split()[1:] == ["0", "0", "0", "-", "-", "-", "-", "-", "-"]
    assert "Other=1, Sales.Analytics=3" in table[2] and "{" not in table[2]
    rows = json.loads(run("stats", bare, full, "--json").output)
    assert [list(r) for r in rows] == [list(STATS_COLUMNS)] * 2
    assert (rows[0]["claimed"], rows[0]["delayed_due"], rows[0]["outbox"]) == (None, None, None)
    assert rows[1]["claimed"] == {"Other": 1, "Sales.Analytics": 3} and rows[1]["delayed_pending"] == 0


def test_stats_watch_shows_time_and_rate(pg: Backend, names: Any) -> None:
    q = pg.create_queue(names("Sales"))
    proc = subprocess.Popen([*SQLQUEUE, "stats", q, "--watch", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "SQLQUEUE_URL": pg.url, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    try:
        lines = [proc.stdout.readline() for _ in range(3)]  # time, header, the first refresh's row
        assert lines[0].endswith("Z  every 0.5s (Ctrl-C stops)\n") and lines[0][:2] == "20", lines
        assert lines[1].split() == [*STATS_COLUMNS, "rate_per_s"]
        assert lines[2].split()[-1] == "-"  # no rate before a second refresh
        pg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(20)])
        rates = []
        deadline = time.monotonic() + 30
        while not any(r > 0 for r in rates) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith('"public"'):
                rates.append(float(line.split()[-1]))
        assert any(r > 0 for r in rates), rates
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err and "Aborted" not in err, err


def test_stats_watch_json_is_one_object_per_refresh(pg: Backend, names: Any) -> None:
    q = pg.create_queue(names("Sales"))
    proc = subprocess.Popen([*SQLQUEUE, "stats", q, "--watch", "0.2", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "SQLQUEUE_URL": pg.url})
    assert proc.stdout is not None
    try:
        first, second = (json.loads(proc.stdout.readline()) for _ in range(2))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert first["time"].endswith("Z") and [r["queue"] for r in first["queues"]] == [f'"public"."{q}"']
    assert list(first["queues"][0]) == [*STATS_COLUMNS, "rate_per_s"]
    assert first["queues"][0]["rate_per_s"] is None and second["queues"][0]["rate_per_s"] == 0
