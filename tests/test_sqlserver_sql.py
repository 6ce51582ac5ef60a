"""The SQL Server dialect without a database: addresses, quoting, and the SQL it generates.

Every statement is checked for: as many ``?`` markers as parameters, no user text outside quoted
identifiers and parameters, and T-SQL that sqlglot parses. sqlglot 30 parses single T-SQL
statements well but control flow (IF/WHILE/BEGIN...END/TRY...CATCH) only shallowly: nested blocks
fall back to opaque "Command" nodes. So each batch is cut into its simple statements (control-flow
words dropped, IF/WHILE conditions parsed as ``SELECT CASE WHEN <condition> THEN 1 END``) and each
of those is parsed; the block structure is checked by counting. The few constructs sqlglot cannot
parse at all are listed in SQLGLOT_GAPS with the reason and asserted on as text instead.

`TestSqlServerLive` runs the statements on a real SQL Server when SQLQUEUE_TEST_SQLSERVER_URL is set.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from dba_scripts import SQL_ROOT, assert_matches_file, endpoint_scripts, render
from spark_qtransport.dialects import dialect_named
from spark_qtransport.dialects.base import BatchRead, ClaimFailures, ClaimResult, QueueAddress, Statement
from spark_qtransport.dialects.sqlserver import CLAIM_CHUNK, SqlServerDialect, placeholders
from spark_qtransport.dialects.sqlserver.statements import ROW_BOUND
from spark_qtransport.errors import ConfigError, QTransportError
from spark_qtransport.wire import FAILURE_HEADERS, RETRY_COUNTERS

ROOT = Path(__file__).resolve().parent.parent
D = SqlServerDialect()
TSQL = sqlglot.Dialect.get_or_raise("tsql")


class _Tokenizer(TSQL.tokenizer_class):  # type: ignore[name-defined,misc]
    # sqlglot lexes everything from a statement-initial END to the next ";" as one raw string
    # (END is one of its "commands"); T-SQL blocks need END to stay a keyword.
    COMMANDS = TSQL.tokenizer_class.COMMANDS - {TokenType.END}


def tokenize(sql: str) -> list[Any]:
    return _Tokenizer(dialect=TSQL).tokenize(sql)

EVIL = "evil'; DROP TABLE x; --"
EVIL_TABLE = "error] ...; DROP TABLE [Victim]; --"


# -- helpers ------------------------------------------------------------------------------------

#: (pattern, replacement, why): constructs of our SQL that sqlglot 30's T-SQL parser rejects.
#: The statement must match the pattern (so the text is asserted), then the rest is parsed.
SQLGLOT_GAPS = [
    (r"\bPRIMARY KEY CLUSTERED\b", "PRIMARY KEY",
     "sqlglot parses CLUSTERED only after a named CONSTRAINT; ours is unnamed (names are per schema)"),
    (r"(\bINTO\s+[#@]\w+)\s*\([^()]*\)", r"\1",
     "sqlglot parses OUTPUT ... INTO <table> but not the column list after it"),
]
#: statements sqlglot misreads rather than rejects ("THROW" parses as a column name)
TEXT_ONLY = {
    "THROW": re.compile(r"^THROW(\s+5\d{4}, N'[^']*', 1)?$"),
    "SAVE": re.compile(r"^SAVE TRANSACTION [A-Za-z_]\w*$"),  # sqlglot 30 has no SAVE TRANSACTION
}

_STARTERS = {
    "SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "SET", "DECLARE", "EXEC", "EXECUTE", "THROW",
    "BREAK", "COMMIT", "ROLLBACK", "DROP", "CREATE", "ALTER", "BEGIN", "IF", "WHILE", "RETURN",
}
_QUOTED = {TokenType.IDENTIFIER, TokenType.STRING, TokenType.NATIONAL_STRING}


def _word(tok: Any) -> str:
    return "" if tok.token_type in _QUOTED else tok.text.upper()


def simple_statements(sql: str) -> list[tuple[str, str]]:
    """Cut a T-SQL batch into ("statement" | "condition", text) parts, dropping control flow."""
    toks = tokenize(sql)
    out: list[tuple[str, str]] = []

    def text(a: int, b: int) -> str:
        return sql[toks[a].start : toks[b].end + 1]

    i = 0
    while i < len(toks):
        w = _word(toks[i])
        nxt = _word(toks[i + 1]) if i + 1 < len(toks) else ""
        if toks[i].token_type == TokenType.SEMICOLON:
            i += 1
        elif w in ("BEGIN", "END") and nxt in ("TRY", "CATCH"):
            i += 2
        elif (w == "BEGIN" and nxt not in ("TRANSACTION", "TRAN")) or w in ("END", "ELSE", "BREAK"):
            i += 1
        elif w in ("IF", "WHILE"):
            j, depth = i + 1, 0
            while j < len(toks):
                t = toks[j]
                if t.token_type == TokenType.L_PAREN:
                    depth += 1
                elif t.token_type == TokenType.R_PAREN:
                    depth -= 1
                elif depth == 0 and _word(t) in _STARTERS:
                    break
                j += 1
            out.append(("condition", f"SELECT CASE WHEN {text(i + 1, j - 1)} THEN 1 END"))
            i = j
        else:
            j, depth, case = i, 0, 0
            while j < len(toks):
                t, tw = toks[j], _word(toks[j])
                if t.token_type == TokenType.L_PAREN:
                    depth += 1
                elif t.token_type == TokenType.R_PAREN:
                    depth -= 1
                elif depth == 0:
                    if t.token_type == TokenType.SEMICOLON:
                        break
                    if tw == "CASE":
                        case += 1
                    elif tw == "END":
                        if not case:
                            break
                        case -= 1
                    elif j > i and not case and tw in ("ELSE", "BEGIN", "IF", "WHILE"):
                        break
                j += 1
            out.append(("statement", text(i, j - 1)))
            i = j
    return out


def parse_all(sql: str) -> list[exp.Expression]:
    """Parse every simple statement of a batch; fail on anything sqlglot does not understand."""
    parsed: list[exp.Expression] = []
    for _kind, part in simple_statements(sql):
        first = part.split(None, 1)[0].upper()
        if first in TEXT_ONLY:
            assert TEXT_ONLY[first].match(part), part
            continue
        try:
            trees = sqlglot.parse(part, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
        except sqlglot.errors.ParseError:
            patched = part
            for pattern, repl, _why in SQLGLOT_GAPS:
                patched = re.sub(pattern, repl, patched)
            assert patched != part, f"sqlglot cannot parse and no known gap applies:\n{part}"
            trees = sqlglot.parse(patched, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
        assert len(trees) == 1 and trees[0] is not None, part
        commands = list(trees[0].find_all(exp.Command))
        assert not commands, f"sqlglot fell back to an opaque command: {commands[0]}"
        parsed.append(trees[0])
    return parsed


def block_words(sql: str) -> list[str]:
    """BEGIN/END words of the batch's control flow (CASE ... END and BEGIN TRANSACTION left out)."""
    toks = tokenize(sql)
    words, case = [], 0
    for i, t in enumerate(toks):
        w, nxt = _word(t), (_word(toks[i + 1]) if i + 1 < len(toks) else "")
        if w == "CASE":
            case += 1
        elif w == "END" and case:
            case -= 1
        elif w == "BEGIN" and nxt not in ("TRANSACTION", "TRAN"):
            words.append("BEGIN " + nxt if nxt in ("TRY", "CATCH") else "BEGIN")
        elif w == "END":
            words.append("END " + nxt if nxt in ("TRY", "CATCH") else "END")
    return words


def comments(sql: str) -> list[str]:
    return [c for t in tokenize(sql) for c in t.comments]


ADDRESSES = {
    "plain": ("Sales", "error"),
    "schema_catalog": ("Sales@[billing]@[shop]", "error@[ops]"),
    "odd_names": ("A_]_B@[my@schema]", f"{EVIL_TABLE}@[x]]y]@[c.d]"),
    "dots": ("Sales.Orders.v1", "errors.all"),
}


#: a key as `due_delayed` makes them: RowVersion, a space, Due in ISO 8601 (style 126)
KEY = "17 2025-01-02T03:04:05.007"
KEY_NO_MS = "3 2025-01-02T03:04:05"


def statements(queue_text: str, error_text: str, consumer: str = EVIL) -> dict[str, list[Statement]]:
    """Every statement the dialect makes, by method name (the consumer, the sink and every other
    value that travels as a parameter are EVIL unless told)."""
    q, e = D.parse_address(queue_text), D.parse_address(error_text, option="errorQueue")
    c = D.claims_table(q)
    s, o, dl = D.companion(q, "Staging"), D.companion(q, "Outbox"), D.companion(q, "Delayed")
    subs = q.with_table("SubscriptionRouting")
    attempts = [consumer, "0" * 32]
    return {
        **send_statements(q, e, s, o, dl, subs, consumer, attempts),
        "create_queue": D.create_queue(q),
        "create_queue_32": D.create_queue(q, seq_bits=32),
        "create_error": D.create_queue(e),
        "create_claims": D.create_claims(c),
        "table_id": [D.table_id(c)],
        "queue_columns": [D.queue_columns(e)],
        "indexes": [D.indexes(q), D.indexes(e)],
        "nullable_columns": [D.nullable_columns(q)],
        "try_lock_consumer": [D.try_lock_consumer(c, consumer)],
        "unlock_consumer": [D.unlock_consumer(c, consumer)],
        "peek": [D.peek(q, after=0, upto=None)],
        "peek_upto": [D.peek(q, after=10, upto=99)],
        "claim": D.claim(q, c, e, consumer=consumer, limit=500, after=0, upto=None),
        "claim_upto": D.claim(q, c, e, consumer=consumer, limit=5000, after=7, upto=12345),
        "backlog": [D.backlog(q)],
        "backlogs": [D.backlogs([q, e, q])],
        "tables_exist": [D.tables_exist([q, dl])],
        "max_claim": [D.max_claim(c, consumer)],
        "nth_claim": [D.nth_claim(c, consumer, after=3, n=50)],
        "read_claims": [D.read_claims(c, consumer, after=3, upto=9)],
        "ack_claims": [D.ack_claims(c, consumer, upto=9, batch=4000)],
        "max_source_seq": [D.max_source_seq(q)],
        "forward_candidates": [D.forward_candidates(c, consumer, lo=3, hi=9)],
        "forward_claims": [D.forward_claims(c, consumer, e, keys=[9, 3], headers=[consumer, "{}"])],
        "forward_claims_plain": [D.forward_claims(c, consumer, q, keys=[3], headers=[consumer])],
        "forward_claims_audit": [D.forward_claims(c, consumer, e, keys=[9, 3], headers=[consumer, "{}"], ttbr_ms=86_400_001)],
        "forward_claims_copy": [D.forward_claims(c, consumer, e, keys=[9, 3], headers=None)],
        "ack_rows": [D.ack_rows(c, consumer, upto=7, batch=100)],
        "claims_with_header": [D.claims_with_header(c, consumer, upto=7, header="ServiceControl.Retry.AcknowledgementQueue", limit=100)],
        "control_messages": [D.control_messages(e, headers=[consumer, "{}"])],
        "set_claim_headers": [D.set_claim_headers(c, consumer, keys=[3, 4], headers=[consumer, "{}"])],
        "drop_claims": [D.drop_claims(c, consumer, keys=[3, 4])],
        **settled_statements(c, consumer),
        **operation_statements(q, e, c, dl, o, subs, consumer),
    }


def settled_statements(c: QueueAddress, value: str) -> dict[str, list[Statement]]:
    """The settled-batches table's statements (`transport.settled`), `value` as every text."""
    b = D.batches_table()
    reads = [BatchRead(D.qualified(c), value, value, 0, 9), BatchRead(D.qualified(c), "other", "7.8", 9, 12)]
    return {
        "create_batches": D.create_batches(b),
        "batches_record": [D.batches_record(b, query_id=value, batch_id=3, reads=reads)],
        "batches_settle": [D.batches_settle(b, query_id=value, batch_id=3)],
        "batches_settled": [D.batches_settled(b, claims=D.qualified(c), consumer=value, table_id=value)],
        "batches_forget": [D.batches_forget(b, claims=D.qualified(c), consumer=value, upto=9, failed=D.failed_table(),
                                            claims_table=c, table_id=value, spans=[])],
        "failed_note": [D.failed_note(D.failed_table(), claims=c, keys=[9, 3])],
        "failed_take_keys": [D.failed_take_keys(D.failed_table(), table_id=value, keys=[9, 3])],
        "failed_among": [D.failed_among(D.failed_table(), table_id=value, keys=[9, 3])],
    }


#: native ids as `lock_messages` takes them (uniqueidentifier text in any case) and keys as it makes them
NATIVE_IDS = ["6F9619FF-8B86-D011-B42D-00C04FC964FF", "{0b4e3c2a-1d5f-4e6a-9b8c-7d6e5f4a3b2c}"]
MESSAGE_KEYS = ["17", "3"]


def operation_statements(
    q: QueueAddress, e: QueueAddress, c: QueueAddress, dl: QueueAddress, o: QueueAddress, subs: QueueAddress,
    value: str,
) -> dict[str, list[Statement]]:
    """The statements of the sqlqueue CLI (`e` the error queue messages are retried from)."""
    return {
        "lock_messages": [D.lock_messages(e, native_ids=None, limit=100)],
        "lock_messages_ids": [D.lock_messages(e, native_ids=NATIVE_IDS, limit=100)],
        "lock_messages_no_ids": [D.lock_messages(e, native_ids=[], limit=100)],
        "move_messages": [D.move_messages(e, q, keys=MESSAGE_KEYS, headers=[value, "{}"])],
        "move_messages_plain": [D.move_messages(e, q, keys=MESSAGE_KEYS[:1], headers=[value])],
        "move_messages_none": [D.move_messages(e, q, keys=[], headers=[])],
        "delete_messages": [D.delete_messages(e, keys=MESSAGE_KEYS)],
        "delete_messages_none": [D.delete_messages(e, keys=[])],
        "peek_messages": [D.peek_messages(q, limit=10, preview=240)],
        "peek_delayed": [D.peek_delayed(dl, limit=10, preview=240)],
        "queue_stats": [D.queue_stats(q)],
        "oldest_headers": [D.oldest_headers(q)],
        "failure_stats": [D.failure_stats(e, limit=100_000)],
        "delayed_stats": [D.delayed_stats(dl)],
        "claim_stats": [D.claim_stats(c)],
        "count_rows": [D.count_rows(o)],
        "purge_expired": [D.purge_expired(q, limit=10_000)],
        "subscribe": [D.subscribe(subs, queue_address=value, endpoint=value, topic=value)],
        "unsubscribe": [D.unsubscribe(subs, endpoint=value, topic=value)],
    }


def send_statements(
    q: QueueAddress, e: QueueAddress, s: QueueAddress, o: QueueAddress, dl: QueueAddress, subs: QueueAddress,
    value: str, attempts: list[str],
) -> dict[str, list[Statement]]:
    return {
        "create_staging": D.create_staging(s),
        "create_outbox": D.create_outbox(o),
        "create_delayed": D.create_delayed(dl),
        "create_subscriptions": D.create_subscriptions(subs),
        "outbox_insert": [D.outbox_insert(o, sink=value, batch_id=7, fingerprint="query " + value)],
        "outbox_get": [D.outbox_get(o, sink=value, batch_id=7)],
        "outbox_finish": [D.outbox_finish(o, sink=value, batch_id=7, sent=3, delayed=2, published=1)],
        "subscribers": [D.subscribers(subs, [value, "Ns.OrderPlaced"])],
        "subscribers_none": [D.subscribers(subs, [])],
        "dispatch": [D.dispatch(s, e, attempts=attempts, route=value, publish_routes=[value, "Ns.A;Ns.B"])],
        "dispatch_plain": [D.dispatch(s, e, attempts=attempts, route=None, publish_routes=[value])],
        "insert_message": [D.insert_message(e, headers=value, body=value.encode(), ttbr_ms=7 * 86_400_000)],
        "insert_message_no_ttbr": [D.insert_message(q, headers=value, body=b"", ttbr_ms=None)],
        "dispatch_send_only": [D.dispatch(s, e, attempts=attempts, route=value, publish_routes=[])],
        "dispatch_none": [D.dispatch(s, e, attempts=[], route=None, publish_routes=[])],
        "staged_messages": [D.staged_messages(s, attempts=attempts, route=value, publish_routes=[value, "Ns.A"])],
        "staged_messages_none": [D.staged_messages(s, attempts=[], route=None, publish_routes=[])],
        "move_staged": [D.move_staged(s, e, keys=[9, 3], headers=[value, "{}"])],
        "move_staged_plain": [D.move_staged(s, q, keys=[3], headers=[value])],
        "move_staged_none": [D.move_staged(s, q, keys=[], headers=[])],
        "dispatch_delayed": [D.dispatch_delayed(s, dl, attempts=attempts)],
        "dispatch_delayed_none": [D.dispatch_delayed(s, dl, attempts=[])],
        "delete_staged": [D.delete_staged(s, attempts=attempts)],
        "delete_batch_leftovers": [D.delete_batch_leftovers(s, sink=value, batch_id=7)],
        "outbox_cleanup": [D.outbox_cleanup(o, older_than_seconds=604800, limit=4000)],
        "staging_cleanup": [D.staging_cleanup(s, older_than_seconds=604800, limit=4000)],
        "any_due": [D.any_due(dl)],
        "lock_mover": [D.lock_mover(dl)],
        "due_delayed": [D.due_delayed(dl, limit=1000)],
        "move_delayed": [D.move_delayed(dl, e, keys=[KEY, KEY_NO_MS], headers=[value, "{}"])],
        "move_delayed_plain": [D.move_delayed(dl, q, keys=[KEY], headers=[value])],
        "move_delayed_none": [D.move_delayed(dl, q, keys=[], headers=[])],
        "delete_delayed": [D.delete_delayed(dl, keys=[KEY, KEY_NO_MS])],
        "delete_delayed_none": [D.delete_delayed(dl, keys=[])],
    }


ALL = [
    pytest.param(method, stmt, id=f"{case}-{method}-{i}")
    for case, (qt, et) in ADDRESSES.items()
    for method, stmts in statements(qt, et).items()
    for i, stmt in enumerate(stmts)
]


def one(stmts: list[Statement]) -> Statement:
    assert len(stmts) == 1
    return stmts[0]


# -- addresses and quoting ----------------------------------------------------------------------


class TestAddresses:
    def test_registered(self) -> None:
        d = dialect_named("sqlserver")
        assert isinstance(d, SqlServerDialect)
        assert (d.name, d.default_schema, d.max_table_bytes) == ("sqlserver", "dbo", 128)

    @pytest.mark.parametrize(
        ("text", "table", "schema", "catalog"),
        [
            ("Sales", "Sales", None, None),
            ("Sales@dbo", "Sales", "dbo", None),
            ("Sales@[billing]", "Sales", "billing", None),
            ("Sales@[billing]@[shop]", "Sales", "billing", "shop"),
            ("Sales@billing@shop", "Sales", "billing", "shop"),
            ("table@[my@schema]@[cat]", "table", "my@schema", "cat"),
            ("t@[a]]@b]@[c]]d]", "t", "a]@b", "c]d"),
            ("t@[]@[cat]", "t", None, "cat"),  # NServiceBus writes an empty schema as []
            ("t@", "t", None, None),
            ("t@[ ]", "t", None, None),  # blank parts mean the default, as in NServiceBus
            ("t@s@c@ignored", "t", "s", "c"),  # parsing stops after the catalog, as in NServiceBus
            ("t@@cat", "t", "@cat", None),  # NServiceBus quirk: a part's first character never splits
            ("[X]", "[X]", None, None),  # the table part is literal: brackets are part of the name
            ("A_]_B", "A_]_B", None, None),
            ("Sales.Orders.v1", "Sales.Orders.v1", None, None),  # dots belong to the table name
            ("t@[a.b]", "t", "a.b", None),
            ("Sales@[unterminated", "Sales", "[unterminated", None),  # unquoted as NServiceBus does: not at all
            (" Sales", " Sales", None, None),  # names are not trimmed: NServiceBus does not trim either
            ("Verkäufe@[Größe]", "Verkäufe", "Größe", None),
        ],
    )
    def test_parse_like_nservicebus(self, text: str, table: str, schema: str | None, catalog: str | None) -> None:
        assert D.parse_address(text) == QueueAddress(table, schema, catalog)

    @pytest.mark.parametrize(
        ("address", "quoted"),
        [
            (QueueAddress("Sales"), "[dbo].[Sales]"),
            (QueueAddress("[X]"), "[dbo].[[X]]]"),
            (QueueAddress("A_]_B"), "[dbo].[A_]]_B]"),
            (QueueAddress("Sales.Orders.v1", "sch"), "[sch].[Sales.Orders.v1]"),
            (QueueAddress("table", "my@schema", "cat"), "[cat].[my@schema].[table]"),
            (QueueAddress(EVIL_TABLE), "[dbo].[error]] ...; DROP TABLE [Victim]]; --]"),
        ],
    )
    def test_qualified(self, address: QueueAddress, quoted: str) -> None:
        assert D.qualified(address) == quoted

    def test_quote_doubles_closing_brackets_only(self) -> None:
        assert D.quote("a]b[c") == "[a]]b[c]"
        assert D.quote("]]") == "[]]]]]"

    @pytest.mark.parametrize("name", ["[X]", "A_]_B", EVIL_TABLE, "Sales.Orders.v1", "a]]]b", "x'y\"z", "--", "/*"])
    def test_quoted_name_is_one_identifier(self, name: str) -> None:
        """Whatever the name, it comes out of sqlglot's T-SQL parser as exactly one table name:
        it cannot end the identifier early and run as SQL."""
        for addr in (QueueAddress(name), QueueAddress("t", name, name)):
            trees = sqlglot.parse(f"SELECT * FROM {D.qualified(addr)}", read="tsql")
            assert len(trees) == 1
            table = trees[0].find(exp.Table)
            assert (table.name, table.db or None, table.catalog or None) == (
                addr.table, addr.schema or "dbo", addr.catalog,
            )
            assert not list(trees[0].find_all(exp.Drop, exp.Command))

    @pytest.mark.parametrize(
        ("address", "text"),
        [
            (QueueAddress("Sales"), "Sales@[dbo]"),
            (QueueAddress("Sales", "billing"), "Sales@[billing]"),
            (QueueAddress("Sales", "billing", "shop"), "Sales@[billing]@[shop]"),
            (QueueAddress("Sales", None, "shop"), "Sales@[dbo]@[shop]"),
            (QueueAddress("table", "my@schema", "c]at"), "table@[my@schema]@[c]]at]"),
            (QueueAddress("[X]"), "[X]@[dbo]"),
        ],
    )
    def test_format_canonical(self, address: QueueAddress, text: str) -> None:
        assert D.format_address(address) == text

    @pytest.mark.parametrize(
        "address",
        [
            QueueAddress("Sales"),
            QueueAddress("A_]_B", "x]]y", "c@t"),
            QueueAddress("table", "my@schema", "cat"),
            QueueAddress("t", "[lead", "]trail"),
            QueueAddress("Sales.Orders.v1", "a.b", "c.d"),
            QueueAddress(EVIL_TABLE, EVIL_TABLE, EVIL_TABLE),
        ],
    )
    def test_format_parse_round_trip(self, address: QueueAddress) -> None:
        back = D.parse_address(D.format_address(address))
        assert back == QueueAddress(address.table, address.schema or "dbo", address.catalog)

    def test_format_refuses_at_in_table(self) -> None:
        with pytest.raises(ConfigError, match="contains '@'"):
            D.format_address(QueueAddress("a@b"))

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("", "option 'errorQueue' is empty"),
            ("   ", "option 'errorQueue' is empty"),
            ("@dbo", "option 'errorQueue': invalid queue address '@dbo': table name is empty"),
            (" @dbo", "table name is empty"),
            ("a\x00b", "NUL"),
            ("t@[s\x00]", "schema name .* NUL"),
            ("x" * 129, "longer than 128 characters"),
            ("t@" + "s" * 129, "schema name .* longer than 128"),
            ("t@s@" + "c" * 129, "catalog name .* longer than 128"),
            ("#temp", "temporary tables"),
        ],
    )
    def test_invalid(self, text: str, message: str) -> None:
        with pytest.raises(ConfigError, match=message) as err:
            D.parse_address(text, option="errorQueue")
        assert err.value.option == "errorQueue"

    def test_none_is_empty(self) -> None:
        with pytest.raises(ConfigError, match="option 'queue' is empty"):
            D.parse_address(None)  # type: ignore[arg-type]

    def test_frozen(self) -> None:
        import dataclasses

        with pytest.raises(dataclasses.FrozenInstanceError):
            D.default_schema = "x"  # type: ignore[misc]
        assert D.adapt_to_server(160000, QueueAddress("Sales.Claims")) == (D, None)

    def test_128_characters_not_bytes(self) -> None:
        assert D.parse_address("x" * 128).table == "x" * 128
        assert D.parse_address("ä" * 128).table == "ä" * 128  # 256 bytes in UTF-8: still a valid name
        with pytest.raises(ConfigError):
            D.quote("ä" * 129)

    def test_claims_table(self) -> None:
        assert D.claims_table(D.parse_address("Sales@[b]@[c]")) == QueueAddress("Sales.Claims", "b", "c")
        assert D.claims_table(QueueAddress("ä" * 121)).table == "ä" * 121 + ".Claims"
        with pytest.raises(ConfigError, match="its table .* would exceed 128 characters"):
            D.claims_table(QueueAddress("x" * 122))


# -- every statement ----------------------------------------------------------------------------


