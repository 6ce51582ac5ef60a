"""Shared by the jobs: a SparkSession configured from conf/spark-defaults.conf for local runs.

Under spark-submit the session already exists (its configuration comes from the command line and
``--properties-file``), so `session()` only adds what is missing. With plain ``python jobs/x.py``
the defaults file is read here; paths in it are relative to the project and made absolute, and
the session starts quietly: Delta's jars are fetched once by a child process whose resolver
listing is shown only if it fails, and the JVM's stderr passes a filter that drops the lines it
prints before log4j is configured (conf/log4j2.properties quiets the rest).

Delta's jars are built per Spark line (``io.delta:delta-spark_<line>_2.13``): `read_conf` names
the running pyspark's line in place of the file's, and on a line Delta has no release for yet it
drops the Delta settings, so sessions start without Delta (`delta_available`; the jobs that write
Delta tables end at once with the line of `delta_missing`, `require_delta`).

    python jobs/_spark.py fetch-jars     # fetch the jars of conf/spark-defaults.conf (this pyspark's line) now,
                                         # and write conf/local/spark-defaults.conf (`write_local_conf`);
                                         # --jars-only: the jars only (another line's virtualenv, tests/compat)
    python jobs/_spark.py filter-stderr  # what `quiet_jvm_start` runs
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "conf" / "spark-defaults.conf"

#: settings whose values are paths relative to the project
_PATHS = ("spark.jars.ivySettings", "spark.jars.ivy")


def read_conf(path: Path = DEFAULTS, spark_line: str | None = None) -> dict[str, str]:
    """The settings of a spark-defaults.conf file, with project-relative paths made absolute and
    Delta's jars those of `spark_line` (default: the running pyspark's line; `for_spark_line`)."""
    conf: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition(" ")
                conf[key] = value.strip()
    for key in _PATHS:
        if key in conf and not os.path.isabs(conf[key]):
            conf[key] = str(ROOT / conf[key])
    if "spark.driver.extraJavaOptions" in conf:
        conf["spark.driver.extraJavaOptions"] = conf["spark.driver.extraJavaOptions"].replace(
            "conf/log4j2.properties", str(ROOT / "conf" / "log4j2.properties"))
    return for_spark_line(conf, spark_line or running_spark_line())


#: the Spark lines Delta Lake publishes ``io.delta:delta-spark_<line>_2.13`` for, at the Delta
#: version conf/spark-defaults.conf names (4.4.0: Maven Central has 4.0, 4.1 and 4.2, no 4.3)
DELTA_LINES = ("4.0", "4.1", "4.2")
#: a Delta artifact in ``spark.jars.packages``: its Spark line, Scala version and Delta version
_DELTA_ARTIFACT = re.compile(r"io\.delta:delta-spark_(\d+\.\d+)_(\d+\.\d+):(\S+)")
_DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def running_spark_line() -> str | None:
    """The release line of the pyspark this process imports ("4.1"), None without pyspark."""
    try:
        import pyspark
    except ImportError:
        return None
    return ".".join(pyspark.__version__.split(".")[:2])


def for_spark_line(conf: dict[str, str], line: str | None) -> dict[str, str]:
    """`conf` with its Delta artifact built for Spark `line`; on a line outside `DELTA_LINES`
    without the Delta settings (the artifact, the extension, the catalog, ``spark.databricks.delta.*``),
    so a session starts without Delta instead of failing to resolve jars that do not exist."""
    packages = [p.strip() for p in conf.get("spark.jars.packages", "").split(",") if p.strip()]
    found = [m for m in map(_DELTA_ARTIFACT.fullmatch, packages) if m]
    if line is None or not found:
        return conf
    out = dict(conf)
    if line in DELTA_LINES:
        out["spark.jars.packages"] = ",".join(
            _DELTA_ARTIFACT.sub(lambda m: f"io.delta:delta-spark_{line}_{m[2]}:{m[3]}", p) for p in packages)
        return out
    kept = [p for p in packages if not _DELTA_ARTIFACT.fullmatch(p)]
    if kept:
        out["spark.jars.packages"] = ",".join(kept)
    else:
        del out["spark.jars.packages"]
    extensions = [e.strip() for e in out.pop("spark.sql.extensions", "").split(",")
                  if e.strip() and e.strip() != _DELTA_EXTENSION]
    if extensions:
        out["spark.sql.extensions"] = ",".join(extensions)
    if out.get("spark.sql.catalog.spark_catalog") == _DELTA_CATALOG:
        del out["spark.sql.catalog.spark_catalog"]
    return {k: v for k, v in out.items() if not k.startswith("spark.databricks.delta.")}


def delta_artifact(conf: dict[str, str] | None = None) -> str | None:
    """The Delta artifact in ``spark.jars.packages`` of `conf` (default: `read_conf`), None without."""
    packages = (read_conf() if conf is None else conf).get("spark.jars.packages", "").split(",")
    return next((p.strip() for p in packages if _DELTA_ARTIFACT.fullmatch(p.strip())), None)


def delta_available(line: str | None = None) -> bool:
    """Whether Delta Lake has a release for Spark `line` (default: the running pyspark's)."""
    return (line or running_spark_line()) in DELTA_LINES


def delta_missing(line: str | None = None) -> str:
    """The one line a Delta job ends with on a Spark line Delta has no release for."""
    line = line or running_spark_line() or "?"
    return (f"Delta Lake has no release for Spark {line} yet (io.delta:delta-spark_{line}_2.13); "
            f"run the Delta jobs on Spark {', '.join(DELTA_LINES[:-1])} or {DELTA_LINES[-1]}")


def require_delta() -> None:
    """For the jobs that write Delta tables, first thing: without Delta for the running Spark
    line, end with `delta_missing()` on stderr and exit code 2 (no traceback, nothing started)."""
    if not delta_available():
        print(delta_missing(), file=sys.stderr, flush=True)
        sys.exit(2)


#: settings that make a session Delta-enabled (taken from the defaults file by `delta_conf`)
DELTA_KEYS = ("spark.jars.packages", "spark.jars.ivySettings", "spark.jars.ivy", "spark.sql.extensions",
              "spark.sql.catalog.spark_catalog", "spark.databricks.delta.snapshotPartitions")


def _manifest(conf: dict[str, str]) -> Path | None:
    """Where the jars resolved for these packages are listed once Spark has fetched them."""
    packages, ivy = conf.get("spark.jars.packages"), conf.get("spark.jars.ivy")
    if not packages or not ivy:
        return None
    return Path(ivy) / f"resolved-{hashlib.sha256(packages.encode()).hexdigest()[:16]}.txt"


def with_cached_jars(conf: dict[str, str]) -> dict[str, str]:
    """`conf` with ``spark.jars.packages`` replaced by the jars an earlier run resolved, when all
    of them are still in the cache: no resolver run (10+ s and network) at every start."""
    manifest = _manifest(conf)
    if manifest is None or not manifest.exists():
        return conf
    jars = manifest.read_text().split()
    if not jars or not all(Path(j).exists() for j in jars):
        return conf
    out = {k: v for k, v in conf.items() if k not in ("spark.jars.packages", "spark.jars.ivySettings")}
    out["spark.jars"] = ",".join([*filter(None, conf.get("spark.jars", "").split(",")), *jars])
    return out


def remember_jars(spark: Any, conf: dict[str, str]) -> None:
    """After Spark resolved ``spark.jars.packages``, list the jars it fetched for `with_cached_jars`."""
    manifest = _manifest(conf)
    if manifest is None or manifest.exists():
        return
    cache = str(Path(conf["spark.jars.ivy"]) / "jars")
    jars = [urlparse(j).path for j in spark.sparkContext.getConf().get("spark.jars", "").split(",")]
    jars = [j for j in jars if j.startswith(cache)]
    if jars:
        manifest.write_text("\n".join(jars) + "\n")


#: the settings Spark's resolver reads (passed to the child that fetches the jars)
JAR_KEYS = ("spark.jars.packages", "spark.jars.ivySettings", "spark.jars.ivy", "spark.jars.repositories")


def fetch_jars(conf: dict[str, str]) -> None:
    """Resolve ``spark.jars.packages`` into the Ivy cache once, in a child process, so the session
    starts from the cached jars (`with_cached_jars`). The resolver's listing (a hundred lines on
    the first run) is kept from the console unless the fetch fails: then it ends the error."""
    manifest = _manifest(conf)
    if manifest is None or with_cached_jars(conf) is not conf:
        return
    packages, ivy = conf["spark.jars.packages"], conf["spark.jars.ivy"]
    print(f"fetching {packages} and its dependencies into {ivy} (once) ...", file=sys.stderr, flush=True)
    jar_conf = {k: conf[k] for k in JAR_KEYS if k in conf}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "fetch-jars", json.dumps(jar_conf)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 or not manifest.exists():
        raise RuntimeError(f"could not fetch {packages} into {ivy} (spark.jars.packages in "
                           f"{DEFAULTS.relative_to(ROOT)}); the resolver said:\n"
                           + resolver_problems(done.stdout + done.stderr))


#: what `write_local_conf` writes: conf/spark-defaults.conf with Delta's jars resolved
LOCAL_CONF = ROOT / "conf" / "local" / "spark-defaults.conf"


def write_local_conf(conf: dict[str, str]) -> Path | None:
    """After `fetch_jars`: `LOCAL_CONF`, the settings of `conf` with ``spark.jars.packages``
    replaced by the jars it resolved (`with_cached_jars`) and every path absolute, for scripts run
    with ``SPARK_CONF_DIR=conf/local`` and for ``spark-submit --properties-file``: Delta without
    the resolver's listing (about 55 lines) at every start. None when the jars are not cached."""
    local = with_cached_jars(conf)
    if local is conf and "spark.jars.packages" in conf:
        return None
    local = {k: v for k, v in local.items() if k != "spark.jars.ivy"}
    LOCAL_CONF.parent.mkdir(exist_ok=True)
    width = max(map(len, local)) + 2
    LOCAL_CONF.write_text(
        "# Written by `python jobs/_spark.py fetch-jars` (make setup) for this checkout and this pyspark's\n"
        "# line: conf/spark-defaults.conf with Delta's jars resolved once. Not in git; run it again after\n"
        "# changing conf/spark-defaults.conf or pyspark.\n"
        + "".join(f"{k.ljust(width)}{v}\n" for k, v in local.items()), encoding="utf-8")
    return LOCAL_CONF


def resolver_problems(output: str, limit: int = 60) -> str:
    """What a failed fetch printed that says why: Ivy's problems summary when there is one (the
    modules not found, the URLs tried, the unresolved dependencies), then Spark's exception,
    without Java stack frames, blank lines or the child's Python traceback."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(":: problems summary ::")), 0)
    kept: list[str] = []
    for line in lines[start:]:
        if line.startswith("Traceback (most recent call last):"):
            break
        if line.strip() and not line.lstrip().startswith(("at ", "... ")):
            kept.append(line.rstrip())
    return "\n".join(kept[:limit] or lines[-limit:])


def _fetch_jars_child(jar_conf: dict[str, str]) -> None:
    """The child of `fetch_jars`: a minimal session whose start resolves the packages."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[1]").appName("fetch-jars")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in jar_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        remember_jars(spark, jar_conf)
    finally:
        spark.stop()


