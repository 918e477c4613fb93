"""Gradient errors, targets, tables and plots of the QP benchmark."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import markdown_table

DXOPT = ("dxopt_penalty", "dxopt_kkt")


def grad_error(grads: dict[str, np.ndarray], ref: dict[str, np.ndarray], blocks: list[str]):
    """``||g - g_ref|| / ||g_ref||`` over the concatenated ``blocks``, or None if missing."""
    if not ref or any(k not in grads or k not in ref for k in blocks):
        return None
    num = sum(float(np.sum((grads[k] - ref[k]) ** 2)) for k in blocks)
    den = sum(float(np.sum(ref[k] ** 2)) for k in blocks)
    return math.sqrt(num / den) if den > 0 else None


def total(rec: dict[str, Any]) -> float | None:
    if rec.get("status") != "ok" or rec.get("forward_s") is None:
        return None
    return rec["forward_s"] + (rec.get("backward_s") or 0.0)


def _cell(records: list[dict], family: str, n: int, method: str) -> dict[str, Any]:
    for r in records:
        if r["family"] == family and r["n"] == n and r["method"] == method:
            return r
    return {}


def _fastest_raw(records: list[dict], family: str, n: int) -> tuple[float | None, str]:
    raws = [
        (r["forward_s"], r["method"][4:])
        for r in records
        if r["family"] == family and r["n"] == n and r["method"].startswith("raw_")
        and r.get("status") == "ok" and r.get("found", True)
    ]  # fmt: skip
    return min(raws) if raws else (None, "-")


def _verdict(value: float | None, bound: float, *, at_most: bool) -> str:
    if value is None or value != value:
        return "MISSED (not measured)"
    ok = value <= bound if at_most else value >= bound
    return "PASS" if ok else "MISSED"


def targets(records: list[dict], *, batch_n: int, simplex_n: int) -> list[dict[str, Any]]:
    """Every target of issue 6 with its measured figure and verdict."""
    rows: list[dict[str, Any]] = []

    def add(name: str, value: float | None, bound: float, at_most: bool, note: str = "") -> None:
        rel = "<=" if at_most else ">="
        rows.append({
            "target": name, "bound": f"{rel} {bound:g}", "measured": value,
            "verdict": _verdict(value, bound, at_most=at_most), "note": note,
        })  # fmt: skip

    for n in (1000, 2000):
        raw, raw_name = _fastest_raw(records, "dense", n)
        chol = _cell(records, "dense", n, "cholesky").get("forward_s")
        qpth = total(_cell(records, "dense", n, "qpth"))
        for method in DXOPT:
            rec = _cell(records, "dense", n, method)
            tot, bwd = total(rec), rec.get("backward_s")
            label = method.replace("dxopt_", "")
            add(f"dense n={n}: {label} fwd+bwd / fastest raw solve ({raw_name})",
                tot / raw if tot and raw else None, 1.25, True)  # fmt: skip
            add(f"dense n={n}: qpth fwd+bwd / {label} fwd+bwd",
                qpth / tot if tot and qpth else None, 2.0, False)  # fmt: skip
            add(f"dense n={n}: {label} backward / one dense Cholesky",
                bwd / chol if bwd is not None and chol else None, 3.0, True)  # fmt: skip
    qpth_b = total(_cell(records, "batched", batch_n, "qpth"))
    for method in DXOPT:
        tot = total(_cell(records, "batched", batch_n, method))
        add(f"batched 128 x n={batch_n}: qpth / {method.replace('dxopt_', '')} (fwd+bwd)",
            qpth_b / tot if tot and qpth_b else None, 5.0, False)  # fmt: skip
    raw, raw_name = _fastest_raw(records, "simplex", simplex_n)
    for method in DXOPT:
        rec = _cell(records, "simplex", simplex_n, method)
        label = method.replace("dxopt_", "")
        done = 1.0 if rec.get("status") == "ok" else 0.0
        add(f"simplex n={simplex_n:.0e}: {label} completes (1 = yes)", done, 1.0, False,
            rec.get("status", "not run"))  # fmt: skip
        add(f"simplex n={simplex_n:.0e}: {label} grad rel. err vs closed form",
            rec.get("grad_err"), 1e-6, True)  # fmt: skip
        bwd = rec.get("backward_s")
        add(f"simplex n={simplex_n:.0e}: {label} backward / fastest raw solve ({raw_name})",
            bwd / raw if bwd is not None and raw else None, 0.5, True)  # fmt: skip
    for method in DXOPT:
        errs = [r.get("grad_err") for r in records if r["family"] == "dense"
                and r["method"] == method and r.get("status") == "ok"]  # fmt: skip
        worst = max((e for e in errs if e is not None), default=None)
        add(f"dense family: {method.replace('dxopt_', '')} max grad rel. err (all n)",
            worst, 1e-6, True)  # fmt: skip
    return rows


def results_table(records: list[dict], family: str) -> str:
    rows = []
    for r in records:
        if r["family"] != family:
            continue
        rows.append({
            "n": r["n"], "method": r["method"], "build s": r.get("build_s"),
            "forward s": r.get("forward_s") if r.get("status") == "ok" else None,
            "backward s": r.get("backward_s") if r.get("status") == "ok" else None,
            "runs": r.get("runs"), "first call s": r.get("first_s"),
            "grad rel. err": r.get("grad_err"),
            "status": r.get("status", "-"),
        })  # fmt: skip
    cols = ["n", "method", "build s", "forward s", "backward s", "runs", "first call s"]
    cols += ["grad rel. err", "status"]
    return markdown_table(rows, cols)


def targets_table(rows: list[dict]) -> str:
    return markdown_table(rows, ["target", "bound", "measured", "verdict", "note"])


def plot_family(records: list[dict], family: str, path: Path) -> None:
    """Log-log plots: fwd+bwd time vs n per method, and gradient error vs n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    methods = sorted({r["method"] for r in records if r["family"] == family})
    for method in methods:
        cells = sorted((r for r in records if r["family"] == family and r["method"] == method),
                       key=lambda r: r["n"])  # fmt: skip
        pts = [(r["n"], total(r)) for r in cells if total(r)]
        if pts:
            ax_t.plot(*zip(*pts), marker="o", label=method)
        errs = [(r["n"], r["grad_err"]) for r in cells if r.get("grad_err")]
        if errs:
            ax_e.plot(*zip(*errs), marker="o", label=method)
    for ax, ylabel in ((ax_t, "forward + backward [s]"), (ax_e, "grad rel. error")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_e.axhline(1e-6, color="k", ls="--", lw=0.8)
    if ax_t.get_legend_handles_labels()[0]:
        ax_t.legend(fontsize=7)
    fig.suptitle(f"QP benchmark: {family}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