class TestEveryStatement:
    @pytest.mark.parametrize(("method", "stmt"), ALL)
    def test_markers_match_params(self, method: str, stmt: Statement) -> None:
        params = stmt.params
        assert params is None or isinstance(params, tuple), "pyodbc takes positional parameters"
        n = len(params or ())
        assert len(placeholders(stmt.sql)) == n
        assert sum(t.token_type == TokenType.PLACEHOLDER for t in tokenize(stmt.sql)) == n
        if "?" not in "".join(a for pair in ADDRESSES.values() for a in pair):
            assert stmt.sql.count("?") == n

    @pytest.mark.parametrize(("method", "stmt"), ALL)
    def test_consumer_never_in_sql_text(self, method: str, stmt: Statement) -> None:
        assert EVIL not in stmt.sql and "evil" not in stmt.sql
        if method in ("try_lock_consumer", "unlock_consumer", "claim", "claim_upto", "max_claim", "nth_claim",
                      "read_claims", "ack_claims", "subscribe", "unsubscribe"):
            # the consumer lock takes it folded (see test_consumer_lock_folds_case_and_trailing_spaces)
            assert any(EVIL in p or EVIL.upper() in p for p in stmt.params if isinstance(p, str))

    @pytest.mark.parametrize(("method", "stmt"), ALL)
    def test_params_are_plain_values(self, method: str, stmt: Statement) -> None:
        # no None (pyodbc would have to guess the type of a NULL), no bools, nothing exotic
        for p in stmt.params or ():
            assert type(p) in (int, str), (method, p)

    @pytest.mark.parametrize(("method", "stmt"), ALL)
    def test_parses(self, method: str, stmt: Statement) -> None:
        trees = parse_all(stmt.sql)
        assert trees
        for drop in (t for t in trees if isinstance(t, exp.Drop)):  # only the batch's own temp tables
            assert drop.sql("tsql") in ("DROP TABLE #sqlqueue_moved", "DROP TABLE #sqlqueue_keys")

    @pytest.mark.parametrize(("method", "stmt"), ALL)
    def test_blocks_balance(self, method: str, stmt: Statement) -> None:
        stack: list[str] = []
        for w in block_words(stmt.sql):
            if w.startswith("BEGIN"):
                stack.append(w.replace("BEGIN", "END"))
            else:
                assert stack and stack.pop() == w, (w, stmt.sql)
        assert not stack
        assert stmt.sql.count("BEGIN TRANSACTION") == stmt.sql.count("COMMIT TRANSACTION") - (
            1 if "ERROR_NUMBER() IN (2714, 1913)" in stmt.sql or "ERROR_NUMBER() IN (2705)" in stmt.sql else 0
        )

    @pytest.mark.parametrize(("method", "stmt"), ALL)
    def test_comments_are_inert(self, method: str, stmt: Statement) -> None:
        """Drivers scan for ``?`` markers and literals; a comment must not look like either."""
        for c in comments(stmt.sql):
            assert not set(c) & set("?'\"[]"), c

    @pytest.mark.parametrize(("method", "stmt"), ALL)
    def test_nocount_only_in_parameterized_batches(self, method: str, stmt: Statement) -> None:
        # A parameterized batch runs in sp_executesql/sp_prepexec: its SET options end with it.
        # Without parameters a SET NOCOUNT ON would stay on the session and hide rowcounts.
        if "SET NOCOUNT ON" in stmt.sql or "SET XACT_ABORT ON" in stmt.sql:
            assert stmt.params

    @pytest.mark.parametrize("case", [c for c in ADDRESSES if c != "plain"])
    def test_names_change_only_quoted_identifiers(self, case: str) -> None:
        """Token for token, the SQL made for odd names equals the SQL made for plain names of the
        same shape except inside quoted identifiers: a name cannot add or change a statement."""
        odd = statements(*ADDRESSES[case])
        plain = statements(*(_skeleton(t) for t in ADDRESSES[case]))
        for method in plain:
            for a, b in zip(plain[method], odd[method], strict=True):
                assert _shape(a.sql) == _shape(b.sql), method


def _skeleton(text: str) -> str:
    """A plain address of the same shape (schema and catalog given or not)."""
    a = D.parse_address(text)
    return D.format_address(QueueAddress("T", "S" if a.schema else None, "C" if a.catalog else None)).replace(
        "@[dbo]", "" if a.schema is None and a.catalog is None else "@[]"
    )


def _shape(sql: str) -> list[str]:
    return ["<name>" if t.token_type == TokenType.IDENTIFIER else t.text for t in tokenize(sql)]


class TestNoUserTextInSql:
    """User values travel only as parameters; names only as quoted identifiers."""

    @pytest.mark.parametrize("consumer", [EVIL, "Billing]; --", "a?b", "x" * 200])
    def test_consumer_only_in_params(self, consumer: str) -> None:
        q, e = D.parse_address("Sales"), D.parse_address("error")
        c = D.claims_table(q)
        stmts = [
            D.try_lock_consumer(c, consumer),
            D.unlock_consumer(c, consumer),
            *D.claim(q, c, e, consumer=consumer, limit=10, after=0, upto=None),
            *D.claim(q, c, e, consumer=consumer, limit=10, after=0, upto=5),
            D.max_claim(c, consumer),
            D.nth_claim(c, consumer, after=0, n=3),
            D.read_claims(c, consumer, after=0, upto=1),
            D.ack_claims(c, consumer, upto=1, batch=10),
        ]
        for s in stmts:
            assert consumer not in s.sql and consumer.upper() not in s.sql
            assert any(consumer in p or consumer.upper() in p for p in s.params if isinstance(p, str)), s.sql

    def test_evil_name_only_quoted(self) -> None:
        """The evil name as table, schema and catalog: wherever it shows in SQL text it is one
        quoted identifier token, never SQL."""
        quoted_schema = EVIL_TABLE.replace("]", "]]")
        for method, stmts in statements(f"{EVIL_TABLE}@[{quoted_schema}]@[{quoted_schema}]", EVIL_TABLE).items():
            if method in ("create_batches", "batches_settle", "failed_take_keys", "failed_among"):  # the database's tables, by
                continue  # query and batch or by a claim table's id: no queue name
            for s in stmts:
                tokens = tokenize(s.sql)
                outside = [t for t in tokens if "Victim" in t.text and t.token_type != TokenType.IDENTIFIER]
                assert not outside, (method, outside)
                names = {t.text for t in tokens if "Victim" in t.text}
                assert names <= {EVIL_TABLE, *(f"{EVIL_TABLE}.{x}" for x in ("Claims", "Staging", "Outbox", "Delayed"))}, (
                    method, names,
                )
                # the name is there: quoted in the text, or as a parameter
                assert names or any("Victim" in p for p in s.params or () if isinstance(p, str)), method
                assert not [t for t in parse_all(s.sql) if isinstance(t, exp.Drop) and "Victim" in t.sql("tsql")]

    def test_consumer_length(self) -> None:
        c = D.claims_table(D.parse_address("Sales"))
        with pytest.raises(ConfigError, match="^consumer: consumer name"):
            D.read_claims(c, "x" * 201, after=0, upto=1)
        with pytest.raises(ConfigError, match="^consumer: consumer name"):
            D.try_lock_consumer(c, "")
        # nvarchar(200) counts UTF-16 code units: 101 emoji are 202 of them, and would be cut
        with pytest.raises(ConfigError, match="^consumer: consumer name"):
            D.claim(c, c, c, consumer="\U0001f600" * 101, limit=1, after=0, upto=None)
        D.read_claims(c, "\U0001f600" * 100, after=0, upto=1)

    def test_lock_resource_fits_and_stays_distinct(self) -> None:
        c = D.claims_table(QueueAddress("q" * 100, "s" * 100))
        a, b = D.try_lock_consumer(c, "x" * 199 + "a"), D.try_lock_consumer(c, "x" * 199 + "b")
        assert a.params != b.params
        # "sqlqueue consumer " + two ints as text + " " + the consumer: within nvarchar(255)
        for consumer in ("x" * 200, "\U0001f600" * 100, "\U0001f600" * 99 + "a", "\u00df" * 200):
            part = D.try_lock_consumer(c, consumer).params[1]
            assert len("sqlqueue consumer ") + 23 + 1 + len(part.encode("utf-16-le")) // 2 <= 255
        # folded longer than the resource holds ("\u00df" upper-cases to "SS"): a digest, never truncated
        x, y = (D.try_lock_consumer(c, "\u00df" * 199 + t).params[1] for t in "ab")
        assert x != y and re.fullmatch("[0-9a-f]{64}", x)
        short = D.try_lock_consumer(D.claims_table(QueueAddress("Sales")), "Billing")
        assert short.params == ("[dbo].[Sales.Claims]", "BILLING")
        assert D.unlock_consumer(D.claims_table(QueueAddress("Sales")), "Billing").params == short.params


# -- the statements, one by one -----------------------------------------------------------------


def _flat(sql: str) -> str:
    return " ".join(sql.split())


class TestInstallers:
    def test_queue_table_is_nservicebus_layout(self) -> None:
        s = one(D.create_queue(D.parse_address("Sales")))
        assert s.params == ("[dbo].[Sales]",)
        (create,) = [t for t in parse_all(s.sql) if isinstance(t, exp.Create) and t.kind == "TABLE"]
        cols = {c.name: c.args["kind"].sql("tsql") for c in create.find_all(exp.ColumnDef)}
        assert cols == {
            "Id": "UNIQUEIDENTIFIER", "CorrelationId": "VARCHAR(255)", "ReplyToAddress": "VARCHAR(255)",
            "Recoverable": "BIT", "Expires": "DATETIME", "Headers": "NVARCHAR(MAX)", "Body": "VARBINARY(MAX)",
            "RowVersion": "BIGINT",
        }
        flat = _flat(s.sql)
        for column in ("Id uniqueidentifier NOT NULL", "CorrelationId varchar(255) NULL", "Recoverable bit NOT NULL",
                       "Expires datetime NULL", "Headers nvarchar(max) NOT NULL", "Body varbinary(max) NULL",
                       "RowVersion bigint IDENTITY(1,1) NOT NULL"):
            assert column in flat
        assert "CLUSTERED" not in flat.replace("NONCLUSTERED", "")  # a heap, like NServiceBus's
        assert "CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [dbo].[Sales] (RowVersion);" in flat
        assert ("CREATE NONCLUSTERED INDEX [Index_Expires] ON [dbo].[Sales] (Expires) INCLUDE (Id, RowVersion)"
                " WHERE Expires IS NOT NULL;") in flat
        assert "CREATE SCHEMA" not in flat  # no schema named: dbo exists

    def test_idempotent_with_nservicebus_lock(self) -> None:
        flat = _flat(one(D.create_queue(D.parse_address("Sales"))).sql)
        check = "IF NOT EXISTS (SELECT * FROM sys.objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')"
        assert flat.count(check) == 2  # before the lock and again under it
        assert flat.index(check) < flat.index("BEGIN TRANSACTION") < flat.index("sp_getapplock") < flat.rindex(check)
        # NServiceBus's resource: '[catalog].[schema].[table]_lock', catalog = the current database
        assert "DECLARE @lock nvarchar(255) = QUOTENAME(DB_NAME()) + N'.' + @table + N'_lock';" in flat
        assert "@LockMode = N'Exclusive', @LockOwner = N'Transaction'" in flat
        assert "IF ERROR_NUMBER() IN (2714, 1913) AND XACT_STATE() = 1 COMMIT TRANSACTION;" in flat

    def test_catalog_and_schema(self) -> None:
        s = one(D.create_queue(D.parse_address("Sales@[billing]@[shop]")))
        assert s.params == ("[shop].[billing].[Sales]", "billing", "[billing]")
        flat = _flat(s.sql)
        assert "DECLARE @lock nvarchar(255) = @table + N'_lock';" in flat
        assert "FROM [shop].sys.objects WHERE" in flat and "FROM [shop].sys.schemas WHERE name = @schema" in flat
        assert "DECLARE @createSchema nvarchar(max) = N'CREATE SCHEMA ' + ?;" in flat
        assert "EXEC [shop].sys.sp_executesql @createSchema;" in flat  # runs in the catalog it belongs to
        assert "IF ERROR_NUMBER() <> 2714 THROW;" in flat
        assert "CREATE TABLE [shop].[billing].[Sales] (" in flat

    def test_schema_name_is_a_quoted_parameter(self) -> None:
        s = one(D.create_queue(D.parse_address(f"q@[{EVIL_TABLE.replace(']', ']]')}]")))
        assert s.params[1:] == (EVIL_TABLE, "[error]] ...; DROP TABLE [Victim]]; --]")

    def test_seq_bits(self) -> None:
        assert "RowVersion int IDENTITY(1,1) NOT NULL" in one(D.create_queue(QueueAddress("q"), seq_bits=32)).sql
        with pytest.raises(ConfigError, match="seq_bits"):
            D.create_queue(QueueAddress("q"), seq_bits=16)

    def test_claims_table(self) -> None:
        (s,) = D.create_claims(D.claims_table(D.parse_address("Sales")))
        flat = _flat(s.sql)
        assert s.params == ("[dbo].[Sales.Claims]",)
        for column in ("Consumer nvarchar(200) COLLATE Latin1_General_BIN2 NOT NULL", "ClaimSeq bigint IDENTITY(1,1) NOT NULL",
                       "Id uniqueidentifier NOT NULL", "Expires datetime NULL", "Headers nvarchar(max) NOT NULL",
                       "Body varbinary(max) NULL", "SourceSeq bigint NOT NULL",
                       "ClaimedAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME()",
                       "PRIMARY KEY CLUSTERED (Consumer, ClaimSeq)"):
            assert column in flat
        assert "ALTER TABLE [dbo].[Sales.Claims] SET (LOCK_ESCALATION = DISABLE);" in flat
        assert "sp_getapplock" in flat and flat.count("OBJECT_ID(@table) AND type = N'U'") == 2


