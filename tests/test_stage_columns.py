"""The sink builds a task's input column by column (`MessageBuilder.build_columns`: the writer
hands it `InputColumns`, the values of Spark's Arrow record batches) and row by row
(`MessageBuilder.build`, the general path): for any batch, good rows and bad, the same staged
rows (the rows of each (kind, route) in the same order: queue order), the same counts, the same
error copies, the same error for the same row. Only generated values differ: the message and
conversation ids each path draws (here from one deterministic sequence, and compared by where
they appear, not by value) and TimeOfFailure (masked). The task's report is the same too, by
either way in. Below them, the pieces: headers texts and ids made column by column
(`SentHeaderText.texts`, `uuid4_list`) are those `SentHeaderText.text` writes one by one, and
ids `str(uuid.uuid4())` could be."""

from __future__ import annotations

import itertools
import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_qtransport.dialects import dialect_named
from spark_qtransport.transport.sending import builder as builder_module
from spark_qtransport.transport.sending.builder import MessageBuilder
from spark_qtransport.transport.sending.inline import hand_over
from spark_qtransport.transport.sending.messages import InputColumns, RowGroup, SendPlan, StagedRow
from spark_qtransport.transport.sending.staging import TaskRows, stage_partition
from spark_qtransport.transport.settings import SendSettings
from spark_qtransport.wire import H, decode_headers

FIXED = uuid.UUID("0b5e7a3c-1d2f-4a6b-8c9d-0e1f2a3b4c5d")  # the general path's uuid4 (ConversationId)
TYPE = "Shop.Messages.OrderAccepted, Shop.Messages"
NOW = "2026-11-23 15:00:00:123456 Z"
GENERATED = re.compile(r"00000000-0000-4000-8000-\d{12}")
FAILURE_TIME = re.compile(r'("NServiceBus\.TimeOfFailure":)"[^"]*"')
TIME_SENT = re.compile(r'("NServiceBus\.TimeSent":)"[^"]*"')

# text with what JSON escapes, "/" (escaped as "\/"), non-ASCII, white space, and sometimes NUL
TEXT = st.text(st.sampled_from(["a", "/", '"', "\\", "\n", "\x01", "ü", "😀", " ", "\u2028", "\x00"]), max_size=6)
CLEAN = TEXT.filter(lambda t: "\x00" not in t)
OPT = st.one_of(st.none(), st.just(""), TEXT)
# what an Arrow record batch holds: text or None in text columns, a map as (key, value) pairs
ROW = st.fixed_dictionaries({}, optional={
    "body": st.one_of(st.none(), st.binary(max_size=4), TEXT, st.just("\ud800")),
    "message_id": st.one_of(OPT, st.just("m-1")),
    "message_type": st.one_of(OPT, st.just(TYPE), st.just("Sales/Orders.Placed, Sales")),
    "correlation_id": OPT,
    "reply_to": st.one_of(OPT, st.just("Web/Front")),
    "intent": st.sampled_from([None, "", "send", "publish", "reply", " Reply ", "PUBLISH", "shout", "  ", "fail", "retry"]),
    "destination": st.sampled_from([None, "Billing", "sales.Billing", "", "a\x00b", '"x', "Ship/ping"]),
    "headers": st.one_of(st.none(), st.lists(st.tuples(st.one_of(TEXT, st.just(H.CONVERSATION_ID), st.just(H.MESSAGE_ID)),
                                                       st.one_of(st.none(), TEXT)), max_size=3)),
    "time_to_be_received": st.sampled_from([None, None, 30, -1]),
    "delay": st.sampled_from([None, None, 5, 0]),
    "deliver_at": st.sampled_from([None, None, datetime(2020, 1, 1, tzinfo=timezone.utc)]),
    "failure": st.sampled_from([None, {"message": "no", "failed_q": "Sales"}]),
})
# rows that mostly take the column-wise path
PLAIN = st.fixed_dictionaries({"body": st.one_of(st.binary(max_size=4), CLEAN)}, optional={
    "message_id": st.one_of(st.none(), st.just(""), CLEAN),
    "message_type": st.one_of(st.just(TYPE), CLEAN, st.just("Sales/Orders.Placed, Sales")),
    "correlation_id": st.one_of(st.none(), CLEAN),
    "reply_to": st.one_of(st.none(), CLEAN),
    "intent": st.sampled_from([None, "send", "publish", " Reply"]),
    "destination": st.sampled_from([None, "Billing", "x.y.z"]),
    "headers": st.one_of(
        st.none(), st.just([]),
        st.tuples(CLEAN, CLEAN).map(lambda t: [(H.CONVERSATION_ID, t[0]), (H.RELATED_TO, t[1])]),  # reply(), publish()
        st.tuples(st.sampled_from([H.CONVERSATION_ID, "Shop.Tenant"]), CLEAN, CLEAN).map(  # a key twice: the last wins
            lambda t: [(t[0], t[1]), (H.RELATED_TO, "r"), (t[0], t[2])]),
        st.lists(st.tuples(st.sampled_from([H.CONVERSATION_ID, H.RELATED_TO, "Shop.Tenant", "a/b", "ü\"", H.CORRELATION_ID,
                                            H.REPLY_TO_ADDRESS, "NServiceBus.TimeToBeReceived"]),
                           st.one_of(CLEAN, CLEAN, st.none(), TEXT)), max_size=3)),
})


