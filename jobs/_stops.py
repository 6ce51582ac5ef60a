"""Stopping a job: Ctrl-C (SIGINT) and SIGTERM (what schedulers and Databricks send), quietly.

Python's default turns SIGINT into a KeyboardInterrupt wherever the main thread is, most often in
the middle of a py4j call to the JVM: py4j's "reentrant call" errors, half-sent commands, the
stream thread interrupted mid-write, over a thousand lines of Java and Python stacks. SIGTERM's
default kills Python and leaves the JVM to run its shutdown hooks under a live query.

Here a signal only records that a stop was asked for:

- while the job starts (no query yet: nothing read, nothing to finish) it ends at once with one
  line, after the clean-ups registered with `on_exit` (the demo's embedded PostgreSQL);
- while a query runs, the batch under way may finish for `BATCH_WAIT` seconds (3), then it is
  cancelled; whatever Spark then takes to stop, the job's JVM is killed and the job exits
  `HARD_STOP` seconds (7) after the signal: the job is gone within 10 s whatever moment the signal
  hits (a busy machine included), and the cancelled batch
  replays from the checkpoint next run (a cancelled foreachBatch call raises `StopRequested`, one
  line: Spark's own text for it, a Java stack inside a Python one inside a Java one, overflows
  its check for an interruption). A batch that would start after the signal
  (`gated`: the jobs' foreachBatch functions) ends the query before it writes anything, or
  `_progress.follow`, between two polls, stops a query that runs no batch. Spark's JVM logging is
  off from then on (a query ended on purpose is not news), the job prints its summary, and
  `exit_with` stops Spark and exits with 130 (SIGINT) or 143 (SIGTERM);
- a second signal ends it at once.

Nothing is lost either way: the checkpoint and the claims resume where the stop landed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["EXIT_BOUND", "HARD_STOP", "STOPS", "StopRequested", "Stops", "exit_within", "quiet_accumulators", "quiet_jvm",
           "shut_down", "stop_query"]

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class Stops:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.running = False
        self.installed = False
        self.in_batch = 0
        #: the job made its SparkSession (`_spark.session`); not when a caller lent it one (a test)
        self.started_spark = False
        self._cleanups: list[Callable[[], None]] = []

    def install(self) -> None:
        """Take SIGINT and SIGTERM (pyspark's SparkContext is kept from putting in its own SIGINT
        handler: `kept`)."""
        self.installed = True
        for signum in NAMES:
            signal.signal(signum, self._handle)

    @contextmanager
    def kept(self) -> Iterator[None]:
        """While pyspark makes its SparkContext: ours stay the SIGINT and SIGTERM handlers. The
        SparkContext puts in its own SIGINT handler, which cancels the jobs and raises
        KeyboardInterrupt in the middle of a py4j call: a Ctrl-C in the moment between that and
        `install` again printed py4j's tracebacks and ended the job with -2 instead of one line."""
        if not self.installed:
            yield
            return
        real = signal.signal

        def ours_stay(signum: Any, handler: Any) -> Any:
            # a Python handler only: SIG_IGN still passes (pyspark's JVM launch ignores SIGINT in
            # the child it forks, so that a Ctrl-C reaches the job, not the JVM)
            return signal.getsignal(signum) if signum in NAMES and callable(handler) else real(signum, handler)

        signal.signal = ours_stay  # type: ignore[assignment]
        try:
            yield
        finally:
            signal.signal = real

    def on_exit(self, cleanup: Callable[[], None]) -> None:
        """Run `cleanup` when a signal ends the job before its query runs."""
        self._cleanups.append(cleanup)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def code(self) -> int:
        return 128 + int(self.signum or signal.SIGINT)

    @property
    def name(self) -> str:
        return NAMES.get(self.signum or signal.SIGINT, "a signal")

    def _handle(self, signum: int, frame: Any) -> None:
        again = self.signum is not None
        self.signum = signum
        if self.running and not again:
            print(f"stopping ({self.name}): the query stops, its checkpoint resumes the rest", file=sys.stderr,
                  flush=True)
            bound = threading.Timer(HARD_STOP, self._at_the_bound)
            bound.daemon = True
            bound.start()
            return
        print(f"stopped ({self.name}) {'at once' if again else 'while starting: nothing was read'}",
              file=sys.stderr, flush=True)
        self._end_now()

    def _end_now(self) -> None:
        """The clean-ups registered with `on_exit`, the JVM killed, and exit."""
        for cleanup in reversed(self._cleanups):
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        _kill_jvm()
        os._exit(self.code)

    def _at_the_bound(self) -> None:
        """`HARD_STOP` seconds after the signal and the job still runs (Spark slow to stop its query
        or itself): its JVM is killed and it exits, its checkpoint and claims resuming next run, as
        after a kill."""
        print(f"stopped ({self.name}): Spark did not stop within {HARD_STOP:.0f} s; ended at once", file=sys.stderr,
              flush=True)
        self._end_now()

    def gated(self, fn: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """A foreachBatch function that starts no batch after a stop was asked for (the query
        ends there, its checkpoint replays that batch next run) and says when one runs."""

        def run(batch: Any, batch_id: int) -> None:
            if self.requested:
                quiet_jvm()
                raise StopRequested(f"stopped ({self.name}) before batch {batch_id}")
            self.in_batch += 1
            try:
                fn(batch, batch_id)
            except Exception:
                if not self.requested:
                    raise
                # the batch cancelled by `stop_query` (it ran past the wait): a short error, not
                # the cancelled Spark job's Java stack inside a Python one inside a Java one
                raise StopRequested(f"stopped ({self.name}) during batch {batch_id}") from None
            finally:
                self.in_batch -= 1

        return run


class StopRequested(Exception):  # noqa: N818 - what it is, not an error
    """Raised in a foreachBatch function after Ctrl-C or SIGTERM: the query ends before the batch."""


#: this job's stops
STOPS = Stops()


def _spark_context_class() -> Any:
    """pyspark's SparkContext class if pyspark was imported (`pyspark.core.context` since 4.0),
    without importing it."""
    return getattr(sys.modules.get("pyspark"), "SparkContext", None)


def _kill_jvm() -> None:
    """The JVM this process launched, killed outright (nothing ran, nothing to flush). Left to exit
    when its gateway's pipe closes, a JVM still starting runs its shutdown hooks beside its own
    start-up and logs their races (an executor fetching a file into a directory a hook deleted) as
    stacks, and one still launching (pyspark waits for its gateway before it keeps the process
    anywhere but in a local) finishes its start-up first: seconds on a busy machine. Safe in a
    signal handler: no py4j call, pyspark not imported here if it was not."""
    proc = getattr(getattr(_spark_context_class(), "_gateway", None), "proc", None) or _launching_jvm()
    try:
        if proc is not None:
            proc.kill()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


def _launching_jvm() -> Any:
    """The JVM process pyspark's `launch_gateway` is starting, if the main thread is in it: that
    function's `proc` (its `Popen`), found on the main thread's stack."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "pyspark.java_gateway":
            proc = frame.f_locals.get("proc")
            if hasattr(proc, "kill"):
                return proc
        frame = frame.f_back
    return None


def quiet_jvm() -> None:
    """Spark's JVM logging off, and the connector's line for a failed query: after a stop was
    asked for, the query ends on purpose, and what they would say is not news."""
    import logging

    logging.getLogger("spark_qtransport.failures").setLevel(logging.CRITICAL)
    quiet_accumulators()
    jobs_spark = sys.modules.get("_spark")  # the filter of the JVM's stderr, when the job started one
    if jobs_spark is not None:
        jobs_spark.mute_jvm_stderr()
    try:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is not None:
            sc.setLogLevel("OFF")
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext: nothing logs here
        pass


#: how long a stop waits for the batch under way to end by itself: a short batch ends cleanly; a
#: longer one is cancelled (`query.stop()`), so that the job is gone within 10 s of the signal, its
#: checkpoint and its claims replaying that batch next run (our sink and Delta's writes are
#: idempotent per batch)
BATCH_WAIT = 3.0
#: seconds after a signal at which a job still running is ended at once (its JVM killed): the
#: batch's wait, Spark's stop and the JVM's exit fit in it on an idle machine; on a busy one the
#: job still ends within 10 s of the signal, its stream's warden finishing the rest
HARD_STOP = 7.0


def stop_query(query: Any, *, wait: float = BATCH_WAIT) -> None:
    """End a running query after a signal: once no batch runs (the next one, `gated`, ends it
    first), or after `wait` seconds, stopped as it is."""
    import time

    quiet_jvm()
    deadline = time.monotonic() + wait
    try:
        while query.isActive and time.monotonic() < deadline:
            if not STOPS.in_batch and not query.status.get("isTriggerActive", False):
                break
            time.sleep(0.05)
        query.stop()
    except Exception:  # noqa: BLE001 - stopping anyway
        pass


def quiet_accumulators(server: Any = None) -> None:
    """From a stop on: the driver's accumulator server says nothing of the JVM closing its end.

    The JVM sends tasks' accumulator updates to the driver's Python over one connection. A query
    stopped while it merges them (`query.stop()` interrupts the thread, and Java closes a channel
    under an interrupted thread), or pyspark's `SparkContext.stop` (the JVM's context stops before
    the server's shutdown flag is set), closes that connection; the server's handler reads an end
    of file and `socketserver` prints its traceback: 20 lines of EOFError on a stop that went as it
    should. Any other error of that server still prints. `server`: the active SparkContext's."""
    if server is None:
        sc = getattr(_spark_context_class(), "_active_spark_context", None)
        server = getattr(sc, "_accumulatorServer", None)
    if server is None or getattr(server, "_quiet_at_stop", False):
        return  # a stop quiets it once (`quiet_jvm` runs at each of a stop's steps)
    loud = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (EOFError, ConnectionError)):
            loud(request, client_address)

    server.handle_error = handle_error
    server._quiet_at_stop = True


#: seconds a job that ended (its work committed) gives Spark's stop and the interpreter's exit
#: before it exits anyway (`exit_within`)
EXIT_BOUND = 30.0


def exit_within(code: int, seconds: float = EXIT_BOUND) -> None:
    """From here on the process exits with `code` within `seconds`, whatever Spark's stop or an
    exit hook calling into a JVM that is going away does: the job's work is done and committed
    (its checkpoint and claims say so), and a job that hangs after its last line is one a
    scheduler kills, or that never frees its slot."""

    def end() -> None:
        print(f"Spark did not stop within {seconds:.0f} s of the job's end; exiting", file=sys.stderr, flush=True)
        _kill_jvm()
        os._exit(code)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()


def shut_down() -> None:
    """After a stop: Spark stopped and its JVM ended (at most 8 s after Spark's stop)."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        gateway = SparkContext._gateway
        quiet_accumulators()
        if spark is not None:
            spark.stop()
        proc = getattr(gateway, "proc", None)
        if gateway is not None:
            gateway.shutdown()
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # the gateway server exits at the end of its input
            try:
                proc.wait(8)
            except Exception:  # noqa: BLE001 - still there: it goes now
                proc.kill()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
