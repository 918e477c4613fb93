"""Summaries, targets, the Markdown section and the plots of the DFL benchmark."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import fmt, markdown_table
from benchmarks.dfl.methods import HYPER, METHODS

PROBLEM_NAMES = {"sp": "shortest path 5x5", "ks": "2-D knapsack (32 items)"}
SPEEDUP_TARGET = 3.0


def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean, sd = _mean_sd(values)
    return f"{mean:.4f} ± {sd:.4f}" if len(values) > 1 else f"{mean:.4f}"


def _select(runs: list[dict[str, Any]], **keys: Any) -> list[dict[str, Any]]:
    return [r for r in runs if all(r[k] == v for k, v in keys.items())]


def regret_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (problem, method, deg): normalised test regret of each library over the
    seeds (mean ± sample standard deviation), the paired per-seed difference, and whether the
    dxopt mean lies within PyEPO's seed spread (one standard deviation of PyEPO's mean)."""
    rows = []
    for problem in dict.fromkeys(r["problem"] for r in runs):
        for method in METHODS:
            for deg in sorted({r["deg"] for r in _select(runs, problem=problem)}):
                sel = _select(runs, problem=problem, method=method, deg=deg)
                if not sel:
                    continue
                pe = {r["seed"]: r["regret"] for r in sel if r["library"] == "pyepo"}
                dx = {r["seed"]: r["regret"] for r in sel if r["library"] == "dxopt"}
                pe_mean, pe_sd = _mean_sd(list(pe.values()))
                dx_mean, _ = _mean_sd(list(dx.values()))
                paired = [dx[s] - pe[s] for s in dx if s in pe]
                within: bool | None = None
                if pe and dx:
                    # a single seed has no spread: compare with 5% of the mean instead
                    spread = pe_sd if len(pe) > 1 else 0.05 * pe_mean
                    within = abs(dx_mean - pe_mean) <= spread
                rows.append(
                    {
                        "problem": problem,
                        "method": method,
                        "deg": deg,
                        "PyEPO regret": _cell(list(pe.values())),
                        "dxopt regret": _cell(list(dx.values())),
                        "dxopt - PyEPO (paired)": statistics.fmean(paired) if paired else None,
                        "within spread": {True: "yes", False: "NO", None: "-"}[within],
                        "_within": within,
                    }
                )
    return rows


