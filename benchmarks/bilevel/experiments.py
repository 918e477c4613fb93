"""The experiments behind ``dxopt bench bilevel``: method settings, runs and slope fits.

All Ji runs use the analytic banded oracles in float64 with exact call counting; the stop
test uses the exact (uncounted) hypergradient. Settings follow the research notes: unit
constants, T = floor(n^2 / (12 eps^2)), outer step 1/(10 n^2), K = ceil(4 sqrt(kappa)) for
AGD inner loops and CG, K = ceil(4 kappa) for GD inner loops.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from dxopt.bilevel import (
    AID,
    CG,
    F2BA,
    ITD,
    SOBA,
    CarmonChain,
    InnerLoop,
    JiInstance,
    MinibatchLogisticRegularization,
    NesterovChain,
    Neumann,
    StocBiO,
    breast_cancer_regularization,
    minimize_bilevel,
    run_single_level,
)

JI_METHODS = ("AID-CG+AGD", "AID-CG+GD", "ITD+AGD", "F2BA+AGD")


def ji_method(name: str, ji: JiInstance) -> Any:
    """The method ``name`` tuned to ``ji``'s kappa as in the research notes."""
    k = ji.kappa
    k_agd, k_gd = math.ceil(4 * math.sqrt(k)), math.ceil(4 * k)
    lr = 1.0 / (10 * ji.n**2)
    agd = InnerLoop.agd(smoothness=ji.L_g, strong_convexity=ji.mu, max_iter=k_agd)
    if name == "AID-CG+AGD":
        return AID(inner=agd, linear=CG(k_agd), outer_lr=lr)
    if name == "AID-CG+GD":
        return AID(
            inner=InnerLoop.gd(smoothness=ji.L_g, max_iter=k_gd), linear=CG(k_agd), outer_lr=lr
        )
    if name == "ITD+AGD":
        return ITD(inner=agd, outer_lr=lr)
    if name == "F2BA+AGD":
        return F2BA(inner=agd, penalty=10.0 * k / ji.epsilon, outer_lr=lr)
    raise ValueError(f"name: expected one of {JI_METHODS}, got {name!r}.")


def run_ji(
    name: str, block: int, epsilon: float, *, links: int | None = None, budget: int, frontier=False
) -> dict[str, Any]:
    ji = JiInstance.for_accuracy(block=block, epsilon=epsilon, links=links)
    start = time.perf_counter()
    with torch.inference_mode():
        result = minimize_bilevel(
            ji_method(name, ji),
            ji,
            max_iter=10**7,
            budget=budget,
            tol=ji.epsilon,
            track_frontier=frontier,
        )
    row: dict[str, Any] = {
        "method": name,
        "n": block,
        "kappa": ji.kappa,
        "epsilon": epsilon,
        "T": ji.T,
        "lower_bound_Tn": ji.T * ji.n,
        "calls": result.trajectory.calls_to_reach(ji.epsilon),
        "status": result.status.value,
        "outer_iterations": result.iterations,
        "grad_f": result.cost.grad_f,
        "grad_g": result.cost.grad_g,
        "hvp": result.cost.hvps,
        "jvp": result.cost.jvps,
        "seconds": round(time.perf_counter() - start, 3),
    }
    if frontier:
        assert result.first_nonzero_x is not None and result.first_nonzero_y is not None
        reach = ji.frontier(result.first_nonzero_x, result.first_nonzero_y)
        row["first_nonzero_x"] = result.first_nonzero_x.tolist()
        row["frontier"] = reach.tolist()
        row["max_frontier_step"] = int((reach[1:] - reach[:-1]).max()) if reach.numel() > 1 else 0
    return row