def _builder(dialect: str, reply_to: str | None, destination: str | None, invalid_to: str | None) -> MessageBuilder:
    """A builder whose new ids come from one deterministic sequence, row by row and in blocks."""
    d = dialect_named(dialect)
    plan = SendPlan(dialect=dialect, endpoint="Sales/East", reply_to=reply_to, content_type="application/json",
                    default_destination=None if destination is None else d.parse_address(destination),
                    sink="default", error_queue=invalid_to, invalid_fail=invalid_to is None)
    b = MessageBuilder(plan, batch_id=7, attempt="a1")
    b._ids = (f"00000000-0000-4000-8000-{i:012d}" for i in itertools.count())
    b._id_block = lambda n: list(itertools.islice(b._ids, n))
    return b


def _masked(row: StagedRow) -> StagedRow:
    """The row with its generated ids named by where they first appear in it (message id, then
    the headers' order), and TimeOfFailure masked."""
    names: dict[str, str] = {}

    def name(m: re.Match[str]) -> str:
        return names.setdefault(m.group(0), f"<generated {len(names)}>")

    message_id = GENERATED.sub(name, row.message_id)
    headers = FAILURE_TIME.sub(r'\1"<time>"', GENERATED.sub(name, row.headers))
    return row._replace(message_id=message_id, headers=headers)


def _generated(value: Any) -> str:
    """A text (an error's, or its repr) with every generated id masked alike."""
    return GENERATED.sub("<generated>", repr(value))


def _outcome(items: Any) -> tuple[list[StagedRow], Any, int]:
    """The staged rows an iterable of rows and groups yields, the error that ended it, and how
    many of the rows came in groups."""
    rows: list[StagedRow] = []
    grouped = 0
    try:
        for item in items:
            if isinstance(item, RowGroup):
                rows += item.rows("default", 7, "a1")
                grouped += len(item.columns[0])
            else:
                rows.append(item)
    except Exception as exc:  # noqa: BLE001 - compared: the same error for the same row
        return rows, (type(exc), str(exc)), grouped
    return rows, None, grouped


def _by_key(rows: list[StagedRow]) -> dict[tuple[str, str], list[StagedRow]]:
    out: dict[tuple[str, str], list[StagedRow]] = {}
    for row in rows:
        out.setdefault((row.kind, row.route), []).append(_masked(row))
    return out


def _same(rows: list[dict[str, Any]], dialect: str, reply_to: str | None, destination: str | None,
          invalid_to: str | None) -> int:
    """Assert both ways build the same; returns how many rows were built column-wise."""
    batch = InputColumns.of(rows)
    columns, general = (_builder(dialect, reply_to, destination, invalid_to) for _ in range(2))
    with mock.patch.object(uuid, "uuid4", lambda: FIXED):  # the general path's ConversationIds
        got, got_error, grouped = _outcome(columns.build_columns(batch, NOW))
        want, want_error, _ = _outcome(general.build(row, NOW) for row in batch)  # every column in every row, as Spark's
    assert _generated(got_error) == _generated(want_error)
    assert _by_key(got) == _by_key(want)
    assert (columns.counts, columns.invalid, _generated(columns.invalid_reason)) == (
        general.counts, general.invalid, _generated(general.invalid_reason))
    return grouped


@settings(max_examples=1500, deadline=None)
@given(rows=st.lists(ROW, min_size=1, max_size=8), dialect=st.sampled_from(["postgres", "sqlserver"]),
       reply_to=st.sampled_from([None, '"public"."Sales"']), destination=st.sampled_from([None, "Billing"]),
       invalid_to=st.sampled_from([None, '"public"."error"']))
def test_columns_build_what_rows_build(rows: list[dict[str, Any]], dialect: str, reply_to: str | None,
                                       destination: str | None, invalid_to: str | None) -> None:
    _same(rows, dialect, reply_to, destination, invalid_to)


