"""Mutation testing of the unit tier's pure modules (mutmut), each module against the test files that cover it.

    python tests/mutation/run.py                      # every module below (make mutation)
    python tests/mutation/run.py --only wire/times    # modules whose path holds any --only text
    python tests/mutation/run.py --keep               # keep each module's work tree (`mutmut browse` in it)

For each module: a copy of the repository's files (tracked and untracked, not ignored) in a work
directory outside the repository, a ``setup.cfg`` there with a ``[mutmut]`` section that mutates
that one module and runs ``pytest -m "unit and not slow"`` over its test files only (`MODULES`),
then ``mutmut run`` in it. mutmut runs each mutant against the tests that reached the mutated
function, with ``-x -q -p no:randomly`` and a timeout of 15 times their clean duration plus 3 s.

mutmut mutates function and method bodies only: module-level constants (`wire/names.py`'s header
names, the option registry's defaults and bounds, `_TIME_FORMAT`) are not mutated; tests hold them
by value (tests/test_mutants_*.py).

Printed: a table of module, mutants, killed, survived, timeout, other (no tests, suspicious,
segfault), score (killed and timed out over all) and the wall time. Written to
``reports/tmp/mutation/`` (ignored): ``summary.md`` (the table) and ``survivors.md`` (the diff
of every surviving mutant), and each module's mutmut output in ``logs/``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "reports" / "tmp" / "mutation"
#: the mutmut release this driver is written for (its .meta files and diff helper): the `mutation` extra
MUTMUT = "3.8.1"

UNIT = "unit and not slow"
_WIRE = ["tests/test_wire.py", "tests/test_properties.py", "tests/test_mutants_wire.py"]
_ADDRESSING = ["tests/test_options.py", "tests/test_values.py", "tests/test_queues.py", "tests/test_vacuum.py",
               "tests/test_privileges.py", "tests/test_mutants_addressing.py", "tests/test_mutants_routing.py"]

#: module (under spark_qtransport/) -> the unit-tier test files that reach it, found with coverage's per-test
#: contexts over `pytest -m "unit and not slow"`, less those that reach it only on the way to something else
#: and cost much. tests/test_stage_columns.py and tests/test_stage_fast.py (property tests: a minute together,
#: which every surviving mutant pays) are kept for wire/outgoing.py (the headers text they hold equal to
#: `outgoing_headers`) and ids, not for checks.py, which they reach through the builder; tests/test_sqlserver_sql.py
#: and tests/test_sqlserver_guards.py are kept for routing and addressing. A file that does not exist is left out.
MODULES: dict[str, list[str]] = {
    "wire/names.py": _WIRE,
    "wire/decode.py": _WIRE + ["tests/test_decode.py", "tests/test_poison_at_ack.py"],
    "wire/encode.py": _WIRE + ["tests/test_values.py", "tests/test_postgres_sql.py", "tests/test_poison_at_ack.py"],
    "wire/failures.py": _WIRE + ["tests/test_values.py", "tests/test_postgres_sql.py", "tests/test_poison_at_ack.py",
                                 "tests/test_platform.py"],
    "wire/times.py": _WIRE + ["tests/test_decode.py", "tests/test_values.py", "tests/test_postgres_sql.py",
                              "tests/test_poison_at_ack.py", "tests/test_monitoring.py", "tests/test_platform.py"],
    "wire/outgoing.py": _WIRE + ["tests/test_values.py", "tests/test_stage_fast.py", "tests/test_stage_columns.py"],
    "wire/ids.py": _WIRE + ["tests/test_values.py", "tests/test_stage_fast.py", "tests/test_inline.py"],
    "options/registry.py": ["tests/test_registry.py", "tests/test_options.py", "tests/test_docs.py",
                          "tests/test_unwrap.py", "tests/test_first_hour.py", "tests/test_invalid_rows.py",
                          "tests/test_audit_to_delta.py", "tests/test_mutants_registry.py"],
    "transport/routing.py": ["tests/test_options.py", "tests/test_registry.py", "tests/test_sqlserver_sql.py",
                             "tests/test_invalid_rows.py", "tests/test_mutants_routing.py"],
    "dialects/base/addressing.py": _ADDRESSING + ["tests/test_postgres_sql.py", "tests/test_sqlserver_sql.py",
                                                  "tests/test_sqlserver_guards.py", "tests/test_registry.py",
                                                  "tests/test_poison_at_ack.py", "tests/test_first_hour.py",
                                                  "tests/test_invalid_rows.py", "tests/test_audit_to_delta.py"],
    "dialects/postgres/addressing.py": _ADDRESSING + ["tests/test_postgres_sql.py", "tests/test_registry.py",
                                                      "tests/test_poison_at_ack.py", "tests/test_first_hour.py",
                                                      "tests/test_invalid_rows.py", "tests/test_audit_to_delta.py"],
    "dialects/sqlserver/addressing.py": _ADDRESSING + ["tests/test_sqlserver_sql.py",
                                                       "tests/test_sqlserver_guards.py"],
    "transport/sending/checks.py": ["tests/test_values.py", "tests/test_properties.py", "tests/test_mutants_checks.py"],
}

#: what the tests read besides the package and tests/ (mutmut copies only those two into its tree)
ALSO_COPY = ["docs/", "sql/", "conf/", "jobs/", "bench/", "notebooks/", "reports/", "README.md", "ARCHITECTURE.md",
             "Makefile", "mkdocs.yml", ".ci/"]


@dataclass
class Result:
    module: str
    statuses: dict[str, str] = field(default_factory=dict)  # mutant name -> mutmut's status
    seconds: float = 0.0
    error: str = ""
    note: str = ""

    def count(self, *statuses: str) -> int:
        return sum(1 for s in self.statuses.values() if s in statuses)

    @property
    def other(self) -> int:
        return len(self.statuses) - self.count("killed", "survived", "timeout")

    @property
    def score(self) -> float | None:
        return 100.0 * self.count("killed", "timeout") / len(self.statuses) if self.statuses else None


def ensure_mutmut() -> None:
    """mutmut at the pinned version in this interpreter's environment (installed when it is not)."""
    try:
        from importlib.metadata import version

        if version("mutmut") == MUTMUT:
            return
    except Exception:  # noqa: BLE001 - not installed
        pass
    print(f"installing mutmut=={MUTMUT}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"mutmut=={MUTMUT}"], check=True)


def copy_tree(work: Path) -> None:
    """The repository's files (tracked, and untracked but not ignored: new tests count) into `work`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def setup_cfg(module: str, tests: list[str]) -> str:
    lines = ["[mutmut]", "source_paths = spark_qtransport", f"only_mutate = spark_qtransport/{module}",
             "pytest_add_cli_args = -m", f"    {UNIT}", "    -p", "    no:cacheprovider",
             "pytest_add_cli_args_test_selection = " + "\n    ".join(tests),
             "also_copy = " + "\n    ".join(ALSO_COPY),
             "timeout_multiplier = 15", "timeout_constant = 3", "use_git_change_detection = false"]
    return "\n".join(lines) + "\n"


def run_module(module: str, work: Path, max_children: int, log: Path) -> Result:
    """``mutmut run`` of `module` in `work` (a copy of the repository made for it)."""
    result = Result(module)
    source = work / "spark_qtransport" / module
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(ast.parse(source.read_text()))):
        result.note = "no functions: nothing mutmut mutates"
        return result
    tests = [t for t in MODULES[module] if (work / t).is_file()]
    (work / "setup.cfg").write_text(setup_cfg(module, tests))
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)], cwd=work,
                              stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    result.seconds = time.monotonic() - started
    meta = work / "mutants" / "spark_qtransport" / f"{module}.meta"
    if meta.is_file():
        from mutmut.stats import status_by_exit_code

        codes = json.loads(meta.read_text())["exit_code_by_key"]
        result.statuses = {name: status_by_exit_code[code] for name, code in codes.items()}
    if done.returncode != 0:
        result.error = f"mutmut exited {done.returncode} (see {log})"
    return result


def survivor_diffs(result: Result, work: Path) -> list[str]:
    """The diff of each surviving mutant of `result`'s module (mutmut's own `show`)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    out = []
    here = Path.cwd()
    os.chdir(work)
    try:
        for name, status in sorted(result.statuses.items()):
            if status == "survived":
                out.append(f"### {name}\n```diff\n{get_diff_for_mutant(name, path=Path('spark_qtransport') / result.module)}\n```\n")
    finally:
        os.chdir(here)
    return out


