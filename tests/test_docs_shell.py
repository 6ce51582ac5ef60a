"""The documentation's shell examples, run as written and in the order written: the commands of
docs/operations/cli.md (every `sqlqueue ...` block, the output and exit code after it), the block of
docs/operations/metrics.md, the DBA's commands of docs/operations/permissions.md and the
spark-submit block of docs/jobs.md. Each block is read from its page under its heading, so a page
edit is what runs.

What differs from a person at a terminal, and why (every substitution is asserted to apply, so a
page edit that removes its target fails here instead of being skipped):

- `$SQLQUEUE_URL` is a database of its own on the test server, where the reader of the docs has the
  `sqlqueue dev-db` of its `export` line (which tests/test_dev_db.py runs); `sqlqueue` is the
  checkout's `.venv/bin/sqlqueue`, on PATH as after `. .venv/bin/activate`.
- A transcript's output is compared line by line with the values no two runs share left out:
  message and native ids (UUIDs), times, and the one-decimal ages and rates (with the spaces that
  pad them). A command starts at least 1 s after the one before it did, as typed: the transcript's
  `--delay 1s` message is due by the `stats` two commands later, as it is for a person.
- `pip install 'spark-qtransport[metrics]'` is not run: the test environment has the `metrics`
  extra (`import prometheus_client` is asserted instead).
- `--listen` servers listen on port 0 (a free port, which the docs say port 0 picks) instead of
  9188, which may be taken; each is scraped once and stopped with SIGTERM.
- `--once`'s file goes to a temporary directory instead of /var/lib/node_exporter/textfile/.
- `## Permissions`: the DBA's role is `app_role` with a suffix (roles belong to the server, not to a
  database); each "run what it prints" is run through psycopg, where a DBA would use psql.
- The spark-submit block's /tmp paths are temporary directories of the test; it runs in the
  checkout with SPARK_LOCAL_IP=127.0.0.1 (as the quick start's script sets it), after the queues
  the paragraph before it names were made as it says, and Sales given three messages with
  `sqlqueue send`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import psycopg
import pytest
from docs_pages import blocks, fences, section
from test_metrics import parse, value

from processes import ROOT, Job

VENV_BIN = ROOT / ".venv" / "bin"


def substitute(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in text, f"the page no longer has {old!r}: update this test's substitutions"
        text = text.replace(old, new)
    return text


def database(pg_url: str, name: str) -> str:
    """A new database on the test server: what `sqlqueue dev-db` gives the reader of the docs."""
    db = f"{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    return pg_url.rsplit("/", 1)[0] + "/" + db


def shell_env(url: str) -> dict[str, str]:
    """A shell after `. .venv/bin/activate` and the `export SQLQUEUE_URL=...` line, without what
    the test session set for its own Spark."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "SQLQUEUE_URL": url}


# ## Operations: transcripts

@dataclass
class Command:
    line: str  # as typed, after "$ "
    output: list[str] = field(default_factory=list)  # stdout and stderr, as a terminal shows them
    code: int = 0  # a "(exit N)" line after the output


def transcripts() -> list[Command]:
    """The commands of docs/operations/cli.md in order: each a `bash` block of one line, its
    output the `text` block right after it (none: it prints nothing), ending in ``(exit N)`` when
    it fails."""
    found: list[Command] = []
    for fence in fences("operations/cli.md"):
        if fence.language == "bash" and fence.body.startswith("sqlqueue "):
            assert fence.body.count("\n") == 1, fence.body
            found.append(Command(fence.body.strip()))
        elif fence.language == "text" and found and not found[-1].output:
            for line in fence.body.splitlines():
                if m := re.fullmatch(r"\(exit (\d+)\)", line):
                    found[-1].code = int(m[1])
                else:
                    found[-1].output.append(line)
    return found


UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
TIME = r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?Z?"
DECIMAL = r"[+-]?\d+\.\d(?= |$) *"  # an age or a rate, and the spaces that pad its column