class TestReceiveStatements:
    Q, E = QueueAddress("Sales"), QueueAddress("error")
    C = QueueAddress("Sales.Claims")

    def test_failed_marks(self) -> None:
        """The sink marks the claims it failed in the database's failed-claims table, by the claim
        table's identity as the reader's set-up reads it (`table_id`: OBJECT_ID of the qualified
        name, as nvarchar) and the claim's number; NServiceBus has no counterpart (its handler and
        its receive share one transaction, so it never audits a failed message). The mistakes it
        could make: a NULL identity (no claim table: nothing is written), a key marked twice (a
        dispatch retried: NOT EXISTS under UPDLOCK + HOLDLOCK, so two never race to insert it), a
        parameter per key (OPENJSON: one), an identity of another spelling (the same expression
        as `table_id`). The acknowledgement's chunk deletes and returns the marks of its own claims
        (OUTPUT deleted; by key, not by range: the identity interleaves consumers' claims), and the
        forget of acknowledged batches takes the marks no claim needs any more."""
        f = D.failed_table()
        s = D.failed_note(f, claims=self.C, keys=[9, 3])
        assert s.params == ("[dbo].[Sales.Claims]", "[9,3]")
        assert _flat(s.sql) == (
            "INSERT INTO [dbo].[SqlQueue.Failed] (TableId, ClaimSeq)"
            " SELECT i.TableId, k.ClaimSeq FROM (SELECT CAST(OBJECT_ID(?) AS nvarchar(20)) AS TableId) AS i"
            " CROSS JOIN OPENJSON(?) WITH (ClaimSeq bigint '$') AS k"
            " WHERE i.TableId IS NOT NULL AND NOT EXISTS (SELECT 1 FROM [dbo].[SqlQueue.Failed] AS f"
            " WITH (UPDLOCK, HOLDLOCK, ROWLOCK) WHERE f.TableId = i.TableId AND f.ClaimSeq = k.ClaimSeq)")
        assert "CAST(OBJECT_ID(?) AS nvarchar(20))" in D.table_id(self.C).sql  # the reader's identity, spelled alike
        _marks_match(s)
        take = D.failed_take_keys(f, table_id="123", keys=[9, 3])
        assert take.params == ("123", "[9,3]")  # a consumer's own claims: identities interleave consumers
        assert _flat(take.sql) == ("DELETE [dbo].[SqlQueue.Failed] WITH (ROWLOCK) OUTPUT deleted.ClaimSeq WHERE TableId = ?"
                                   " AND ClaimSeq IN (SELECT k.ClaimSeq FROM OPENJSON(?) WITH (ClaimSeq bigint '$') AS k)")
        # the marks no claim needs: a claim gone from the claim table, whoever's; a claim read by its
        # acknowledgement (UPDLOCK) is seen and keeps its mark, one being deleted (X) was taken first
        forget = D.batches_forget(D.batches_table(), claims="[dbo].[Sales.Claims]", consumer="c", upto=9, failed=f,
                                  claims_table=self.C, table_id="123", spans=[])
        assert forget.params == ("123", 9, "[dbo].[Sales.Claims]", "c", 9)
        assert _flat(forget.sql).startswith(
            "SET NOCOUNT ON; DELETE f FROM [dbo].[SqlQueue.Failed] AS f WITH (ROWLOCK) WHERE f.TableId = ?"
            " AND f.ClaimSeq <= ? AND NOT EXISTS (SELECT 1 FROM [dbo].[Sales.Claims] AS c WITH (READPAST)"
            " WHERE c.ClaimSeq = f.ClaimSeq);")
        (_, table) = D.create_batches(D.batches_table())
        assert "PRIMARY KEY CLUSTERED (TableId, ClaimSeq)" in _flat(table.sql)
        assert "TableId nvarchar(20) NOT NULL" in _flat(table.sql)  # as long as table_id's CAST

    def test_backlogs_of_many_queues_are_nservicebus_peeks_in_one_statement(self) -> None:
        """A stream's idle check: the backlog statement (`backlog`, the span of RowVersion, READPAST
        so a row being received is skipped, never waited on) once per queue, one UNION ALL branch
        each, tagged with its index. ServiceControl's QueueLengthProvider batches the same peek
        (10 queues a command, WITH (nolock), a result each); ours stays a locking read that skips
        held rows, as our one-queue backlog does. A branch's value can never be NULL (isnull)."""
        s = D.backlogs([self.Q, self.E])
        assert s.params is None
        branches = _flat(s.sql).split(" UNION ALL ")
        assert len(branches) == 2
        for i, (branch, queue) in enumerate(zip(branches, (self.Q, self.E), strict=True)):
            peek = _flat(D.backlog(queue).sql)
            assert branch == f"SELECT {i}, ({peek})"
            assert "WITH (READPAST, READCOMMITTEDLOCK)" in branch

    def test_tables_exist_binds_names_and_sees_user_tables_only(self) -> None:
        """Whether each delayed table exists, for many queues in one statement: the names travel
        as one JSON parameter (never pasted), OBJECT_ID with type 'U' (no view, no synonym)."""
        dl = D.companion(self.Q, "Delayed")
        s = D.tables_exist([self.Q, dl])
        assert s.params == (json.dumps([D.qualified(self.Q), D.qualified(dl)]),)
        assert "OBJECT_ID(j.[value], N'U')" in s.sql and "OPENJSON(?)" in s.sql
        assert D.qualified(dl) not in s.sql

    def test_out_of_connections_is_its_own_class(self) -> None:
        """17809 (the server's user connections are all taken) is waited on briefly and then
        reported naming the limit (@@MAX_CONNECTIONS), not ridden through as an outage."""
        full = Exception("08001", "[08001] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Could not connect "
                         "because the maximum number of '30' user connections has already been reached. (17809)")
        lost = Exception("08S01", "[08S01] [Microsoft][ODBC Driver 18 for SQL Server]Communication link failure (0)")
        assert D.is_out_of_connections(full) and not D.is_out_of_connections(lost)
        assert D.connection_limit().sql == "SELECT @@MAX_CONNECTIONS"

    def test_claim_statements_name_no_failed_column(self) -> None:
        """The claims the sink failed are marked in ``SqlQueue.Failed`` (`test_failed_marks`), not
        in the claim table: a claim table an earlier version made, with its ``Failed`` column or
        without one, is read alike; the chunk read gives (ClaimSeq, Headers, ClaimedAt)."""
        rows = _flat(D.ack_rows(self.C, "Billing", upto=9, batch=10).sql)
        assert rows.startswith("SELECT TOP (?) ClaimSeq, Headers, ClaimedAt FROM")
        for method, stmts in statements("Sales", "Billing").items():
            for stmt in stmts:
                assert not re.search(r"\bFailed\b(?!\])", stmt.sql), method  # [SqlQueue.Failed] is the table

    def claim(self, **kw: Any) -> Statement:
        args = {"consumer": "Billing", "limit": 100, "after": 0, "upto": None, **kw}
        return one(D.claim(self.Q, self.C, self.E, **args))

    def test_claim_params_in_marker_order(self) -> None:
        lock = ("[dbo].[Sales.Claims]", "BILLING")  # the consumer lock the claim checks first
        assert self.claim().params[:6] == (*lock, 100, 0, "Billing", "[dbo].[error]")  # the lock's name folded
        assert self.claim(after=5, upto=9).params[:7] == (*lock, 100, 5, 9, "Billing", "[dbo].[error]")
        # then the failure headers of a row without an Id, one variable each, in FAILURE_HEADERS order
        failure = self.claim().params[6:]
        assert len(failure) == len(FAILURE_HEADERS) and failure[0] == "Sales@[dbo]"
        flat = _flat(self.claim(after=5, upto=9).sql)
        assert flat.index("@limit bigint = ?") < flat.index("@after bigint = ?") < flat.index("@upto bigint = ?") \
            < flat.index("@consumer nvarchar(200) = ?") < flat.index("@error nvarchar(776) = ?")

    def test_claim_checks_the_consumer_lock_first(self) -> None:
        # a session-owned applock vanishes with its server session: the claim refuses to run unless
        # the lock is held here, or (a claim made ahead on a second session) by another session
        flat = _flat(self.claim().sql)
        assert flat.index("IF @held = 0 THROW 51000,") < flat.index("SET XACT_ABORT ON;")
        assert ("EXEC sys.sp_executesql N'SET @held = CASE WHEN APPLOCK_MODE(N''public'', @resource, N''Session'')"
                " <> N''NoLock'' OR APPLOCK_TEST(N''public'', @resource, N''Exclusive'', N''Session'') = 0"
                " THEN 1 ELSE 0 END;'") in flat
        lock = _flat(D.try_lock_consumer(self.C, "Billing").sql)
        resource = re.search(r"DECLARE @resource nvarchar\(255\) = (.*?);", lock)
        assert resource and resource[1].replace("@table", "@lockTable").replace("@consumer", "@lockConsumer") in flat
        other = _flat(one(D.claim(QueueAddress("Sales", "s", "cat"), QueueAddress("Sales.Claims", "s", "cat"),
                                  self.E, consumer="B", limit=1, after=0, upto=None)).sql)
        assert "EXEC [cat].sys.sp_executesql N'SET @held" in other  # the claim table's database, where the lock is

    def test_claim_takes_oldest_unlocked_rows(self) -> None:
        flat = _flat(self.claim().sql)
        assert ("WITH picked AS ( SELECT TOP (@chunk) Id, Expires, Headers, Body, RowVersion"
                " FROM [dbo].[Sales] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE RowVersion > @after"
                " ORDER BY RowVersion )") in flat
        assert ("DELETE FROM picked OUTPUT deleted.Id, deleted.Expires, ISNULL(deleted.Headers, N''), deleted.Body,"
                " deleted.RowVersion"
                " INTO #sqlqueue_moved (Id, Expires, Headers, Body, RowVersion);") in flat
        assert "RowVersion <= @upto" not in flat
        assert "WHERE RowVersion > @after AND RowVersion <= @upto ORDER BY RowVersion" in _flat(self.claim(upto=9).sql)

    def test_claim_chunks_stay_below_lock_escalation(self) -> None:
        assert CLAIM_CHUNK < 5000 / 2  # a heap row costs a RID lock and index key locks
        flat = _flat(self.claim(limit=10_000).sql)
        assert "WHILE @limit > 0 BEGIN" in flat
        assert f"SET @chunk = CASE WHEN @limit < {CLAIM_CHUNK} THEN @limit ELSE {CLAIM_CHUNK} END;" in flat
        assert "IF @n < @chunk BREAK;" in flat  # fewer rows than asked: the queue has no more for us

    def test_claim_is_all_or_nothing_read_committed(self) -> None:
        sql = self.claim().sql
        assert sql.startswith("SET NOCOUNT ON;")  # the final SELECT is the batch's first result
        assert "SET XACT_ABORT ON;" in sql
        assert "SNAPSHOT" not in sql and "NOLOCK" not in sql and "TRANSACTION" not in sql  # caller's transaction

    def test_claim_expired_and_poison(self) -> None:
        flat = _flat(self.claim().sql)
        assert "Expired = CASE WHEN Expires IS NOT NULL AND Expires <= GETUTCDATE() THEN 1 ELSE 0 END" in flat
        poison = flat[flat.index("Poison = CASE"):]
        # empty headers are an empty set, as NServiceBus reads them (DATALENGTH: N'  ' = N'' is true)
        assert poison.startswith("Poison = CASE WHEN DATALENGTH(Headers) = 0 THEN 0 WHEN ISJSON(Headers) = 1 AND LEFT(LTRIM(")
        assert "= N'{' THEN CASE WHEN EXISTS (SELECT 1 FROM OPENJSON(CASE WHEN ISJSON(Headers) = 1 THEN Headers END)" \
            " WHERE type NOT IN (0, 1)) THEN 1 ELSE 0 END ELSE 1 END," in poison

    def test_poison_dead_lettered_before_expiry(self) -> None:
        # NServiceBus moves a corrupted row to the error queue before it looks at Expires: an
        # expired poison row is dead-lettered too, never dropped; expired counts the others only.
        flat = _flat(self.claim().sql)
        assert "SELECT @poison = COUNT(*) FROM #sqlqueue_moved WHERE Poison = 1;" in flat
        assert "SELECT Poison = 1 AND Expired = 0" not in flat and "Poison = 1 AND Expired" not in flat
        assert "SELECT @expired = COUNT(*) FROM #sqlqueue_moved WHERE Poison = 0 AND Expired = 1;" in flat

    @pytest.mark.parametrize("recoverable", [False, True])
    def test_poison_to_error_queue_with_or_without_recoverable(self, recoverable: bool) -> None:
        flat = _flat(self.claim().sql)
        check = ("IF EXISTS (SELECT 1 FROM sys.columns WHERE object_id = OBJECT_ID(@error)"
                 " AND name = N'Recoverable') SET @insertError = ")
        assert check in flat
        # both variants are dynamic SQL run per chunk of poison rows: each parses once the name is put in
        texts = re.findall(r"(?:DECLARE @insertError nvarchar\(max\)|SET @insertError) = N'INSERT INTO ' \+ @error \+ N'([^']*)';", flat)
        assert len(texts) == 2
        dynamic = "INSERT INTO [dbo].[error]" + texts[1 if recoverable else 0]
        tree = sqlglot.parse_one(dynamic, read="tsql")
        assert isinstance(tree, exp.Insert)
        columns = ["Id", "Recoverable", "Expires", "Headers", "Body"] if recoverable else ["Id", "Expires", "Headers", "Body"]
        assert [c.name for c in tree.this.expressions] == columns
        assert dynamic.endswith(f"FROM #sqlqueue_moved WHERE PoisonPos > @from AND PoisonPos <= @from + {CLAIM_CHUNK}"
                                " ORDER BY PoisonPos")
        assert "EXEC sys.sp_executesql @insertError, N'@from int', @from = @from;" in flat
        # numbered in queue order, one chunk per call, every chunk
        assert "ROW_NUMBER() OVER (ORDER BY RowVersion) AS Pos FROM #sqlqueue_moved WHERE Poison = 1 OR NullId = 1" in flat
        assert "SET @toError = @poison + @nullId; IF @toError > 0 BEGIN" in flat
        assert "WHILE @from < @toError BEGIN EXEC sys.sp_executesql" in flat
        assert f"SET @from = @from + {CLAIM_CHUNK}; END" in flat
        other_catalog = _flat(one(D.claim(self.Q, self.C, QueueAddress("error", "ops", "cat"), consumer="B",
                                          limit=1, after=0, upto=None)).sql)
        assert "FROM [cat].sys.columns WHERE object_id = OBJECT_ID(@error)" in other_catalog

    def test_null_headers_and_null_ids_never_fail_a_claim(self) -> None:
        """NULL Headers are no headers (MessageRow.GetHeaders: DBNull -> null; Message: IsNullOrEmpty
        -> an empty set); a row without an Id, which the receive of NServiceBus fails on at every
        attempt, goes to the error queue with a new Id and the failure headers merged into its own."""
        flat = _flat(self.claim().sql)
        assert "CREATE TABLE #sqlqueue_moved ( Id uniqueidentifier NULL," in flat
        assert ("UPDATE #sqlqueue_moved SET NullId = CASE WHEN Id IS NULL AND Poison = 0 AND Expired = 0"
                " THEN 1 ELSE 0 END;") in flat
        assert "UPDATE #sqlqueue_moved SET Id = NEWID() WHERE Id IS NULL AND (Poison = 1 OR NullId = 1);" in flat
        merge = re.search(r"IF @nullId > 0 UPDATE #sqlqueue_moved SET Headers = (.*) WHERE NullId = 1;", flat)
        assert merge
        # the retry counters removed (a NULL deletes in lax mode), then one JSON_MODIFY per failure
        # header, on the row's headers ('' read as {}), values bound
        expr = sqlglot.parse_one(merge[1], read="tsql")
        modified = len(RETRY_COUNTERS) + len(FAILURE_HEADERS)
        assert merge[1].count("JSON_MODIFY(") == modified
        assert merge[1].startswith("JSON_MODIFY(" * modified
                                   + "CASE WHEN DATALENGTH(Headers) = 0 THEN N'{}' ELSE Headers END,")
        for name in RETRY_COUNTERS:
            assert f"N'$.\"{name}\"', NULL)" in merge[1]
        for n, name in enumerate(FAILURE_HEADERS):
            assert f"N'$.\"{name}\"', @failure{n})" in merge[1]
            assert f"DECLARE @failure{n} nvarchar(max) = ?;" in flat
        assert expr is not None
        failures = ClaimFailures.build(failed_q="Sales@[dbo]", endpoint="Billing")
        params = one(D.claim(self.Q, self.C, self.E, consumer="Billing", limit=1, after=0, upto=None,
                             failures=failures)).params
        assert dict(zip(FAILURE_HEADERS, params[6:], strict=True)) == json.loads(failures.null_id)
        assert "column id is NULL" in params[8]

    def test_failure_header_names_must_be_plain_to_enter_a_json_path(self) -> None:
        bad = ClaimFailures(null_id=json.dumps({"x'] DROP": "1"}), far_expires="{}", slot="s")
        with pytest.raises(QTransportError, match="cannot be merged"):
            D.claim(self.Q, self.C, self.E, consumer="B", limit=1, after=0, upto=None, failures=bad)

    def test_claimed_in_queue_order(self) -> None:
        flat = _flat(self.claim().sql)
        assert ("INSERT INTO [dbo].[Sales.Claims] (Consumer, Id, Expires, Headers, Body, SourceSeq)"
                " OUTPUT inserted.ClaimSeq INTO @claimedSeq (ClaimSeq)"
                " SELECT @consumer, Id, Expires, Headers, Body, RowVersion FROM #sqlqueue_moved"
                " WHERE Poison = 0 AND Expired = 0 AND NullId = 0 ORDER BY RowVersion;") in flat

    def test_claim_result_row(self) -> None:
        last = parse_all(self.claim().sql)[-1]
        assert isinstance(last, exp.Select)
        assert [e.alias for e in last.expressions] == ["deleted", "expired", "poison", "claimed", "max_claim", "max_source", "min_claim", "forward", "null_id"]
        assert [e.this.name for e in last.expressions] == ["deleted", "expired", "poison", "claimed", "maxClaim", "maxSource", "minClaim", "forward", "nullId"]
        assert set(e.alias for e in last.expressions) <= set(ClaimResult.__dataclass_fields__)
        # the only statement returning rows: every other SELECT of the batch assigns variables
        selects = [part for kind, part in simple_statements(self.claim().sql)
                   if kind == "statement" and part.startswith("SELECT")]
        for part in selects[:-1]:
            tree = sqlglot.parse_one(part, read="tsql")
            assert all(isinstance(e, exp.EQ) and isinstance(e.this, exp.Parameter) for e in tree.expressions), part

    def test_claim_flags_forwarded_rows(self) -> None:
        flat = _flat(self.claim().sql)
        assert ("SELECT @forward = COUNT(*) FROM #sqlqueue_moved WHERE Poison = 0 AND Expired = 0 AND NullId = 0"
                " AND Headers LIKE N'%NServiceBus.SqlServer.ForwardDestination%';") in flat
        assert "SELECT @maxClaim = MAX(ClaimSeq), @minClaim = MIN(ClaimSeq) FROM @claimedSeq;" in flat

    @pytest.mark.parametrize("recoverable", [True, False])
    def test_forward_claims_make_a_new_native_id(self, recoverable: bool) -> None:
        # NServiceBus forwards with a new Id (MessageRow.From: Guid.NewGuid()), Expires NULL
        s = dynamic(D.forward_claims(self.C, "B", self.E, keys=[9, 3], headers=['{"a":"1"}', "{}"]), recoverable)
        assert s.params == ('[[9,"{\\"a\\":\\"1\\"}"],[3,"{}"]]', "B")
        assert json.loads(s.params[0]) == [[9, '{"a":"1"}'], [3, "{}"]]
        rec = ("Recoverable, ", "1, ") if recoverable else ("", "")
        assert _flat(s.sql) == (
            "INSERT INTO #sqlqueue_keys (Pos, KeyRow, Headers) SELECT CAST(o.[key] AS bigint) + 1, k.KeyRow, k.Headers"
            " FROM OPENJSON(?) AS o"
            " CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]', Headers nvarchar(max) '$[1]') AS k"
            " WHERE EXISTS (SELECT 1 FROM [dbo].[Sales.Claims] AS c WHERE c.Consumer = ? AND c.ClaimSeq = k.KeyRow);"
            f" INSERT INTO [dbo].[error] (Id, {rec[0]}Expires, Headers, Body)"
            f" SELECT NEWID(), {rec[1]}NULL, k.Headers, c.Body"
            " FROM #sqlqueue_keys AS k JOIN [dbo].[Sales.Claims] AS c ON c.ClaimSeq = k.KeyRow"
            f" WHERE k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND} ORDER BY k.Pos; SET @n = @@ROWCOUNT;"
        )
        with pytest.raises(QTransportError, match="1 keys but 0 headers"):
            D.forward_claims(self.C, "B", self.E, keys=[1], headers=[])

    def test_forward_candidates_and_claim_edits(self) -> None:
        s = D.forward_candidates(self.C, "B", lo=3, hi=9)
        assert s.params == ("B", 3, 9)
        assert "Headers LIKE N'%NServiceBus.SqlServer.ForwardDestination%'" in s.sql
        s = D.set_claim_headers(self.C, "B", keys=[3], headers=["{}"])
        assert s.params == ('[[3,"{}"]]', "B") and "WHERE c.Consumer = ?" in s.sql
        s = D.drop_claims(self.C, "B", keys=[3, 4])
        assert s.params == ("B", "[3,4]")

    def test_claim_rejects_nonsense(self) -> None:
        with pytest.raises(QTransportError, match="claim limit"):
            self.claim(limit=0)

    def test_peek(self) -> None:
        s = D.peek(self.Q, after=3, upto=None)
        assert s.sql == ("SELECT TOP (1) RowVersion FROM [dbo].[Sales] WITH (UPDLOCK, READPAST, ROWLOCK)"
                         " WHERE RowVersion > ? ORDER BY RowVersion")
        assert s.params == (3,)
        s = D.peek(self.Q, after=3, upto=8)
        assert "WHERE RowVersion > ? AND RowVersion <= ? ORDER BY RowVersion" in s.sql and s.params == (3, 8)

    def test_backlog_is_nservicebus_peek(self) -> None:
        assert D.backlog(self.Q) == Statement(
            "SELECT isnull(cast(max(RowVersion) - min(RowVersion) + 1 AS bigint), 0)"
            " FROM [dbo].[Sales] WITH (READPAST, READCOMMITTEDLOCK)"
        )

    def test_table_id_and_columns(self) -> None:
        assert D.table_id(self.C) == Statement("SELECT CAST(OBJECT_ID(?) AS nvarchar(20))", ("[dbo].[Sales.Claims]",))
        s = D.queue_columns(QueueAddress("q", "s", "c"))
        assert s.params == ("[c].[s].[q]",)
        assert "FROM [c].sys.columns AS c JOIN [c].sys.types AS t ON t.user_type_id = c.user_type_id" in s.sql
        assert s.sql.startswith("SELECT LOWER(c.name),")

    def test_consumer_lock(self) -> None:
        s = D.try_lock_consumer(self.C, "Billing")
        flat = _flat(s.sql)
        assert "EXEC @rc = sys.sp_getapplock @Resource = @resource, @LockMode = N'Exclusive'," \
               " @LockOwner = N'Session', @LockTimeout = 0;" in flat
        assert flat.endswith("SELECT CAST(CASE WHEN @rc >= 0 THEN 1 ELSE 0 END AS bit)")
        # no claim table, no resource: an error, never a lock on a NULL name
        assert flat.index("IF @resource IS NULL THROW 51000, N'") < flat.index("sp_getapplock")
        u = D.unlock_consumer(self.C, "Billing")
        assert ("IF @resource IS NOT NULL EXEC sys.sp_executesql N'IF APPLOCK_MODE(N''public'', @resource,"
                " N''Session'') <> N''NoLock'' EXEC sys.sp_releaseapplock @Resource = @resource,"
                " @LockOwner = N''Session'';', N'@resource nvarchar(255)', @resource = @resource;") in _flat(u.sql)

    def test_claims_reads(self) -> None:
        assert D.max_claim(self.C, "B") == Statement(
            "SELECT (SELECT TOP (1) ClaimSeq FROM [dbo].[Sales.Claims] WHERE Consumer = ? ORDER BY ClaimSeq DESC),"
            " (SELECT TOP (1) ClaimSeq FROM [dbo].[Sales.Claims] WHERE Consumer = ? ORDER BY ClaimSeq)",
            ("B", "B"),
        )
        r = D.read_claims(self.C, "B", after=10, upto=20)
        assert r.sql == (
            "SELECT ClaimSeq, CAST(Id AS varchar(36)), Expires, Headers, Body, SourceSeq, ClaimedAt"
            " FROM [dbo].[Sales.Claims] WHERE Consumer = ? AND ClaimSeq > ? AND ClaimSeq <= ? ORDER BY ClaimSeq"
        )
        assert r.params == ("B", 10, 20)
        assert D.ack_claims(self.C, "B", upto=20, batch=500) == Statement(
            "DELETE TOP (?) FROM [dbo].[Sales.Claims] WHERE Consumer = ? AND ClaimSeq <= ?", (500, "B", 20)
        )
        assert D.max_source_seq(self.Q).sql == "SELECT max(RowVersion) FROM [dbo].[Sales] WITH (READPAST, READCOMMITTEDLOCK)"


# -- send: installers ---------------------------------------------------------------------------


def _table_columns(stmt: Statement) -> dict[str, str]:
    (create,) = [t for t in parse_all(stmt.sql) if isinstance(t, exp.Create) and t.kind == "TABLE"]
    return {c.name: c.args["kind"].sql("tsql") for c in create.find_all(exp.ColumnDef)}


class TestSendInstallers:
    Q = QueueAddress("Sales")

    def test_companions_count_characters(self) -> None:
        assert D.companion(D.parse_address("Sales@[b]@[c]"), "Staging") == QueueAddress("Sales.Staging", "b", "c")
        assert D.companion(QueueAddress("ä" * 120), "Delayed").table == "ä" * 120 + ".Delayed"  # 240 UTF-8 bytes
        with pytest.raises(ConfigError, match=r"Sales.*too long: its table .* would exceed 128 characters"):
            D.companion(QueueAddress("Sales" + "x" * 118), "Staging")

    def test_staging_table(self) -> None:
        s = one(D.create_staging(D.companion(self.Q, "Staging")))
        assert s.params == ("[dbo].[Sales.Staging]",)
        assert _table_columns(s) == {
            "Seq": "BIGINT", "Sink": "NVARCHAR(200)", "BatchId": "BIGINT", "Attempt": "VARCHAR(64)", "Kind": "CHAR(1)",
            "Route": "NVARCHAR(MAX)", "MessageId": "NVARCHAR(200)", "Headers": "NVARCHAR(MAX)", "Body": "VARBINARY(MAX)",
            "TtbrMs": "BIGINT", "DelayMs": "BIGINT", "Due": "DATETIME2", "StagedAt": "DATETIME2",
        }
        flat = _flat(s.sql)
        for column in ("Seq bigint IDENTITY(1,1) NOT NULL", "Sink nvarchar(200) COLLATE Latin1_General_BIN2 NOT NULL",
                       "Attempt varchar(64) COLLATE Latin1_General_BIN2 NOT NULL", "Kind char(1) NOT NULL",
                       "Route nvarchar(max) COLLATE Latin1_General_BIN2 NOT NULL",
                       "MessageId nvarchar(200) COLLATE Latin1_General_BIN2 NOT NULL", "Headers nvarchar(max) NOT NULL",
                       "Body varbinary(max) NULL", "TtbrMs bigint NULL", "DelayMs bigint NULL", "Due datetime2 NULL",
                       "StagedAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME()", "PRIMARY KEY CLUSTERED (Seq)"):
            assert column in flat
        assert ("CREATE NONCLUSTERED INDEX [Index_Attempt] ON [dbo].[Sales.Staging] (Attempt, Kind)"
                " INCLUDE (Route, MessageId);") in flat
        assert "ALTER TABLE [dbo].[Sales.Staging] SET (LOCK_ESCALATION = DISABLE);" in flat

    def test_staging_columns_follow_staged_columns(self) -> None:
        from spark_qtransport.dialects.base import STAGED_COLUMNS

        cols = list(_table_columns(one(D.create_staging(D.companion(self.Q, "Staging")))))
        assert [c.lower() for c in cols[1:-1]] == [c.replace("_", "") for c in STAGED_COLUMNS]

    def test_outbox_table(self) -> None:
        s = one(D.create_outbox(D.companion(self.Q, "Outbox")))
        assert _table_columns(s) == {
            "Sink": "NVARCHAR(200)", "BatchId": "BIGINT", "Fingerprint": "NVARCHAR(400)", "Sent": "INTEGER",
            "Delayed": "INTEGER", "Published": "INTEGER", "DispatchedAt": "DATETIME2",
        }
        flat = _flat(s.sql)
        assert "Sink nvarchar(200) COLLATE Latin1_General_BIN2 NOT NULL, BatchId bigint NOT NULL," in flat
        assert "Fingerprint nvarchar(400) NOT NULL," in flat
        assert "Sent int NULL, Delayed int NULL, Published int NULL," in flat
        assert "DispatchedAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME(), PRIMARY KEY CLUSTERED (Sink, BatchId)" in flat
        assert "CREATE NONCLUSTERED INDEX [Index_DispatchedAt] ON [dbo].[Sales.Outbox] (DispatchedAt);" in flat
        assert "ALTER TABLE [dbo].[Sales.Outbox] SET (LOCK_ESCALATION = DISABLE);" in flat

    def test_delayed_table_is_nservicebus_layout(self) -> None:
        s = one(D.create_delayed(D.companion(self.Q, "Delayed")))
        assert s.params == ("[dbo].[Sales.Delayed]",)
        assert _table_columns(s) == {
            "Headers": "NVARCHAR(MAX)", "Body": "VARBINARY(MAX)", "Due": "DATETIME", "RowVersion": "BIGINT",
        }
        flat = _flat(s.sql)
        assert ("CREATE TABLE [dbo].[Sales.Delayed] ( Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL,"
                " Due datetime NOT NULL, RowVersion bigint IDENTITY(1,1) NOT NULL );") in flat
        assert "CREATE NONCLUSTERED INDEX [Index_Due] ON [dbo].[Sales.Delayed] (Due);" in flat
        assert "UNIQUE" not in flat and "CLUSTERED" not in flat.replace("NONCLUSTERED", "")  # a heap, as NServiceBus's

    def test_subscription_table_is_nservicebus_layout(self) -> None:
        s = one(D.create_subscriptions(QueueAddress("SubscriptionRouting")))
        assert _table_columns(s) == {"QueueAddress": "NVARCHAR(200)", "Endpoint": "NVARCHAR(200)", "Topic": "NVARCHAR(200)"}
        assert "PRIMARY KEY CLUSTERED (Endpoint, Topic)" in _flat(s.sql)

    @pytest.mark.parametrize("method", ["create_staging", "create_outbox", "create_delayed", "create_subscriptions"])
    def test_idempotent_under_the_nservicebus_lock(self, method: str) -> None:
        table = QueueAddress("Sales.X", "billing", "shop")
        s = one(getattr(D, method)(table))
        assert s.params == ("[shop].[billing].[Sales.X]", "billing", "[billing]")
        flat = _flat(s.sql)
        check = "IF NOT EXISTS (SELECT * FROM [shop].sys.objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')"
        assert flat.count(check) == 2
        assert flat.index(check) < flat.index("sp_getapplock") < flat.rindex(check) < flat.index("CREATE TABLE")
        assert "DECLARE @lock nvarchar(255) = @table + N'_lock';" in flat  # NServiceBus's installer lock
        assert "IF ERROR_NUMBER() IN (2714, 1913) AND XACT_STATE() = 1 COMMIT TRANSACTION;" in flat

    @pytest.mark.parametrize("method", ["create_staging", "create_outbox", "create_delayed", "create_subscriptions"])
    def test_scripts_render_and_parse(self, method: str) -> None:
        table = D.parse_address(f"{EVIL_TABLE}@[{EVIL_TABLE.replace(']', ']]')}]")
        text = D.script(getattr(D, method)(table))
        assert text.startswith(SET_OPTIONS) and text.endswith("\nGO\n") and text.count("\nGO\n") == 2
        assert "DECLARE @table nvarchar(776) = N'[error]] ...; DROP TABLE [Victim]]; --].[error]] ...; DROP TABLE" in text
        batch = text.removeprefix(SET_OPTIONS).rsplit("GO", 1)[0]
        assert not placeholders(batch)
        trees = parse_all(batch)
        assert not [t for t in trees if isinstance(t, exp.Drop)]
        assert any(isinstance(t, exp.Create) and t.kind == "TABLE" for t in trees)


# -- send: dispatch -----------------------------------------------------------------------------


def _marks_match(stmt: Statement) -> None:
    assert isinstance(stmt.params, tuple)
    assert len(placeholders(stmt.sql)) == len(stmt.params)
    assert all(type(p) in (int, str) for p in stmt.params), stmt.params


def _insert(stmt: Statement, recoverable: bool = False) -> exp.Insert:
    """The INSERT of a statement; of a bounded batch (see `bounded`) or its `dynamic` form, the
    one its chunks run (where the table has the Recoverable column or not)."""
    if "sp_executesql @step" in stmt.sql:
        stmt = Statement(bounded(stmt, recoverable).step)
    trees = [t for t in parse_all(stmt.sql) if isinstance(t, exp.Insert) and "#sqlqueue_keys" not in t.this.sql("tsql")]
    (tree,) = trees
    return tree


def dynamic(stmt: Statement, recoverable: bool) -> Statement:
    """A bounded batch as one text to read: its keys statement (values as ``?`` markers) then the
    step its chunks run, with the names put in; the parameters those of the keys."""
    parts = bounded(stmt, recoverable)
    return Statement(f"{parts.keys.sql};\n{parts.step}", parts.keys.params)


#: a dynamic text, nvarchar(max) from its first piece on (no cut at 4,000 characters)
_CONCAT = r"CAST\(N'' AS nvarchar\(max\)\) \+ N'(?:[^']|'')*'(?: \+ @\w+ \+ N'(?:[^']|'')*')*"
_BOUNDED = re.compile(
    r"SET NOCOUNT ON;\n"
    r"(?P<declared>(?:DECLARE @\w+ [\w()]+ = \?;\n)*)"
    r"IF OBJECT_ID\(N'tempdb\.\.#sqlqueue_keys'\) IS NOT NULL DROP TABLE #sqlqueue_keys;\n"
    r"CREATE TABLE #sqlqueue_keys \(Pos bigint NOT NULL PRIMARY KEY, KeyRow bigint NOT NULL,"
    r" KeyDue varchar\(23\) NULL, Headers nvarchar\(max\) NULL\);\n"
    r"(?P<keys>INSERT INTO #sqlqueue_keys .*?);\n"
    rf"DECLARE @step nvarchar\(max\) = (?P<without>{_CONCAT});\n"
    r"(?:IF EXISTS \(SELECT 1 FROM (?:\[[^\]]*\]\.)?sys\.columns WHERE object_id = OBJECT_ID\(@table\)"
    rf" AND name = N'Recoverable'\)\n    SET @step = (?P<with>{_CONCAT});\n)?"
    r"DECLARE @lo bigint = 0, @n int, @total int = 0, @last bigint;\n"
    r"SELECT @last = MAX\(Pos\) FROM #sqlqueue_keys;\n"
    r"WHILE @lo < @last\nBEGIN\n"
    r"    EXEC sys\.sp_executesql @step, N'@lo bigint, @n int OUTPUT', @lo = @lo, @n = @n OUTPUT;\n"
    r"    SET @total = @total \+ @n;\n"
    rf"    SET @lo = @lo \+ {ROW_BOUND};\n"
    r"END\n"
    r"DROP TABLE #sqlqueue_keys;\n"
    r"SELECT @total AS written;",
    re.DOTALL,
)


def _joined(concat: str, values: dict[str, Any]) -> str:
    """The text a ``CAST(N'' AS nvarchar(max)) + N'...' + @name + N'...'`` expression makes on the server."""
    concat = concat.replace("CAST(N'' AS nvarchar(max)) + ", "", 1)
    pieces = re.split(r"' \+ @(\w+) \+ N'", concat[2:-1])
    return "".join(values[p] if i % 2 else p.replace("''", "'") for i, p in enumerate(pieces))


class Bounded(NamedTuple):
    keys: Statement  # what fills #sqlqueue_keys: values as ``?`` markers, with their parameters
    step: str  # one chunk, the tables' names put in
    recoverable: bool  # the batch chooses the step by the target's Recoverable column


def bounded(stmt: Statement, recoverable: bool = False) -> Bounded:
    """The parts of a batch that writes a table not ours in bounded chunks. The batch declares its
    parameters, fills the keys table once, joins one of two step texts with the quoted table
    names (parameters too, so no name is ever inside a literal), chosen by whether the target has
    the legacy Recoverable column, and runs the step per chunk of keys. Returned: the keys
    statement with each value's @name written as a ``?`` marker and its parameters; the step
    text with the names put in."""
    assert stmt.counted, "a bounded batch selects the rows it wrote"
    m = _BOUNDED.fullmatch(stmt.sql)
    assert m, stmt.sql
    declared = re.findall(r"DECLARE @(\w+) ([\w()]+) = \?;", m["declared"])
    assert len(stmt.params) == len(declared)
    by_name = {name: value for (name, _), value in zip(declared, stmt.params, strict=True)}
    keys_names = [n for n in re.findall(r"@(\w+)", m["keys"])]
    spliced = {n for key in ("with", "without") if m[key] for n in re.findall(r"@(\w+) \+ N'", m[key])}
    assert all(dict(declared)[n] == "nvarchar(776)" for n in spliced)  # spliced: quoted table names only
    assert set(by_name) == spliced | set(keys_names) | ({"table"} if m["with"] else set())  # nothing unused
    slots = {n: f"\x00{n}\x00" for n in spliced}  # the names put in last: they may hold any text
    texts = {rec: _joined(m["with" if rec and m["with"] else "without"], slots) for rec in (True, False)}
    if m["with"]:
        assert texts[True].replace(", Recoverable", "").replace("NEWID(), 1,", "NEWID(),") == texts[False]
    step = texts[recoverable]
    assert re.findall(r"(?<!@)@(\w+)", step) == ["lo", "lo", "n"], step  # no value in the step: its chunk only
    for n in spliced:
        step = step.replace(slots[n], by_name[n])
    keys = Statement(re.sub(r"@\w+", "?", m["keys"]), tuple(by_name[n] for n in keys_names))
    return Bounded(keys, step, bool(m["with"]))


