"""Method runners for the natgrad benchmark: each trains a fresh network under a wall-clock budget.

Time spent measuring the test error is excluded from the budget (the clock is paused).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dxopt.natgrad import ENGD, SNG, SPRING, PINNProblem, tanh_mlp

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class ProblemSetup:
    """How one PDE is trained: network, batches and budget."""

    problem: PINNProblem
    hidden: tuple[int, ...]
    budget_s: float
    full_batch: Callable[[torch.Generator], Batch]  # ENGD / Adam / L-BFGS batch
    mini_batch: Callable[[torch.Generator], Batch]  # SNG / SPRING batch
    resample_full: bool  # draw a new full batch every step (ENGD/Adam) or keep one
    hyper: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Trace:
    times: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)


class _Clock:
    """Training-time clock that pauses while the test error is measured."""

    def __init__(self, setup: ProblemSetup, model: torch.nn.Module, n_evals: int = 60) -> None:
        self.setup, self.model = setup, model
        self.trace = Trace()
        self.elapsed = 0.0
        self.next_eval = 0.0
        self.eval_every = setup.budget_s / n_evals
        self.t0 = time.perf_counter()
        self.record(0)

    def record(self, step: int) -> None:
        self.elapsed += time.perf_counter() - self.t0
        err = self.setup.problem.relative_l2(self.model)
        self.trace.times.append(self.elapsed)
        self.trace.steps.append(step)
        self.trace.errors.append(err if math.isfinite(err) else float("nan"))
        self.next_eval = self.elapsed + self.eval_every
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return self.elapsed + time.perf_counter() - self.t0

    def tick(self, step: int) -> bool:
        """Record when due; return False when the budget is spent."""
        now = self.elapsed + time.perf_counter() - self.t0
        if now >= self.setup.budget_s:
            self.record(step)
            return False
        if now >= self.next_eval:
            self.record(step)
        return True


def _loss(setup: ProblemSetup, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    residual = setup.problem.residual(model)
    r = residual(dict(model.named_parameters()), batch)
    return 0.5 * (r * r).sum()


def run_method(setup: ProblemSetup, method: str, seed: int) -> dict[str, Any]:
    """Train one network with ``method`` for ``setup.budget_s`` seconds; return its trace."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = tanh_mlp(setup.problem.dim, setup.hidden, seed=seed)
    hyper = setup.hyper.get(method, {})
    clock = _Clock(setup, model)
    step, fallbacks, diverged = 0, 0, False
    fixed = setup.full_batch(torch.Generator().manual_seed(10_000 + seed))
    try:
        if method in ("SNG", "SPRING", "ENGD"):
            residual = setup.problem.residual(model)
            kwargs = {k: v for k, v in hyper.items() if k != "lr_final_fraction"}
            opt: Any = {"SNG": SNG, "SPRING": SPRING, "ENGD": ENGD}[method](
                model, residual, **kwargs
            )
            lr0, final_fraction = getattr(opt, "lr", None), hyper.get("lr_final_fraction")
            while clock.tick(step):
                if final_fraction is not None:  # linear decay in training time
                    progress = min(clock.now() / setup.budget_s, 1.0)
                    opt.lr = lr0 * (1.0 - (1.0 - final_fraction) * progress)
                if method == "ENGD":
                    batch = setup.full_batch(gen) if setup.resample_full else fixed
                else:
                    batch = setup.mini_batch(gen)
                opt.step(batch)
                step += 1
            fallbacks = opt.fallbacks
        elif method == "Adam":
            adam = torch.optim.Adam(model.parameters(), lr=hyper.get("lr", 1e-3))
            while clock.tick(step):
                batch = setup.full_batch(gen) if setup.resample_full else fixed
                adam.zero_grad()
                _loss(setup, model, batch).backward()
                adam.step()
                step += 1
        elif method == "L-BFGS":
            lbfgs = torch.optim.LBFGS(
                model.parameters(),
                lr=1.0,
                max_iter=hyper.get("max_iter", 10),
                history_size=hyper.get("history_size", 100),
                tolerance_grad=0.0,
                tolerance_change=0.0,
                line_search_fn="strong_wolfe",
            )

            def closure() -> torch.Tensor:
                lbfgs.zero_grad()
                loss = _loss(setup, model, fixed)
                loss.backward()
                return loss

            while clock.tick(step):
                lbfgs.step(closure)
                step = int(lbfgs.state[lbfgs.param_groups[0]["params"][0]].get("n_iter", step))
        else:
            raise ValueError(f"method: unknown {method!r}")
    except ValueError as exc:  # a diverged iterate (NaN residual) is reported, not hidden
        if "NaN" not in str(exc):
            raise
        diverged = True
        clock.record(step)
    errors = clock.trace.errors
    finite = [e for e in errors if e == e]
    return {
        "method": method,
        "seed": seed,
        "final_error": errors[-1],
        "best_error": min(finite) if finite else float("nan"),
        "steps": step,
        "train_time_s": clock.trace.times[-1],
        "fallbacks": fallbacks,
        "diverged": diverged,
        "trace": {"time": clock.trace.times, "step": clock.trace.steps, "error": errors},
    }