@settings(max_examples=1000, deadline=None)
@given(rows=st.lists(st.one_of(PLAIN, PLAIN, PLAIN, ROW), min_size=1, max_size=12),
       dialect=st.sampled_from(["postgres", "sqlserver"]), reply_to=st.sampled_from([None, '"public"."Sales"']),
       destination=st.sampled_from([None, "Billing"]), invalid_to=st.sampled_from([None, '"public"."error"']))
def test_columns_build_what_rows_build_from_mostly_plain_rows(rows: list[dict[str, Any]], dialect: str,
                                                              reply_to: str | None, destination: str | None,
                                                              invalid_to: str | None) -> None:
    _same(rows, dialect, reply_to, destination, invalid_to)


@pytest.mark.parametrize("shape", ["new", "ids", "odd", "routes", "headers"])
def test_a_large_batch_builds_what_rows_build(shape: str) -> None:
    """Thousands of rows: literal message types, with and without ids, bad rows between good ones,
    several destinations and intents."""
    n = 3000
    rows: list[dict[str, Any]] = [{"body": f"{{\"n\":{i}}}".encode(), "message_type": TYPE} for i in range(n)]
    for i, row in enumerate(rows):
        if shape == "ids":
            row.update(message_id=f"m/{i}" if i % 3 else None, correlation_id="c" if i % 5 == 0 else None,
                       reply_to="Web" if i % 7 == 0 else None)
        elif shape == "odd":
            row.update(message_id="bad\x00" if i % 97 == 0 else None, delay=5 if i % 89 == 0 else None,
                       message_type="" if i % 83 == 0 else TYPE, headers=[("Shop.Tenant", "ü")] if i % 79 == 0 else None)
        elif shape == "headers":
            row.update(intent=("reply", "publish", None)[i % 3], destination="Web" if i % 3 == 0 else None, headers=[
                [(H.CONVERSATION_ID, f"c{i}"), (H.RELATED_TO, f"r/{i}")],
                [(H.CONVERSATION_ID, f"c{i}"), (H.RELATED_TO, f"r{i}"), ("Shop.Tenant", "\"ü\"")],
                [(H.RELATED_TO, "r"), (H.RELATED_TO, "s")], [("Shop.Tenant", None)], [("Shop.Tenant", "a\x00")],
                [(H.CORRELATION_ID, "c")], [(H.MESSAGE_ID, "m")], [], None, [(H.CONVERSATION_ID, "")],
            ][i % 10 if i % 7 else 0])
        elif shape == "routes":
            row.update(destination=("Billing", "Shipping", None, "a\x00b")[i % 4], intent=("send", "reply", "publish")[i % 3],
                       message_type=("T1", "T2/x")[i % 2])
    for invalid_to in (None, '"public"."error"'):
        grouped = _same(rows, "postgres", '"public"."Sales"', "Billing", invalid_to)
        if invalid_to is not None or shape in ("new", "ids"):  # else the first bad row fails the task
            assert grouped >= n // 2


