"""One local Spark Connect server (pyspark's own ``SparkConnectServer``, with the jobs' Delta jars)
for the whole test session, in its own process, and a Connect client session on it: fixtures
`connect_url`, `connect_session` and `connect`, shared by every test file through conftest.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_qtransport import register

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Spark Connect server (with Delta), started once per test session."""
    import pyspark

    sys.path.insert(0, str(JOBS))
    import _spark

    home = Path(pyspark.__file__).parent
    port = _free_port()
    conf = {
        **_spark.with_cached_jars(_spark.delta_conf()),
        "spark.master": "local[2]",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.pollingDelay": "10ms",
        "spark.sql.streaming.noDataProgressEventInterval": "0",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={ROOT / 'conf' / 'log4j2.properties'}",
    }
    args = [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    args.append("spark-internal")
    # the server's Python workers: this interpreter (the package is installed in it), and the jobs'
    # and tests' modules (foreachBatch functions are pickled with references to their functions)
    path = [str(JOBS), str(ROOT / "tests"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "SPARK_HOME": str(home),
           "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    log = tmp_path_factory.mktemp("connect") / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"Spark Connect server exited: {log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Spark Connect server did not start: {log.read_text()[-3000:]}") from None
                time.sleep(0.25)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()  # the JVM stops its Python workers on the way out
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="session")
def connect_session(connect_url: str, spark: Any) -> Iterator[Any]:
    """The Connect client's session. The classic test session (`spark`) starts first: once the
    client's gRPC threads run, this process forking to launch a JVM (pyspark's gateway, through
    Popen with a preexec_fn) can lose the child, which then never reports its port
    (JAVA_GATEWAY_EXITED; seen once in the compatibility run, where Connect's tests come first)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    session = RemoteSparkSession.builder.remote(connect_url).create()
    register(session)
    yield session
    session.stop()


@pytest.fixture
def connect(connect_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The Connect session; pyspark's functions build Connect columns while a test runs (this
    process may also hold the classic test session)."""
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return connect_session
