"""A failed query says why in one line, whether or not anyone awaits it.

A query started in the background (``start()`` without ``awaitTermination()``, a notebook cell)
that fails is silent with Spark's logging as the project ships it (``conf/log4j2.properties``
keeps MicroBatchExecution's hundreds of lines of stack out): only "Data source write support ...
is aborting" would tell. `register` adds `QueryFailureListener` to the session: when a query ends
with an error it logs one ERROR line on the ``spark_qtransport`` logger (Python's last-resort
handler prints it to stderr when the application set up no logging)::

    query 'orders' failed: DatabaseError: claim on queue "public"."Sales" failed: ...

naming our error and its fields when the failure is ours (`errors.unwrap` reads them from Spark's
text), else the first line of Spark's own. No stack: `spark_qtransport.failures` at DEBUG logs the
whole text.
"""

from __future__ import annotations

import atexit
import logging
import re
from typing import Any

from ..errors import unwrap

__all__ = ["failure_line", "report_failures"]

log = logging.getLogger("spark_qtransport.failures")

#: Spark's wrapper of a query's failure: "[STREAM_FAILED] Query [id = ..., runId = ...] terminated with exception: "
_WRAPPER = re.compile(r"^\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")


def failure_line(name: str | None, query_id: Any, text: str) -> str:
    """One line for a query that failed with `text` (its exception as Spark gives it)."""
    who = f"query {name!r}" if name else f"query {query_id}"
    ours = unwrap(_Text(text))
    if ours is not None:
        return f"{who} failed: {type(ours).__name__}: {ours}"
    first = next((line.strip() for line in _WRAPPER.sub("", text.strip()).splitlines() if line.strip()), "")
    return f"{who} failed: {first[:2000]}"


class _Text(Exception):
    """Spark's failure text, as an exception `unwrap` reads."""


def report_failures(spark: Any) -> None:
    """Add `QueryFailureListener` to `spark`'s queries, once per session."""
    if getattr(spark, "_sqlqueue_failures", None) is not None:
        return
    listener = _listener()
    try:
        spark.streams.addListener(listener)
    except Exception as exc:  # noqa: BLE001 - a session without listeners still reads and sends
        log.debug("no failure listener on this session: %s", exc)
        return
    try:
        spark._sqlqueue_failures = listener
    except AttributeError:  # a session object that takes no attributes: a second call adds another
        pass
    atexit.register(_remove, spark, listener)


def _remove(spark: Any, listener: Any) -> None:
    """At the program's exit, before pyspark's own exit hook ends the JVM (exit hooks run last
    registered first): the listener leaves the session. Else Spark's listener bus, still
    delivering the last batch's progress or the queries' ends, called into a Python that was
    going away, and logged each failed call with a 40-line Java stack after the script's output.
    Events Spark has queued are delivered first (a query that failed as the program ended is
    still reported), for at most 2 s."""
    try:
        sc = spark.sparkContext
    except Exception:  # noqa: BLE001 - Spark Connect: no SparkContext, the listener leaves over the connection
        sc = None
    if sc is not None and getattr(sc, "_jsc", None) is None:
        return  # stopped (a job stops its Spark before it exits): the listener bus went with it, and a
        # call now would open a new Py4J connection to a JVM that is ending (under spark-submit, one
        # that waits for this process to exit)
    if sc is not None:
        try:
            sc._jsc.sc().listenerBus().waitUntilEmpty(2000)
        except Exception as exc:  # noqa: BLE001 - a timeout, a JVM gone
            log.debug("listener bus not drained at exit: %s", exc)
    try:
        spark.streams.removeListener(listener)
    except Exception as exc:  # noqa: BLE001 - a session stopped already, a JVM gone: nothing to call
        log.debug("failure listener not removed at exit: %s", exc)


def _listener() -> Any:
    from pyspark.sql.streaming import StreamingQueryListener

    class QueryFailureListener(StreamingQueryListener):
        """Logs one line when a query ends with an error (see the module)."""

        def __init__(self) -> None:
            self.names: dict[str, str] = {}

        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
            if getattr(event, "name", None):
                self.names[str(event.id)] = str(event.name)

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            name = self.names.pop(str(event.id), None)  # the terminated event carries no name
            text = getattr(event, "exception", None)
            if not text:
                return
            log.error("%s", failure_line(name, event.id, str(text)))
            log.debug("the whole failure: %s", text)

    return QueryFailureListener()
