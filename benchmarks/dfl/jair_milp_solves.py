"""Seconds per scheduling MILP solve, dxopt's ``MILPOracle`` (HiGHS) beside PyEPO's
``optGrbModel`` (Gurobi), on the same costs, one thread each.

The costs are those the JAIR suite's methods send to the oracle on the training days of
``scheduling-<instance>``: the true costs :math:`c` (what the data's optima and the regret
need), the initial model's predictions :math:`\\hat c` (DBB, I-MLE, PG, NID solve near these)
and SPO+'s :math:`2\\hat c - c`. Each solver variant solves them one after the other; for each
the mean seconds per solve and the largest relative excess of its objective over HiGHS' proven
optimum, :math:`\\max_i (z_i - z_i^*) / |z_i^*|` (minimisation: 0 for an exact answer). Gurobi
runs at its default ``MIPGap`` (``1e-4``, as the suite's PyEPO model) and at ``MIPGap=0`` (the
exactness dxopt's oracle certifies); HiGHS without presolve (as the suite), at
``mip_rel_gap=0`` (dxopt's default) and ``1e-4``, warm-started from its own answers (the
default) and from the training optima (``add_solutions``).

Command: ``OMP_NUM_THREADS=1 PYTHONPATH=src:. python -m benchmarks.dfl.jair_milp_solves
--instance 1 --days 16``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from benchmarks.dfl.jair_suite import PriceModel, load_task, pyepo_model


def _gurobi(inst: Any, costs: torch.Tensor, gap: float | None) -> tuple[float, torch.Tensor]:
    model = pyepo_model(inst)
    if gap is not None:
        model._model.Params.MIPGap = gap
    xs, t0 = [], time.perf_counter()
    for row in costs:
        model.setObj(row.numpy())
        xs.append(model.solve()[0])
    return (time.perf_counter() - t0) / len(costs), torch.tensor(np.array(xs)).double()


def _highs(inst: Any, costs: torch.Tensor, gap: float, pool: bool) -> tuple[float, torch.Tensor]:
    oracle = inst.task.oracle.copy(presolve=False, mip_rel_gap=gap, on_failure="ignore")
    if pool:
        oracle.add_solutions(inst.w_train.double())
    t0 = time.perf_counter()
    x = oracle(costs)
    return (time.perf_counter() - t0) / len(costs), x.double()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instance", type=int, default=1)
    parser.add_argument("--days", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    inst = load_task("scheduling", seed=args.seed, num_train=args.days, option=args.instance)
    with torch.no_grad():
        c_hat = PriceModel(inst.task, args.seed)(inst.x_train).double()
    c = inst.c_train.double()
    variants = {
        "gurobi MIPGap=1e-4 (default)": lambda C: _gurobi(inst, C, None),
        "gurobi MIPGap=0": lambda C: _gurobi(inst, C, 0.0),
        "highs mip_rel_gap=0 (dxopt)": lambda C: _highs(inst, C, 0.0, False),
        "highs mip_rel_gap=1e-4": lambda C: _highs(inst, C, 1e-4, False),
        "highs gap 0, warm from training optima": lambda C: _highs(inst, C, 0.0, True),
    }
    print(f"scheduling-{args.instance}, {args.days} days, {inst.num_vars} variables")
    print("| costs | solver | ms/solve | max excess over optimum |")
    print("|---|---|---|---|")
    for name, costs in (("c", c), ("c_hat", c_hat), ("2 c_hat - c", 2 * c_hat - c)):
        results = {k: run(costs) for k, run in variants.items()}
        z_opt = (results["highs mip_rel_gap=0 (dxopt)"][1] * costs).sum(1)
        for k, (sec, x) in results.items():
            excess = float((((x * costs).sum(1) - z_opt) / z_opt.abs()).max())
            print(f"| {name} | {k} | {1e3 * sec:.1f} | {excess:.1e} |")


if __name__ == "__main__":
    main()