#: what the JVM prints on its stderr before log4j is configured and a user needs not see:
#: Spark 4.1+ adds ``--add-modules=jdk.incubator.vector``, and Java warns of it at every start
JVM_NOISE = (b"WARNING: Using incubator modules: ",)


#: sent to a filter (`mute_jvm_stderr`) after Ctrl-C or SIGTERM: it drops everything from then on
MUTE = signal.SIGUSR1


def filter_stderr(source: IO[bytes], sink: IO[bytes]) -> None:
    """Copy `source` to `sink` line by line as it comes, without the `JVM_NOISE` lines, and
    nothing at all after a `MUTE` signal."""
    muted = False

    def mute(signum: int, frame: Any) -> None:
        nonlocal muted
        muted = True

    signal.signal(MUTE, mute)
    for line in source:
        if not muted and not line.startswith(JVM_NOISE):
            sink.write(line)
            sink.flush()


def mute_jvm_stderr() -> None:
    """Nothing more from the JVMs started here, or from their Python workers (`MUTE`): after a
    stop, a cancelled batch's aborted writes and its workers' broken pipes are not news."""
    for filt in _FILTERS:
        try:
            filt.send_signal(MUTE)
        except OSError:  # ended with its JVM
            pass


#: the filters started by `quiet_jvm_start` (each ends by itself when its JVM does)
_FILTERS: list[subprocess.Popen[bytes]] = []


