"""Claims held by prepared transactions (`claimMode`): exactly once, written once, bounded in time.

A server of this module's own allows prepared transactions (the test session's shared one does not,
so the rest of the suite runs the claim table's form): every test here reads with claimMode
`prepared` or `auto` on it, and checks what the claim table form cannot show: the claim table is
never written while claims are prepared, no prepared transaction outlives its bound, a crash of the
driver or of the server itself with prepared claims outstanding loses and duplicates nothing, and
NServiceBus's own receive competing on the same queue never gets a message the stream got.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, nsb_headers, prepared_slots, server_of_its_own
from processes import START, Job, run_to_end, wait_for

pytestmark = pytest.mark.db  # a server of its own (prepared transactions on)

CHILD = Path(__file__).with_name("crash_child.py")


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield from server_of_its_own(max_prepared_transactions="16")


@pytest.fixture(scope="module")
def ppg(server: Any) -> Backend:
    return Backend(server.url)


def prepared_now(pg: Backend, queue: str | None = None) -> list[tuple[str, float]]:
    """(gid, age in seconds) of the server's prepared transactions (on `queue`'s claim table)."""
    with pg.connect() as c:
        found = [(str(g), float(a)) for g, a in c.execute(
            "SELECT gid, extract(epoch FROM clock_timestamp() - prepared)::float8 FROM pg_prepared_xacts")]
        if queue is None:
            return found
        (oid,) = c.execute("SELECT to_regclass(%s)::oid::text", (pg.claims(queue),)).fetchone()
    return [(gid, age) for gid, age in found if gid.startswith(f"sqlqueue:{oid}:")]


def horizon_held(pg: Backend, xids: int = 50) -> bool:
    """Whether something holds the cluster's xmin horizon (what vacuum may clean up to) back: `xids`
    transactions are run, one at a time, and the horizon then lags the next xid by at least as many
    only if an older transaction (a prepared claim) is still open. Prints the lag and the
    database's age(datfrozenxid)."""
    with pg.connect() as c:
        for _ in range(xids):
            c.execute("SELECT pg_current_xact_id()")
        lag, frozen = c.execute(
            "SELECT pg_current_xact_id()::text::bigint - pg_snapshot_xmin(pg_current_snapshot())::text::bigint,"
            " age(datfrozenxid) FROM pg_catalog.pg_database WHERE datname = current_database()").fetchone()
    print(f"xmin horizon {lag} xid(s) behind, age(datfrozenxid) {frozen}")
    return int(lag) >= xids


def inserted(pg: Backend, table: str) -> int:
    """Rows ever inserted into `table` (the statistics collector's count, flushed first)."""
    with pg.connect() as c:
        c.execute("SELECT pg_stat_force_next_flush()")
        row = c.execute("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = to_regclass(%s)", (table,)).fetchone()
        return int(row[0]) if row else 0


def reader(spark: Any, pg: Backend, queue: str, error: str, **options: str) -> Any:
    r = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", queue)
         .option("errorQueue", error).option("claimMode", "prepared"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


class Collect:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [r.message_id for r in df.select("message_id").collect()]
        with self.lock:
            self.ids.extend(rows)


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.compat
def test_prepared_claims_deliver_once_and_never_write_the_claim_table(
        spark: Any, ppg: Backend, names: Any, tmp_path: Path) -> None:
    q, e = ppg.create_queue(names("Sales")), ppg.create_queue(names("error"))
    claims = ppg.claims(q)
    good = [f"m{i:04d}" for i in range(300)]
    ppg.send_many(q, [(nsb_headers(m), b'{"n": 1}') for m in good[:150]])
    ppg.send_many(q, [("<corrupted headers", b"p1"), ('{"a": 1}', b"p2")])  # poison: raw to the error queue
    ppg.send_many(q, [(nsb_headers(m), b'{"n": 1}') for m in good[150:]])
    with ppg.connect() as c:  # two expired messages: dropped, never delivered
        c.execute(f"INSERT INTO {ppg.q(q)} (id, expires, headers, body) SELECT gen_random_uuid(),"
                  " (now() AT TIME ZONE 'UTC') - interval '1 minute', %s, ''::bytea FROM generate_series(1, 2)",
                  ('{"NServiceBus.MessageId": "expired"}',))
    sink = Collect()
    query = (reader(spark, ppg, q, e, maxMessagesPerTrigger="100").writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start())
    try:
        _wait(lambda: len(sink.ids) >= len(good), 120, "every message")
        assert sorted(sink.ids) == good  # once each, poison and expired never
        # the last batch is acknowledged while the stream idles (COMMIT PREPARED), the poison with it
        # (on Spark 4.0/4.1 the first batch took all)
        _wait(lambda: prepared_now(ppg, q) == [] and ppg.count(q) == 0 and ppg.count(e) == 2, 10,
              "the last batch acknowledged")
    finally:
        query.stop()
    # the next run delivers nothing again; the claim table is never written
    again = Collect()
    query = (reader(spark, ppg, q, e, preparedClaimTimeout="4s").writeStream.foreachBatch(again)
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start())
    try:
        ppg.send_many(q, [(nsb_headers("late"), b"{}")])
        _wait(lambda: "late" in again.ids, 60, "the late message")
        assert inserted(ppg, claims) == 0  # claims held by prepared transactions only
    finally:
        query.stop()
    assert again.ids == ["late"]
    # a stopped stream leaves nothing prepared: the stream's warden acknowledges what Spark committed
    # and parks the rest once its source process is gone (Spark ends it without stop())
    _wait(lambda: prepared_now(ppg, q) == [], 5, "the stopped stream's claims finished")
    assert ppg.count(q) == 0 and ppg.count(e) == 2 and ppg.count(claims) <= 1


def test_a_stopped_stream_leaves_nothing_prepared_within_5_seconds(
        spark: Any, ppg: Backend, names: Any, tmp_path: Path) -> None:
    """`query.stop()` in a process that goes on (a notebook) right after a batch, before Spark said
    it was committed: within 5 s nothing is prepared any more and DDL on the queue goes through at
    the first try with a lock_timeout of 5 s. (Before: 35 s, until the bound's warden.)"""
    q, e = ppg.create_queue(names("Sales")), ppg.create_queue(names("error"))
    ppg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(20)])
    sink = Collect()
    query = (reader(spark, ppg, q, e, preparedClaimTimeout="30s").writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="60 seconds").start())
    try:
        _wait(lambda: len(sink.ids) == 20, 120, "the messages")
        assert prepared_now(ppg, q), "the batch is held by a prepared claim until Spark commits it"
    finally:
        query.stop()
    stopped = time.monotonic()
    _wait(lambda: prepared_now(ppg, q) == [], 5, "no prepared claim 5 s after stop()")
    print(f"nothing prepared {time.monotonic() - stopped:.1f} s after stop()")
    with ppg.connect() as c:
        c.execute("SET lock_timeout = '5s'")
        c.execute(f"ALTER TABLE {ppg.q(q)} ADD COLUMN IF NOT EXISTS probe integer")
        c.execute(f"ALTER TABLE {ppg.q(q)} DROP COLUMN probe")
    assert ppg.count(q) + ppg.count(ppg.claims(q)) == 20, "parked or acknowledged, none lost"