def _js(values: list[Any]) -> str:
    """The JSON parameter a list travels as."""
    return json.dumps(values, ensure_ascii=False, separators=(",", ":"))


HOSTILE = [EVIL, "x]; DROP TABLE [Victim]; --", "a?b", "it's", "N'x'", "Grüße ☃", "/* ? */", ""]


class TestRecoverableDecidedOnTheServer:
    """Every INSERT of messages into a queue table writes the legacy Recoverable column (1) exactly
    where the destination has it: the batch looks at the destination's columns and runs one of two
    INSERTs. Callers no longer say (no parameter), so a table altered meanwhile is still right."""

    Q, C, S, DL = QueueAddress("Sales"), QueueAddress("Sales.Claims"), QueueAddress("Sales.Staging"), QueueAddress("Sales.Delayed")

    def inserts(self, destination: QueueAddress) -> dict[str, Statement]:
        return {
            "dispatch": D.dispatch(self.S, destination, attempts=["a"], route="r", publish_routes=["p"]),
            "move_staged": D.move_staged(self.S, destination, keys=[1], headers=["{}"]),
            "forward_claims": D.forward_claims(self.C, "B", destination, keys=[1], headers=["{}"]),
            "move_delayed": D.move_delayed(self.DL, destination, keys=[KEY], headers=["{}"]),
            "move_messages": D.move_messages(self.Q, destination, keys=["1"], headers=["{}"]),
        }

    @pytest.mark.parametrize("method", ["dispatch", "move_staged", "forward_claims", "move_delayed", "move_messages"])
    def test_with_and_without_the_column(self, method: str) -> None:
        s = self.inserts(QueueAddress("Billing"))[method]
        assert s.params[0] == "[dbo].[Billing]"  # the destination, checked by OBJECT_ID on the server
        assert ("IF EXISTS (SELECT 1 FROM sys.columns WHERE object_id = OBJECT_ID(@table)"
                " AND name = N'Recoverable')") in s.sql
        with_column, without = _insert(s, recoverable=True), _insert(s, recoverable=False)
        cols = [c.name for c in with_column.this.expressions]
        # NServiceBus's SendTextWithRecoverable columns: never the legacy CorrelationId and
        # ReplyToAddress, so a table without them works
        assert cols == ["Id", "Recoverable", "Expires", "Headers", "Body"]
        assert with_column.expression.expressions[1].sql("tsql") == "1"
        assert [c.name for c in without.this.expressions] == [c for c in cols if c != "Recoverable"]
        assert len(without.expression.expressions) == len(cols) - 1
        assert dynamic(s, True).params == dynamic(s, False).params  # the same values either way

    @pytest.mark.parametrize("method", ["dispatch", "move_staged", "forward_claims", "move_delayed", "move_messages"])
    def test_rowcount_is_the_inserts(self, method: str) -> None:
        stmt = self.inserts(QueueAddress("Billing"))[method]
        # nothing counts rows (NOCOUNT); the batch adds up its chunks' inserts and selects the sum
        assert stmt.counted and stmt.sql.startswith("SET NOCOUNT ON;\n") and "NOCOUNT OFF" not in stmt.sql
        assert stmt.sql.endswith("SELECT @total AS written;")
        assert bounded(stmt).step.endswith("ORDER BY k.Pos;\nSET @n = @@ROWCOUNT;")

    def test_other_catalog_checks_its_own_columns(self) -> None:
        for method, s in self.inserts(QueueAddress("Billing", "ops", "shop")).items():
            assert "FROM [shop].sys.columns WHERE object_id = OBJECT_ID(@table)" in s.sql, method
            assert s.params[0] == "[shop].[ops].[Billing]", method

    def test_names_are_never_inside_the_dynamic_text(self) -> None:
        odd = QueueAddress("x'; DROP TABLE [Victim]; --")
        for method, s in self.inserts(odd).items():
            assert "Victim" not in s.sql, method  # the name travels as a parameter
            assert s.sql.count("DROP") == s.sql.count("DROP TABLE #sqlqueue_keys"), method
            assert s.params[0] == D.qualified(odd)

    def test_no_recoverable_parameter(self) -> None:
        import inspect

        from spark_qtransport.dialects.postgres import PostgresDialect

        for dialect in (D, PostgresDialect()):
            for name in dir(dialect):
                method = getattr(dialect, name)
                if callable(method) and not name.startswith("__"):
                    assert "recoverable" not in inspect.signature(method).parameters, name


class TestInsertMessage:
    """One message with a time to be received (monitoring reports): NServiceBus's SendText, the
    Recoverable column written where the table has it, values bound (the body as hexadecimal text)."""

    _STEP = re.compile(rf"DECLARE @step nvarchar\(max\) = (?P<without>{_CONCAT});\n"
                       r"IF EXISTS \(SELECT 1 FROM (?:\[[^\]]*\]\.)?sys\.columns WHERE object_id = OBJECT_ID\(@table\)"
                       rf" AND name = N'Recoverable'\)\n    SET @step = (?P<with>{_CONCAT});\n"
                       r"EXEC sys\.sp_executesql @step, N'(?P<signature>[^']*)'(?P<assign>(?:, @\w+ = @\w+)*);$")

    def texts(self, stmt: Statement) -> dict[bool, exp.Insert]:
        m = self._STEP.search(stmt.sql)
        assert m, stmt.sql
        names = {"table": stmt.params[0]}
        out = {}
        for recoverable in (True, False):
            (tree,) = parse_all(_joined(m["with" if recoverable else "without"], names))
            assert isinstance(tree, exp.Insert)
            out[recoverable] = tree
        return out

    def test_the_insert(self) -> None:
        body = bytes(range(256))
        stmt = D.insert_message(QueueAddress("Particular.Monitoring", "ops", "shop"), headers='{"a":"b"}', body=body,
                                ttbr_ms=7 * 86_400_000)
        assert stmt.params == ("[shop].[ops].[Particular.Monitoring]", 604_800_000, '{"a":"b"}', body.hex())
        assert bytes.fromhex(stmt.params[3]) == body
        assert stmt.sql.startswith("SET NOCOUNT ON;\n") and not stmt.counted
        assert "FROM [shop].sys.columns WHERE object_id = OBJECT_ID(@table)" in stmt.sql
        trees = self.texts(stmt)
        for recoverable, tree in trees.items():
            cols = [c.name for c in tree.this.expressions]
            assert cols == ["Id", *(["Recoverable"] if recoverable else []), "Expires", "Headers", "Body"]
            (row,) = tree.expression.expressions  # one row of values
            values = [v.sql("tsql") for v in row.expressions]
            assert values[0] == "NEWID()" and values[-2:] == ["@headers", "CONVERT(VARBINARY(MAX), @body, 2)"]
            # Expires as the dispatch computes it: seconds and milliseconds apart (DATEADD takes an int)
            assert values[-3] == "DATEADD(SECOND, @ttbr / 1000, DATEADD(MS, @ttbr % 1000, GETUTCDATE()))"
        assert "'@ttbr bigint, @headers nvarchar(max), @body nvarchar(max)', @ttbr = @ttbr" in stmt.sql

    def test_no_time_to_be_received(self) -> None:
        stmt = D.insert_message(QueueAddress("Sales"), headers="{}", body=b"", ttbr_ms=None)
        assert stmt.params == ("[dbo].[Sales]", "{}", "")
        assert "@ttbr" not in stmt.sql
        for tree in self.texts(stmt).values():
            (row,) = tree.expression.expressions
            assert row.expressions[-3].sql("tsql") == "NULL"

    def test_names_are_never_inside_the_dynamic_text(self) -> None:
        odd = QueueAddress("x'; DROP TABLE [Victim]; --")
        stmt = D.insert_message(odd, headers="{}", body=b"x", ttbr_ms=1)
        assert "Victim" not in stmt.sql and stmt.params[0] == D.qualified(odd)


class TestDispatchStatements:
    S, OUTBOX = QueueAddress("Sales.Staging"), QueueAddress("Sales.Outbox")
    Q, SUBS = QueueAddress("Billing"), QueueAddress("SubscriptionRouting")
    A = ["a" * 32, "b" * 32]

    def dispatch(self, **kw: Any) -> Statement:
        args: dict[str, Any] = {"attempts": self.A, "route": "Billing@[dbo]", "publish_routes": ["Ns.E"], **kw}
        return D.dispatch(self.S, self.Q, **args)

    def test_outbox_insert_if_absent(self) -> None:
        s = D.outbox_insert(self.OUTBOX, sink="default", batch_id=41, fingerprint="query q1")
        assert s == Statement(
            "INSERT INTO [dbo].[Sales.Outbox] (Sink, BatchId, Fingerprint) SELECT ?, ?, ?"
            " WHERE NOT EXISTS (SELECT 1 FROM [dbo].[Sales.Outbox] WITH (UPDLOCK, HOLDLOCK)"
            " WHERE Sink = ? AND BatchId = ?)",
            ("default", 41, "query q1", "default", 41),
        )
        # one statement and no SET NOCOUNT: the dispatcher reads its rowcount (1 recorded, 0 there already)
        assert ";" not in s.sql and "NOCOUNT" not in s.sql
        assert "READPAST" not in s.sql  # READPAST with HOLDLOCK is error 650

    def test_outbox_insert_checks_widths(self) -> None:
        with pytest.raises(ValueError, match="sink name"):
            D.outbox_insert(self.OUTBOX, sink="x" * 201, batch_id=1, fingerprint="f")
        with pytest.raises(ValueError, match="sink name"):
            D.outbox_insert(self.OUTBOX, sink="", batch_id=1, fingerprint="f")
        with pytest.raises(QTransportError, match="fingerprint"):
            D.outbox_insert(self.OUTBOX, sink="s", batch_id=1, fingerprint="f" * 401)
        _marks_match(D.outbox_insert(self.OUTBOX, sink="s" * 200, batch_id=1, fingerprint="f" * 400))

    def test_outbox_get_and_finish(self) -> None:
        assert D.outbox_get(self.OUTBOX, sink="s", batch_id=3) == Statement(
            "SELECT Fingerprint, DispatchedAt, Sent, Delayed, Published FROM [dbo].[Sales.Outbox]"
            " WHERE Sink = ? AND BatchId = ?", ("s", 3),
        )
        assert D.outbox_finish(self.OUTBOX, sink="s", batch_id=3, sent=10, delayed=2, published=4) == Statement(
            "UPDATE [dbo].[Sales.Outbox] SET Sent = ?, Delayed = ?, Published = ? WHERE Sink = ? AND BatchId = ?",
            (10, 2, 4, "s", 3),
        )

    def test_subscribers(self) -> None:
        # NServiceBus's GetSubscribersText, one SELECT per topic tagged with its position: the
        # Topic column meets each parameter directly, so its collation decides as for NServiceBus
        s = D.subscribers(self.SUBS, ["Ns.OrderPlaced", "Ns.IEvent"])
        assert s == Statement(
            "SELECT QueueAddress, 0 AS TopicIndex FROM [dbo].[SubscriptionRouting] WHERE Topic = ?\n"
            "UNION\n"
            "SELECT QueueAddress, 1 AS TopicIndex FROM [dbo].[SubscriptionRouting] WHERE Topic = ?",
            ("Ns.OrderPlaced", "Ns.IEvent"),
        )
        [union] = parse_all(s.sql)
        assert isinstance(union, exp.Union) and union.args.get("distinct") is True  # UNION, not UNION ALL
        for eq in union.find_all(exp.EQ):
            assert (eq.this.sql("tsql"), eq.expression.sql("tsql")) == ("Topic", "?")
        none = D.subscribers(self.SUBS, [])
        assert none == Statement("SELECT QueueAddress, 0 AS TopicIndex FROM [dbo].[SubscriptionRouting] WHERE 1 = 0", ())
        parse_all(none.sql)
        with pytest.raises(QTransportError, match="1001 topics"):
            D.subscribers(self.SUBS, [f"T{i}" for i in range(1001)])

    def test_dispatch(self) -> None:
        s = dynamic(self.dispatch(), True)
        assert _flat(s.sql) == (
            "INSERT INTO #sqlqueue_keys (Pos, KeyRow) SELECT ROW_NUMBER() OVER (ORDER BY f.Seq), f.Seq"
            " FROM (SELECT MIN(Seq) AS Seq FROM [dbo].[Sales.Staging]"
            " WHERE Attempt IN (SELECT a.Attempt COLLATE Latin1_General_BIN2 FROM OPENJSON(?)"
            " WITH (Attempt varchar(64) '$') AS a)"
            " AND ((Kind = 's' AND Route = ?) OR (Kind = 'p' AND Route IN (?)))"
            " GROUP BY MessageId) AS f;"
            " INSERT INTO [dbo].[Billing] (Id, Recoverable, Expires, Headers, Body)"
            " SELECT NEWID(), 1,"
            " CASE WHEN m.TtbrMs IS NULL THEN NULL"
            " ELSE DATEADD(second, m.TtbrMs / 1000, DATEADD(ms, m.TtbrMs % 1000, GETUTCDATE())) END,"
            " m.Headers, m.Body"
            " FROM #sqlqueue_keys AS k JOIN [dbo].[Sales.Staging] AS m ON m.Seq = k.KeyRow"
            f" WHERE k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND} ORDER BY k.Pos; SET @n = @@ROWCOUNT;"
        )
        assert s.params == (_js(self.A), "Billing@[dbo]", "Ns.E")

    @pytest.mark.parametrize("recoverable", [True, False])
    def test_dispatch_columns_and_values_line_up(self, recoverable: bool) -> None:
        tree = _insert(dynamic(self.dispatch(), recoverable))
        cols = [c.name for c in tree.this.expressions]
        expected = ["Id", "Recoverable", "Expires", "Headers", "Body"]
        assert cols == (expected if recoverable else [c for c in expected if c != "Recoverable"])
        select = tree.expression
        assert len(select.expressions) == len(cols)
        assert select.expressions[cols.index("Id")].sql("tsql") == "NEWID()"
        assert select.expressions[cols.index("Headers")].sql("tsql") == "m.Headers"
        if recoverable:
            assert select.expressions[cols.index("Recoverable")].sql("tsql") == "1"
        assert [o.sql("tsql") for o in select.args["order"].expressions] == ["k.Pos"]

    def test_dispatch_routes(self) -> None:
        send_only = dynamic(self.dispatch(publish_routes=[]), False)
        assert "AND ((Kind = 's' AND Route = ?))" in _flat(send_only.sql) and "Kind = 'p'" not in send_only.sql
        assert send_only.params == (_js(self.A), "Billing@[dbo]")
        subscriber = dynamic(self.dispatch(route=None, publish_routes=["Ns.A;Ns.B", "Ns.C"]), False)
        assert "AND ((Kind = 'p' AND Route IN (?, ?)))" in _flat(subscriber.sql) and "Kind = 's'" not in subscriber.sql
        assert subscriber.params == (_js(self.A), "Ns.A;Ns.B", "Ns.C")
        nothing = dynamic(self.dispatch(route=None, publish_routes=[]), False)
        assert "AND (1 = 0)" in _flat(nothing.sql) and nothing.params == (_js(self.A),)
        for stmt in (send_only, subscriber, nothing):
            _marks_match(stmt)
            _insert(stmt)

    def test_dispatch_no_attempts_is_valid_sql(self) -> None:
        s = dynamic(self.dispatch(attempts=[], route=None, publish_routes=[]), False)
        assert s.params == ("[]",)
        _marks_match(s)
        _insert(s)

    def test_many_attempts_are_one_parameter(self) -> None:
        """A request takes at most 2,100 parameters; a batch may have more tasks than that."""
        attempts = [uuid.UUID(int=i).hex for i in range(5000)]
        for s in (dynamic(self.dispatch(attempts=attempts), False), D.dispatch_delayed(self.S, QueueAddress("D"), attempts=attempts),
                  D.delete_staged(self.S, attempts=attempts)):
            assert len(placeholders(s.sql)) <= 3
            assert json.loads(s.params[0]) == attempts

    @pytest.mark.parametrize("value", HOSTILE)
    def test_values_only_in_parameters(self, value: str) -> None:
        stmts = [
            dynamic(self.dispatch(attempts=[value], route=value, publish_routes=[value, value]), False),
            D.dispatch_delayed(self.S, QueueAddress("D"), attempts=[value]),
            D.delete_staged(self.S, attempts=[value]),
            D.subscribers(self.SUBS, [value]),
            D.outbox_get(self.OUTBOX, sink=value or "s", batch_id=1),
            D.delete_batch_leftovers(self.S, sink=value or "s", batch_id=1),
        ]
        plain = [
            dynamic(self.dispatch(attempts=["v"], route="v", publish_routes=["v", "v"]), False),
            D.dispatch_delayed(self.S, QueueAddress("D"), attempts=["v"]),
            D.delete_staged(self.S, attempts=["v"]),
            D.subscribers(self.SUBS, ["v"]),
            D.outbox_get(self.OUTBOX, sink="s", batch_id=1),
            D.delete_batch_leftovers(self.S, sink="s", batch_id=1),
        ]
        for s, p in zip(stmts, plain, strict=True):
            assert s.sql == p.sql  # the value changed the parameters only
            _marks_match(s)
        assert json.loads(stmts[0].params[0]) == [value]

    def test_dispatch_delayed(self) -> None:
        s = dynamic(D.dispatch_delayed(self.S, QueueAddress("Sales.Delayed"), attempts=self.A), False)
        # NServiceBus's delayed table: at most ROW_BOUND rows per INSERT, in staging order
        assert _flat(s.sql) == (
            "INSERT INTO #sqlqueue_keys (Pos, KeyRow) SELECT ROW_NUMBER() OVER (ORDER BY Seq), Seq"
            " FROM [dbo].[Sales.Staging]"
            " WHERE Attempt IN (SELECT a.Attempt COLLATE Latin1_General_BIN2 FROM OPENJSON(?)"
            " WITH (Attempt varchar(64) '$') AS a) AND Kind = 'd';"
            " INSERT INTO [dbo].[Sales.Delayed] (Headers, Body, Due)"
            " SELECT m.Headers, m.Body,"
            " COALESCE(m.Due, DATEADD(second, m.DelayMs / 1000, DATEADD(ms, m.DelayMs % 1000, GETUTCDATE())))"
            " FROM #sqlqueue_keys AS k JOIN [dbo].[Sales.Staging] AS m ON m.Seq = k.KeyRow"
            f" WHERE k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND} ORDER BY k.Pos; SET @n = @@ROWCOUNT;"
        )
        assert s.params == (_js(self.A),)
        assert [c.name for c in _insert(s).this.expressions] == ["Headers", "Body", "Due"]
        empty = dynamic(D.dispatch_delayed(self.S, QueueAddress("Sales.Delayed"), attempts=[]), False)
        assert empty.params == ("[]",)
        _insert(empty)

    def test_delete_staged_and_leftovers(self) -> None:
        s = D.delete_staged(self.S, attempts=self.A)
        assert s.sql == (
            "DELETE FROM [dbo].[Sales.Staging] WHERE Attempt IN (SELECT a.Attempt COLLATE Latin1_General_BIN2"
            " FROM OPENJSON(?) WITH (Attempt varchar(64) '$') AS a)"
        )
        assert "READPAST" not in s.sql  # its rowcount is checked against what the tasks staged
        assert D.delete_batch_leftovers(self.S, sink="s", batch_id=9) == Statement(
            "DELETE FROM [dbo].[Sales.Staging] WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK) WHERE Sink = ? AND BatchId = ?",
            ("s", 9),
        )

    def test_cleanup(self) -> None:
        assert D.outbox_cleanup(self.OUTBOX, older_than_seconds=604800, limit=4000) == Statement(
            "DELETE TOP (?) FROM [dbo].[Sales.Outbox] WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE DispatchedAt < DATEADD(second, -?, SYSUTCDATETIME())",
            (4000, 604800),
        )
        assert D.staging_cleanup(self.S, older_than_seconds=60, limit=10) == Statement(
            "DELETE TOP (?) FROM [dbo].[Sales.Staging] WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE StagedAt < DATEADD(second, -?, SYSUTCDATETIME())",
            (10, 60),
        )


# -- send: publish to the subscribers a case-insensitive collation finds --------------------------


def _sqlserver_ci_as(a: str, b: str) -> int:
    """SQL Server's default collation (SQL_Latin1_General_CP1_CI_AS) as far as topics go:
    case-insensitive, and trailing spaces never count (= pads the shorter string with spaces)."""
    x, y = a.rstrip(" ").casefold(), b.rstrip(" ").casefold()
    return (x > y) - (x < y)


class _CollatingDatabase:
    """A DB-API cursor that runs the dialect's subscriber statement on SQLite, whose
    ``SubscriptionRouting.Topic`` column compares as SQL Server's default collation does: what
    NServiceBus's GetSubscribersText (``WHERE Topic IN (@Topic_0, ...)``) matches, this matches.
    The only other statement it answers is the table's column check."""

    def __init__(self, subscriptions: QueueAddress, rows: list[tuple[str, str, str]]) -> None:
        import sqlite3

        self.columns_sql = D.queue_columns(subscriptions).sql
        self.db = sqlite3.connect(":memory:")
        self.db.create_collation("SQLSERVER_CI_AS", _sqlserver_ci_as)
        self.db.execute(f"ATTACH DATABASE ':memory:' AS {subscriptions.schema or 'dbo'}")
        self.db.execute(f"CREATE TABLE {D.qualified(subscriptions)} (QueueAddress TEXT COLLATE SQLSERVER_CI_AS,"
                        " Endpoint TEXT COLLATE SQLSERVER_CI_AS, Topic TEXT COLLATE SQLSERVER_CI_AS)")
        self.db.executemany(f"INSERT INTO {D.qualified(subscriptions)} VALUES (?, ?, ?)", rows)
        self.result: list[tuple[Any, ...]] = []
        self.description = [("result",)]  # every statement it answers selects rows

    def nextset(self) -> bool:
        return False

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        if sql == self.columns_sql:
            self.result = [("queueaddress", "nvarchar(200)"), ("endpoint", "nvarchar(200)"), ("topic", "nvarchar(200)")]
        else:
            self.result = self.db.execute(sql, params).fetchall()

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.result


class TestSubscribersAsTheDatabaseCompares:
    """A subscription's Topic is matched by the database's collation (case-insensitive, trailing
    spaces ignored by default on SQL Server), as NServiceBus matches it; the dispatch must route
    by what the database matched, never look up the spelling the database returns."""

    SUBS = QueueAddress("SubscriptionRouting")
    PLACED = "Shop.Events.OrderPlaced, Shop.Events, Version=1.0.0.0;Shop.Events.IOrderEvent, Shop.Events"
    OTHER = "Shop.Events.OrderShipped, Shop.Events"

    def subscribers(self, rows: list[tuple[str, str, str]], published: list[str]) -> dict[str, list[str]]:
        from spark_qtransport.transport.routing import Router, Target
        from spark_qtransport.transport.sending.fanout import Destination, add_subscribers

        class NoLookups(Router):  # every subscriber queue exists
            def resolve(self, cur: Any, text: str | None, *, source: str = "address") -> Target:
                a = D.parse_address(str(text))
                return Target(a, D.qualified(a), D.format_address(a), {})

        destinations: dict[str, Destination] = {}
        add_subscribers(_CollatingDatabase(self.SUBS, rows), D, NoLookups(D), self.SUBS, create=False,
                        published=published, destinations=destinations)
        return {k: sorted(d.publish_routes) for k, d in sorted(destinations.items())}  # routes: an IN list

    def test_a_topic_stored_in_another_case_with_trailing_spaces_is_delivered(self) -> None:
        got = self.subscribers([
            ("Billing", "Billing", "shop.events.orderplaced "),  # case and a trailing space differ
            ("Shipping", "Shipping", "SHOP.EVENTS.IORDEREVENT"),
            ("Audit", "Audit", "Shop.Events.OrderPlaced.V2"),  # another topic
        ], [self.PLACED, self.OTHER])
        assert got == {"Billing@[dbo]": [self.PLACED], "Shipping@[dbo]": [self.PLACED]}

    def test_our_spellings_that_the_database_takes_for_one_topic_each_get_the_subscriber(self) -> None:
        upper = "SHOP.EVENTS.ORDERPLACED, Shop.Events"
        got = self.subscribers([("Billing", "Billing", "Shop.Events.OrderPlaced")], [self.PLACED, upper, self.OTHER])
        assert got == {"Billing@[dbo]": sorted([self.PLACED, upper])}

    def test_an_exact_match_is_delivered_once(self) -> None:
        got = self.subscribers([("Billing", "Billing", "Shop.Events.OrderPlaced"),
                                ("Billing", "Billing.Audit", "Shop.Events.IOrderEvent")], [self.PLACED])
        assert got == {"Billing@[dbo]": [self.PLACED]}


# -- send: staging (executors) ------------------------------------------------------------------


class _FakeCursor:
    """Records each executemany with the input sizes set for it (pyodbc keeps them on the
    cursor until set again)."""

    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.fast_executemany = False
        self.inputsizes: list[Any] | None = None

    def setinputsizes(self, sizes: Any) -> None:
        self.inputsizes = None if sizes is None else list(sizes)

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self.log.append(("executemany", self.fast_executemany, sql, list(rows), self.inputsizes))

    def close(self) -> None:
        self.log.append(("close",))


class _FakeConn:
    def __init__(self) -> None:
        self.log: list[Any] = []

    def cursor(self) -> _FakeCursor:
        return _FakeCursor(self.log)

    def commit(self) -> None:  # pragma: no cover - must never be called
        raise AssertionError("stage_rows must not commit")


