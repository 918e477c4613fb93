"""Shared helpers for the benchmarks: timing, machine facts, JSON/Markdown output.

Every benchmark writes its raw results as JSON and a Markdown table under
``benchmarks/<area>/results/`` and replaces its own section of ``BENCHMARKS.md`` (between
``<!-- BEGIN <area> -->`` and ``<!-- END <area> -->``), so ``dxopt bench <area>`` reproduces
that section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = REPO_ROOT / "BENCHMARKS.md"


SMOKE_VERDICT = "smoke run"
"""What a ``--quick`` run prints where a full run prints a target's verdict: a smoke budget
measures nothing a target is about."""

SMOKE_NOTE = (
    "Smoke run (`--quick`): budgets far below the targets', so no target verdicts; the figures "
    "only show that every path runs."
)


def verdict(ok: bool, *, quick: bool, met: str = "PASS", missed: str = "MISSED") -> str:
    """A target's verdict: ``met`` or ``missed``, or :data:`SMOKE_VERDICT` in a smoke run."""
    if quick:
        return SMOKE_VERDICT
    return met if ok else missed


def smoke_verdicts(targets: list[dict[str, Any]], key: str = "verdict") -> list[dict[str, Any]]:
    """The target rows of a ``--quick`` run: each ``key`` replaced by :data:`SMOKE_VERDICT`
    (rows without a verdict, ``"-"`` or no ``key``, unchanged)."""
    return [{**t, key: SMOKE_VERDICT} if t.get(key, "-") != "-" else t for t in targets]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def set_threads(n: int = 2) -> None:
    """Pin torch's intra-op threads (and BLAS, for child processes) to ``n``."""
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    torch.set_num_threads(n)


def results_dir(area: str) -> Path:
    out = REPO_ROOT / "benchmarks" / area / "results"
    out.mkdir(parents=True, exist_ok=True)
    return out


def median_time(fn: Callable[[], Any], *, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine_info() -> dict[str, Any]:
    import numpy
    import scipy
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "commit": commit,
    }


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def fmt(value: Any, digits: int = 3) -> str:
    """Format a number compactly for tables (``-`` for None/NaN)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if value == 0.0:
            return "0"
        if abs(value) >= 1e4 or abs(value) < 1e-2:
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def machine_line(info: dict[str, Any]) -> str:
    return (
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
        f"({info['torch_threads']} threads), Python {info['python']}; "
        f"run {info['date']} at commit {info['commit'] or 'unknown'}."
    )


def update_benchmarks_md(area: str, section: str) -> None:
    """Replace (or add) ``area``'s section of BENCHMARKS.md, keeping the others."""
    begin, end = f"<!-- BEGIN {area} -->", f"<!-- END {area} -->"
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else "# Benchmarks\n"
    block = f"{begin}\n{section.strip()}\n{end}"
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        _, post = rest.split(end, 1)
        text = pre + block + post
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS_MD.write_text(text)


def publish(
    out: Path,
    stem: str,
    text: str,
    *,
    area: str | None = None,
    plot: Callable[[Path], None] | None = None,
) -> None:
    """Write a run's report: ``out/<stem>.md``, the plot ``out/<stem>.png`` (``plot(path)``),
    the BENCHMARKS.md section ``area`` (``None``: leave BENCHMARKS.md alone), and print it."""
    (out / f"{stem}.md").write_text(text)
    if plot is not None:
        plot(out / f"{stem}.png")
    if area is not None:
        update_benchmarks_md(area, text)
    print(text)