def test_no_prepared_claim_outlives_its_bound(spark: Any, ppg: Backend, names: Any, tmp_path: Path) -> None:
    """A batch stuck in the sink (Spark plans nothing meanwhile): past `preparedClaimTimeout` its
    claim moves into the claim table, so vacuum is never held back longer than the bound."""
    q, e = ppg.create_queue(names("Sales")), ppg.create_queue(names("error"))
    claims = ppg.claims(q)
    ppg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(50)])
    ids: list[str] = []

    def slow(df: Any, batch_id: int) -> None:
        ids.extend(r.message_id for r in df.select("message_id").collect())
        time.sleep(8)

    query = (reader(spark, ppg, q, e, preparedClaimTimeout="3s").writeStream.foreachBatch(slow)
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start())
    oldest, seen = 0.0, 0
    try:
        _wait(lambda: len(ids) == 50, 60, "the messages")
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            ages = [age for _, age in prepared_now(ppg, q)]
            oldest, seen = max([oldest, *ages]), seen + len(ages)
            time.sleep(0.2)
        # without this, a silent fallback to the claim table (no prepared claim at all) would pass
        assert seen, "the batch was never held in a prepared transaction"
        assert prepared_now(ppg, q) == [] and ppg.count(claims) == 50  # parked, the batch still in the sink
        assert not horizon_held(ppg), "parked: nothing holds vacuum back"
        _wait(lambda: ppg.count(claims) == 0, 30, "the parked batch acknowledged once the sink is done")
    finally:
        query.stop()
    assert oldest <= 3.0 + 1.5, f"a prepared claim lived {oldest:.1f}s, over its 3s bound"
    assert sorted(ids) == sorted(f"m{i}" for i in range(50))


def test_nservicebus_competing_with_a_prepared_stream_gets_other_messages(
        spark: Any, ppg: Backend, names: Any, tmp_path: Path) -> None:
    """A raw NServiceBus receive (its own SQL, FOR UPDATE SKIP LOCKED) on the same queue skips
    the rows a prepared claim holds, as it skips locked ones: 0 duplicates, 0 lost."""
    q, e = ppg.create_queue(names("Sales")), ppg.create_queue(names("error"))
    n = 4000
    ppg.send_many(q, [(nsb_headers(f"m{i:05d}"), b"{}") for i in range(n)])
    stream = Collect()
    theirs: list[str] = []
    stop = threading.Event()

    def nservicebus() -> None:
        from spark_qtransport.wire import decode_headers

        with ppg.connect(autocommit=False) as conn:
            while not stop.is_set():
                row = ppg.receive_one(q, conn)
                conn.commit()
                if row is None:
                    time.sleep(0.01)
                    continue
                theirs.append(decode_headers(row[2])["NServiceBus.MessageId"])

    thread = threading.Thread(target=nservicebus)
    query = (reader(spark, ppg, q, e, maxMessagesPerTrigger="200").writeStream.foreachBatch(stream)
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="100 milliseconds").start())
    try:
        _wait(lambda: bool(stream.ids), 60, "the stream's first batch")  # then NServiceBus competes
        thread.start()
        _wait(lambda: len(stream.ids) + len(theirs) >= n, 120, "every message by one of them")
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(30)
        query.stop()
    assert len(set(stream.ids) & set(theirs)) == 0
    assert sorted(stream.ids + theirs) == [f"m{i:05d}" for i in range(n)]
    assert stream.ids and theirs  # both received


