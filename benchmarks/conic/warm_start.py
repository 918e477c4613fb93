"""What a warm start from the previous :class:`dxopt.conic.ConicSolution` saves on a real loop
(issue 38, item 2, for :mod:`dxopt.conic`), cold and warm timed interleaved in one run,
1 thread, medians.

**SOCP MPC over a trajectory**: a planar double integrator (position and velocity in
:math:`\\mathbb R^2`, ``dt = 0.1``) steered from ``(5, -3, 0, 0)`` to the origin by a
condensed MPC of horizon ``T``: ``n = 2T`` inputs, the thrust bound
:math:`\\Vert u_k\\Vert_2 \\le 1` as ``T`` second-order cones ``SOC(3)`` and
:math:`|p| \\le 6` per coordinate over the horizon (``4T`` nonnegative rows), one SOCP per
step, the first input applied; consecutive SOCPs differ in the initial state only. Warm:
each step starts from the previous step's solution (:mod:`dxopt.conic.warm`: polished and
certified first, Clarabel skipped where that certifies). Each step runs forward and backward
(the gradient of the applied input in ``q``, as a learned-MPC loop would).

Both runs follow the same trajectory (the script checks ``max |x_warm - x_cold|`` over the
loop). Reported: the median over rounds of the whole loop's seconds, cold / warm (above 1: the
warm start pays), and the share of steps the warm start certified.

Run ``python -m benchmarks.conic.warm_start [--rounds R] [--steps S] [--horizon T]
[--batches B ...] [--forward-only]``; writes ``results/warm_start.json`` (or
``warm_start_forward.json``).
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
from torch import Tensor

import dxopt.conic as dc

F64 = torch.float64
RESULTS = Path(__file__).parent / "results"


def mpc_data(horizon: int) -> dict[str, Any]:
    """Condensed dynamics ``X = Sx x0 + Su U`` and the SOCP's fixed ``P, A, b``, cones."""
    dt = 0.1
    Ad = np.eye(4)
    Ad[0, 2] = Ad[1, 3] = dt
    Bd = np.zeros((4, 2))
    Bd[0, 0] = Bd[1, 1] = 0.5 * dt * dt
    Bd[2, 0] = Bd[3, 1] = dt
    T = horizon
    Sx = np.zeros((4 * T, 4))
    Su = np.zeros((4 * T, 2 * T))
    for k in range(T):
        Sx[4 * k : 4 * k + 4] = np.linalg.matrix_power(Ad, k + 1)
        for j in range(k + 1):
            Su[4 * k : 4 * k + 4, 2 * j : 2 * j + 2] = np.linalg.matrix_power(Ad, k - j) @ Bd
    Qbar = np.kron(np.eye(T), np.diag([1.0, 1.0, 0.1, 0.1]))
    P = Su.T @ Qbar @ Su + 0.05 * np.eye(2 * T)
    rows, rhs = [], []
    for k in range(T):  # (1, u_k) in SOC(3): s = b - A u = (1, u_k)
        block = np.zeros((3, 2 * T))
        block[1:, 2 * k : 2 * k + 2] = -np.eye(2)
        rows.append(block)
        rhs.append(np.array([1.0, 0.0, 0.0]))
    pos = np.vstack([Su[4 * k : 4 * k + 2] for k in range(T)])  # positions over the horizon
    pos_x = np.vstack([Sx[4 * k : 4 * k + 2] for k in range(T)])
    rows += [pos, -pos]
    A = np.vstack(rows)
    cones = [dc.SecondOrderCone(3)] * T + [dc.NonnegCone(4 * T)]
    return {"P": torch.tensor(P), "A": torch.tensor(A), "b_soc": np.concatenate(rhs),
            "pos": pos, "pos_x": pos_x, "Sx": Sx, "Su": Su, "Qbar": Qbar, "Ad": Ad, "Bd": Bd,
            "cones": cones}  # fmt: skip


def run_loop(
    data: dict[str, Any], steps: int, warm: bool, batch: int, backward: bool = True
) -> tuple[float, list[Tensor], int]:
    """``batch`` trajectories stepped together (one batched solve per step, initial states
    spread around ``(5, -3, 0, 0)``); returns the seconds, the solutions and the number of
    warm-certified samples."""
    rng = np.random.default_rng(0)
    x0 = np.array([5.0, -3.0, 0.0, 0.0]) + rng.uniform(-1, 1, (batch, 4)) * [1, 1, 0, 0] * (
        batch > 1
    )
    prev = None
    xs, hits = [], 0
    P, A = data["P"], data["A"]
    H = data["Su"].T @ data["Qbar"] @ data["Sx"]
    start = time.perf_counter()
    for _ in range(steps):
        q = torch.tensor(x0 @ H.T, requires_grad=True)
        box = 6.0 - x0 @ data["pos_x"].T
        soc = np.broadcast_to(data["b_soc"], (batch, data["b_soc"].size))
        b = torch.tensor(np.concatenate([soc, box, 12.0 - box], axis=1))
        sol = dc.solve(P, q, A, b, cones=data["cones"], warm_start=prev if warm else None)
        if backward:
            sol.x[:, :2].sum().backward()
        hits += sum(sol.info.warm)
        u0 = sol.x[:, :2].detach().numpy()
        x0 = x0 @ data["Ad"].T + u0 @ data["Bd"].T
        xs.append(sol.x.detach())
        prev = sol
    return time.perf_counter() - start, xs, hits


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--forward-only", action="store_true", help="no backward per step")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = mpc_data(args.horizon)
    rows = []
    for batch in args.batches:
        run_loop(data, 3, warm=False, batch=batch)  # untimed warm-up (imports, first calls)
        cold_s, warm_s, err, hits = [], [], 0.0, 0
        for r in range(args.rounds):
            out = {}
            for warm in (False, True) if r % 2 == 0 else (True, False):
                out[warm] = run_loop(data, args.steps, warm, batch, not args.forward_only)
            cold_s.append(out[False][0])
            warm_s.append(out[True][0])
            hits = out[True][2]
            diffs = [float((a - c).abs().max()) for a, c in zip(out[True][1], out[False][1])]
            err = max(err, *diffs)
        cold, warm = statistics.median(cold_s), statistics.median(warm_s)
        rows.append({
            "loop": f"SOCP MPC, horizon {args.horizon} (n={2 * args.horizon}, "
            f"m={7 * args.horizon}), batch {batch}, {args.steps} steps, "
            + ("forward" if args.forward_only else "forward+backward"),
            "cold_s": cold,
            "warm_s": warm,
            "ratio_cold_over_warm": cold / warm,
            "warm_certified": f"{hits}/{args.steps * batch}",
            "max_abs_x_diff": err,
        })  # fmt: skip
    result = {"rows": rows, "rounds": args.rounds, "threads": 1}
    RESULTS.mkdir(exist_ok=True)
    name = "warm_start_forward.json" if args.forward_only else "warm_start.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
