"""How our errors leave the methods Spark calls: tagged, and without a Python traceback.

pyspark sends an exception raised in a data source method to the JVM as text
(`pyspark.util.handle_worker_exception`): the whole traceback, unless the worker's environment has
``SPARK_HIDE_TRACEBACK`` (what ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` sets for
UDF workers; the data source planners and the streaming source runner do not get it). Every such
worker ends after reporting the exception (`worker_run`, `worker.main`, the streaming source
runner), so setting the variable there, as our error leaves, hides the traceback of our error and
of nothing else. In a process that is not one of Spark's Python workers (a user's own, calling
these classes directly) nothing is set. The text then reads ``<Spark's prefix>:
spark_qtransport.errors.ConfigError: option 'queue' ... [qtransport {...}]``, and
`spark_qtransport.errors.unwrap` reads the error back.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import QTransportError, tagged
from ..options.registry import name_fields

__all__ = ["surfaced", "in_spark_worker"]

F = TypeVar("F", bound=Callable[..., Any])

HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"


def in_spark_worker() -> bool:
    """This process is one of Spark's Python workers (its main module is pyspark's)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and str(getattr(spec, "name", "")).startswith("pyspark.")


def _leaving(exc: QTransportError) -> QTransportError:
    if in_spark_worker():
        os.environ[HIDE_TRACEBACK] = "1"
    return tagged(name_fields(exc))  # a settings field the transport names: the option's name


def surfaced(fn: F) -> F:
    """Decorate a method Spark calls: our error leaves it tagged, its cause and traceback cut."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generate(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from fn(*args, **kwargs)
            except QTransportError as exc:
                raise _leaving(exc) from None

        return generate  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except QTransportError as exc:
            raise _leaving(exc) from None

    return call  # type: ignore[return-value]
