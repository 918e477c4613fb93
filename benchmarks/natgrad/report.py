"""Targets, plots and the BENCHMARKS.md section of the natgrad benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks.common import fmt, markdown_table


def _median(rows: list[dict[str, Any]], problem: str, method: str) -> float:
    for r in rows:
        if r["problem"] == problem and r["method"] == method:
            return float(r["median final rel. L2"])
    return float("nan")


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets on 2D Poisson (median final relative L2 over seeds, same run)."""
    spring = _median(rows, "poisson2d", "SPRING")
    engd = _median(rows, "poisson2d", "ENGD")
    sng = _median(rows, "poisson2d", "SNG")
    adam = _median(rows, "poisson2d", "Adam")
    lbfgs = _median(rows, "poisson2d", "L-BFGS")
    checks = [
        ("SPRING rel. L2 <= 1e-7", spring, spring <= 1e-7),
        ("ENGD rel. L2 <= 1e-6", engd, engd <= 1e-6),
        ("SNG rel. L2 <= 2e-5", sng, sng <= 2e-5),
        ("Adam / SPRING >= 100", adam / spring, adam / spring >= 100),
        ("L-BFGS / SPRING >= 10", lbfgs / spring, lbfgs / spring >= 10),
    ]
    return [
        {"target": name, "measured": value, "status": "PASS" if ok else "MISSED"}
        for name, value, ok in checks
    ]


def write_plots(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """One error-versus-training-time panel per problem (all seeds, one colour per method)."""
    problems = list(dict.fromkeys(r["problem"] for r in runs))
    fig, axes = plt.subplots(1, len(problems), figsize=(5 * len(problems), 4), squeeze=False)
    colours = {"Adam": "C0", "L-BFGS": "C1", "ENGD": "C2", "SNG": "C3", "SPRING": "C4"}
    for ax, problem in zip(axes[0], problems, strict=True):
        seen: set[str] = set()
        for r in runs:
            if r["problem"] != problem:
                continue
            label = r["method"] if r["method"] not in seen else None
            seen.add(r["method"])
            ax.semilogy(
                r["trace"]["time"],
                r["trace"]["error"],
                color=colours[r["method"]],
                label=label,
                alpha=0.8,
            )
        ax.set_title(problem)
        ax.set_xlabel("training wall-clock time [s]")
        ax.set_ylabel("relative L2 error")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out / "natgrad_error_vs_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def section_markdown(
    *,
    command: str,
    machine: str,
    table: str,
    checks: list[dict[str, Any]],
    plots: list[str],
    setups: dict[str, Any],
    seeds: list[int],
    smoke_note: str | None = None,
) -> str:
    """The section; with ``smoke_note`` (a ``--quick`` run) the note replaces the targets."""
    budgets = ", ".join(f"{k} {s.budget_s:g} s" for k, s in setups.items())
    hyper = next(iter(setups.values())).hyper
    settings = "; ".join(f"{m}: {h}" for m, h in hyper.items())
    for name, setup in setups.items():
        changed = {m: h for m, h in setup.hyper.items() if hyper.get(m) != h}
        if changed:
            settings += f". Overrides for {name}: " + "; ".join(
                f"{m}: {h}" for m, h in changed.items()
            )
    target_rows = [
        {"target": c["target"], "measured": fmt(c["measured"]), "status": c["status"]}
        for c in checks
    ]
    plot_lines = "\n".join(f"![{p}](benchmarks/natgrad/results/{p})" for p in plots)
    verdicts = (
        smoke_note
        if smoke_note is not None
        else "Targets (2D Poisson, median over seeds, this run):\n\n"
        + markdown_table(target_rows, ["target", "measured", "status"])
    )
    return f"""## Natgrad{" (smoke run)" if smoke_note is not None else ""}

Command: `{command}`

{machine}

Relative L2 error on a fixed test set after an equal wall-clock training budget per method
and seed (seeds {seeds}; budgets: {budgets}; evaluation time excluded). Float64, tanh MLPs
2-32-1 (2D Poisson, heat) and 5-64-1 (5D Poisson). 2D problems: 30x30 interior midpoints +
120 boundary points; Adam, L-BFGS (fixed batch) and ENGD use all 1020 rows, SNG/SPRING draw
64 + 16 rows per step. 5D Poisson: fresh points every step (ENGD/Adam 1000 + 200, SNG/SPRING
256 + 64; L-BFGS one fixed 1000 + 200 batch). Torch runs single-threaded (the per-step
tensors are tiny; on this shared 2-core machine a second OpenMP thread mostly waits for a
descheduled partner). The machine is shared with other jobs, so wall-clock budgets are noisy:
the step counts say how much work each method got done. `lr_final_fraction` means the step
size decays linearly in training time to that fraction of `lr` at the end of the budget.
Settings: {settings}.

{table}

{verdicts}

{plot_lines}
"""
