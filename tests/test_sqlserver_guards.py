"""Guards over every statement the SQL Server dialect can make, one per class of defect a review of
the dialect against NServiceBus's source found. No SQL Server runs here: what a server would reject
or suffer is checked on the SQL text, for every statement, so a statement added later is covered.

- no aggregate that can skip a NULL (warning 8153 arrives through ODBC as one more result);
- no statement writes to, or deletes from, a table that is not ours more than `ROW_BOUND` rows
  (lock escalation to a table lock blocks NServiceBus receivers and ServiceControl);
- every result is read through the one seam that skips results without rows;
- the database's compatibility level (OPENJSON needs 130) is checked by every entry point.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from test_sqlserver_sql import ADDRESSES, simple_statements, statements

from spark_qtransport.dialects.base import BatchRead, QueueAddress, Statement
from spark_qtransport.dialects.sqlserver import SqlServerDialect
from spark_qtransport.dialects.sqlserver.statements import ROW_BOUND
from spark_qtransport.errors import SchemaError
from spark_qtransport.transport import session as db

ROOT = Path(__file__).resolve().parent.parent
D = SqlServerDialect()


def every_statement() -> dict[str, list[Statement]]:
    """Every statement the dialect makes: the collection the SQL tests use, and the rest (server
    checks, savepoints, grants, privileges, listings), for every address shape."""
    out: dict[str, list[Statement]] = {}
    for case, (qt, et) in ADDRESSES.items():
        for method, stmts in statements(qt, et).items():
            out[f"{case}:{method}"] = stmts
        q = D.parse_address(qt)
        out[f"{case}:grants"] = D.grants("app", {q: ["SELECT", "INSERT", "DELETE"]}, queues=[q])
        out[f"{case}:privileges"] = [D.privileges(q, ["SELECT", "INSERT", "DELETE"])]
        out[f"{case}:database_levels"] = [D.database_levels([c for c in (q.catalog,) if c])]
    c = D.claims_table(D.parse_address("Sales"))
    optional = {  # methods that make no SQL on SQL Server (None, or nothing to do)
        "server_check": D.server_check(), "release_savepoint": D.release_savepoint("sqlqueue_route"),
        "helpers_exist": D.helpers_exist(c), "vacuum": D.vacuum(c),
        "vacuum_due": D.vacuum_due(c, every_seconds=60, min_rows=1000),
        "schema_and_tables": D.schema_and_tables("dbo", ["Sales"]), "server_time_zone": D.server_time_zone(),
        "wal_settings": D.wal_settings(),
        # queue by queue on SQL Server (`batches_forget`): no statement for many queues at once
        "batches_forget_many": D.batches_forget_many(D.batches_table(), failed=D.failed_table(),
                                                     queues=[BatchRead(D.qualified(c), "c", "1", 0, 9)]),
        # no hint of an idle queue by its sequence (receiving/quiet.py): every queue is peeked
        "sequences_of": D.sequences_of([D.parse_address("Sales")]), "sequence_values": D.sequence_values([1]),
        "tables_written": D.tables_written([1]),
        # no catalog version: a pattern is matched at every trigger
        "catalog_version": D.catalog_version(),
        # each queue's set-up and held claims asked alone (`look_ahead`, `_look_first`): no statement for many
        "columns_of": D.columns_of([q]), "try_lock_consumers": D.try_lock_consumers([(c, "Sales")]),
        "max_claims": D.max_claims([(c, "Sales")]),
    }
    assert optional["batches_forget_many"] is None
    assert optional["columns_of"] is optional["try_lock_consumers"] is optional["max_claims"] is None
    assert optional["sequences_of"] is optional["sequence_values"] is optional["tables_written"] is None
    assert optional["catalog_version"] is None
    assert D.read_transaction(one_snapshot=False) == []  # one snapshot only for prepared claims (none here)
    out["read_transaction"] = []
    out.update({name: [s] if s is not None else [] for name, s in optional.items()})
    out["savepoint"] = [D.savepoint("sqlqueue_route")]
    out["rollback_to_savepoint"] = [D.rollback_to_savepoint("sqlqueue_route")]
    out["create_helpers"] = D.create_helpers(c)
    out["dispatch_plans"] = D.dispatch_plans()
    out["list_queues"] = [D.list_queues()]
    out["connection_limit"] = [D.connection_limit()]
    return out


EVERY = every_statement()


def _methods_making_sql() -> set[str]:
    """Public methods of the dialect whose annotated result is SQL (a Statement or a list of them)."""
    names = set()
    for name, fn in inspect.getmembers(SqlServerDialect, inspect.isfunction):
        if not name.startswith("_") and "Statement" in str(inspect.signature(fn).return_annotation):
            names.add(name)
    return names


#: statements of dialects whose claim does not judge headers (`ReceiveSql.poison_at_claim`): the
#: SQL Server claim judges them, so it makes none of these (they raise)
NOT_MADE = {"ack_headers", "dead_letter_claims", "drop_claim_range"}
#: SQL Server has no prepared claims (`claimMode`): none of their statements is ever made there
NO_PREPARED = {"after_progress", "commit_prepared", "copy_held", "copy_held_range", "failed_take", "forget_progress",
               "list_prepared", "note_progress", "park", "parked", "pick", "prepare", "prepared_bound",
               "prepared_capacity", "prepared_headers", "read_prepared", "repeatable_read", "rollback_prepared",
               "take", "claim_numbers"}


def test_every_statement_method_is_collected() -> None:
    """A statement added to the dialect must be added to the collection, so every guard sees it."""
    made = {key.split(":")[-1] for key in EVERY}
    missing = {m for m in _methods_making_sql() - NOT_MADE - NO_PREPARED
               if not any(k == m or k.startswith(m + "_") for k in made)}
    assert not missing, f"add these to every_statement() / test_sqlserver_sql.statements(): {sorted(missing)}"


def test_the_claim_judges_headers_so_the_acknowledgement_makes_no_poison_sql() -> None:
    c = D.claims_table(D.parse_address("Sales"))
    assert D.poison_at_claim is True
    calls = {"ack_headers": lambda: D.ack_headers(c, "x", upto=1, batch=1),
             "dead_letter_claims": lambda: D.dead_letter_claims(c, "x", D.parse_address("error"), keys=[1]),
             "drop_claim_range": lambda: D.drop_claim_range(c, "x", lo=1, hi=1)}
    assert set(calls) == NOT_MADE
    for call in calls.values():
        with pytest.raises(NotImplementedError, match="judges headers in the claim"):
            call()


def test_sql_server_holds_no_claim_in_a_prepared_transaction() -> None:
    """claimMode prepared is refused for SQL Server at the options, auto never takes it, and no
    statement of a prepared claim (nor a numbered claim) is ever made for it."""
    from spark_qtransport.dialects import ClaimNumbering, PickedRows
    from spark_qtransport.errors import ConfigError
    from spark_qtransport.options.parse import ReaderOptions

    assert D.prepared_claims is False
    q, c = D.parse_address("Sales"), D.claims_table(D.parse_address("Sales"))
    calls = {"commit_prepared": lambda: D.commit_prepared("g"), "list_prepared": lambda: D.list_prepared("g"),
             "park": lambda: D.park(q, c, "x", xid="1", shift=0, first=1, last=1, low=1, high=1, claimed_at="",
                                    poison=[]),
             "prepared_headers": lambda: D.prepared_headers(q, xid="1", after=0, high=1, claimed_at="", limit=1),
             "parked": lambda: D.parked(c, "x", after=0, upto=1), "prepare": lambda: D.prepare("g"),
             "pick": lambda: D.pick(q, after=0, upto=None, limit=1),
             "take": lambda: D.take(q, after=0, upto=None, limit=1),
             "claim_numbers": lambda: D.claim_numbers(first=1, clock_base=None),
             "prepared_bound": D.prepared_bound, "prepared_capacity": D.prepared_capacity,
             "read_prepared": lambda: D.read_prepared(q, xid="1", shift=0, after=0, upto=1, claimed_at=""),
             "repeatable_read": D.repeatable_read, "rollback_prepared": lambda: D.rollback_prepared("g"),
             "copy_held": lambda: D.copy_held(q, q, xid="1", shift=0, claimed_at="", keys=[1], headers=None),
             "copy_held_range": lambda: D.copy_held_range(q, q, xid="1", shift=0, claimed_at="", after=0, upto=1, skip=[]),
             "failed_take": lambda: D.failed_take(D.failed_table(), table_id="1", after=0, upto=1),
             "after_progress": lambda: D.after_progress(c, "x", first=1),
             "note_progress": lambda: D.note_progress(c, "x", first=1, done=1),
             "forget_progress": lambda: D.forget_progress(c, "x", upto=1)}
    assert set(calls) == NO_PREPARED
    for call in calls.values():
        with pytest.raises(NotImplementedError):
            call()
    with pytest.raises(NotImplementedError):
        D.claim(q, c, D.parse_address("error"), consumer="x", limit=1, after=0, upto=None,
                numbering=ClaimNumbering(2**62 + 1, prepared=False, picked=PickedRows([1], [], [], False)))
    with pytest.raises(ConfigError, match="claimMode"):
        ReaderOptions.stream({"url": "sqlserver://h/db", "queue": "Sales", "claimMode": "prepared"})


# -- no aggregate that can skip a NULL ------------------------------------------------------------

_AGGREGATE = re.compile(r"\b(COUNT_BIG|COUNT|SUM|MIN|MAX|AVG|STDEV|STDEVP|VAR|VARP|STRING_AGG)\s*\(", re.I)
_NOT_NULL = re.compile(r"(?:^|[(,\n])\s*\[?(\w+)\]?\s+[a-z0-9]+(?:\([^)]*\))?(?:\s+IDENTITY\([^)]*\))?\s+NOT NULL", re.I)


def _not_null_columns() -> set[str]:
    """Columns declared NOT NULL in any table the dialect creates (queue, delayed, claims, staging,
    outbox, subscriptions) or any temp table or table variable its batches make."""
    return {m.lower() for stmts in EVERY.values() for s in stmts for m in _NOT_NULL.findall(s.sql)}


def _arguments(sql: str) -> list[tuple[str, str]]:
    """(aggregate, its argument) of each aggregate call in `sql`, comments left out (the
    dialect's comments hold no quote, so a line's ``--`` starts a comment)."""
    sql = re.sub(r"--[^\n]*", "", sql)
    found = []
    for m in _AGGREGATE.finditer(sql):
        depth, i = 1, m.end()
        while depth and i < len(sql):
            depth += {"(": 1, ")": -1}.get(sql[i], 0)
            i += 1
        found.append((m.group(1).upper(), sql[m.end():i - 1].strip()))
    return found


@pytest.mark.parametrize("key", list(EVERY))
def test_no_aggregate_can_skip_a_null(key: str) -> None:
    """With ANSI_WARNINGS on (the ODBC default, and required by the filtered Index_Expires), an
    aggregate that skips a NULL sends warning 8153, which ODBC reports as a result of its own: the
    caller's fetch then fails ("No results. Previous SQL was not a query"). Every aggregate takes
    `*` or a column that is NOT NULL where the dialect creates it; dynamic SQL (inside literals)
    included."""
    allowed = _not_null_columns()
    for stmt in EVERY[key]:
        for name, arg in _arguments(stmt.sql):
            column = arg.split(".")[-1].strip("[]").lower()
            assert arg == "*" or (re.fullmatch(r"(\w+\.)?\[?\w+\]?", arg) and column in allowed), (
                f"{key}: {name}({arg}) may skip a NULL; count with WHERE, or give the CASE an ELSE")


def test_the_guard_catches_the_claims_old_count() -> None:
    # the claim once counted expired rows with COUNT(CASE WHEN Expired = 1 THEN 1 END)
    assert _arguments("SELECT @e = COUNT(CASE WHEN Expired = 1 THEN 1 END) FROM t") == [
        ("COUNT", "CASE WHEN Expired = 1 THEN 1 END")]
    assert {"rowversion", "claimseq", "seq", "pos"} <= _not_null_columns()


# -- at most ROW_BOUND rows per statement into or out of a table that is not ours ---------------

_OURS = re.compile(r"^[#@]|\.(Claims|Staging|Outbox)\]$|\[SqlQueue\.(Batches|Failed)\]$")
_CONCAT = re.compile(r"N'(?:[^']|'')*'(?:\s*\+\s*@\w+\s*\+\s*N'(?:[^']|'')*')*")


def _with_dynamic(stmt: Statement) -> list[str]:
    """The statement's text and each dynamic SQL text it builds, the table names it splices in
    (parameters) put back."""
    declared = re.findall(r"DECLARE @(\w+) [\w()]+ = \?;", stmt.sql)
    values = dict(zip(declared, stmt.params or (), strict=False)) if len(declared) == len(stmt.params or ()) else {}
    texts = [stmt.sql]
    for m in _CONCAT.finditer(stmt.sql):
        text = re.sub(r"'\s*\+\s*@(\w+)\s*\+\s*N'", lambda n: str(values.get(n[1], f"[@{n[1]}]")), m.group(0))
        text = text[2:-1].replace("''", "'")
        if re.search(r"\b(INSERT\s+INTO|DELETE\s+\S|UPDATE\s+\S+\s+SET|MERGE\s)", text):
            texts.append(text)
    return texts


_TARGET = re.compile(
    r"^(?:WITH\s+\w+\s+AS\s*\((?P<cte>.*)\)\s*)?"
    r"(?:INSERT\s+INTO\s+|DELETE\s+(?:TOP\s*\([^)]*\)\s+)?(?:FROM\s+)?|UPDATE\s+|MERGE\s+)"
    r"(?P<target>(?:\[(?:[^\]]|\]\])*\]\.?)+|[#@]?\w+)",
    re.I | re.S,
)


def _target(part: str) -> str:
    m = _TARGET.match(part)
    assert m, f"no target found in: {part}"
    target = m["target"]
    if m["cte"]:  # WITH picked AS (SELECT TOP (n) ... FROM <table> ...) DELETE FROM picked
        source = re.search(r"\bFROM\s+((?:\[(?:[^\]]|\]\])*\]\.?)+)", m["cte"])
        return source[1] if source else target
    alias = re.search(rf"\bFROM\s+((?:\[(?:[^\]]|\]\])*\]\.?)+|[#@]?\w+)\s+AS\s+{re.escape(target)}\b", part)
    return alias[1] if alias else target  # DELETE m FROM [queue] AS m


def _bounded(part: str, batch: str) -> bool:
    chunk = re.search(r"\bTOP\s*\(\s*@chunk\s*\)", part)
    if chunk:  # the batch caps @chunk
        caps = [int(n) for n in re.findall(r"SET @chunk = CASE WHEN .*? ELSE (\d+) END", batch)]
        return bool(caps) and max(caps) <= 2000
    literal = re.search(r"\bTOP\s*\(\s*(\d+)\s*\)", part)
    if literal:
        return int(literal[1]) <= 2000
    window = re.search(r"\b(\w+\.)?(Pos|PoisonPos) > @(\w+) AND \1?\2 <= @\3 \+ (\d+)", part)
    if window:
        return int(window[4]) <= 2000
    if _one_values_row(part):  # INSERT ... VALUES (...): one row, as NServiceBus's SendText
        return True
    # one row by the whole primary key of SubscriptionRouting (Endpoint, Topic), as NServiceBus does
    return bool(re.search(r"SubscriptionRouting\]", part) and (
        re.search(r"USING \(SELECT \? AS Endpoint, \? AS QueueAddress, \? AS Topic\)", part)
        or re.search(r"WHERE Endpoint = \? AND Topic = \?$", part)))


def _one_values_row(part: str) -> bool:
    """Whether `part` is ``INSERT INTO t (...) VALUES (...)`` with exactly one row of values."""
    m = re.match(r"INSERT\s+INTO\s+(?:\[(?:[^\]]|\]\])*\]\.?)+\s*\([^()]*\)\s*VALUES\s*\(", part, re.I)
    if not m:
        return False
    depth, i = 1, m.end()
    while depth and i < len(part):
        depth += {"(": 1, ")": -1}.get(part[i], 0)
        i += 1
    return depth == 0 and not part[i:].strip(" ;\n")


def _foreign_writes(stmt: Statement) -> list[tuple[str, str]]:
    out = []
    for text in _with_dynamic(stmt):
        for kind, part in simple_statements(text):
            if kind != "statement" or not re.match(r"(WITH\s+\w+\s+AS\s*\(.*\)\s*)?(INSERT|DELETE|UPDATE|MERGE)\b",
                                                    part, re.I | re.S):
                continue
            target = _target(part)
            if not _OURS.search(target):
                out.append((target, part))
    return out


@pytest.mark.parametrize("key", list(EVERY))
def test_writes_to_tables_not_ours_are_bounded(key: str) -> None:
    """SQL Server escalates to a table lock once one statement holds about 5,000 locks on a table
    or index; READPAST skips row and page locks only, so NServiceBus receivers and ServiceControl
    would wait for our transaction. Every INSERT, DELETE, UPDATE and MERGE on a queue, an error
    queue, a delayed table or SubscriptionRouting writes at most ROW_BOUND (2,000) rows."""
    assert ROW_BOUND <= 2000
    for stmt in EVERY[key]:
        for target, part in _foreign_writes(stmt):
            assert _bounded(part, stmt.sql), f"{key}: unbounded write to {target}: {part[:300]}"


def test_the_guard_catches_an_unbounded_insert() -> None:
    old_dispatch = Statement(
        "INSERT INTO [dbo].[Billing] (Id, Expires, Headers, Body) SELECT NEWID(), NULL, m.Headers, m.Body"
        " FROM [dbo].[Sales.Staging] AS m WHERE Attempt IN (SELECT value FROM OPENJSON(?)) ORDER BY m.Seq", ("[]",))
    assert [t for t, _ in _foreign_writes(old_dispatch)] == ["[dbo].[Billing]"]
    assert not _bounded(_foreign_writes(old_dispatch)[0][1], old_dispatch.sql)
    ours = Statement("DELETE FROM [dbo].[Sales.Staging] WHERE Attempt = ?", ("a",))
    assert _foreign_writes(ours) == []


def test_only_one_values_row_counts_as_bounded() -> None:
    one = "INSERT INTO [dbo].[Billing] (Id, Expires, Headers, Body)\nVALUES (NEWID(), DATEADD(ms, 1, GETUTCDATE()), @h, @b);"
    assert _one_values_row(one)
    assert not _one_values_row(one.replace(";", ", (NEWID(), NULL, @h, @b);"))
    assert not _one_values_row("INSERT INTO [dbo].[Billing] (Id, Expires, Headers, Body) SELECT NEWID(), NULL, h, b FROM x")
    writes = _foreign_writes(D.insert_message(QueueAddress("Billing"), headers="{}", body=b"", ttbr_ms=1))
    assert len(writes) == 2  # with the Recoverable column and without
    assert all(target == "[dbo].[Billing]" and _one_values_row(part) for target, part in writes)


def test_every_kind_of_write_to_a_queue_is_seen() -> None:
    # the guard finds the writes inside dynamic SQL too: the dispatch, the claim's poison rows, the mover
    q, e, dl = QueueAddress("Sales"), QueueAddress("error"), QueueAddress("Sales.Delayed")
    s = QueueAddress("Sales.Staging")
    targets = {
        t for stmt in (D.dispatch(s, q, attempts=["a"], route="r", publish_routes=[]),
                       *D.claim(q, D.claims_table(q), e, consumer="c", limit=10, after=0, upto=None),
                       D.move_delayed(dl, q, keys=["1 2025-01-02T03:04:05"], headers=["{}"]),
                       D.dispatch_delayed(s, dl, attempts=["a"]), D.purge_expired(q, limit=10))
        for t, _ in _foreign_writes(stmt)
    }
    assert targets == {"[dbo].[Sales]", "[dbo].[error]", "[dbo].[Sales.Delayed]"}


# -- results: one seam skips the results without rows --------------------------------------------


def test_results_skip_results_without_rows(pg_url: Any) -> None:
    """A batch that answers with a result without rows first (a row count; on SQL Server the
    warning 8153 as ODBC reports it) is read past, on a real driver."""
    from spark_qtransport.connections import parse_url
    from spark_qtransport.dialects import dialect_named

    d = dialect_named("postgres")
    conn = d.connect(parse_url(pg_url))
    try:
        cur = conn.cursor()
        batch = Statement("CREATE TEMP TABLE sqlqueue_guard (x int); INSERT INTO sqlqueue_guard VALUES (1); SELECT 42")
        assert db.one(cur, batch) == (42,)
        assert db.rows(cur, Statement("DROP TABLE sqlqueue_guard; SELECT 1, 2")) == [(1, 2)]
    finally:
        conn.rollback()
        conn.close()


def test_no_result_is_read_around_the_seam() -> None:
    """Outside the dialects, results are read through `transport.session` (`results`, `first`,
    `one`, `rows`, `columns`, `rowcount`); the only other fetch is the slice reader's streaming
    fetchmany of one plain SELECT."""
    allowed = {ROOT / "spark_qtransport" / "transport" / "session.py",
               ROOT / "spark_qtransport" / "transport" / "receiving" / "slices.py"}
    offenders = []
    for path in (ROOT / "spark_qtransport").rglob("*.py"):
        if path in allowed or "dialects" in path.parts:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.fetch(one|all|many)\(", line) and "db.results(" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    # a connection check reads its own one-statement result
    offenders = [o for o in offenders if 'execute("SELECT 1").fetchall()' not in o]
    assert not offenders, offenders
    read = D.read_claims(QueueAddress("Sales.Claims"), "c", after=0, upto=9).sql
    assert read.startswith("SELECT ") and ";" not in read  # one statement: one result


# -- the compatibility level ----------------------------------------------------------------------


def test_compatibility_level_sql_runs_at_any_level() -> None:
    s = D.database_levels(["Shop", "ops]x"])
    assert s == Statement("SELECT name, compatibility_level FROM sys.databases WHERE name = DB_NAME()"
                          " OR name = ? OR name = ? ORDER BY name", ("Shop", "ops]x"))
    assert "OPENJSON" not in s.sql  # what finds out whether OPENJSON exists cannot use it
    assert D.level_problem("Shop", 130) is None and D.level_problem("Shop", 160) is None
    assert D.level_problem("Shop", 120) == (
        "database [Shop] is at compatibility level 120; spark-qtransport needs 130 or higher (OPENJSON, "
        "SQL Server 2016): ALTER DATABASE [Shop] SET COMPATIBILITY_LEVEL = 130")
    assert "[a]]b]" in str(D.level_problem("a]b", 110))


class _Levels:
    """A DB-API cursor that answers the compatibility check with `levels` (the rest with no rows)."""

    def __init__(self, levels: list[tuple[str, int]]) -> None:
        self.levels, self.seen, self.description, self._rows = levels, [], None, []

    def execute(self, sql: str, *params: Any) -> _Levels:
        self.seen.append(sql)
        self._rows = list(self.levels) if "compatibility_level" in sql else []
        self.description = [("c",)]
        return self

    def nextset(self) -> bool:
        return False

    def fetchall(self) -> list[Any]:
        return self._rows


def test_every_entry_point_checks_the_level() -> None:
    """The receiver's start, the sender's start and doctor all go through `database_problems`."""
    from spark_qtransport.transport.operations.doctor import check_server
    from spark_qtransport.transport.server import database_problems

    cur = _Levels([("Shop", 120), ("ops", 150)])
    queues = [QueueAddress("Sales", "dbo", "ops"), QueueAddress("error")]
    assert database_problems(cur, D, queues) == [D.level_problem("Shop", 120)]
    assert cur.seen[-1] == D.database_levels(["ops"]).sql
    (finding,) = check_server(_Levels([("Shop", 110)]), D, queues)
    assert finding.level == "error" and "ALTER DATABASE [Shop] SET COMPATIBILITY_LEVEL = 130" in finding.message
    assert check_server(_Levels([("Shop", 130)]), D, queues) == []
    for module, seam in (("transport/receiving/setup.py", "require_databases("),
                         ("transport/sending/dispatch.py", "require_databases("),
                         ("transport/operations/doctor.py", "database_problems(")):
        assert seam in (ROOT / "spark_qtransport" / module).read_text(), module


def test_receiver_start_refuses_a_low_level() -> None:
    from spark_qtransport.transport.receiving.setup import ConnectionFacts, Endpoint, EndpointSetUp

    class Options:
        queue, error_queue = QueueAddress("Sales"), QueueAddress("error")

        def platform_queues(self) -> dict[str, QueueAddress]:
            return {"auditQueue": QueueAddress("audit")}

    endpoint = Endpoint(Options(), D, D.claims_table(QueueAddress("Sales")))  # type: ignore[arg-type]

    with pytest.raises(SchemaError, match=r"^url: database \[Shop\] is at compatibility level 110"):
        EndpointSetUp(endpoint)._check_server(_Levels([("Shop", 110)]), ConnectionFacts())
    EndpointSetUp(endpoint)._check_server(_Levels([("Shop", 130)]), ConnectionFacts())
