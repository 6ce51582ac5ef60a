"""Shared fixtures: one embedded PostgreSQL and one local SparkSession for the whole test session.

Set SQLQUEUE_TEST_PG_URL to use your own PostgreSQL instead of the embedded one, and
SQLQUEUE_TEST_SQLSERVER_URL to run the contract suite against SQL Server as well.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, server_settings
from connect_server import connect, connect_session, connect_url  # noqa: F401 - fixtures for every file

# Spark must bind to loopback and start its Python workers with this interpreter.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

ROOT = Path(__file__).resolve().parent.parent

#: the tiers, from the fixtures a test uses (its closure): a new test lands in its tier by itself
SPARK_FIXTURES = {"spark", "connect", "connect_session", "connect_url", "delta"}
DB_FIXTURES = {"pg_url", "pg", "backend"}
TIERS = ("unit", "db", "spark")


def _tier(item: pytest.Item) -> str:
    """The higher of the tier its fixtures need and the one its markers say."""
    used = set(getattr(item, "fixturenames", ()))
    needs = ["unit", "db" if used & DB_FIXTURES else "unit", "spark" if used & SPARK_FIXTURES else "unit"]
    needs += [t for t in TIERS if any(m.name == t for m in item.iter_markers())]
    return max(needs, key=TIERS.index)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test `spark` (it uses a SparkSession, local or over Spark Connect), else `db` (a
    database), else `unit` (neither: `make test-unit`). A test that reaches Spark or a database
    another way (a server of its own, a subprocess) says so with an explicit marker; one that does
    not fails in the unit tier (`_reach`), naming what it started."""
    for item in items:
        tier = _tier(item)
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
    _longest_first(items)
    unexplained = sorted({item.nodeid.split("::")[0] + "::" + item.name.split("[")[0] for item in items
                          if (mark := item.get_closest_marker("slow")) is not None and not slow_reason(mark)})
    if unexplained:
        raise pytest.UsageError("a `slow` marker says why the test is slow: pytest.mark.slow(reason=...) on "
                                + ", ".join(unexplained))


def _longest_first(items: list[pytest.Item]) -> None:
    """Order the files so the long ones start first (those with `slow` tests, then Spark's, the
    database's, the unit tier's), each file's tests together in their own order: `make test` runs
    files on several workers (pytest-xdist, --dist loadfile --no-loadscope-reorder), and a run that
    starts its longest files last ends on one worker while the others idle."""
    rank = {"spark": 1, "db": 2, "unit": 3}
    cost: dict[Any, int] = {}
    for item in items:
        here = 0 if item.get_closest_marker("slow") else rank[_tier(item)]
        cost[item.path] = min(here, cost.get(item.path, here))
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (cost[item.path], order[id(item)]))


# -- the time budget -------------------------------------------------------------------------------

#: a test of `make test` that takes longer (setup, call and teardown) is marked `slow` with its reason
BUDGET_SECONDS = 60.0
_TOOK: dict[str, float] = {}
_SLOW: set[str] = set()


