"""CVXPY front end of dxopt.qp against cvxpylayers and against the hand-written matrices (issue 27).

Three of cvxpylayers' QP examples (:mod:`benchmarks.qp_cvxpy.problems`: the OptNet QP, box-
constrained least squares, the simplex projection) at batch 1 and 128, forward plus backward of
``L = sum(w * x)`` with gradients for every parameter, timed in one process with
``torch.set_num_threads(1)``:

- ``CvxpyQPLayer``: :class:`dxopt.qp.CvxpyQPLayer` (compiled once, compile time reported apart);
- ``dxopt.qp.solve (matrices)``: the same QP written by hand from the same leaves
  (``P = L^T L`` etc.) and passed to :func:`dxopt.qp.solve`: the unit of the overhead ratio;
- ``cvxpylayers`` 1.x: ``CvxpyLayer`` with its default solver arguments (diffcp: SCS, all cores),
  and its other CPU options (diffcp with Clarabel; one job each way); ``cvxpylayers fastest`` is
  the fastest of them on each case.

Methods are interleaved round by round in a new seeded random order (machine load hits them
alike) and the median over rounds is reported. ``x_err`` is ``max |x - x_matrices|``.
Targets: ``CvxpyQPLayer`` at least 10x faster than the fastest cvxpylayers option at batch 128,
and at most 1.3x the hand-written ``dxopt.qp.solve`` call.

Run ``dxopt bench qp_cvxpy`` (a few minutes) or ``--quick`` (batch 1 and 8, two rounds: a smoke
run). Writes ``results/qp_cvxpy{_quick}.json``, ``.md``, ``.png``; the full run replaces the
``qp_cvxpy`` section of BENCHMARKS.md (``--no-md`` to skip).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import (
    SMOKE_NOTE,
    fmt,
    machine_info,
    machine_line,
    markdown_table,
    publish,
    results_dir,
    smoke_verdicts,
    write_json,
)

COMMAND = "dxopt bench qp_cvxpy"
SPEEDUP_TARGET = 10.0  # over the fastest cvxpylayers option, batch 128
OVERHEAD_TARGET = 1.3  # over dxopt.qp.solve with the matrices
CVXPYLAYERS_OPTIONS: dict[str, dict[str, Any]] = {
    "cvxpylayers default": {},
    "cvxpylayers Clarabel": {"solve_method": "Clarabel"},
    "cvxpylayers SCS 1 job": {"n_jobs_forward": 1, "n_jobs_backward": 1},
    "cvxpylayers Clarabel 1 job": {
        "solve_method": "Clarabel", "n_jobs_forward": 1, "n_jobs_backward": 1,
    },
}  # fmt: skip
COLUMNS = ("problem", "batch", "method", "fwd_bwd_ms", "vs_matrices", "speedup", "x_err", "note")


def _fwd_bwd(fn: Callable[..., Any], values: list[Any], weight: Any) -> Callable[[], Any]:
    def run() -> Any:
        leaves = [v.clone().requires_grad_() for v in values]
        x = fn(*leaves)
        (weight * x).sum().backward()
        return x.detach()

    return run


def run_case(name: str, batch: int, rounds: int, seed: int) -> list[dict[str, Any]]:
    import torch
    from cvxpylayers.torch import CvxpyLayer

    from benchmarks.qp_cvxpy.problems import PROBLEMS
    from dxopt.qp import CvxpyQPLayer

    prob = PROBLEMS[name](batch, seed=seed)
    t0 = time.perf_counter()
    layer = CvxpyQPLayer(prob.problem, prob.parameters, [prob.variable])
    compile_s = time.perf_counter() - t0
    reference = CvxpyLayer(prob.problem, parameters=prob.parameters, variables=[prob.variable])
    shape = (batch, prob.variable.size) if batch > 1 else (prob.variable.size,)
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    methods: dict[str, Callable[[], Any]] = {
        "CvxpyQPLayer": _fwd_bwd(lambda *v: layer(*v)[0], prob.values, weight),
        "dxopt.qp.solve (matrices)": _fwd_bwd(prob.direct, prob.values, weight),
    }
    for label, options in CVXPYLAYERS_OPTIONS.items():
        call = (lambda o: lambda *v: reference(*v, solver_args=dict(o))[0])(options)
        methods[label] = _fwd_bwd(call, prob.values, weight)
    outputs = {label: fn() for label, fn in methods.items()}  # warm-up, and the solutions
    times: dict[str, list[float]] = {label: [] for label in methods}
    order = list(methods)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for label in order:
            t = time.perf_counter()
            methods[label]()
            times[label].append(time.perf_counter() - t)
    ms = {label: 1e3 * statistics.median(ts) for label, ts in times.items()}
    base = outputs["dxopt.qp.solve (matrices)"]
    fastest = min((k for k in ms if k.startswith("cvxpylayers")), key=ms.__getitem__)
    rows = []
    for label in methods:
        rows.append({
            "problem": f"{prob.name} ({prob.size})",
            "key": name,
            "batch": batch,
            "method": label,
            "fwd_bwd_ms": ms[label],
            "vs_matrices": ms[label] / ms["dxopt.qp.solve (matrices)"],
            "speedup": ms[fastest] / ms[label] if label == "CvxpyQPLayer" else None,
            "x_err": float((outputs[label] - base).abs().max()),
            "note": (f"compile {compile_s:.2f} s" if label == "CvxpyQPLayer"
                     else "fastest cvxpylayers" if label == fastest else ""),
        })  # fmt: skip
    return rows


def targets(rows: list[dict[str, Any]], *, quick: bool = False) -> list[dict[str, Any]]:
    """The targets with their verdicts (none in a ``--quick`` smoke run)."""
    out = []
    for r in rows:
        if r["method"] != "CvxpyQPLayer":
            continue
        if r["batch"] >= 128:
            out.append({
                "target": f"speedup over cvxpylayers >= {SPEEDUP_TARGET:g}x",
                "case": f"{r['key']} batch {r['batch']}", "figure": r["speedup"],
                "verdict": "met" if r["speedup"] >= SPEEDUP_TARGET else "MISSED",
            })  # fmt: skip
        out.append({
            "target": f"time / dxopt.qp.solve (matrices) <= {OVERHEAD_TARGET:g}",
            "case": f"{r['key']} batch {r['batch']}", "figure": r["vs_matrices"],
            "verdict": "met" if r["vs_matrices"] <= OVERHEAD_TARGET else "MISSED",
        })  # fmt: skip
    return smoke_verdicts(out) if quick else out


def section(rows: list[dict[str, Any]], info: dict[str, Any], load: tuple[float, float],
            line: str, rounds: str, *, quick: bool = False) -> str:  # fmt: skip
    verdicts = "\n".join(
        f"- {t['target']}, {t['case']}: {fmt(t['figure'])} ({t['verdict']})"
        for t in targets(rows, quick=quick)
    ) + (f"\n\n{SMOKE_NOTE}" if quick else "")
    return (
        "## CVXPY front end: `CvxpyQPLayer` vs cvxpylayers vs the matrices\n\n"
        f"Command: `{line}`. {machine_line(info)} One torch thread; load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end (the ratios are within one run, "
        f"methods interleaved). Medians over {rounds} rounds of forward + backward of "
        "`sum(w * x)` with gradients for every parameter. `vs_matrices`: time over "
        "`dxopt.qp.solve` with the hand-written matrices from the same leaves; `speedup`: the "
        "fastest cvxpylayers option over `CvxpyQPLayer`; `x_err`: max |x - x_matrices|.\n\n"
        + markdown_table(rows, COLUMNS)
        + "\n\nTargets:\n\n"
        + verdicts
        + "\n"
    )


def _plot(rows: list[dict[str, Any]], path: os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["key"], r["batch"]) for r in rows}, key=lambda c: (c[1], c[0]))
    methods = ["CvxpyQPLayer", "dxopt.qp.solve (matrices)", *CVXPYLAYERS_OPTIONS]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        vals = [
            next((r["fwd_bwd_ms"] for r in rows if (r["key"], r["batch"], r["method"]) ==
                  (key, batch, method)), np.nan)
            for key, batch in cases
        ]  # fmt: skip
        ax.bar(np.arange(len(cases)) + j * width, vals, width, label=method)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(cases)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{k}\nB={b}" for k, b in cases], fontsize=7)
    ax.set_ylabel("forward + backward (ms)")
    ax.set_title("CVXPY QPs: dxopt CvxpyQPLayer vs cvxpylayers vs hand-written matrices")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 1 and 8, two rounds")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-md", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    if args.quick:
        plan = [(1, args.rounds or 2), (8, args.rounds or 2)]
    else:
        plan = [(1, args.rounds or 30), (128, args.rounds or 5)]
    rows: list[dict[str, Any]] = []
    for batch, rounds in plan:
        for name in ("optnet", "box_lsq", "simplex"):
            rows += run_case(name, batch, rounds, args.seed)
            print(f"done {name} batch {batch}", flush=True)
    load = (load0, os.getloadavg()[0])
    info = machine_info()
    duration = time.perf_counter() - start
    line = COMMAND + (" --quick" if args.quick else "")
    out = results_dir("qp_cvxpy")
    suffix = "_quick" if args.quick else ""
    payload = {"machine": info, "load": list(load), "duration_s": duration, "rows": rows,
               "targets": targets(rows, quick=args.quick)}  # fmt: skip
    write_json(out / f"qp_cvxpy{suffix}.json", payload)
    rounds_text = ", ".join(f"{r} (batch {b})" for b, r in plan)
    text = section(rows, info, load, line, rounds_text, quick=args.quick)
    text += f"\nWhole run: {duration:.0f} s.\n"
    area = None if args.quick or args.no_md else "qp_cvxpy"
    publish(out, f"qp_cvxpy{suffix}", text, area=area, plot=lambda path: _plot(rows, path))
    checks = targets(rows, quick=args.quick)
    print("targets:", ", ".join(f"{t['verdict']} {fmt(t['figure'])}" for t in checks))


if __name__ == "__main__":
    main()