def speed_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (problem, method): median seconds per epoch and oracle calls per epoch of
    each library over all its runs, and the median of the paired (same deg and seed) ratios."""
    rows = []
    for problem in dict.fromkeys(r["problem"] for r in runs):
        for method in METHODS:
            sel = _select(runs, problem=problem, method=method)
            if not sel:
                continue
            pe = [r for r in sel if r["library"] == "pyepo"]
            dx = [r for r in sel if r["library"] == "dxopt"]
            by_key = {(r["deg"], r["seed"]): r for r in pe}
            ratios = [
                by_key[(r["deg"], r["seed"])]["s_per_epoch"] / r["s_per_epoch"]
                for r in dx
                if (r["deg"], r["seed"]) in by_key and r["s_per_epoch"] > 0
            ]
            speedup = statistics.median(ratios) if ratios else None
            met = None if speedup is None or method == "2S" else speedup >= SPEEDUP_TARGET
            own_pe, own_dx = _own_seconds(runs, pe), _own_seconds(runs, dx)
            own_speedup = (
                own_pe / own_dx
                if own_pe is not None and own_dx is not None and own_dx > 0 and method != "2S"
                else None
            )
            ceilings = [
                by_key[key]["s_per_epoch"] / control["s_per_epoch"]
                for key, control in _controls(runs, dx).items()
                if key in by_key and control["s_per_epoch"] > 0
            ]
            ceiling = statistics.median(ceilings) if ceilings and method != "2S" else None

            def med(rs: list[dict[str, Any]], key: str) -> float | None:
                return statistics.median(r[key] for r in rs) if rs else None

            def calls(rs: list[dict[str, Any]]) -> int | None:
                value = med(rs, "calls_per_epoch")
                return None if value is None else round(value)

            rows.append(
                {
                    "problem": problem,
                    "method": method,
                    "PyEPO s/epoch": med(pe, "s_per_epoch"),
                    "dxopt s/epoch": med(dx, "s_per_epoch"),
                    "speed-up": speedup,
                    "target >= 3x": {True: "yes", False: "NO", None: "-"}[met],
                    "PyEPO calls/epoch": calls(pe),
                    "dxopt calls/epoch": calls(dx),
                    "PyEPO method s/epoch": None if method == "2S" else own_pe,
                    "dxopt method s/epoch": None if method == "2S" else own_dx,
                    "method speed-up": own_speedup,
                    "ceiling": ceiling,
                    "_met": met,
                }
            )
    return rows


def _controls(
    runs: list[dict[str, Any]], sel: list[dict[str, Any]]
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """For each run of ``sel``, keyed by (deg, seed), the two-stage run of the same library,
    data set and record (the same process: a control from another process saw another
    load); none for a method trained with another batch size than two-stage's (its loop takes
    another number of steps)."""
    out = {}
    for r in sel:
        hyper = HYPER.get(r["problem"], {})
        if r["method"] not in hyper or hyper[r["method"]].batch != hyper["2S"].batch:
            continue  # another batch size: another number of steps than the control's loop
        control = [
            c
            for c in _select(
                runs, problem=r["problem"], deg=r["deg"], seed=r["seed"], library=r["library"]
            )
            if c["method"] == "2S" and c.get("record", 0) == r.get("record", 0)
        ]
        if control:
            out[(r["deg"], r["seed"])] = control[0]
    return out


def _own_seconds(runs: list[dict[str, Any]], sel: list[dict[str, Any]]) -> float | None:
    """The method's own seconds per epoch: the median over ``sel`` of its epoch minus the
    two-stage epoch of the same library, data set and process (the shared training loop:
    model, Adam, batches), i.e. the time spent in the method's loss and oracle calls."""
    controls = _controls(runs, sel)
    diffs = [
        r["s_per_epoch"] - controls[(r["deg"], r["seed"])]["s_per_epoch"]
        for r in sel
        if (r["deg"], r["seed"]) in controls
    ]
    return statistics.median(diffs) if diffs else None


def targets(regrets: list[dict[str, Any]], speeds: list[dict[str, Any]]) -> dict[str, Any]:
    """The two targets of issue 30, method by method (QPTL and 2S are outside both: PyEPO has
    no QPTL, and two-stage has no oracle)."""
    judged = [r for r in regrets if r["_within"] is not None]
    timed = [r for r in speeds if r["_met"] is not None]
    return {
        "regret within PyEPO's seed spread": {
            "met": sum(bool(r["_within"]) for r in judged),
            "of": len(judged),
            "missed": [
                f"{r['problem']} {r['method']} deg {r['deg']}" for r in judged if not r["_within"]
            ],
        },
        "time per epoch >= 3x lower": {
            "met": sum(bool(r["_met"]) for r in timed),
            "of": len(timed),
            "missed": [
                f"{r['problem']} {r['method']} ({fmt(r['speed-up'])}x{_why(r)})"
                for r in timed
                if not r["_met"]
            ],
        },
    }


def _why(row: dict[str, Any]) -> str:
    """What bounds a missed epoch speed-up: the ceiling (PyEPO's epoch over the shared loop's,
    the speed-up of a method that cost nothing) and the method's own speed-up."""
    parts = []
    if row.get("ceiling") is not None:
        parts.append(f"ceiling {fmt(row['ceiling'])}x")
    if row.get("method speed-up") is not None:
        parts.append(f"the method's own time {fmt(row['method speed-up'])}x lower")
    return "; " + ", ".join(parts) if parts else ""


