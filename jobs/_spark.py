"""Shared by the jobs: a SparkSession configured from conf/spark-defaults.conf for local runs.

Under spark-submit the session already exists (and its configuration comes from the command
line), so `session()` only adds what is missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "conf" / "spark-defaults.conf"


def read_conf(path: Path = DEFAULTS) -> dict[str, str]:
    conf: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition(" ")
                conf[key] = value.strip()
    return conf


def session(app: str) -> Any:
    # Loopback only, and Python workers started with this interpreter (where the package is).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_qtransport import register

    builder = SparkSession.builder.appName(app)
    for key, value in read_conf().items():
        if key == "spark.driver.extraJavaOptions":
            value = value.replace("conf/log4j2.properties", str(ROOT / "conf" / "log4j2.properties"))
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
