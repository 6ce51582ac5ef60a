"""The documentation tells the truth: the option tables are made from the code's registry, the
hand-written column tables are the code's, the README opens with the two commands, mkdocs.yml's
navigation names every page, and the quick start and the other examples run as written."""

from __future__ import annotations

import html
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from docs_pages import DOCS, ROOT, bodies, fences, page, run_by, section

from spark_qtransport.spark.reader import SCHEMA
from spark_qtransport.spark.registry import READ, WRITE, for_side
from spark_qtransport.transport.sending.messages import INPUT_COLUMNS

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _rows(text: str) -> list[list[str]]:
    """The cells of the first table in `text`, its header left out."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:] if not row.startswith("|---")]


def _table(name: str, title: str) -> list[list[str]]:
    return _rows(section(name, title))


def hook() -> ModuleType:
    """docs/_hooks/options.py, the mkdocs hook that makes the option tables."""
    spec = importlib.util.spec_from_file_location("docs_options_hook", DOCS / "_hooks" / "options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_opens_with_demo_and_test_commands() -> None:
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make demo", "make test"]


@pytest.mark.parametrize(("kind", "side"), [("reader", READ), ("sink", WRITE)])
def test_option_tables_are_made_from_the_registry(kind: str, side: str) -> None:
    """One row per registry entry of the side, in the registry's order, with its type, default and
    meaning, and the command line's flag where one takes the same value."""
    table = hook().options_table(kind)
    assert table.splitlines()[0] == "| option | type | default | meaning |"
    rows = _rows(table)
    options = list(for_side(side).values())
    assert [r[0] for r in rows] == [f"`{o.name}`" for o in options]
    for (_, kind_text, default, meaning), o in zip(rows, options, strict=True):
        also = f" (command line: `{o.cli}`)" if o.cli else ""
        assert html.unescape(kind_text) == o.type_text(), o.name
        assert (html.unescape(default), html.unescape(meaning)) == (o.shown, o.meaning + also), o.name
    assert "| `maxMessagesPerTrigger` | whole number, 1 to 10,000,000 | 10000 |" in table or kind == "sink"


def test_the_pages_show_the_option_tables() -> None:
    """The placeholders are where the tables belong, and the hook puts the tables there."""
    options = hook()
    pages = {"reading.md": ["reader"], "sending.md": ["sink"], "reference/options.md": ["reader", "sink"]}
    for name, kinds in pages.items():
        text = page(name)
        built = options.on_page_markdown(text)
        for kind in kinds:
            assert f"\n<!-- options: {kind} -->\n" in text, (name, kind)
            assert options.options_table(kind) in built, (name, kind)
        assert "<!-- options:" not in built, name
    assert "<!-- options: reader -->" in section("reading.md", "Options")
    assert "<!-- options: sink -->" in section("sending.md", "Sink options")


def test_output_columns_table_matches_the_schema() -> None:
    rows = _table("reading.md", "Output columns")
    assert [r[0].strip("`") for r in rows] == SCHEMA.fieldNames()
    for name, typ, _ in rows:
        assert re.sub(r"\s", "", SCHEMA[name.strip("`")].dataType.simpleString()) == typ.strip("`").replace(
            "long", "bigint"), name


def test_input_columns_table_matches_the_code() -> None:
    assert [r[0].strip("`") for r in _table("sending.md", "Input columns")] == list(INPUT_COLUMNS)


def _nav_pages(entry: object) -> list[str]:
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, dict):
        return [p for value in entry.values() for p in _nav_pages(value)]
    if isinstance(entry, list):
        return [p for item in entry for p in _nav_pages(item)]
    return []


def test_the_navigation_names_every_page() -> None:
    """mkdocs.yml's nav names every page under docs/ (the hooks are no page), each once, and every
    page it names exists."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    named = _nav_pages(config["nav"])
    assert len(named) == len(set(named)), named
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_hooks" not in p.relative_to(DOCS).parts}
    assert set(named) == pages, (sorted(pages - set(named)), sorted(set(named) - pages))
    assert "_hooks/" in config["exclude_docs"] and "docs/_hooks/options.py" in config["hooks"]


def test_every_block_of_the_site_is_run_by_a_test_or_says_why_not() -> None:
    """A block is run, as written, by the test `docs_pages.RUN_BY` names (which reads it from its page),
    or its title tells the reader it is not run and why (``title="not run: ..."``), or that it is
    what a run prints (``title="printed: ..."``)."""
    unclaimed, claimed = [], []
    for path in sorted(DOCS.rglob("*.md")):
        name = str(path.relative_to(DOCS))
        for fence in fences(name):
            test = run_by(fence)
            title = fence.title or ""
            if test is not None:
                claimed.append((fence, test))
                assert not title.startswith(("not run", "printed")), (name, fence.first_line)
            elif not re.fullmatch(r"(not run|printed): \S.{4,}", title):
                unclaimed.append(f"{name}: {fence.first_line[:60]!r}")
    assert unclaimed == []
    for fence, test in claimed:  # the test exists, and reads the block's page
        file, function = test.split("::")
        source = (Path(__file__).parent / file).read_text()
        assert f"def {function}(" in source, test
        assert fence.page in source, (test, fence.page)


def test_the_api_page_shows_every_name_the_package_exports() -> None:
    import spark_qtransport

    api = page("reference/api.md")
    shown = set(re.findall(r"^::: spark_qtransport\.(?:[\w.]+\.)?(\w+)$", api, flags=re.M))
    assert set(spark_qtransport.__all__) - {"__version__"} - shown == set()


def test_readme_example_uses_what_the_package_exports() -> None:
    """The README's example compiles and imports only what spark_qtransport exports."""
    import spark_qtransport

    (example,) = bodies(README, "python")
    compile(example, "README.md", "exec")
    imported = re.findall(r"^from spark_qtransport import (.+)$", example, flags=re.M)
    assert imported
    for names in imported:
        for name in names.split(","):
            assert name.strip() in spark_qtransport.__all__, name