class TestStageRows:
    S = QueueAddress("Sales.Staging")

    def test_fast_executemany_insert(self) -> None:
        from datetime import datetime, timedelta, timezone

        conn = _FakeConn()
        due = datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
        rows = [
            ("default", 7, "a" * 32, "s", "Billing@[dbo]", "m1", '{"a":"b"}', b"body", 60000, None, None),
            ("default", 7, "a" * 32, "d", "Billing@[dbo]", "m2", "{}", None, None, None, due),
            ("default", 7, "a" * 32, "d", "Billing@[dbo]", "m3", "{}", bytearray(b"x"), None, 5000, None),
        ]
        D.stage_rows(conn, self.S, rows)
        (call, close) = conn.log
        assert close == ("close",)
        kind, fast, sql, data, _sizes = call
        assert kind == "executemany" and fast is True
        assert sql == (
            "INSERT INTO [dbo].[Sales.Staging] (Sink, BatchId, Attempt, Kind, Route, MessageId, Headers, Body,"
            " TtbrMs, DelayMs, Due) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        assert len(placeholders(sql)) == 11
        parse_all(sql)
        assert data[0] == rows[0]
        assert data[1][-1] == datetime(2030, 1, 2, 1, 4, 5, 123456)  # naive UTC for datetime2
        assert data[2][7] == b"x" and type(data[2][7]) is bytes

    def test_naive_due_is_kept(self) -> None:
        from datetime import datetime

        conn = _FakeConn()
        when = datetime(2030, 1, 1)
        D.stage_rows(conn, self.S, [("s", 1, "a", "d", "r", "m", "{}", None, None, None, when)])
        assert conn.log[0][3][0][-1] == when

    def test_nothing_to_write(self) -> None:
        conn = _FakeConn()
        D.stage_rows(conn, self.S, [])
        assert conn.log == []

    def test_row_shape_checked(self) -> None:
        with pytest.raises(QTransportError, match="10 values, not 11"):
            D.stage_rows(_FakeConn(), self.S, [("s", 1, "a", "s", "r", "m", "{}", None, None, None)])

    # -- the (max) columns Route, Headers, Body: bound in place where the values fit ----------

    #: input sizes of Route (4), Headers (6) and Body (7); None: as the server describes
    FIT = [None, None, None, None, (-9, 4000, 0), None, (-9, 4000, 0), (-3, 8000, 0), None, None, None]

    @staticmethod
    def row(i: int, *, route: str = "Billing@[dbo]", headers: str = '{"a":"b"}', body: Any = b"body") -> tuple[Any, ...]:
        return ("default", 7, "a" * 32, "s", route, f"m{i}", headers, body, None, None, None)

    @staticmethod
    def calls(conn: _FakeConn) -> list[tuple[list[Any], list[tuple[Any, ...]]]]:
        assert conn.log[-1] == ("close",) and all(c[0] == "executemany" and c[1] is True for c in conn.log[:-1])
        return [(c[4], c[3]) for c in conn.log[:-1]]

    @staticmethod
    def sizes(route: int, headers: int, body: int) -> list[Any]:
        return [None, None, None, None, (-9, route, 0), None, (-9, headers, 0), (-3, body, 0), None, None, None]

    def test_the_constants_are_pyodbcs(self) -> None:
        pyodbc = pytest.importorskip("pyodbc")
        from spark_qtransport.dialects.sqlserver import send

        assert (send.SQL_WVARCHAR, send.SQL_VARBINARY) == (pyodbc.SQL_WVARCHAR, pyodbc.SQL_VARBINARY)

    def test_values_that_fit_are_bound_in_place(self) -> None:
        """Not as the server describes nvarchar(max)/varbinary(max): pyodbc would send every
        cell of those in pieces (SQLPutData), a few thousand rows a second."""
        conn = _FakeConn()
        rows = [self.row(0), self.row(1, body=None), self.row(2, headers="x" * 4000, body=b"\0" * 8000),
                self.row(3, route="r" * 4000)]
        D.stage_rows(conn, self.S, rows)
        assert self.calls(conn) == [(self.FIT, rows)]
        assert self.sizes(4000, 4000, 8000) == self.FIT

    def test_longer_values_take_the_max_path_in_runs_that_keep_the_order(self) -> None:
        astral = "\U0001F600"  # two UTF-16 code units, one Python character
        rows = [
            self.row(0), self.row(1),
            self.row(2, body=b"b" * 8001),  # one byte too long
            self.row(3),
            self.row(4, headers="h" * 4001),  # one character too long
            self.row(5, headers=astral * 2001),  # 2,001 characters but 4,002 code units
            self.row(6, headers=astral * 1999 + "ab"),  # 2,001 characters, 4,000 code units: fits
            self.row(7, route="r" * 4001, headers="h" * 4001, body=bytearray(9000)),
            self.row(8),
        ]
        conn = _FakeConn()
        D.stage_rows(conn, self.S, rows)
        calls = self.calls(conn)
        assert [[r[5] for r in part] for _, part in calls] == [["m0", "m1"], ["m2"], ["m3"], ["m4", "m5"], ["m6"],
                                                                ["m7"], ["m8"]]
        assert [sizes for sizes, _ in calls] == [
            self.FIT, self.sizes(4000, 4000, 0), self.FIT, self.sizes(4000, 0, 8000), self.FIT, self.sizes(0, 0, 0),
            self.FIT]
        staged = [r for _, part in calls for r in part]
        assert [r[5] for r in staged] == [f"m{i}" for i in range(9)]  # Seq, an IDENTITY, numbers them in this order
        assert staged[7][7] == bytes(9000) and type(staged[7][7]) is bytes

    def test_a_calls_parameter_array_stays_bounded(self) -> None:
        """pyodbc allocates one call's whole parameter array, each bounded cell its full size
        (8,000 bytes a Headers or Body value): the rows go in calls of a bounded byte size."""
        from spark_qtransport.dialects.sqlserver.send import PARAM_ARRAY_BYTES

        rows = [self.row(i) for i in range(2500)]
        conn = _FakeConn()
        D.stage_rows(conn, self.S, rows)
        calls = self.calls(conn)
        assert len(calls) > 1 and all(sizes == self.FIT for sizes, _ in calls)
        assert all(len(part) * (2 * 4000 + 2 * 4000 + 8000) <= PARAM_ARRAY_BYTES for _, part in calls)
        assert [r for _, part in calls for r in part] == rows

    def test_hostile_table_is_quoted(self) -> None:
        conn = _FakeConn()
        D.stage_rows(conn, QueueAddress(EVIL_TABLE + ".Staging"), [("s", 1, "a", "s", "r", "m", "{}", None, None, None, None)])
        sql = conn.log[0][2]
        assert sql.startswith("INSERT INTO [dbo].[error]] ...; DROP TABLE [Victim]]; --.Staging] (Sink,")
        assert [t for t in tokenize(sql) if "Victim" in t.text][0].token_type == TokenType.IDENTIFIER


# -- delayed delivery ---------------------------------------------------------------------------


class TestDelayedStatements:
    DL, Q, E = QueueAddress("Sales.Delayed"), QueueAddress("Sales"), QueueAddress("error")

    def test_any_due_is_a_read(self) -> None:
        assert D.any_due(self.DL) == Statement(
            "SELECT TOP (1) 1 FROM [dbo].[Sales.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due <= GETUTCDATE()"
        )

    def test_lock_mover(self) -> None:
        s = D.lock_mover(self.DL)
        assert s.params == ("[dbo].[Sales.Delayed]",)
        flat = _flat(s.sql)
        assert flat.startswith("SET NOCOUNT ON; DECLARE @table nvarchar(776) = ?; DECLARE @rc int;")
        # keyed by the table identity, as the consumer lock: however the table is spelled, one mover
        assert ("DECLARE @resource nvarchar(255) = N'sqlqueue mover ' + CAST(DB_ID() AS nvarchar(11)) + N'.'"
                " + CAST(OBJECT_ID(@table) AS nvarchar(11));") in flat
        spellings = [D.lock_mover(D.parse_address(t)) for t in ("Sales.Delayed", "SALES.DELAYED@[dbo]")]
        assert all("N'sqlqueue mover ' + CAST(DB_ID()" in x.sql and "Sales" not in x.sql.split("@resource")[1]
                   for x in spellings)
        # a Transaction-owned lock needs a transaction: in implicit transaction mode a read opens it
        assert ("IF @@TRANCOUNT = 0 SELECT TOP (1) @rc = 0 FROM [dbo].[Sales.Delayed]"
                " WITH (READPAST, READCOMMITTEDLOCK);") in flat
        assert "IF @@TRANCOUNT = 0 THROW 51000, N'" in flat
        assert ("EXEC @rc = sys.sp_getapplock @Resource = @resource, @LockMode = N'Exclusive',"
                " @LockOwner = N'Transaction', @LockTimeout = 0;") in flat
        assert flat.endswith("SELECT CAST(CASE WHEN @rc >= 0 THEN 1 ELSE 0 END AS bit)")
        assert flat.index("@@TRANCOUNT") < flat.index("sp_getapplock")
        # the only statement returning rows is the last one
        selects = [p for k, p in simple_statements(s.sql) if k == "statement" and p.startswith("SELECT")]
        assert len(selects) == 2 and "@rc = 0" in selects[0]

    def test_lock_mover_other_catalog_and_long_names(self) -> None:
        s = D.lock_mover(QueueAddress("Sales.Delayed", "b", "shop"))
        assert "EXEC @rc = [shop].sys.sp_getapplock @Resource = @resource" in s.sql  # the lock lives with the table
        assert s.params == ("[shop].[b].[Sales.Delayed]", "shop") and "CAST(DB_ID(?) AS nvarchar(11))" in s.sql
        # "sqlqueue mover " + two ints as text: always within nvarchar(255), whatever the names
        assert "sqlqueue mover " in s.sql and "sqlqueue consumer" not in s.sql

    def test_due_delayed(self) -> None:
        assert D.due_delayed(self.DL, limit=100) == Statement(
            "SELECT TOP (?) CAST(RowVersion AS varchar(20)) + ' ' + CONVERT(varchar(23), Due, 126), Headers"
            " FROM [dbo].[Sales.Delayed] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Due <= GETUTCDATE() ORDER BY Due",
            (100,),
        )

    @pytest.mark.parametrize("recoverable", [True, False])
    def test_move_delayed(self, recoverable: bool) -> None:
        s = dynamic(D.move_delayed(self.DL, self.E, keys=[KEY, KEY_NO_MS], headers=['{"a":"1"}', "not json"]), recoverable)
        assert s.params is not None and len(s.params) == 1
        assert json.loads(s.params[0]) == [[17, "2025-01-02T03:04:05.007", '{"a":"1"}'], [3, "2025-01-02T03:04:05", "not json"]]
        flat = _flat(s.sql)
        rec = ("Recoverable, ", "1, ") if recoverable else ("", "")
        assert flat == (
            "INSERT INTO #sqlqueue_keys (Pos, KeyRow, KeyDue, Headers) SELECT CAST(o.[key] AS bigint) + 1, k.KeyRow,"
            " k.KeyDue, k.Headers FROM OPENJSON(?) AS o"
            " CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]', KeyDue varchar(23) '$[1]',"
            " Headers nvarchar(max) '$[2]') AS k;"
            f" INSERT INTO [dbo].[error] (Id, {rec[0]}Expires, Headers, Body)"
            f" SELECT NEWID(), {rec[1]}NULL, k.Headers, d.Body"
            " FROM #sqlqueue_keys AS k"
            " JOIN [dbo].[Sales.Delayed] AS d WITH (READPAST, READCOMMITTEDLOCK)"
            " ON d.Due >= DATEADD(ms, -4, CONVERT(datetime, k.KeyDue, 126))"
            " AND d.Due <= DATEADD(ms, 4, CONVERT(datetime, k.KeyDue, 126)) AND d.RowVersion = k.KeyRow"
            f" WHERE k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND} ORDER BY k.Pos; SET @n = @@ROWCOUNT;"
        )
        tree = _insert(s)
        assert len(tree.this.expressions) == len(tree.expression.expressions)

    def test_move_delayed_checks_its_input(self) -> None:
        with pytest.raises(QTransportError, match="2 keys but 1 headers"):
            D.move_delayed(self.DL, self.Q, keys=[KEY, KEY], headers=["{}"])
        for bad in ("17", "x 2025-01-01T00:00:00", "17 ", ""):
            with pytest.raises(QTransportError, match="not a delayed row key"):
                D.move_delayed(self.DL, self.Q, keys=[bad], headers=["{}"])
            with pytest.raises(QTransportError, match="not a delayed row key"):
                D.delete_delayed(self.DL, keys=[bad])

    def test_move_keeps_key_order_beyond_the_parameter_limit(self) -> None:
        keys = [f"{i} 2025-01-02T03:04:05.{i % 1000:03d}" for i in range(3000, 0, -1)]
        s = dynamic(D.move_delayed(self.DL, self.Q, keys=keys, headers=[f"h{i}" for i in range(3000)]), False)
        assert len(placeholders(s.sql)) == 1
        assert [r[0] for r in json.loads(s.params[0])] == list(range(3000, 0, -1))

    def test_headers_survive_json(self) -> None:
        headers = ['{"NServiceBus.MessageId":"x\\/y","k":"Grüße \\u2603 \\"q\\""}', "tab\there\nnewline", EVIL]
        s = dynamic(D.move_delayed(self.DL, self.Q, keys=[KEY] * 3, headers=headers), False)
        assert [r[2] for r in json.loads(s.params[0])] == headers
        assert EVIL not in s.sql

    def test_delete_delayed(self) -> None:
        s = dynamic(D.delete_delayed(self.DL, keys=[KEY]), False)
        # NServiceBus's delayed table: at most ROW_BOUND rows per DELETE
        assert _flat(s.sql) == (
            "INSERT INTO #sqlqueue_keys (Pos, KeyRow, KeyDue) SELECT CAST(o.[key] AS bigint) + 1, k.KeyRow,"
            " k.KeyDue FROM OPENJSON(?) AS o CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]',"
            " KeyDue varchar(23) '$[1]') AS k;"
            " DELETE d FROM [dbo].[Sales.Delayed] AS d WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " JOIN #sqlqueue_keys AS k ON d.Due >= DATEADD(ms, -4, CONVERT(datetime, k.KeyDue, 126))"
            " AND d.Due <= DATEADD(ms, 4, CONVERT(datetime, k.KeyDue, 126)) AND d.RowVersion = k.KeyRow"
            f" WHERE k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND}; SET @n = @@ROWCOUNT;"
        )
        assert s.params == ('[[17,"2025-01-02T03:04:05.007"]]',)
        assert dynamic(D.delete_delayed(self.DL, keys=[]), False).params == ("[]",)


# -- operations (the sqlqueue CLI) --------------------------------------------------------------

#: the hints of every read of the CLI: never wait for a row another session holds, shared locks only
_READ_HINTS = "WITH (READPAST, READCOMMITTEDLOCK)"


def _columns_of(stmts: list[Statement]) -> set[str]:
    return set(_table_columns(one(stmts)))


def _used_columns(stmt: Statement) -> set[str]:
    (tree,) = parse_all(stmt.sql)
    return {c.name for c in tree.find_all(exp.Column) if c.name and not c.table}


class TestOperationStatements:
    Q, C = QueueAddress("Sales"), QueueAddress("Sales.Claims")
    DL, OUTBOX, SUBS = QueueAddress("Sales.Delayed"), QueueAddress("Sales.Outbox"), QueueAddress("SubscriptionRouting")

    def reads(self) -> dict[str, Statement]:
        return {
            "peek_messages": D.peek_messages(self.Q, limit=10, preview=240),
            "peek_delayed": D.peek_delayed(self.DL, limit=10, preview=240),
            "queue_stats": D.queue_stats(self.Q),
            "oldest_headers": D.oldest_headers(self.Q),
            "delayed_stats": D.delayed_stats(self.DL),
            "claim_stats": D.claim_stats(self.C),
            "count_rows": D.count_rows(self.OUTBOX),
            "failure_stats": D.failure_stats(self.Q, limit=100_000),
        }

    def test_peek_messages(self) -> None:
        """Only the start of each body is read, with its length (a 50 MB body is not fetched)."""
        assert D.peek_messages(self.Q, limit=25, preview=240) == Statement(
            "SELECT TOP (?) CAST(Id AS varchar(36)), Expires, CAST(NULL AS nvarchar(40)), Headers,"
            " CAST(SUBSTRING(Body, 1, ?) AS varbinary(8000)), DATALENGTH(Body), RowVersion"
            " FROM [dbo].[Sales] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion",
            (25, 240),
        )
        (tree,) = parse_all(D.peek_messages(self.Q, limit=1, preview=1).sql)
        # native id text, expires, expires text, headers, body start, body length, sequence
        assert len(tree.expressions) == 7
        for preview in (0, 8001):
            with pytest.raises(ConfigError, match="body preview"):
                D.peek_messages(self.Q, limit=1, preview=preview)

    def test_peek_delayed(self) -> None:
        """NServiceBus's next-due read (MoveDueDelayedMessageText: TOP 1 ... Due FROM t WITH
        (READPAST) ORDER BY Due) taken n rows deep, the start of each body only."""
        assert D.peek_delayed(self.DL, limit=25, preview=240) == Statement(
            "SELECT TOP (?) Due, Headers, CAST(SUBSTRING(Body, 1, ?) AS varbinary(8000)), DATALENGTH(Body)"
            " FROM [dbo].[Sales.Delayed] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY Due",
            (25, 240),
        )
        (tree,) = parse_all(D.peek_delayed(self.DL, limit=1, preview=1).sql)
        assert len(tree.expressions) == 4  # due, headers, body start, body length
        for preview in (0, 8001):
            with pytest.raises(ConfigError, match="body preview"):
                D.peek_delayed(self.DL, limit=1, preview=preview)
        with pytest.raises(ConfigError, match="at least 1"):
            D.peek_delayed(self.DL, limit=0, preview=1)

    def test_queue_stats(self) -> None:
        s = D.queue_stats(self.Q)
        assert s == Statement(
            "SELECT COUNT_BIG(*),"
            " (SELECT COUNT_BIG(*) FROM [dbo].[Sales] WITH (READPAST, READCOMMITTEDLOCK) WHERE Expires <= GETUTCDATE()),"
            " MIN(RowVersion), MAX(RowVersion)"
            " FROM [dbo].[Sales] WITH (READPAST, READCOMMITTEDLOCK)"
        )
        (tree,) = parse_all(s.sql)
        assert len(tree.expressions) == 4  # messages, expired, lowest, highest

    def test_delayed_stats(self) -> None:
        s = D.delayed_stats(self.DL)
        t = "[dbo].[Sales.Delayed] WITH (READPAST, READCOMMITTEDLOCK)"
        assert s == Statement(
            f"SELECT (SELECT COUNT_BIG(*) FROM {t} WHERE Due <= GETUTCDATE()),"
            f" (SELECT COUNT_BIG(*) FROM {t} WHERE Due > GETUTCDATE()),"
            f" (SELECT MIN(Due) FROM {t} WHERE Due > GETUTCDATE())"
        )
        (tree,) = parse_all(s.sql)
        assert len(tree.expressions) == 3  # due now, not yet due, next due

    def test_claim_stats(self) -> None:
        s = D.claim_stats(self.C)
        assert s == Statement(
            "SELECT Consumer, COUNT_BIG(*), MIN(ClaimedAt) FROM [dbo].[Sales.Claims]"
            " WITH (READPAST, READCOMMITTEDLOCK) GROUP BY Consumer ORDER BY Consumer"
        )
        (tree,) = parse_all(s.sql)
        assert len(tree.expressions) == 3

    def test_failure_stats(self) -> None:
        """The oldest rows only (TOP, Index_RowVersion), then grouped; JSON_VALUE read only where
        ISJSON says the headers are JSON, so a poison row cannot fail the query."""
        s = D.failure_stats(self.Q, limit=500)
        assert s == Statement(
            "SELECT t.FailedQ, COUNT_BIG(*) FROM (SELECT TOP (?) CASE WHEN ISJSON(Headers) = 1"
            " THEN JSON_VALUE(Headers, N'$.\"NServiceBus.FailedQ\"') END AS FailedQ"
            " FROM [dbo].[Sales] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion) AS t"
            " GROUP BY t.FailedQ ORDER BY t.FailedQ",
            (500,),
        )
        (tree,) = parse_all(s.sql)
        assert len(tree.expressions) == 2  # FailedQ, count
        case = tree.find(exp.Case)
        assert case is not None and "ISJSON" in case.sql("tsql") and case.find(exp.JSONExtractScalar) is not None
        assert D.failed_q_value("Sales@[dbo]") == "Sales@[dbo]" and D.failed_q_value(None) is None
        with pytest.raises(ConfigError, match="at least 1"):
            D.failure_stats(self.Q, limit=0)

    def test_count_rows(self) -> None:
        assert D.count_rows(self.OUTBOX) == Statement(
            "SELECT COUNT_BIG(*) FROM [dbo].[Sales.Outbox] WITH (READPAST, READCOMMITTEDLOCK)"
        )

    def test_reads_never_wait_and_never_lock_for_update(self) -> None:
        for method, s in self.reads().items():
            assert s.sql.count(" FROM [") == s.sql.count(_READ_HINTS), method  # every table read
            for hint in ("UPDLOCK", "XLOCK", "HOLDLOCK", "NOLOCK", "TABLOCK", "SNAPSHOT"):
                assert hint not in s.sql, (method, hint)
            assert "NOCOUNT" not in s.sql and ";" not in s.sql, method  # one statement, no session options
            (tree,) = parse_all(s.sql)
            assert isinstance(tree, exp.Select), method

    def test_columns_are_the_tables_own(self) -> None:
        queue = _columns_of(D.create_queue(self.Q))
        assert _used_columns(D.peek_messages(self.Q, limit=1, preview=240)) <= queue
        assert _used_columns(D.queue_stats(self.Q)) <= queue
        assert _used_columns(D.oldest_headers(self.Q)) == {"Headers", "RowVersion"}  # no Expires, no Body
        (purge,) = [t for t in parse_all(D.purge_expired(self.Q, limit=1).sql) if isinstance(t, exp.Delete)]
        assert {c.name for c in purge.find_all(exp.Column) if not c.table} <= queue
        assert _used_columns(D.delayed_stats(self.DL)) <= _columns_of(D.create_delayed(self.DL))
        assert _used_columns(D.peek_delayed(self.DL, limit=1, preview=1)) <= _columns_of(D.create_delayed(self.DL))
        assert _used_columns(D.claim_stats(self.C)) == {"Consumer", "ClaimedAt"} <= _columns_of(D.create_claims(self.C)[:1])
        subscriptions = _columns_of(D.create_subscriptions(self.SUBS))
        assert _used_columns(D.unsubscribe(self.SUBS, endpoint="e", topic="t")) <= subscriptions
        (merge,) = parse_all(D.subscribe(self.SUBS, queue_address="q", endpoint="e", topic="t").sql)
        assert {c.name for c in merge.find_all(exp.Column)} <= subscriptions

    def test_purge_expired(self) -> None:
        s = D.purge_expired(self.Q, limit=10_000)
        # NServiceBus's PurgeBatchOfExpiredMessagesText, at most ROW_BOUND rows per DELETE (a
        # queue is NServiceBus's) until the limit or no more; the batch selects the count
        assert s.params == (10_000,) and s.counted
        assert _flat(s.sql) == (
            "SET NOCOUNT ON; DECLARE @limit int = ?; DECLARE @total int = 0, @n int, @chunk int;"
            " WHILE @total < @limit BEGIN"
            f" SET @chunk = CASE WHEN @limit - @total < {ROW_BOUND} THEN @limit - @total ELSE {ROW_BOUND} END;"
            " DELETE TOP (@chunk) FROM [dbo].[Sales] WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            " WHERE Expires <= GETUTCDATE();"
            " SET @n = @@ROWCOUNT; SET @total = @total + @n; IF @n < @chunk BREAK; END"
            " SELECT @total AS written;"
        )
        assert sum(isinstance(t, exp.Delete) for t in parse_all(s.sql)) == 1

    @pytest.mark.parametrize("limit", [0, -1])
    def test_limits_are_positive(self, limit: int) -> None:
        with pytest.raises(ValueError, match="^limit: must be at least 1"):
            D.peek_messages(self.Q, limit=limit, preview=240)
        with pytest.raises(ValueError, match="^limit: must be at least 1"):
            D.purge_expired(self.Q, limit=limit)

    def test_subscribe_is_nservicebus_merge(self) -> None:
        s = D.subscribe(self.SUBS, queue_address="Billing@[dbo]", endpoint="Billing", topic="Ns.OrderPlaced")
        assert _flat(s.sql) == (
            "MERGE [dbo].[SubscriptionRouting] WITH (HOLDLOCK, TABLOCK) AS target"
            " USING (SELECT ? AS Endpoint, ? AS QueueAddress, ? AS Topic) AS source"
            " ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic"
            " WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN"
            " UPDATE SET QueueAddress = source.QueueAddress"
            " WHEN NOT MATCHED THEN"
            " INSERT (QueueAddress, Topic, Endpoint) VALUES (source.QueueAddress, source.Topic, source.Endpoint);"
        )
        assert s.params == ("Billing", "Billing@[dbo]", "Ns.OrderPlaced")  # marker order: the USING row
        _marks_match(s)
        assert "NOCOUNT" not in s.sql and s.sql.count(";") == 1  # MERGE must end with a semicolon
        (tree,) = parse_all(s.sql)
        assert isinstance(tree, exp.Merge)
        using = tree.args["using"].this
        assert [e.alias for e in using.expressions] == ["Endpoint", "QueueAddress", "Topic"]
        assert all(isinstance(e.this, exp.Placeholder) for e in using.expressions)

    def test_unsubscribe(self) -> None:
        s = D.unsubscribe(self.SUBS, endpoint="Billing", topic="Ns.OrderPlaced")
        assert s == Statement(
            "DELETE FROM [dbo].[SubscriptionRouting] WHERE Endpoint = ? AND Topic = ?", ("Billing", "Ns.OrderPlaced")
        )
        assert "READPAST" not in s.sql  # its rowcount says whether the subscription was there

    @pytest.mark.parametrize("value", [v for v in HOSTILE if v])
    def test_subscription_values_only_in_parameters(self, value: str) -> None:
        subscribe = D.subscribe(self.SUBS, queue_address=value, endpoint=value, topic=value)
        unsubscribe = D.unsubscribe(self.SUBS, endpoint=value, topic=value)
        assert subscribe.sql == D.subscribe(self.SUBS, queue_address="q", endpoint="e", topic="t").sql
        assert unsubscribe.sql == D.unsubscribe(self.SUBS, endpoint="e", topic="t").sql
        assert subscribe.params == (value,) * 3 and unsubscribe.params == (value,) * 2
        for s in (subscribe, unsubscribe):
            _marks_match(s)

    def test_subscription_values_fit_the_table(self) -> None:
        """nvarchar(200) NOT NULL, as NServiceBus creates SubscriptionRouting: refused here, not truncated there."""
        _marks_match(D.subscribe(self.SUBS, queue_address="q" * 200, endpoint="e" * 200, topic="t" * 200))
        for bad in ("", "x" * 201, None):
            with pytest.raises(ConfigError, match="^endpoint: "):
                D.subscribe(self.SUBS, queue_address="q", endpoint=bad, topic="t")  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="^topic: "):
                D.subscribe(self.SUBS, queue_address="q", endpoint="e", topic=bad)  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="^queue: "):
                D.subscribe(self.SUBS, queue_address=bad, endpoint="e", topic="t")  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="^topic: "):
                D.unsubscribe(self.SUBS, endpoint="e", topic=bad)  # type: ignore[arg-type]

    def test_list_queues_finds_queue_shaped_tables(self) -> None:
        s = D.list_queues()
        (tree,) = parse_all(s.sql)
        assert isinstance(tree, exp.Select) and s.params is None
        assert "LOWER(c.name) IN (N'id', N'headers', N'body', N'expires', N'rowversion')) = 5" in s.sql

    @pytest.mark.parametrize("case", list(ADDRESSES))
    def test_odd_names_stay_quoted(self, case: str) -> None:
        q, e = D.parse_address(ADDRESSES[case][0]), D.parse_address(ADDRESSES[case][1], option="errorQueue")
        stmts = operation_statements(q, e, D.claims_table(q), D.companion(q, "Delayed"), D.companion(q, "Outbox"),
                                     q.with_table("SubscriptionRouting"), "v")
        for method, (s,) in stmts.items():
            if "sp_executesql @step" in s.sql:  # a bounded batch: the tables are in the dynamic text
                s = dynamic(s, True)
            found = [t for tree in parse_all(s.sql) for t in tree.find_all(exp.Table)]
            # the only table functions are OPENJSON of a parameter or of another OPENJSON's value
            functions = [t.this for t in found if not isinstance(t.this, exp.Identifier)]
            assert all(isinstance(f, exp.OpenJSON) for f in functions), (method, functions)
            found = [t for t in found if isinstance(t.this, exp.Identifier)]
            # sqlglot 30 reads DELETE TOP (?) as a table named TOP: the only unquoted one allowed
            aliases = {t.alias for t in found if t.alias}  # DELETE m FROM [queue] AS m
            assert all(t.this.quoted or (t.name == "TOP" and "DELETE TOP" in s.sql) or t.name in aliases
                       or (t.this.args.get("temporary") and t.name.startswith("sqlqueue_")) for t in found), method
            tables = {t.name for t in found if t.this.quoted}
            assert tables and tables <= {q.table, e.table, f"{q.table}.Claims", f"{q.table}.Delayed",
                                         f"{q.table}.Outbox", "SubscriptionRouting"}, (method, tables)


