"""What a warm start from the previous :class:`dxopt.qp.QPSolution` saves in two real loops
(issue 38, item 2), cold and warm timed interleaved in one run, 1 thread, medians.

- **MPC over a trajectory**: a double integrator (position, velocity; ``dt = 0.1``) steered
  from ``(5, 0)`` to the origin by a condensed MPC of horizon ``T`` (``n = T`` inputs,
  ``|u| <= 1`` and ``|position| <= 6`` over the horizon, ``m = 4T`` rows), one QP per step,
  the first input applied; consecutive QPs differ only in the initial state. Warm: each step
  starts from the previous step's solution.
- **DFL training epochs**: a linear cost model trained with QPTL's regret loss
  (:mod:`benchmarks.qp_speed.qptl`: PyEPO's 5 x 5 shortest-path LP with ``eps/2 ||x||^2``,
  40 arcs, flow rows and ``0 <= x <= 1``) by SGD, mini-batches of 32, forward and backward
  per batch. Warm: each batch starts from the previous epoch's solution of the same batch.

Both loops follow the same trajectory cold and warm (the answers agree to the certificate's
tolerance: the script checks ``max |x_warm - x_cold|``). Reported per loop: the median over
rounds of the whole loop's seconds, cold / warm (above 1: the warm start pays).

Run ``python -m benchmarks.qp_speed.warm_start [--rounds R]``; writes
``results/warm_start.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import dxopt.qp as dqp
from benchmarks.qp_speed.qptl import grid_incidence

F64 = torch.float64
RESULTS = Path(__file__).parent / "results"


def mpc_data(horizon: int) -> dict[str, Any]:
    """The condensed MPC matrices: ``X = Sx x0 + Su U``, cost ``sum x'Qx + r u^2``."""
    dt = 0.1
    Ad = np.array([[1.0, dt], [0.0, 1.0]])
    Bd = np.array([[0.5 * dt * dt], [dt]])
    Sx = np.zeros((2 * horizon, 2))
    Su = np.zeros((2 * horizon, horizon))
    power = np.eye(2)
    for k in range(horizon):
        power = Ad @ power
        Sx[2 * k : 2 * k + 2] = power
        for j in range(k + 1):
            Su[2 * k : 2 * k + 2, j] = (np.linalg.matrix_power(Ad, k - j) @ Bd)[:, 0]
    Qbar = np.kron(np.eye(horizon), np.diag([1.0, 0.1]))
    P = Su.T @ Qbar @ Su + 0.05 * np.eye(horizon)
    pos = Su[0::2]
    G = np.vstack([np.eye(horizon), -np.eye(horizon), pos, -pos])
    t = torch.tensor
    return {"P": t(P), "Sx": Sx, "Su": Su, "Qbar": Qbar, "G": t(G), "pos_x": Sx[0::2], "Ad": Ad,
            "Bd": Bd}  # fmt: skip


def mpc_loop(data: dict[str, Any], steps: int, warm: bool) -> tuple[float, np.ndarray]:
    """Seconds of the whole trajectory and the inputs applied."""
    x0 = np.array([5.0, 0.0])
    T = data["P"].shape[0]
    prev = None
    applied = []
    seconds = 0.0
    for _ in range(steps):
        q = torch.tensor(data["Su"].T @ data["Qbar"] @ data["Sx"] @ x0)
        px = data["pos_x"] @ x0
        h = torch.tensor(np.concatenate([np.ones(2 * T), 6.0 - px, 6.0 + px]))
        start = time.perf_counter()
        sol = dqp.solve(data["P"], q, G=data["G"], h=h, warm_start=prev if warm else None)
        seconds += time.perf_counter() - start
        prev = sol
        u = float(sol.x[0])
        applied.append(u)
        x0 = data["Ad"] @ x0 + data["Bd"][:, 0] * u
    return seconds, np.array(applied)


