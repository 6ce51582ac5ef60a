"""The ``sqlqueue`` command line: set up queues, print DDL for DBAs, send, move due delayed messages.

Every command takes ``--url`` (or ``$SQLQUEUE_URL``), prints tables for people or ``--json`` for
scripts, and turns errors into one line on stderr with exit code 1 (2 for wrong usage).

Modules: `app` (the group, shared options, errors and exit codes), `output` (tables, JSON,
every line printed, escaped), `db` (a command's session, names from the command line), and the
commands: `install` (create-*, ddl), `queues` (peek, stats, purge-expired, doctor), `messages`
(send, move-delayed, subscribe, unsubscribe), `error_queue` (error list/retry), `metrics` (Prometheus
metrics, over `snapshot`: what stats reports, read once), `dev` (dev-db).
"""

from __future__ import annotations

from . import dev, error_queue, install, messages, metrics, queues  # noqa: F401 - each registers its commands
from .app import Group, main
from .queues import STATS_COLUMNS

__all__ = ["Group", "STATS_COLUMNS", "main"]
