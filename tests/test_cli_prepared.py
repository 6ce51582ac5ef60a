"""`sqlqueue stats` and `sqlqueue doctor` on claims held by prepared transactions (`claimMode`).

A server of this module's own allows 4 prepared transactions; each test prepares real ones, as a
stream's claim does (BEGIN; DELETE the queue's rows; PREPARE TRANSACTION with a `PreparedClaim`'s
gid naming the queue's claim table by id), runs the command line and rolls them back. The advice
on max_prepared_transactions 0 is read from the test session's shared server, which has none.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from click.testing import CliRunner

from backends import Backend, nsb_headers, server_of_its_own
from spark_qtransport.cli import main
from spark_qtransport.transport import session as db
from spark_qtransport.transport.receiving.prepared import NUMBER_BASE, PreparedClaim, consumer_token

pytestmark = pytest.mark.db  # a server of its own (prepared transactions on)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield from server_of_its_own(max_prepared_transactions="4")


@pytest.fixture(scope="module")
def ppg(server: Any) -> Backend:
    return Backend(server.url)


def cli(backend: Backend, *args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(main, list(args), env={"SQLQUEUE_URL": backend.url})
    assert result.exit_code == code, (result.output, result.exception)
    return result


def streamed_queue(backend: Backend, name: str, messages: int = 3) -> str:
    """A queue with its claim table (as a stream's start makes it) and `messages` messages."""
    backend.create_queue(name)
    d = backend.dialect
    conn = d.connect(backend.parsed)
    try:
        db.install(d, conn.cursor(), d.create_claims(d.claims_table(backend.address(name))))
        conn.commit()
    finally:
        conn.close()
    backend.send_many(name, [(nsb_headers(f"m{i}"), b"{}") for i in range(messages)])
    return name


def claim_table_id(backend: Backend, queue: str) -> str:
    with backend.connect() as c:
        (oid,) = c.execute("SELECT to_regclass(%s)::oid::text", (backend.claims(queue),)).fetchone()
    return str(oid)


@contextmanager
def prepared(backend: Backend, gid: str, sql: str = "") -> Iterator[str]:
    """A prepared transaction under `gid` that ran `sql`, rolled back at the end."""
    with backend.connect(autocommit=True) as c:
        c.execute("BEGIN")
        if sql:
            c.execute(sql)
        c.execute(f"PREPARE TRANSACTION '{gid}'")
        try:
            yield gid
        finally:
            c.execute(f"ROLLBACK PREPARED '{gid}'")


@contextmanager
def prepared_claim(backend: Backend, queue: str, consumer: str) -> Iterator[PreparedClaim]:
    """A claim as a stream prepares it: every row of the queue deleted, numbered from NUMBER_BASE."""
    with backend.connect() as c:
        low, high = c.execute(f"SELECT min(seq), max(seq) FROM {backend.q(queue)}").fetchone()
    clock = time.strftime("%Y%m%d%H%M%S", time.gmtime()) + "000000"
    claim = PreparedClaim(claim_table_id(backend, queue), NUMBER_BASE + 1, NUMBER_BASE + 1 + high - low, int(low),
                          int(high), clock, consumer_token(consumer))
    with prepared(backend, claim.gid, f"DELETE FROM {backend.q(queue)} WHERE seq BETWEEN {low} AND {high}"):
        yield claim


def test_stats_lists_prepared_claims_per_consumer(ppg: Backend) -> None:
    tag = uuid.uuid4().hex[:8]
    q, idle, plain = streamed_queue(ppg, f"Sales_{tag}"), streamed_queue(ppg, f"Idle_{tag}"), ppg.create_queue(f"Plain_{tag}")
    long_consumer = "Sales Analytics/" + "x" * 70  # not a gid's characters: the gid holds a digest
    with ppg.connect() as c:  # the claim table names the consumer (a claim of the same stream parked before)
        c.execute(f"INSERT INTO {ppg.q(ppg.claims(q))} (claim_seq, consumer, id, headers, body, source_seq, claimed_at)"
                  " OVERRIDING SYSTEM VALUE VALUES (7, %s, gen_random_uuid(), '{}', ''::bytea, 7, now())",
                  (long_consumer,))
    with prepared_claim(ppg, q, "Sales.Spark") as claim:
        time.sleep(0.3)
        rows = {r["queue"]: r for r in json.loads(cli(ppg, "stats", q, idle, plain, "--json").output)}
        mine = rows[f'"public"."{q}"']
        assert mine["messages"] == 3  # a prepared claim's rows stand for everyone else until it commits
        assert mine["claimed"] == {long_consumer: 1}
        assert list(mine["prepared"]) == ["Sales.Spark"]
        assert (mine["prepared"]["Sales.Spark"]["claims"], mine["prepared"]["Sales.Spark"]["messages_up_to"]) == (1, 3)
        assert 0.3 <= mine["prepared"]["Sales.Spark"]["oldest_age_s"] < 30
        assert rows[f'"public"."{idle}"']["prepared"] == {}  # a claim table, no prepared claim
        assert rows[f'"public"."{plain}"']["prepared"] is None  # no claim table
        # a second claim, of the consumer the claim table names: shown by that name, not its digest
        digest = consumer_token(long_consumer)
        assert digest.startswith("~")
        second = PreparedClaim(claim.table, claim.last + 1, claim.last + 10, claim.high + 1, claim.high + 10,
                               claim.clock, digest)
        with prepared(ppg, second.gid):
            [row] = json.loads(cli(ppg, "stats", q, "--json").output)
            assert list(row["prepared"]) == [long_consumer, "Sales.Spark"]
            assert (row["prepared"][long_consumer]["claims"], row["prepared"][long_consumer]["messages_up_to"]) == (1, 10)
            lines = cli(ppg, "stats", q, idle, plain).output.splitlines()
    header = lines[0].split()
    assert header[header.index("claimed") + 1] == "prepared"
    line = next(x for x in lines if x.startswith(f'"public"."{q}"'))
    assert "Sales.Spark=1 (up to 3, " in line and f"{long_consumer}=1 (up to 10, " in line
    assert next(x for x in lines if x.startswith(f'"public"."{plain}"')).split()[header.index("prepared")] == "-"
    [after] = json.loads(cli(ppg, "stats", q, "--json").output)
    assert after["prepared"] == {}


def test_stats_names_a_consumer_with_underscores_that_the_claim_table_does_not(ppg: Backend) -> None:
    """After Ctrl-C of jobs/queue_to_delta.py (consumer `queue_to_delta`, every claim prepared),
    stats named it `~651a0495...=2`: a gid held a digest for any name with an underscore, and only
    a claim-table row could name it. The gid now holds such a name as it is; a claim an earlier
    version prepared (the digest) is still the consumer's (`prepared.listed`)."""
    from spark_qtransport.transport.receiving.prepared import consumer_tokens

    q = streamed_queue(ppg, f"Orders_{uuid.uuid4().hex[:8]}")
    assert consumer_token("queue_to_delta") == "queue_to_delta"
    assert len(consumer_tokens("queue_to_delta")) == 2 and consumer_tokens("Sales.Spark") == {"Sales.Spark"}
    with prepared_claim(ppg, q, "queue_to_delta"):
        [row] = json.loads(cli(ppg, "stats", q, "--json").output)
    assert list(row["prepared"]) == ["queue_to_delta"], row["prepared"]


def doctor(backend: Backend, *args: str, code: int = 0) -> list[dict[str, str]]:
    return list(json.loads(cli(backend, "doctor", *args, "--json", code=code).output))


def test_doctor_flags_prepared_claims_past_the_bound(ppg: Backend) -> None:
    tag = uuid.uuid4().hex[:8]
    q, other = streamed_queue(ppg, f"Sales_{tag}"), streamed_queue(ppg, f"Billing_{tag}")
    with prepared_claim(ppg, q, "Sales.Spark") as claim:
        assert not [f for f in doctor(ppg, q) if f["level"] == "warning"]  # younger than the default 60 s
        time.sleep(2.0)
        findings = doctor(ppg, q, "--prepared-timeout", "1s")  # warnings only: exit 0
        [flagged] = [f for f in findings if f["level"] == "warning"]
        assert flagged["table"] == f'"public"."{q}"'
        text = flagged["finding"]
        assert text.startswith("a prepared claim of consumer 'Sales.Spark' prepared ")
        assert "past the 1.0 s bound" in text and "holds vacuum back" in text and "age(datfrozenxid) is " in text
        assert "up to 3 message(s) stay claimed" in text
        assert "starting the stream again (or stopping it cleanly) moves it into the claim table" in text
        assert claim.gid in text
        # checked from another queue: named by its claim table's id, which the finding says how to resolve
        [elsewhere] = [f for f in doctor(ppg, other, "--prepared-timeout", "1s") if f["level"] == "warning"]
        assert elsewhere["table"] == "(server)"
        assert f"on the claim table with id {claim.table}, of a queue not checked here" in elsewhere["finding"]
        with ppg.connect() as c:
            (name,) = c.execute(f"SELECT {claim.table}::regclass::text").fetchone()
        assert name == f'"{q}.Claims"'
        # a prepared transaction of someone else's, as old: a warning too
        with prepared(ppg, f"billing-batch-{tag}"):
            time.sleep(1.2)
            warnings = [f for f in doctor(ppg, q, "--prepared-timeout", "1s") if f["level"] == "warning"]
            assert [f["table"] for f in warnings] == [f'"public"."{q}"', "(server)"]
            assert warnings[1]["finding"].startswith(f"prepared transaction 'billing-batch-{tag}' (not sqlqueue's) was "
                                                     "prepared ")
            assert "holds vacuum back" in warnings[1]["finding"] and "ROLLBACK PREPARED" in warnings[1]["finding"]
            # and, with 2 of the 4 slots held (one by others), too few for prepared claims on both queues
            [advice] = [f for f in doctor(ppg, q, other) if f["level"] == "info" and f["table"] == "(server)"]
            assert advice["finding"].startswith("max_prepared_transactions is 4: too few for prepared claims")
            assert "at least 9 (4 per queue a stream reads" in advice["finding"]
    assert not [f for f in doctor(ppg, q, other, "--prepared-timeout", "1s") if f["level"] == "warning"]
    assert "must be a duration" in cli(ppg, "doctor", q, "--prepared-timeout", "soon", code=1).output


def test_doctor_advises_on_max_prepared_transactions_0(pg: Backend, names: Any) -> None:
    with pg.connect() as c:
        (setting,) = c.execute("SELECT current_setting('max_prepared_transactions')").fetchone()
    if setting != "0":
        pytest.skip("the shared test server allows prepared transactions (SQLQUEUE_TEST_PREPARED_SLOTS)")
    q, plain = streamed_queue(pg, names("Sales")), pg.create_queue(names("Billing"))
    [advice] = [f for f in doctor(pg, q, plain) if f["table"] == "(server)" and "max_prepared" in f["finding"]]
    assert advice["level"] == "info"
    text = advice["finding"]
    assert text.startswith("max_prepared_transactions is 0: every claim is held in the claim table, so each message "
                           "received is written three times")
    assert "set max_prepared_transactions to at least 4 (4 per queue a stream reads" in text
    assert "restart the server" in text and "claimMode auto" in text and "a third of the WAL" in text
    # a queue no stream reads (no claim table) gets no advice: the default of `sqlqueue doctor` stays quiet
    assert not [f for f in doctor(pg, plain) if "max_prepared" in f["finding"]]