def test_claim_mode_is_decided_once_and_says_why(pg: Backend, ppg: Backend, names: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """auto: prepared where the server has room, else the claim table with one INFO line naming
    the setting; prepared where the server allows none: an error naming the option and the setting."""
    from spark_qtransport.errors import ConfigError
    from spark_qtransport.transport.receiving.receiver import Receiver
    from spark_qtransport.transport.settings import ReceiveSettings

    def mode(backend: Backend, **values: Any) -> bool:
        q, e = backend.create_queue(names("Sales")), backend.create_queue(names("error"))
        r = Receiver(ReceiveSettings.create(backend.url, q, error_queue=e, **values))
        try:
            r.initial_offset()
            return r.endpoint.mode.prepares
        finally:
            r.close()

    caplog.set_level(logging.INFO, "spark_qtransport")
    assert mode(ppg) is True
    assert mode(ppg, claim_mode="table") is False
    if not prepared_slots():  # the suite's server: max_prepared_transactions 0
        assert mode(pg) is False
        assert any("max_prepared_transactions" in r.getMessage() and "claim table" in r.getMessage()
                   for r in caplog.records)
        with pytest.raises(ConfigError, match="^claim_mode: prepared: .*max_prepared_transactions"):
            mode(pg, claim_mode="prepared")
    audit = ppg.create_queue(names("audit"))
    assert mode(ppg, audit_queue=ppg.dialect.parse_address(audit), claim_mode="prepared") is True  # written before the commit


@pytest.mark.slow(reason="job processes SIGKILLed with prepared claims outstanding, the server crashed")
def test_sigkill_and_a_server_crash_with_prepared_claims_outstanding(
        server: Any, ppg: Backend, names: Any, tmp_path: Path) -> None:
    """SIGKILL of the driver while a claim is prepared, after the sink's commit and before COMMIT
    PREPARED; then the database server itself stopped at once
    (`pg_ctl -m immediate`) with prepared claims outstanding: 0 lost, 0 duplicated, FIFO kept."""
    q, e = ppg.create_queue(names("Orders")), ppg.create_queue(names("error"))
    sink = names("sink")
    with ppg.connect() as c:
        c.execute(f'CREATE TABLE "{sink}" (message_id text PRIMARY KEY, batch_id bigint)')
        c.execute(f'CREATE TABLE "{sink}_log" (message_id text, batch_id bigint, n bigserial)')
    checkpoint, markers, log = tmp_path / "ckpt", tmp_path / "markers", tmp_path / "job.log"
    markers.mkdir()
    url = ppg.url + "?options=-c%20client_connection_check_interval%3D200"
    args = [url, q, e, str(checkpoint), sink, str(markers)]
    # a long bound, and every kill takes the stream's warden too (a lost machine): the claims stay
    # prepared across the kills
    env = {"CRASH_CLAIM_MODE": "prepared", "CRASH_PREPARED_TIMEOUT": "1h"}
    sent = 0

    def produce(n: int) -> None:
        nonlocal sent
        ppg.send_many(q, [(nsb_headers(f"m{sent + i:06d}"), b'{"n": 1}') for i in range(n)])
        sent += n

    def delivered() -> int:
        with ppg.connect() as c:
            return int(c.execute(f'SELECT count(*) FROM "{sink}"').fetchone()[0])

    def ours_prepared() -> bool:
        return bool(prepared_now(ppg, q))

    produce(1500)
    kills = []
    # 1. the moment a claim is prepared (Spark may or may not have logged its offsets)
    job = Job(CHILD, args, log=log, env=env)
    wait_for(lambda: delivered() > 0 and ours_prepared(), START, "a prepared claim", job)
    job.kill(with_warden=True)
    kills.append("claim prepared")
    # (a kill during the executors' read of a prepared claim: the next test)
    # 2. after the sink committed, before the acknowledgement's COMMIT PREPARED
    produce(500)
    job = Job(CHILD, args, "after_sink", log=log, env=env)
    wait_for(lambda: (markers / "after_sink").exists(), START, "a written batch", job)
    assert ours_prepared()
    job.kill(with_warden=True)  # a lost machine: nothing finishes the claims
    kills.append("after sink, before COMMIT PREPARED")
    # 3. the server, immediately, with prepared claims outstanding (they survive it)
    assert ours_prepared()
    server.crash()
    server.start()
    assert ours_prepared()
    kills.append("server immediate stop")
    produce(300)
    run_to_end(CHILD, args, log=log, env=env)

    with ppg.connect() as c:
        ids = [r[0] for r in c.execute(f'SELECT message_id FROM "{sink}" ORDER BY message_id')]
        firsts = [r[0] for r in c.execute(
            f'SELECT message_id FROM "{sink}_log" GROUP BY message_id ORDER BY min(n)')]
    assert len(kills) == 3
    assert ids == [f"m{i:06d}" for i in range(sent)], "every message reached the sink exactly once"
    assert firsts == sorted(firsts), "first deliveries in queue order"
    assert ppg.count(q) == 0 and ppg.count(e) == 0
    assert not ours_prepared(), "a finished run leaves no prepared claim"


@pytest.mark.slow(reason="a job process SIGKILLed, its claims parked by the warden after the bound")
def test_a_killed_driver_leaves_no_prepared_claim_past_its_bound(ppg: Backend, names: Any, tmp_path: Path) -> None:
    """SIGKILL of every process of the job with claims prepared: the stream's warden (a process of
    its own, outside the job) parks them within the bound; the next run delivers them, once."""
    q, e = ppg.create_queue(names("Orders")), ppg.create_queue(names("error"))
    sink = names("sink")
    with ppg.connect() as c:
        c.execute(f'CREATE TABLE "{sink}" (message_id text PRIMARY KEY, batch_id bigint)')
        c.execute(f'CREATE TABLE "{sink}_log" (message_id text, batch_id bigint)')
    markers, log = tmp_path / "markers", tmp_path / "job.log"
    markers.mkdir()
    args = [ppg.url, q, e, str(tmp_path / "ckpt"), sink, str(markers)]
    env = {"CRASH_CLAIM_MODE": "prepared", "CRASH_PREPARED_TIMEOUT": "20s"}
    # A first batch starts the job's Python workers: the claims the test kills are then read within
    # seconds of their PREPARE, not after a loaded machine's worker start (which took over the 20 s
    # bound once, and the claims were parked before the kill).
    ppg.send_many(q, [(nsb_headers("warm"), b"{}")])
    job = Job(CHILD, args, "during_read", log=log, env=env)
    wait_for(lambda: (markers / "batch-0").exists(), START, "the first batch", job)
    ppg.send_many(q, [(nsb_headers(f"m{i:04d}"), b"{}") for i in range(1000)])
    wait_for(lambda: (markers / "during_read").exists(), START, "a read in progress", job)
    assert prepared_now(ppg, q)
    job.kill()
    # the warden may park the claims at their bound while this looks (on a loaded machine the read
    # began late in it): a horizon not held is wrong only while the claims are still prepared
    held = horizon_held(ppg)
    assert held or not prepared_now(ppg, q), "the killed job's prepared claims hold the xmin horizon"
    oldest, deadline = 0.0, time.monotonic() + 25
    while time.monotonic() < deadline and prepared_now(ppg, q):
        oldest = max([oldest, *(age for _, age in prepared_now(ppg, q))])
        time.sleep(0.2)
    assert prepared_now(ppg, q) == [], "the warden parked the killed job's claims"
    assert not horizon_held(ppg), "parked: nothing holds vacuum back"
    assert oldest <= 20.0 + 2.0, f"a prepared claim lived {oldest:.1f}s, over its 20s bound"
    assert ppg.count(ppg.claims(q)) > 0
    run_to_end(CHILD, args, log=log, env=env)
    with ppg.connect() as c:
        ids = [r[0] for r in c.execute(f'SELECT message_id FROM "{sink}" ORDER BY message_id')]
    assert ids == [f"m{i:04d}" for i in range(1000)] + ["warm"]
    assert ppg.count(q) == 0 and prepared_now(ppg, q) == []


def test_a_prepared_claim_reads_exactly_its_own_rows(ppg: Backend, names: Any) -> None:
    """Within a claim's sequence range, rows another consumer held while it claimed (NServiceBus's
    receive, locked) are not its rows, whether that consumer then deletes them or rolls back: the
    read selects by the claim's transaction, not by the range alone."""
    import psycopg

    from spark_qtransport.dialects import ClaimNumbering
    from spark_qtransport.transport.receiving.claimer import pick
    from spark_qtransport.transport.receiving.prepared import NUMBER_BASE, PreparedClaim, commit, consumer_token

    d = ppg.dialect
    q, e = ppg.create_queue(names("Sales")), ppg.create_queue(names("error"))
    queue, error = d.parse_address(q), d.parse_address(e)
    claims = d.claims_table(queue)
    with ppg.connect() as c:
        for stmt in d.create_claims(claims):
            c.execute(stmt.sql, stmt.params)
    ppg.send_many(q, [(nsb_headers(f"m{i:02d}"), b"x") for i in range(20)])
    other = psycopg.connect(ppg.url)  # NServiceBus's receive holds three rows in the middle
    held = [r[0] for r in other.execute(
        f"SELECT seq FROM {ppg.q(q)} WHERE seq IN (SELECT seq FROM {ppg.q(q)} ORDER BY seq OFFSET 5 LIMIT 3)"
        " ORDER BY seq FOR UPDATE").fetchall()]
    with psycopg.connect(ppg.url) as conn:
        cur = conn.cursor()
        first = NUMBER_BASE + 1
        picked = pick(d, cur, queue, after=0, upto=None, limit=100)
        assert len(picked.seqs) == 17 and not picked.poison and not picked.special
        for stmt in d.claim(queue, claims, error, consumer="Sales", limit=100, after=0, upto=None,
                            numbering=ClaimNumbering(first, prepared=True, picked=picked)):
            cur.execute(stmt.sql, stmt.params)
        row = dict(zip([col[0] for col in cur.description], cur.fetchone(), strict=True))
        assert row["claimed"] == 17 and row["tabled"] == 0, row
        claim = PreparedClaim("1", first, int(row["max_claim"]), int(row["low_source"]), int(row["max_source"]),
                              str(row["claimed_at"]), consumer_token("Sales"), str(row["xid"]))
        cur.execute(d.prepare(claim.gid).sql)
    other.rollback()  # the held rows are back in the queue, their xmax still the other transaction's
    with psycopg.connect(ppg.url) as reader:
        stmt = d.read_prepared(queue, xid=claim.xid, shift=claim.shift, after=claim.first - 1, upto=claim.last,
                               claimed_at=claim.claimed_at)
        rows = reader.execute(stmt.sql, stmt.params).fetchall()
        assert [r[5] for r in rows] == [s for s in range(held[0] - 5, held[0] + 15) if s not in held]
        assert [r[0] - claim.shift for r in rows] == [r[5] for r in rows]  # numbered by sequence
        commit(reader, _endpoint(ppg, queue, claims), claim)
    assert ppg.count(q) == 3  # the rows the other consumer let go, still waiting
    other.close()
    with pytest.raises(ValueError, match="gid"):
        d.prepare("x'; DROP TABLE y; --")


def test_a_claim_taken_in_one_pass_reads_exactly_its_own_rows_and_rolls_back_for_poison(
        ppg: Backend, names: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prepared claim of plain messages deletes its rows in the pass that reads their headers
    (`ReceiveSql.take`), no pick first: it reads exactly them (not the rows another consumer held
    in its range, not the expired ones) and writes no claim table. A poison row among them rolls
    the pass back, and the claim is picked and made whole: the poison goes to the error queue once,
    the rest is delivered, nothing lost."""
    import psycopg

    from spark_qtransport.dialects.postgres import PostgresDialect
    from spark_qtransport.transport.receiving.receiver import Receiver, read_slice
    from spark_qtransport.transport.settings import ReceiveSettings

    calls: list[str] = []
    for name in ("take", "pick", "claim"):
        made = getattr(PostgresDialect, name)
        monkeypatch.setattr(PostgresDialect, name,
                            lambda self, *a, _n=name, _m=made, **k: calls.append(_n) or _m(self, *a, **k))
    q, e = ppg.create_queue(names("Sales")), ppg.create_queue(names("error"))
    ppg.send_many(q, [(nsb_headers(f"m{i:02d}"), b"x") for i in range(12)])
    with ppg.connect() as c:  # two messages expired before they were received
        c.execute(f"UPDATE {ppg.q(q)} SET expires = now() AT TIME ZONE 'UTC' - interval '1 minute'"
                  f" WHERE seq IN (SELECT seq FROM {ppg.q(q)} ORDER BY seq OFFSET 2 LIMIT 2)")
    other = psycopg.connect(ppg.url)  # NServiceBus's receive holds three rows in the middle
    assert len(other.execute(
        f"SELECT seq FROM {ppg.q(q)} WHERE seq IN (SELECT seq FROM {ppg.q(q)} ORDER BY seq OFFSET 6 LIMIT 3)"
        " ORDER BY seq FOR UPDATE").fetchall()) == 3
    r = Receiver(ReceiveSettings.create(ppg.url, q, error_queue=e, claim_ahead=False, claim_mode="prepared"))
    try:
        start = r.initial_offset()
        end = r.latest(start, 100)
        assert "take" in calls and "pick" not in calls and "claim" not in calls, calls
        assert len(prepared_now(ppg, q)) == 1 and inserted(ppg, ppg.claims(q)) == 0
        other.rollback()  # the held rows are back in the queue, never the claim's
        rows = [row for part in r.slices(start, end) for row in read_slice(part)]
        assert [row.message_id for row in rows] == [f"m{i:02d}" for i in (0, 1, 4, 5, 9, 10, 11)]
        r.ack(end)
        assert ppg.count(q) == 3 and prepared_now(ppg, q) == []
        calls.clear()
        ppg.send_many(q, [("<corrupted headers", b"p"), (nsb_headers("m12"), b"x")])
        start, end = end, r.latest(end, 100)
        assert calls[:3] == ["take", "pick", "claim"], calls  # rolled back, then picked and claimed
        rows = [row for part in r.slices(start, end) for row in read_slice(part)]
        assert sorted(row.message_id for row in rows) == ["m06", "m07", "m08", "m12"]
        r.ack(end)
    finally:
        r.close()
        other.close()
    assert ppg.count(q) == 0 and prepared_now(ppg, q) == [] and ppg.count(e) == 1
    assert ppg.rows(e)[0][1] == "<corrupted headers"


def _endpoint(pg: Backend, queue: Any, claims: Any) -> Any:
    from spark_qtransport.transport.receiving.setup import Endpoint
    from spark_qtransport.transport.settings import ReceiveSettings

    o = ReceiveSettings.create(pg.url, pg.dialect.format_address(queue))
    return Endpoint(o, pg.dialect, claims)


def test_a_new_run_numbers_its_claims_above_the_last_runs_committed_ones(ppg: Backend, names: Any) -> None:
    """Spark 4.0/4.1 give a run's first batch no start, and the last run's claims may all be
    committed (nothing of them left on the server): the new run's claim numbers still lie above
    the checkpoint's, so Spark's commit of the checkpoint's last batch, which comes as the new run
    starts, cannot commit the new run's claim before its batch is read (it did: messages lost)."""
    from spark_qtransport.transport.receiving.planner import ClaimOffset
    from spark_qtransport.transport.receiving.receiver import Receiver, read_slice
    from spark_qtransport.transport.settings import ReceiveSettings

    q, e = ppg.create_queue(names("Sales")), ppg.create_queue(names("error"))
    settings = ReceiveSettings.create(ppg.url, q, error_queue=e, claim_ahead=False, claim_mode="prepared")

    def read(r: Receiver, start: ClaimOffset, end: ClaimOffset) -> list[Any]:
        return [row for part in r.slices(start, end) for row in read_slice(part)]

    ppg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(5)])
    r = Receiver(settings)
    try:
        last = r.first_batch(fresh=True)
        assert len(read(r, ClaimOffset(0, last.table), last)) == 5
        r.ack(last)  # the checkpoint's last batch, committed: no claim of that run is left
    finally:
        r.close()
    assert prepared_now(ppg, q) == [] and ppg.count(q) == 0
    ppg.send_many(q, [(nsb_headers(f"late{i}"), b"{}") for i in range(2)])
    r = Receiver(settings)  # a new run, as on Spark 4.0: the first batch is planned without a start
    try:
        new = r.first_batch(fresh=False)
        assert new.claim > last.claim, "the new run's claim numbers lie above the checkpoint's"
        r.ack(last)  # Spark's commit of the checkpoint's last batch, at the new run's start
        assert len(prepared_now(ppg, q)) == 1 and ppg.unheld(q) == 0, "the new claim is still held"
        assert len(read(r, last, new)) == 2
        r.ack(new)
    finally:
        r.close()
    assert ppg.count(q) == 0 and prepared_now(ppg, q) == []


