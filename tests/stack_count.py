"""Run the documentation's pages many times and count what a reader should never see: Java and
Python stacks, Spark's warnings, Ivy's listing (`test_docs.spark_noise`).

A stack after a script's own output came from a race (Spark's listener bus calling into a Python
that was exiting), so one clean run proves little: this runs each page's blocks, as
`test_docs.test_a_page_runs_as_written` does, RUNS times on an embedded PostgreSQL of its own, and
prints per page how many runs printed any such line, and the first of them.

    .venv/bin/python tests/stack_count.py --runs 20                      # every page of SCRIPT_PAGES
    .venv/bin/python tests/stack_count.py --runs 20 getting-started.md   # one page
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_pages import SCRIPT_PAGES  # noqa: E402
from test_docs import run_page, spark_noise  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("pages", nargs="*", default=list(SCRIPT_PAGES))
    args = parser.parse_args(argv)
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    noisy_pages = 0
    with EmbeddedPostgres(fsync=False) as pg:
        for name in args.pages:
            noisy, first, started = 0, None, time.monotonic()
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory(prefix="sqlqueue-stacks-") as tmp:
                    try:
                        run_page(name, pg.url, Path(tmp))
                    except AssertionError as exc:  # run_page asserts no noise: count it, keep the first
                        noisy += 1
                        first = first or [line for line in spark_noise(str(exc)) or [str(exc)[:300]]][:3]
            print(f"{name}: {noisy} of {args.runs} runs printed a stack or Spark's noise "
                  f"({time.monotonic() - started:.0f} s)" + (f"; the first: {first}" if first else ""), flush=True)
            noisy_pages += bool(noisy)
    return 1 if noisy_pages else 0


if __name__ == "__main__":
    sys.exit(main())
