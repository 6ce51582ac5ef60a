"""Bad input, each with its documented outcome and nothing lost (../shared/CONFORMANCE.md, issue 6).

Bodies are opaque bytes in both directions: NULL, empty, not UTF-8, 10 MB. Hostile queue names in
headers (ForwardDestination, ReplyToAddress) are quoted or refused, never executed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from backends import Backend, Sender, nsb_headers, receive_batch
from spark_qtransport.wire import decode_headers

BODIES = {
    "null": None,
    "empty": b"",
    "not utf-8": b"\xff\xfe\x00\x80 \xc3\x28 bytes",
    "all byte values": bytes(range(256)),
    "10 MB": os.urandom(10 * 1024 * 1024),
}


@pytest.fixture
def queues(pg: Backend, names: Any) -> Any:
    class Q:
        sales = pg.create_queue(names("Sales"))
        out = pg.create_queue(names("Out"))
        error = pg.create_queue(names("error"))

    return Q


def test_bodies_are_opaque_bytes_both_ways(pg: Backend, queues: Any) -> None:
    for name, body in BODIES.items():
        pg.send(queues.sales, nsb_headers(name), body)
    received = {row[0]: row[3] for row in receive_batch(pg, queues.sales, queues.error)}
    assert received == BODIES
    result = Sender(pg, queues.sales).send([
        {"body": body, "message_id": f"{name}-out", "message_type": "T", "destination": queues.out}
        for name, body in BODIES.items()
    ])
    assert result.sent == len(BODIES)
    out = {decode_headers(h)["NServiceBus.MessageId"]: body for _, h, body in pg.rows(queues.out)}
    assert out == {f"{name}-out": body for name, body in BODIES.items()}
    assert pg.count(queues.error) == 0


@pytest.mark.parametrize("hostile", [
    'x"; DROP TABLE "Victim"; --', "x]; DROP TABLE [Victim]; --", "Victim' OR '1'='1", "a;b--c", "Ünï😀.queue",
])
def test_hostile_addresses_in_headers_are_quoted_or_refused(pg: Backend, queues: Any, names: Any, hostile: str) -> None:
    victim = pg.create_queue("Victim")
    fwd = "NServiceBus.SqlServer.ForwardDestination"
    # a claimed message whose ForwardDestination is hostile: the error queue gets it, FailedQ set
    pg.send(queues.sales, nsb_headers("forwarded", **{fwd: hostile}), b"f")
    assert receive_batch(pg, queues.sales, queues.error) == []
    ((_, text, body),) = pg.rows(queues.error)
    failed = decode_headers(text)
    assert failed["NServiceBus.FailedQ"] == hostile and body == b"f" and fwd not in failed
    assert json.loads(text)["NServiceBus.MessageId"] == "forwarded"
    # a reply to a hostile ReplyToAddress: refused, to the error queue; the batch is sent
    result = Sender(pg, queues.sales, error_queue=queues.error).send(
        [{"body": b"r", "message_type": "T", "intent": "reply", "destination": hostile}])
    assert (result.sent, result.failed) == (0, 1)
    assert pg.count(victim) == 0 and pg.count(queues.out) == 0 and pg.count(queues.error) == 2
