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
    """One fenced block of a page: its language, its attributes (``title="sales_out.py"``), its body."""

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


#: the pages whose shell and Python blocks a reader runs in order, in the checkout after `sqlqueue
#: dev-db`: `test_docs.py::test_a_page_runs_as_written` runs each so, on a database of its own (its
#: Python blocks saved under their titles first, as the shell blocks run them by name)
SCRIPT_PAGES = ("index.md", "getting-started.md", "reading.md", "sending.md", "platform.md")
_PAGE_RUN = "test_docs.py::test_a_page_runs_as_written"
_OPERATIONS = "test_docs_shell.py::test_operations_then_metrics_run_as_written"

#: other blocks the tests run, as written (page, how the block's first line starts) -> the test that runs it
RUN_BY: dict[tuple[str, str], str] = {
    ("getting-started.md", ".venv/bin/sqlqueue dev-db"): "test_dev_db.py::test_dev_db_serves_until_interrupted",
    ("operations/cli.md", "sqlqueue "): _OPERATIONS,  # each command, its output the `text` block after it
    ("operations/metrics.md", "pip install 'spark-qtransport[metrics]'"): _OPERATIONS,
    ("operations/permissions.md", "sqlqueue create-queue Sales error"): "test_docs_shell.py::test_the_permissions_dba_block_runs_as_written",
    ("jobs.md", ". .venv/bin/activate"): "test_docs_shell.py::test_the_spark_submit_job_runs_as_written",
}

#: the blocks no test runs, and why (kept here, not in the pages: a caption is for readers); a
#: `text` block is what something prints, never run
NOT_RUN: dict[tuple[str, str], str] = {
    ("index.md", "make demo"): "CI runs make test itself, and the demo's job in tests/test_jobs.py",
    ("getting-started.md", "make demo"): "CI runs make test itself, and the demo's job in tests/test_jobs.py",
    ("getting-started.md", "pip install '.[postgres]'"): "installs into your environment; the tests use make setup's",
    ("getting-started.md", "pip install 'dist/"): "installs into your environment; tests/test_wheel.py installs the wheel",
    ("databricks.md", ""): "needs a Databricks workspace",
    ("errors.md", "from spark_qtransport import"): "a pattern around the reader's own query or write",
    ("notebook.md", "python jobs/audit_to_delta.py"): "tests/test_notebook.py runs the job and the notebook with test paths",
    ("operations/metrics.md", "sqlqueue_queue_messages"): "a Grafana query; no Prometheus in the tests",
    ("operations/permissions.md", "sqlqueue ddl --dialect sqlserver"): "SQL Server, which the tests cannot start",
    ("operations/permissions.md", "GRANT "): "what sqlqueue ddl --grant-to prints (tests/test_privileges.py)",
    ("spark-versions.md", "make compat-table"): "CI runs make compat, which checks this table",
}


def bodies(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks in `text` written in `language`, in order."""
    return [body for lang, body in blocks(text) if lang == language]


def not_run(fence: Fence) -> str | None:
    """Why no test runs `fence` (`NOT_RUN`), or None."""
    return next((why for (name, start), why in NOT_RUN.items()
                 if name == fence.page and fence.first_line.startswith(start)), None)


def run_by(fence: Fence) -> str | None:
    """The test that runs `fence` as written: `RUN_BY`'s, else for a block of a `SCRIPT_PAGES`
    page `test_a_page_runs_as_written`; None."""
    named = next((test for (name, start), test in RUN_BY.items()
                  if name == fence.page and fence.first_line.startswith(start)), None)
    if named is None and fence.page in SCRIPT_PAGES and fence.language in ("bash", "python") and not_run(fence) is None:
        return _PAGE_RUN
    return named
