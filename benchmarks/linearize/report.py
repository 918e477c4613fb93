"""The linearize benchmark's claims, plots and BENCHMARKS.md section."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.linearize.methods import METHODS, Config
from benchmarks.linearize.tasks import TASKS


def _mean(runs: list[dict[str, Any]], method: str, key: str) -> float:
    return statistics.fmean(r[key] for r in runs if r["method"] == method)


def claims(runs: list[dict[str, Any]], cost: dict[str, dict[str, float]]) -> list[dict]:
    """The paper's three claims, each checked against a stated tolerance (means over seeds)."""
    m = {
        k: {meth: _mean(runs, meth, k) for meth in METHODS}
        for k in (
            "single_mean",
            "add_norm",
            "add_abs",
            "add_gain",
            "neg_target",
            "neg_control",
            "xi",
        )
    }
    out = []

    def check(claim: str, ok: bool, figures: str) -> None:
        out.append(
            {"claim": claim, "status": "HOLDS" if ok else "DOES NOT HOLD", "figures": figures}
        )

    check(
        "task addition of the student within 2 points (normalised acc.) of the linearized teacher",
        m["add_norm"]["delta"] >= m["add_norm"]["linear"] - 0.02,
        f"student {m['add_norm']['delta']:.3f}, teacher {m['add_norm']['linear']:.3f}, "
        f"standard {m['add_norm']['standard']:.3f} (absolute accuracy gain of the merged "
        f"model over θ₀: student {m['add_gain']['delta']:+.3f}, teacher "
        f"{m['add_gain']['linear']:+.3f}, standard {m['add_gain']['standard']:+.3f})",
    )
    check(
        "task negation of the student within 2 points (target acc.) of the linearized teacher",
        m["neg_target"]["delta"] <= m["neg_target"]["linear"] + 0.02,
        f"student {m['neg_target']['delta']:.3f}, teacher {m['neg_target']['linear']:.3f}, "
        f"standard {m['neg_target']['standard']:.3f}",
    )
    check(
        "weight disentanglement of the student better than standard fine-tuning (lower ξ)",
        m["xi"]["delta"] < m["xi"]["standard"],
        f"student {m['xi']['delta']:.3f}, teacher {m['xi']['linear']:.3f}, "
        f"standard {m['xi']['standard']:.3f}",
    )
    check(
        "single-task accuracy of the student within 2 points of standard fine-tuning",
        m["single_mean"]["delta"] >= m["single_mean"]["standard"] - 0.02,
        f"student {m['single_mean']['delta']:.3f}, standard {m['single_mean']['standard']:.3f}, "
        f"teacher {m['single_mean']['linear']:.3f}",
    )
    fs, fd, fl = (cost[k]["mflop_per_example"] for k in ("standard", "delta", "linear"))
    s, d, lin = (cost[k]["us_per_example"] for k in ("standard", "delta", "linear"))
    check(
        "no inference overhead: the student's forward costs the standard model's FLOPs, the "
        "linearized model's more",
        fd == fs and fl > 1.5 * fs,
        f"MFLOP/example: student {fd:.3f}, standard {fs:.3f}, linearized {fl:.3f} "
        f"({fl / fs:.2f}x); µs/example (noisy, shared machine): student {d:.1f}, standard "
        f"{s:.1f}, linearized {lin:.1f}; peak KB/example: student "
        f"{cost['delta']['peak_bytes_per_example'] / 1024:.1f}, linearized "
        f"{cost['linear']['peak_bytes_per_example'] / 1024:.1f}",
    )
    check(
        "the student's curvature term helps task arithmetic (normalised addition acc. and ξ "
        "better than without it)",
        m["add_norm"]["delta"] > m["add_norm"]["delta_no_curv"]
        and m["xi"]["delta"] < m["xi"]["delta_no_curv"],
        f"with {m['add_norm']['delta']:.3f} / ξ {m['xi']['delta']:.3f}, without "
        f"{m['add_norm']['delta_no_curv']:.3f} / ξ {m['xi']['delta_no_curv']:.3f}",
    )
    return out