def test_new_messages_take_the_column_wise_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The usual new messages (body, a literal message type; or replies and sends with their
    ids) never reach the row-wise path, and make one group per (kind, route)."""
    b = _builder("postgres", '"public"."Sales"', "Billing", '"public"."error"')
    monkeypatch.setattr(b, "build", lambda row, now: pytest.fail(f"row-wise path for {row}"))
    new = InputColumns(["body", "message_type"], [[b"{}"] * 100, [TYPE] * 100])
    (group,) = b.build_columns(new, NOW)
    assert (group.kind, group.route, len(group.columns[0])) == ("s", '"public"."Billing"', 100)
    assert b.counts == {("s", '"public"."Billing"'): 100}
    sends = InputColumns(["body", "message_type", "message_id", "intent", "destination", "headers", "delay"],
                         [[b"{}"] * 4, [TYPE] * 4, ["m1", None, "m3", ""], [None, "reply", "send", "publish"],
                          ["Shipping", "Web", None, None], [None] * 4, [None] * 4])
    assert [(g.kind, g.route, len(g.columns[0])) for g in b.build_columns(sends, NOW)] == [
        ("s", '"public"."Shipping"', 1), ("s", '"public"."Web"', 1), ("s", '"public"."Billing"', 1), ("p", TYPE, 1)]
    related = [[(H.CONVERSATION_ID, f"c{i}"), (H.RELATED_TO, f"r{i}"), ("Shop.Tenant", "acme")] for i in range(3)]
    replies = InputColumns(["body", "destination", "intent", "message_type", "correlation_id", "headers"],  # reply()
                           [[b"{}"] * 3, ["Web"] * 3, ["reply"] * 3, [TYPE] * 3, ["c0", "c1", "c2"], related])
    events = InputColumns(["body", "intent", "message_type", "headers"], [[b"{}"] * 3, ["publish"] * 3, [TYPE] * 3, related])
    assert [(g.kind, g.route, len(g.columns[0])) for g in [*b.build_columns(replies, NOW), *b.build_columns(events, NOW)]] \
        == [("s", '"public"."Web"', 3), ("p", TYPE, 3)]


def test_headers_of_a_new_message() -> None:
    b = _builder("postgres", '"public"."Sales"', "Billing", None)
    (group,) = b.build_columns(InputColumns(["body", "message_type"], [["é"], [TYPE]]), NOW)
    (row,) = group.rows("default", 7, "a1")
    assert row == StagedRow("default", 7, "a1", "s", '"public"."Billing"', "00000000-0000-4000-8000-000000000000",
                            row.headers, "é".encode(), None, None, None)
    assert list(decode_headers(row.headers).items()) == [  # type: ignore[union-attr]
        (H.MESSAGE_ID, row.message_id), (H.MESSAGE_INTENT, "Send"), (H.ENCLOSED_MESSAGE_TYPES, TYPE),
        (H.CONTENT_TYPE, "application/json"), (H.TIME_SENT, NOW), (H.ORIGINATING_ENDPOINT, "Sales/East"),
        (H.ORIGINATING_MACHINE, b.machine), (H.CONVERSATION_ID, "00000000-0000-4000-8000-000000000001"),
        (H.CORRELATION_ID, row.message_id), (H.REPLY_TO_ADDRESS, '"public"."Sales"'),
    ]
    assert '"application\\/json"' in row.headers and '"Sales\\/East"' in row.headers


def _task(rows: list[dict[str, Any]], batches: list[Any], inline_bytes: int) -> Any:
    options = SendSettings.create("postgresql://u@localhost:1/db", "Sales", destination="Billing", inline_bytes=inline_bytes)
    d = options.dialect
    plan = SendPlan(dialect="postgres", endpoint="Sales", default_destination=d.parse_address("Billing"),
                    reply_to='"public"."Sales"', content_type="application/json", sink="default",
                    error_queue='"public"."error"')
    with mock.patch.object(builder_module, "uuid4_list", lambda n: [str(FIXED)] * n), \
            mock.patch.object(builder_module, "uuid4_texts", lambda: itertools.repeat(str(FIXED))), \
            mock.patch.object(uuid, "uuid4", lambda: FIXED):
        return stage_partition(options, plan, batches, batch_id=3, query_id="q")


def test_a_task_hands_over_the_same_messages_either_way() -> None:
    rows = [{"body": bytes([i % 256]) * 10, "message_type": TYPE, "message_id": None if i % 4 else f"m{i}",
             "intent": "publish" if i % 10 == 0 else None, "delay": 5 if i % 13 == 0 else None,
             "correlation_id": "bad\x00" if i % 17 == 0 else None} for i in range(500)]
    by_rows = _task(rows, [rows[:200], rows[200:]], 2**26)
    by_columns = _task(rows, [InputColumns.of(rows[:200]), InputColumns.of(rows[200:])], 2**26)
    assert by_rows.inline is not None and by_columns.inline is not None

    def masked(report: Any) -> Any:
        groups = [(g.kind, g.route, [list(c) for c in g.columns]) for g in report.inline]
        text = TIME_SENT.sub(r'\1"<time>"', FAILURE_TIME.sub(r'\1"<time>"', repr(groups)))  # each task's own clock
        return text, report.rows, report.routes, report.invalid, report.invalid_reason

    assert masked(by_columns) == masked(by_rows)
    assert by_columns.rows == 500 and by_columns.invalid == 33  # a NUL; a delayed event


def test_task_rows_write_groups_as_their_rows_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups and rows, read past the bound: every message staged, in order, each chunk bounded,
    and a retry writes the kept ones again under its attempt."""
    from spark_qtransport.transport.sending import staging

    monkeypatch.setattr(staging, "STAGE_CHUNK", 4)
    b = _builder("postgres", None, "Billing", None)
    batch = InputColumns(["body", "message_type", "delay"], [[b"x" * 10] * 9, [TYPE] * 9, [None, 5, *[None] * 7]])
    items = list(b.build_columns(batch, NOW))
    assert [type(i).__name__ for i in items] == ["RowGroup", "StagedRow", "RowGroup"]
    task = TaskRows(iter(items), sink="default", batch_id=7)
    assert task.within(50) is None and task.replayable
    first = [r for chunk in task.chunks("a1") for r in chunk]
    again = list(task.chunks("a2"))
    assert all(len(c) <= 4 for c in again)
    assert [r._replace(attempt="a1") for c in again for r in c] == first
    assert {r.attempt for c in again for r in c} == {"a2"} and len(first) == 9
    assert [(r.kind, r.delay_ms) for r in first][:3] == [("s", None), ("d", 5000), ("s", None)]
    expected = [row for item in items for row in (item.rows("default", 7, "a1") if isinstance(item, RowGroup) else [item])]
    assert first == expected
    assert [(g.kind, list(g.columns[0])) for g in hand_over(items)] == [
        ("s", [r.message_id for r in expected if r.kind == "s"]), ("d", [expected[1].message_id])]


