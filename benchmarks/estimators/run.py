"""Reproduction of "The Cost of Avoiding Backpropagation" (arXiv 2506.21833) at small scale.

Task 1: an MLP on scikit-learn's digits, all estimator variants. Task 2: the frozen
all-MiniLM-L6-v2 encoder with LoRA adapters on a generated topic-classification task.
Checkpointing is matched in memory to forward-mode AD (the checkpoint plan whose peak of
live tensors is closest to FmAD's), then every method trains over the seeds; we report
accuracy, FLOPs and wall-clock time to a target accuracy, peak memory and failures.

Usage: ``dxopt bench estimators [--quick] [--seeds 0 1 2] [--tasks digits minilm]`` (lists are
space separated, as in every area).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks.common import (  # noqa: E402
    machine_info,
    positive_float,
    positive_int,
    results_dir,
    set_threads,
)
from benchmarks.estimators.methods import CANDIDATE_PLANS, digits_methods, minilm_methods  # noqa: E402
from benchmarks.estimators.report import summarise, write_outputs  # noqa: E402
from benchmarks.estimators.tasks import digits_task, minilm_task  # noqa: E402
from benchmarks.estimators.training import match_checkpoint_plan, measure_memory, train  # noqa: E402
from dxopt.estimators import ForwardGradient  # noqa: E402

TARGETS = {"digits-mlp": 0.85, "minilm-lora": 0.80}
EVAL_EVERY = {"digits-mlp": 100, "minilm-lora": 5}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dxopt bench estimators",
        description="Estimators benchmark: The Cost of Avoiding Backpropagation "
        "(arXiv 2506.21833) at small scale, on digits and a LoRA-adapted MiniLM.",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run into a temporary folder")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds, space separated"
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        choices=["digits", "minilm"],
        default=["digits", "minilm"],
        help="tasks, space separated",
    )
    parser.add_argument(
        "--budget-scale", type=positive_float, default=1.0, help="scales step budgets (> 0)"
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch threads (1: on a shared 2-core box, 2 threads ran MiniLM ~19x slower)",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder override")
    return parser.parse_args(argv)


def _run_task(name: str, args: argparse.Namespace, scale: float) -> dict[str, Any]:
    make_task = digits_task if name == "digits" else minilm_task
    task = make_task(args.seeds[0])
    gen = torch.Generator().manual_seed(12345)
    batch = task.sample_batch(gen)
    anchor_batch = None
    if name == "digits":
        anchor_batch = task.sample_batch(torch.Generator().manual_seed(777))
        anchor_batch = tuple(torch.cat([anchor_batch[i]] * 8) for i in range(2))
    fmad_peak = measure_memory(task, ForwardGradient(validate=False), batch)["peak_bytes"]
    plan_name, plan_memory = match_checkpoint_plan(task, CANDIDATE_PLANS, fmad_peak, batch)
    plan = CANDIDATE_PLANS[plan_name]
    methods = (digits_methods if name == "digits" else minilm_methods)(plan, scale)
    memory = {m.name: measure_memory(task, m.make(0, anchor_batch), batch) for m in methods}
    runs = []
    bar = tqdm(total=len(methods) * len(args.seeds), desc=task.name, leave=False)
    for seed in args.seeds:
        task = make_task(seed)
        for method in methods:
            runs.append(
                train(
                    task,
                    method,
                    seed,
                    target=TARGETS[task.name],
                    eval_every=max(1, int(EVAL_EVERY[task.name] * min(scale * 4, 1.0))),
                    anchor_batch=anchor_batch,
                ).as_dict()
            )
            bar.update()
    bar.close()
    return {
        "task": task.name,
        "target_accuracy": TARGETS[task.name],
        "trainable_parameters": sum(p.numel() for p in task.params.values()),
        "matched_plan": plan_name,
        "plan_memory": plan_memory,
        "fmad_reference_peak_bytes": fmad_peak,
        "memory": memory,
        "methods": [
            {
                "name": m.name,
                "family": m.family,
                "lr": m.lr,
                "steps": m.steps,
                "optimizer": m.optimizer,
            }
            for m in methods
        ],
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    set_threads(args.threads)
    scale = 0.005 * args.budget_scale if args.quick else args.budget_scale
    out = args.out
    if out is None:
        out = (
            Path(tempfile.mkdtemp(prefix="dxopt-est-")) if args.quick else results_dir("estimators")
        )
    machine = machine_info()  # at the start: the commit that runs
    tasks = [_run_task(t, args, scale) for t in tqdm(args.tasks, desc="tasks")]
    payload = {
        "machine": machine,
        "argv": sys.argv[1:] if argv is None else argv,
        "quick": args.quick,
        "seeds": args.seeds,
        "tasks": tasks,
    }
    payload["summary"] = [summarise(t) for t in tasks]
    write_outputs(payload, out, update_md=not args.quick and args.out is None)
    print(f"results written to {out}")


if __name__ == "__main__":
    main()
