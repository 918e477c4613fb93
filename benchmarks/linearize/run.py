"""linearize benchmark: standard, linearized (teacher), DELTA student and DELTA without the
curvature term, on four digits tasks: single-task accuracy, task addition and negation, weight
disentanglement, inference cost.

Run with ``dxopt bench linearize`` (or ``python -m benchmarks.linearize.run``). Everything runs
one after another on one thread. ``--quick`` is a smoke run (one seed, a few steps, small
grids) that writes to a temporary directory and leaves ``results/`` and ``BENCHMARKS.md``
alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode
from tqdm import tqdm

from benchmarks.common import (
    machine_info,
    machine_line,
    markdown_table,
    positive_int,
    results_dir,
    set_threads,
    update_benchmarks_md,
    write_json,
)
from benchmarks.linearize.methods import LINEAR_METHODS, METHODS, Config, Editor, finetune
from benchmarks.linearize.metrics import QUICK_GRIDS, Grids, evaluate
from benchmarks.linearize.report import claims, notes, section_markdown, write_plots
from benchmarks.linearize.tasks import TASKS, build_suite
from dxopt.estimators import MemoryTracker

COMMAND = "dxopt bench linearize"


def inference_cost(
    models: dict[str, torch.nn.Module], x: torch.Tensor, *, repeats: int
) -> dict[str, dict[str, float]]:
    """Per model: FLOPs (``torch.utils.flop_counter``), seconds and peak bytes of live tensors
    per example of one no-grad forward.

    The models are timed round-robin (so load spikes on the shared machine hit all of them
    alike) and the fastest of ``repeats`` is kept, the least load-sensitive figure.
    """
    times: dict[str, list[float]] = {m: [] for m in models}
    out: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for model in models.values():
            model(x)  # warm-up
        for _ in range(repeats):
            for name, model in models.items():
                t0 = time.perf_counter()
                model(x)
                times[name].append(time.perf_counter() - t0)
        for name, model in models.items():
            with MemoryTracker() as mem:
                model(x)
            counter = FlopCounterMode(display=False)
            with counter:
                model(x)
            out[name] = {
                "us_per_example": 1e6 * min(times[name]) / x.shape[0],
                "mflop_per_example": counter.get_total_flops() / 1e6 / x.shape[0],
                "peak_bytes_per_example": mem.report.peak_bytes / x.shape[0],
                "weight_bytes": float(
                    sum(p.numel() * p.element_size() for p in model.parameters())
                ),
            }
    return out


def summarize(runs: list[dict[str, Any]], cost: dict[str, dict[str, float]]) -> list[dict]:
    rows = []
    for m in METHODS:
        sel = [r for r in runs if r["method"] == m]

        def ms(key: str, sel: list[dict[str, Any]] = sel) -> str:
            vals = [r[key] for r in sel]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            return f"{statistics.fmean(vals):.3f} ± {sd:.3f}"

        rows.append(
            {
                "method": m,
                "single-task acc": ms("single_mean"),
                "add. abs acc": ms("add_abs"),
                "add. norm acc": ms("add_norm"),
                "add. gain over θ₀": ms("add_gain"),
                "α* add": ms("add_alpha"),
                "neg. target acc ↓": ms("neg_target"),
                "neg. control acc": ms("neg_control"),
                "ξ ↓": ms("xi"),
                "MFLOP / example": cost[m]["mflop_per_example"],
                "µs / example": cost[m]["us_per_example"],
                "peak KB / example": cost[m]["peak_bytes_per_example"] / 1024,
                "weights KB": cost[m]["weight_bytes"] / 1024,
                "train s / task": ms("train_s"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run into a temp dir")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="fine-tuning steps per task")
    parser.add_argument("--out", type=Path, default=None, help="output directory override")
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch intra-op threads (>= 1)"
    )
    args = parser.parse_args(argv)
    set_threads(args.threads)
    load_start = os.getloadavg()
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    cfg = Config() if args.steps is None else Config(steps=args.steps)
    grids = Grids()
    seeds = args.seeds
    if args.quick:
        cfg = Config(steps=args.steps or 6)
        grids = QUICK_GRIDS
        seeds = seeds[:1]
        out = args.out or Path(tempfile.mkdtemp(prefix="linearize_quick_"))
    else:
        out = args.out or results_dir("linearize")

    runs: list[dict[str, Any]] = []
    cost: dict[str, dict[str, float]] = {}
    timed: dict[str, torch.nn.Module] = {}
    curves: dict[str, list[list[float]]] = {m: [] for m in METHODS}
    heat: dict[str, Any] = {}
    zero_shot: list[float] = []
    control0: list[float] = []
    bar = tqdm(total=len(seeds) * len(METHODS) * len(TASKS), desc="linearize", unit="run")
    for seed in seeds:
        suite = build_suite(seed, quick=args.quick)
        taus: dict[str, dict] = {}
        for method in METHODS:
            taus[method], secs = {}, []
            for task in TASKS:
                teacher = taus["linear"][task] if method.startswith("delta") else None
                ft = finetune(method, suite, task, cfg, seed, teacher=teacher)
                taus[method][task] = ft.tau
                secs.append(ft.seconds)
                bar.update()
            editor = Editor(suite, method in LINEAR_METHODS)
            ev = evaluate(editor, taus[method], grids)
            if seed == seeds[0]:  # the fine-tuned model of the first task, first seed
                timed[method] = editor.model(taus[method][TASKS[0]])
            curves[method].append(ev["addition"]["val_curve"])
            if seed == seeds[0]:
                heat[method] = ev["xi_pairs"]
            runs.append(
                {
                    "method": method,
                    "seed": seed,
                    "single": ev["single"],
                    "single_mean": ev["single_mean"],
                    "add_abs": ev["addition"]["absolute"],
                    "add_gain": ev["addition"]["absolute"]
                    - statistics.fmean(ev["zero_shot"].values()),
                    "add_norm": ev["addition"]["normalized"],
                    "add_alpha": ev["addition"]["alpha"],
                    "add_test": ev["addition"]["test"],
                    "negation": ev["negation"],
                    "neg_target": ev["negation_target"],
                    "neg_control": ev["negation_control"],
                    "xi": ev["xi"],
                    "train_s": statistics.fmean(secs),
                    "tau_norm": statistics.fmean(taus[method][t].norm() for t in TASKS),
                }
            )
        if seed == seeds[0]:
            x = suite.data[TASKS[0]]["test"].x[:256]
            cost = inference_cost(timed, x, repeats=5 if args.quick else 30)
        zero_shot.append(statistics.fmean(ev["zero_shot"].values()))
        control0.append(ev["control_pretrained"])
    bar.close()
    info = machine_info()
    info["load_average_start"] = load_start
    info["load_average_end"] = os.getloadavg()
    info["total_seconds"] = time.perf_counter() - t_start
    info["cpu_seconds"] = time.process_time() - cpu_start
    rows = summarize(runs, cost)
    checks = claims(runs, cost)
    payload = {
        "machine": info,
        "command": COMMAND + (" --quick" if args.quick else ""),
        "config": cfg.__dict__,
        "grids": grids.__dict__,
        "seeds": seeds,
        "tasks": list(TASKS),
        "zero_shot_mean": zero_shot,
        "control_pretrained": control0,
        "summary": rows,
        "claims": checks,
        "cost": cost,
        "runs": runs,
        "addition_curves": curves,
        "xi_heatmaps_first_seed": heat,
    }
    write_json(out / "linearize.json", payload)
    plots = write_plots(payload, out)
    columns = list(rows[0])
    table = markdown_table(rows, columns)
    section = section_markdown(
        command=COMMAND,
        machine=machine_line(info),
        info=info,
        table=table,
        checks=checks,
        plots=[p.name for p in plots],
        cfg=cfg,
        seeds=seeds,
        zero_shot=zero_shot,
        control0=control0,
        readings=notes(payload),
    )
    (out / "linearize.md").write_text(section + "\n")
    if not args.quick and args.out is None:
        update_benchmarks_md("linearize", section)
    print(section)
    return payload


if __name__ == "__main__":
    main()
