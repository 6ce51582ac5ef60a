"""The chaos report: each test prints its figures and, when ``SQLQUEUE_CHAOS_REPORT`` names a
directory, writes them there as a Markdown section (plus PNG plots); ``conftest.py`` joins the
sections of one run into ``<dir>/chaos.md``."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: the order of the sections in chaos.md
SECTIONS = ("crash-loop", "db-faults", "competition", "backlog")


def directory() -> Path | None:
    path = os.environ.get("SQLQUEUE_CHAOS_REPORT")
    return Path(path) if path else None


def table(rows: Sequence[tuple[str, Any]], head: tuple[str, str] = ("figure", "value")) -> list[str]:
    return [f"| {head[0]} | {head[1]} |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def section(name: str, lines: list[str], figures: dict[str, Any]) -> None:
    """Print the figures; with a report directory, write the section's Markdown."""
    print(f"{name}:", json.dumps(figures, default=str))
    out = directory()
    if out is None:
        return
    (out / "sections").mkdir(parents=True, exist_ok=True)
    (out / "sections" / f"{name}.md").write_text("\n".join(lines) + "\n")


class Sampler(threading.Thread):
    """Calls `sample()` every `every` seconds and keeps what it returns, stamped with the seconds
    since start (``t``). A sample that fails (the server restarting) is skipped."""

    def __init__(self, sample: Callable[[], dict[str, float]], every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.sample, self.every, self.samples = sample, every, []  # type: ignore[var-annotated]
        self.started = time.monotonic()
        self.halt = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.started

    def run(self) -> None:
        while not self.halt.wait(self.every):
            try:
                self.samples.append({"t": self.now(), **self.sample()})
            except Exception:  # noqa: BLE001 - a missed sample is a gap in the plot, nothing more
                pass

    def stop(self) -> list[dict[str, float]]:
        """Stop sampling; one last sample shows where things ended."""
        self.halt.set()
        self.join(30)
        try:
            self.samples.append({"t": self.now(), **self.sample()})
        except Exception:  # noqa: BLE001
            pass
        return self.samples


def rates(samples: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """Per-second rates of a running total between consecutive samples."""
    ts, rs = [], []
    for a, b in zip(samples, samples[1:], strict=False):
        if key in a and key in b and b["t"] > a["t"]:
            ts.append(b["t"])
            rs.append(max(b[key] - a[key], 0) / (b["t"] - a["t"]))
    return ts, rs


def plot(name: str, samples: list[dict[str, float]], *, totals: dict[str, str], levels: dict[str, str],
         events: Sequence[tuple[float, str]] = (), title: str = "") -> str | None:
    """A PNG with the rates of `totals` (msg/s) above and `levels` below (one axis each), and a
    vertical line per event (kills, restarts). Returns its file name, or None without a report
    directory or samples."""
    out = directory()
    if out is None or len(samples) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1 + len(levels), 1, figsize=(10, 3 + 2 * len(levels)), sharex=True, squeeze=False)
    top = axes[0][0]
    for key, label in totals.items():
        top.plot(*rates(samples, key), label=label, linewidth=1)
    top.set_ylabel("messages/s")
    top.legend(loc="upper right")
    top.set_title(title)
    for ax, (key, label) in zip((a[0] for a in axes[1:]), levels.items(), strict=True):
        ax.plot([s["t"] for s in samples if key in s], [s[key] for s in samples if key in s], linewidth=1)
        ax.set_ylabel(label)
    for ax in (a[0] for a in axes):
        for t, what in events:
            ax.axvline(t, color="red" if what == "kill" else "purple", alpha=0.3, linewidth=1)
        ax.grid(alpha=0.3)
    axes[-1][0].set_xlabel("seconds" + ("  (red: SIGKILL of the job, purple: other events)" if events else ""))
    fig.tight_layout()
    file = f"{name}.png"
    out.mkdir(parents=True, exist_ok=True)  # (a report's first figure may come before its first section)
    fig.savefig(out / file, dpi=80)
    plt.close(fig)
    return file
