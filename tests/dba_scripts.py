"""The DBA scripts in sql/<dialect>/ are generated from the code; these helpers keep them in step."""

from __future__ import annotations

import os
from collections.abc import Callable
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


def endpoint_scripts(d: Dialect) -> dict[str, tuple[str, str, Callable[[], list[Statement]]]]:
    """The scripts of a sending endpoint 'Sales' (file -> title, methods, statements), per dialect."""
    sales = d.parse_address("Sales")
    staging, outbox, delayed = (d.companion(sales, s) for s in ("Staging", "Outbox", "Delayed"))
    subscriptions = d.parse_address("SubscriptionRouting")
    return {
        "sender.sql": (
            f"Staging and outbox tables {d.qualified(staging)} and {d.qualified(outbox)} of sending endpoint "
            "'Sales': what spark-qtransport sinks stage and dispatch.",
            "create_staging, create_outbox",
            lambda: d.create_staging(staging) + d.create_outbox(outbox),
        ),
        "delayed.sql": (
            f"Delayed-delivery table {d.qualified(delayed)} of endpoint 'Sales', as NServiceBus lays it out.",
            "create_delayed",
            lambda: d.create_delayed(delayed),
        ),
        "subscriptions.sql": (
            f"Publish/subscribe routing table {d.qualified(subscriptions)}, as NServiceBus lays it out.",
            "create_subscriptions",
            lambda: d.create_subscriptions(subscriptions),
        ),
    }
