"""multi_attempt benchmark: GRPO, naive and CAL attempt weights, exactly and in training.

Part 1, exact: bias and variance of each weighting on tabular K-attempt policies (every group
enumerated, or Monte Carlo with standard errors). Part 2, learning: an MLP policy on the
"probe and fix" task (``benchmarks/multi_attempt/task.py``) trained with each weighting under
the same budget, several seeds, exact Verification@K and Pass@1 curves.

Run with ``dxopt bench multi_attempt`` (or ``python -m benchmarks.multi_attempt.run``).
``--quick`` is a smoke run (seconds) into a temporary directory that leaves ``results/`` and
``BENCHMARKS.md`` alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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
from benchmarks.multi_attempt.exact import bias_variance_table
from benchmarks.multi_attempt.report import section_markdown, summarize, write_plot
from benchmarks.multi_attempt.task import ProbeFixTask, TaskConfig, TrainConfig, train

METHODS = ("grpo", "naive", "cal", "cal-mix")
COMMAND = "dxopt bench multi_attempt"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run into a temp dir")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=1000, help="training steps per run")
    parser.add_argument("--out", type=Path, default=None, help="output directory override")
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch intra-op threads (>= 1)"
    )
    args = parser.parse_args(argv)
    set_threads(args.threads)
    load_start = os.getloadavg()
    t0, cpu0 = time.perf_counter(), time.process_time()
    steps, seeds = args.steps, args.seeds
    if args.quick:
        out = args.out or Path(tempfile.mkdtemp(prefix="multi_attempt_quick_"))
        steps, seeds = min(steps, 40), seeds[:2]
    else:
        out = args.out or results_dir("multi_attempt")

    out.mkdir(parents=True, exist_ok=True)
    exact_rows = bias_variance_table(args.quick)

    task_cfg = TaskConfig()
    train_cfg = TrainConfig(steps=steps, eval_every=10 if args.quick else 20)
    task = ProbeFixTask(task_cfg, seed=0)
    runs = []
    for seed in tqdm(seeds, desc="multi_attempt", unit="seed"):
        for method in METHODS:
            runs.append(train(task, method, seed, train_cfg))
    optimum = task.optimum_verification()
    summary = summarize(runs, METHODS)
    plot = write_plot(runs, METHODS, optimum, out)
    info = machine_info()
    payload = {
        "machine": info,
        "command": COMMAND,
        "quick": args.quick,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - cpu0,
        "task": task_cfg.__dict__,
        "train": train_cfg.__dict__,
        "optimum_verification": optimum,
        "exact": exact_rows,
        "summary": summary,
        "runs": runs,
    }
    write_json(out / "multi_attempt.json", payload)
    section = section_markdown(
        payload=payload,
        machine=machine_line(info),
        exact_table=markdown_table(
            exact_rows,
            [
                "instance",
                "N",
                "J",
                "|grad|",
                "estimator",
                "claimed unbiased",
                "|bias|",
                "|bias| / |grad|",
                "cos(mean, grad)",
                "max z",
                "total variance",
                "how",
            ],
        ),
        final_table=markdown_table(
            summary, ["method", "Verification@3", "Pass@1", "per seed V@3", "steps", "runs"]
        ),
        plot=plot.name,
    )
    (out / "multi_attempt.md").write_text(section + "\n")
    if not args.quick and args.out is None:
        update_benchmarks_md("multi_attempt", section)
    print(section)
    print(f"median run {statistics.median(r['seconds'] for r in runs):.1f} s")
    return payload


if __name__ == "__main__":
    main()
