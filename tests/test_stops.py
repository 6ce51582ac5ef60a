"""Ctrl-C and SIGTERM of the jobs and the demo, as a terminal and a scheduler send them.

A terminal's Ctrl-C goes to the whole foreground process group (the Python driver and the JVM it
started); a scheduler's SIGTERM (Databricks, Kubernetes, systemd) to the main process. Either way
the job prints at most 5 lines from the signal on, the run's summary among them, exits with
130 (SIGINT) or 143 (SIGTERM), its JVM is gone within 10 s, and a rerun loses and duplicates
nothing. Each case is a real process started as spark-submit would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from faultproxy import FaultProxy

from backends import Backend, nsb_headers, server_of_its_own
from processes import ROOT

JOBS = ROOT / "jobs"

pytestmark = pytest.mark.slow(reason="each case is a job process (its own JVM) stopped by a signal, then run again")


@dataclass
class Stopped:
    code: int
    before: list[str]  # the lines printed before the signal
    after: list[str]  # the lines printed from the signal on
    jvm_seconds: float  # from the driver's exit until its JVM was gone
    left: list[str]  # processes of the job still alive 10 s after the signal (their command lines)


def interrupt(script: Path, args: list[str], signum: int, *, ready: str | float, log: Path,
              timeout: float = 240, then: float = 0.0, at_ready: Callable[[psutil.Process], None] | None = None,
              at_signal: Callable[[], None] | None = None) -> Stopped:
    """Start `script`, wait for a line containing `ready` (or `ready` seconds), call `at_ready` (with
    the job's process), wait
    `then` seconds more, send `signum` (SIGINT: to the process group, as a terminal's Ctrl-C;
    SIGTERM: to the driver), call `at_signal`, and wait for it to end."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SQLQUEUE_URL", None)
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        if isinstance(ready, float):
            time.sleep(ready)
        while isinstance(ready, str) and ready not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"the job ended before {ready!r}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {ready!r} in {timeout} s: {log.read_text()[-3000:]}"
            time.sleep(0.1)
        if at_ready is not None:
            at_ready(psutil.Process(proc.pid))
        time.sleep(then)
        # every process the job started, wherever it went (pyspark.daemon's workers move to process
        # groups of their own, a stream's warden to a session of its own)
        everything = psutil.Process(proc.pid).children(recursive=True)
        jvms = [p for p in everything if _is_java(p)]
        before = log.read_text(errors="replace").splitlines()
        signalled = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        if at_signal is not None:
            at_signal()
        code = proc.wait(120)
        exited = time.monotonic()
        _, alive = psutil.wait_procs(jvms, timeout=15)
        jvm_seconds = time.monotonic() - exited if not alive else float("inf")
        _, alive = psutil.wait_procs(everything, timeout=max(0.0, signalled + 10 - time.monotonic()))
        # a zombie has ended (no memory, connection or lock): it waits for whoever adopted it (here
        # the machine's init, which reaps orphans lazily) to read its exit status
        left = [" ".join(_cmdline(p)) or str(p.pid) for p in alive if not _ended(p)]
        lines = log.read_text(errors="replace").splitlines()
        return Stopped(code, before, lines[len(before):], jvm_seconds, left)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and os.getpgid(p.pid) == proc.pid:
                    p.kill()
            except (psutil.Error, ProcessLookupError):
                pass


def quiet(stopped: Stopped, signum: int) -> None:
    shown = "\n".join(stopped.after)
    assert stopped.code == 128 + signum, f"exit code {stopped.code}:\n{shown[-3000:]}"
    assert len(stopped.after) <= 5, f"{len(stopped.after)} lines after the signal:\n{shown[-3000:]}"
    assert any(line.startswith("stopped") for line in stopped.after), shown
    assert stopped.jvm_seconds <= 10, f"the JVM outlived the driver by {stopped.jvm_seconds:.1f} s"
    assert not stopped.left, f"{len(stopped.left)} process(es) of the job alive 10 s after the signal: {stopped.left}"


