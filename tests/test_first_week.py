"""What a new user met in the first week, second round: a wrong address that waited two minutes,
and a one-off write whose rows could not be built that said nothing. Each case failed before."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from backends import Backend

SQLQUEUE = [sys.executable, "-m", "spark_qtransport.cli"]


@pytest.fixture
def nobody_url() -> str:
    """A PostgreSQL URL where nothing listens: a port free a moment ago (refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def test_the_cli_on_a_wrong_port_fails_in_seconds_with_one_line(nobody_url: str) -> None:
    """Before: 120.6 s (the outage bound) and then the error. A database that never answered is
    not in an outage; one that answered before still is (tests/test_outages.py)."""
    done = subprocess.run([*SQLQUEUE, "stats", "--url", nobody_url], capture_output=True, text=True, timeout=30,
                          env={k: v for k, v in os.environ.items() if not k.startswith("SQLQUEUE_")})
    assert done.returncode == 1, done
    said = done.stderr.strip().splitlines()
    assert len(said) == 1, done.stderr
    assert f"{nobody_url} does not answer" in said[0] and "Connection refused" in said[0], said[0]
    assert "check the host and port" in said[0] and "outage" not in said[0], said[0]


def test_a_stream_on_a_wrong_port_fails_at_its_start_in_seconds(spark: Any, nobody_url: str, tmp_path: Any) -> None:
    query = (spark.readStream.format("sqlqueue").option("url", nobody_url).option("queue", "Sales")
             .option("endpoint", "Sales").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        with pytest.raises(Exception) as failed:  # before: active for the 2-minute outage bound
            assert not query.awaitTermination(40), "the query ended without an error"
    finally:
        query.stop()
    assert failed.type.__name__ == "StreamingQueryException", failed.value
    text = str(failed.value)
    assert f"{nobody_url} does not answer" in text and "check the host and port" in text, text[:2000]


def test_a_one_off_write_without_a_message_type_raises_naming_the_column_and_the_count(
        spark: Any, pg: Backend, names: Any) -> None:
    """Before: save() succeeded and all three rows went to the error queue, with one log line
    naming a random batch id. A stream keeps that default (its endpoint's failed messages go
    there); a one-off write sends nothing and says why, unless invalidRows is chosen."""
    from spark_qtransport import unwrap
    from spark_qtransport.errors import MessageError

    billing, error = pg.create_queue(names("Billing")), pg.create_queue(names("error"))
    df = spark.createDataFrame([("{}",), ("{}",), ("{}",)], "body string")

    def write(**options: str) -> None:
        (df.write.format("sqlqueue").option("url", pg.url).option("endpoint", names("Sales"))
         .option("destination", billing).option("errorQueue", error).options(**options).mode("append").save())

    with pytest.raises(Exception) as failed:
        write()
    cause = unwrap(failed.value)
    assert isinstance(cause, MessageError), failed.value
    assert cause.message.startswith("nothing was sent: all 3 rows of this write could not be built into messages; "
                                    "the first: column 'message_type' of message "), cause.message
    assert "set option invalidRows to 'error-queue'" in cause.message
    assert pg.count(billing) == pg.count(error) == 0
    write(invalidRows="error-queue")  # chosen: they go to the error queue, the write succeeds
    assert pg.count(billing) == 0 and pg.count(error) == 3


# -- sqlqueue: what it prints ------------------------------------------------------------------------

def _cli(pg: Backend, *args: str) -> Any:
    from click.testing import CliRunner

    from spark_qtransport.cli import main

    return CliRunner().invoke(main, list(args), env={"SQLQUEUE_URL": pg.url})


def test_peek_shows_a_binary_body_as_bytes_not_as_control_characters(pg: Backend, names: Any) -> None:
    """The monitoring queue's reports are binary (NServiceBus's TaggedLongValueWriterOccurrence):
    peek printed them as escaped control characters, one long garbled cell."""
    q = pg.create_queue(names("Monitoring"))
    pg.send(q, {"NServiceBus.MessageId": "m1"}, bytes([1, 0, 0, 0, 0x7F, 0xFF, 0x10]) + b"\x00" * 200)
    pg.send(q, {"NServiceBus.MessageId": "m2"}, "a café, 订单\n".encode())
    done = _cli(pg, "peek", q)
    assert done.exit_code == 0, done.output
    first, second = done.output.splitlines()[1:]
    assert first.endswith("(binary, 207 bytes) 01 00 00 00 7f ff 10 00 00 00 00 00 00 00 00 00 00 00 00 00 ..."), first
    assert second.endswith("a café, 订单\\x0a"), second  # text stays text (its newline escaped)


def test_peek_of_a_delayed_table_lists_what_is_due_soonest_and_where_it_goes(pg: Backend, names: Any) -> None:
    """`peek Sales.Delayed` failed with "is not a queue table"; it lists the delayed messages, the
    soonest due first, with the queue each goes to (read from NServiceBus's ForwardDestination)."""
    sales = pg.create_queue(names("Sales"))
    done = _cli(pg, "create-queue", sales, "--delayed")
    assert done.exit_code == 0, done.output
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    with pg.connect() as conn:
        for minutes, n in ((30, 2), (5, 1)):
            conn.execute(
                f'INSERT INTO "{sales}.Delayed" (headers, body, due) VALUES (%s, %s,'
                " (now() AT TIME ZONE 'UTC') + make_interval(mins => %s))",
                (json.dumps({"NServiceBus.MessageId": f"m{n}", "NServiceBus.SqlServer.ForwardDestination": "Billing"}),
                 f"order {n}".encode(), minutes))
    done = _cli(pg, "peek", f"{sales}.Delayed", "--json")
    assert done.exit_code == 0, done.output
    rows = json.loads(done.output)
    assert [(r["message_id"], r["destination"], r["body"]) for r in rows] == [("m1", "Billing", "order 1"),
                                                                             ("m2", "Billing", "order 2")]
    due = [datetime.fromisoformat(r["due"]) for r in rows]
    now = datetime.now(timezone.utc)
    assert timedelta(minutes=4) < due[0] - now < timedelta(minutes=6) and due[1] < later, due
    assert "seq" not in rows[0] and "expires" not in rows[0]
    assert _cli(pg, "peek", f"{sales}.Delayed").output.splitlines()[0].split() == [
        "due", "destination", "message_id", "type", "correlation_id", "body"]
    # another command given the delayed table as a queue says what it is and what reads it
    done = _cli(pg, "purge-expired", f"{sales}.Delayed")
    assert done.exit_code == 1
    assert done.output.strip() == (f'error: "public"."{sales}.Delayed" is the delayed table of endpoint "public".'
                                   f'"{sales}", not a queue; `sqlqueue peek` lists its messages, `sqlqueue stats` '
                                   "counts its due and pending messages, `sqlqueue move-delayed` delivers the due ones"), done.output


def test_tables_stay_aligned_with_wide_characters(pg: Backend, names: Any) -> None:
    """A queue named in Chinese took two columns a character in the terminal and one in the
    padding: every column after it was shifted."""
    from spark_qtransport.cli.output import display_width

    wide, plain = names("订单"), names("Sales")
    done = _cli(pg, "create-queue", wide, plain)
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    where = [display_width(line[:line.index("ready" if "ready" in line else "status")]) for line in lines]
    assert len(set(where)) == 1, done.output


def test_the_first_progress_report_of_a_run_says_what_waits(spark: Any, pg: Backend, names: Any, tmp_path: Any) -> None:
    """The jobs print each batch with the backlog the source reports: the first said `backlog 0`
    while 27,000 messages waited (the estimate is made in the background, after the claim ahead,
    and the first report had none yet)."""
    import json

    from backends import nsb_headers

    q = pg.create_queue(names("Backlog"))
    pg.create_queue(names("error"))
    pg.send_many(q, [(nsb_headers(f"m{i}"), json.dumps({"n": i}).encode()) for i in range(3000)])
    query = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q)
             .option("errorQueue", names("error")).option("maxMessagesPerTrigger", "500").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        import time

        deadline = time.monotonic() + 120
        while not [p for p in query.recentProgress if p["numInputRows"]]:
            assert time.monotonic() < deadline and query.isActive, query.exception()
            time.sleep(0.2)
        first = next(p for p in query.recentProgress if p["numInputRows"])
    finally:
        query.stop()
    latest = first["sources"][0]["latestOffset"]
    latest = json.loads(latest) if isinstance(latest, str) else latest
    assert latest.get("backlog") is not None and latest["backlog"] >= 2000, latest


@pytest.mark.spark
def test_a_jar_of_another_spark_line_is_named_not_taken_for_sqlqueue_existing(tmp_path: Any) -> None:
    """Delta's jars for Spark 4.0 on Spark 4.2 (a conf/local/spark-defaults.conf written for another
    line) fail Java's ServiceLoader, and Spark's register() then said "Data source 'sqlqueue'
    already exists": every run of the Sending page's Delta script failed so. A jar whose data
    source provider cannot be loaded does the same; register() names the provider and the cure."""
    import zipfile

    jar = tmp_path / "broken-provider.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister", "com.example.NotThere\n")
    script = tmp_path / "register.py"
    script.write_text(
        "import os, sys\n"
        "os.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
        "from pyspark.sql import SparkSession\n"
        "from spark_qtransport import ConfigError, register\n"
        f"spark = (SparkSession.builder.master('local[1]').config('spark.jars', {str(jar)!r})\n"
        "         .config('spark.ui.enabled', 'false').getOrCreate())\n"
        "try:\n"
        "    register(spark)\n"
        "except ConfigError as exc:\n"
        "    print('ConfigError:', exc)\n")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    said = [line for line in done.stdout.splitlines() if line.startswith("ConfigError:")]
    assert said, (done.stdout, done.stderr[-3000:])
    assert "com.example.NotThere" in said[0] and "make setup" in said[0], said
    assert "already exists" not in said[0]