class TestMessageMoves:
    """sqlqueue error retry: lock rows of the error queue, insert copies into their queue, delete them."""

    E, Q = QueueAddress("error"), QueueAddress("Sales")
    LOCK = (
        "SELECT TOP (?) CAST(RowVersion AS varchar(20)), LOWER(CAST(Id AS varchar(36))), Headers"
        " FROM [dbo].[error] WITH (UPDLOCK, READPAST, ROWLOCK)"
    )

    def test_lock_oldest(self) -> None:
        s = D.lock_messages(self.E, native_ids=None, limit=50)
        assert s == Statement(self.LOCK + " ORDER BY RowVersion", (50,))
        (tree,) = parse_all(s.sql)
        assert len(tree.expressions) == 3  # key, native id, headers
        assert [o.sql("tsql") for o in tree.args["order"].expressions] == ["RowVersion"]
        assert _used_columns(s) <= _columns_of(D.create_queue(self.E))

    def test_lock_by_native_ids(self) -> None:
        s = D.lock_messages(self.E, native_ids=NATIVE_IDS, limit=50)
        assert s == Statement(
            self.LOCK + " WHERE Id IN (SELECT CAST(value AS uniqueidentifier) FROM OPENJSON(?)) ORDER BY RowVersion",
            (50, _js(["6f9619ff-8b86-d011-b42d-00c04fc964ff", "0b4e3c2a-1d5f-4e6a-9b8c-7d6e5f4a3b2c"])),
        )
        _marks_match(s)
        # any number of ids is one parameter, in marker order after the limit
        many = D.lock_messages(self.E, native_ids=[str(uuid.UUID(int=i)) for i in range(3000)], limit=3000)
        # at most ROW_BOUND locked rows per statement (lock escalation); callers go on while rows move
        assert len(placeholders(many.sql)) == 2 and many.params[0] == ROW_BOUND
        assert len(json.loads(many.params[1])) == 3000

    def test_lock_no_native_ids_is_valid_sql_selecting_nothing(self) -> None:
        s = D.lock_messages(self.E, native_ids=[], limit=50)
        assert s.params == (50, "[]")
        assert "WHERE Id IN (SELECT CAST(value AS uniqueidentifier) FROM OPENJSON(?))" in s.sql  # not the oldest 50
        _marks_match(s)
        (tree,) = parse_all(s.sql)
        assert isinstance(tree, exp.Select)

    @pytest.mark.parametrize("bad", ["", "x", "6F9619FF-8B86-D011-B42D", EVIL, "1 OR 1 = 1"])
    def test_lock_refuses_what_is_no_uniqueidentifier(self, bad: str) -> None:
        with pytest.raises(ValueError, match="native message id"):
            D.lock_messages(self.E, native_ids=[NATIVE_IDS[0], bad], limit=1)

    def test_lock_limit(self) -> None:
        assert D.lock_messages(self.E, native_ids=None, limit=0).params == (0,)  # TOP (0): nothing
        with pytest.raises(ValueError, match="^limit: must not be negative"):
            D.lock_messages(self.E, native_ids=None, limit=-1)

    def test_lock_takes_receive_locks(self) -> None:
        """Rows others hold are skipped (READPAST), rows taken stay ours until commit (UPDLOCK)."""
        for ids in (None, [], NATIVE_IDS):
            s = D.lock_messages(self.E, native_ids=ids, limit=5)
            assert s.sql.count(" FROM ") == 1 + (ids is not None)  # the queue and, with ids, OPENJSON
            assert "WITH (UPDLOCK, READPAST, ROWLOCK)" in s.sql
            assert "NOCOUNT" not in s.sql and ";" not in s.sql

    @pytest.mark.parametrize("recoverable", [True, False])
    def test_move(self, recoverable: bool) -> None:
        s = dynamic(D.move_messages(self.E, self.Q, keys=["17", "3"], headers=['{"a":"1"}', "not json"]), recoverable)
        assert s.params == ('[[17,"{\\"a\\":\\"1\\"}"],[3,"not json"]]',)
        assert json.loads(s.params[0]) == [[17, '{"a":"1"}'], [3, "not json"]]
        rec = ("Recoverable, ", "1, ") if recoverable else ("", "")
        assert _flat(s.sql) == (
            "INSERT INTO #sqlqueue_keys (Pos, KeyRow, Headers) SELECT CAST(o.[key] AS bigint) + 1, k.KeyRow, k.Headers"
            " FROM OPENJSON(?) AS o"
            " CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]', Headers nvarchar(max) '$[1]') AS k;"
            f" INSERT INTO [dbo].[Sales] (Id, {rec[0]}Expires, Headers, Body)"
            f" SELECT NEWID(), {rec[1]}NULL, k.Headers, m.Body"
            " FROM #sqlqueue_keys AS k"
            " JOIN [dbo].[error] AS m WITH (READPAST, READCOMMITTEDLOCK) ON m.RowVersion = k.KeyRow"
            f" WHERE k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND} ORDER BY k.Pos; SET @n = @@ROWCOUNT;"
        )

    @pytest.mark.parametrize("recoverable", [True, False])
    def test_move_columns_and_values_line_up(self, recoverable: bool) -> None:
        tree = _insert(dynamic(D.move_messages(self.E, self.Q, keys=["1"], headers=["{}"]), recoverable))
        cols = [c.name for c in tree.this.expressions]
        expected = ["Id", "Recoverable", "Expires", "Headers", "Body"]
        assert cols == (expected if recoverable else [c for c in expected if c != "Recoverable"])
        assert set(cols) <= _columns_of(D.create_queue(self.Q))
        values = [v.sql("tsql") for v in tree.expression.expressions]
        assert len(values) == len(cols)
        got = dict(zip(cols, values, strict=True))
        assert (got["Id"], got["Expires"], got["Headers"], got["Body"]) == ("NEWID()", "NULL", "k.Headers", "m.Body")
        assert got.get("Recoverable", "1") == "1"
        # new rows get their RowVersion in the order of the keys: the JSON array's position
        assert [o.sql("tsql") for o in tree.expression.args["order"].expressions] == ["k.Pos"]

    def test_move_keeps_key_order_beyond_the_parameter_limit(self) -> None:
        keys = [str(i) for i in range(3000, 0, -1)]
        s = dynamic(D.move_messages(self.E, self.Q, keys=keys, headers=[f"h{i}" for i in range(3000)]), False)
        assert len(placeholders(s.sql)) == 1
        assert [r[0] for r in json.loads(s.params[0])] == list(range(3000, 0, -1))
        assert [r[1] for r in json.loads(s.params[0])] == [f"h{i}" for i in range(3000)]

    def test_move_none_is_valid_sql(self) -> None:
        s = dynamic(D.move_messages(self.E, self.Q, keys=[], headers=[]), False)
        assert s.params == ("[]",)
        _marks_match(s)
        _insert(s)

    def test_move_and_delete_check_their_input(self) -> None:
        with pytest.raises(QTransportError, match="2 keys but 1 headers"):
            D.move_messages(self.E, self.Q, keys=["1", "2"], headers=["{}"])
        for bad in ("", "x", " 17", "17 ", "1.5", "1e3", "1_000", "0x11", KEY, "9" * 20, str(2**63), EVIL):
            with pytest.raises(QTransportError, match="not a message key"):
                D.move_messages(self.E, self.Q, keys=[bad], headers=["{}"])
            with pytest.raises(QTransportError, match="not a message key"):
                D.delete_messages(self.E, keys=["1", bad])
        assert D.delete_messages(self.E, keys=[str(2**63 - 1), "-5"]).params[0] == _js([[2**63 - 1], [-5]])

    @pytest.mark.parametrize("value", HOSTILE)
    def test_headers_only_in_parameters(self, value: str) -> None:
        s = dynamic(D.move_messages(self.E, self.Q, keys=["1", "2"], headers=[value, "{}"]), False)
        assert s.sql == dynamic(D.move_messages(self.E, self.Q, keys=["8", "9"], headers=["{}", "{}"]), False).sql
        assert json.loads(s.params[0])[0][1] == value
        _marks_match(s)

    def test_delete(self) -> None:
        s = dynamic(D.delete_messages(self.E, keys=["17", "3"]), False)
        # a queue is NServiceBus's: at most ROW_BOUND rows per DELETE; the batch selects the count
        assert _flat(s.sql) == (
            "INSERT INTO #sqlqueue_keys (Pos, KeyRow) SELECT CAST(o.[key] AS bigint) + 1, k.KeyRow"
            " FROM OPENJSON(?) AS o CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]') AS k;"
            " DELETE m FROM [dbo].[error] AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)"
            f" JOIN #sqlqueue_keys AS k ON m.RowVersion = k.KeyRow WHERE k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND};"
            " SET @n = @@ROWCOUNT;"
        )
        assert s.params == ("[[17],[3]]",)
        assert D.delete_messages(self.E, keys=["17", "3"]).counted
        delete = [t for t in parse_all(s.sql) if isinstance(t, exp.Delete)]
        assert len(delete) == 1
        none = dynamic(D.delete_messages(self.E, keys=[]), False)
        assert none.params == ("[]",)
        _marks_match(none)


class TestIndexes:
    """sqlqueue doctor: (name, key columns, clustered, unique, filter) of a table's indexes."""

    SQL = (
        "WITH t AS (SELECT OBJECT_ID(?) AS id),"
        " k AS ("
        " SELECT ic.object_id, ic.index_id, ic.key_ordinal, CAST(LOWER(c.name) AS nvarchar(max)) AS cols"
        " FROM t"
        " JOIN {s}index_columns AS ic ON ic.object_id = t.id AND ic.key_ordinal = 1 AND ic.is_included_column = 0"
        " JOIN {s}columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id"
        " UNION ALL"
        " SELECT ic.object_id, ic.index_id, ic.key_ordinal, CAST(k.cols + N',' + LOWER(c.name) AS nvarchar(max))"
        " FROM k"
        " JOIN {s}index_columns AS ic ON ic.object_id = k.object_id AND ic.index_id = k.index_id"
        " AND ic.key_ordinal = k.key_ordinal + 1 AND ic.is_included_column = 0"
        " JOIN {s}columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id"
        " )"
        " SELECT i.name, k.cols, CAST(CASE WHEN i.type = 1 THEN 1 ELSE 0 END AS bit), i.is_unique, i.filter_definition"
        " FROM t"
        " JOIN {s}indexes AS i ON i.object_id = t.id"
        " LEFT JOIN k ON k.object_id = i.object_id AND k.index_id = i.index_id"
        " AND NOT EXISTS (SELECT 1 FROM {s}index_columns AS n"
        " WHERE n.object_id = k.object_id AND n.index_id = k.index_id AND n.key_ordinal = k.key_ordinal + 1)"
        " WHERE i.type <> 0 AND i.is_hypothetical = 0"
        " ORDER BY i.name"
    )

    def test_sql(self) -> None:
        s = D.indexes(QueueAddress("Sales"))
        assert s.params == ("[dbo].[Sales]",)
        assert _flat(s.sql) == self.SQL.format(s="sys.")
        assert s.sql == s.sql.strip() and ";" not in s.sql  # one statement, its rows the first result
        _marks_match(s)

    def test_catalog_views_of_the_tables_database(self) -> None:
        s = D.indexes(QueueAddress("q", "s", "shop"))
        assert s.params == ("[shop].[s].[q]",)
        assert _flat(s.sql) == self.SQL.format(s="[shop].sys.")
        assert _flat(s.sql).count("[shop].sys.") == 6 and " sys." not in s.sql  # no view of the current database
        # schema and table are never in the text: OBJECT_ID resolves the quoted name
        assert D.indexes(QueueAddress("q", "other")).sql == D.indexes(QueueAddress("Sales")).sql

    def test_parsed_shape(self) -> None:
        s = D.indexes(QueueAddress("Sales", "b", "shop"))
        (tree,) = parse_all(s.sql)
        assert isinstance(tree, exp.Select)
        assert [c.alias_or_name for c in tree.ctes] == ["t", "k"]
        # the one marker is OBJECT_ID's argument
        (marker,) = tree.find_all(exp.Placeholder)
        assert marker.parent.sql("tsql") == "OBJECT_ID(?)"
        assert marker.find_ancestor(exp.CTE).alias == "t"
        views = {(t.catalog, t.db, t.name) for t in tree.find_all(exp.Table) if t.db}
        assert views == {("shop", "sys", v) for v in ("index_columns", "columns", "indexes")}
        assert {t.name for t in tree.find_all(exp.Table) if not t.db} == {"t", "k"}
        assert len(tree.selects) == 5
        assert [e.sql("tsql") for e in tree.args["order"].expressions] == ["i.name"]

    def test_keys_only_in_key_order_no_heap(self) -> None:
        flat = _flat(D.indexes(QueueAddress("Sales")).sql)
        # key columns only (included and partitioning columns have key_ordinal 0), chained 1, 2, ...
        assert "ic.key_ordinal = 1 AND ic.is_included_column = 0" in flat
        assert "ic.key_ordinal = k.key_ordinal + 1 AND ic.is_included_column = 0" in flat
        assert "CAST(k.cols + N',' + LOWER(c.name) AS nvarchar(max))" in flat  # appended: key order kept
        # the last key of each index (no next one): its chain holds all keys
        assert "NOT EXISTS (SELECT 1 FROM sys.index_columns AS n" in flat
        assert "WHERE i.type <> 0 AND i.is_hypothetical = 0" in flat
        # SQL Server 2016 (OPENJSON's first version): no STRING_AGG, no FOR XML
        assert "STRING_AGG" not in flat.upper() and "FOR XML" not in flat.upper()

    @pytest.mark.parametrize("name", [EVIL_TABLE, *[v for v in HOSTILE if v], "a]]]b", "x,y"])
    def test_hostile_names_only_in_the_parameter(self, name: str) -> None:
        plain = D.indexes(QueueAddress("q", "s"))
        for address in (QueueAddress(name), QueueAddress("t", name), QueueAddress(name, name)):
            s = D.indexes(address)
            assert s.sql == plain.sql
            assert s.params == (D.qualified(address),)
        # as the catalog: one quoted identifier, six times; the statement's shape unchanged
        s = D.indexes(QueueAddress("t", None, name))
        assert s.params == (D.qualified(QueueAddress("t", None, name)),)
        assert _shape(s.sql) == _shape(D.indexes(QueueAddress("t", None, "c")).sql)
        quoted = D.quote(name)
        assert [t.text for t in tokenize(s.sql) if t.token_type == TokenType.IDENTIFIER] == [name] * 6
        assert s.sql.count(quoted) == 6
        assert not [t for t in parse_all(s.sql) if isinstance(t, (exp.Drop, exp.Command))]


# -- scripts for DBAs ---------------------------------------------------------------------------

SQL_DIR = SQL_ROOT / "sqlserver"
HEADER = """\
-- {title}
--
-- Generated from spark_qtransport.dialects.sqlserver.SqlServerDialect.{method}() and rendered
-- with SqlServerDialect.script(): this is exactly what the connector runs, with its parameters
-- written as literals. tests/test_sqlserver_sql.py fails when this file and the code differ
-- (regenerate with SQLQUEUE_WRITE_SQL=1 pytest tests/test_sqlserver_sql.py -k script_files).
-- `sqlqueue ddl` prints the same script for other queue names.
--
-- Idempotent: does nothing when the table exists; otherwise creates it under the same
-- application lock as the NServiceBus installer (<table>_lock), so the two never race.
-- Runs as it is in sqlcmd (add -b to stop at the first error), SSMS or Azure Data Studio: its
-- first batch sets QUOTED_IDENTIFIER and ANSI_NULLS ON, which sqlcmd leaves OFF without -I.
"""
SCRIPTS = {
    "queue.sql": (
        "Queue table [dbo].[Sales]: the NServiceBus SQL Server transport layout (queue 'Sales').",
        "create_queue",
        lambda: D.create_queue(D.parse_address("Sales")),
    ),
    "claims.sql": (
        "Claim table [dbo].[Sales.Claims] of queue 'Sales': messages claimed by spark-qtransport readers.",
        "create_claims",
        lambda: D.create_claims(D.claims_table(D.parse_address("Sales"))),
    ),
    "batches.sql": (
        "The database's settled-batches table [dbo].[SqlQueue.Batches] (which claims each streaming batch read, and whether its sink settled it) and failed-claims table [dbo].[SqlQueue.Failed] (the claims its sink failed).",
        "create_batches",
        lambda: D.create_batches(D.batches_table()),
    ),
    **endpoint_scripts(D),
}


def _script_file(name: str) -> str:
    title, method, make = SCRIPTS[name]
    return render(D, HEADER, title, method, make())


class TestScripts:
    @pytest.mark.parametrize("name", list(SCRIPTS))
    def test_script_files(self, name: str) -> None:
        assert_matches_file(SQL_DIR / name, _script_file(name))

    def test_script_inlines_literals(self) -> None:
        text = D.script([Statement("SELECT ?, ?, [a?], '?', ? -- ?\n", ("it's", 5, "x"))])
        assert text == SET_OPTIONS + "\nSELECT N'it''s', 5, [a?], '?', N'x' -- ?\nGO\n"

    def test_script_counts_markers(self) -> None:
        with pytest.raises(QTransportError, match="1 parameter markers but 2 parameters"):
            D.script([Statement("SELECT ?", (1, 2))])

    def test_script_of_queue_parses_without_parameters(self) -> None:
        text = D.script(D.create_queue(D.parse_address("Sales@[billing]")))
        assert "DECLARE @table nvarchar(776) = N'[dbo].[Sales]'" not in text
        assert "DECLARE @table nvarchar(776) = N'[billing].[Sales]';" in text
        assert "DECLARE @createSchema nvarchar(max) = N'CREATE SCHEMA ' + N'[billing]';" in text
        batch = text.removeprefix(SET_OPTIONS).rsplit("GO", 1)[0]
        assert not placeholders(batch)
        parse_all(batch)


#: what every script for people starts with (pinned here as text, not imported from the dialect)
SET_OPTIONS = "SET ANSI_NULLS ON;\nSET QUOTED_IDENTIFIER ON;\nGO\n"


def _without_comments(text: str) -> str:
    """A script without its leading comment and blank lines (the headers of the files and of
    `sqlqueue ddl`'s parts)."""
    lines = text.splitlines(keepends=True)
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "".join(lines)


def _every_script() -> dict[str, str]:
    """Every T-SQL script the project generates for people, by where it comes from: each DDL
    method of the dialect (found by name, so a new one is included) for every address shape,
    the grants of both endpoint kinds, each file in sql/sqlserver/, and each part of
    `sqlqueue ddl` (with and without --grant-to)."""
    from click.testing import CliRunner

    from spark_qtransport.cli import main
    from spark_qtransport.cli.install import DDL_PARTS
    from spark_qtransport.transport.operations import privileges

    ddl_methods = sorted(n for n in dir(D) if n.startswith("create_") and callable(getattr(D, n)))
    assert {"create_queue", "create_claims", "create_staging", "create_outbox", "create_delayed",
            "create_subscriptions", "create_helpers"} <= set(ddl_methods)
    out: dict[str, str] = {}
    for case, (queue_text, error_text) in ADDRESSES.items():
        q, e = D.parse_address(queue_text), D.parse_address(error_text)
        for name in ddl_methods:
            out[f"{name}({case})"] = D.script(getattr(D, name)(q))
        needs = [*privileges.receiving(D, q, error_queue=e),
                 *privileges.sending(D, q, destinations=[e], error_queue=e, subscriptions=q.with_table("Subs"))]
        out[f"grants({case})"] = D.script(privileges.grant_statements(D, "app_role", needs))
    for path in sorted(SQL_DIR.glob("*.sql")):
        out[f"sql/sqlserver/{path.name}"] = path.read_text(encoding="utf-8")
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(main, ["ddl", "--dialect", "sqlserver", *args], env={"SQLQUEUE_URL": ""})
        assert result.exit_code == 0, (result.output, result.exception)
        return result.output

    # One script per header line the command prints: "-- <part>: sqlserver" before each part of
    # the DDL, "-- grants for role ..." before the grants of each endpoint kind.
    header = re.compile(r"^(?=-- (?:\w+: sqlserver|grants for role .*)$)", re.M)
    outputs = {"": cli(), " --grant-to": cli("--grant-to", "app_role")}
    for part in DDL_PARTS:
        outputs[f" --part {part}"] = cli("--part", part)
        outputs[f" --part {part} --grant-to"] = cli("--part", part, "--grant-to", "app_role")
    for args, output in outputs.items():
        scripts = header.split(output)
        assert scripts[0] == "" and len(scripts) > 1, output
        out.update({f"sqlqueue ddl{args} (script {i})": text for i, text in enumerate(scripts[1:], 1)})
    assert sum(k.startswith("sqlqueue ddl (") for k in out) == len(DDL_PARTS)
    return out


class TestScriptsRunInSqlcmd:
    """Classic sqlcmd runs scripts with QUOTED_IDENTIFIER OFF (unless given -I): the filtered
    Index_Expires then fails with error 1934 and the installer's CATCH rolls the whole queue
    table back. Every script for people therefore sets the options in a first batch of its own."""

    SCRIPTS = _every_script()

    @pytest.mark.parametrize("where", list(SCRIPTS))
    def test_starts_with_the_set_options_then_go(self, where: str) -> None:
        text = _without_comments(self.SCRIPTS[where])
        assert text.startswith(SET_OPTIONS), f"{where} does not start with the SET options:\n{text[:200]}"
        rest = text.removeprefix(SET_OPTIONS)
        assert "QUOTED_IDENTIFIER" not in rest and "ANSI_NULLS" not in rest  # set once, never turned off

    def test_the_filtered_index_is_in_a_script_that_sets_them(self) -> None:
        queue = self.SCRIPTS["sql/sqlserver/queue.sql"]
        assert "WHERE Expires IS NOT NULL" in queue
        assert queue.index(SET_OPTIONS) < queue.index("CREATE NONCLUSTERED INDEX [Index_Expires]")

    def test_the_options_are_the_dialects(self) -> None:
        from spark_qtransport.dialects.sqlserver import SCRIPT_SET_OPTIONS

        assert SCRIPT_SET_OPTIONS == SET_OPTIONS
        parse_all(SET_OPTIONS.removesuffix("GO\n"))


