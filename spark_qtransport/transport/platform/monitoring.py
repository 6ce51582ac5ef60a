"""ServicePulse monitoring: the reports NServiceBus.Metrics.ServiceControl sends. Dialect-free.

An NServiceBus endpoint with metrics sends ServiceControl.Monitoring (queue ``Particular.Monitoring``
by default; option ``monitoringQueue``), outside any transaction and with a time to be received of
7 days, every interval:

- an ``NServiceBus.Metrics.EndpointMetadataReport`` (JSON ``{"PluginVersion":3,"LocalAddress":...}``,
  the endpoint's input queue in the transport's address syntax: ServiceControl polls its length);
- raw metrics, one message per metric (``NServiceBus.Metric.Type``: ``ProcessingTime``,
  ``CriticalTime``, ``Retries``), ContentType ``TaggedLongValueWriterOccurrence``, whose body
  `encode_report` writes: (time, message type, value) entries. ServiceControl.Monitoring derives
  throughput from the number of ProcessingTime entries.

`Monitor` is that reporter for a receiver: the acknowledgement hands it each committed chunk's
`Processed` messages (`observe`: in memory, no I/O), and a daemon thread sends the reports every
``monitoringInterval`` seconds, never in a transaction of the acknowledgement: the `ReportSession`'s,
whose one connection and one thread serve every queue of a stream. Reports are best-effort, as
NServiceBus's are: a failed send is logged (one WARNING per streak of failures) and its reports are
dropped; nothing is raised into the caller, and `flush` and `close` wait a bounded time.

Every report carries the plugin's headers (``NServiceBus.OriginatingEndpoint``, ``.OriginatingMachine``,
``$.diagnostics.originating.hostid``, ``$.diagnostics.hostdisplayname``; raw reports no
``EnclosedMessageTypes``: ServiceControl picks their deserializer by ContentType) and, which the
plugin's do not (its dispatcher sends bare transport messages), ``NServiceBus.MessageId`` and
``NServiceBus.MessageIntent`` = ``Send``. Entries carry the time their message was acknowledged
(its ProcessingEnded), as the plugin records the time its probe fired.

Differences from the plugin, by design:

- **Retries** is 1 per processed message that arrived through a delayed retry (its
  ``NServiceBus.Retries`` > 0), counted when it is acknowledged. NServiceBus signals each retry it
  schedules (immediate and delayed) when the attempt fails; a Spark batch has no failed attempts
  of single messages, and a message a Spark endpoint gives up on through ``retry_later()`` comes
  back as such a delivery.
- **Bounded memory.** The plugin's ring buffer drops entries when its reporter falls behind.
  Here at most `max_entries` entries per metric are kept per interval; beyond that a uniform
  sample of them (reservoir sampling) is sent. At more than `max_entries` messages per interval
  (10,000 msg/s with the defaults) ServicePulse's throughput, which counts ProcessingTime entries,
  then shows the sample's rate, not the endpoint's: a shorter ``monitoringInterval`` raises the bound.
"""

from __future__ import annotations

import json
import logging
import random
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone

from ...dialects import Connection, Cursor, QueueAddress
from ...errors import field_error
from ...wire import H, as_utc, encode_headers, host_id, machine
from .. import session as db
from ..routing import Router
from ..settings import ReceiveSettings
from .processed import Processed

__all__ = ["Monitor", "ReportSession", "encode_report", "encode_reports", "ticks", "METRICS", "MAX_DELTA_TICKS"]

log = logging.getLogger("spark_qtransport.monitoring")

#: the raw metrics sent, as ``NServiceBus.Metric.Type`` names them
PROCESSING_TIME, CRITICAL_TIME, RETRIES = "ProcessingTime", "CriticalTime", "Retries"
METRICS = (PROCESSING_TIME, CRITICAL_TIME, RETRIES)

