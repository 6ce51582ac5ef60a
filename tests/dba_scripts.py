"""The DBA scripts in sql/<dialect>/ are generated from the code; these helpers keep them in step."""

from __future__ import annotations

import os
from pathlib import Path

from spark_qtransport.dialects import Dialect, Statement

SQL_ROOT = Path(__file__).resolve().parent.parent / "sql"


def render(dialect: Dialect, header: str, title: str, method: str, statements: list[Statement]) -> str:
    return header.format(title=title, method=method) + "\n" + dialect.script(statements)


def assert_matches_file(path: Path, expected: str) -> None:
    """The file equals `expected` up to white space; SQLQUEUE_WRITE_SQL=1 rewrites it first."""
    if os.environ.get("SQLQUEUE_WRITE_SQL") == "1":
        path.write_text(expected, encoding="utf-8")
    assert path.exists(), f"{path} is missing"
    assert "".join(path.read_text(encoding="utf-8").split()) == "".join(expected.split()), (
        f"{path} differs from the code; regenerate it (see its header)"
    )
