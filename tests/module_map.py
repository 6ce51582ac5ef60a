"""The module map of a part of the package: each module's lines and which modules of that part it
imports and is imported by (imports inside functions and under TYPE_CHECKING included), and the
import circles among them. ARCHITECTURE.md's maps before and after a restructuring come from it.

    .venv/bin/python tests/module_map.py transport.receiving transport.platform
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_layers import ROOT, _module, _sources, circles, imports_of  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", help="dotted parts of the package, e.g. transport.receiving")
    args = parser.parse_args(argv)
    prefixes = tuple(f"{ROOT}.{p}" for p in args.parts)
    paths = {_module(p): p for p in _sources() if _module(p).startswith(prefixes)}
    graph = {m: {t for t in imports_of(p) if t in paths} for m, p in paths.items()}
    short = {m: m[len(ROOT) + 1:] for m in paths}
    print("| module | lines | imports (of these) | imported by (of these) |")
    print("|---|---:|---|---|")
    for m in sorted(paths):
        lines = len(paths[m].read_text().splitlines())
        out = ", ".join(sorted(short[t].rsplit(".", 1)[-1] for t in graph[m])) or "-"
        into = ", ".join(sorted(short[s].rsplit(".", 1)[-1] for s in paths if m in graph[s])) or "-"
        print(f"| `{short[m]}` | {lines} | {out} | {into} |")
    total = sum(len(p.read_text().splitlines()) for p in paths.values())
    print(f"\n{len(paths)} modules, {total:,} lines")
    found = circles(graph)
    print("import circles: " + ("; ".join(" <-> ".join(short[m] for m in g) for g in found) if found else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
