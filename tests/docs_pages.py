"""The documentation's pages as tests read them: a page, the section under one of its headings,
and the fenced blocks of a text, in the order written."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of docs/<name>, as written (option placeholders and all)."""
    return (DOCS / name).read_text(encoding="utf-8")


def section(name: str, title: str) -> str:
    """The text under the heading `title` (any level) of docs/<name>, up to the next heading of the
    same or a higher level; lines inside code fences are never headings."""
    lines = page(name).splitlines()
    fenced, start, level = False, -1, 0
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"(#+) (.*)$", line)
        if heading is None:
            continue
        if start < 0 and heading[2] == title:
            start, level = i + 1, len(heading[1])
        elif start >= 0 and len(heading[1]) <= level:
            return "\n".join(lines[start:i]) + "\n"
    assert start >= 0, f"docs/{name} has no heading {title!r}"
    return "\n".join(lines[start:]) + "\n"


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block in `text`, in order; language "" for a bare fence.
    A block's attributes (```python title="..."```) are not part of either."""
    return re.findall(r"^```(\w*)[^\n]*\n(.*?)^```$", text, flags=re.S | re.M)


@dataclass(frozen=True)
class Fence:
    """One fenced block of a page: its language, its attributes (``title="not run: ..."``), its body."""

    page: str
    language: str
    attributes: str
    body: str

    @property
    def first_line(self) -> str:
        return self.body.splitlines()[0] if self.body else ""

    @property
    def title(self) -> str | None:
        found = re.search(r'title="([^"]*)"', self.attributes)
        return found[1] if found else None


def fences(name: str) -> list[Fence]:
    """Every fenced block of docs/<name>, in order."""
    found = re.findall(r"^```(\w*)([^\n]*)\n(.*?)^```$", page(name), flags=re.S | re.M)
    return [Fence(name, language, attributes.strip(), body) for language, attributes, body in found]


#: the tests that run most of the blocks
_QUICK_START = "test_docs.py::test_the_quick_start_and_sending_run_as_written"
_OPERATIONS = "test_docs_shell.py::test_operations_then_metrics_run_as_written"

#: the blocks the tests run, as written (page, how the block's first line starts) -> the test that runs it; every
#: other block of the site says, in its title, that it is not run and why (``title="not run: ..."``),
#: or that it is what a run prints (``title="printed: ..."``)
RUN_BY: dict[tuple[str, str], str] = {
    ("index.md", "from spark_qtransport import register"): _QUICK_START,
    ("getting-started.md", ".venv/bin/sqlqueue dev-db"): "test_dev_db.py::test_dev_db_serves_until_interrupted",
    ("getting-started.md", ". .venv/bin/activate"): _QUICK_START,
    ("getting-started.md", "import os"): _QUICK_START,
    ("reading.md", 'audit = (spark.readStream.format("sqlqueue").option("url", url)'):
        _QUICK_START,
    ("reading.md", 'spark.readStream.format("sqlqueue").option("queue", "Sales")'):
        _QUICK_START,
    ("sending.md", "sqlqueue create-queue Billing Reminders"): _QUICK_START,
    ("sending.md", "from spark_qtransport import publish"): _QUICK_START,
    ("sending.md", "from spark_qtransport import QueueSink"): _QUICK_START,
    ("sending.md", "from pyspark.sql import functions as F"): _QUICK_START,
    ("platform.md", "from pyspark.sql import functions as F"): _QUICK_START,
    ("platform.md", "from spark_qtransport import platform_columns"): _QUICK_START,
    ("operations/cli.md", "$ sqlqueue dev-db"): _OPERATIONS,
    ("operations/cli.md", "$ sqlqueue create-queue Sales --delayed"): _OPERATIONS,
    ("operations/cli.md", "$ sqlqueue peek Shop.Web"): _OPERATIONS,
    ("operations/cli.md", "$ sqlqueue stats Billing --watch 2"): _OPERATIONS,
    ("operations/metrics.md", "pip install 'spark-qtransport[metrics]'"): _OPERATIONS,
    ("operations/permissions.md", "sqlqueue create-queue Sales error"): "test_docs_shell.py::test_the_permissions_dba_block_runs_as_written",
    ("jobs.md", ". .venv/bin/activate"): "test_docs_shell.py::test_the_spark_submit_job_runs_as_written",
}


def bodies(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks in `text` written in `language`, in order."""
    return [body for lang, body in blocks(text) if lang == language]


def run_by(fence: Fence) -> str | None:
    """The test that runs `fence` as written (`RUN_BY`), or None."""
    return next((test for (name, start), test in RUN_BY.items()
                 if name == fence.page and fence.first_line.startswith(start)), None)
