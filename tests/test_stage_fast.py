"""Staging's hot path builds exactly what the general path builds: `MessageBuilder.build` (the
fast path for plain rows) against `MessageBuilder._build` (every row, every check in order), on
any row, good or bad: the same staged row, or the same error naming the same column. Any row a
check refuses becomes, with an error queue, an error copy that can be written. And the task's
chunks are the same with the rows' sizes reckoned once (`TaskRows.chunks`)."""

from __future__ import annotations

import itertools
import math
import types
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_qtransport import wire
from spark_qtransport.dialects import dialect_named
from spark_qtransport.errors import MessageError
from spark_qtransport.transport.sending import builder, staging
from spark_qtransport.transport.sending.builder import MessageBuilder
from spark_qtransport.transport.sending.checks import Refused
from spark_qtransport.transport.sending.messages import SendPlan, StagedRow
from spark_qtransport.transport.sending.staging import TaskRows
from spark_qtransport.wire import (
    INTENTS,
    RESERVED,
    H,
    SentHeaderText,
    decode_headers,
    encode_headers,
    outgoing_headers,
)

FIXED = uuid.UUID("0b5e7a3c-1d2f-4a6b-8c9d-0e1f2a3b4c5d")
TYPE = "Shop.Messages.PlaceOrder, Shop.Messages"
NOW = datetime(2026, 11, 23, 15, 0, 0, 123456, tzinfo=timezone.utc)

# text with what JSON escapes, "/" (escaped as "\/"), non-ASCII, and sometimes NUL
TEXT = st.text(st.sampled_from(["a", "/", '"', "\\", "\n", "\x01", "ü", "😀", " ", "\u2028", "\x00"]), max_size=6)
NAMES = st.sampled_from([H.MESSAGE_ID, H.CONVERSATION_ID, H.CORRELATION_ID, H.ENCLOSED_MESSAGE_TYPES, H.CONTENT_TYPE,
                         H.ORIGINATING_ENDPOINT, H.REPLY_TO_ADDRESS, H.TIME_SENT, "NServiceBus.TimeToBeReceived",
                         "Shop.Tenant", *RESERVED])
KEY = st.one_of(NAMES, TEXT, st.integers(0, 3))
VALUE = st.one_of(st.none(), TEXT, st.just(TYPE), st.integers(0, 3))
PAIRS = st.lists(st.tuples(KEY, VALUE), max_size=5)
HEADERS = st.one_of(
    st.none(), PAIRS.map(dict), PAIRS, PAIRS.map(lambda p: types.MappingProxyType(dict(p))), st.just("a=b"), st.integers(),
)
OPT_TEXT = st.one_of(st.none(), st.just(""), TEXT, st.integers(0, 3))
DURATION = st.one_of(st.none(), st.sampled_from([0, -1, 30.5, 2**31, 1e300, math.nan, "x", timedelta(seconds=90)]))
DELIVER_AT = st.one_of(st.none(), st.sampled_from([
    NOW + timedelta(hours=1), (NOW + timedelta(days=1)).replace(tzinfo=None), NOW - timedelta(days=1),
    datetime(9999, 1, 1), "tomorrow",
]))
ROW = st.fixed_dictionaries({}, optional={
    "body": st.one_of(st.none(), st.binary(max_size=4), TEXT, st.just("\ud800"), st.just(bytearray(b"xy"))),
    "message_id": OPT_TEXT,
    "message_type": st.one_of(OPT_TEXT, st.just(TYPE)),
    "correlation_id": OPT_TEXT,
    "reply_to": OPT_TEXT,
    "intent": st.one_of(st.none(), st.sampled_from(["", "send", " Publish ", "reply", "REPLY", "shout"]), st.integers()),
    "headers": HEADERS,
    "destination": st.one_of(st.none(), st.sampled_from(["Billing", "sales.Billing", "", "a\x00b", '"x'])),
    "time_to_be_received": DURATION,
    "delay": DURATION,
    "deliver_at": DELIVER_AT,
})

# rows that mostly pass: the fast path's own ground
CLEAN = TEXT.filter(lambda t: "\x00" not in t)
GOOD_HEADERS = st.one_of(st.none(), st.dictionaries(st.one_of(NAMES.filter(lambda n: n not in RESERVED), CLEAN),
                                                    st.one_of(CLEAN, st.just(TYPE)), max_size=5))