def _public(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def section_markdown(
    *,
    command: str,
    machine: str,
    settings: dict[str, Any],
    regrets: list[dict[str, Any]],
    speeds: list[dict[str, Any]],
    checks: dict[str, Any],
    plots: list[str],
    notes: list[str],
) -> str:
    """The BENCHMARKS.md section."""
    lines = [
        "## Decision-focused learning: dxopt.dfl against PyEPO (`dxopt bench dfl`)",
        "",
        f"Reproduce with `{command}`. {machine}",
        "",
        "The PyEPO paper's task (Tang & Khalil, arXiv 2206.14234; the protocol of Mandi et al., "
        "JAIR 2024): shortest path on the 5x5 grid and the 2-D knapsack (32 items, capacity 20), "
        "5 features, polynomial degree `deg`, noise half-width 0.5, a linear model "
        "`nn.Linear(5, d)`, Adam, a fixed number of epochs. Both libraries run in the same "
        "process on the same arrays (PyEPO's own generators `pyepo.data.*.genData`, training "
        "labels from PyEPO's solver model), from the same initial weights and mini-batch order; "
        "for each (deg, seed, method) PyEPO's run and dxopt's follow each other. The test "
        "regret of every trained model is judged once, by PyEPO's `pyepo.metric.regret` "
        "(normalised: sum of regrets over sum of |optimal objectives|) on the held-out samples.",
        "",
        "Settings: " + "; ".join(f"{k} {v}" for k, v in settings.items()) + ".",
        "",
        "### Normalised test regret (mean ± sd over seeds)",
        "",
        markdown_table(_public(regrets), [k for k in regrets[0] if not k.startswith("_")])
        if regrets
        else "(no runs)",
        "",
        "### Time and oracle calls per epoch (medians over degs and seeds; 1 thread)",
        "",
        markdown_table(_public(speeds), [k for k in speeds[0] if not k.startswith("_")])
        if speeds
        else "(no runs)",
        "",
        "### Targets",
        "",
    ]
    for name, check in checks.items():
        missed = ", ".join(check["missed"]) or "none"
        lines.append(f"- {name}: {check['met']} of {check['of']} (missed: {missed})")
    lines += ["", *[f"- {n}" for n in notes]]
    if plots:
        lines += ["", *[f"![{p}](benchmarks/dfl/results/{p})" for p in plots]]
    return "\n".join(lines) + "\n"


def write_plots(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """``dfl.png``: per problem, test regret against deg (each method, both libraries, error
    bars over seeds) and seconds per epoch of each method (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    problems = list(dict.fromkeys(r["problem"] for r in runs))
    if not problems:
        return []
    fig, axes = plt.subplots(len(problems), 2, figsize=(12, 4.2 * len(problems)), squeeze=False)
    colors = {m: f"C{i}" for i, m in enumerate(METHODS)}
    for row, problem in enumerate(problems):
        ax_r, ax_t = axes[row]
        for method in METHODS:
            for lib, style in (("pyepo", "--"), ("dxopt", "-")):
                sel = _select(runs, problem=problem, method=method, library=lib)
                degs = sorted({r["deg"] for r in sel})
                if not degs:
                    continue
                stats = [_mean_sd([r["regret"] for r in sel if r["deg"] == d]) for d in degs]
                ax_r.errorbar(
                    degs,
                    [s[0] for s in stats],
                    yerr=[s[1] for s in stats],
                    ls=style,
                    marker="o",
                    ms=3,
                    capsize=2,
                    color=colors[method],
                    label=f"{method} ({lib})",
                )
        ax_r.set_title(f"{PROBLEM_NAMES.get(problem, problem)}: test regret")
        ax_r.set_xlabel("polynomial degree (misspecification)")
        ax_r.set_ylabel("normalised regret")
        ax_r.legend(fontsize=7, ncol=2)
        methods = [m for m in METHODS if _select(runs, problem=problem, method=m)]
        for k, (lib, shift) in enumerate((("pyepo", -0.2), ("dxopt", 0.2))):
            vals = []
            for m in methods:
                sel = _select(runs, problem=problem, method=m, library=lib)
                vals.append(statistics.median(r["s_per_epoch"] for r in sel) if sel else 0.0)
            ax_t.bar(
                [i + shift for i in range(len(methods))],
                vals,
                width=0.4,
                label=lib,
                color=f"C{k + 7}",
            )
        ax_t.set_xticks(range(len(methods)), methods)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("seconds per epoch (1 thread)")
        ax_t.set_title(f"{PROBLEM_NAMES.get(problem, problem)}: time per epoch")
        ax_t.legend()
    fig.tight_layout()
    path = out / "dfl.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
