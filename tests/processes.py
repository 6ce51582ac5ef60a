"""Child processes for crash tests: start a job tagged by environment, SIGKILL all of it.

pyspark.daemon moves Python workers into their own process group, so every process a job
started (driver, JVM, workers) is found by an environment tag, not by its group.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
#: seconds a child job may take to reach a point it is waited for (its first batch, a stall): a bound
#: that tells a hung job from a slow one, not a measure. A busy two-core CI machine, its JVMs
#: starting beside the other test workers', once took over 120 s to a first batch.
START = 300.0


class Job:
    """One run of a child script, tagged so that every process it spawns can be killed."""

    def __init__(self, script: Path, args: list[str], point: str = "", *, log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.tag = uuid.uuid4().hex
        env = {**os.environ, **(env or {}), "CRASH_POINT": point, "SQLQUEUE_CRASH_TAG": self.tag,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.log = log.open("ab")
        self.proc = subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def processes(self) -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("SQLQUEUE_CRASH_TAG") == self.tag:
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def kill(self, *, with_warden: bool = False) -> int:
        """SIGKILL every process of the job, repeatedly until none is left. `with_warden`: its
        streams' wardens too (processes of their own, outside the job: a lost machine takes them)."""
        killed = 0
        for _ in range(20):
            procs = self.processes()
            if with_warden:
                procs += [c for p in procs for c in _children(p) if "receiving.warden" in " ".join(_cmdline(c))]
            if not procs:
                break
            for p in procs:
                try:
                    p.send_signal(signal.SIGKILL)
                    killed += 1
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.1)
        self.proc.wait(30)
        self.log.close()
        return killed

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.close()


def wardens_of_this_process() -> list[psutil.Process]:
    """The wardens of the streams this process runs (a process of their own each, started by a
    stream's source process): what a test kills to play a machine lost with the driver."""
    return [c for c in _children(psutil.Process(os.getpid())) if "receiving.warden" in " ".join(_cmdline(c))]


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def wait_for(cond: Callable[[], bool], timeout: float, what: str, job: Job) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if job.proc.poll() is not None:
            raise AssertionError(f"job exited (code {job.proc.returncode}) before {what}; see {job.log.name}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def kill_at_random(script: Path, args: list[str], produce: Callable[[], None], *, log: Path, markers: Path,
                   times: int = 2, window: tuple[float, float] = (0.2, 2.0)) -> list[str]:
    """`times` rounds of: produce, start the job, let it run a random while once it has run a
    batch (markers/batch-*), SIGKILL all of it. The seed is SQLQUEUE_CRASH_SEED (printed)."""
    seed = int(os.environ.get("SQLQUEUE_CRASH_SEED", "20261122"))
    print(f"random kills: SQLQUEUE_CRASH_SEED={seed}")
    rnd = random.Random(seed)
    kills = []
    for _ in range(times):
        produce()
        job = Job(script, args, log=log)
        wait_for(lambda: any(markers.glob("batch-*")), START, "the job to run", job)
        time.sleep(rnd.uniform(*window))
        job.kill()
        kills.append("random")
    return kills


def run_to_end(script: Path, args: list[str], *, log: Path, env: dict[str, str] | None = None,
               runs: int | None = None) -> None:
    """Run the job with Trigger.AvailableNow (its last argument) until it finishes, cleanly. On Spark
    4.0/4.1 AvailableNow is one batch, and a run that finds an uncommitted batch (a killed run's)
    replays only that one: a second run then drains the rest. `runs`: that many runs instead."""
    from spark_qtransport.spark.versions import capabilities

    for _ in range(runs or (1 if capabilities().admission_control else 2)):
        job = Job(script, [*args, "available-now"], log=log, env=env)
        assert job.wait(300) == 0, log.read_text()[-3000:]


def child_spark() -> Any:
    """The SparkSession of a child job: local[2] on loopback, quiet, sqlqueue registered.
    SQLQUEUE_CHILD_MASTER sets another master (``local[2,8]``: a failed task is tried up to 8 times,
    as on a cluster)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_qtransport import register

    spark = (
        SparkSession.builder.master(os.environ.get("SQLQUEUE_CHILD_MASTER", "local[2]"))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