def spark_noise(output: str) -> list[str]:
    """The lines of `output` a user of the quick start or the demo should not see: Spark's log4j
    warnings (``WARN Utils: Your hostname ...``, ``WARN NativeCodeLoader: ...``), its log level
    notices, Ivy's resolution listing and console progress bars. Java's one line about the incubator
    module Spark 4.1+ asks for is not Spark's, and the demo filters it (`jobs/_spark.py`)."""
    noise = re.compile(r"\bWARN\b|:: resolving|:: loading settings|\[Stage \d|Setting default log level"
                       r"|Using Spark's default log4j profile|found io\.delta#"
                       r"|\bERROR\b|^\tat |^Caused by: |Traceback")  # a Java stack, a Python one
    return [line for line in output.replace("\r", "\n").splitlines() if noise.search(line)]


def test_spark_noise_finds_what_spark_prints() -> None:
    """`spark_noise` against lines Spark, log4j and Ivy really print (and ones they don't)."""
    printed = """\
WARNING: Using incubator modules: jdk.incubator.vector
26/11/24 19:17:45 WARN Utils: Your hostname, vm, resolves to a loopback address: 127.0.0.1
Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties
Setting default log level to "WARN".
:: resolving dependencies :: org.apache.spark#spark-submit-parent-5e4104e2;1.0
\tfound io.delta#delta-storage;4.4.0 in central
[Stage 0:>                (0 + 1) / 1]\r[Stage 0:=========(1 + 0) / 1]
replied to 3 orders
queue "public"."Sales": claimed 1950, dropped 50 expired, moved 1 poison to "public"."error"
06:29:52 ERROR StreamingQueryListenerBus: Listener PythonStreamingQueryListenerWrapper threw an exception
py4j.Py4JException: Error while sending a command.
	at py4j.CallbackClient.sendCommand(CallbackClient.java:397)
Caused by: py4j.Py4JNetworkException: Error while sending a command: c
"""
    assert len(spark_noise(printed)) == 10
    assert spark_noise("replied to 3 orders\nWARNING: Using incubator modules: jdk.incubator.vector\n") == []


