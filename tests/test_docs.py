"""The documentation tells the truth: the option tables are made from the code's registry, the
hand-written column tables are the code's, the README opens with the two commands, mkdocs.yml's
navigation names every page, and the quick start and the other examples run as written."""

from __future__ import annotations

import html
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from docs_pages import DOCS, ROOT, SCRIPT_PAGES, bodies, fences, not_run, page, run_by, section

from spark_qtransport.options.registry import READ, WRITE, for_side
from spark_qtransport.spark.reader import SCHEMA
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
    """A block is run, as written, by the test `docs_pages.run_by` names (which reads it from its
    page), or `docs_pages.NOT_RUN` says why not, or it is a `text` block: what a run prints. Its
    caption is for readers: no test bookkeeping in it."""
    unclaimed, claimed = [], []
    for path in sorted(DOCS.rglob("*.md")):
        name = str(path.relative_to(DOCS))
        for fence in fences(name):
            test = run_by(fence)
            assert not re.match(r"(not run|printed)\b", fence.title or ""), (name, fence.title)
            if test is not None:
                claimed.append((fence, test))
            elif fence.language != "text" and not_run(fence) is None:
                unclaimed.append(f"{name}: {fence.first_line[:60]!r}")
    assert unclaimed == []
    for fence, test in claimed:  # the test exists, and reads the block's page
        file, function = test.split("::")
        source = (Path(__file__).parent / file).read_text()
        assert f"def {function}(" in source, test
        assert fence.page in source or "SCRIPT_PAGES" in source, (test, fence.page)


def test_every_document_the_code_cites_is_in_the_repository() -> None:
    """The code and the architecture page named a DESIGN.md "the contract" that no clone had; the
    contract is docs/contributing/contract.md, and every Markdown file a module or page names exists."""
    sources = [*ROOT.joinpath("spark_qtransport").rglob("*.py"), ROOT / "ARCHITECTURE.md", ROOT / "README.md"]
    cited = {(path.relative_to(ROOT), name) for path in sources
             for name in re.findall(r"\b([\w./-]*[A-Z][\w/-]*\.md)\b", path.read_text(encoding="utf-8"))}
    missing = sorted((str(path), name) for path, name in cited
                     if not (ROOT / name).exists() and not (DOCS / name).exists()
                     and not any(p.name == Path(name).name for p in DOCS.rglob("*.md")))
    assert not missing, missing
    assert "## Receive: claim, read, acknowledge" in page("contributing/contract.md")


def test_the_pages_name_the_delta_version_the_project_uses() -> None:
    """Every `delta-spark==X` a page tells a reader to install is the Delta of conf/spark-defaults.conf
    (the notebook page said 4.4.1, whose jars are not on Maven Central)."""
    conf = (ROOT / "conf" / "spark-defaults.conf").read_text(encoding="utf-8")
    version = re.search(r"io\.delta:delta-spark_[\d.]+_[\d.]+:(\S+)", conf)
    assert version is not None
    named = {(str(p.relative_to(DOCS)), v) for p in DOCS.rglob("*.md")
             for v in re.findall(r"delta-spark==([\w.]+)", p.read_text(encoding="utf-8"))}
    assert named and all(v == version[1] for _, v in named), (version[1], named)


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


@dataclass
class Ran:
    block: str
    stdout: str
    stderr: str


