"""The stop tests of `tests/test_stops.py` that ``make test`` leaves out: queue_to_delta.py stopped
between two batches by Ctrl-C and by SIGTERM (``make test`` stops it by Ctrl-C in the middle of a
long batch), endpoint.py by Ctrl-C (``make test``: SIGTERM, the demo's Ctrl-C and a Ctrl-C while a
job starts); ``make chaos`` only."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from test_stops import queue_to_delta_stops_quietly_and_loses_nothing as queue_to_delta_stop
from test_stops import test_endpoint_job_stops_quietly_and_loses_nothing as endpoint_stop

from backends import Backend

pytestmark = [pytest.mark.slow(reason="job processes stopped by the other signal (make chaos only)"), pytest.mark.usefixtures("delta"),
              pytest.mark.skipif(not os.environ.get("SQLQUEUE_CHAOS_KILLS"), reason="make chaos only (the long run)")]


def test_queue_to_delta_ctrl_c(spark: Any, pg: Backend, names: Any, tmp_path: Path) -> None:
    queue_to_delta_stop(spark, pg, names, tmp_path, signal.SIGINT)


def test_queue_to_delta_sigterm(spark: Any, pg: Backend, names: Any, tmp_path: Path) -> None:
    queue_to_delta_stop(spark, pg, names, tmp_path, signal.SIGTERM)


def test_endpoint_ctrl_c(spark: Any, pg: Backend, names: Any, tmp_path: Path) -> None:
    endpoint_stop(spark, pg, names, tmp_path, signal.SIGINT)
