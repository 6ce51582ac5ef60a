"""sqlqueue's bounds and escapes: what a command reads is bounded in bytes (a body to send, the
bodies peek shows), odd values in a queue print, and no line it prints can drive the terminal
(click's runner, or a real process where memory, pipes and exit codes matter; a real database)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from backends import Backend, nsb_headers
from spark_qtransport.cli import main

SQLQUEUE = [sys.executable, "-m", "spark_qtransport.cli"]

#: the largest body `sqlqueue send` reads (its --help and docs/operations/cli.md say so)
MAX_BODY_BYTES = 256 * 2**20

#: runs a command as its only child and prints the child's peak RSS (KiB) last on stdout
_MEASURE = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True);"
            " sys.stdout.buffer.write(done.stdout); sys.stderr.buffer.write(done.stderr);"
            " print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)")

#: an OSC 52 sequence (write the clipboard) and a CSI one (red), as a hostile name would hold them
HOSTILE = "Q\x1b]52;c;aGVsbG8=\x07\x1b[31mx\x9b"
HOSTILE_ESCAPED = r"Q\x1b]52;c;aGVsbG8=\x07\x1b[31mx\x9b"


@pytest.fixture
def run(pg: Backend) -> Any:
    runner = CliRunner()

    def invoke(*args: str, ok: bool = True) -> Any:
        result = runner.invoke(main, list(args), env={"SQLQUEUE_URL": pg.url})
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result

    return invoke


def _process(pg: Backend, *args: str, stdin: Any = None, measure: bool = False) -> subprocess.CompletedProcess[bytes]:
    """sqlqueue in a process of its own, its output piped; address space capped at 1.5 GiB, so a
    command that reads without end fails there instead of exhausting the machine."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))

    command = [sys.executable, "-c", _MEASURE, *SQLQUEUE] if measure else SQLQUEUE
    return subprocess.run([*command, *args], stdin=stdin, capture_output=True, timeout=300, preexec_fn=cap,
                          env={**os.environ, "SQLQUEUE_URL": pg.url})


def _peak_kib(done: subprocess.CompletedProcess[bytes]) -> tuple[int, Any]:
    """(peak RSS of the measured command in KiB, its JSON output)."""
    out, _, peak = done.stdout.rstrip().rpartition(b"\n")
    return int(peak), json.loads(out)


# -- bounded reads -------------------------------------------------------------------------------------


def test_peek_reads_only_the_start_of_a_large_body(pg: Backend, names: Any) -> None:
    """A 50 MB body: peek's peak memory grows less than 50 MB over a peek of a tiny message, and
    --json says how long the body is and that the preview is cut."""
    tiny, large = pg.create_queue(names("Tiny")), pg.create_queue(names("Large"))
    pg.send(tiny, nsb_headers("t1"), b"{}")
    size = 50 * 2**20
    with pg.connect() as conn:
        conn.cursor().execute(f"INSERT INTO {pg.q(large)} (id, expires, headers, body) SELECT gen_random_uuid(), NULL,"
                              " %s, convert_to(repeat('x', %s), 'UTF8')", (json.dumps(nsb_headers("big")), size))
    try:
        base_kib, base = _peak_kib(_process(pg, "peek", tiny, "--json", measure=True))
        done = _process(pg, "peek", large, "--json", measure=True)
        assert done.returncode == 0, done.stderr
        peak_kib, rows = _peak_kib(done)
    finally:
        pg.drop(large)
    assert peak_kib - base_kib < 50 * 1024, (base_kib, peak_kib)
    assert base[0]["body_bytes"] == 2 and base[0]["body_truncated"] is False
    assert rows[0]["message_id"] == "big" and rows[0]["body_bytes"] == size and rows[0]["body_truncated"] is True
    assert rows[0]["body"] == "x" * 60 + "..."


@pytest.mark.parametrize("source", ["@/dev/zero", "-"])
def test_a_body_without_end_is_refused_at_the_limit(pg: Backend, names: Any, source: str) -> None:
    """--body @/dev/zero or stdin from it: a usage error naming --body and the limit, after
    reading one byte more than the limit (the cap on the process's memory guards the test)."""
    q = pg.create_queue(names("Sales"))
    with open("/dev/zero", "rb") as zero:
        done = _process(pg, "send", q, "--endpoint", names("Web"), "--type", "T", "--body", source, stdin=zero)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "Invalid value for '--body'" in err and "more than 256 MB" in err and "Traceback" not in err, err
    assert pg.count(q) == 0


def test_a_file_larger_than_the_limit_is_refused_unread(pg: Backend, names: Any, run: Any, tmp_path: Any) -> None:
    """A regular file is judged by its size (a sparse file: nothing to read); one at the limit is sent."""
    q = pg.create_queue(names("Sales"))
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(MAX_BODY_BYTES + 1)
    result = run("send", q, "--endpoint", names("Web"), "--type", "T", "--body", f"@{big}", ok=False)
    assert result.exit_code == 2 and "more than 256 MB" in result.output, result.output
    assert "256 MB" in run("send", "--help").output


# -- odd values and what peek shows ----------------------------------------------------------------------


