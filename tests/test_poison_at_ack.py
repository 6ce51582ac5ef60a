"""PostgreSQL: the claim does not judge the headers of the rows it claims (jsonb parses them ten
times slower than the read's orjson); a poison claim is never delivered, and its batch's
acknowledgement moves it raw to the error queue, exactly once, however the driver dies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_receive_contract import drain, read_batch
from test_receive_contract import receiving as contract_receiving

from backends import Backend, nsb_headers
from spark_qtransport.dialects.base import QueueAddress
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.transport.receiving.decode import rows_batch
from spark_qtransport.wire import decode_header_texts, decode_headers

POISON = ["<corrupted headers", "[1]", '{"a": {"b": "c"}}', '{"n": 5}', " ", '{"s": "\\ud800"}', '"text"', "{}}"]


def receiving(backend: Backend, queue: str, error: str, **settings: Any) -> Any:
    """The contract suite's receiver, its claims held in the claim table: this module is about
    the acknowledgement of claim-table claims (a prepared claim moves its poison at the claim:
    test_prepared.py)."""
    return contract_receiving(backend, queue, error, **{"claim_mode": "table", **settings})


@pytest.fixture
def queues(pg: Backend, names):  # type: ignore[no-untyped-def]
    q, e, a = names("Sales"), names("error"), names("audit")
    for t in (q, e, a):
        pg.create_queue(t)
    yield q, e, a
    for t in (q, e, a, pg.claims(q)):
        pg.drop(t)


def test_the_claim_judges_only_the_rows_it_does_not_claim() -> None:
    d = PostgresDialect()
    claim = d.claim(QueueAddress("Sales"), QueueAddress("Sales.Claims"), QueueAddress("error"), consumer="c",
                    limit=10, after=0, upto=None)[-1].sql
    check = d._poison("headers")
    assert claim.count(check) == 1 and claim.count("pg_input_is_valid") == 1
    at = claim.index(check)
    # the jsonb check is the THEN of a CASE on expiry and id: claimed rows never reach it
    guard = " ".join(claim[claim.rindex("CASE WHEN", 0, at):at].split())
    assert guard == ("CASE WHEN (expires IS NOT NULL AND expires <= (now() AT TIME ZONE 'UTC')) OR id IS NULL OR"
                     " (expires > TIMESTAMP '9999-12-31 23:59:59.999999' AND isfinite(expires)) THEN")
    assert " ".join(claim[at + len(check):].split()).startswith("ELSE false END AS poison,")


def test_poison_is_claimed_never_delivered_and_moved_by_the_acknowledgement(pg: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e, _ = queues
    pg.send(q, nsb_headers("before"))
    ids = [pg.send(q, bad, f"poison {i}".encode()) for i, bad in enumerate(POISON)]
    pg.send(q, nsb_headers("after"))
    with receiving(pg, q, e, claim_ahead=False) as r:
        start = r.initial_offset()
        end = r.latest(start, 100)
        assert pg.count(pg.claims(q)) == len(POISON) + 2 and pg.count(e) == 0  # claimed, whatever the headers
        assert [row[0] for row in read_batch(r, start, end)] == ["before", "after"]
        assert [row[0] for row in read_batch(r, start, end)] == ["before", "after"]  # a replay: the same
        assert pg.count(e) == 0 and r.stats.poison == 0
        r.ack(end)
        assert r.stats.poison == len(POISON) and r.report()["poison"] == len(POISON)
    assert sorted(pg.rows(e)) == sorted((str(i), bad, f"poison {n}".encode()) for n, (i, bad) in enumerate(zip(ids, POISON, strict=True)))
    assert pg.count(pg.claims(q)) == 0 and pg.count(q) == 0


def test_a_driver_that_dies_before_the_acknowledgement_moves_poison_once(pg: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e, _ = queues
    poison_id = pg.send(q, "<corrupted", b"raw")
    pg.send(q, nsb_headers("ok"))
    with receiving(pg, q, e, claim_ahead=False) as r:  # claimed and read, never acknowledged
        start = r.initial_offset()
        assert [row[0] for row in read_batch(r, start, r.latest(start, 10))] == ["ok"]
    with receiving(pg, q, e, claim_ahead=False) as r:  # a new checkpoint takes the claims over
        rows, _ = drain(r)
        again, _ = drain(r)
    assert [row[0] for row in rows] == ["ok"] and again == []
    assert pg.rows(e) == [(str(poison_id), "<corrupted", b"raw")]
    assert pg.count(pg.claims(q)) == 0


def test_poison_claims_sharing_an_id_both_reach_the_error_queue(pg: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """A native id comes back after its row was claimed: two claims, one id, one acknowledgement."""
    q, e, _ = queues
    with receiving(pg, q, e, claim_ahead=False) as r:
        start = r.initial_offset()
        nid = pg.send(q, "<first", b"1")
        mid = r.latest(start, 10)
        pg.send(q, "<second", b"2", native_id=nid)
        end = r.latest(mid, 10)
        assert read_batch(r, start, end) == []
        r.ack(end)
    got = pg.rows(e)
    assert sorted(b for _, _, b in got) == [b"1", b"2"] and len({i for i, _, _ in got}) == 2
    assert (str(nid), "<first", b"1") in got  # the first keeps its id


def test_with_audit_poison_goes_to_the_error_queue_not_the_audit_queue(pg: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e, a = queues
    pg.send(q, nsb_headers("ok"))
    poison_id = pg.send(q, '{"n": 1}', b"raw")
    with receiving(pg, q, e, audit_queue=pg.address(a)) as r:
        rows, _ = drain(r)
        assert r.report()["audited"] == 1 and r.stats.poison == 1
    assert [row[0] for row in rows] == ["ok"]
    assert pg.rows(e) == [(str(poison_id), '{"n": 1}', b"raw")]
    assert [json.loads(h)["NServiceBus.MessageId"] for _, h, _ in pg.rows(a)] == ["ok"]


def test_a_fetch_of_poison_only_is_an_empty_batch() -> None:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    rows = [(i, f"00000000-0000-4000-8000-00000000000{i}", None, bad, b"x", i, now) for i, bad in enumerate(POISON[:3], 1)]
    assert rows_batch("q", rows, judge=True).num_rows == 0
    mixed = [*rows, (9, "00000000-0000-4000-8000-000000000009", None, '{"NServiceBus.MessageId":"m"}', b"y", 9, now)]
    assert rows_batch("q", mixed, judge=True).column("claim_seq").to_pylist() == [9]
    with pytest.raises(Exception, match="unreadable headers"):  # without judging (SQL Server's claim judged)
        rows_batch("q", rows)


#: texts near the edge of the rule: JSON of every shape, escapes, surrogates, NULs, white space
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_EDGES = st.sampled_from(['"\\ud800"', '"\\udc00x"', '"\\ud83d\\ude00"', '"\\u0000"', '"a\\\\u0000"', "null", '""', "NaN",
                          "1e999", '"\\/"', " ", "\t", "\n",
                          '["\\ud800"]', '{"x":"\\udc00"}', '"\\\\ud800"', '"\\ud800\\\\udc00"'])


@st.composite
def header_texts(draw: Any) -> str:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return json.dumps(draw(_JSONISH), ensure_ascii=draw(st.booleans()))
    if kind == 1:  # a flat object whose values are edge cases
        keys = draw(st.lists(st.text(max_size=4), max_size=3))
        return "{" + ",".join(f"{json.dumps(k)}:{draw(_EDGES)}" for k in keys) + "}"
    if kind == 2:
        return draw(st.sampled_from(POISON + ["", "{}", '{"a":null}', ' {"a" : "b"} ', '{"a":"b","a":"c"}']))
    return draw(st.text(alphabet='{}[]":,\\u0123 ntrfaeld', max_size=12))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(header_texts(), min_size=1, max_size=20))
def test_the_python_rule_is_the_servers_rule(pg: Backend, texts: list[str]) -> None:
    """The read and the acknowledgement judge with `decode_headers`; the claim (expired and odd
    rows) with jsonb. Both must call the same texts poison."""
    d = PostgresDialect()
    with pg.connect() as conn:
        got = conn.execute(f"SELECT {d._poison('h')} FROM unnest(%s::text[]) WITH ORDINALITY AS t(h, n) ORDER BY n",
                           (texts,)).fetchall()
    server = [bool(p) for (p,) in got]
    assert [decode_headers(t) is None for t in texts] == server
    assert [h is None for h in decode_header_texts(texts)] == server


def test_each_acknowledgement_chunk_reads_after_the_last_one(pg: Backend, queues, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Until a vacuum, deleted claims leave dead index entries: a chunk that read from the
    consumer's first claim would walk every earlier chunk's (measured: 4.6 us of the server's CPU
    per message in a drain). Each chunk reads after the last claim the one before it read; an
    acknowledgement starts where the last one of the same claim table ended."""
    q, e, _ = queues
    pg.send_many(q, [(nsb_headers(f"m{i:02d}"), b"x") for i in range(20)])
    with receiving(pg, q, e, claim_ahead=False, ack_batch=4) as r:
        seen: list[tuple[int, int]] = []
        real = type(r.dialect).ack_headers

        def spy(self: Any, claims: Any, consumer: str, *, upto: int, batch: int, after: int = 0) -> Any:
            seen.append((after, upto))
            return real(self, claims, consumer, upto=upto, batch=batch, after=after)

        monkeypatch.setattr(type(r.dialect), "ack_headers", spy)
        start = r.initial_offset()
        first = r.latest(start, 10)
        second = r.latest(first, 10)
        r.ack(first)
        r.ack(second)
        assert pg.count(pg.claims(q)) == 0
    assert (first.claim, second.claim) == (10, 20)  # a new claim table: claim sequences 1 to 20
    assert seen == [(0, 10), (4, 10), (8, 10),
                    (first.claim, second.claim), (first.claim + 4, second.claim), (first.claim + 8, second.claim)]