def test_a_deliver_at_in_the_past_is_no_plain_row() -> None:
    """Rows with a time column holding a value are built row by row, even when it means now."""
    b = _builder("postgres", None, "Billing", None)
    past = datetime.now(timezone.utc) - timedelta(days=1)
    items = list(b.build_columns(InputColumns(["body", "message_type", "deliver_at"], [[b""], [TYPE], [past]]), NOW))
    assert [type(i) for i in items] == [StagedRow] and items[0].kind == "d" and items[0].delay_ms == 0


@settings(max_examples=1000, deadline=None)
@given(data=st.data(), n=st.integers(1, 6), one_intent=st.booleans(), one_type=st.booleans(),
       correlations=st.booleans(), reply_to=st.sampled_from(["none", "one", "each"]), time_sent=CLEAN, machine=CLEAN)
def test_sent_header_texts_are_the_texts_of_each(data: Any, n: int, one_intent: bool, one_type: bool, correlations: bool,
                                                 reply_to: str, time_sent: str, machine: str) -> None:
    """`SentHeaderText.texts` writes, column by column, what `text` writes for each message
    (with the text of its given headers from `given_texts`)."""
    from spark_qtransport.wire import NOT_GIVEN_TEXT, SentHeaderText, given_texts

    each = lambda strategy: data.draw(st.lists(strategy, min_size=n, max_size=n))  # noqa: E731
    message_ids, conversations = each(CLEAN.filter(bool)), each(CLEAN)
    intents = data.draw(st.sampled_from(["Send", "Reply", "Publish"])) if one_intent else each(
        st.sampled_from(["Send", "Reply", "Publish"]))
    types = data.draw(CLEAN.filter(bool)) if one_type else each(CLEAN.filter(bool))
    correlation_ids = each(st.one_of(st.none(), st.just(""), CLEAN)) if correlations else None
    replies: Any = {"none": None, "one": data.draw(st.one_of(st.just(""), CLEAN)),
                    "each": each(st.one_of(st.none(), st.just(""), CLEAN))}[reply_to]
    names = data.draw(st.lists(st.one_of(CLEAN, st.sampled_from([H.RELATED_TO, "NServiceBus.TimeToBeReceived"])).filter(
        lambda name: name not in NOT_GIVEN_TEXT and name != H.CONVERSATION_ID), unique=True, max_size=3))
    given = [dict(zip(names, values, strict=True)) for values in zip(*[each(CLEAN) for _ in names], strict=True)] \
        if names else [{} for _ in range(n)]
    writer = SentHeaderText(endpoint="Sales/East", machine=machine, content_type="application/json", new_id=lambda: "")
    got = writer.texts(message_ids=message_ids, intent=intents, enclosed=types, correlation_ids=correlation_ids,
                       reply_to=replies, time_sent=time_sent, conversations=conversations,
                       given=given_texts(names, [[g[name] for g in given] for name in names]) if names else None)

    def at(value: Any, i: int) -> Any:
        return value if value is None or isinstance(value, str) else value[i]

    want = []
    for i in range(n):
        writer._new_id = lambda i=i: conversations[i]  # type: ignore[misc]
        want.append(writer.text(message_id=message_ids[i], intent=at(intents, i), enclosed=at(types, i),
                                correlation_id=at(correlation_ids, i) or message_ids[i], reply_to=at(replies, i),
                                time_sent=time_sent, given=given[i] or None))
    assert got == want


@pytest.mark.parametrize("n", [0, 1, 2, 257, 5000])
def test_uuid4_lists_are_distinct_version_4_uuid_texts(n: int) -> None:
    from spark_qtransport.wire import uuid4_list

    ids = uuid4_list(n)
    assert len(ids) == n and len(set(ids)) == n
    for text in ids:
        u = uuid.UUID(text)
        assert str(u) == text and u.version == 4 and u.variant == uuid.RFC_4122
