"""The package builds as a wheel that carries the package and nothing else (as CI publishes it)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow(reason="builds the wheel in an isolated build environment (pip installs the build backend)")
def test_wheel_builds_with_the_package_only(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("spark_qtransport-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "spark_qtransport/__init__.py" in names and "spark_qtransport/py.typed" in names
    for room in ("spark/reader.py", "transport/receiving/forward.py", "dialects/base/receive.py",
                 "dialects/postgres/receive.py", "dialects/sqlserver/receive.py", "cli/app.py", "cli/embedded.py"):
        assert f"spark_qtransport/{room}" in names, names
    assert not [n for n in names if n.startswith(("tests/", "jobs/", "bench/"))]
    metadata = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    # pyspark comes with the user's Spark: an extra, never a requirement
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist: pyspark")]
    assert requires and all("extra ==" in line for line in requires)