def fit_slope(xs, ys, *, bootstrap: int, seed: int) -> dict[str, float | None]:
    """Least-squares slope of log(ys) on log(xs) with a 95% pairs-bootstrap interval."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y]
    if len(pts) < 2:
        return {"slope": None, "ci_low": None, "ci_high": None, "points": len(pts)}
    lx, ly = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    slope = float(np.polyfit(lx, ly, 1)[0])
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(bootstrap):
        idx = rng.integers(0, len(pts), len(pts))
        if len(set(idx.tolist())) < 3 and len(pts) >= 3:
            continue
        if np.ptp(lx[idx]) == 0:
            continue
        boots.append(float(np.polyfit(lx[idx], ly[idx], 1)[0]))
    lo, hi = np.percentile(boots, [2.5, 97.5]).tolist() if boots else (None, None)
    return {"slope": slope, "ci_low": lo, "ci_high": hi, "points": len(pts)}


def single_level_references(blocks, epsilon: float, carmon_links: int) -> list[dict[str, Any]]:
    """Single-level calls at the same kappa values: Carmon's chain (GD, kappa-free) and
    Nesterov's chain (AGD to a 1e-6 relative gradient)."""
    rows = []
    carmon = CarmonChain(carmon_links)
    c_run = run_single_level(carmon.grad, carmon_links, lr=0.1, tol=1.0, max_calls=10**6)
    for n in blocks:
        kappa = 4.0 * n * n + 1.0
        chain = NesterovChain(dim=4000, smoothness=1.0, strong_convexity=1.0 / kappa)
        root = math.sqrt(kappa)
        g0 = float(torch.linalg.vector_norm(chain.grad(torch.zeros(4000, dtype=torch.float64))))
        n_run = run_single_level(
            chain.grad,
            4000,
            lr=1.0,
            momentum=(root - 1) / (root + 1),
            tol=1e-6 * g0,
            max_calls=10**6,
        )
        rows.append(
            {
                "n": n,
                "kappa": kappa,
                "carmon_gd_calls": c_run.calls,
                "nesterov_agd_calls": n_run.calls,
            }
        )
    return rows


def regularization_task(*, budget: int, seed: int) -> list[dict[str, Any]]:
    """All six methods on breast-cancer L2 selection, same budget, validation loss curves."""
    task = breast_cancer_regularization(seed=seed)
    L, mu = task.smoothness, task.strong_convexity
    agd = InnerLoop.agd(smoothness=L, strong_convexity=mu, max_iter=20)
    gd = InnerLoop.gd(smoothness=L, max_iter=20)
    lr = 100.0
    methods: dict[str, tuple[Any, Any]] = {
        "AID-CG+AGD": (AID(inner=agd, linear=CG(20), outer_lr=lr), task.oracle),
        "AID-Neumann+GD": (AID(inner=gd, linear=Neumann(50, 1.0 / L), outer_lr=lr), task.oracle),
        "ITD+AGD": (ITD(inner=agd, outer_lr=lr), task.oracle),
        "F2BA+AGD": (F2BA(inner=agd, penalty=1e3, outer_lr=lr), task.oracle),
        "stocBiO (batch 32)": (
            StocBiO(inner=gd, neumann=Neumann(50, 1.0 / L), outer_lr=lr),
            MinibatchLogisticRegularization(
                task.oracle, batch_size=32, generator=torch.Generator().manual_seed(seed)
            ),
        ),
        "SOBA (batch 32)": (
            SOBA(inner_lr=1.0 / L, outer_lr=lr / 20),
            MinibatchLogisticRegularization(
                task.oracle, batch_size=32, generator=torch.Generator().manual_seed(seed)
            ),
        ),
    }
    x0 = torch.zeros(task.oracle.dim_x, dtype=torch.float64)
    start_loss = task.validation_loss(x0)
    rows = []
    for name, (method, oracle) in methods.items():
        with torch.inference_mode():
            result = minimize_bilevel(method, oracle, max_iter=10**7, budget=budget)
        w_star = task.oracle.lower_solution(result.x)
        traj = result.trajectory
        rows.append(
            {
                "method": name,
                "calls": result.cost.total,
                "seconds": round(traj.seconds[-1], 3),
                "outer_iterations": result.iterations,
                "start_val_loss": start_loss,
                "final_val_loss": task.validation_loss(result.x),
                "final_val_accuracy": task.validation_accuracy(w_star),
                "final_grad_norm": traj.hypergradient_norm[-1],
                "curve_calls": list(traj.calls),
                "curve_seconds": list(traj.seconds),
                "curve_val_loss": list(traj.upper_value),
            }
        )
    return rows
