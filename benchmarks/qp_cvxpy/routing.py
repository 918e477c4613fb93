"""CvxpyQPLayer's default route against both routes, side by side in one process, 1 thread.

The problem: constrained linear MPC (issue 35 item 9), ``min sum ||x_t||^2 + ||u_t||^2`` s.t.
``x_{t+1} = A x_t + B u_t``, ``x_0`` a parameter, ``-1 <= u_t <= 1``; horizon 30, 8 states,
6 inputs (428 canonical variables), batch 16. Each route is timed forward and backward (the
best of ``--repeats`` after a warm-up); the row reports default / best. The JSON goes to
benchmarks/qp_cvxpy/results/routing.json.

Run: ``python benchmarks/qp_cvxpy/routing.py``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import cvxpy as cp
import numpy as np
import torch

from dxopt.qp import CvxpyQPLayer

HERE = Path(__file__).resolve().parent


def mpc(horizon: int, nx: int, nu: int) -> tuple[cp.Problem, cp.Parameter, cp.Variable]:
    rng = np.random.default_rng(100)
    A = np.eye(nx) + 0.1 * rng.standard_normal((nx, nx))
    B = rng.standard_normal((nx, nu))
    X, U = cp.Variable((nx, horizon + 1)), cp.Variable((nu, horizon))
    x0 = cp.Parameter(nx, name="x0")
    cons = [X[:, 0] == x0, U <= 1, U >= -1]
    cons += [X[:, t + 1] == A @ X[:, t] + B @ U[:, t] for t in range(horizon)]
    return cp.Problem(cp.Minimize(cp.sum_squares(X) + cp.sum_squares(U)), cons), x0, U


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    problem, x0, U = mpc(args.horizon, 8, 6)
    values = torch.from_numpy(np.random.default_rng(0).uniform(-2, 2, (args.batch, 8)))
    rows = {}
    for label, sparse in (("dense", False), ("sparse", True), ("default", None)):
        layer = CvxpyQPLayer(problem, [x0], [U], sparse=sparse)
        theta = values.clone().requires_grad_()
        layer(theta)[0].sum().backward()  # warm-up
        best = (float("inf"), float("inf"))
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            (u,) = layer(theta)
            t1 = time.perf_counter()
            u.square().sum().backward()
            t2 = time.perf_counter()
            best = min(best, (t1 - t0, t2 - t1), key=sum)
        rows[label] = {"sparse": layer.sparse, "fwd_ms": 1e3 * best[0], "bwd_ms": 1e3 * best[1]}
        print(label, rows[label], flush=True)
    total = {k: v["fwd_ms"] + v["bwd_ms"] for k, v in rows.items()}
    ratio = total["default"] / min(total["dense"], total["sparse"])
    print(f"default / best = {ratio:.2f} (target <= 2)")
    out = {"horizon": args.horizon, "batch": args.batch, "threads": 1, "routes": rows,
           "default_over_best": ratio, "target": 2.0}  # fmt: skip
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "routing.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
