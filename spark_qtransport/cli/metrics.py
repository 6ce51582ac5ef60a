"""``sqlqueue metrics``: the numbers of `sqlqueue stats` and the error queues' failures by FailedQ,
served to Prometheus (or printed once, for cron and node_exporter's textfile collector).

One round of queries per `--cache-seconds` at most (`SnapshotCollector`): scrapes within that
time, and scrapes arriving together, share one round, so a tight scrape interval or several
Prometheus servers cannot load the database. A database that cannot be read gives ``sqlqueue_up
0`` and one more ``sqlqueue_scrape_errors_total``, with no stale numbers; the next round tries
again. prometheus_client (the ``metrics`` extra) is imported only by this command.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from ..dialects.base import one_line
from ..errors import QTransportError
from ..options.registry import by_name
from .app import delayed_options, main, registered, url_option
from .db import CommandDb, open_db
from .output import echo, escape
from .snapshot import Snapshot, take_snapshot

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["SnapshotCollector", "families", "metrics"]

#: one attempt and one retry on a new connection (a restarted server): a scrape gives up within
#: about a second (plus the connect timeout), serves sqlqueue_up 0, and the next one tries again
ATTEMPTS = 2

#: the oldest rows of an error queue counted by FailedQ per round, unless --failures-limit says otherwise
FAILURES_LIMIT = 100_000


class SnapshotCollector:
    """A Prometheus collector whose `collect` reuses the last round of queries (`take`) while it
    is younger than `cache_seconds`, counted from the round's end. A lock makes concurrent
    scrapes wait for one round rather than run their own. A round that raises is reported
    (`on_error`) and exposed as ``sqlqueue_up 0``."""

    def __init__(self, take: Callable[[], Snapshot], *, cache_seconds: float,
                 on_error: Callable[[BaseException], None]) -> None:
        self._take, self._cache, self._on_error = take, float(cache_seconds), on_error
        self.lock = threading.Lock()
        self._fresh_until: float | None = None  # time.monotonic() until which the families are reused
        self._families: list[Metric] = []
        self.rounds = 0
        self.errors = 0
        self.up = False

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            if self._fresh_until is None or time.monotonic() >= self._fresh_until:
                self._refresh()
            out = list(self._families)
        yield from out

    def _refresh(self) -> None:
        at, started = time.time(), time.monotonic()
        snapshot: Snapshot | None
        try:
            snapshot = self._take()
        except Exception as exc:  # noqa: BLE001 - whatever failed, the exporter goes on serving
            snapshot = None
            self.errors += 1
            self._on_error(exc)
        self.rounds += 1
        self.up = snapshot is not None
        ended = time.monotonic()
        self._families = families(snapshot, duration=ended - started, at=at, rounds=self.rounds, errors=self.errors)
        self._fresh_until = ended + self._cache


def families(snapshot: Snapshot | None, *, duration: float, at: float, rounds: int, errors: int) -> list[Metric]:
    """The metric families of one round (`snapshot` None: it failed). Labels name queues as
    `sqlqueue stats` does (canonical addresses)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    out: list[Metric] = [
        GaugeMetricFamily("sqlqueue_up", "1 when the last round of queries read the database, else 0",
                          value=0 if snapshot is None else 1),
        GaugeMetricFamily("sqlqueue_scrape_duration_seconds", "seconds the last round of queries took",
                          value=duration),
        GaugeMetricFamily("sqlqueue_scrape_timestamp_seconds", "when the last round of queries started (Unix time)",
                          value=at),
        CounterMetricFamily("sqlqueue_scrape_rounds", "rounds of queries run (scrapes within --cache-seconds of "
                            "the last round reuse it)", value=rounds),
        CounterMetricFamily("sqlqueue_scrape_errors", "rounds of queries that failed", value=errors),
    ]
    if snapshot is None:
        return out
    messages = GaugeMetricFamily("sqlqueue_queue_messages", "messages in the queue table, counted "
                                 "(SQL Server: rows other sessions hold are skipped)", labels=["queue"])
    expired = GaugeMetricFamily("sqlqueue_queue_expired_messages", "messages past their time to be received, "
                                "waiting to be purged", labels=["queue"])
    oldest = GaugeMetricFamily("sqlqueue_queue_oldest_message_age_seconds", "age of the oldest message by its "
                               "NServiceBus.TimeSent header (0: the queue is empty)", labels=["queue"])
    claimed = GaugeMetricFamily("sqlqueue_claimed_messages", "messages a reader claimed and has not acknowledged "
                                "(<queue>.Claims), per consumer", labels=["queue", "consumer"])
    delayed = GaugeMetricFamily("sqlqueue_delayed_messages", "messages in the endpoint's delayed table: "
                                "state due (to be moved now) or pending", labels=["queue", "state"])
    outbox = GaugeMetricFamily("sqlqueue_outbox_records", "records of the endpoint's outbox (<queue>.Outbox)",
                               labels=["queue"])
    for row in snapshot.queues:
        q = str(row["queue"])
        messages.add_metric([q], row["messages"])
        expired.add_metric([q], row["expired"])
        if row["oldest_age_s"] is not None:
            oldest.add_metric([q], max(float(row["oldest_age_s"]), 0.0))
        elif not row["messages"]:
            oldest.add_metric([q], 0.0)
        for consumer, n in (row["claimed"] or {}).items():
            claimed.add_metric([q, consumer], n)
        if row["delayed_due"] is not None:
            delayed.add_metric([q, "due"], row["delayed_due"])
            delayed.add_metric([q, "pending"], row["delayed_pending"])
        if row["outbox"] is not None:
            outbox.add_metric([q], row["outbox"])
    failures = GaugeMetricFamily("sqlqueue_error_queue_failures", "messages of an error queue by the queue they "
                                 "failed in (NServiceBus.FailedQ; (none): headers name none), over its oldest "
                                 "--failures-limit messages", labels=["error_queue", "failed_q"])
    for error_queue, counts in snapshot.failures.items():
        for failed_q, n in counts.items():
            failures.add_metric([error_queue, failed_q], n)
    return [*out, messages, expired, oldest, claimed, delayed, outbox, failures]