@contextmanager
def quiet_jvm_start() -> Iterator[None]:
    """Give a JVM started in this block (by pyspark, for a SparkSession) a stderr that drops
    `JVM_NOISE`: a `filter_stderr` process between it and this process's stderr. The JVM keeps
    that stderr for its life; everything else it, Spark or the Python workers write passes
    through (errors included). The filter ends when the JVM closes its end."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: the JVM runs already
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        # its own session: a Ctrl-C in the terminal does not end it before the JVM's last words
        filt = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "filter-stderr"],
                                stdin=subprocess.PIPE, stdout=saved, start_new_session=True)
    except OSError:  # no filter: the JVM writes to our stderr as it would anyway
        os.close(saved)
        yield
        return
    assert filt.stdin is not None
    _FILTERS.append(filt)
    os.dup2(filt.stdin.fileno(), 2)  # inherited by the JVM pyspark starts
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        filt.stdin.close()  # the JVM holds the pipe now; without a JVM the filter ends at once


def delta_conf() -> dict[str, str]:
    """The Delta settings of conf/spark-defaults.conf for the running pyspark's line (for sessions
    built elsewhere, e.g. tests); without Delta on that line (`delta_available`), only the jar
    cache's paths."""
    conf = read_conf()
    return {k: conf[k] for k in DELTA_KEYS if k in conf}