def _ended(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _is_java(p: psutil.Process) -> bool:
    """Whether `p` is a JVM; a child that ended between the listing and this look is not one to wait for."""
    try:
        return "java" in p.name()
    except psutil.NoSuchProcess:
        return False


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def produce(pg: Backend, queue: str, ids: range) -> None:
    pg.send_many(queue, [(nsb_headers(f"order-{i:05d}"), json.dumps({"OrderId": i, "Amount": 5, "Customer": "c"}).encode())
                         for i in ids])


#: the other signal of the endpoint job runs in `make chaos` (tests/chaos/test_stops_other_signal.py)
ENDPOINT_SIGNAL = signal.SIGTERM


def queue_to_delta_stops_quietly_and_loses_nothing(spark: Any, pg: Backend, names: Any, tmp_path: Path,
                                                   signum: int) -> None:
    """queue_to_delta.py stopped between two short batches, then run again: `make chaos` runs it with
    either signal (tests/chaos/test_stops_other_signal.py); `make test` stops that job in the middle
    of a long batch instead (the next test), a stop the between-batches case adds nothing to."""
    q, e = pg.create_queue(names("Stop")), pg.create_queue(names("error"))
    table, ckpt = tmp_path / "bronze", tmp_path / "ckpt"
    args = ["--url", pg.url, "--queue", q, "--error-queue", e, "--table", str(table), "--checkpoint", str(ckpt),
            "--max-messages", "50", "--job-id", f"stop-{uuid.uuid4().hex[:6]}"]
    produce(pg, q, range(0, 2000))
    stopped = interrupt(JOBS / "queue_to_delta.py", [*args, "--trigger", "100ms"], signum, ready="batch 1:",
                        log=tmp_path / "job.log")
    quiet(stopped, signum)
    again = subprocess.run([sys.executable, str(JOBS / "queue_to_delta.py"), *args, "--trigger", "available-now",
                            "--max-messages", "5000"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    bronze = spark.read.format("delta").load(str(table))
    assert bronze.count() == bronze.select("message_id").distinct().count() == 2000


@pytest.fixture
def ppg() -> Iterator[Backend]:
    """A server of the test's own that allows prepared transactions: streams hold their claims there."""
    for server in server_of_its_own(max_prepared_transactions="16"):
        yield Backend(server.url)


def produce_fast(pg: Backend, queue: str, count: int) -> None:
    """`count` orders in one statement (NServiceBus's headers, 1 KB bodies): a backlog in a second."""
    headers = json.dumps(nsb_headers("MID")).replace('"MID"', '"\' || id || \'"')
    with pg.connect() as c:
        c.execute(f"INSERT INTO {pg.q(queue)} (id, headers, body) SELECT id, '{headers}', "
                  "convert_to(rpad('{\"OrderId\": ' || n || ', \"Pad\": \"', 1020, 'x') || '\"}', 'UTF8') "
                  "FROM (SELECT gen_random_uuid() AS id, n FROM generate_series(1, %s) AS n ORDER BY n) AS m",
                  (count,))


@pytest.mark.usefixtures("delta")
def test_ctrl_c_during_a_long_batch_leaves_no_process(spark: Any, ppg: Backend, names: Any, tmp_path: Path) -> None:
    """Ctrl-C 1 s into a batch that would take half a minute (9,000 messages read over a link slowed to
    200 KB/s after the first batch; connections made after the signal, the warden's, at full
    speed), claims held by prepared transactions: the few lines, exit 130, and 10 s later no
    process of the job is left, its warden included (a Python worker would hold a connection and
    the endpoint's consumer lock). Before, the job waited up to 120 s for the batch to end. A rerun
    at full speed loses and duplicates nothing."""
    pg, count = ppg, 10_000
    q, e = pg.create_queue(names("Stop")), pg.create_queue(names("error"))
    table, ckpt = tmp_path / "bronze", tmp_path / "ckpt"
    link = FaultProxy(pg.url)
    try:
        args = ["--url", link.url, "--queue", q, "--error-queue", e, "--table", str(table), "--checkpoint",
                str(ckpt), "--job-id", f"stop-{uuid.uuid4().hex[:6]}", "--max-messages", str(count)]
        produce_fast(pg, q, count)
        stopped = interrupt(JOBS / "queue_to_delta.py", [*args, "--trigger", "100ms"], signal.SIGINT,
                            ready="batch 0:", at_ready=lambda _: link.throttle(200_000), then=1.0, at_signal=link.spare_new,
                            log=tmp_path / "job.log")
        link.throttle(None)
        quiet(stopped, signal.SIGINT)
        assert not any(line.startswith("batch 1:") for line in stopped.after), "\n".join(stopped.after)
        again = subprocess.run([sys.executable, str(JOBS / "queue_to_delta.py"), *args, "--trigger", "available-now"],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        link.close()
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    bronze = spark.read.format("delta").load(str(table))
    assert bronze.count() == bronze.select("message_id").distinct().count() == count


def test_a_batch_that_never_returns_still_ends_the_job_within_10_seconds(pg: Backend, names: Any,
                                                                           tmp_path: Path) -> None:
    """Ctrl-C while a foreachBatch function is stuck in Python (Spark's cancel cannot interrupt it,
    and `query.stop()` waits for it): the job ends at its bound (`HARD_STOP`, 7 s after the signal),
    its JVM killed, no process left 10 s after the signal, exit 130. Before, the job waited for
    the function. The stuck batch's messages stay claimed for the next run (a kill's case)."""
    q, e = pg.create_queue(names("Stuck")), pg.create_queue(names("error"))
    produce(pg, q, range(20))
    stopped = interrupt(ROOT / "tests" / "stuck_batch_job.py", [pg.url, q, e, str(tmp_path / "ckpt")], signal.SIGINT,
                        ready="handled forever", then=0.5, log=tmp_path / "job.log")
    quiet(stopped, signal.SIGINT)
    assert any("did not stop within 7 s" in line for line in stopped.after), stopped.after
    assert pg.count(q) == 0  # claimed by the stuck batch, delivered again by the next run


def _endpoint_config(pg: Backend, names: Any, tmp_path: Path, trigger: str) -> tuple[Path, str]:
    from spark_qtransport.dialects import dialect_named

    d = dialect_named("postgres")
    sales, e, web = pg.create_queue(names("Sales")), pg.create_queue(names("error")), pg.create_queue(names("Web"))
    subs = names("Subscriptions")
    with pg.connect() as c:
        for stmt in [*d.create_delayed(d.companion(d.parse_address(sales), "Delayed")),
                     *d.create_subscriptions(d.parse_address(subs))]:
            c.execute(stmt.sql, stmt.params)
    pg.send_many(sales, [(nsb_headers(f"o{i}", **{"NServiceBus.ReplyToAddress": web}),
                          json.dumps({"OrderId": i, "Amount": 5.5, "Customer": "c"}).encode()) for i in range(1500)])
    config = tmp_path / "endpoint.toml"
    config.write_text(
        "[endpoint]\n"
        f"queue = {json.dumps(sales)}\nerror_queue = {json.dumps(e)}\ntable = {json.dumps(str(tmp_path / 'sales'))}\n"
        f"checkpoint = {json.dumps(str(tmp_path / 'ckpt'))}\ntrigger = {json.dumps(trigger)}\nreminder_delay = 600\n"
        f"max_messages = 50\nsubscription_table = {json.dumps(subs)}\njob_id = \"endpoint-{uuid.uuid4().hex[:6]}\"\n"
    )
    return config, web


@pytest.mark.usefixtures("delta")
def test_endpoint_job_stops_quietly_and_loses_nothing(spark: Any, pg: Backend, names: Any, tmp_path: Path,
                                                       signum: int = ENDPOINT_SIGNAL) -> None:
    config, web = _endpoint_config(pg, names, tmp_path, "100ms")
    stopped = interrupt(JOBS / "endpoint.py", ["--config", str(config), "--url", pg.url], signum, ready="batch 1:",
                        log=tmp_path / "job.log")
    quiet(stopped, signum)
    config.write_text(config.read_text().replace('trigger = "100ms"', 'trigger = "available-now"')
                      .replace("max_messages = 50", "max_messages = 5000"))
    again = subprocess.run([sys.executable, str(JOBS / "endpoint.py"), "--config", str(config), "--url", pg.url],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    with pg.connect() as c:
        replies = [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.RelatedTo' FROM {pg.q(web)}")]
    assert sorted(replies) == sorted(f"o{i}" for i in range(1500)), "every order answered once"


@pytest.mark.usefixtures("delta")
def test_ctrl_c_while_a_job_starts_is_one_line(pg: Backend, names: Any, tmp_path: Path) -> None:
    config, web = _endpoint_config(pg, names, tmp_path, "100ms")
    stopped = interrupt(JOBS / "endpoint.py", ["--config", str(config), "--url", pg.url], signal.SIGINT,
                        ready=4.0, log=tmp_path / "job.log")  # the JVM is starting
    shown = "\n".join(stopped.after)
    assert stopped.code == 130, shown[-3000:]
    assert len(stopped.after) <= 2, shown[-3000:]
    assert stopped.jvm_seconds <= 10
    assert pg.count(web) == 0


def test_ctrl_c_while_the_jvm_launches_kills_it(pg: Backend, names: Any, tmp_path: Path) -> None:
    """A signal before pyspark has its gateway (it keeps the JVM's process in a local until the
    gateway answers): the JVM is killed with the job, not left to finish its start-up and then see
    its pipe closed (over 10 s on a busy CI machine). Here the launching JVM is frozen (SIGSTOP), so
    it never answers: left alone it would outlive the job for good."""
    config, _ = _endpoint_config(pg, names, tmp_path, "100ms")

    def freeze_the_launching_jvm(job: psutil.Process) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for p in job.children(recursive=True):
                line = _cmdline(p)  # spark-submit's bash, then its launcher's java, then the JVM
                if line and "java" in line[0] and "org.apache.spark.deploy.SparkSubmit" in line[1:] \
                        and "org.apache.spark.launcher.Main" not in line:
                    p.send_signal(signal.SIGSTOP)
                    return
            time.sleep(0.01)
        raise AssertionError("no JVM was launched in 60 s")

    stopped = interrupt(JOBS / "endpoint.py", ["--config", str(config), "--url", pg.url], signal.SIGINT,
                        ready=0.0, at_ready=freeze_the_launching_jvm, log=tmp_path / "job.log")
    shown = "\n".join(stopped.after)
    assert stopped.code == 130, shown[-3000:]
    assert stopped.after == ["stopped (Ctrl-C) while starting: nothing was read"], shown[-3000:]
    assert stopped.jvm_seconds <= 10, "the launching JVM outlived the job"
    assert not stopped.left, stopped.left


@pytest.mark.usefixtures("delta")
def test_ctrl_c_of_the_demo(tmp_path: Path) -> None:
    stopped = interrupt(JOBS / "demo.py", ["--orders", "3000"], signal.SIGINT, ready="PlaceOrder commands",
                        log=tmp_path / "demo.log")
    shown = "\n".join(stopped.after)
    assert stopped.code == 130, shown[-3000:]
    assert len(stopped.after) <= 5, shown[-3000:]
    assert stopped.jvm_seconds <= 10


def test_the_jvm_hanging_up_its_accumulator_connection_at_a_stop_prints_nothing(capsys: Any) -> None:
    """The JVM sends tasks' accumulator updates to the driver's pyspark over one connection, and a
    stop closes it under a running handler (`query.stop()` interrupting the thread that merges
    them): pyspark's server printed an EOFError's 20 lines after a SIGTERM'd endpoint job's
    "stopping" line in CI. Here pyspark's own server (one of its own: a SparkContext's serves one
    connection at a time, its JVM's) and, as the JVM, a socket that authenticates, sends an empty
    update and hangs up: loud before `quiet_accumulators` (the case is real), silent after."""
    import socket
    import struct
    import threading

    from pyspark import accumulators

    sys.path.insert(0, str(JOBS))
    from _stops import quiet_accumulators

    token = uuid.uuid4().hex
    server = accumulators.AccumulatorTCPServer(("127.0.0.1", 0), accumulators.UpdateRequestHandler, token)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def hang_up() -> str:
        with socket.create_connection(server.server_address[:2], timeout=30) as s:
            s.sendall(token.encode() + struct.pack("!i", 0))
            assert s.recv(1) == b"\x01", "the server took the update"
        time.sleep(2.5)  # the handler polls every second, then reads the end of the file
        return capsys.readouterr().err

    try:
        assert "EOFError" in hang_up(), "without it the hang-up prints a traceback"
        quiet_accumulators(server)
        assert hang_up() == ""
    finally:
        server.shutdown()


def test_a_job_whose_exit_hangs_still_exits_within_the_bound(tmp_path: Path) -> None:
    """After a job's work is done and committed, its exit (Spark's stop, an exit hook calling into
    a JVM that is going away) may not hang the process: `exit_within` ends it with the job's exit
    code, one line said. Here an exit hook that never returns stands for the hang (a CI run's
    spark-submit job printed its summary, then stood for ten minutes)."""
    script = tmp_path / "hangs_at_exit.py"
    script.write_text(
        "import atexit, sys, time\n"
        f"sys.path.insert(0, {str(JOBS)!r})\n"
        "from _stops import exit_within\n"
        "atexit.register(time.sleep, 600)\n"
        "print('done: 3 messages', flush=True)\n"
        "exit_within(0, seconds=1.0)\n"
        "sys.exit(0)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30, "the bound did not end the process"
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["done: 3 messages"]
    assert done.stderr.splitlines() == ["Spark did not stop within 1 s of the job's end; exiting"]
