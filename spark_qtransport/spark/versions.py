"""What the running pyspark gives a Python data source, found by what it offers (not by its version
number: a vendor's Spark may have more than the open-source release of the same number).

``python -m spark_qtransport.spark.versions`` prints it as JSON: the compatibility runs
(tests/compat/) record it beside each line's results, and the docs' version table is made from them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pyspark

__all__ = ["SparkCapabilities", "capabilities"]


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


if __name__ == "__main__":
    print(json.dumps(capabilities().to_dict()))