def session(app: str, extra: dict[str, str] | None = None) -> Any:
    """The job's SparkSession (Delta enabled where its Spark line has Delta: `delta_available`),
    with the ``sqlqueue`` source registered."""
    # Loopback only, and Python workers started with this interpreter (where the package is).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_qtransport import register

    conf = {**read_conf(), **(extra or {})}
    starts_jvm = not ("PYSPARK_GATEWAY_PORT" in os.environ or "SPARK_REMOTE" in os.environ or "spark.remote" in conf)
    if starts_jvm:
        fetch_jars(conf)
    builder = SparkSession.builder.appName(app)
    for key, value in with_cached_jars(conf).items():
        builder = builder.config(key, value)
    from _stops import STOPS

    with quiet_jvm_start(), STOPS.kept():
        spark = builder.getOrCreate()
    STOPS.started_spark = True  # the job's own Spark: `exit_with` stops it before the job exits
    if not type(spark).__module__.startswith("pyspark.sql.connect"):  # Spark Connect: no sparkContext
        remember_jars(spark, conf)
        spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def append_once(batch: Any, batch_id: int, *, table: str, job_id: str, partition: str = "date",
                query_name: str | None = None) -> None:
    """Append a micro-batch to a Delta table once: ``txnAppId`` = job id + the streaming query's
    id (kept in the checkpoint, so a new checkpoint is never taken for a replay), ``txnVersion`` =
    the batch id (a batch Spark replays after a crash is skipped by Delta).

    The query id comes from `spark_qtransport.streaming_ids`: the local property
    ``sql.streaming.queryId`` of the query's thread on classic Spark; over Spark Connect the
    session's active query (the one named `query_name` when the session runs several)."""
    from spark_qtransport import streaming_ids

    query_id = streaming_ids(batch, query_name)[0] or "no-query"
    (batch.write.format("delta").mode("append").partitionBy(partition)
     .option("txnAppId", f"{job_id}:{query_id}").option("txnVersion", batch_id).save(table))


if __name__ == "__main__":
    if sys.argv[1:2] == ["filter-stderr"]:
        try:
            filter_stderr(sys.stdin.buffer, sys.stdout.buffer)
        except BrokenPipeError:  # our stderr's reader is gone: nothing more to show
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    elif sys.argv[1:] in (["fetch-jars"], ["fetch-jars", "--jars-only"]):
        try:
            fetch_jars(read_conf())
        except RuntimeError as e:
            sys.exit(str(e))
        if "--jars-only" not in sys.argv:  # another line's virtualenv (tests/compat) leaves the checkout's conf alone
            write_local_conf(read_conf())
    elif sys.argv[1:2] == ["fetch-jars"] and len(sys.argv) == 3:  # the child of `fetch_jars`
        _fetch_jars_child(json.loads(sys.argv[2]))
    else:
        sys.exit(f"usage: {sys.argv[0]} fetch-jars [--jars-only] | filter-stderr")
