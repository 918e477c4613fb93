"""What the decision-focused demos (``examples/shortest_path``, ``examples/transportation``)
share: the output folder, the paired verdict over seeds, the bar plot and the results file.

The verdict is a paired comparison: with :math:`\\delta_s` the difference of the two methods'
scores on seed :math:`s` (lower is better), a mean :math:`\\bar\\delta` beyond two standard
errors :math:`2\\,\\mathrm{sd}(\\delta)/\\sqrt{S}` is called a difference; otherwise it is within
the noise, and one seed has no spread to judge it by.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_output_options", "bar_plot", "output_folder", "paired_verdict", "write_results"]


def output_folder(script: str, installed_name: str) -> Path:
    """``out/`` next to the demo's ``script``; ``./<installed_name>`` in the working directory
    when the demo runs from an installed wheel (never write into site-packages)."""
    here = Path(script).resolve().parent / "out"
    if "site-packages" in here.parts or "dist-packages" in here.parts:
        return Path.cwd() / installed_name
    return here


def add_output_options(parser: argparse.ArgumentParser, *, quick: str, installed_name: str) -> None:
    """The ``--quick`` (``quick``: what the smoke run does) and ``--out`` options."""
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke run ({quick}) into a temporary folder"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output folder (default: out/ next to this script, ./{installed_name} from an "
        "installed wheel; with --quick a temporary folder)",
    )


def resolve_output(args: argparse.Namespace, default: Path, prefix: str) -> Path:
    """``args.out``, else a temporary folder for ``--quick``, else ``default``."""
    if args.out is not None:
        return Path(args.out)
    return Path(tempfile.mkdtemp(prefix=prefix)) if args.quick else default


def paired_verdict(
    candidate: Sequence[float], baseline: Sequence[float], *, score: str, digits: int
) -> str:
    """Compare ``candidate`` with ``baseline`` seed by seed (lower ``score`` is better)."""
    diffs = [a - b for a, b in zip(candidate, baseline, strict=True)]
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        word = "lower" if mean < 0 else "higher"
        return f"{word} by {abs(mean):.{digits}f} (one seed: no spread to judge it by)"
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    if mean < -2 * se:
        return f"BETTER: {score} lower by {-mean:.{digits}f} (> 2 standard errors, {se:.{digits}f})"
    if mean > 2 * se:
        return f"WORSE: {score} higher by {mean:.{digits}f} (> 2 standard errors, {se:.{digits}f})"
    return f"no clear difference: {mean:+.{digits}f} is within 2 standard errors ({se:.{digits}f})"


def bar_plot(
    path: Path, draw: Callable[[Any], None], *, title: str, ylabel: str, size: tuple[int, int]
) -> bool:
    """Draw bars with ``draw(ax)`` and save them to ``path`` (its folder created); ``False``
    without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_results(out_dir: Path, summary: dict[str, Any]) -> Path:
    """``results.json`` in ``out_dir`` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps(summary, indent=2))
    return path
