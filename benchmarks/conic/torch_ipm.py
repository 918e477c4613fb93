"""The batched torch interior point (``solver="torch"``, :mod:`dxopt.conic.ipm`) against the
Clarabel forward, the raw Clarabel loop and Moreau, side by side in one process, 1 thread.

Problems ``socp``, ``portfolio``, ``monotone`` (zero, nonnegative and second-order cones only;
:mod:`benchmarks.conic.problems`) at batch 1, 8, 32, 128. Rows per problem and batch (medians
over rounds, methods interleaved in a seeded random order, the first round a warm-up):

- ``raw Clarabel loop``: Clarabel on the raw cone data, forward only (the physical reference);
- ``Moreau fwd`` / ``Moreau fwd+bwd``: ``moreau.torch.Solver`` (CPU, batched), where installed;
- ``dxopt clarabel fwd`` / ``fwd+bwd``: :func:`dxopt.conic.solve` with ``solver="clarabel"``;
- ``dxopt torch fwd`` / ``fwd+bwd``: the same with ``solver="torch"`` (the interior point as
  the first attempt, every point certified, the rest handed on to Clarabel);
- ``attempt: clarabel`` / ``attempt: torch``: the backend runners alone
  (:func:`dxopt.conic.backends.run_clarabel`, :func:`dxopt.conic.ipm.run_torch`), without
  dxopt's certificate and polish.

``x_err`` is ``max |x - x_ref|`` of the whole canonical ``x`` against ``dxopt clarabel fwd``
(for the dxopt rows; the certified points are unique where the program's solution is).
``solvers`` names the attempts whose points were certified. Writes
``results/torch_ipm.json`` and ``.md`` with the load average at start and end.
Run: ``python -m benchmarks.conic.torch_ipm [--rounds 5] [--batches 1 8 32 128]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import machine_info, machine_line, markdown_table, results_dir, write_json
from benchmarks.conic import peers
from benchmarks.conic.problems import PROBLEMS, cone_data

NAMES = ("socp", "portfolio", "monotone")
COLUMNS = ("problem", "batch", "method", "ms", "vs_raw", "x_err", "solvers")


def _dxopt(data: Any, solver: str, backward: bool) -> Callable[[], Any]:
    from dxopt import conic

    P, q, A, b, cones = peers.dxopt_data(data)
    weight = torch.ones_like(q)

    def run() -> Any:
        if not backward:
            return conic.solve(P, q, A, b, cones=cones, solver=solver)
        leaves = [t.clone().requires_grad_() for t in (q, A, b)]
        P_leaf = P.clone().requires_grad_() if P is not None else None
        sol = conic.solve(P_leaf, *leaves, cones=cones, solver=solver)
        (weight * sol.x).sum().backward()
        return sol

    return run


def _attempt(data: Any, runner: Any) -> Callable[[], Any]:
    from dxopt.conic.problem import conic_problem

    P, q, A, b, cones = peers.dxopt_data(data)
    prob = conic_problem(P, q, A, b, cones, check_psd=False)
    index = list(range(prob.batch))
    return lambda: runner(prob, index, 1e-8, 200)


def _moreau_fwd(data: Any) -> Callable[[], Any]:
    solver, values = peers.moreau_batch(data)
    return lambda: solver.solve(*values)


def _counts(names: Any) -> str:
    return " ".join(f"{k}:{v}" for k, v in collections.Counter(names).items())


def run_case(name: str, batch: int, rounds: int, seed: int) -> list[dict[str, Any]]:
    from dxopt.conic.backends import run_clarabel
    from dxopt.conic.ipm import run_torch

    prob = PROBLEMS[name](batch, seed=seed)
    data = cone_data(prob)
    methods: dict[str, Callable[[], Any]] = {"raw Clarabel loop": peers.raw_clarabel(prob)}
    if peers.moreau_available() is None:
        methods["Moreau fwd"] = _moreau_fwd(data)
        methods["Moreau fwd+bwd"] = peers.moreau_solver(prob)
    for solver in ("clarabel", "torch"):
        methods[f"dxopt {solver} fwd"] = _dxopt(data, solver, backward=False)
        methods[f"dxopt {solver} fwd+bwd"] = _dxopt(data, solver, backward=True)
    methods["attempt: clarabel"] = _attempt(data, run_clarabel)
    methods["attempt: torch"] = _attempt(data, run_torch)
    times: dict[str, list[float]] = {k: [] for k in methods}
    outs: dict[str, Any] = {}
    rng = random.Random(seed)
    for _ in range(rounds + 1):
        order = list(methods)
        rng.shuffle(order)
        for key in order:
            t0 = time.perf_counter()
            outs[key] = methods[key]()
            times[key].append(time.perf_counter() - t0)
    raw = statistics.median(times["raw Clarabel loop"][1:])
    ref = outs["dxopt clarabel fwd"].x
    rows = []
    for key in methods:
        ms = statistics.median(times[key][1:])
        row: dict[str, Any] = {"problem": name, "batch": batch, "method": key,
                               "ms": 1e3 * ms, "vs_raw": ms / raw}  # fmt: skip
        if key.startswith("dxopt"):
            sol = outs[key]
            row["x_err"] = float((sol.x.detach() - ref).abs().max())
            row["solvers"] = _counts(sol.info.solvers)
        if key == "attempt: torch":
            row["solvers"] = _counts(outs[key].claims)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8, 32, 128])
    parser.add_argument("--problems", nargs="*", default=list(NAMES), choices=list(NAMES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    rows = [r for name in args.problems for b in args.batches
            for r in run_case(name, b, args.rounds, args.seed)]  # fmt: skip
    load_end = os.getloadavg()
    info = machine_info()
    load = f"load average (1/5/15 min) at start {load_start}, at end {load_end}"
    out = results_dir("conic")
    write_json(out / "torch_ipm.json", {"machine": info, "load": [load_start, load_end],
                                        "rows": rows})  # fmt: skip
    text = f"{machine_line(info)}; 1 thread; {load}\n\n{markdown_table(rows, COLUMNS)}\n"
    (out / "torch_ipm.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
