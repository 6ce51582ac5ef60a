"""What the running pyspark gives a Python data source, found by what it offers (not by its version
number: a vendor's Spark may have more than the open-source release of the same number).

``python -m spark_qtransport.spark.versions`` prints it as JSON: the compatibility runs
(tests/compat/) record it beside each line's results, and the docs' version table is made from them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pyspark

__all__ = ["SparkCapabilities", "capabilities", "classpath_problem"]


@dataclass(frozen=True)
class SparkCapabilities:
    #: pyspark's version, e.g. "4.0.5"
    version: str
    #: latestOffset(start, limit), ReadMaxRows/ReadMinRows, reportLatestOffset (pyspark >= 4.2)
    admission_control: bool
    #: read() may yield Arrow record batches (pyspark >= 4.2)
    arrow_reads: bool
    #: Arrow stream and batch writers (pyspark >= 4.1)
    arrow_writes: bool

    @property
    def line(self) -> str:
        """The release line, "4.0"."""
        return ".".join(self.version.split(".")[:2])

    @property
    def available_now(self) -> str:
        """How ``Trigger.AvailableNow`` runs: Spark's own multi-batch run with admission control;
        without it Spark runs one batch, and the source makes the first batch of each run take
        every message waiting at its start."""
        return "native" if self.admission_control else "one batch"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "line": self.line, "available_now": self.available_now}


def capabilities() -> SparkCapabilities:
    from .reader import HAS_ADMISSION_CONTROL
    from .schema import ARROW_READS
    from .writer import ARROW_WRITES

    return SparkCapabilities(pyspark.__version__, HAS_ADMISSION_CONTROL, ARROW_READS, ARROW_WRITES)


def classpath_problem(spark: object) -> str | None:
    """Why Spark cannot list its data sources, on a classic session: a jar on its classpath built
    for another Spark line (Delta for 4.0 in Spark 4.2) fails Java's ServiceLoader, and Spark then
    says a new data source "already exists". The failing provider's line; None when the lookup
    works, or over Spark Connect (no JVM here)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return None
    try:
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            "sqlqueue", spark._jsparkSession.sessionState().conf())  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - py4j's error: its first Java line says why
        for line in str(exc).splitlines():
            if "ServiceConfigurationError" in line:
                return line.split("ServiceConfigurationError:", 1)[1].strip()
        return None
    return None


if __name__ == "__main__":
    print(json.dumps(capabilities().to_dict()))
