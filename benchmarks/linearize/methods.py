"""The four fine-tuning methods and the models they edit.

- ``standard``: ordinary fine-tuning of the backbone (cross-entropy through the frozen head);
- ``linear``: tangent-space fine-tuning of :class:`~dxopt.linearize.LinearizedModel` with the
  curvature penalty :math:`\\lambda R(\\delta)` (the teacher);
- ``delta``: DELTA's student, ordinary fine-tuning along the ray :math:`\\theta_0+\\alpha\\tau_S`
  with :math:`\\alpha` from the curriculum, squared-L2 distillation of the backbone features to
  the linearized teacher's :math:`\\varphi(x;\\theta_0)+\\alpha J\\tau_T`, and
  :math:`\\lambda R(\\tau_S)`;
- ``delta_no_curv``: the same student with :math:`\\lambda=0` on its own penalty (same
  teacher).

All use AdamW (no weight decay), linear warm-up over the first 10% of steps and a cosine decay,
batch 64. Deviation from the authors: the teacher is trained first and then frozen (they train
it jointly with the student, with its own optimiser).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from benchmarks.linearize.tasks import CONTROL, Suite
from dxopt.linearize import (
    CurvaturePenalty,
    LinearizedModel,
    TaskVector,
    call_along_ray,
    distillation_loss,
    sample_alpha,
)

METHODS = ("standard", "linear", "delta", "delta_no_curv")
LINEAR_METHODS = frozenset({"linear"})


@dataclass(frozen=True)
class Config:
    steps: int = 120
    batch: int = 64
    lr: float = 3e-3
    curvature: float = 1.0  # lambda
    distill: float = 1.0  # w
    reference_batch: int = 16


@dataclass(frozen=True)
class FineTuned:
    tau: TaskVector
    seconds: float


def _schedule(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    warm = max(1, steps // 10)

    def factor(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (i - warm) / max(1, steps - warm)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _batches(n: int, cfg: Config, g: torch.Generator):
    perm = torch.randperm(n, generator=g)
    i = 0
    for _ in range(cfg.steps):
        if i + cfg.batch > n:
            perm, i = torch.randperm(n, generator=g), 0
        yield perm[i : i + cfg.batch]
        i += cfg.batch


def penalty_for(suite: Suite, cfg: Config, seed: int) -> CurvaturePenalty:
    """R on task-agnostic reference data: the upright pretraining images."""
    return CurvaturePenalty(
        suite.backbone,
        suite.data[CONTROL]["train"].x,
        batch_size=cfg.reference_batch,
        generator=torch.Generator().manual_seed(10_000 + seed),
    )


def finetune(
    method: str,
    suite: Suite,
    task: str,
    cfg: Config,
    seed: int,
    *,
    teacher: TaskVector | None = None,
) -> FineTuned:
    """Fine-tune on ``task``; return its task vector and the training wall time."""
    train = suite.data[task]["train"]
    head = suite.heads[task]
    g = torch.Generator().manual_seed(seed * 1000 + sorted(suite.data).index(task))
    torch.manual_seed(seed)
    penalty = penalty_for(suite, cfg, seed)
    ce = nn.functional.cross_entropy
    t0 = time.perf_counter()
    if method == "linear":
        lin = LinearizedModel(suite.backbone)
        deltas = lin.delta_params()
        opt = torch.optim.AdamW(deltas.values(), lr=cfg.lr, weight_decay=0.0)
        sched = _schedule(opt, cfg.steps)
        for b in _batches(len(train.y), cfg, g):
            loss = ce(head(lin(train.x[b])), train.y[b])
            if cfg.curvature > 0:
                loss = loss + cfg.curvature * penalty(deltas)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        return FineTuned(TaskVector.from_linearized(lin), time.perf_counter() - t0)

    model = copy.deepcopy(suite.backbone).requires_grad_(True)
    theta0 = {n: p.detach().clone() for n, p in suite.backbone.named_parameters()}
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(params.values(), lr=cfg.lr, weight_decay=0.0)
    sched = _schedule(opt, cfg.steps)
    if method == "standard":
        for b in _batches(len(train.y), cfg, g):
            loss = ce(head(model(train.x[b])), train.y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    elif method in ("delta", "delta_no_curv"):
        if teacher is None:
            raise ValueError(
                f"teacher: method {method!r} needs the linearized teacher's task vector"
            )
        teacher_model = teacher.apply_to(LinearizedModel(suite.backbone)).eval()
        lam = cfg.curvature if method == "delta" else 0.0
        for step, b in enumerate(_batches(len(train.y), cfg, g)):
            alpha = sample_alpha(step / max(1, cfg.steps - 1), generator=g)
            x = train.x[b]
            feats = call_along_ray(model, theta0, alpha, x)
            with torch.no_grad():
                f0 = suite.backbone(x)
                target = f0 + alpha * (teacher_model(x) - f0)
            loss = ce(head(feats), train.y[b]) + cfg.distill * distillation_loss(feats, target)
            if lam > 0:
                loss = loss + lam * penalty({n: params[n] - theta0[n] for n in theta0})
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    else:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    return FineTuned(TaskVector.from_models(suite.backbone, model), time.perf_counter() - t0)


class Editor:
    """Features at :math:`\\theta_0+\\alpha\\tau`: an ordinary forward, or a JVP (linear)."""

    def __init__(self, suite: Suite, linear: bool) -> None:
        self.suite = suite
        self.linear = linear
        self._lin = LinearizedModel(suite.backbone).eval() if linear else None

    def model(self, tau: TaskVector | None, alpha: float = 1.0) -> nn.Module:
        base: nn.Module = self._lin if self._lin is not None else self.suite.backbone
        if tau is None or alpha == 0.0:
            return base
        return tau.apply_to(base, alpha)

    @torch.no_grad()
    def accuracy(self, tau: TaskVector | None, alpha: float, task: str, split: str) -> float:
        data = self.suite.data[task][split]
        return accuracy(self.model(tau, alpha), self.suite.heads[task], data.x, data.y)

    @torch.no_grad()
    def predictions(self, tau: TaskVector | None, alpha: float, task: str, x: Tensor) -> Tensor:
        return self.suite.heads[task](self.model(tau, alpha)(x)).argmax(1)


def accuracy(model: nn.Module, head: nn.Module, x: Tensor, y: Tensor) -> float:
    return float((head(model(x)).argmax(1) == y).float().mean())