def slow_reason(mark: pytest.Mark) -> str:
    reason = mark.kwargs.get("reason", mark.args[0] if mark.args else "")
    return reason.strip() if isinstance(reason, str) else ""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _TOOK.setdefault(nodeid, 0.0)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TOOK[report.nodeid] = _TOOK.get(report.nodeid, 0.0) + report.duration
    if "slow" in report.keywords:
        _SLOW.add(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name each test over the budget that is not marked `slow` (with its reason): the next
    regression is seen in the run that brings it, not an hour of CI later."""
    over = sorted(((took, nodeid) for nodeid, took in _TOOK.items()
                   if took > BUDGET_SECONDS and nodeid not in _SLOW), reverse=True)
    if over:
        terminalreporter.section("over the budget", yellow=True)
        terminalreporter.line(f"{len(over)} test(s) took over {BUDGET_SECONDS:.0f}s and are not marked slow: make "
                              "them cheaper, or mark them pytest.mark.slow(reason=...)")
        for took, nodeid in over:
            terminalreporter.line(f"{took:7.1f}s {nodeid}")


_RUNNING_TIER: list[str] = [""]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _RUNNING_TIER[0] = _tier(item)


def _reach(what: str) -> None:
    """A unit-tier test (fixtures included) reached `what`: it fails, naming it, so the tier holds."""
    if _RUNNING_TIER[0] == "unit":
        pytest.fail(f"a unit-tier test reached {what}: give it the `db` or `spark` marker", pytrace=False)


def _guard_the_tiers() -> None:
    import psycopg

    from spark_qtransport.cli.embedded import EmbeddedPostgres

    opening = psycopg.connect

    def connecting(*args: Any, **kwargs: Any) -> Any:
        _reach("a PostgreSQL connection")
        return opening(*args, **kwargs)

    psycopg.connect = connecting  # what the dialect and the tests' Backend call
    enter = EmbeddedPostgres.__enter__

    def starting(self: Any) -> Any:
        _reach("an embedded PostgreSQL")
        return enter(self)

    EmbeddedPostgres.__enter__ = starting  # type: ignore[method-assign]


_guard_the_tiers()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    url = os.environ.get("SQLQUEUE_TEST_PG_URL")
    if url:
        yield url
        return
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    # fsync off: tests kill processes, not machines; durability against power loss is not tested.
    # No prepared transactions by default (`server_settings`): the suite's streams hold their claims
    # in the claim table; test_prepared.py has a server of its own. SQLQUEUE_TEST_PREPARED_SLOTS=64
    # runs the suite with prepared claims instead.
    with EmbeddedPostgres(fsync=False, settings=server_settings()) as pg:
        yield pg.url


@pytest.fixture(scope="session")
def pg(pg_url: str) -> Backend:
    return Backend(pg_url)


def _backends() -> list[object]:
    params: list[object] = ["postgres"]
    marks = []
    if not os.environ.get("SQLQUEUE_TEST_SQLSERVER_URL"):
        marks.append(pytest.mark.skip(reason="SQLQUEUE_TEST_SQLSERVER_URL not set"))
    params.append(pytest.param("sqlserver", marks=[pytest.mark.sqlserver, *marks]))
    return params


@pytest.fixture(scope="session", params=_backends())
def backend(request: pytest.FixtureRequest) -> Backend:
    """The contract suite's database: PostgreSQL always, SQL Server when a URL is configured."""
    if request.param == "postgres":
        return request.getfixturevalue("pg")  # type: ignore[no-any-return]
    return Backend(os.environ["SQLQUEUE_TEST_SQLSERVER_URL"])


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Names:
    return Names(request.node.name)


class Names:
    """Unique queue names per test, so tests never see each other's messages."""

    def __init__(self, test: str) -> None:
        self.tag = uuid.uuid4().hex[:8]

    def __call__(self, base: str) -> str:
        return f"{base}_{self.tag}"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    _reach("a SparkSession")
    from pyspark.sql import SparkSession

    from spark_qtransport import register

    sys.path.insert(0, str(ROOT / "jobs"))
    import _spark  # the jobs' Delta settings: the same jars, resolved once into .cache/ivy

    delta = _spark.delta_conf()
    builder = SparkSession.builder
    for key, value in _spark.with_cached_jars(delta).items():
        builder = builder.config(key, value)
    session = (
        builder.master("local[2]")
        .appName("spark-qtransport-tests")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.sql.streaming.noDataProgressEventInterval", "0")
        .config("spark.sql.session.timeZone", "UTC")
        # a Python worker's connection back to the JVM may take long while three test workers' JVMs,
        # jobs and servers share two cores ("Python worker failed to connect back"; default 15 s)
        .config("spark.python.authenticate.socketTimeout", "60s")
        # the tests' session only (not conf/spark-defaults.conf): Python processes talk to the JVM over
        # Unix sockets (4.1 and later), which passes rows faster; its BrokenPipeError stacks at a stop
        # land in pytest's capture, where no test reads them
        .config("spark.python.unix.domain.socket.enabled", "true")
        .getOrCreate()
    )
    _spark.remember_jars(session, delta)
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def delta() -> None:
    """For a test that writes Delta tables: skipped, saying why, on a Spark line Delta has no release
    for (the compatibility runs list the reason in docs/spark-versions.md)."""
    sys.path.insert(0, str(ROOT / "jobs"))
    import _spark

    if not _spark.delta_available():
        pytest.skip(_spark.delta_missing())


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")
