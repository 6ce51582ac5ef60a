"""Small tasks hand their rows to the driver, which writes them straight into their queues in the
batch's dispatch transaction (`transport.sending.inline`); larger tasks stage theirs. These are the
seams between the two ways: the bound, a batch of both, and what reaches the queue.
(`test_send_contract.py` runs every send scenario both ways.)"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from test_send_contract import msg, received, subscribe

from backends import Backend, Sender
from spark_qtransport.transport.sending import staging
from spark_qtransport.transport.sending.messages import SEND, StagedRow
from spark_qtransport.transport.sending.staging import TaskRows
from spark_qtransport.wire import H, uuid4s


def test_a_small_task_stages_nothing_and_its_rows_go_straight_into_the_queue(pg: Backend, names: Any) -> None:
    sales, billing = pg.create_queue(names("Sales")), pg.create_queue(names("Billing"))
    s = Sender(pg, sales, destination=billing)
    report = s.stage([msg(f'{{"n": {i}}}', message_id=f"m{i}", time_to_be_received=3600 if i == 0 else None)
                      for i in range(3)], batch_id=0)
    assert report.inline is not None and sum(len(g.columns[0]) for g in report.inline) == report.rows == 3
    assert s.staged() == 0
    result = s.dispatch(0, [report])
    assert (result.sent, result.destinations) == (3, {pg.dialect.format_address(pg.address(billing)): 3})
    assert [(h[H.MESSAGE_ID], body) for h, body in received(pg, billing)] == [
        ("m0", b'{"n": 0}'), ("m1", b'{"n": 1}'), ("m2", b'{"n": 2}')]
    assert s.staged() == 0
    assert s.dispatch(0, [s.stage([msg(message_id="m0")], batch_id=0)]).skipped  # a replay: the outbox record


def test_the_rows_keep_the_server_computed_expiry_and_fresh_ids(pg: Backend, names: Any) -> None:
    sales, billing = pg.create_queue(names("Sales")), pg.create_queue(names("Billing"))
    Sender(pg, sales, destination=billing).send([msg(message_id="a", time_to_be_received=60), msg(message_id="b")])
    with pg.connect() as c:
        rows = c.execute(f"SELECT id, expires - (now() AT TIME ZONE 'UTC') FROM {pg.q(billing)} ORDER BY seq").fetchall()
    (id_a, left_a), (id_b, left_b) = rows
    assert 55 < left_a.total_seconds() <= 60 and left_b is None
    assert id_a != id_b and id_a.version == 4 and id_b.version == 4


def test_a_task_over_its_share_of_the_bound_stages_its_rows_and_so_do_tasks_past_the_first_four(
        pg: Backend, names: Any) -> None:
    sales, billing = pg.create_queue(names("Sales")), pg.create_queue(names("Billing"))
    s = Sender(pg, sales, destination=billing, inline_bytes=4 * 1000)  # 1,000 bytes a task
    small = s.stage([msg("x" * 100, message_id="small")], batch_id=0, partition=3)
    large = s.stage([msg("x" * 600, message_id=f"large{i}") for i in range(2)], batch_id=0, partition=0)
    fifth = s.stage([msg("x" * 100, message_id="fifth")], batch_id=0, partition=4)
    assert small.inline is not None and large.inline is None and fifth.inline is None and s.staged() == 3
    assert s.dispatch(0, [small, large, fifth]).sent == 4
    assert sorted(h[H.MESSAGE_ID] for h, _ in received(pg, billing)) == ["fifth", "large0", "large1", "small"]
    assert s.staged() == 0


def test_a_batch_of_inline_and_staged_tasks_sends_each_message_once(pg: Backend, names: Any) -> None:
    """A queue that staged rows of other tasks go to takes the inline ones the staged way too,
    so a message id repeated across tasks reaches it once; a queue only inline rows go to is
    written straight; published and delayed rows of small tasks go the staged way."""
    sales, billing = pg.create_queue(names("Sales")), pg.create_queue(names("Billing"))
    shipping, subs, error = pg.create_queue(names("Shipping")), names("Subs"), names("error")
    inline = Sender(pg, sales, destination=billing, subscriptions=subs, error_queue=error, create_queues=True)
    staged = Sender(pg, sales, destination=billing, subscriptions=subs, error_queue=error, create_queues=True,
                    inline_bytes=0)
    inline.send([msg(intent="publish", message_id="e0", message_type="Shop.Nothing")], batch_id=3)  # creates subs
    subscribe(pg, subs, shipping, "Shipping", "Shop.OrderPlaced")
    a = inline.stage([msg("a", message_id="same"), msg("ship", message_id="s1", destination=shipping),
                      msg("event", message_id="e1", intent="publish", message_type="Shop.OrderPlaced"),
                      msg("later", message_id="d1", delay=3600)], batch_id=4)
    b = staged.stage([msg("b", message_id="same"), msg("c", message_id="other")], batch_id=4)
    assert a.inline is not None and b.inline is None
    result = inline.dispatch(4, [a, b])
    assert (result.sent, result.published, result.delayed) == (4, 1, 1)
    assert sorted(h[H.MESSAGE_ID] for h, _ in received(pg, billing)) == ["other", "same"]
    assert sorted(h[H.MESSAGE_ID] for h, _ in received(pg, shipping)) == ["e1", "s1"]
    assert pg.count(pg.dialect.format_address(inline.options.delayed)) == 1
    assert inline.staged() == 0


def test_rows_read_past_the_retry_budget_are_staged_in_order(monkeypatch: Any) -> None:
    """A task whose rows outgrow both the bound and what is kept for a retry still writes every
    row, the ones read while deciding first."""
    monkeypatch.setattr(staging, "STAGE_RETRY_BYTES", 250)
    rows = [StagedRow("default", 0, "a1", SEND, "q", f"m{i}", "{}", b"x" * 100, None, None, None) for i in range(6)]
    task = TaskRows(iter(rows))
    assert task.within(400) is None and not task.replayable
    assert [r.message_id for chunk in task.chunks("a1") for r in chunk] == [f"m{i}" for i in range(6)]


@pytest.mark.parametrize("n", [0, 1, 300])
def test_row_ids_are_distinct_version_4_uuids(n: int) -> None:
    ids = [uuid.UUID(bytes=b) for b in uuid4s(n)]
    assert len(set(ids)) == n and all(i.version == 4 and i.variant == uuid.RFC_4122 for i in ids)