GOOD_ROW = st.fixed_dictionaries({"body": st.one_of(st.binary(max_size=4), CLEAN)}, optional={
    "message_id": st.one_of(st.none(), CLEAN),
    "message_type": st.one_of(st.just(TYPE), CLEAN),
    "correlation_id": st.one_of(st.none(), CLEAN),
    "reply_to": st.one_of(st.none(), CLEAN),
    "intent": st.sampled_from([None, "send", "publish", " Reply"]),
    "headers": st.one_of(GOOD_HEADERS, GOOD_HEADERS.map(lambda h: None if h is None else list(h.items()))),
    "destination": st.sampled_from([None, "Billing", "x.y.z"]),
    "time_to_be_received": st.sampled_from([None, 30.5, timedelta(minutes=2)]),
    "delay": st.sampled_from([None, -1, 0, 10]),
    "deliver_at": st.sampled_from([None, NOW + timedelta(hours=1)]),
})


def _builder(dialect: str, reply_to: str | None, destination: str | None, invalid_to: str | None = None) -> MessageBuilder:
    d = dialect_named(dialect)
    plan = SendPlan(dialect=dialect, endpoint="Sales", default_destination=None if destination is None else d.parse_address(destination),
                    reply_to=reply_to, content_type="application/json", sink="default", error_queue=invalid_to, invalid_fail=invalid_to is None)
    b = MessageBuilder(plan, batch_id=7, attempt="a1")
    b._ids = itertools.repeat(str(FIXED))  # the general path's uuid4 is fixed alike (below)
    return b


def _outcome(build: Any, row: dict[str, Any], now: Any) -> tuple[str, Any]:
    try:
        return "row", build(row, now)
    except MessageError as exc:
        return "refused", (str(exc), exc.column, exc.option)
    except Exception as exc:  # noqa: BLE001 - the same non-MessageError too (a bad body, a bad intent type)
        return "error", (type(exc), str(exc))


def _general(b: MessageBuilder) -> Any:
    """The general path alone, its refusals turned into the `MessageError` `build` raises."""
    def build(row: dict[str, Any], now: Any) -> StagedRow:
        try:
            return b._build(row, now)
        except Refused as refused:
            raise b.error(row, refused) from None

    return build


def _same(rows: list[dict[str, Any]], dialect: str, reply_to: str | None, destination: str | None, now: Any) -> None:
    fast, general = _builder(dialect, reply_to, destination), _builder(dialect, reply_to, destination)
    with mock.patch.object(uuid, "uuid4", lambda: FIXED):  # the general path's new ids
        for row in rows:
            got, want = _outcome(fast.build, row, now), _outcome(_general(general), row, now)
            assert got == want, row
            if got[0] == "row":
                assert type(got[1]) is StagedRow and got[1].headers == want[1].headers
    assert fast.counts == general.counts


@settings(max_examples=1500, deadline=None)
@given(rows=st.lists(ROW, min_size=1, max_size=4), dialect=st.sampled_from(["postgres", "sqlserver"]),
       reply_to=st.sampled_from([None, '"public"."Sales"']), destination=st.sampled_from([None, "Billing"]),
       now=st.sampled_from(["2026-11-23 15:00:00:123456 Z", NOW]))
def test_the_fast_path_builds_what_the_general_path_builds(rows: list[dict[str, Any]], dialect: str, reply_to: str | None,
                                                           destination: str | None, now: Any) -> None:
    _same(rows, dialect, reply_to, destination, now)


@settings(max_examples=1500, deadline=None)
@given(rows=st.lists(GOOD_ROW, min_size=1, max_size=4), dialect=st.sampled_from(["postgres", "sqlserver"]),
       reply_to=st.sampled_from([None, '"public"."Sales"']), destination=st.sampled_from([None, "Billing"]))
def test_the_fast_path_builds_what_the_general_path_builds_from_good_rows(
        rows: list[dict[str, Any]], dialect: str, reply_to: str | None, destination: str | None) -> None:
    _same(rows, dialect, reply_to, destination, "2026-11-23 15:00:00:123456 Z")