METADATA_TYPE = "NServiceBus.Metrics.EndpointMetadataReport"
RAW_CONTENT_TYPE = "TaggedLongValueWriterOccurrence"
METRIC_TYPE = "NServiceBus.Metric.Type"
#: NServiceBus.Metrics.ServiceControl's EndpointMetadata.PluginVersion
PLUGIN_VERSION = 3
#: ReportingOptions.TimeToBeReceived: ServiceControl.Monitoring may be down for up to a week
TTBR_MS = 7 * 86_400_000

#: entries kept per metric per interval (beyond: a uniform sample)
MAX_ENTRIES = 100_000  # 10,000 msg/s at the default interval; about 130 bytes an entry
#: entries per report body, as the plugin's RawDataReporter flushes them (16 bytes each: 32 kB)
ENTRIES_PER_REPORT = 2048
#: seconds `flush` and `close` wait for the reporter thread
FLUSH_TIMEOUT = 10.0
#: a send makes one attempt; on a fault its reports are dropped, the connection is closed and the
#: next round opens another (no retry waits: `close` stays quick)
ATTEMPTS = 1

_VERSION = 1
#: an entry's time is an int32 of ticks after the report's base: about 214.7 seconds
MAX_DELTA_TICKS = 2**31 - 1
_INT64 = (-(2**63), 2**63 - 1)
_DOTNET_EPOCH = datetime(1, 1, 1, tzinfo=timezone.utc)

#: (ticks, tag, value): one measurement
Entry = tuple[int, str, int]


def ticks(moment: datetime) -> int:
    """.NET ``DateTime.Ticks`` of a UTC time: 100 ns units since 0001-01-01 (naive = UTC)."""
    d = as_utc(moment) - _DOTNET_EPOCH
    return (d.days * 86_400 + d.seconds) * 10_000_000 + d.microseconds * 10


def encode_report(entries: Sequence[Entry]) -> bytes:
    """One TaggedLongValueWriterOccurrence body (TaggedLongValueWriterV1), little-endian: int64
    version 1; int64 base ticks, the earliest entry's; int32 tag count, then per tag int32 id
    (from 1), int32 byte length, its UTF-8 bytes; int32 entry count, then per entry, oldest first,
    int32 ticks after the base, int32 tag id, int64 value. Every entry must lie within
    `MAX_DELTA_TICKS` of the earliest (see `encode_reports`)."""
    ordered = sorted(entries, key=lambda e: e[0])
    base = ordered[0][0] if ordered else 0
    ids: dict[str, int] = {}
    for _, tag, _ in ordered:
        if tag not in ids:
            ids[tag] = len(ids) + 1
    out = [struct.pack("<qqi", _VERSION, base, len(ids))]
    for tag, n in ids.items():
        raw = tag.encode("utf-8", "replace")
        out.append(struct.pack("<ii", n, len(raw)))
        out.append(raw)
    out.append(struct.pack("<i", len(ordered)))
    body = struct.Struct("<iiq")
    for at, tag, value in ordered:
        delta = at - base
        if delta > MAX_DELTA_TICKS:
            raise ValueError(f"entries span more than {MAX_DELTA_TICKS} ticks; split them (encode_reports)")
        out.append(body.pack(delta, ids[tag], min(max(value, _INT64[0]), _INT64[1])))
    return b"".join(out)


def encode_reports(entries: Iterable[Entry], *, per_report: int = ENTRIES_PER_REPORT) -> list[bytes]:
    """`entries` as report bodies, oldest first: each at most `per_report` entries, all within
    `MAX_DELTA_TICKS` (about 214 s) of its first, so every time delta fits its int32."""
    ordered = sorted(entries, key=lambda e: e[0])
    bodies, start = [], 0
    while start < len(ordered):
        end, limit = start + 1, min(len(ordered), start + per_report)
        first = ordered[start][0]
        while end < limit and ordered[end][0] - first <= MAX_DELTA_TICKS:
            end += 1
        bodies.append(encode_report(ordered[start:end]))
        start = end
    return bodies


