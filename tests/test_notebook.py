"""notebooks/platform_insights.ipynb, run headless as Jupyter runs it: a real kernel (this
interpreter) executes every cell over the audit and failures tables that the real
jobs/audit_to_delta.py wrote from messages in the embedded PostgreSQL, and every plot is saved.
"""

from __future__ import annotations

import json
import re
import struct
import sys
import uuid
from pathlib import Path
from typing import Any

import matplotlib.image
import nbformat
import psutil
import pytest
from nbclient import NotebookClient
from platform_data import generate_platform_tables

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "platform_insights.ipynb"
PLOTS = ("throughput_per_endpoint", "critical_time_percentiles", "processing_time_percentiles",
         "failures_by_exception_type", "failures_by_queue")
KERNEL = "spark-qtransport-test"


def test_notebook_is_committed_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    first = nb.cells[0]
    assert first.cell_type == "code" and "parameters" in first.metadata.get("tags", [])
    assert all(name in first.source for name in ("AUDIT_TABLE", "FAILURES_TABLE", "TIME_BUCKET", "PLOTS_DIR"))
    executed = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert executed == [], f"cells {executed} carry outputs: clear them before committing"


def test_the_docs_list_the_parameters_of_the_first_cell() -> None:
    """docs/notebook.md's table: parameter, environment variable, widget and default, as the first cell has them."""
    first = nbformat.read(NOTEBOOK, as_version=4).cells[0].source
    cell = {m[0]: (m[1], m[2]) for m in re.findall(r'^(\w+) = os\.environ\.get\("(\w+)", "([^"]*)"\)', first, re.M)}
    widgets = re.findall(r'"(\w+)": (\w+)', first.split("_widgets = {", 1)[1].split("}", 1)[0])
    section = (ROOT / "docs" / "notebook.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \| `([^`]*)`", section, re.M)
    assert {r[0]: (r[1], r[3]) for r in rows} == cell
    assert sorted((r[2], r[0]) for r in rows) == sorted(widgets)


def kernelspec(where: Path, tag: str) -> None:
    """A kernel that runs this interpreter (the project's virtualenv), whatever kernels Jupyter has
    installed; its processes (the kernel, its Spark) carry `tag` in their environment."""
    spec = where / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "spark-qtransport tests", "language": "python", "env": {"SQLQUEUE_TEST_KERNEL": tag},
    }))


def outlived(tag: str) -> list[int]:
    """The processes tagged `tag` still running 30 s after the kernel was shut down (killed)."""
    def tagged(p: psutil.Process) -> bool:
        try:
            return p.environ().get("SQLQUEUE_TEST_KERNEL") == tag
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    _, alive = psutil.wait_procs([p for p in psutil.process_iter() if tagged(p)], timeout=30)
    for p in alive:
        p.kill()
    return [p.pid for p in alive]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (after checking the signature)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path.name} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow(reason="a notebook kernel process with its own local Spark")
def test_notebook_plots_the_platform_tables(spark: Any, pg_url: str, names: Any, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    tables = generate_platform_tables(spark, pg_url, names, tmp_path / "platform", n_audit=300, n_failures=60)
    assert tables["audit_count"] == 300 and tables["failures_count"] == 60
    plots = tmp_path / "plots"
    # the parameters' environment variables, as a headless run sets them; the kernel inherits them
    for name, value in {"AUDIT": tables["audit_table"], "FAILURES": tables["failures_table"],
                        "BUCKET": "6 hours", "PLOTS": str(plots), "TOP": "4"}.items():
        monkeypatch.setenv(f"SQLQUEUE_INSIGHTS_{name}", value)

    tag = uuid.uuid4().hex
    kernelspec(tmp_path, tag)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))  # where the client finds it

    nb = nbformat.read(NOTEBOOK, as_version=4)
    try:  # raises CellExecutionError, with the cell and its traceback, if any cell fails
        NotebookClient(nb, kernel_name=KERNEL, timeout=300, startup_timeout=120,
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:
        left = outlived(tag)
    assert left == [], f"processes {left} outlived the kernel's shutdown"

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert [o for o in outputs if o.output_type == "error"] == []
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    # it read the job's tables: every row of each
    assert "audit: 300 messages processed" in text and "failures: 60 messages" in text, text
    assert "nothing to plot" not in text, text
    shown = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(shown) == len(PLOTS), f"{len(shown)} plots shown"
    for name in PLOTS:
        path = plots / f"{name}.png"
        assert path.is_file(), f"{name}.png was not saved"
        width, height = png_size(path)
        assert width >= 400 and height >= 200, (name, width, height)
        pixels = matplotlib.image.imread(path)
        # more than a canvas with a title and a line of text (an empty plot: 0.02, 83 colours)
        colours = len({tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7]})
        assert pixels.std() > 0.05 and colours > 150, (name, pixels.std(), colours)
        assert f"saved {path}" in text
