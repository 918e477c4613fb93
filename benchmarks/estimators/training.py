"""One training run of one estimator on one task, with costs, memory and failures recorded."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from dxopt.estimators import CheckpointPlan, MemoryTracker


@dataclass
class RunResult:
    task: str
    method: str
    family: str
    seed: int
    steps: int = 0
    curve: list[dict[str, float]] = field(default_factory=list)  # step, flops, time, acc
    final_acc: float = float("nan")
    best_acc: float = float("nan")
    steps_to_target: int | None = None
    flops_to_target: float | None = None
    time_to_target: float | None = None
    nonfinite: int = 0
    diverged: bool = False
    flops_per_step: float = 0.0
    seconds_per_step: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clone(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in params.items()}


def _install(task: Any, params: dict[str, torch.Tensor]) -> None:
    """Copy values into the task's own parameter tensors (MiniLM's live in its module)."""
    with torch.no_grad():
        for n, p in task.params.items():
            p.copy_(params[n])
            p.grad = None


def measure_memory(task: Any, estimator: Any, batch: Any) -> dict[str, int]:
    """Peak live bytes and saved-for-backward bytes of one estimate (after a warm-up call)."""
    start = _clone(task.params)
    estimator.estimate(task.loss_fn, task.params, batch)
    with MemoryTracker() as tracker:
        estimator.estimate(task.loss_fn, task.params, batch)
    _install(task, start)
    report = tracker.report
    return {"peak_bytes": report.peak_bytes, "saved_bytes": report.saved_activation_bytes}


def match_checkpoint_plan(
    task: Any, plans: dict[str, CheckpointPlan], reference_peak: int, batch: Any
) -> tuple[str, dict[str, dict[str, int]]]:
    """Measure every plan; return the cheapest (first in ``plans``, ordered by recompute)
    whose peak is at most ``reference_peak``, else the plan with the lowest peak."""
    from dxopt.estimators import Backprop

    measured = {n: measure_memory(task, Backprop(checkpoint=p), batch) for n, p in plans.items()}
    within = [n for n in plans if measured[n]["peak_bytes"] <= reference_peak]
    if within:
        return within[0], measured
    return min(measured, key=lambda n: measured[n]["peak_bytes"]), measured


def _kind(estimator: Any) -> bool:
    """Whether the next estimate refreshes an SVRG anchor (or is a LOZO redraw step): such
    steps cost other FLOPs than the rest."""
    return getattr(estimator, "_calls", 1) % getattr(estimator, "refresh_every", 10**9) == 0


def _flops_by_kind(task: Any, method: Any, seed: int, anchor_batch: Any) -> dict[bool, float]:
    """FLOPs of one step of each kind, counted on a twin estimator (same construction, so the
    same draws) before training: the timed training steps never run under the counter, whose
    dispatch overhead would inflate them. Parameters are restored afterwards."""
    start = _clone(task.params)
    twin = method.make(seed, anchor_batch)
    gen = torch.Generator().manual_seed(1000 + seed)
    counted: dict[bool, float] = {}
    for _ in range(2):  # call 0 refreshes (SVRG) / redraws (LOZO), call 1 does not
        kind = _kind(twin)
        est = twin.estimate(task.loss_fn, task.params, task.sample_batch(gen), count_flops=True)
        counted[kind] = float(est.cost.flops or 0)
    _install(task, start)
    return counted


def train(
    task: Any, method: Any, seed: int, *, target: float, eval_every: int, anchor_batch: Any
) -> RunResult:
    """Train from the task's initial parameters; stop at the step budget or on divergence."""
    start = _clone(task.params)
    result = RunResult(task.name, method.name, method.family, seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    estimator = method.make(seed, anchor_batch)
    params = task.params
    if method.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(params.values(), lr=method.lr)
    else:
        opt = torch.optim.SGD(params.values(), lr=method.lr, momentum=0.9)
    flops_by_kind = _flops_by_kind(task, method, seed, anchor_batch)
    flops = seconds = 0.0
    first_loss = None
    acc = task.accuracy(params)
    result.curve.append({"step": 0, "flops": 0.0, "time": 0.0, "acc": acc})
    for step in range(1, method.steps + 1):
        batch = task.sample_batch(gen)
        kind = _kind(estimator)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        est = estimator.estimate(task.loss_fn, params, batch)
        opt.step()
        seconds += time.perf_counter() - t0  # every step timed, none under the FLOP counter
        flops += flops_by_kind[kind]
        result.nonfinite += int(est.info.get("nan_jvps", 0)) + int(est.info.get("nonfinite", 0))
        result.steps = step
        first_loss = est.loss if first_loss is None else first_loss
        if not math.isfinite(est.loss) or est.loss > 10 * max(first_loss, 1.0):
            result.diverged = True
        if step % eval_every == 0 or step == method.steps or result.diverged:
            acc = task.accuracy(params) if not result.diverged else float("nan")
            wall = seconds
            result.curve.append({"step": step, "flops": flops, "time": wall, "acc": acc})
            if result.steps_to_target is None and acc >= target:
                result.steps_to_target, result.flops_to_target = step, flops
                result.time_to_target = wall
        if result.diverged:
            break
    accs = [c["acc"] for c in result.curve if math.isfinite(c["acc"])]
    result.final_acc = result.curve[-1]["acc"]
    result.best_acc = max(accs) if accs else float("nan")
    result.flops_per_step = flops / max(result.steps, 1)
    result.seconds_per_step = seconds / max(result.steps, 1)
    _install(task, start)
    return result