class _Reservoir:
    """At most `size` entries of all those added: a uniform sample once more came (algorithm R)."""

    __slots__ = ("size", "seen", "entries")

    def __init__(self, size: int) -> None:
        self.size, self.seen = size, 0
        self.entries: list[Entry] = []

    def add(self, entry: Entry, rand: Callable[[], float]) -> None:
        self.seen += 1
        if len(self.entries) < self.size:
            self.entries.append(entry)
            return
        j = int(rand() * self.seen)
        if j < self.size:
            self.entries[j] = entry


class ReportSession:
    """The connection monitoring reports are sent on and the one thread that sends them, a round at
    a time: a stream's monitors (one a queue) share both, so reporting for a thousand queues holds
    one connection and one thread. The thread runs while a monitor is enlisted (`enlist`), each
    monitor's round when it is due or asked for; a monitor's state is guarded by `cond`, which
    they share. Best-effort: its retry policy gives up after `ATTEMPTS`."""

    def __init__(self, settings: ReceiveSettings, *, close_when_idle: bool = False) -> None:
        assert settings.monitoring_queue is not None
        d, url = settings.dialect, settings.url
        self._lock = threading.Lock()
        self._session = db.Session(d, url, backoff=db.Backoff.of(url, attempts=ATTEMPTS),
                                   what=f"sending monitoring reports to {d.format_address(settings.monitoring_queue)}")
        #: guards every enlisted monitor's state and the list of them
        self.cond = threading.Condition()
        #: the enlisted monitors (a dict for its order and its O(1) membership: `observe` asks each chunk)
        self._monitors: dict[Monitor, None] = {}
        self._thread: threading.Thread | None = None
        #: the session is one monitor's own: closed when its thread ends (its monitor closed)
        self._close_when_idle = close_when_idle

    def run(self, fn: Callable[[Connection], None]) -> None:
        with self._lock:
            self._session.run(fn)

    def drop(self) -> None:
        with self._lock:
            self._session.drop()

    def close(self) -> None:
        with self._lock:
            self._session.close()

    def enlist(self, monitor: Monitor) -> None:
        """Send `monitor`'s rounds from now on (the caller holds `cond`); the thread starts with the
        first monitor and ends with the last one's final round."""
        self._monitors.setdefault(monitor)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sqlqueue-monitoring", daemon=True)
            self._thread.start()
        self.cond.notify_all()

    def enlisted(self, monitor: Monitor) -> bool:
        """Whether `monitor` has rounds sent (the caller holds `cond`)."""
        return monitor in self._monitors

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while True:
                        if not self._monitors:
                            self._thread = None
                            return
                        now = time.monotonic()
                        ready = [m for m in self._monitors if m.wants_round(now)]
                        if ready:
                            break
                        self.cond.wait(max(min(m.due for m in self._monitors) - now, 0.0))
                    asked = [(m, *m.asked()) for m in ready]
                for monitor, wanted, stopping in asked:
                    monitor.round()
                    with self.cond:
                        monitor.rounded(wanted)
                        if stopping:
                            del self._monitors[monitor]
                        self.cond.notify_all()
        finally:
            if self._close_when_idle:
                self.close()