def _listen(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, int] | None:
    """HOST:PORT (``[::1]:9188`` for IPv6; an empty host listens on every interface)."""
    if value is None:
        return None
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 0.0.0.0:9188; port 0 picks a free one)",
                                 ctx=ctx, param=param)
    return host.strip("[]") or "0.0.0.0", int(port)


def _error_line(exc: BaseException) -> str:
    """A failed round as one line, as the group prints a command's error (passwords masked)."""
    if isinstance(exc, QTransportError):
        return escape(exc)
    return f"{type(exc).__name__}: {escape(one_line(str(exc)) or type(exc).__name__)}"


@main.command("metrics")
@click.argument("queues", nargs=-1)
@click.option("--listen", callback=_listen, metavar="HOST:PORT",
              help="serve Prometheus metrics over HTTP here (e.g. 0.0.0.0:9188; port 0 picks a free one)")
@click.option("--once", is_flag=True, help="print the metrics once on stdout and exit (cron, textfile collectors)")
@registered("--error-queue", "QUEUE", "an error queue whose failures are counted by FailedQ (repeatable; default: "
            f"{by_name('errorQueue').default}, where that table exists)", dest="error_queues", multiple=True)
@click.option("--cache-seconds", default=5.0, show_default=True, type=click.FloatRange(min=0),
              help="scrapes within this many seconds of the last round of queries reuse its numbers")
@click.option("--failures-limit", default=FAILURES_LIMIT, show_default=True, type=click.IntRange(1, 10_000_000),
              help="the oldest messages of each error queue counted by FailedQ per round")
@delayed_options
@url_option
def metrics(queues: tuple[str, ...], listen: tuple[str, int] | None, once: bool, error_queues: tuple[str, ...],
            cache_seconds: float, failures_limit: int, delayed_suffix: str | None, delayed_table: str | None,
            url: str | None) -> None:
    """Prometheus metrics of queues: what `sqlqueue stats` shows (messages, oldest age, expired,
    claimed per consumer, delayed due and pending, outbox records) and each error queue's
    failures by NServiceBus.FailedQ. Without QUEUE: every queue table of the database. One round
    of queries per --cache-seconds at most, whatever the scrape rate; a database that is down
    gives sqlqueue_up 0, never a stopped exporter. Needs the metrics extra.

    \b
    Examples:
      pip install 'spark-qtransport[metrics]'
      sqlqueue metrics --listen 0.0.0.0:9188
      sqlqueue metrics Sales Billing --error-queue error --listen 127.0.0.1:9188
      sqlqueue metrics --once > /var/lib/node_exporter/textfile/sqlqueue.prom.tmp
    """
    if listen is not None and once:
        raise click.UsageError("--listen and --once exclude each other: serve the metrics, or print them once")
    if listen is None and not once:
        raise click.UsageError("give --listen HOST:PORT to serve the metrics, or --once to print them")
    if delayed_table is not None and len(queues) != 1:
        raise click.UsageError("--delayed-table names one endpoint's delayed table: give one queue with it")
    try:
        from prometheus_client import CollectorRegistry, generate_latest, start_http_server
    except ImportError:
        raise QTransportError("sqlqueue metrics needs prometheus_client: pip install 'spark-qtransport[metrics]'") \
            from None

    def on_error(exc: BaseException) -> None:
        line = _error_line(exc)  # our errors name the command already
        echo(f"error: {line if line.startswith('sqlqueue metrics') else 'sqlqueue metrics: ' + line}", err=True)

    with open_db(url, attempts=ATTEMPTS) as s:
        def take(db: CommandDb = s) -> Snapshot:
            rule = db.delayed_rule(delayed_table, delayed_suffix, names=len(queues))
            return take_snapshot(db, queues, rule, error_queues, failures_limit=failures_limit)

        collector = SnapshotCollector(take, cache_seconds=cache_seconds, on_error=on_error)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        if once:
            echo(generate_latest(registry).decode("utf-8").rstrip("\n"))
            if not collector.up:
                sys.exit(1)
            return
        assert listen is not None
        _serve(listen, registry, collector, start_http_server)


def _serve(listen: tuple[str, int], registry: Any, collector: SnapshotCollector, start: Any) -> None:
    """Serve until interrupted (Ctrl-C, SIGTERM); the address it listens on is the first line."""
    host, port = listen
    try:
        server, _ = start(port, addr=host, registry=registry)
    except OSError as exc:
        raise click.UsageError(f"--listen {host}:{port}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    echo(f"serving http://{shown}:{server.server_port}/metrics")
    sys.stdout.flush()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)) if main_thread else None
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        server.shutdown()
        server.server_close()
        collector.lock.acquire(timeout=30)  # a round running now ends before the session closes