def test_a_parked_claim_keeps_its_messages_and_sends_its_poison_once(ppg: Backend, names: Any) -> None:
    """A prepared claim judged its poison on the driver and moved it to the error queue; parking
    the claim (its bound passed) copies exactly the rest into the claim table, by the same rule, and
    a batch planned over it reads them from there: nothing lost, no second error copy."""
    from spark_qtransport.transport.receiving.planner import ClaimOffset
    from spark_qtransport.transport.receiving.receiver import Receiver, read_slice
    from spark_qtransport.transport.settings import ReceiveSettings

    q, e = ppg.create_queue(names("Sales")), ppg.create_queue(names("error"))
    hostile = ['{"a": 1}', "<corrupted headers", '{"a": {"b": "c"}}', '{"x": "\\ud800"}', " "]
    ppg.send_many(q, [(nsb_headers(f"m{i}"), b"{}") for i in range(3)] + [(h, b"p") for h in hostile]
                  + [(nsb_headers(f"m{i}"), b"{}") for i in range(3, 6)] + [("", b"empty")])
    r = Receiver(ReceiveSettings.create(ppg.url, q, error_queue=e, claim_ahead=False, claim_mode="prepared"))
    try:
        end = r.first_batch(fresh=True)
        assert ppg.count(e) == 0 and len(prepared_now(ppg, q)) == 1  # the poison moves with the claim's commit
        assert r.acker.park(r.main, older_than=None) == 1
        assert prepared_now(ppg, q) == [] and ppg.count(ppg.claims(q)) == 7  # six messages and the empty one
        assert ppg.count(e) == len(hostile)
        rows = [row for part in r.slices(ClaimOffset(0, end.table), end) for row in read_slice(part)]
        assert [row.message_id for row in rows][:6] == [f"m{i}" for i in range(6)] and len(rows) == 7
        r.ack(end)
    finally:
        r.close()
    assert ppg.count(q) == 0 and ppg.count(ppg.claims(q)) == 0 and ppg.count(e) == len(hostile)