class Monitor:
    """The ServicePulse reporter of one receiver (settings.consumer the endpoint's name,
    settings.queue its input queue, settings.monitoring_queue where the reports go).

    - `check(cur)`: at set-up, the monitoring queue must exist (`QueueNotFoundError` naming
      option ``monitoringQueue``); starts the reporter.
    - `observe(items)`: thread-safe, O(items), no I/O, never raises: called after each committed
      acknowledgement chunk.
    - `flush()`: send the metadata report and what is pending now, waiting at most `timeout`.
    - `close()`: flush and stop (idempotent).

    Its rounds start at the first `check`, `observe` or `flush` and come every
    `settings.monitoring_interval` seconds from then on, sent by the thread of its `ReportSession`
    (`reports`: the stream's, shared by its queues' monitors; else one of its own) on that lazily
    connected session, one transaction per round (the metadata report and every raw report); a
    round that fails is dropped. At most `max_entries` entries per metric per interval are
    kept: a uniform sample when more arrive (see the module)."""

    def __init__(self, settings: ReceiveSettings, *, max_entries: int = MAX_ENTRIES, timeout: float = FLUSH_TIMEOUT,
                 per_report: int = ENTRIES_PER_REPORT, seed: int | None = None,
                 reports: ReportSession | None = None) -> None:
        if settings.monitoring_queue is None:
            raise field_error("monitoring_queue", "monitoring needs a queue to report to")
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.settings = settings
        self.dialect = settings.dialect
        self.address: QueueAddress = settings.monitoring_queue
        self.interval = float(settings.monitoring_interval)
        self.max_entries, self.timeout, self.per_report = max_entries, timeout, per_report
        self.local_address = self.dialect.format_address(settings.queue)
        endpoint, host = settings.consumer, machine()
        self._base = {
            H.ORIGINATING_ENDPOINT: endpoint,
            H.ORIGINATING_MACHINE: host,
            H.ORIGINATING_HOST_ID: host_id(endpoint),
            H.HOST_DISPLAY_NAME: host,
        }
        self._metadata = json.dumps({"PluginVersion": PLUGIN_VERSION, "LocalAddress": self.local_address},
                                    ensure_ascii=False, separators=(",", ":")).encode()
        self._random = random.Random(seed).random
        self._lock = threading.Lock()
        self._pending = self._empty()
        #: the connection and thread reports go on: the stream's, shared by its queues' monitors, or its own
        self._session = reports if reports is not None else ReportSession(settings, close_when_idle=True)
        self._cond = self._session.cond  # guards the four below
        self._requested = self._done = 0
        self._stopping = False
        self.due = 0.0  # when the next round is due (`_start`: an interval after the first)
        self._failing = False
        #: reports sent and dropped (rounds that failed), for tests and logs
        self.sent = self.dropped = 0

    def _empty(self) -> dict[str, _Reservoir]:
        return {name: _Reservoir(self.max_entries) for name in METRICS}

    # -- the caller's side ----------------------------------------------------------------------

    def check(self, cur: Cursor) -> None:
        """The monitoring queue must exist and be a queue (at set-up, on the caller's cursor); then `start`."""
        Router(self.dialect, self.settings.routing).configured(cur, self.address, field="monitoring_queue")
        self.start()

    def start(self) -> None:
        """Start the reporter, for a caller that checked the queue itself (the receiver's set-up)."""
        self._start()

    def observe(self, items: Sequence[Processed]) -> None:
        """Record acknowledged messages: their processing time, critical time (when their sent
        time is known) and, for a delayed retry's delivery, one retry. In memory only."""
        if not items:
            return
        try:
            with self._lock:
                pending, rand = self._pending, self._random
                processing, critical, retries = (pending[name] for name in METRICS)
                ended, at = None, 0
                for p in items:
                    if p.ended is not ended:  # a chunk's messages share their ProcessingEnded
                        ended, at = p.ended, ticks(p.ended)
                    tag = p.message_types or ""
                    processing.add((at, tag, p.processing_ms), rand)
                    ms = p.critical_ms
                    if ms is not None:
                        critical.add((at, tag, ms), rand)
                    if p.retries > 0:
                        retries.add((at, tag, 1), rand)
            self._start()
        except Exception as exc:  # noqa: BLE001 - monitoring is best-effort: never the caller's failure
            log.warning("monitoring could not record %d processed message(s): %s", len(items), exc)

    def pending(self) -> dict[str, int]:
        """Entries waiting per metric (at most `max_entries` each)."""
        with self._lock:
            return {name: len(r.entries) for name, r in self._pending.items()}

    def flush(self, timeout: float | None = None) -> bool:
        """Send the metadata report and what is pending now; wait at most `timeout` seconds
        (default: the monitor's). True when the round finished in time (sent, or dropped and
        logged); never raises."""
        with self._cond:
            if self._stopping:
                return False
        self._start()
        with self._cond:
            self._requested += 1
            wanted = self._requested
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._done >= wanted, self.timeout if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send what is pending and stop the reporter, waiting at most `timeout` seconds."""
        wait = self.timeout if timeout is None else timeout
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            if not self._session.enlisted(self):  # never started: nothing to send
                return
            self._requested += 1
            wanted = self._requested
            self._cond.notify_all()
            if self._cond.wait_for(lambda: self._done >= wanted, wait):
                return
        log.warning("monitoring reports to %s: still sending after %.0fs; left to finish in the background",
                    self.dialect.format_address(self.address), wait)

    # -- the reporter's side (the session's thread) ---------------------------------------------

    def _start(self) -> None:
        with self._cond:
            if self._stopping or self._session.enlisted(self):
                return
            self.due = time.monotonic() + self.interval
            self._session.enlist(self)

    def wants_round(self, now: float) -> bool:
        """A round is asked for (`flush`, `close`) or due (the caller holds the session's `cond`)."""
        return self._stopping or self._requested > self._done or now >= self.due

    def asked(self) -> tuple[int, bool]:
        """(the requests a round now answers, whether it is the last) (the caller holds `cond`)."""
        return self._requested, self._stopping

    def rounded(self, wanted: int) -> None:
        """A round answering `wanted` requests is over (the caller holds `cond`): the next is due an
        interval from now."""
        self.due = time.monotonic() + self.interval
        self._done = max(self._done, wanted)

    def _take(self) -> dict[str, list[Entry]]:
        with self._lock:
            pending, self._pending = self._pending, self._empty()
        return {name: r.entries for name, r in pending.items() if r.entries}

    def reports(self, entries: dict[str, list[Entry]]) -> list[tuple[str, bytes]]:
        """(headers text, body) of one round: the metadata report, then each metric's reports."""
        out = [(encode_headers({**self._base, H.MESSAGE_ID: str(uuid.uuid4()), H.MESSAGE_INTENT: "Send",
                                H.ENCLOSED_MESSAGE_TYPES: METADATA_TYPE, H.CONTENT_TYPE: "application/json"}),
                self._metadata)]
        for name in METRICS:
            for body in encode_reports(entries.get(name, ()), per_report=self.per_report):
                out.append((encode_headers({**self._base, H.MESSAGE_ID: str(uuid.uuid4()), H.MESSAGE_INTENT: "Send",
                                            H.CONTENT_TYPE: RAW_CONTENT_TYPE, METRIC_TYPE: name}), body))
        return out

    def round(self) -> None:
        """One round's reports in one transaction; on failure logged (once per streak) and dropped."""
        messages: list[tuple[str, bytes]] = []
        try:
            messages = self.reports(self._take())
            d, address = self.dialect, self.address

            def send(conn: Connection) -> None:
                cur = conn.cursor()
                for headers, body in messages:
                    db.execute(cur, d.insert_message(address, headers=headers, body=body, ttbr_ms=TTBR_MS))

            self._session.run(send)
        except Exception as exc:  # noqa: BLE001 - best-effort: logged and dropped, never raised
            self._session.drop()
            self.dropped += len(messages)
            if not self._failing:
                self._failing = True
                log.warning("monitoring reports to %s not sent, dropped until a send succeeds: %s",
                            self.dialect.format_address(self.address), db.describe(self.dialect, exc))
            else:
                log.debug("monitoring reports dropped: %s", db.describe(self.dialect, exc))
            return
        self.sent += len(messages)
        if self._failing:
            self._failing = False
            log.info("monitoring reports to %s sent again", self.dialect.format_address(self.address))