def table(results: list[Result], wall: float) -> str:
    rows = [("module", "mutants", "killed", "survived", "timeout", "other", "score %", "seconds")]
    for r in results:
        rows.append((r.module, str(len(r.statuses)), str(r.count("killed")), str(r.count("survived")),
                     str(r.count("timeout")), str(r.other), "-" if r.score is None else f"{r.score:.1f}",
                     f"{r.seconds:.0f}" + (" (error)" if r.error else "") + (f" ({r.note})" if r.note else "")))
    total = sum(len(r.statuses) for r in results)
    detected = sum(r.count("killed", "timeout") for r in results)
    rows.append(("total", str(total), str(sum(r.count("killed") for r in results)),
                 str(sum(r.count("survived") for r in results)), str(sum(r.count("timeout") for r in results)),
                 str(sum(r.other for r in results)), f"{100.0 * detected / total:.1f}" if total else "-",
                 f"{wall:.0f} (wall)"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="modules whose path holds this text (repeatable)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2, help="mutants run at once")
    parser.add_argument("--keep", action="store_true", help="keep the work directories (printed)")
    parser.add_argument("--fail-under", type=float, default=0.0, help="exit 1 when the total score is below this")
    args = parser.parse_args()

    ensure_mutmut()
    modules = [m for m in MODULES if not args.only or any(o in m for o in args.only)]
    if not modules:
        parser.error(f"no module matches {args.only}")
    (REPORT / "logs").mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="spark-qtransport-mutation-"))
    started = time.monotonic()
    results: list[Result] = []
    survivors: list[str] = []
    try:
        for module in modules:
            slug = module.replace("/", "_").removesuffix(".py")
            log, work = REPORT / "logs" / f"{slug}.log", root / slug
            copy_tree(work)
            print(f"mutating spark_qtransport/{module} ...", flush=True)
            result = run_module(module, work, args.max_children, log)
            results.append(result)
            survivors += [f"## spark_qtransport/{module}\n"] + survivor_diffs(result, work)
            (REPORT / "survivors.md").write_text("\n".join(survivors))  # as it goes: a long run can be read early
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            print(f"  {len(result.statuses)} mutants, {result.count('survived')} survived, {result.seconds:.0f} s"
                  + (f"; {result.error}" if result.error else ""), flush=True)
    finally:
        if args.keep:
            print(f"work directories kept: {root}/<module> (`mutmut browse` there)")
        else:
            shutil.rmtree(root, ignore_errors=True)
    text = table(results, time.monotonic() - started)
    print(text)
    (REPORT / "summary.md").write_text(text + "\n")
    (REPORT / "survivors.md").write_text("\n".join(survivors))
    print(f"survivors: {(REPORT / 'survivors.md').relative_to(ROOT)}")
    total = sum(len(r.statuses) for r in results)
    score = 100.0 * sum(r.count("killed", "timeout") for r in results) / total if total else 100.0
    return 1 if any(r.error for r in results) or score < args.fail_under else 0


if __name__ == "__main__":
    sys.exit(main())
