"""Joins the report sections of one chaos run into <SQLQUEUE_CHAOS_REPORT>/chaos.md."""

from __future__ import annotations

import os
import platform
import shutil
from datetime import datetime, timezone

import pytest

from report import SECTIONS, directory


def pytest_sessionstart(session: pytest.Session) -> None:
    out = directory()
    if out is not None:
        shutil.rmtree(out / "sections", ignore_errors=True)  # a report shows one run, never a mix


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = directory()
    if out is None or not (out / "sections").is_dir():
        return
    # a section is <name>.md, or several files <name>-*.md (one per parametrized test) joined in name order
    found = ["".join(p.read_text() for p in sorted((out / "sections").glob(f"{name}*.md"))) for name in SECTIONS]
    found = [text for text in found if text]
    if not found:
        return
    head = [
        f"# Chaos report, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        f"`make chaos` on {platform.machine()} Linux, {_cores()} cores; embedded PostgreSQL, Spark `local[2]`; claims held "
        + ("by prepared transactions (`max_prepared_transactions` "
           f"{slots})." if (slots := int(os.environ.get("SQLQUEUE_TEST_PREPARED_SLOTS") or 0)) else "in the claim table."),
        f"Test outcome: {'all passed' if exitstatus == 0 else f'FAILURES (pytest exit {exitstatus})'}.",
        "",
    ]
    (out / "chaos.md").write_text("\n".join(head) + "\n" + "\n".join(found))
    shutil.rmtree(out / "sections", ignore_errors=True)


def _cores() -> int:
    import os

    return os.cpu_count() or 0