def matcher(expected: str) -> re.Pattern[str]:
    """`expected` with its ids, times and one-decimal numbers as patterns, the rest as written."""
    volatile = {UUID: UUID, TIME: TIME, DECIMAL: r"[+-]?\d+\.\d *"}
    parts = re.split(f"({UUID}|{TIME}|{DECIMAL})", expected)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(re.escape(part))
        else:
            out.append(next(p for k, p in volatile.items() if re.fullmatch(k, part)))
    return re.compile("".join(out))


def same_lines(actual: list[str], expected: list[str], command: str) -> None:
    assert len(actual) == len(expected), (command, actual, expected)
    for a, e in zip(actual, expected, strict=True):
        assert matcher(e).fullmatch(a), f"$ {command}\n  printed: {a!r}\n  docs:    {e!r}"


class Typist:
    """Runs transcript lines in a shell in `cwd`, each at least 1 s after the one before started."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd, self.last = env, cwd, 0.0

    def _pace(self) -> None:
        time.sleep(max(0.0, self.last + 1.0 - time.monotonic()))
        self.last = time.monotonic()

    def run(self, command: Command) -> None:
        self._pace()
        done = subprocess.run(["bash", "-c", command.line], cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120)
        assert done.returncode == command.code, (command.line, done.returncode, done.stdout)
        same_lines(done.stdout.splitlines(), command.output, command.line)

    def watch(self, command: Command) -> None:
        """A `--watch` command: its first refresh, then Ctrl-C (exit code 0). The page shows a
        moment of a busier queue: its time line and header are compared, and its row by queue and
        number of columns."""
        self._pace()
        proc = subprocess.Popen(["bash", "-c", "exec " + command.line], cwd=self.cwd, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        try:
            printed = [proc.stdout.readline().rstrip("\n") for _ in command.output]
            proc.send_signal(signal.SIGINT)
            rest, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == command.code == 0 and not err and not rest.strip(), (proc.returncode, rest, err)
        same_lines(printed[:2], command.output[:2], command.line)
        for a, e in zip(printed[2:], command.output[2:], strict=True):
            assert a.split()[0] == e.split()[0] and len(a.split()) == len(e.split()), (a, e)


def run_operations(typist: Typist) -> None:
    """Every command of `## Operations` in order but the first, `sqlqueue dev-db`, which runs
    until Ctrl-C (tests/test_dev_db.py runs it). The dotted-names command shows what happens
    "when the schema exists": the test makes schema "Shop" before it, as its paragraph says."""
    dev_db, *rest = transcripts()
    assert dev_db.line == "sqlqueue dev-db" and rest[0].line == "sqlqueue create-queue Sales --delayed"
    assert any(c.line == "sqlqueue peek Shop.Web" for c in rest) and "--watch" in rest[-1].line
    for command in rest:
        if command.line == "sqlqueue peek Shop.Web":
            with psycopg.connect(typist.env["SQLQUEUE_URL"], autocommit=True) as c:
                c.execute('CREATE SCHEMA "Shop"')
        (typist.watch if "--watch" in command.line else typist.run)(command)


# ### Metrics for Prometheus

def serve_and_stop(line: str, typist: Typist) -> None:
    """Start a `--listen` line, scrape its /metrics once (up 1, the transcript's queues there),
    SIGTERM it: exit code 0, nothing printed but its `serving` line."""
    proc = subprocess.Popen(["bash", "-c", "exec " + line], cwd=typist.cwd, env=typist.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        serving = proc.stdout.readline()
        m = re.fullmatch(r"serving http://(\S+):(\d+)/metrics\n", serving)
        assert m and m[2] != "0", (serving, proc.poll())
        with urllib.request.urlopen(f"http://127.0.0.1:{m[2]}/metrics", timeout=60) as response:
            samples = parse(response.read().decode())
        assert value(samples, "sqlqueue_up") == 1, samples
        assert value(samples, "sqlqueue_queue_messages", queue='"public"."Billing"') == 4  # the transcript's
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out == "" and err == "", (line, proc.returncode, out, err)


def run_metrics(typist: Typist, tmp_path: Path) -> None:
    [(language, block)] = blocks(section("operations/metrics.md", "Metrics for Prometheus"))[:1]
    assert language == "bash"
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    block = substitute(block, {":9188": ":0", "/var/lib/node_exporter/textfile/": f"{textfile}/"})
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[0].startswith("pip install 'spark-qtransport[metrics]'")
    import prometheus_client  # noqa: F401 - what that line installs

    for line in lines[1:]:
        if "--listen" in line:
            serve_and_stop(line, typist)
        else:
            assert "--once >" in line, line
            done = subprocess.run(["bash", "-c", line], cwd=typist.cwd, env=typist.env, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done
            [prom] = textfile.iterdir()
            samples = parse(prom.read_text(encoding="utf-8"))
            assert value(samples, "sqlqueue_up") == 1
            assert value(samples, "sqlqueue_queue_messages", queue='"public"."Billing"') == 4
            assert '"public"."Sales"' in {dict(k)["queue"] for k in samples["sqlqueue_queue_messages"]}


def test_operations_then_metrics_run_as_written(pg_url: str, tmp_path: Path) -> None:
    """`## Operations`' transcripts, then `### Metrics for Prometheus` on what they left: Sales,
    Billing (4 messages) and error."""
    typist = Typist(shell_env(database(pg_url, "operations")), tmp_path)
    run_operations(typist)
    run_metrics(typist, tmp_path)


# ## Jobs (spark-submit) and Delta

#: bash on a block, in a directory, started from a Python child so that `processes.Job` tags (and can
#: kill) every process the block starts; the test session's Spark settings are not the reader's
BASH = ("import os, sys\n"
        "for k in ('PYSPARK_PYTHON', 'PYSPARK_DRIVER_PYTHON', 'VIRTUAL_ENV', 'PYTHONPATH'): os.environ.pop(k, None)\n"
        "os.chdir(sys.argv[2])\n"
        "os.execvp('bash', ['bash', '-e', '-c', sys.argv[1]])\n")


def delta_rows(table: Path) -> list[str]:
    """message_id of every row of the Delta table: the parquet files its log adds and keeps."""
    import pyarrow.parquet as pq

    files: dict[str, None] = {}  # in the order added
    for version in sorted((table / "_delta_log").glob("*.json")):
        for action in map(json.loads, version.read_text(encoding="utf-8").splitlines()):
            if "add" in action:
                files[action["add"]["path"]] = None
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
    return [m for path in files for m in pq.read_table(table / unquote(path), columns=["message_id"])
            .column("message_id").to_pylist()]


def test_the_permissions_dba_block_runs_as_written(pg_url: str, tmp_path: Path) -> None:
    """`## Permissions`: the DBA's commands, in order, as an owner; "run what it prints" is run (as
    the DBA would, with psql; here through psycopg). The role then holds exactly the privileges of
    the section's table. The role's name gets a suffix: roles are the server's, not a database's."""
    url = database(pg_url, "permissions")
    env = shell_env(url)
    role = f"app_role_{uuid.uuid4().hex[:8]}"
    (dba,) = [body for language, body in blocks(section("operations/permissions.md", "Permissions")) if body.startswith("sqlqueue create-queue")]
    dba = substitute(dba, {"app_role": role})
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{role}" NOLOGIN')
    try:
        for line in dba.splitlines():
            command, _, comment = line.partition("#")
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, (line, done.stdout, done.stderr)
            if "run what it prints" in comment:
                with psycopg.connect(url, autocommit=True) as c:
                    c.execute(done.stdout)
        table = section("operations/permissions.md", "Permissions").split("| endpoint | table | privileges |", 1)[1]
        assert "| | `<queue>.Claims` | `SELECT, INSERT, UPDATE, DELETE` |" in table
        dml, write, read = ("SELECT, INSERT, UPDATE, DELETE", "SELECT, INSERT", "SELECT")
        expected = {"Sales": dml, "Sales.Claims": dml, "Sales.Delayed": dml, "Sales.Staging": dml, "Sales.Outbox": dml,
                    "error": write, "Billing": write, "SubscriptionRouting": read,
                    "SqlQueue.Batches": "SELECT, INSERT, UPDATE, DELETE", "SqlQueue.Failed": "SELECT, INSERT, DELETE"}
        with psycopg.connect(url) as c:
            for name, privileges in expected.items():
                held = [p for p in ("SELECT", "INSERT", "UPDATE", "DELETE") if c.execute(
                    "SELECT has_table_privilege(%s, %s, %s)", (role, f'"public"."{name}"', p)).fetchone()[0]]
                assert ", ".join(held) == privileges, (name, held)
            columns = [r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE"
                                               " table_name = 'Sales.Claims' ORDER BY ordinal_position")]
        assert columns[-1] == "claimed_at"  # the claim table as this version makes it: no failed column
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'DROP OWNED BY "{role}"')
            c.execute(f'DROP ROLE "{role}"')


@pytest.mark.slow(reason="spark-submit starts a JVM of its own, as the page writes it")
@pytest.mark.usefixtures("delta")
def test_the_spark_submit_job_runs_as_written(pg_url: str, tmp_path: Path) -> None:
    jobs = section("jobs.md", "Running a job with spark-submit")
    [(language, block)] = [b for b in blocks(jobs) if "spark-submit" in b[1]]
    assert language == "bash"
    # the queues the paragraph before the block says the job needs, made as it says
    paragraph = jobs[:jobs.index("```bash\n" + block)].rstrip().rsplit("\n\n", 1)[-1]
    queues = re.search(r"`(sqlqueue create-queue [^`]+)`", paragraph)
    assert queues is not None, "docs/jobs.md no longer says which queues the spark-submit job needs"
    table, checkpoint = tmp_path / "bronze" / "sales", tmp_path / "checkpoints" / "sales-bronze"
    block = substitute(block, {"/tmp/bronze/sales": str(table), "/tmp/checkpoints/sales-bronze": str(checkpoint)})
    url = database(pg_url, "jobs")
    env = shell_env(url)
    setup = queues[1] + "\n" + "".join(
        f"sqlqueue send Sales --endpoint Web --type T --body x{i}\n" for i in range(3))
    subprocess.run(["bash", "-e", "-c", setup], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    peeked = subprocess.run(["bash", "-c", "sqlqueue peek Sales --json"], cwd=tmp_path, env=env, check=True,
                            capture_output=True, text=True, timeout=120)
    sent = sorted(m["message_id"] for m in json.loads(peeked.stdout))
    assert len(sent) == 3

    log = tmp_path / "job.log"
    # `python -c BASH block ROOT`: Job runs its script argument with the test's python
    job = Job(Path("-c"), [BASH, block, str(ROOT)], log=log, env={"SQLQUEUE_URL": url, "SPARK_LOCAL_IP": "127.0.0.1"})
    try:
        code = job.wait(600)
    finally:
        if job.processes():
            job.kill()
    printed = log.read_text(errors="replace")
    assert code == 0, printed[-3000:]
    done = re.search(r"^done: 3 messages in \d+ micro-batch(es)?, .*\n", printed, flags=re.M)
    assert done, printed[-3000:]
    assert sorted(delta_rows(table)) == sent
    after = printed[done.end():]
    # the summary is the job's last word: under spark-submit the JVM outlives the job's Python
    # process, so the job stops Spark before it exits (else listeners' last events print py4j stacks)
    assert after == "", after[-3000:]
    from test_docs import spark_noise

    assert not spark_noise(printed), printed[:3000]  # conf/local: no resolver listing (55 lines with conf/)
