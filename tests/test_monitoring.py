"""ServicePulse monitoring reports (`transport.platform.monitoring`): the raw-metrics body read back
by a decoder written from the wire description (not the encoder), the reports a `Monitor` writes into
a real monitoring queue, the bound on what it keeps, and a dead database."""

from __future__ import annotations

import json
import logging
import random
import socket
import struct
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from backends import Backend
from spark_qtransport.errors import QueueNotFoundError
from spark_qtransport.options.registry import name_fields
from spark_qtransport.transport.platform.monitoring import (
    MAX_DELTA_TICKS,
    Monitor,
    encode_report,
    encode_reports,
    ticks,
)
from spark_qtransport.transport.platform.processed import Processed
from spark_qtransport.transport.settings import ReceiveSettings
from spark_qtransport.wire import decode_headers, host_id, machine

TYPES = ["Shop.Messages.OrderPlaced, Shop.Messages", "Shop.Messages.OrderBilled;Shop.Messages.IEvent", "Grüße.Bestellung"]
UTC = timezone.utc
EPOCH = datetime(1, 1, 1, tzinfo=UTC)


# -- a decoder written from the description of the format ----------------------------------------


def decode(body: bytes) -> list[tuple[datetime, str, int]]:
    """TaggedLongValueWriterOccurrence as described (little-endian): int64 version 1; int64 base
    ticks (100 ns since 0001-01-01 UTC); int32 tag count, per tag int32 id, int32 byte length,
    UTF-8 bytes; int32 entry count, per entry int32 tick delta, int32 tag id, int64 value.
    Returns (time, tag, value) per entry; the time rounded to microseconds."""
    version, base = struct.unpack_from("<qq", body, 0)
    assert version == 1
    at = 16
    (tag_count,) = struct.unpack_from("<i", body, at)
    at += 4
    tags: dict[int, str] = {}
    for _ in range(tag_count):
        tag_id, length = struct.unpack_from("<ii", body, at)
        at += 8
        tags[tag_id] = body[at:at + length].decode("utf-8")
        at += length
    (count,) = struct.unpack_from("<i", body, at)
    at += 4
    out = []
    for _ in range(count):
        delta, tag_id, value = struct.unpack_from("<iiq", body, at)
        at += 16
        assert delta >= 0
        out.append((EPOCH + timedelta(microseconds=(base + delta) // 10), tags[tag_id], value))
    assert at == len(body), "nothing after the entries"
    return out


def test_ticks_are_dotnet_ticks() -> None:
    # DateTime.UnixEpoch.Ticks
    assert ticks(datetime(1970, 1, 1, tzinfo=UTC)) == 621_355_968_000_000_000
    assert ticks(datetime(1970, 1, 1)) == 621_355_968_000_000_000  # naive is UTC
    assert ticks(datetime(1970, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == 621_355_968_000_000_000
    assert ticks(datetime(2020, 1, 1, 0, 0, 0, 1, tzinfo=UTC)) == 637_134_336_000_000_010


def test_encoded_reports_decode_by_the_description() -> None:
    rng = random.Random(7)
    start = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    moments = [start + timedelta(microseconds=rng.randrange(0, 900 * 10**6)) for _ in range(5000)]  # 15 minutes
    tags = [*TYPES, ""]
    entries = [(ticks(m), rng.choice(tags), rng.randrange(0, 2**40)) for m in moments]
    bodies = encode_reports(entries, per_report=2048)
    decoded = [e for b in bodies for e in decode(b)]
    assert sorted(decoded) == sorted((m, tag, v) for m, (_, tag, v) in zip(moments, entries, strict=True))
    # 15 minutes need at least 5 reports of at most ~214 s, each oldest first within its int32
    assert len(bodies) >= 5
    for body in bodies:
        times = [t for t, _, _ in decode(body)]
        assert times == sorted(times) and 0 < len(times) <= 2048
        assert ticks(times[-1]) - ticks(times[0]) <= MAX_DELTA_TICKS
    # one report: tags numbered from 1, only those used
    one = encode_report([(ticks(start), "B", 5), (ticks(start) + 10, "A", 6), (ticks(start) + 3, "B", 7)])
    assert struct.unpack_from("<qqiii", one, 0) == (1, ticks(start), 2, 1, 1)
    assert decode(one) == [(start, "B", 5), (start, "B", 7), (start + timedelta(microseconds=1), "A", 6)]
    assert decode(encode_report([])) == []
    with pytest.raises(ValueError, match="split them"):
        encode_report([(0, "A", 1), (MAX_DELTA_TICKS + 1, "A", 1)])


# -- a Monitor and a real monitoring queue ------------------------------------------------------


def processed(n: int, *, seed: int = 1, now: datetime | None = None) -> list[Processed]:
    """`n` acknowledged messages of the three types, in chunks sharing ProcessingEnded."""
    rng = random.Random(seed)
    now = now or datetime.now(UTC)
    out = []
    for i in range(n):
        ended = now - timedelta(seconds=(n - i) // 50)
        started = ended - timedelta(milliseconds=rng.randrange(0, 5000))
        sent = None if i % 7 == 0 else started - timedelta(milliseconds=rng.randrange(0, 60_000))
        out.append(Processed(TYPES[i % 3], started, ended, sent, rng.choice([0, 0, 0, 1, 2])))
    return out


def settings_for(url: str, queue: str, monitoring: str | None, **values: Any) -> ReceiveSettings:
    s = ReceiveSettings.create(url, queue, error_queue=queue + "_err", consumer="Shop.Sales", **values)
    if monitoring is None:
        return s
    return ReceiveSettings.create(url, queue, error_queue=queue + "_err", consumer="Shop.Sales",
                                  monitoring_queue=s.dialect.parse_address(monitoring), **values)


def read_reports(backend: Backend, queue: str) -> tuple[list[tuple[dict[str, Any], bytes, timedelta]], datetime]:
    """(headers, body, expires - now) of every row, and the database's UTC now."""
    now_sql = "now() AT TIME ZONE 'UTC'" if backend.name == "postgres" else "GETUTCDATE()"
    with backend.connect() as conn:
        cur = conn.cursor()
        cur.execute(f"SELECT headers, body, expires, {now_sql} FROM {backend.q(queue)}")
        rows = cur.fetchall()
    now = rows[0][3] if rows else datetime.now(UTC).replace(tzinfo=None)
    return [(decode_headers(h) or {}, bytes(b), e - now) for h, b, e, _ in rows], now


def test_monitor_writes_the_reports(backend: Backend, names: Any) -> None:
    queue, monitoring = names("sales"), backend.create_queue(names("monitoring"))
    settings = settings_for(backend.url, queue, monitoring, monitoring_interval=3600)
    monitor = Monitor(settings)
    items = processed(600)
    with backend.connect() as conn:
        monitor.check(conn.cursor())
    for at in range(0, len(items), 100):  # as acknowledgement chunks hand them over
        monitor.observe(items[at:at + 100])
    assert monitor.flush() is True
    monitor.close()
    reports, _ = read_reports(backend, monitoring)

    endpoint, host = "Shop.Sales", machine()
    ids = set()
    by_metric: dict[str, list[tuple[datetime, str, int]]] = {}
    metadata = []
    for headers, body, to_expiry in reports:
        assert abs(to_expiry - timedelta(days=7)) < timedelta(minutes=1)
        assert headers["NServiceBus.OriginatingEndpoint"] == endpoint
        assert headers["NServiceBus.OriginatingMachine"] == host
        assert headers["$.diagnostics.originating.hostid"] == host_id(endpoint)
        assert headers["$.diagnostics.hostdisplayname"] == host
        assert headers["NServiceBus.MessageIntent"] == "Send"
        ids.add(str(uuid.UUID(headers["NServiceBus.MessageId"])))
        if headers.get("NServiceBus.EnclosedMessageTypes") == "NServiceBus.Metrics.EndpointMetadataReport":
            assert headers["NServiceBus.ContentType"] == "application/json"
            metadata.append(json.loads(body))
        else:
            assert headers["NServiceBus.ContentType"] == "TaggedLongValueWriterOccurrence"
            assert "NServiceBus.EnclosedMessageTypes" not in headers  # as the plugin sends them
            by_metric.setdefault(headers["NServiceBus.Metric.Type"], []).extend(decode(body))
    assert len(ids) == len(reports)
    assert metadata == [{"PluginVersion": 3, "LocalAddress": settings.dialect.format_address(settings.queue)}] * len(metadata)
    assert metadata, "a metadata report each round"

    expected = {
        "ProcessingTime": [(p.ended, p.message_types, p.processing_ms) for p in items],
        "CriticalTime": [(p.ended, p.message_types, p.critical_ms) for p in items if p.critical_ms is not None],
        "Retries": [(p.ended, p.message_types, 1) for p in items if p.retries > 0],
    }
    assert set(by_metric) == set(expected)
    for metric, entries in expected.items():
        got = by_metric[metric]
        assert sorted(got) == sorted(entries), metric  # the same times, types and values
        assert all(v >= 0 for _, _, v in got)
        assert Counter(t for _, t, _ in got) == Counter(t for _, t, _ in entries)
    assert set(Counter(t for _, t, _ in by_metric["ProcessingTime"]).values()) == {200}


def test_a_missing_monitoring_queue_is_named(backend: Backend, names: Any) -> None:
    settings = settings_for(backend.url, names("sales"), names("monitoring"))
    monitor = Monitor(settings)
    with backend.connect() as conn, pytest.raises(QueueNotFoundError, match="^monitoring_queue: queue ") as caught:
        monitor.check(conn.cursor())
    assert caught.value.field == "monitoring_queue"  # the transport names its setting; the reader, its option:
    named = name_fields(caught.value)
    assert named.option == "monitoringQueue" and named.message.startswith("option 'monitoringQueue': queue ")
    monitor.close()


# -- bounded --------------------------------------------------------------------------------------


def test_what_is_kept_is_bounded_and_uniform(pg: Backend, names: Any) -> None:
    monitoring = pg.create_queue(names("monitoring"))
    monitor = Monitor(settings_for(pg.url, names("sales"), monitoring, monitoring_interval=3600),
                      max_entries=10_000, seed=3)
    now = datetime.now(UTC)
    # processing time i s for the i-th message: a uniform sample averages about half the range
    items = [Processed(TYPES[i % 3], now - timedelta(seconds=i), now, now, i % 2) for i in range(100_000)]
    began = time.perf_counter()
    for at in range(0, len(items), 10_000):
        monitor.observe(items[at:at + 10_000])
    took = time.perf_counter() - began
    assert monitor.pending() == {"ProcessingTime": 10_000, "CriticalTime": 10_000, "Retries": 10_000}
    assert took < 5, f"observe took {took:.1f}s for 100,000 messages"
    assert monitor.flush() is True
    monitor.close()
    reports, _ = read_reports(pg, monitoring)
    raw = [(h["NServiceBus.Metric.Type"], decode(b)) for h, b, _ in reports if "NServiceBus.Metric.Type" in h]
    assert len(raw) == 3 * 5  # per metric 10,000 entries: 5 reports of at most 2,048 (and metadata reports)
    assert all(len(entries) <= 2048 for _, entries in raw)
    values = [v // 1000 for metric, entries in raw if metric == "ProcessingTime" for _, _, v in entries]
    assert len(values) == 10_000 and len(set(values)) == 10_000  # each message at most once
    assert abs(sum(values) / len(values) - 50_000) < 2_000
    assert min(values) < 2_000 and max(values) > 98_000  # early and late chunks both sampled


# -- a dead database -----------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dead_database_is_logged_once_and_dropped(pg: Backend, caplog: pytest.LogCaptureFixture) -> None:
    dead = pg.url.replace(f":{pg.parsed.port}/", f":{_closed_port()}/")
    assert dead != pg.url
    monitor = Monitor(settings_for(dead, "sales", "Particular.Monitoring", monitoring_interval=3600), timeout=15)
    with caplog.at_level(logging.DEBUG, logger="spark_qtransport"):
        for _ in range(3):
            monitor.observe(processed(50))
            began = time.perf_counter()
            assert monitor.flush() is True  # the round ended: dropped, not raised
            assert time.perf_counter() - began < 12
        monitor.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "monitoring reports to" in warnings[0].getMessage() and "dropped" in warnings[0].getMessage()
    assert monitor.sent == 0 and monitor.dropped >= 3 * 4
    assert monitor.pending() == {"ProcessingTime": 0, "CriticalTime": 0, "Retries": 0}


@pytest.mark.db  # connects (to a socket that never answers)
def test_a_hanging_database_blocks_flush_and_close_a_bounded_time() -> None:
    """A server that accepts connections and never answers: the caller waits `timeout`, not the
    connection's own timeout; the reporter thread finishes on its own."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/postgres"
        monitor = Monitor(settings_for(url, "sales", "Particular.Monitoring", monitoring_interval=3600), timeout=0.5)
        monitor.observe(processed(10))
        began = time.perf_counter()
        assert monitor.flush() is False
        monitor.close()
        assert time.perf_counter() - began < 3


def test_the_timer_sends_every_interval(pg: Backend, names: Any) -> None:
    monitoring = pg.create_queue(names("monitoring"))
    monitor = Monitor(settings_for(pg.url, names("sales"), monitoring, monitoring_interval=0.2))
    monitor.observe(processed(30))
    deadline = time.monotonic() + 10
    while pg.count(monitoring) < 4 and time.monotonic() < deadline:  # metadata, three metrics
        time.sleep(0.05)
    metrics = {h.get("NServiceBus.Metric.Type") for h, _, _ in read_reports(pg, monitoring)[0]}
    assert {"ProcessingTime", "CriticalTime", "Retries", None} <= metrics
    monitor.close()
    rounds = pg.count(monitoring)
    time.sleep(0.5)
    assert pg.count(monitoring) == rounds  # closed: no more rounds


def test_the_monitors_of_many_queues_share_one_thread_and_one_connection(pg: Backend, names: Any) -> None:
    """A stream's monitors (one a queue) send on their `ReportSession`: 200 queues' reports go out
    on one thread and one connection, each queue's on its own interval and flush, and the thread
    ends with the last monitor closed."""
    import threading

    from spark_qtransport.transport.platform.monitoring import ReportSession

    def reporting() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "sqlqueue-monitoring"]

    monitoring = pg.create_queue(names("monitoring"))
    queues = [names(f"tenant{i:03d}") for i in range(200)]
    before = len(reporting())
    shared = ReportSession(settings_for(pg.url, queues[0], monitoring))
    monitors = [Monitor(settings_for(pg.url, q, monitoring, monitoring_interval=0.3 if i % 2 else 3600),
                        reports=shared) for i, q in enumerate(queues)]
    try:
        for m in monitors:
            m.observe(processed(3))
        assert len(reporting()) == before + 1, "one thread for every queue's reports"
        assert all(m.flush() for m in monitors[::2])  # the hourly ones, asked for
        deadline = time.monotonic() + 20
        while min(m.sent for m in monitors[1::2]) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the others, on their own 0.3 s interval
        assert min(m.sent for m in monitors) >= 4  # metadata and three metrics each
        assert shared._session.generation == 1, "one connection opened, never dropped"
        addresses = Counter(json.loads(body)["LocalAddress"] for h, body, _ in read_reports(pg, monitoring)[0]
                            if h.get("NServiceBus.EnclosedMessageTypes") == "NServiceBus.Metrics.EndpointMetadataReport")
        assert {a.split(".")[-1].strip('"') for a in addresses} == set(queues)
    finally:
        for m in monitors:
            m.close()
        shared.close()
    deadline = time.monotonic() + 5
    while len(reporting()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(reporting()) == before, "the thread ends with the last monitor"


def test_a_stream_reports_what_it_processed(spark: Any, pg: Backend, names: Any, tmp_path: Any) -> None:
    """A stream with monitoringQueue: the reports in the queue decode into the message types and
    counts the stream processed, with plausible times, and name the endpoint and its input queue."""
    from test_stream import Collect, reader, run_available_now

    from backends import nsb_headers

    q, e, mon = (pg.create_queue(names(n)) for n in ("Sales", "error", "monitoring"))
    sent_at = datetime.now(UTC)
    stamp = sent_at.strftime("%Y-%m-%d %H:%M:%S:%f Z")
    types = {"Shop.PlaceOrder": 7, "Shop.CancelOrder": 3}
    messages = [(nsb_headers(f"{t}-{i}", **{"NServiceBus.EnclosedMessageTypes": t, "NServiceBus.TimeSent": stamp,
                                             **({"NServiceBus.Retries": "1"} if t == "Shop.CancelOrder" else {})}), b"{}")
                for t, n in types.items() for i in range(n)]
    pg.send_many(q, messages)
    run_available_now(spark, reader(spark, pg, q, e, endpoint="Shop.Sales", monitoringQueue=mon,
                                    monitoringInterval="1s", maxMessagesPerTrigger="4"), str(tmp_path / "c"), Collect())
    done = datetime.now(UTC)
    deadline = time.monotonic() + 30  # the source's stop() (the last flush) may finish after the query
    while time.monotonic() < deadline:
        reports, _ = read_reports(pg, mon)
        kinds = Counter(h.get("NServiceBus.Metric.Type") for h, _, _ in reports)
        if sum(Counter(t for h, b, _ in reports if h.get("NServiceBus.Metric.Type") == "ProcessingTime"
                       for _, t, _ in decode(b)).values()) == sum(types.values()) and kinds["Retries"]:
            break
        time.sleep(0.2)
    by_metric: dict[str, list[tuple[datetime, str, int]]] = {}
    metadata = []
    for headers, body, _ in reports:
        assert headers["NServiceBus.OriginatingEndpoint"] == "Shop.Sales"
        assert headers["$.diagnostics.originating.hostid"] == host_id("Shop.Sales")
        if headers.get("NServiceBus.EnclosedMessageTypes") == "NServiceBus.Metrics.EndpointMetadataReport":
            metadata.append(json.loads(body))
        else:
            by_metric.setdefault(headers["NServiceBus.Metric.Type"], []).extend(decode(body))
    assert metadata and metadata[0] == {"PluginVersion": 3, "LocalAddress": pg.dialect.format_address(pg.address(q))}
    assert Counter(tag for _, tag, _ in by_metric["ProcessingTime"]) == types
    assert Counter(tag for _, tag, _ in by_metric["CriticalTime"]) == types
    assert Counter(tag for _, tag, _ in by_metric["Retries"]) == {"Shop.CancelOrder": 3}
    limit = (done - sent_at).total_seconds() * 1000 + 1000
    for metric in ("ProcessingTime", "CriticalTime"):
        for at, _, value in by_metric[metric]:
            assert 0 <= value <= limit and sent_at - timedelta(seconds=1) <= at <= done + timedelta(seconds=1)