def test_placeholders_skip_quoted_text_and_comments() -> None:
    sql = "SELECT ? FROM [a?]]?] WHERE x = N'?''?' AND \"q?\" = ? -- ?\n/* ? */ AND y = ?"
    assert [sql[i - 2 : i + 1] for i in placeholders(sql)] == ["T ?", "= ?", "= ?"]
    assert placeholders(sql)[1] == sql.index("\" = ?") + 4


# -- errors and connections ---------------------------------------------------------------------


class _FakeError(Exception):
    """Shaped like pyodbc.Error: args = (sqlstate, message)."""


class TestErrors:
    @pytest.mark.parametrize(
        ("state", "message"),
        [
            ("40001", "[40001] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Transaction (Process ID 57) was"
                      " deadlocked on lock resources with another process and has been chosen as the deadlock victim."
                      " Rerun the transaction. (1205) (SQLExecDirectW)"),
            ("08S01", "[08S01] [Microsoft][ODBC Driver 18 for SQL Server]TCP Provider: Error code 0x68 (104) (SQLExecDirectW)"),
            ("HYT00", "[HYT00] [Microsoft][ODBC Driver 18 for SQL Server]Query timeout expired (0) (SQLExecDirectW)"),
            ("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Database 'shop' on server 'x'"
                      " is not currently available. Please retry the connection later. (40613) (SQLDriverConnect)"),
            ("42000", "[42000] [Microsoft]...Resource ID : 1. The request limit for the database is 200 and has been"
                      " reached. (10928); [42000] ... The service is currently busy. (40501)"),
            ("HY000", "[HY000] [FreeTDS][SQL Server]Server is busy (49918) (SQLExecDirectW)"),
            # SqlClient's list, as NServiceBus's endpoints meet a failover (SqlConfigurableRetryFactory)
            *[("42000", f"[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]failing over ({n}) (SQLExecDirectW)")
              for n in (20, 64, 233, 997, 1204, 1222, 4221, 10053, 10054, 10060, 10929, 40143, 40197, 40540, 49919, 49920)],
        ],
    )
    def test_transient(self, state: str, message: str) -> None:
        assert D.is_transient(_FakeError(state, message))

    @pytest.mark.parametrize(
        ("state", "message"),
        [
            ("42S02", "[42S02] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Invalid object name 'dbo.x'. (208) (SQLExecDirectW)"),
            ("23000", "[23000] ... Cannot insert the value NULL into column 'Recoverable' (515) (SQLExecDirectW)"),
            ("22001", "[22001] ... String or binary data would be truncated. Truncated value: '(1205)'. (2628) (SQLExecDirectW)"),
            ("42000", "[42000] ... Incorrect syntax near 'x'. (102) (SQLExecDirectW)"),
        ],
    )
    def test_not_transient(self, state: str, message: str) -> None:
        assert not D.is_transient(_FakeError(state, message))
        assert not D.is_transient(ValueError("plain"))

    def test_undefined_table(self) -> None:
        assert D.is_undefined_table(_FakeError("42S02", "[42S02] ...Invalid object name 'dbo.x'. (208) (SQLExecDirectW)"))
        assert D.is_undefined_table(_FakeError("42000", "... Invalid object name 'x'. (208) (SQLExecDirectW)"))
        assert not D.is_undefined_table(_FakeError("42S22", "... Invalid column name 'x'. (207) (SQLExecDirectW)"))
        assert not D.is_undefined_table(KeyError("x"))


class TestConnect:
    def test_connect_read_committed_autocommit_off(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from spark_qtransport.connections import parse_url

        calls: list[Any] = []

        class Cursor:
            def execute(self, sql: str, *params: Any) -> None:
                calls.append(("execute", sql, params))

            def close(self) -> None:
                calls.append(("cursor.close",))

        class Conn:
            def cursor(self) -> Cursor:
                return Cursor()

            def commit(self) -> None:
                calls.append(("commit",))

            def close(self) -> None:
                calls.append(("close",))

        def connect(text: str, **kw: Any) -> Conn:
            calls.append(("connect", text, kw))
            return Conn()

        class OperationalError(Exception):
            pass

        fake = types.ModuleType("pyodbc")
        fake.connect = connect  # type: ignore[attr-defined]
        fake.OperationalError = OperationalError  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "pyodbc", fake)
        url = parse_url("sqlserver://sa:pw@db.local:1433/Shop?TrustServerCertificate=yes")
        D.connect(url)
        # no transparent reconnect: it would drop the session-owned consumer lock without a word
        assert calls[0] == ("connect", "ConnectRetryCount=0;" + url.odbc_string(), {"autocommit": False})
        assert ("execute", "SET TRANSACTION ISOLATION LEVEL READ COMMITTED", ()) in calls
        # the server's `user options` may start sessions with NOCOUNT (row counts of -1: every
        # outbox insert would read as a replay) or XACT_ABORT (no rollback to a savepoint): off
        assert ("execute", "SET NOCOUNT OFF; SET XACT_ABORT OFF;", ()) in calls
        assert calls[-1] == ("commit",)
        assert D.is_transient(OperationalError("08S01", "link failure"))
        assert not D.is_transient(OperationalError("HY000", "anything"))  # judged by diagnostics, not class


    def test_freetds_driver_reaches_the_server(self) -> None:
        """The real pyodbc + unixODBC + FreeTDS path, up to the connection attempt: a listener on
        loopback receives the driver's TDS PRELOGIN packet; the refused login is a transient
        OperationalError (retried by the connector), and the password is not in it."""
        import socket
        import threading

        pyodbc = pytest.importorskip("pyodbc")
        if "FreeTDS" not in pyodbc.drivers():
            pytest.skip("FreeTDS ODBC driver not installed (make system-deps installs it)")
        from spark_qtransport.connections import parse_url

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(20)
        received: list[bytes] = []

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                received.append(conn.recv(8))

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        port = listener.getsockname()[1]
        url = parse_url(f"sqlserver://sa:s3cret-pw@127.0.0.1:{port}/Shop?driver=FreeTDS&TDS_Version=7.4")
        try:
            with pytest.raises(pyodbc.OperationalError) as exc:
                D.connect(url)
        finally:
            server.join(20)
            listener.close()
        assert received and received[0][:1] == b"\x12", "no TDS PRELOGIN packet reached the listener"
        assert D.is_transient(exc.value)
        assert "s3cret-pw" not in str(exc.value)


class TestDoctor:
    """`sqlqueue doctor`'s judgement of SQL Server tables, from the facts its statements read."""

    NSB = {"id": "uniqueidentifier", "correlationid": "varchar(255)", "replytoaddress": "varchar(255)",
           "recoverable": "bit", "expires": "datetime", "headers": "nvarchar(max)", "body": "varbinary(max)",
           "rowversion": "bigint"}
    CURRENT = ((("rowversion",), False), (("expires",), False))  # NServiceBus's current installer

    def assess(self, **kw: Any) -> list[tuple[str, str]]:
        from spark_qtransport.transport.operations.doctor import TableFacts, assess

        facts = {"name": "[dbo].[Sales]", "columns": dict(self.NSB), "index_keys": self.CURRENT, **kw}
        return [(f.level, f.message) for f in assess(TableFacts(**facts), D)]

    def test_current_installer_table_is_fine(self) -> None:
        findings = self.assess()
        assert findings[0][0] == "ok"
        assert ("info", "Recoverable column present: sends write 1") in findings
        assert not [f for f in findings if f[0] in ("warning", "error")]

    def test_varchar_headers_warn(self) -> None:
        findings = self.assess(columns={**self.NSB, "headers": "varchar(max)"})
        assert [level for level, m in findings if "Headers is varchar(max)" in m] == ["warning"]

    def test_missing_expires_index_and_clustered_rowversion_warn(self) -> None:
        findings = self.assess(index_keys=((("rowversion",), True),))
        messages = [m for level, m in findings if level == "warning"]
        assert any(m.startswith("no index on Expires") for m in messages)
        assert any(m.startswith("clustered index on RowVersion") for m in messages)

    def test_a_heap_without_a_rowversion_index_warns(self) -> None:
        # NServiceBus's SchemaVerification warns when no nonclustered index leads with RowVersion
        # (CheckIfNonClusteredRowVersionIndexIsPresent): every receive then scans and sorts the heap
        findings = self.assess(index_keys=((("expires",), False),))
        assert [level for level, m in findings if m.startswith("no nonclustered index on RowVersion")] == ["warning"]
        assert not [m for _, m in self.assess() if "nonclustered index on RowVersion" in m]

    @pytest.mark.parametrize(("high", "level"), [(1000, "info"), (int(0.85 * 2**31), "warning"), (2**31 - 10, "error")])
    def test_int_rowversion_near_exhaustion(self, high: int, level: str) -> None:
        findings = self.assess(columns={**self.NSB, "rowversion": "int"}, high_seq=high)
        assert [lv for lv, m in findings if m.startswith("RowVersion is a 32-bit int IDENTITY")] == [level]

    def test_recoverable_removed_and_body_string(self) -> None:
        cols = {k: v for k, v in self.NSB.items() if k != "recoverable"} | {"bodystring": "nvarchar(max)"}
        findings = self.assess(columns=cols)
        assert ("info", "no Recoverable column: sends leave it out") in findings
        assert any(m.startswith("computed BodyString column present") for _, m in findings)

    def test_columns_nservicebus_declares_not_null(self) -> None:
        # NServiceBus's CreateQueueText: Id, Recoverable, Headers, RowVersion NOT NULL
        findings = self.assess(nullable=("id", "correlationid", "recoverable", "expires", "headers", "body"))
        [(level, message)] = [f for f in findings if "allow NULL" in f[1]]
        assert level == "warning" and message.startswith("column(s) id, recoverable, headers allow NULL")
        assert findings[0][0] != "ok"
        assert not [f for f in self.assess(nullable=("correlationid", "replytoaddress", "expires", "body"))
                    if "allow NULL" in f[1]]
        assert D.nullable_columns(QueueAddress("Sales", "s", "cat")) == Statement(
            "SELECT LOWER(c.name) FROM [cat].sys.columns AS c WHERE c.object_id = OBJECT_ID(?) AND c.is_nullable = 1"
            " ORDER BY c.column_id", ("[cat].[s].[Sales]",))

    def test_companion_names_too_long(self) -> None:
        name = "x" * 122  # .Claims: 129 characters, one more than a name may have
        findings = self.assess(too_long=(("Claims", f"{name}.Claims", 129),))
        assert ("warning", f"table '{name}.Claims' would be named with 129 characters, more than the 128 the "
                "database allows: no stream can receive from this queue (a shorter queue name fits)") in findings

    def test_not_a_queue_table(self) -> None:
        assert self.assess(columns={"id": "int", "name": "nvarchar(50)"}) == [
            ("error", "not a queue table: missing column(s) headers, body, expires, seq / RowVersion")]
        assert self.assess(columns={})[0][0] == "error"


# -- a real SQL Server --------------------------------------------------------------------------

LIVE_URL = os.environ.get("SQLQUEUE_TEST_SQLSERVER_URL")
NSB_SEND = (
    "INSERT INTO {0} (Id, CorrelationId, ReplyToAddress, Recoverable, Expires, Headers, Body)"
    " VALUES (NEWID(), NULL, NULL, 1, NULL, ?, ?)"
)
NSB_SEND_TTBR = (
    "INSERT INTO {0} (Id, CorrelationId, ReplyToAddress, Recoverable, Expires, Headers, Body)"
    " VALUES (NEWID(), NULL, NULL, 1, DATEADD(ms, ?, GETUTCDATE()), ?, ?)"
)


def _headers(n: int) -> str:
    return json.dumps({"NServiceBus.MessageId": f"m-{n}", "NServiceBus.ContentType": "application/json",
                       "Custom.Null": None, "Custom.Text": "Grüße \u2603"}, ensure_ascii=False)


@pytest.mark.sqlserver
@pytest.mark.skipif(not LIVE_URL, reason="SQLQUEUE_TEST_SQLSERVER_URL not set")
class TestSqlServerLive:
    @pytest.fixture
    def db(self) -> Any:
        from spark_qtransport.connections import parse_url

        url = parse_url(LIVE_URL or "")
        conn = D.connect(url)
        tag = uuid.uuid4().hex[:8]
        q = D.parse_address(f"sqlqueue_test_{tag}")
        e = D.parse_address(f"sqlqueue_test_{tag}_error")
        plain_error = D.parse_address(f"sqlqueue_test_{tag}_plainerror")
        c = D.claims_table(q)
        created = [q, e, c, plain_error]
        try:
            yield types.SimpleNamespace(url=url, conn=conn, q=q, e=e, c=c, plain_error=plain_error)
        finally:
            conn.rollback()
            cur = conn.cursor()
            for t in created:
                cur.execute(f"DROP TABLE IF EXISTS {D.qualified(t)}")
            conn.commit()
            conn.close()

    @staticmethod
    def run(conn: Any, stmts: list[Statement] | Statement) -> Any:
        cur = conn.cursor()
        for s in stmts if isinstance(stmts, list) else [stmts]:
            cur.execute(s.sql, s.params) if s.params is not None else cur.execute(s.sql)
        return cur

    @staticmethod
    def count(conn: Any, stmt: Statement) -> int:
        """The rows a statement wrote, read as the connector reads them (a bounded batch selects it)."""
        from spark_qtransport.transport import session

        return session.rowcount(conn.cursor(), stmt)

    def install(self, db: Any) -> None:
        for _ in range(2):  # idempotent
            self.run(db.conn, D.create_queue(db.q) + D.create_queue(db.e) + D.create_claims(db.c))
            db.conn.commit()

    def test_queue_tables(self, db: Any) -> None:
        self.install(db)
        cols = dict(self.run(db.conn, D.queue_columns(db.q)).fetchall())
        assert cols == {"id": "uniqueidentifier", "correlationid": "varchar(255)", "replytoaddress": "varchar(255)",
                        "recoverable": "bit", "expires": "datetime", "headers": "nvarchar(max)",
                        "body": "varbinary(max)", "rowversion": "bigint"}
        first = self.run(db.conn, D.table_id(db.c)).fetchone()[0]
        assert first is not None
        assert self.run(db.conn, D.table_id(db.q.with_table("no_such_table_here"))).fetchone()[0] is None
        indexes = {r[0] for r in self.run(db.conn, Statement(
            "SELECT name FROM sys.indexes WHERE object_id = OBJECT_ID(?) AND name IS NOT NULL", (D.qualified(db.q),)
        )).fetchall()}
        assert indexes == {"Index_RowVersion", "Index_Expires"}
        db.conn.commit()

    def test_indexes(self, db: Any) -> None:
        self.install(db)
        rows = [tuple(r) for r in self.run(db.conn, D.indexes(db.q)).fetchall()]
        # NServiceBus's heap: no row for the heap itself, only its two nonclustered indexes
        assert rows == [("Index_Expires", "expires", False, False, "([Expires] IS NOT NULL)"),
                        ("Index_RowVersion", "rowversion", False, False, None)]
        assert self.run(db.conn, D.indexes(db.q.with_table("no_such_table_here"))).fetchall() == []
        # the claim table: a clustered primary key of two columns, in key order
        [(_, cols, clustered, unique, where)] = self.run(db.conn, D.indexes(db.c)).fetchall()
        assert (cols, bool(clustered), bool(unique), where) == ("consumer,claimseq", True, True, None)
        db.conn.commit()
        # odd column names, keys in key order (not column order), included columns left out, heaps skipped
        odd = db.q.with_table(db.q.table + "_odd ]")
        t = D.qualified(odd)
        try:
            self.run(db.conn, [
                Statement(f"CREATE TABLE {t} ([A,]]b] int NOT NULL, [Ü'x] int NOT NULL, [c?] int NULL)"),
                Statement(f"CREATE UNIQUE CLUSTERED INDEX [ix ]]1] ON {t} ([Ü'x] DESC, [A,]]b])"),
                Statement(f"CREATE INDEX [ix2] ON {t} ([c?]) INCLUDE ([A,]]b]) WHERE [c?] IS NOT NULL"),
            ])
            db.conn.commit()
            rows = [tuple(r) for r in self.run(db.conn, D.indexes(odd)).fetchall()]
            assert rows == [("ix ]1", "ü'x,a,]b", True, True, None), ("ix2", "c?", False, False, "([c?] IS NOT NULL)")]
            db.conn.commit()
        finally:
            db.conn.rollback()
            db.conn.cursor().execute(f"DROP TABLE IF EXISTS {t}")
            db.conn.commit()

    def test_consumer_lock(self, db: Any) -> None:
        self.install(db)
        other = D.connect(db.url)
        try:
            assert self.run(db.conn, D.try_lock_consumer(db.c, EVIL)).fetchone()[0] in (1, True)
            db.conn.commit()
            assert self.run(other, D.try_lock_consumer(db.c, EVIL)).fetchone()[0] in (0, False)
            assert self.run(other, D.try_lock_consumer(db.c, "someone else")).fetchone()[0] in (1, True)
            other.commit()
            self.run(db.conn, D.unlock_consumer(db.c, EVIL))
            self.run(db.conn, D.unlock_consumer(db.c, EVIL))  # not held: no error
            db.conn.commit()
            assert self.run(other, D.try_lock_consumer(db.c, EVIL)).fetchone()[0] in (1, True)
            other.commit()
        finally:
            other.close()

    def test_claim_read_ack(self, db: Any) -> None:
        self.install(db)
        cur = db.conn.cursor()
        q = D.qualified(db.q)
        good = [(_headers(n), f'{{"n": {n}}}'.encode()) for n in range(3)]
        cur.execute(NSB_SEND.format(q), good[0])
        cur.execute(NSB_SEND.format(q), ("not json", b"p1"))
        cur.execute(NSB_SEND.format(q), good[1])
        cur.execute(NSB_SEND_TTBR.format(q), (1, _headers(99), b"expired"))
        cur.execute(NSB_SEND.format(q), ('{"a": 1}', b"p2"))
        cur.execute(NSB_SEND.format(q), ('["x"]', b"p3"))
        cur.execute(NSB_SEND_TTBR.format(q), (1, "not json either", b"expired poison"))
        cur.execute(NSB_SEND.format(q), good[2])
        db.conn.commit()
        time.sleep(0.1)  # let the 1 ms time-to-be-received pass

        assert self.run(db.conn, D.backlog(db.q)).fetchone()[0] == 8
        first = self.run(db.conn, D.peek(db.q, after=0, upto=None)).fetchone()[0]
        row = self.run(db.conn, D.claim(db.q, db.c, db.e, consumer=EVIL, limit=100, after=0, upto=None)).fetchone()
        db.conn.commit()
        deleted, expired, poison, claimed, max_claim, max_source = row
        assert (deleted, expired, poison, claimed) == (8, 2, 3, 3)
        assert max_source == first + 7 and max_claim is not None
        assert self.run(db.conn, D.peek(db.q, after=0, upto=None)).fetchone() is None
        assert self.run(db.conn, D.backlog(db.q)).fetchone()[0] == 0
        assert self.run(db.conn, D.max_source_seq(db.q)).fetchone()[0] is None

        errors = self.run(db.conn, Statement(
            f"SELECT Headers, Body, Recoverable, Expires FROM {D.qualified(db.e)} ORDER BY RowVersion"
        )).fetchall()
        assert [(h, bytes(b)) for h, b, _, _ in errors] == [("not json", b"p1"), ('{"a": 1}', b"p2"), ('["x"]', b"p3")]
        assert all(r[2] in (1, True) and r[3] is None for r in errors)

        hi, lo = self.run(db.conn, D.max_claim(db.c, EVIL)).fetchone()
        assert (hi, hi - lo) == (max_claim, 2)
        rows = self.run(db.conn, D.read_claims(db.c, EVIL, after=lo - 1, upto=hi)).fetchall()
        assert [r[0] for r in rows] == [lo, lo + 1, hi]
        assert [(r[3], bytes(r[4])) for r in rows] == good
        assert [r[5] for r in rows] == sorted(r[5] for r in rows)
        assert all(len(r[1]) == 36 and r[2] is None and r[6] is not None for r in rows)
        assert self.run(db.conn, D.read_claims(db.c, "other", after=0, upto=hi)).fetchall() == []
        db.conn.commit()

        assert self.run(db.conn, D.ack_claims(db.c, EVIL, upto=hi, batch=2)).rowcount == 2
        assert self.run(db.conn, D.ack_claims(db.c, EVIL, upto=hi, batch=2)).rowcount == 1
        assert self.run(db.conn, D.ack_claims(db.c, EVIL, upto=hi, batch=2)).rowcount == 0
        db.conn.commit()
        assert tuple(self.run(db.conn, D.max_claim(db.c, EVIL)).fetchone()) == (None, None)
        db.conn.commit()

    def test_failure_stats(self, db: Any) -> None:
        """FailedQ values grouped (escapes decoded by JSON_VALUE), poison rows under NULL, the
        oldest `limit` rows only."""
        self.install(db)
        failed = [json.dumps({"NServiceBus.FailedQ": q}) for q in ("Sales@[dbo]", "Sales@[dbo]", 'Caf\u00e9 "x"')]
        for headers in [*failed, "not json", '["x"]', '{"a": "b"}']:
            self.run(db.conn, Statement(NSB_SEND.format(D.qualified(db.e)), (headers, b"x")))
        db.conn.commit()
        rows = {r[0]: int(r[1]) for r in self.run(db.conn, D.failure_stats(db.e, limit=100)).fetchall()}
        assert rows == {"Sales@[dbo]": 2, 'Caf\u00e9 "x"': 1, None: 3}
        rows = {r[0]: int(r[1]) for r in self.run(db.conn, D.failure_stats(db.e, limit=2)).fetchall()}
        assert rows == {"Sales@[dbo]": 2}
        db.conn.commit()

    def test_claim_in_chunks_and_upto(self, db: Any) -> None:
        self.install(db)
        n = CLAIM_CHUNK + 500
        self.run(db.conn, Statement(
            f"INSERT INTO {D.qualified(db.q)} (Id, CorrelationId, ReplyToAddress, Recoverable, Expires, Headers, Body)"
            " SELECT TOP (?) NEWID(), NULL, NULL, 1, NULL,"
            " N'{\"n\": \"' + CAST(ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS nvarchar(10)) + N'\"}', NULL"
            " FROM sys.all_objects AS a CROSS JOIN sys.all_objects AS b", (n,)
        ))
        db.conn.commit()
        first = self.run(db.conn, D.peek(db.q, after=0, upto=None)).fetchone()[0]
        db.conn.rollback()
        # upto stops the claim early; limit is respected across chunks
        row = self.run(db.conn, D.claim(db.q, db.c, db.e, consumer="c", limit=n, after=0, upto=first + 9)).fetchone()
        db.conn.commit()
        assert tuple(row)[:4] == (10, 0, 0, 10) and row[5] == first + 9
        row = self.run(db.conn, D.claim(db.q, db.c, db.e, consumer="c", limit=CLAIM_CHUNK + 100, after=0, upto=None)).fetchone()
        db.conn.commit()
        assert tuple(row)[:4] == (CLAIM_CHUNK + 100, 0, 0, CLAIM_CHUNK + 100)
        assert row[5] == first + 9 + CLAIM_CHUNK + 100
        seqs = [r[5] for r in self.run(db.conn, D.read_claims(db.c, "c", after=0, upto=row[4])).fetchall()]
        assert seqs == list(range(first, first + 10 + CLAIM_CHUNK + 100))  # claim order is queue order
        db.conn.commit()

    def test_poison_to_error_queue_without_recoverable(self, db: Any) -> None:
        self.install(db)
        self.run(db.conn, Statement(
            f"CREATE TABLE {D.qualified(db.plain_error)} (Id uniqueidentifier NOT NULL, Expires datetime NULL,"
            " Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, RowVersion bigint IDENTITY(1,1) NOT NULL)"
        ))
        db.conn.commit()
        self.run(db.conn, Statement(NSB_SEND.format(D.qualified(db.q)), ('{"a": {"b": "c"}}', b"nested")))
        db.conn.commit()
        row = self.run(db.conn, D.claim(db.q, db.c, db.plain_error, consumer="c", limit=10, after=0, upto=None)).fetchone()
        db.conn.commit()
        assert tuple(row)[:4] == (1, 0, 1, 0) and row[4] is None
        got = self.run(db.conn, Statement(f"SELECT Headers, Body FROM {D.qualified(db.plain_error)}")).fetchall()
        assert [(h, bytes(b)) for h, b in got] == [('{"a": {"b": "c"}}', b"nested")]
        db.conn.commit()

    def test_missing_table_is_undefined_table(self, db: Any) -> None:
        with pytest.raises(Exception) as info:
            self.run(db.conn, D.max_source_seq(db.q.with_table("no_such_table_here")))
        db.conn.rollback()
        assert D.is_undefined_table(info.value)

    def test_send_statements(self, db: Any) -> None:
        s, o, dl = D.companion(db.q, "Staging"), D.companion(db.q, "Outbox"), D.companion(db.q, "Delayed")
        subs = db.q.with_table(db.q.table + "_subscriptions")
        try:
            self.install(db)
            for _ in range(2):  # idempotent
                self.run(db.conn, D.create_staging(s) + D.create_outbox(o) + D.create_delayed(dl)
                         + D.create_subscriptions(subs))
                db.conn.commit()

            # outbox: recorded once; the second insert finds the record
            assert self.run(db.conn, D.outbox_insert(o, sink=EVIL, batch_id=1, fingerprint="f")).rowcount == 1
            assert self.run(db.conn, D.outbox_insert(o, sink=EVIL, batch_id=1, fingerprint="g")).rowcount == 0
            self.run(db.conn, D.outbox_finish(o, sink=EVIL, batch_id=1, sent=2, delayed=1, published=0))
            fp, at, sent, delayed, published = self.run(db.conn, D.outbox_get(o, sink=EVIL, batch_id=1)).fetchone()
            assert (fp, sent, delayed, published) == ("f", 2, 1, 0) and at is not None
            db.conn.commit()

            # stage, dispatch: one row per message id (the first staged), in staging order
            a, route = "a" * 32, D.format_address(db.q)
            D.stage_rows(db.conn, s, [
                ("k", 1, a, "s", route, "m1", _headers(1), b"one", 60000, None, None),
                ("k", 1, a, "s", route, "m1", _headers(1), b"duplicate", None, None, None),
                ("k", 1, a, "s", route, "m2", _headers(2), None, None, None, None),
                ("k", 1, a, "d", route, "m3", _headers(3), b"later", None, 0, None),
                ("k", 1, "failed", "s", route, "m4", _headers(4), b"x", None, None, None),
            ])
            db.conn.commit()
            sent_rows = self.count(db.conn, D.dispatch(s, db.q, attempts=[a], route=route, publish_routes=[]))
            assert sent_rows == 2
            assert self.count(db.conn, D.dispatch_delayed(s, dl, attempts=[a])) == 1
            assert self.run(db.conn, D.delete_staged(s, attempts=[a])).rowcount == 4
            self.run(db.conn, D.delete_batch_leftovers(s, sink="k", batch_id=1))
            db.conn.commit()
            got = self.run(db.conn, Statement(
                f"SELECT Headers, Body, Expires FROM {D.qualified(db.q)} ORDER BY RowVersion")).fetchall()
            assert [(h, None if b is None else bytes(b)) for h, b, _ in got] == [(_headers(1), b"one"), (_headers(2), None)]
            assert got[0][2] is not None and got[1][2] is None
            assert self.run(db.conn, Statement(f"SELECT COUNT(*) FROM {D.qualified(s)}")).fetchone()[0] == 0

            # the delayed row is due: one mover moves it
            time.sleep(0.05)
            assert self.run(db.conn, D.any_due(dl)).fetchone() is not None
            assert self.run(db.conn, D.lock_mover(dl)).fetchone()[0] in (1, True)
            other = D.connect(db.url)
            try:
                assert self.run(other, D.lock_mover(dl)).fetchone()[0] in (0, False)
                other.rollback()
            finally:
                other.close()
            [(key, headers)] = self.run(db.conn, D.due_delayed(dl, limit=10)).fetchall()
            assert headers == _headers(3)
            self.run(db.conn, D.move_delayed(dl, db.e, keys=[key], headers=['{"moved":"yes"}']))
            assert self.count(db.conn, D.delete_delayed(dl, keys=[key])) == 1
            db.conn.commit()
            moved = self.run(db.conn, Statement(f"SELECT Headers, Body FROM {D.qualified(db.e)}")).fetchall()
            assert [(h, bytes(b)) for h, b in moved] == [('{"moved":"yes"}', b"later")]
            assert self.run(db.conn, D.any_due(dl)).fetchone() is None

            # subscribers, cleanup
            self.run(db.conn, Statement(f"INSERT INTO {D.qualified(subs)} (QueueAddress, Endpoint, Topic) VALUES (?, ?, ?)",
                                        ("Billing@[dbo]", "Billing", "Ns.E")))
            assert [tuple(r) for r in self.run(db.conn, D.subscribers(subs, ["Ns.F", "Ns.E"])).fetchall()] == [
                ("Billing@[dbo]", 1)]
            # the database's collation decides, as for NServiceBus (case-insensitive by default)
            self.run(db.conn, Statement(f"INSERT INTO {D.qualified(subs)} (QueueAddress, Endpoint, Topic) VALUES (?, ?, ?)",
                                        ("Shipping@[dbo]", "Shipping", "ns.e ")))
            nsb = Statement(f"SELECT DISTINCT QueueAddress FROM {D.qualified(subs)} WHERE Topic IN (?)", ("Ns.E",))
            expected = sorted((str(r[0]), 0) for r in self.run(db.conn, nsb).fetchall())
            got = sorted((str(r[0]), int(r[1])) for r in self.run(db.conn, D.subscribers(subs, ["Ns.E"])).fetchall())
            assert got == expected and ("Billing@[dbo]", 0) in got
            assert self.run(db.conn, D.subscribers(subs, [])).fetchall() == []
            assert self.run(db.conn, D.outbox_cleanup(o, older_than_seconds=0, limit=10)).rowcount == 1
            assert self.run(db.conn, D.staging_cleanup(s, older_than_seconds=0, limit=10)).rowcount == 0
            db.conn.commit()
        finally:
            db.conn.rollback()
            cur = db.conn.cursor()
            for t in (s, o, dl, subs):
                cur.execute(f"DROP TABLE IF EXISTS {D.qualified(t)}")
            db.conn.commit()

    def test_stage_rows_bound_in_place_and_as_max_keep_values_and_order(self, db: Any) -> None:
        s = D.companion(db.q, "Staging")
        astral = "\U0001F600"
        values = [  # (route, headers, body): fits, each column too long in turn, the limits exactly
            ("r", "{}", b"small"), ("r", "{}", b"\1" * 8001), ("r", "h" * 4001, None), ("r" * 4001, "{}", b""),
            ("r", astral * 2001, b"x"), ("r" * 4000, astral * 1999 + "ab", b"\2" * 8000), ("r", "{}", None),
        ]
        try:
            self.run(db.conn, D.create_staging(s))
            db.conn.commit()
            D.stage_rows(db.conn, s, [("k", 1, "a" * 32, "s", r, f"m{i}", h, b, None, None, None)
                                      for i, (r, h, b) in enumerate(values)])
            db.conn.commit()
            got = self.run(db.conn, Statement(f"SELECT Route, Headers, Body FROM {D.qualified(s)} ORDER BY Seq")).fetchall()
            assert [(r, h, None if b is None else bytes(b)) for r, h, b in got] == values
        finally:
            db.conn.rollback()
            db.conn.cursor().execute(f"DROP TABLE IF EXISTS {D.qualified(s)}")
            db.conn.commit()

    def test_operations(self, db: Any) -> None:
        dl, o = D.companion(db.q, "Delayed"), D.companion(db.q, "Outbox")
        subs = db.q.with_table(db.q.table + "_subscriptions")
        try:
            self.install(db)
            self.run(db.conn, D.create_delayed(dl) + D.create_outbox(o) + D.create_subscriptions(subs))
            db.conn.commit()
            q = D.qualified(db.q)
            assert tuple(self.run(db.conn, D.queue_stats(db.q)).fetchone()) == (0, 0, None, None)
            cur = db.conn.cursor()
            cur.execute(NSB_SEND.format(q), (_headers(1), b"one"))
            cur.execute(NSB_SEND_TTBR.format(q), (1, _headers(2), b"expired"))
            cur.execute(NSB_SEND.format(q), (_headers(3), None))
            db.conn.commit()
            time.sleep(0.1)  # let the 1 ms time-to-be-received pass

            messages, expired, low, high = self.run(db.conn, D.queue_stats(db.q)).fetchone()
            assert (messages, expired, high - low) == (3, 1, 2)
            rows = self.run(db.conn, D.peek_messages(db.q, limit=2, preview=2)).fetchall()
            assert [(r[3], None if r[4] is None else bytes(r[4]), r[5], r[6]) for r in rows] == [
                (_headers(1), b"on", 3, low), (_headers(2), b"ex", 7, low + 1)]  # a body's start, its length
            assert len(rows[0][0]) == 36 and rows[0][1] is None and rows[1][1] is not None
            assert rows[0][2] is None and rows[1][2] is None  # Expires text: only for values a datetime cannot hold
            db.conn.commit()

            # a row another session holds is skipped, never waited for
            other = D.connect(db.url)
            try:
                other.cursor().execute(NSB_SEND.format(q), (_headers(4), b"uncommitted"))
                cur = db.conn.cursor()
                cur.execute("SET LOCK_TIMEOUT 5000")
                assert len(self.run(db.conn, D.peek_messages(db.q, limit=10, preview=240)).fetchall()) == 3
                assert self.run(db.conn, D.queue_stats(db.q)).fetchone()[0] == 3
                db.conn.commit()
                other.rollback()
            finally:
                other.close()

            assert self.count(db.conn, D.purge_expired(db.q, limit=10)) == 1
            assert self.count(db.conn, D.purge_expired(db.q, limit=10)) == 0
            db.conn.commit()
            assert tuple(self.run(db.conn, D.queue_stats(db.q)).fetchone())[:2] == (2, 0)

            self.run(db.conn, Statement(
                f"INSERT INTO {D.qualified(dl)} (Headers, Body, Due) VALUES"
                " (N'{}', NULL, DATEADD(minute, -1, GETUTCDATE())), (N'{}', NULL, DATEADD(hour, 1, GETUTCDATE())),"
                " (N'{}', NULL, DATEADD(hour, 2, GETUTCDATE()))"
            ))
            db.conn.commit()
            due, pending, next_due = self.run(db.conn, D.delayed_stats(dl)).fetchone()
            assert (due, pending) == (1, 2) and next_due is not None

            self.run(db.conn, D.claim(db.q, db.c, db.e, consumer=EVIL, limit=10, after=0, upto=None)).fetchone()
            db.conn.commit()
            [(consumer, claimed, oldest)] = self.run(db.conn, D.claim_stats(db.c)).fetchall()
            assert (consumer, claimed) == (EVIL, 2) and oldest is not None
            assert self.run(db.conn, D.count_rows(o)).fetchone()[0] == 0
            db.conn.commit()

            # subscribe: insert, unchanged, moved; unsubscribe: removed once
            for address, changed in (("Billing@[dbo]", 1), ("Billing@[dbo]", 0), ("Billing@[ops]", 1)):
                s = D.subscribe(subs, queue_address=address, endpoint=EVIL, topic="Ns.E")
                assert self.run(db.conn, s).rowcount == changed, address
            db.conn.commit()
            assert [tuple(r) for r in self.run(db.conn, D.subscribers(subs, ["Ns.E"])).fetchall()] == [
                ("Billing@[ops]", 0)]
            assert self.run(db.conn, D.unsubscribe(subs, endpoint=EVIL, topic="Ns.E")).rowcount == 1
            assert self.run(db.conn, D.unsubscribe(subs, endpoint=EVIL, topic="Ns.E")).rowcount == 0
            db.conn.commit()
        finally:
            db.conn.rollback()
            cur = db.conn.cursor()
            for t in (dl, o, subs):
                cur.execute(f"DROP TABLE IF EXISTS {D.qualified(t)}")
            db.conn.commit()

    def test_move_messages(self, db: Any) -> None:
        """sqlqueue error retry: lock by native ids or oldest first, move in key order, delete; one transaction."""
        self.install(db)
        e = D.qualified(db.e)
        cur = db.conn.cursor()
        for n in range(4):
            cur.execute(NSB_SEND.format(e), (_headers(n), f"b{n}".encode()))
        db.conn.commit()
        ids = [r[0] for r in self.run(db.conn, D.peek_messages(db.e, limit=10, preview=240)).fetchall()]
        db.conn.commit()
        assert len(ids) == 4

        assert self.run(db.conn, D.lock_messages(db.e, native_ids=[], limit=10)).fetchall() == []
        locked = self.run(db.conn, D.lock_messages(
            db.e, native_ids=[ids[3].upper(), ids[1].lower(), str(uuid.uuid4())], limit=10)).fetchall()
        assert [(r[1], r[2]) for r in locked] == [(ids[1].lower(), _headers(1)), (ids[3].lower(), _headers(3))]
        keys = [r[0] for r in locked]
        assert int(keys[0]) < int(keys[1])

        # another session skips the rows locked here, never waits for them
        other = D.connect(db.url)
        try:
            other.cursor().execute("SET LOCK_TIMEOUT 5000")
            rows = self.run(other, D.lock_messages(db.e, native_ids=None, limit=10)).fetchall()
            assert [r[2] for r in rows] == [_headers(0), _headers(2)]
            other.rollback()
        finally:
            other.close()

        # moved in the order of the keys given (reversed here), then deleted: all or nothing
        moved = D.move_messages(db.e, db.q, keys=keys[::-1], headers=['{"retry":"3"}', '{"retry":"1"}'])
        assert self.run(db.conn, moved).rowcount == 2
        assert self.count(db.conn, D.delete_messages(db.e, keys=keys[::-1])) == 2
        db.conn.commit()
        got = self.run(db.conn, Statement(
            f"SELECT LOWER(CAST(Id AS varchar(36))), Headers, Body, Expires, Recoverable FROM {D.qualified(db.q)}"
            " ORDER BY RowVersion")).fetchall()
        assert [(h, bytes(b), x, r in (1, True)) for _, h, b, x, r in got] == [
            ('{"retry":"3"}', b"b3", None, True), ('{"retry":"1"}', b"b1", None, True)]
        assert not {r[0] for r in got} & {i.lower() for i in ids}  # new native ids
        left = self.run(db.conn, D.lock_messages(db.e, native_ids=None, limit=10)).fetchall()
        assert [r[2] for r in left] == [_headers(0), _headers(2)]
        assert [r[2] for r in self.run(db.conn, D.lock_messages(db.e, native_ids=None, limit=1)).fetchall()] == [
            _headers(0)]
        db.conn.rollback()