def test_audit_and_forward_copies_of_prepared_claims_are_written_once_however_the_acknowledgement_is_cut(
        ppg: Backend, names: Any) -> None:
    """A prepared claim's COMMIT PREPARED cannot carry the audit and forwardTo copies: they are
    written before it, a chunk a transaction, each noting how far the claim's copies got. An
    acknowledgement cut short after some chunks goes on from there; a claim parked then copies only
    the rest into the claim table (whose acknowledgement copies them); a claim whose copies are all
    written is committed and copies nothing. Each message is copied once, the one the sink failed
    never, and nothing of the bookkeeping stays in the claim table."""
    import psycopg

    from spark_qtransport.transport import settled
    from spark_qtransport.transport.receiving.receiver import Receiver, read_slice
    from spark_qtransport.transport.settings import ReceiveSettings
    from spark_qtransport.wire import H

    d = ppg.dialect
    q, e, audit, fwd = (ppg.create_queue(names(n)) for n in ("Sales", "error", "audit", "Copies"))
    settings = ReceiveSettings.create(ppg.url, q, error_queue=e, claim_ahead=False, claim_mode="prepared",
                                      audit_queue=d.parse_address(audit), forward_to=d.parse_address(fwd), ack_batch=2)
    r = Receiver(settings)

    def batch(ids: list[str], start: Any) -> tuple[Any, Any, dict[str, int]]:
        ppg.send_many(q, [(nsb_headers(m), f"body {m}".encode()) for m in ids])
        end = r.latest(start, None)
        rows = [row for part in r.slices(start, end) for row in read_slice(part)]
        assert sorted(row.message_id for row in rows) == sorted(ids)
        [claim] = r.planner.ledger.prepared()
        return end, claim, {row.message_id: row.claim_seq for row in rows}

    def chunks(claim: Any, upto: int) -> None:
        """The acknowledgement's chunks up to number `upto`, each committed, as the acker runs them;
        then the driver 'dies' (nothing commits the claim)."""
        with psycopg.connect(ppg.url) as c:
            done = claim.first - 1
            while done < upto:
                done = r.acker.chunks.held(c.cursor(), claim, after=done, batch=2).last
                c.commit()

    def copied(table: str) -> list[str]:
        return sorted(h[H.MESSAGE_ID] for h, _ in ppg.drain(table))

    try:
        # cut after the first chunk, then acknowledged: it goes on from the second
        end, claim, numbers = batch([f"a{i}" for i in range(7)], r.initial_offset())
        with ppg.connect() as c:  # the sink failed a1 (its dispatch marks the claim, before Spark commits)
            stmt = settled.note_failed(d, ppg.dialect.parse_address(ppg.claims(q)), [numbers["a1"]])
            assert c.execute(stmt.sql, stmt.params).rowcount == 1
        chunks(claim, claim.first + 1)
        assert len(ppg.rows(audit)) == 1  # a0; a1 failed
        r.ack(end)
        assert prepared_now(ppg, q) == [] and ppg.count(q) == 0
        audited = ppg.drain(audit)
        assert sorted(h[H.MESSAGE_ID] for h, _ in audited) == ["a0", *(f"a{i}" for i in range(2, 7))]
        assert all(body == f"body {h[H.MESSAGE_ID]}".encode() and H.PROCESSING_ENDED in h for h, body in audited)
        assert copied(fwd) == ["a0", *(f"a{i}" for i in range(2, 7))]
        assert ppg.count(ppg.claims(q)) == 0  # no progress record
        assert ppg.count(d.format_address(d.failed_table()), f"WHERE table_id = '{r.table_id}'") == 0  # mark taken

        # cut after the first chunk, then parked (its bound passed): the claim table gets the rest
        end2, claim, numbers = batch([f"b{i}" for i in range(5)], end)
        chunks(claim, claim.first + 1)
        assert r.acker.park(r.main, older_than=None) == 1
        assert prepared_now(ppg, q) == [] and ppg.count(ppg.claims(q)) == 3
        r.ack(end2)
        assert copied(audit) == copied(fwd) == [f"b{i}" for i in range(5)]

        # every copy written, the COMMIT PREPARED never made: parking copies nothing, acknowledging neither
        end3, claim, _ = batch(["c0", "c1", "c2"], end2)
        chunks(claim, claim.last)
        assert copied(audit) == ["c0", "c1", "c2"]
        assert r.acker.park(r.main, older_than=None) == 1
        assert ppg.count(ppg.claims(q)) == 0
        r.ack(end3)
        assert ppg.count(audit) == ppg.count(ppg.claims(q)) == 0 and copied(fwd) == ["c0", "c1", "c2"]
    finally:
        r.close()
    assert ppg.count(q) == 0 and prepared_now(ppg, q) == [] and ppg.count(e) == 0