def dfl_loop(
    epochs: int, warm: bool, *, n_samples: int = 128, batch: int = 32
) -> tuple[float, Any]:
    """Seconds of ``epochs`` QPTL training epochs (solve + backward only) and the weights."""
    A, b = grid_incidence()
    n = A.shape[1]
    rng = np.random.default_rng(0)
    features = torch.tensor(rng.normal(size=(n_samples, 5)))
    B_true = rng.normal(size=(5, n))
    costs = torch.tensor(np.abs(features.numpy() @ B_true) / 3 + 0.5)
    W = torch.zeros(5, n, dtype=F64, requires_grad=True)
    bias = torch.ones(n, dtype=F64, requires_grad=True)
    P = 0.1 * torch.eye(n, dtype=F64)
    At, bt = torch.tensor(A), torch.tensor(b)
    lb, ub = torch.zeros(n, dtype=F64), torch.ones(n, dtype=F64)
    opt = torch.optim.SGD([W, bias], lr=0.05)
    previous: dict[int, dqp.QPSolution] = {}
    seconds = 0.0
    for _ in range(epochs):
        for k in range(0, n_samples, batch):
            c_hat = features[k : k + batch] @ W + bias
            start = time.perf_counter()
            sol = dqp.solve(
                P, c_hat, A=At, b=bt, lb=lb, ub=ub, warm_start=previous.get(k) if warm else None
            )
            loss = (costs[k : k + batch] * sol.x).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            seconds += time.perf_counter() - start
            previous[k] = sol
            opt.step()
    return seconds, W.detach().clone()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--horizon", type=int, default=30)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = mpc_data(args.horizon)
    times: dict[str, list[float]] = {
        k: [] for k in ("mpc_cold", "mpc_warm", "dfl_cold", "dfl_warm")
    }
    diff = {"mpc": 0.0, "dfl": 0.0}
    for warm in (False, True):  # untimed: first-call costs (imports, kernel set-up)
        mpc_loop(data, 3, warm)
        dfl_loop(1, warm)
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)  # swap who goes first
        mpc, dfl = {}, {}
        for warm in order:
            mpc[warm] = mpc_loop(data, args.steps, warm)
            dfl[warm] = dfl_loop(args.epochs, warm)
            tag = "warm" if warm else "cold"
            times[f"mpc_{tag}"].append(mpc[warm][0])
            times[f"dfl_{tag}"].append(dfl[warm][0])
        diff["mpc"] = max(diff["mpc"], float(np.abs(mpc[True][1] - mpc[False][1]).max()))
        diff["dfl"] = max(diff["dfl"], float((dfl[True][1] - dfl[False][1]).abs().max()))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [
        {"loop": f"MPC, horizon {args.horizon} (n={args.horizon}, m={4 * args.horizon}), "
                 f"{args.steps} steps", "cold_s": med["mpc_cold"], "warm_s": med["mpc_warm"],
         "ratio": med["mpc_cold"] / med["mpc_warm"], "max_abs_diff": diff["mpc"]},
        {"loop": f"DFL QPTL 5x5 shortest path, 128 samples, batch 32, {args.epochs} epochs "
                 "(fwd+bwd)", "cold_s": med["dfl_cold"], "warm_s": med["dfl_warm"],
         "ratio": med["dfl_cold"] / med["dfl_warm"], "max_abs_diff": diff["dfl"]},
    ]  # fmt: skip
    out = {"rounds": args.rounds, "threads": 1, "torch": torch.__version__, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "warm_start.json").write_text(json.dumps(out, indent=2))
    lines = [
        "| loop | cold (s) | warm (s) | cold / warm | max abs diff (applied u / weights) |",
        "|---|---|---|---|---|",
        *(f"| {r['loop']} | {r['cold_s']:.4f} | {r['warm_s']:.4f} | {r['ratio']:.2f}x | "
          f"{r['max_abs_diff']:.1e} |" for r in rows),
    ]  # fmt: skip
    md = "\n".join(lines) + f"\n\n1 thread, median of {args.rounds} interleaved rounds.\n"
    (RESULTS / "warm_start.md").write_text(md)
    print(md)
    return out


if __name__ == "__main__":
    main()