@settings(max_examples=1000, deadline=None)
@given(row=ROW, dialect=st.sampled_from(["postgres", "sqlserver"]), destination=st.sampled_from([None, "Billing"]))
def test_a_refused_row_becomes_an_error_copy_that_can_be_written(row: dict[str, Any], dialect: str,
                                                                  destination: str | None) -> None:
    """With an error queue (invalidRows=error-queue), a row any check refuses is staged for it: a
    flat object of text headers without NUL, naming the column and the reason, as it would fail."""
    b = _builder(dialect, None, destination, invalid_to='"public"."error"')
    with mock.patch.object(uuid, "uuid4", lambda: FIXED):  # the general path's new ids
        failing = _outcome(_builder(dialect, None, destination).build, row, NOW)
        got = _outcome(b.build, row, NOW)
    if failing[0] != "refused":
        assert got == failing
        assert b.invalid == 0
        return
    assert got[0] == "row", got
    copy: StagedRow = got[1]
    headers = decode_headers(copy.headers)
    assert headers is not None and "\x00" not in copy.headers and "\\u0000" not in copy.headers
    assert (copy.kind, copy.route, copy.ttbr_ms, copy.delay_ms, copy.due) == ("s", '"public"."error"', None, None, None)
    assert "\x00" not in copy.message_id and headers[H.MESSAGE_ID] == copy.message_id
    message, column, _ = failing[1]
    # FailedQ: where the message was going (a retry delivers it there), else the endpoint's queue
    going = row.get("destination", None)
    if column == "destination" or not (going is None or isinstance(going, str)) or (going is None and destination is None):
        assert headers[H.FAILED_Q] == "Sales"
    else:
        assert headers[H.FAILED_Q] in ("Sales", b.route(going, "x"))
    assert headers["NServiceBus.ExceptionInfo.ExceptionType"] == builder.INVALID_TYPE
    assert headers["NServiceBus.ExceptionInfo.Message"] == message
    assert headers["NServiceBus.ExceptionInfo.Data.Column"] == column
    assert not set(RESERVED) & set(headers)
    assert (b.invalid, b.invalid_reason, b.counts) == (1, message, {("s", '"public"."error"'): 1})


