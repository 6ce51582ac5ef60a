"""Spark's Python workers import pyspark from site-packages, not from Spark's zips (test environments).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on every Python worker's
``PYTHONPATH``. A pip-installed pyspark has the same code in site-packages, compiled once; from a
zip nothing is cached, so every worker compiles what it imports: the stream reader's driver-side
runner takes 1.1 s of CPU to start instead of 0.3 s. Spark waits a constant 10 s for a worker it
starts outside its daemon (the driver-side runners of a Python data source) to connect back, and on
two cores shared by three test workers and the jobs they start, interpreters compiling pyspark
missed it ("Python worker failed to connect back", three times in one CI run).

This moves the zips of the running interpreter's pyspark aside (``<name>.unused``): Spark's path then
names files that are not there, and Python finds the same pyspark (and py4j, a dependency of it)
in site-packages. The workers must run this interpreter (``PYSPARK_PYTHON``: the suite and the jobs
set it to ``sys.executable``). Run by ``make setup`` and for each compatibility line's virtualenv
(``tests/compat/run.py``); idempotent. ``--restore`` puts the zips back.
"""

from __future__ import annotations

import sys
from pathlib import Path


def zips() -> list[Path]:
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    return sorted(lib.glob("*.zip")) + sorted(lib.glob("*.zip.unused"))


def main(argv: list[str]) -> int:
    restore = "--restore" in argv
    for path in zips():
        aside = path.name.endswith(".unused")
        if restore and aside:
            path.rename(path.with_name(path.name.removesuffix(".unused")))
        elif not restore and not aside:
            path.rename(path.with_name(path.name + ".unused"))
    import py4j  # noqa: F401 - the zips' py4j must be importable without them
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
