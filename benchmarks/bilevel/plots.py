"""Matplotlib figures (Agg backend, PNG) for the bilevel benchmark."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _loglog_fit_line(ax, xs, ys, slope, style, label):
    if slope is None or not xs:
        return
    x0, y0 = xs[0], ys[0]
    ax.plot([xs[0], xs[-1]], [y0, y0 * (xs[-1] / x0) ** slope], style, lw=0.8, label=label)


def kappa_plot(path: Path, rows: list[dict[str, Any]], fits: dict[str, Any]) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    markers = iter(["o-", "s-", "^--", "v:"])
    for method, fit in fits.items():
        pts = [(r["kappa"], r["calls"]) for r in rows if r["method"] == method and r["calls"]]
        if not pts:
            continue
        xs, ys = zip(*pts)
        s = fit["slope"]
        label = f"{method} (slope {s:.2f})" if s is not None else method
        ax.loglog(xs, ys, next(markers, "o-"), label=label)
    lb = sorted({(r["kappa"], r["lower_bound_Tn"]) for r in rows})
    if lb:
        xs, ys = zip(*lb)
        ax.loglog(xs, ys, "k--", lw=1, label="lower bound T n (slope 1.5)")
    ax.set_xlabel("kappa = 4 n^2 + 1")
    ax.set_ylabel("oracle calls to ||grad H|| <= eps")
    ax.set_title("Ji's instance: calls vs kappa (eps fixed, T = n^2/(12 eps^2))")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def separation_plot(
    path: Path, ji_rows: list[dict[str, Any]], ref_rows: list[dict[str, Any]], slopes: dict
) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    series = [
        ("bilevel: Ji, AID-CG+AGD", [(r["kappa"], r["calls"]) for r in ji_rows], slopes["ji"]),
        (
            "single-level: Nesterov chain, AGD",
            [(r["kappa"], r["nesterov_agd_calls"]) for r in ref_rows],
            slopes["nesterov"],
        ),
        (
            "single-level: Carmon chain, GD",
            [(r["kappa"], r["carmon_gd_calls"]) for r in ref_rows],
            slopes["carmon"],
        ),
    ]
    for label, pts, s in series:
        pts = [p for p in pts if p[1]]
        if pts:
            xs, ys = zip(*pts)
            ax.loglog(xs, ys, "o-", label=f"{label} (slope {s:.2f})" if s is not None else label)
    ax.set_xlabel("kappa")
    ax.set_ylabel("gradient-oracle calls")
    ax.set_title("Separation: bilevel vs single-level chains")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def frontier_plot(path: Path, runs: list[dict[str, Any]]) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    for run in runs:
        reach = run["frontier"]
        ax1.step(range(1, len(reach) + 1), reach, where="post", label=run["method"])
        fx = run["first_nonzero_x"]
        pts = [(i + 1, c) for i, c in enumerate(fx) if c > 0]
        if pts:
            ii, cc = zip(*pts)
            ax2.step(cc, ii, where="post", label=run["method"])
    if runs:
        n, T = runs[0]["n"], runs[0]["T"]
        top = max(len(r["frontier"]) for r in runs)
        ax1.plot([0, top], [0, top], "k:", lw=0.8, label="one coordinate per call")
        ax2.plot([n * i for i in range(1, T + 1)], range(1, T + 1), "k--", lw=0.8, label="i n")
        ax1.set_xscale("log")
        ax2.set_xscale("log")
        ax1.set_ylim(-1, (T + 1) * n + 2)
    ax1.set_xlabel("oracle calls")
    ax1.set_ylabel("chain position reached")
    ax1.set_title("Frontier of the zero-chain")
    ax2.set_xlabel("oracle calls")
    ax2.set_ylabel("index i of the last nonzero x_i")
    ax2.set_title("Staircase: x_i activates after >= i n calls")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def epsilon_plot(path: Path, rows: list[dict[str, Any]], slope: float | None) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    pts = [(1.0 / r["epsilon"], r["calls"]) for r in rows if r["calls"]]
    if pts:
        xs, ys = zip(*pts)
        label = f"AID-CG+AGD, n = {rows[0]['n']} (slope {slope:.2f})" if slope else "AID-CG+AGD"
        ax.loglog(xs, ys, "o-", label=label)
        _loglog_fit_line(ax, list(xs), list(ys), 2.0, "k--", "slope 2")
    ax.set_xlabel("1 / eps")
    ax.set_ylabel("oracle calls to ||grad H|| <= eps")
    ax.set_title("Epsilon scaling on Ji's instance (T = n^2/(12 eps^2))")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def task_plot(path: Path, rows: list[dict[str, Any]]) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    lows = []
    for r in rows:
        # skip the first record (y = 0 before any call, f = log 2), which hides the curves
        vals = [v if math.isfinite(v) else float("nan") for v in r["curve_val_loss"][1:]]
        ax1.plot(r["curve_calls"][1:], vals, label=r["method"])
        ax2.plot(r["curve_seconds"][1:], vals, label=r["method"])
        lows += [v for v in vals if math.isfinite(v)]
    if rows and lows:
        top = 1.15 * rows[0]["start_val_loss"]
        for ax in (ax1, ax2):
            ax.set_ylim(0.95 * min(lows), top)
            ax.set_xscale("log")
            ax.axhline(rows[0]["start_val_loss"], color="k", ls=":", lw=0.8, label="H(0)")
    ax1.set_xlabel("oracle calls")
    ax2.set_xlabel("seconds (method time, evaluation excluded)")
    for ax in (ax1, ax2):
        ax.set_ylabel("validation loss f(x, y_t)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_title("Breast cancer: per-feature L2 selection")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