def test_a_prepared_stream_audits_and_forwards_only_what_succeeded_once(
        spark: Any, ppg: Backend, names: Any, tmp_path: Path) -> None:
    """Through Spark, claims held by prepared transactions: a QueueSink fails three messages (the
    sink notes their prepared claims failed), the rest go on; each other message is audited and
    forwarded once, the failed ones never, and nothing stays claimed, noted or prepared."""
    from pyspark.sql import functions as F

    from spark_qtransport import QueueSink, fail
    from spark_qtransport.wire import H

    q, e, audit, fwd, billing = (ppg.create_queue(names(n)) for n in ("Sales", "error", "audit", "Copies", "Billing"))
    ids = [f"o{i:02d}" for i in range(40)]
    rejected = ["o03", "o17", "o30"]
    ppg.send_many(q, [(nsb_headers(m), m.encode()) for m in ids])
    sink = QueueSink(url=ppg.url, endpoint=q, errorQueue=e)

    def handle(batch: Any, batch_id: int) -> None:
        bad = F.col("message_id").isin(*rejected)
        sink(batch.where(~bad).select("body", F.lit(billing).alias("destination"), F.lit("Billing.Invoice").alias("message_type"))
             .unionByName(batch.where(bad).select(*fail(reason="no lines")), allowMissingColumns=True), batch_id)

    query = (reader(spark, ppg, q, e, maxMessagesPerTrigger="10", auditQueue=audit, forwardTo=fwd)
             .writeStream.foreachBatch(handle).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert not query.isActive and query.exception() is None, query.exception()
    succeeded = [m for m in ids if m not in rejected]
    audited = ppg.drain(audit)
    assert sorted(h[H.MESSAGE_ID] for h, _ in audited) == succeeded
    assert all(body == h[H.MESSAGE_ID].encode() and h[H.PROCESSING_ENDPOINT] == q for h, body in audited)
    assert sorted(h[H.MESSAGE_ID] for h, _ in ppg.drain(fwd)) == succeeded
    assert sorted(h[H.MESSAGE_ID] for h, _ in ppg.drain(e)) == rejected
    assert ppg.count(billing) == len(succeeded)
    assert ppg.count(q) == 0 and ppg.count(ppg.claims(q)) == 0 and prepared_now(ppg, q) == []


@pytest.mark.parametrize("with_poison", [False, True], ids=["appended", "decoded"])
def test_audit_headers_of_prepared_claims_are_nservicebus_audit_headers(
        ppg: Backend, names: Any, with_poison: bool) -> None:
    """A prepared claim without poison has NServiceBus's audit headers appended to each copy's
    headers text unparsed (`with_audit`); one with poison has them decoded and built. Either way each copy's
    headers are the message's own with NServiceBus's audit headers added, or replaced where the
    message named them already (once in the text), whatever the text's spacing; the poison is never
    audited."""
    import json

    from spark_qtransport.transport.receiving.receiver import Receiver, read_slice
    from spark_qtransport.transport.settings import ReceiveSettings
    from spark_qtransport.wire import H, parse_time

    d = ppg.dialect
    q, e, audit = (ppg.create_queue(names(n)) for n in ("Sales", "error", "audit"))
    texts = {
        "plain": json.dumps(nsb_headers("plain")),
        "named": json.dumps({**nsb_headers("named"), H.PROCESSING_ENDPOINT: "Old", H.HOST_ID: "old-host"}),
        "spaced": ' { "NServiceBus.MessageId" : "spaced" , "Shop.Path": "a\\/b \\u00e9" }  \n',
        "bare": "{}",
        "spaced-bare": "{ \t}\r\n",
        "none": "",
        "unicode": json.dumps({"NServiceBus.MessageId": "unicode", "Shop.Note": "\u00e9\U0001f600"}, ensure_ascii=False),
    }
    messages = [(text, name.encode()) for name, text in texts.items()]
    if with_poison:
        messages.insert(3, ("<corrupted headers", b"poison"))
    ppg.send_many(q, messages)
    r = Receiver(ReceiveSettings.create(ppg.url, q, error_queue=e, claim_ahead=False, claim_mode="prepared",
                                        audit_queue=d.parse_address(audit)))
    try:
        start = r.initial_offset()
        end = r.latest(start, None)
        [claim] = r.planner.ledger.prepared()
        assert claim.clean is not with_poison
        assert len([row for part in r.slices(start, end) for row in read_slice(part)]) == len(texts)
        r.ack(end)
    finally:
        r.close()
    copies = {bytes(body).decode(): headers for _, headers, body in ppg.rows(audit)}
    assert sorted(copies) == sorted(texts)  # each once, the poison never
    for name, text in texts.items():
        got = json.loads(copies[name])
        own = json.loads(text) if text.strip() else {}
        assert {k: v for k, v in got.items() if k not in own or k in (H.PROCESSING_ENDPOINT, H.HOST_ID)} == {
            k: got[k] for k in (H.PROCESSING_STARTED, H.PROCESSING_ENDED, H.HOST_ID, H.HOST_DISPLAY_NAME,
                                H.PROCESSING_MACHINE, H.PROCESSING_ENDPOINT)}, name
        assert {k: v for k, v in got.items() if k in own and k not in (H.PROCESSING_ENDPOINT, H.HOST_ID)} == {
            k: v for k, v in own.items() if k not in (H.PROCESSING_ENDPOINT, H.HOST_ID)}, name
        assert got[H.PROCESSING_ENDPOINT] == q and got[H.HOST_ID] != "old-host", name
        assert copies[name].count(f'"{H.PROCESSING_ENDPOINT}"') == 1, copies[name]
        assert parse_time(got[H.PROCESSING_STARTED]) <= parse_time(got[H.PROCESSING_ENDED]), name
    assert [b for _, _, b in ppg.rows(e)] == ([b"poison"] if with_poison else [])


def test_the_marks_of_prepared_claims_go_with_their_commit_and_spare_another_consumers(ppg: Backend,
                                                                                         names: Any) -> None:
    """Prepared claims of two consumers of one queue, B's numbered below A's (B started first:
    our numbers are a stream's own band), each with a message its sink failed; no copies to make,
    so no chunk reads the marks. A's acknowledgement commits its claim and forgets the marks of
    its own numbers only; B's stays until B's acknowledgement takes it."""
    from spark_qtransport.transport import settled
    from spark_qtransport.transport.receiving.receiver import Receiver, read_slice
    from spark_qtransport.transport.settings import ReceiveSettings

    d = ppg.dialect
    q, e = (ppg.create_queue(names(n)) for n in ("Sales", "error"))

    def receiver(consumer: str) -> Receiver:
        return Receiver(ReceiveSettings.create(ppg.url, q, error_queue=e, claim_ahead=False, claim_mode="prepared",
                                               consumer=consumer))

    def batch(r: Receiver, ids: list[str]) -> tuple[Any, dict[str, int]]:
        ppg.send_many(q, [(nsb_headers(m), b"x") for m in ids])
        start = r.initial_offset()
        end = r.latest(start, None)
        return end, {row.message_id: row.claim_seq for part in r.slices(start, end) for row in read_slice(part)}

    def marks(r: Receiver) -> int:
        return ppg.count(d.format_address(d.failed_table()), f"WHERE table_id = '{r.table_id}'")

    def mark(seq: int) -> None:
        stmt = settled.note_failed(d, d.parse_address(ppg.claims(q)), [seq])
        with ppg.connect() as c:
            assert c.execute(stmt.sql, stmt.params).rowcount == 1

    b = receiver("B")
    a = receiver("A")
    try:
        b_end, b_rows = batch(b, ["b0", "b1"])
        a_end, a_rows = batch(a, ["a0", "a1"])
        assert max(b_rows.values()) < min(a_rows.values()) and len(prepared_now(ppg, q)) == 2
        mark(b_rows["b1"])
        mark(a_rows["a1"])
        a.ack(a_end)
        assert marks(a) == 1, "B's mark stays: its claim is held"
        b.ack(b_end)
        assert marks(b) == 0 and prepared_now(ppg, q) == [] and ppg.count(q) == 0
    finally:
        a.close()
        b.close()


def _drive(pg: Backend, q: str, e: str, mode: str, per_trigger: int) -> Any:
    """A one-queue stream over `q`, driven as Spark's driver drives it (no Spark)."""
    from spark_qtransport.options.parse import ReaderOptions
    from spark_qtransport.transport.receiving.queueset import QueueSet

    return QueueSet(ReaderOptions.stream({"url": pg.url, "queue": q, "errorQueue": e, "claimMode": mode,
                                          "maxMessagesPerTrigger": str(per_trigger)}))


def _trigger(qs: Any, end: Any, per_trigger: int) -> Any:
    nxt = qs.latest(end, per_trigger)
    qs.committed(end)  # the batch before is processed
    qs.sessions.background.drain()
    return nxt


@pytest.mark.parametrize("mode", ["prepared", "table"])
def test_rows_another_consumer_let_go_below_our_claims_are_claimed(ppg: Backend, names: Any, mode: str) -> None:
    """Rows a competing consumer held while we claimed around them, then released by rolling back,
    lie below our low-water mark, inside the range of a claim that did not take it whole: a scan
    from the queue head finds them."""
    import psycopg

    q, e = ppg.create_queue(names("LetGo")), ppg.create_queue(names("error"))
    ppg.send_many(q, [(nsb_headers(f"m{i:02d}"), b"x") for i in range(20)])
    other = psycopg.connect(ppg.url)  # NServiceBus's receive holds three rows in the middle
    other.execute(f"SELECT seq FROM {ppg.q(q)} WHERE seq IN (SELECT seq FROM {ppg.q(q)} ORDER BY seq OFFSET 5 LIMIT 3)"
                  " ORDER BY seq FOR UPDATE").fetchall()
    qs = _drive(ppg, q, e, mode, 100)
    try:
        end = _trigger(qs, qs.initial_offset(), 100)
        assert qs.claimed == 17
        other.rollback()
        for _ in range(3):
            end = _trigger(qs, end, 100)
        assert qs.claimed == 20 and ppg.count(q) == 0
    finally:
        other.close()
        qs.close()