def run_page(name: str, pg_url: str, tmp_path: Path) -> tuple[str, list[Ran]]:
    """Run the shell blocks of docs/<name> in order, as a reader does in the checkout after
    `sqlqueue dev-db` and its `export` line (here a database of its own on the test server), with
    the page's Python blocks saved first under their titles (the shell blocks run them by name).
    Each block must end well and print nothing from Spark but its one JVM line (`spark_noise`).
    Returns the database's URL and what each block printed."""
    import os
    import subprocess
    import uuid

    import psycopg

    checkout = Path(__file__).resolve().parent.parent
    for linked in (".venv", "conf", ".cache"):  # the checkout's, where the reader runs the scripts
        (tmp_path / linked).symlink_to(checkout / linked)
    db = f"{Path(name).stem.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    url = pg_url.rsplit("/", 1)[0] + "/" + db
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV",
                                                            "PYTHONPATH", "SPARK_CONF_DIR")}
    env["SQLQUEUE_URL"] = url
    runnable = [f for f in fences(name) if run_by(f) == "test_docs.py::test_a_page_runs_as_written"]
    for fence in runnable:
        if fence.language == "python":
            assert fence.title and fence.title.endswith(".py"), (name, fence.first_line)
            (tmp_path / fence.title).write_text(fence.body, encoding="utf-8")
    ran = []
    for fence in runnable:
        if fence.language != "bash":
            continue
        done = subprocess.run(["bash", "-e", "-c", ". .venv/bin/activate\n" + fence.body], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (fence.body, done.stdout[-3000:] + done.stderr[:3000] + done.stderr[-3000:])
        assert not spark_noise(done.stdout + done.stderr), (fence.body, done.stdout[-3000:] + done.stderr[-3000:])
        ran.append(Ran(fence.body, done.stdout, done.stderr))
    return url, ran


def _count(url: str, table: str, where: str = "") -> int:
    import psycopg

    with psycopg.connect(url) as c:
        return int(c.execute(f'SELECT count(*) FROM "{table}" {where}').fetchone()[0])


@pytest.mark.slow(reason="a page's scripts run as a reader runs them, each a Python process with its own JVM")
@pytest.mark.parametrize("name", SCRIPT_PAGES)
def test_a_page_runs_as_written(name: str, pg_url: str, tmp_path: Path) -> None:
    """Every shell and Python block of a page of `SCRIPT_PAGES`, in order, from a fresh database;
    then what the page says they do."""
    url, ran = run_page(name, pg_url, tmp_path)
    printed = "\n".join(r.stdout for r in ran)
    if name == "index.md":
        assert "Shop.PlaceOrder" in printed and '{"order": 1}' in printed, printed[-3000:]
    elif name == "getting-started.md":
        assert "replied to 3 orders" in printed, printed[-3000:]
        assert printed[printed.index("seq  native_id"):].count("Shop.OrderAccepted") == 3, printed[-3000:]
        again = subprocess_run_again(tmp_path, url, "quickstart.py")
        assert "replied to 0 orders" in again, again
    elif name == "reading.md":
        assert '"public"."Orders_eu": 2\n"public"."Orders_us": 1' in printed, printed[-3000:]
    elif name == "sending.md":
        assert "answered the orders" in printed and "3 orders stored and answered" in printed, printed[-3000:]
        assert "Shop.InvalidOrderException" in printed, printed[-3000:]
        stats = json.loads(ran[1].stdout[ran[1].stdout.index("\n[") + 1:])  # sqlqueue stats Web Sales --json
        by_queue = {q["queue"]: q for q in stats}
        assert by_queue['"public"."Web"']["messages"] == 3 and by_queue['"public"."Sales"']["delayed_pending"] == 3
        assert _count(url, "Web") == 7 and _count(url, "error") == 1  # 3 + 3 + order 7; the broken one
        assert _count(url, "Sales.Delayed") == 4  # three reminders, order 8's retry
    elif name == "platform.md":
        assert "Shop.PlaceOrder at Sales: processed in " in printed, printed[-3000:]
        assert _count(url, "error") == 1 and _count(url, "Particular.Monitoring") >= 1
        assert _count(url, "Sales.Delayed", "WHERE headers LIKE '%Retries%'") == 1
        assert _count(url, "audit") == 0  # audit_times.py read the one audit copy
    else:
        raise AssertionError(f"no check for {name}: say what its blocks do")


def subprocess_run_again(cwd: Path, url: str, script: str) -> str:
    """`python script` once more, in the page's directory: what a second run prints."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV",
                                                            "PYTHONPATH", "SPARK_CONF_DIR")}
    done = subprocess.run(["bash", "-e", "-c", f". .venv/bin/activate\npython {script}"], cwd=cwd,
                          env={**env, "SQLQUEUE_URL": url}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and not spark_noise(done.stdout + done.stderr), done.stdout + done.stderr
    return done.stdout