@pytest.mark.slow(reason="the pages' scripts run as a reader runs them: five Python processes, each with its own JVM")
def test_the_quick_start_and_sending_run_as_written(pg_url: str, tmp_path: Path) -> None:
    """The quick start of docs/getting-started.md, verbatim: its commands in bash (against a database of
    its own on the test server, where `sqlqueue dev-db` would run one), its script as quickstart.py."""
    import os
    import subprocess
    import uuid

    import psycopg

    quick_start = section("getting-started.md", "Quick start")
    start, commands = bodies(quick_start, "bash")
    assert start.strip() == ".venv/bin/sqlqueue dev-db"  # run by tests/test_dev_db.py
    (script,) = bodies(quick_start, "python")
    (tmp_path / "quickstart.py").write_text(script, encoding="utf-8")
    (tmp_path / ".venv").symlink_to(Path(__file__).resolve().parent.parent / ".venv")
    (tmp_path / "conf").symlink_to(Path(__file__).resolve().parent.parent / "conf")  # its log4j2.properties
    db = f"quickstart_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    url = pg_url.rsplit("/", 1)[0] + "/" + db
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["SQLQUEUE_URL"] = url
    for run in (1, 2):
        done = subprocess.run(["bash", "-e", "-c", commands], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "replied to 3 orders" in done.stdout, done.stdout[-3000:]
        assert not spark_noise(done.stdout + done.stderr), done.stderr[-3000:]
        peeked = done.stdout[done.stdout.index("seq  native_id"):]  # the table `sqlqueue peek Web` prints
        assert peeked.count("Shop.OrderAccepted") == 3 * run, peeked

    # docs/sending.md, continuing quickstart.py: its prerequisites, then each block in order, each run
    # after new orders arrive, with Delta from conf/spark-defaults.conf as the page says
    (tmp_path / ".cache").symlink_to(Path(__file__).resolve().parent.parent / ".cache")  # Delta's jars
    sending = page("sending.md")
    prerequisites = bodies(sending, "bash")[0]
    stream_writer, foreach_batch = bodies(sending, "python")[:2]
    preamble = script[:script.index("replies = ")]  # its session, url and orders; its own query left out
    send = 'for i in 4 5 6; do sqlqueue send Sales --endpoint Web --type Shop.PlaceOrder --body "{\\"order\\": $i}"; done'
    sh = ". .venv/bin/activate\n"
    for block in (prerequisites, send):
        done = subprocess.run(["bash", "-e", "-c", sh + block], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with_delta = {**env, "SPARK_CONF_DIR": "conf"}
    for name, block in (("stream_writer", stream_writer), ("foreach_batch", foreach_batch)):
        (tmp_path / f"{name}.py").write_text(preamble + block, encoding="utf-8")
        done = subprocess.run([str(tmp_path / ".venv/bin/python"), f"{name}.py"], cwd=tmp_path, env=with_delta,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert not done.stderr.strip() or "WARNING: Using incubator modules" in done.stderr, done.stderr[-3000:]
        if name == "stream_writer":
            subprocess.run(["bash", "-e", "-c", sh + send], cwd=tmp_path, env=env, check=True, capture_output=True)
    with psycopg.connect(url) as c:
        types = [r[0] for r in c.execute("SELECT headers::json->>'NServiceBus.EnclosedMessageTypes' FROM \"Web\"")]
        reminders = c.execute('SELECT count(*) FROM "Sales.Delayed"').fetchone()[0]
    # the quick start's two runs, the stream writer's orders 4-6, the foreachBatch's second 4-6
    assert sorted(types) == sorted(["Shop.OrderAccepted"] * 6 + ["Shop.Messages.OrderAccepted, Shop.Messages"] * 3
                                   + ["Shop.OrderAccepted"] * 3), types
    assert reminders == 3
    assert len(list((tmp_path / "orders-delta").glob("*.parquet"))) >= 1

    # then the other python blocks in the order written, in one session: several queues and waiting
    # for a batch (reading.md), failing and retrying (sending.md), the platform (platform.md: its query run until it
    # processed what waits, then stopped) and platform columns; after orders of the platform's shape
    several, waiting = bodies(page("reading.md"), "python")
    platform_blocks = bodies(page("platform.md"), "python")
    failing = bodies(sending, "python")[2]
    assert "queuePattern" in several and "minMessagesPerTrigger" in waiting and "retry_later" in failing
    platform_queues = re.search(r"\(`(sqlqueue create-queue audit [^`]+)`", page("platform.md"))
    assert platform_queues is not None
    orders = ['{"order_id": "A1", "amount": 5}', "not an order", '{"order_id": "U1", "amount": 0}']
    setup = sh + platform_queues.group(1) + "\n" + "\n".join(
        f"sqlqueue send Sales --endpoint Web --type Shop.PlaceOrder --body '{o}'" for o in orders)
    done = subprocess.run(["bash", "-e", "-c", setup], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_platform = "\nplatform.processAllAvailable()\nplatform.stop()\n"
    # "What it is" (index.md) first, in a namespace of its own (its `orders` is another endpoint's), its
    # example URL the test database's: it makes the stream it says, with the documented columns
    (what_it_is,) = bodies(section("index.md", "What it is"), "python")
    assert '"postgresql://app@db:5432/shop"' in what_it_is
    first = (f"_ns = {{'spark': spark}}\nexec({what_it_is.replace(chr(34) + 'postgresql://app@db:5432/shop' + chr(34), 'url')!r},"
             " {**globals(), **_ns}, _ns)\nassert _ns['orders'].isStreaming and 'claim_seq' in _ns['orders'].columns\n")
    script = (preamble + first + several + waiting + failing + platform_blocks[0] + run_platform
              + platform_blocks[1])
    (tmp_path / "blocks.py").write_text(script, encoding="utf-8")
    done = subprocess.run([str(tmp_path / ".venv/bin/python"), "blocks.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with psycopg.connect(url) as c:
        failed = c.execute("SELECT headers::json->>'NServiceBus.ExceptionInfo.Message' FROM \"error\"").fetchall()
        retried = c.execute("""SELECT count(*) FROM "Sales.Delayed" WHERE headers LIKE '%Retries%'""").fetchone()[0]
        accepted = c.execute("""SELECT count(*) FROM "Web" WHERE convert_from(body, 'UTF8') LIKE '%A1%'""").fetchone()[0]
    assert failed == [("the body is not an order",)] and retried == 1 and accepted == 1, (failed, retried, accepted)