def test_peek_shows_correlation_id_odd_expires_and_body_lengths(pg: Backend, names: Any, run: Any) -> None:
    """Expires infinity, -infinity, year 10000 and BC print as PostgreSQL writes them (no
    DataError); peek, stats and error list work over them; CorrelationId is a column; a
    multi-byte body shows 60 characters."""
    q = pg.create_queue(names("Sales"))
    odd = ["infinity", "-infinity", "10000-01-01 00:00:00", "0044-03-15 00:00:00 BC"]
    for i, expires in enumerate(odd):
        pg.send(q, nsb_headers(f"m{i}", **{"NServiceBus.CorrelationId": f"c{i}"}), "é".encode() * 100)
        with pg.connect() as conn:
            conn.cursor().execute(f"UPDATE {pg.q(q)} SET expires = %s::timestamp WHERE headers LIKE %s",
                                  (expires, f'%"m{i}"%'))
    pg.send(q, nsb_headers("plain"), None, ttbr_ms=3_600_000)
    rows = json.loads(run("peek", q, "--json").output)
    assert [r["expires"] for r in rows[:4]] == odd and rows[4]["expires"][:2] == "20"
    assert [r["correlation_id"] for r in rows] == ["c0", "c1", "c2", "c3", "plain"]
    assert rows[0]["body"] == "é" * 60 + "..." and rows[0]["body_bytes"] == 200 and rows[0]["body_truncated"]
    assert (rows[4]["body"], rows[4]["body_bytes"], rows[4]["body_truncated"]) == ("(null)", None, False)
    table = run("peek", q).output.splitlines()
    assert table[0].split() == ["seq", "native_id", "message_id", "type", "correlation_id", "expires", "body"]
    assert "infinity" in table[1] and "c0" in table[1]
    stats = json.loads(run("stats", q, "--json").output)
    assert stats[0]["messages"] == 5 and stats[0]["oldest_age_s"] is not None
    assert len(json.loads(run("error", "list", "--queue", q, "--json").output)) == 5


# -- escapes ----------------------------------------------------------------------------------------------


def test_error_lines_escape_control_characters_captured(run: Any) -> None:
    """An error naming a queue with OSC 52 and CSI sequences, and click's own usage error quoting
    what was typed: one line each, every control character escaped."""
    result = run("peek", HOSTILE, ok=False)
    assert result.exit_code == 1
    assert result.output == f'error: queue "public"."{HOSTILE_ESCAPED}" does not exist\n'
    usage = run("peek", "Q", HOSTILE, ok=False)
    assert usage.exit_code == 2 and f"Got unexpected extra argument ({HOSTILE_ESCAPED})" in usage.output, usage.output
    for output in (result.output, usage.output):
        assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 for c in output), repr(output)


def test_error_lines_escape_control_characters_piped(pg: Backend) -> None:
    """Piped, click would strip the CSI sequence only (naming another queue) and pass OSC 52 on:
    the line names the queue as typed, escaped."""
    done = _process(pg, "peek", HOSTILE)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr == f'error: queue "public"."{HOSTILE_ESCAPED}" does not exist\n'.encode(), done.stderr
    usage = _process(pg, "peek", "Q", HOSTILE)
    assert usage.returncode == 2 and f"Got unexpected extra argument ({HOSTILE_ESCAPED})".encode() in usage.stderr, \
        usage.stderr
    assert b"\x1b" not in usage.stderr and b"\x07" not in usage.stderr


def test_warnings_logged_while_a_command_runs_are_escaped(pg: Backend, names: Any) -> None:
    """A delayed message whose ForwardDestination (from data) is a hostile missing queue: move-delayed
    sends it to the error queue, and the package's warning naming that address prints escaped."""
    sales, error = names("Sales"), pg.create_queue(names("error"))
    assert _process(pg, "create-queue", sales, "--delayed").returncode == 0
    headers = nsb_headers("m1", **{"NServiceBus.SqlServer.ForwardDestination": HOSTILE})
    delayed = pg.q(f'"{sales}.Delayed"')
    with pg.connect() as conn:
        conn.cursor().execute(f"INSERT INTO {delayed} (headers, body, due) VALUES (%s, %s, now())",
                              (json.dumps(headers), b"{}"))
    done = _process(pg, "move-delayed", sales, "--error-queue", error)
    err = done.stderr.decode()
    assert done.returncode == 0 and pg.count(error) == 1, err
    assert "warning: " in err and HOSTILE_ESCAPED in err, err
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 for c in err), repr(err)


def test_every_line_goes_through_output_echo() -> None:
    """Nothing in the CLI prints around the one escaping path (output.echo)."""
    import re
    from pathlib import Path

    import spark_qtransport.cli as cli

    for path in Path(cli.__file__).parent.glob("*.py"):
        if path.name in ("output.py", "embedded.py"):  # the path itself; embedded: its own `python -m` entry point
            continue
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\bclick\.(echo|secho)\(|\bprint\(|sys\.std(out|err)\.write", text), path.name


def test_ddl_refuses_a_name_it_cannot_print_as_sql(run: Any) -> None:
    """Escaping would change the table a script creates: a name with a control character is refused."""
    result = run("ddl", "--queue", HOSTILE, ok=False)
    assert result.exit_code == 2 and "holds a control character" in result.output, result.output
    assert "\x1b" not in result.output
