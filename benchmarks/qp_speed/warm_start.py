"""What a warm start from the previous :class:`dxopt.qp.QPSolution` saves in two real loops
(issue 38, item 2), cold and warm timed interleaved in one run, 1 thread, medians.

- **MPC over a trajectory**: a double integrator (position, velocity; ``dt = 0.1``) steered
  from ``(5, 0)`` to the origin by a condensed MPC of horizon ``T`` (``n = T`` inputs,
  ``|u| <= 1`` and ``|position| <= 6`` over the horizon, ``m = 4T`` rows), one QP per step,
  the first input applied; consecutive QPs differ only in the initial state (``q`` and
  ``h``; ``P`` and ``G`` are the same tensors). Warm: each step starts from the previous
  step's solution (daqp's ``dual_start`` at ``n <= 64``, the compiled dual active-set
  solver's warm working set above, which also reuses the last warm step's factors of ``P`` and
  ``G``: :func:`dxopt.qp.lean.warm.keep_factors`). Horizons 30 and 80: at ``T = 30`` a step's
  solve is a fraction of a millisecond and sits at the per-call floor (validation,
  certificate, outputs), so little is left for a warm start to save; at ``T = 80``
  (``m = 320``) the cold solve factors ``P``, forms :math:`L^{-1}G^\top` and builds a working
  set of dozens of rows, which is most of the step.
- **DFL training epochs**: a linear cost model trained with QPTL's regret loss
  (:mod:`benchmarks.qp_speed.qptl`: PyEPO's ``side x side`` shortest-path LP with
  ``eps/2 ||x||^2``, flow rows and ``0 <= x <= 1``) by SGD, mini-batches of 32, forward and
  backward per batch. Warm: each batch starts from the previous epoch's solution of the same
  batch (the compiled solver's warm working sets). Sides 5 (40 arcs, PyEPO's size: the
  backward and the per-call costs weigh as much as the solve) and 8 (112 arcs, 224 bound rows).
  At both sizes the step's time is mostly the minimum-norm multiplier selection at the LP's
  degenerate vertices (:func:`dxopt.qp.certify.multipliers.select_multipliers`, cold or warm
  alike), so the warm start's saving on the solve itself moves the loop's ratio little.

Both loops follow the same trajectory cold and warm (the answers agree to the certificate's
tolerance: the script checks ``max |x_warm - x_cold|``). Reported per loop: the median over
rounds of the whole loop's seconds, cold / warm (above 1: the warm start pays).

Run ``python -m benchmarks.qp_speed.warm_start [--rounds R] [--horizons 30,80]
[--sides 5,8]``; writes ``results/warm_start.json`` and ``.md``.
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
    epochs: int, warm: bool, *, n_samples: int = 128, batch: int = 32, side: int = 5
) -> tuple[float, Any]:
    """Seconds of ``epochs`` QPTL training epochs (solve + backward only) on the ``side x
    side`` grid and the weights."""
    A, b = grid_incidence(side)
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
    parser.add_argument("--horizons", default="30,80", help="MPC horizons, comma-separated")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sides", default="5,8", help="DFL grid sides, comma-separated")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    horizons = [int(t) for t in args.horizons.split(",") if t]
    sides = [int(t) for t in args.sides.split(",") if t]
    loops: list[tuple[str, Any]] = []
    for T in horizons:
        data = mpc_data(T)
        loops.append((f"MPC, horizon {T} (n={T}, m={4 * T}), {args.steps} steps",
                      lambda warm, data=data: mpc_loop(data, args.steps, warm)))  # fmt: skip
    for side in sides:
        arcs = 2 * side * (side - 1)
        loops.append((f"DFL QPTL {side}x{side} shortest path (n={arcs}), 128 samples, batch 32, "
                      f"{args.epochs} epochs (fwd+bwd)",
                      lambda warm, side=side: dfl_loop(args.epochs, warm, side=side)))  # fmt: skip
    for _, run in loops:  # untimed: first-call costs (imports, kernel set-up)
        for warm in (False, True):
            run(warm)
    times: dict[tuple[int, bool], list[float]] = {(k, w): [] for k in range(len(loops))
                                                  for w in (False, True)}  # fmt: skip
    diff = [0.0] * len(loops)
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)  # swap who goes first
        for k, (_, run) in enumerate(loops):
            got = {}
            for warm in order:
                got[warm] = run(warm)
                times[(k, warm)].append(got[warm][0])
            a, b = got[True][1], got[False][1]
            delta = (a - b).abs().max() if isinstance(a, torch.Tensor) else np.abs(a - b).max()
            diff[k] = max(diff[k], float(delta))
    rows = []
    for k, (label, _) in enumerate(loops):
        cold, warm = statistics.median(times[(k, False)]), statistics.median(times[(k, True)])
        rows.append({"loop": label, "cold_s": cold, "warm_s": warm, "ratio": cold / warm,
                     "max_abs_diff": diff[k]})  # fmt: skip
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
