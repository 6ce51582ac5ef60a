"""Shared by the jobs: a SparkSession configured from conf/spark-defaults.conf for local runs.

Under spark-submit the session already exists (its configuration comes from the command line and
``--properties-file``), so `session()` only adds what is missing. With plain ``python jobs/x.py``
the defaults file is read here; paths in it are relative to the project and made absolute.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "conf" / "spark-defaults.conf"

#: settings whose values are paths relative to the project
_PATHS = ("spark.jars.ivySettings", "spark.jars.ivy")


def read_conf(path: Path = DEFAULTS) -> dict[str, str]:
    """The settings of a spark-defaults.conf file, with project-relative paths made absolute."""
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
    return conf


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


def delta_conf() -> dict[str, str]:
    """The Delta settings of conf/spark-defaults.conf (for sessions built elsewhere, e.g. tests)."""
    conf = read_conf()
    return {k: conf[k] for k in DELTA_KEYS if k in conf}


def session(app: str, extra: dict[str, str] | None = None) -> Any:
    """The job's SparkSession (Delta enabled), with the ``sqlqueue`` source registered."""
    # Loopback only, and Python workers started with this interpreter (where the package is).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_qtransport import register

    conf = {**read_conf(), **(extra or {})}
    builder = SparkSession.builder.appName(app)
    for key, value in with_cached_jars(conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
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

    The query id comes from `spark_qtransport.spark.writer.streaming_ids`: the local property
    ``sql.streaming.queryId`` of the query's thread on classic Spark; over Spark Connect the
    session's active query (the one named `query_name` when the session runs several)."""
    from spark_qtransport.spark.writer import streaming_ids

    query_id = streaming_ids(batch, query_name)[0] or "no-query"
    (batch.write.format("delta").mode("append").partitionBy(partition)
     .option("txnAppId", f"{job_id}:{query_id}").option("txnVersion", batch_id).save(table))