def test_plain_rows_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows a pipeline usually sends never reach the general path."""
    b = _builder("postgres", '"public"."Sales"', "Billing")
    monkeypatch.setattr(b, "_build", lambda row, now: pytest.fail(f"general path for {row}"))
    plain = {"body": b"{}", "message_type": TYPE}
    for row in (plain, {**plain, "body": "{}", "headers": {"Shop.Tenant": "acme", H.CONVERSATION_ID: "c"}},
                {**plain, "headers": [("Shop.Tenant", "acme")], "message_id": "m", "correlation_id": "c", "reply_to": "Web"},
                {**plain, "intent": "publish", "destination": None}, {**plain, "intent": "reply", "destination": "Web"},
                {**plain, "time_to_be_received": 30, "body": None}, {**plain, "delay": 5, "message_id": "m"}):
        b.build(row, "now")


def test_headers_of_a_plain_row() -> None:
    b = _builder("postgres", '"public"."Sales"', "Billing")
    b._ids = iter(["mid-1", "conv-1"])
    row = b.build({"body": "é", "message_type": TYPE, "headers": {"Shop.Tenant": "a/b", H.ORIGINATING_ENDPOINT: "Web"}},
                  "2026-11-23 15:00:00:123456 Z")
    assert row == StagedRow("default", 7, "a1", "s", '"public"."Billing"', "mid-1", row.headers, "é".encode(), None, None, None)
    assert list(decode_headers(row.headers).items()) == [  # type: ignore[union-attr]
        (H.MESSAGE_ID, "mid-1"), (H.MESSAGE_INTENT, "Send"), (H.ENCLOSED_MESSAGE_TYPES, TYPE),
        (H.CONTENT_TYPE, "application/json"), (H.TIME_SENT, "2026-11-23 15:00:00:123456 Z"),
        (H.ORIGINATING_ENDPOINT, "Web"), (H.ORIGINATING_MACHINE, b.machine), (H.CONVERSATION_ID, "conv-1"),
        (H.CORRELATION_ID, "mid-1"), (H.REPLY_TO_ADDRESS, '"public"."Sales"'), ("Shop.Tenant", "a/b"),
    ]
    assert '"application\\/json"' in row.headers and '"a\\/b"' in row.headers


def test_new_ids_are_version_4_uuids() -> None:
    ids = list(itertools.islice(wire.uuid4_texts(), 2000))
    assert len(set(ids)) == len(ids)
    for text in ids:
        u = uuid.UUID(text)
        assert str(u) == text and u.version == 4 and u.variant == uuid.RFC_4122
    assert {t[19] for t in ids} == set("89ab")  # the variant's free bits are random, as uuid4's


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(TEXT.filter(lambda t: "\x00" not in t), TEXT, max_size=12))
def test_text_headers_encode_as_the_standard_library_writes_them(headers: dict[str, str]) -> None:
    """orjson writes what ``json.dumps(ensure_ascii=False)`` writes; where it refuses (a lone
    surrogate), the standard library writes it."""
    from spark_qtransport.wire import encode

    assert encode._encode_text(headers) == encode._dumps(headers)
    assert encode._encode_text(headers).replace("/", "\\/") == encode_headers(headers)


@settings(max_examples=1000, deadline=None)
@given(message_id=CLEAN, intent=st.sampled_from(list(INTENTS)), message_type=st.one_of(st.none(), CLEAN),
       correlation_id=st.one_of(st.none(), CLEAN), reply_to=st.one_of(st.none(), CLEAN), time_sent=CLEAN,
       given=st.one_of(st.none(), st.dictionaries(st.one_of(NAMES.filter(lambda n: n not in RESERVED), CLEAN), CLEAN,
                                                   max_size=6)),
       forward=st.one_of(st.none(), CLEAN), machine=CLEAN)
def test_sent_header_text_is_the_outgoing_headers_text(message_id: str, intent: str, message_type: str | None,
                                                        correlation_id: str | None, reply_to: str | None, time_sent: str,
                                                        given: dict[str, str] | None, forward: str | None, machine: str) -> None:
    enclosed = message_type or (given or {}).get(H.ENCLOSED_MESSAGE_TYPES)
    if not enclosed:
        return
    writer = SentHeaderText(endpoint="Sales/East", machine=machine, content_type="application/json", new_id=lambda: "new-1")
    with mock.patch.object(uuid, "uuid4", lambda: "new-1"):
        want = outgoing_headers(message_id=message_id, endpoint="Sales/East", machine=machine, intent=intent,
                                message_type=message_type, correlation_id=correlation_id, reply_to_address=reply_to,
                                headers=given, now=time_sent)
    if forward is not None:
        want[H.FORWARD_DESTINATION] = forward
    for _ in range(2):  # the second time from the text kept for the task
        got = writer.text(message_id=message_id, intent=INTENTS[intent], enclosed=enclosed,
                          correlation_id=correlation_id or message_id, reply_to=reply_to, time_sent=time_sent, given=given,
                          forward=forward)
        assert got == encode_headers(want)


def test_sent_header_text_keeps_few_runs() -> None:
    writer = SentHeaderText(endpoint="Sales", machine="m", content_type="application/json", new_id=lambda: "c")
    for i in range(200):
        sent = f"2026-11-23 15:00:00:{i:06d} Z"
        got = writer.text(message_id="m", intent="Send", enclosed="T", correlation_id="m", reply_to=None, time_sent=sent,
                          given=None)
        assert decode_headers(got)[H.TIME_SENT] == sent  # type: ignore[index]
    assert len(writer._runs) <= 64


def _row(i: int, body: int) -> StagedRow:
    return StagedRow("default", 1, "a1", "s", "r", f"m{i}", "{}", b"x" * body, None, None, None)


def _chunks(rows: list[StagedRow]) -> list[list[StagedRow]]:
    """The chunks expected at STAGE_CHUNK 4 and STAGE_BYTES 20 (headers "{}" count 2 bytes)."""
    out: list[list[StagedRow]] = [[]]
    size = 0
    for row in rows:
        out[-1].append(row)
        size += len(row.headers) + len(row.body or b"")
        if len(out[-1]) >= 4 or size >= 20:
            out.append([])
            size = 0
    return [c for c in out if c]


@pytest.mark.parametrize("sizes", [[10] * 12, [6, 6, 6, 1, 9, 3, 3, 3, 20, 1], [0] * 7, [25, 1, 1], [30, 30, 1, 1], []])
def test_task_chunks_are_bounded_and_replay_the_kept_rows(monkeypatch: pytest.MonkeyPatch, sizes: list[int]) -> None:
    """Chunks of at most STAGE_CHUNK rows, closed once they reach STAGE_BYTES, on a first attempt and
    on a retry after a fault after any chunk; rows are kept while they fit in STAGE_RETRY_BYTES."""
    monkeypatch.setattr(staging, "STAGE_CHUNK", 4)
    monkeypatch.setattr(staging, "STAGE_BYTES", 20)
    monkeypatch.setattr(staging, "STAGE_RETRY_BYTES", 60)
    rows = [_row(i, n) for i, n in enumerate(sizes)]
    for written in range(len(rows) + 1):  # chunks written before the fault
        new = TaskRows(iter(rows))
        first_new = list(itertools.islice(new.chunks("a1"), written))
        assert first_new == _chunks(rows)[:written]
        read = sum(len(c) for c in first_new)
        assert new.replayable == (sum(len(r.body) + 2 for r in rows[:read]) <= 60)
        if new.replayable:
            again = list(new.chunks("a2"))
            assert again == _chunks([r._replace(attempt="a2") for r in rows[:read]] + rows[read:])
            assert sum(len(c) for c in again) == len(rows)  # fresh rows carry the builder's new attempt already
            kept = sum(len(c) for c in first_new)
            assert [r.attempt for c in again for r in c][:kept] == ["a2"] * kept


def test_input_errors_are_input_failed() -> None:
    def source() -> Any:
        yield _row(0, 1)
        raise ValueError("upstream")

    with pytest.raises(staging.InputFailed) as info:
        list(TaskRows(source()).chunks("a1"))
    assert isinstance(info.value.__cause__, ValueError)


def test_module_constants_match_the_wire() -> None:
    assert builder._FORWARD == H.FORWARD_DESTINATION and builder._CONTROL == H.CONTROL_MESSAGE


def test_postgres_stages_every_body_type(pg: Any, names: Any) -> None:
    """The staging COPY's bytea dumper (psycopg's C one) takes every body a staged row holds."""
    import psycopg

    d = dialect_named("postgres")
    table = d.parse_address(names("Staging"))
    bodies = [b"ab", bytearray(b"cd"), memoryview(b"ef"), None, b"", bytes(range(256)) * 4096]
    with psycopg.connect(pg.url) as conn:
        for stmt in d.create_staging(table):
            conn.execute(stmt.sql, stmt.params)
        d.stage_rows(conn, table, [("s", 1, "a", "s", "r", f"m{i}", "{}", b, None, None, None) for i, b in enumerate(bodies)])
        got = conn.execute(f"SELECT message_id, body FROM {d.qualified(table)} ORDER BY seq").fetchall()
        conn.rollback()
    assert got == [(f"m{i}", None if b is None else bytes(b)) for i, b in enumerate(bodies)]


class _Cursor:
    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.fast_executemany = False

    def setinputsizes(self, sizes: list[Any]) -> None:  # bounded binds where values fit (send.py)
        pass

    def executemany(self, sql: str, data: list[Any]) -> None:
        self.log.append(data)

    def close(self) -> None:
        pass


def test_sql_server_converts_what_it_must_and_passes_the_rest() -> None:
    """Rows without a due time and with bytes (or no) bodies go as they are, as plain tuples;
    other buffers become bytes and aware due times (datetime subclasses too) naive UTC."""

    class Stamp(datetime):
        pass

    class Body(bytes):
        pass

    log: list[Any] = []
    conn = types.SimpleNamespace(cursor=lambda: _Cursor(log))
    due = Stamp(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    rows = [StagedRow("s", 1, "a", "s", "r", "m0", "{}", b"x", None, None, None),
            StagedRow("s", 1, "a", "s", "r", "m1", "{}", None, 5, None, None),
            StagedRow("s", 1, "a", "d", "r", "m2", "{}", memoryview(b"y"), None, None, due),
            StagedRow("s", 1, "a", "s", "r", "m3", "{}", Body(b"z"), None, None, None)]
    dialect_named("sqlserver").stage_rows(conn, dialect_named("sqlserver").parse_address("Sales.Staging"), rows)
    (data,) = log
    assert all(type(r) is tuple for r in data)
    assert data[0] == tuple(rows[0]) and data[1] == tuple(rows[1]) and data[3] == tuple(rows[3])
    assert data[2][7] == b"y" and type(data[2][7]) is bytes
    assert data[2][10] == datetime(2030, 1, 2, 1, 4, 5) and data[2][10].tzinfo is None