def notes(payload: dict[str, Any]) -> list[str]:
    """Readings of the table that the claim checks alone would hide."""
    runs = payload["runs"]
    gains = {m: _mean(runs, m, "add_gain") for m in METHODS}
    alphas = {m: _mean(runs, m, "add_alpha") for m in METHODS}
    at_one = {m: statistics.fmean(c[-1] for c in payload["addition_curves"][m]) for m in METHODS}
    out = []
    if max(gains.values()) < 0.05:
        out.append(
            "Task addition barely beats θ₀ for any method (mean α* at most "
            f"{max(alphas.values()):.2f}; accuracy gain of the merged model over θ₀ at most "
            f"{max(gains.values()):+.3f}): the four transformed-digit tasks interfere in this "
            "small CNN, so the addition comparison carries little information at this scale, "
            "and normalised accuracies differ mainly through their denominators (the "
            "single-task accuracies)."
        )
    out.append(
        "Plain sum of the four task vectors (α = 1), mean normalised validation accuracy: "
        + ", ".join(f"{m} {at_one[m]:.3f}" for m in METHODS)
        + " (see the first plot for the whole curve)."
    )
    return out


def write_plots(payload: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    alphas = payload["grids"]["addition"]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for m, curves in payload["addition_curves"].items():
        arr = np.array(curves)
        ax.plot(alphas, arr.mean(0), label=m, marker=".")
    ax.set_xlabel("α (θ₀ + α Σ τ_t)")
    ax.set_ylabel("mean normalised val. accuracy")
    ax.set_title("Task addition, 4 digits tasks (mean over seeds)")
    ax.legend()
    fig.tight_layout()
    p = out / "linearize_addition.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)

    heat = payload["xi_heatmaps_first_seed"]
    grid = payload["grids"]["disentangle"]
    pair = next(iter(next(iter(heat.values()))))
    fig, axes = plt.subplots(1, len(heat), figsize=(3.2 * len(heat), 3.4), layout="constrained")
    vmax = max(float(np.max(h[pair])) for h in heat.values()) or 1.0
    for ax, (m, h) in zip(np.atleast_1d(axes), heat.items()):
        im = ax.imshow(np.array(h[pair]), origin="lower", vmin=0, vmax=vmax, cmap="viridis")
        ax.set_xticks(range(len(grid)), [f"{a:g}" for a in grid])
        ax.set_yticks(range(len(grid)), [f"{a:g}" for a in grid])
        ax.set_title(m)
        ax.set_xlabel("α₂")
    np.atleast_1d(axes)[0].set_ylabel("α₁")
    fig.colorbar(im, ax=list(np.atleast_1d(axes)), shrink=0.8, label=f"ξ ({pair})")
    p = out / "linearize_disentanglement.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    return paths


def section_markdown(
    *,
    command: str,
    machine: str,
    info: dict[str, Any],
    table: str,
    checks: list[dict],
    plots: list[str],
    cfg: Config,
    seeds: list[int],
    zero_shot: list[float],
    control0: list[float],
    readings: list[str],
) -> str:
    la0 = ", ".join(f"{x:.2f}" for x in info["load_average_start"])
    la1 = ", ".join(f"{x:.2f}" for x in info["load_average_end"])
    lines = [
        "## Linearize",
        "",
        "Linearized fine-tuning, task arithmetic and DELTA (distilling a curvature-regularised "
        "linearized teacher into an ordinary student) on scikit-learn's bundled digits: a CNN "
        "(~14k weights) pretrained on upright digits (the control task), four tasks on "
        f"transformed digits ({', '.join(TASKS)}), frozen prototype heads built at θ₀, "
        f"{cfg.steps} AdamW steps (batch {cfg.batch}, lr {cfg.lr}) per task, curvature "
        f"weight λ = {cfg.curvature}, distillation weight w = {cfg.distill}; seeds {seeds}. "
        "Mean ± standard deviation over seeds; accuracies on the test split, α chosen on "
        "validation.",
        "",
        f"Command: `{command}`. {machine} Load average at start {la0}, at end {la1}; "
        f"total {info['total_seconds']:.0f} s wall, {info['cpu_seconds']:.0f} s CPU "
        "(the gap is time spent waiting for the shared cores).",
        "",
        table,
        "",
        f"Pretrained (θ₀, prototype heads) accuracy on the four tasks: "
        f"{statistics.fmean(zero_shot):.3f}; on the control task: "
        f"{statistics.fmean(control0):.3f}. Inference columns: one no-grad forward of 256 "
        "examples (fastest of 30, the four models timed round-robin), peak live-tensor "
        "bytes from `dxopt.estimators.MemoryTracker`, "
        "weights stored (the linearized model keeps θ₀ and δ).",
        "",
        "| claim | status | figures |",
        "|---|---|---|",
        *[f"| {c['claim']} | {c['status']} | {c['figures']} |" for c in checks],
        "",
        *[f"- {r}" for r in readings],
        "",
        *[f"![{p}](benchmarks/linearize/results/{p})" for p in plots],
    ]
    return "\n".join(lines)
