"""Job configuration: built-in defaults, then a TOML file (``--config``), then command-line flags.

A TOML file holds one table per job (``[queue_to_delta]``, ``[endpoint]``); keys are the long
flag names with ``-`` or ``_`` (``max-messages`` = ``max_messages``). See conf/*.toml.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


#: a default that means "must be given"
REQUIRED: Any = None


def stream_parser(doc: str | None, *, trigger: str, job_id: str, table: bool = True,
                  error_queue: str = "where messages that cannot be handled go (default: error)") -> argparse.ArgumentParser:
    """A job's parser with the flags every streaming job has (the job adds its own). A job that
    writes several tables passes ``table=False`` and adds its own flags for them; `error_queue`
    is the help of ``--error-queue``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="database URL (default: $SQLQUEUE_URL)")
    p.add_argument("--error-queue", help=error_queue)
    if table:
        p.add_argument("--table", help="Delta table path")
    p.add_argument("--checkpoint", help="checkpoint location of the stream")
    p.add_argument("--trigger", help=f"'available-now' (drain, then stop) or an interval like '{trigger}' (default)")
    p.add_argument("--max-messages", type=int, help="messages per micro-batch (default 10000)")
    p.add_argument("--job-id", help=f"stable name of this job, part of Delta's txnAppId (default: {job_id})")
    return p


def parse(parser: argparse.ArgumentParser, section: str, defaults: dict[str, Any], argv: list[str] | None = None) -> argparse.Namespace:
    """Parse flags over the `section` table of ``--config`` over `defaults`; unknown keys fail.
    Keys whose default is `REQUIRED` (None) must be given; use "" for an optional empty value."""
    parser.add_argument("--config", metavar="TOML", help=f"a TOML file with a [{section}] table (flags win)")
    ns = parser.parse_args(argv)
    values = dict(defaults)
    if ns.config:
        path = Path(ns.config)
        try:
            table = tomllib.loads(path.read_text()).get(section, {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            parser.error(f"--config {path}: {exc}")
        known = {a.dest for a in parser._actions}
        for key, value in table.items():
            dest = key.replace("-", "_")
            if dest not in known or dest == "config":
                parser.error(f"--config {path}: [{section}] has an unknown key {key!r}")
            values[dest] = value
    for key, value in vars(ns).items():
        if value is not None:
            values[key] = value
    missing = [f"--{k.replace('_', '-')}" for k, v in values.items() if v is None and k in defaults]
    if missing:
        parser.error(f"missing {', '.join(missing)} (a flag or a key in --config)")
    args = argparse.Namespace(**values)
    # Checked before Spark starts: a typo fails in a second, not after the session's start-up.
    from spark_qtransport.errors import ConfigError

    try:
        from spark_qtransport.connections import parse_url

        parse_url(str(args.url), option="--url")
        trigger(str(args.trigger))
    except ConfigError as exc:
        parser.error(str(exc))
    return args


def trigger(text: str) -> dict[str, Any]:
    """``available-now`` or a duration (``500ms``, ``10s``, ``5m``) -> keyword arguments of ``trigger()``."""
    from spark_qtransport.options.parse import parse_duration

    if text.strip().lower() == "available-now":
        return {"availableNow": True}
    seconds = parse_duration(text, option="--trigger")
    return {"processingTime": f"{round(seconds * 1000)} milliseconds"}


def exit_with(main: Any) -> None:
    """Run a job's `main` and exit with its status. Our errors (a missing queue, a bad option, a
    database refusing) end it with one line naming what is at fault, whether they come from the
    job itself or out of Spark's exceptions (`spark_qtransport.unwrap`); anything else keeps its
    traceback. Ctrl-C and SIGTERM stop it quietly (`_stops`): exit code 130 or 143."""
    from _stops import STOPS, exit_within, shut_down

    STOPS.install()
    try:
        code = main()
        if STOPS.requested:
            code = STOPS.code
    except Exception as exc:
        from spark_qtransport import unwrap

        ours = unwrap(exc)
        if ours is None:
            raise
        print(f"error: {ours}", file=sys.stderr, flush=True)
        code = 1
    # the job's Spark stopped before Python exits, however the job ended: under spark-submit the JVM
    # outlives this process, and a listener's last events would find no Python to call (Py4J stacks).
    # A session the job was lent (a caller's, in the same process) is the caller's to stop.
    if STOPS.requested or STOPS.started_spark:
        exit_within(code)
        shut_down()
    sys.exit(code)