# -- trust: system names, savepoints, user tables only, canonical locks, staged error copies ---


class TestTrust:
    S, Q, E = QueueAddress("Sales.Staging"), QueueAddress("Billing"), QueueAddress("error")
    A = ["a" * 32, "b" * 32]

    def test_system_schemas_and_catalogs(self) -> None:
        for schema in ("sys", "SYS", "Sys", "INFORMATION_SCHEMA", "information_schema"):
            assert D.is_system_schema(schema), schema
        for schema in ("dbo", "sales", "system", "sys2"):
            assert not D.is_system_schema(schema), schema
        for catalog in ("Master", "MSDB", "model", "TempDB", "mssqlsystemresource"):
            assert D.is_system_catalog(catalog), catalog
        for catalog in ("shop", "masters", "Sales"):
            assert not D.is_system_catalog(catalog), catalog

    def test_names_compare_case_insensitively(self) -> None:
        assert D.fold_name("SaLes.Orders") == D.fold_name("sales.ORDERS") == "sales.orders"
        assert D.fold_name("[X]") == "[x]"  # folding is no unquoting: brackets stay part of the name

    def test_savepoint_opens_a_transaction_when_none_is_open(self) -> None:
        s = D.savepoint("sqlqueue_route")
        assert s.params is None  # a plain batch, not sp_executesql
        assert _flat(s.sql) == (
            "IF @@TRANCOUNT = 0 BEGIN BEGIN TRANSACTION; IF @@TRANCOUNT = 2 COMMIT TRANSACTION; END"
            " SAVE TRANSACTION sqlqueue_route;"
        )
        parts = simple_statements(s.sql)
        assert [k for k, _ in parts] == ["condition", "statement", "condition", "statement", "statement"]
        # implicit transaction mode: BEGIN at 0 makes 2, the inner COMMIT leaves the implicit one
        assert [p for _, p in parts] == [
            "SELECT CASE WHEN @@TRANCOUNT = 0 THEN 1 END", "BEGIN TRANSACTION",
            "SELECT CASE WHEN @@TRANCOUNT = 2 THEN 1 END", "COMMIT TRANSACTION", "SAVE TRANSACTION sqlqueue_route",
        ]
        parse_all(s.sql)
        assert block_words(s.sql) == ["BEGIN", "END"]

    def test_rollback_to_savepoint_only_while_committable(self) -> None:
        s = D.rollback_to_savepoint("sqlqueue_route")
        assert s.params is None
        flat = _flat(s.sql)
        assert flat.startswith("IF XACT_STATE() = 1 ROLLBACK TRANSACTION sqlqueue_route; ELSE THROW 51000, N'")
        trees = parse_all(s.sql)
        (rollback,) = [t for t in trees if isinstance(t, exp.Rollback)]
        assert rollback.this.name == "sqlqueue_route"
        assert D.release_savepoint("sqlqueue_route") is None  # SQL Server has no RELEASE SAVEPOINT

    @pytest.mark.parametrize("name", ["", "1st", "a b", "x;DROP", "[x]", "a" * 33, "sp?", EVIL])
    def test_savepoint_names_are_identifiers(self, name: str) -> None:
        for make in (D.savepoint, D.rollback_to_savepoint, D.release_savepoint):
            with pytest.raises(QTransportError, match="savepoint name"):
                make(name)

    def test_queue_columns_of_user_tables_only(self) -> None:
        for address, sys_ in ((QueueAddress("q"), "sys."), (QueueAddress("q", "s", "c"), "[c].sys.")):
            s = D.queue_columns(address)
            assert s.params == (D.qualified(address),)
            assert (f" JOIN {sys_}tables AS o ON o.object_id = c.object_id AND o.is_ms_shipped = 0"
                    " AND o.is_external = 0 WHERE c.object_id = OBJECT_ID(?) ORDER BY c.column_id") in s.sql
            (tree,) = parse_all(s.sql)
            tables = {(t.catalog or None, t.db, t.name) for t in tree.find_all(exp.Table)}
            assert tables == {(address.catalog, "sys", n) for n in ("columns", "types", "tables")}
            _marks_match(s)

    SPELLINGS = ["Sales", "Sales@dbo", "Sales@[dbo]", "SALES@[DBO]", "sales@[]"]

    def test_consumer_lock_folds_case_and_trailing_spaces(self) -> None:
        """sp_getapplock compares resources in binary; a claim table made before Consumer compared
        exactly compares as the database does (by default without case or trailing spaces). So
        `Sales` and `sales ` meet on one lock instead of both receiving into one claim table."""
        c = D.claims_table(QueueAddress("Sales"))
        locks = {D.try_lock_consumer(c, name).params for name in ("Billing", "billing", "BILLING  ")}
        assert locks == {("[dbo].[Sales.Claims]", "BILLING")}
        assert D.unlock_consumer(c, "billing").params == D.try_lock_consumer(c, "Billing").params
        assert D.try_lock_consumer(c, "Billing2").params != D.try_lock_consumer(c, "Billing").params
        # new claim tables compare Consumer exactly, as staging and outbox compare Sink
        assert "Consumer nvarchar(200) COLLATE Latin1_General_BIN2 NOT NULL" in _flat(D.create_claims(c)[0].sql)

    def test_consumer_lock_keyed_by_object_id_not_spelling(self) -> None:
        """However the queue is spelled, the SQL text is the same: the resource is built on the
        server from DB_ID and OBJECT_ID, so SQL Server's name resolution, not ours, decides."""
        for make in (D.try_lock_consumer, D.unlock_consumer):
            stmts = [make(D.claims_table(D.parse_address(t)), "Billing") for t in self.SPELLINGS]
            assert len({s.sql for s in stmts}) == 1
            sql = stmts[0].sql
            assert "sales" not in sql.lower()
            assert [s.params[1:] for s in stmts] == [("BILLING",)] * len(stmts)
            assert {s.params[0].lower() for s in stmts} == {"[dbo].[sales.claims]"}  # resolved by OBJECT_ID
            assert ("DECLARE @resource nvarchar(255) = N'sqlqueue consumer ' + CAST(DB_ID() AS nvarchar(11))"
                    " + N'.' + CAST(OBJECT_ID(@table) AS nvarchar(11)) + N' ' + @consumer;") in _flat(sql)
            parse_all(sql)
            _marks_match(stmts[0])

    def test_consumer_lock_resource_expression(self) -> None:
        s = D.try_lock_consumer(D.claims_table(self.Q), "Billing")
        declares = [t for t in parse_all(s.sql) if isinstance(t, exp.Declare)]
        text = {d.sql("tsql") for d in declares}
        assert any("OBJECT_ID(@table)" in t and "DB_ID()" in t and "@consumer" in t for t in text), text
        # the declared variables take the parameters in marker order: table, consumer
        assert _flat(s.sql).index("DECLARE @table nvarchar(776) = ?;") < _flat(s.sql).index(
            "DECLARE @consumer nvarchar(255) = ?;")

    def test_consumer_lock_in_the_claim_tables_database(self) -> None:
        here = D.claims_table(D.parse_address("Sales@[dbo]"))
        there = D.claims_table(D.parse_address("Sales@[dbo]@[Shop]"))
        t = D.try_lock_consumer(there, "Billing")
        assert t.params == ("[Shop].[dbo].[Sales.Claims]", "BILLING", "Shop")
        flat = _flat(t.sql)
        assert "CAST(DB_ID(?) AS nvarchar(11))" in flat
        assert "EXEC @rc = [Shop].sys.sp_getapplock @Resource = @resource," in flat
        u = D.unlock_consumer(there, "Billing")
        assert u.params == t.params
        assert "IF @resource IS NOT NULL EXEC [Shop].sys.sp_executesql N'IF APPLOCK_MODE(" in _flat(u.sql)
        # the same statements as in the current database but for where they run and DB_ID's argument
        for make in (D.try_lock_consumer, D.unlock_consumer):
            a, b = make(here, "Billing").sql, make(there, "Billing").sql
            assert b.replace("[Shop].sys.", "sys.").replace("DB_ID(?)", "DB_ID()") == a
            parse_all(b)
            _marks_match(make(there, "Billing"))

    def test_staged_messages_selects_what_dispatch_sends(self) -> None:
        kw: dict[str, Any] = {"attempts": self.A, "route": "Billing@[dbo]", "publish_routes": ["Ns.E", "Ns.F"]}
        s = D.staged_messages(self.S, **kw)
        assert _flat(s.sql) == (
            "SELECT m.Seq, m.Headers"
            " FROM (SELECT MIN(Seq) AS Seq FROM [dbo].[Sales.Staging]"
            " WHERE Attempt IN (SELECT a.Attempt COLLATE Latin1_General_BIN2 FROM OPENJSON(?)"
            " WITH (Attempt varchar(64) '$') AS a)"
            " AND ((Kind = 's' AND Route = ?) OR (Kind = 'p' AND Route IN (?, ?)))"
            " GROUP BY MessageId) AS f"
            " JOIN [dbo].[Sales.Staging] AS m ON m.Seq = f.Seq"
            " ORDER BY f.Seq"
        )
        d = dynamic(D.dispatch(self.S, self.Q, **kw), False)
        assert s.params == d.params == (_js(self.A), "Billing@[dbo]", "Ns.E", "Ns.F")
        selection = s.sql.split("\n", 1)[1].split("\nJOIN")[0]
        assert selection in d.sql  # one selection text, written once
        (tree,) = parse_all(s.sql)
        assert isinstance(tree, exp.Select)
        _marks_match(s)
        for k in ({"route": None}, {"publish_routes": []}, {"attempts": [], "route": None, "publish_routes": []}):
            args = {**kw, **k}
            assert D.staged_messages(self.S, **args).params == dynamic(D.dispatch(self.S, self.Q, **args), False).params
            parse_all(D.staged_messages(self.S, **args).sql)

    @pytest.mark.parametrize("recoverable", [True, False])
    def test_move_staged(self, recoverable: bool) -> None:
        s = dynamic(D.move_staged(self.S, self.E, keys=[17, 3], headers=['{"a":"1"}', "not json"]), recoverable)
        assert s.params == (_js([[17, '{"a":"1"}'], [3, "not json"]]),)
        rec = ("Recoverable, ", "1, ") if recoverable else ("", "")
        assert _flat(s.sql) == (
            "INSERT INTO #sqlqueue_keys (Pos, KeyRow, Headers) SELECT CAST(o.[key] AS bigint) + 1, k.KeyRow, k.Headers"
            " FROM OPENJSON(?) AS o"
            " CROSS APPLY OPENJSON(o.value) WITH (KeyRow bigint '$[0]', Headers nvarchar(max) '$[1]') AS k;"
            f" INSERT INTO [dbo].[error] (Id, {rec[0]}Expires, Headers, Body)"
            f" SELECT NEWID(), {rec[1]}NULL, k.Headers, m.Body"
            " FROM #sqlqueue_keys AS k JOIN [dbo].[Sales.Staging] AS m ON m.Seq = k.KeyRow"
            f" WHERE k.Pos > @lo AND k.Pos <= @lo + {ROW_BOUND} ORDER BY k.Pos; SET @n = @@ROWCOUNT;"
        )
        tree = _insert(s)
        cols = [c.name for c in tree.this.expressions]
        assert set(cols) <= _columns_of(D.create_queue(self.E))
        got = dict(zip(cols, [v.sql("tsql") for v in tree.expression.expressions], strict=True))
        assert (got["Id"], got["Expires"], got["Headers"], got["Body"]) == ("NEWID()", "NULL", "k.Headers", "m.Body")
        assert got.get("Recoverable", "1") == "1"
        assert {"Seq", "Body"} <= _columns_of(D.create_staging(self.S))
        _marks_match(s)

    def test_move_staged_keeps_key_order_and_checks_input(self) -> None:
        keys = list(range(3000, 0, -1))
        s = dynamic(D.move_staged(self.S, self.Q, keys=keys, headers=[f"h{i}" for i in range(3000)]), False)
        assert len(placeholders(s.sql)) == 1
        assert [r[0] for r in json.loads(s.params[0])] == keys
        assert dynamic(D.move_staged(self.S, self.Q, keys=["5"], headers=["{}"]), False).params == (_js([[5, "{}"]]),)
        with pytest.raises(QTransportError, match="2 keys but 1 headers"):
            D.move_staged(self.S, self.Q, keys=[1, 2], headers=["{}"])
        with pytest.raises(ValueError):
            D.move_staged(self.S, self.Q, keys=[EVIL], headers=["{}"])
        none = dynamic(D.move_staged(self.S, self.Q, keys=[], headers=[]), False)
        assert none.params == ("[]",)
        _insert(none)

    @pytest.mark.parametrize("value", HOSTILE)
    def test_staged_headers_only_in_parameters(self, value: str) -> None:
        s = dynamic(D.move_staged(self.S, self.Q, keys=[1, 2], headers=[value, "{}"]), False)
        assert s.sql == dynamic(D.move_staged(self.S, self.Q, keys=[8, 9], headers=["{}", "{}"]), False).sql
        assert json.loads(s.params[0])[0][1] == value
