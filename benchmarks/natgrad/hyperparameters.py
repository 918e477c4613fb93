"""How the README's SPRING and ENGD settings were chosen: short sweeps on the documented problems.

Run with ``python -m benchmarks.natgrad.hyperparameters [--part spring|engd|all] [--seeds ...]``
(single-threaded, about a minute per part on one core). It prints one table per part:

- ``spring``: SPRING on the 1-D Poisson PINN (:class:`~dxopt.natgrad.Poisson1D`, a 1-32-1 tanh
  network, 32 interior + 2 boundary points drawn afresh each step, 50 steps) and on the README's
  2-D Poisson PINN (64 + 16 points, 100 steps): median relative L2 error over the seeds for a
  grid of ``lr``, ``damping``, ``momentum`` and ``norm_cap``.
- ``engd``: ENGD on plain regression (a 1-32-1 tanh network fitted to 64 noisy samples of
  :math:`\\sin \\pi x`, noise 0.1, residual ``model(x) - y`` as in the README's closure
  example): test MSE against the clean function after 20 and 100 steps, for several dampings
  with and without ``damping_floor``; Adam (lr 1e-2, 2000 full-batch steps) for reference;
  and the same ENGD settings on the 1-D and 2-D Poisson PINNs (fixed grids, 30 steps).
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from typing import Any

import torch

from benchmarks.common import markdown_table
from dxopt.natgrad import ENGD, SPRING, Poisson1D, Poisson2D, tanh_mlp

PI = math.pi


def spring_error(problem: Any, hyper: dict[str, Any], seed: int, *, steps: int) -> float:
    """Relative L2 error of SPRING after ``steps`` fresh-batch steps."""
    model = tanh_mlp(problem.dim, (32,), seed=seed)
    opt = SPRING(model, problem.residual(model), **hyper)
    gen = torch.Generator().manual_seed(seed)
    n_int, n_bnd = (32, 2) if problem.dim == 1 else (64, 16)
    for _ in range(steps):
        opt.step(problem.sample(n_int, n_bnd, gen))
    err = problem.relative_l2(model)
    return err if math.isfinite(err) else math.inf


def spring_sweep(seeds: list[int]) -> list[dict[str, Any]]:
    rows = []
    grid = itertools.product((0.2, 0.5, 1.0), (1e-8, 1e-4, 1e-3), (0.9, 0.99), (1e-2, 1.0, None))
    p1, p2 = Poisson1D(), Poisson2D()
    for lr, damping, momentum, cap in grid:
        hyper = {"lr": lr, "damping": damping, "momentum": momentum, "norm_cap": cap}
        e1 = [spring_error(p1, hyper, s, steps=50) for s in seeds]
        rows.append({**hyper, "norm_cap": "-" if cap is None else cap, "1-D": e1})
    rows.sort(key=lambda r: statistics.median(r["1-D"]))
    for row in rows[:8]:  # the 2-D check for the best 1-D settings only (it is slower)
        hyper = {k: row[k] for k in ("lr", "damping", "momentum")}
        hyper["norm_cap"] = None if row["norm_cap"] == "-" else row["norm_cap"]
        row["2-D"] = [spring_error(p2, hyper, s, steps=100) for s in seeds]
    for row in rows:
        for key in ("1-D", "2-D"):
            if key in row:
                row[f"{key} median"] = statistics.median(row[key])
                row[f"{key} worst"] = max(row[key])
    return rows


def _regression_data(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = 2 * torch.rand(64, 1, generator=gen, dtype=torch.float64) - 1
    y = torch.sin(PI * x).reshape(-1) + 0.1 * torch.randn(64, generator=gen, dtype=torch.float64)
    xt = torch.linspace(-1, 1, 1000, dtype=torch.float64).reshape(-1, 1)
    return x, y, xt, torch.sin(PI * xt).reshape(-1)


def _test_mse(model: torch.nn.Module, xt: torch.Tensor, yt: torch.Tensor) -> float:
    with torch.no_grad():
        mse = float(((model(xt).reshape(-1) - yt) ** 2).mean())
    return mse if math.isfinite(mse) else math.inf


def engd_regression(hyper: dict[str, Any], seed: int, checkpoints: tuple[int, ...]) -> list[float]:
    x, y, xt, yt = _regression_data(seed)
    model = tanh_mlp(1, (32,), seed=seed)
    opt = ENGD(model.parameters(), **hyper)
    out = []
    for step in range(1, max(checkpoints) + 1):
        opt.step(lambda: model(x).reshape(-1) - y)
        if step in checkpoints:
            out.append(_test_mse(model, xt, yt))
    return out


def adam_regression(seed: int, steps: int = 2000) -> float:
    x, y, xt, yt = _regression_data(seed)
    model = tanh_mlp(1, (32,), seed=seed)
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        adam.zero_grad()
        ((model(x).reshape(-1) - y) ** 2).mean().backward()
        adam.step()
    return _test_mse(model, xt, yt)


def engd_pinn(problem: Any, hyper: dict[str, Any], seed: int, steps: int = 30) -> float:
    model = tanh_mlp(problem.dim, (32,), seed=seed)
    opt = ENGD(model, problem.residual(model), line_search="descending", **hyper)
    batch = problem.grid_batch(32, 2) if problem.dim == 1 else problem.grid_batch(30, 120)
    for _ in range(steps):
        opt.step(batch)
    return problem.relative_l2(model)


def engd_sweep(seeds: list[int]) -> list[dict[str, Any]]:
    settings: list[dict[str, Any]] = [{"damping": d} for d in (1e-8, 1e-6, 1e-4, 1e-3, 1e-2)] + [
        {"damping": d, "damping_floor": 1e-10} for d in (1e-4, 1e-3, 1e-2)
    ]
    rows = []
    p1, p2 = Poisson1D(), Poisson2D()
    for hyper in settings:
        runs = [engd_regression(hyper, s, (20, 100)) for s in seeds]
        rows.append(
            {
                "method": "ENGD",
                "damping": hyper["damping"],
                "damping_floor": hyper.get("damping_floor", "-"),
                "test MSE @20": statistics.median(r[0] for r in runs),
                "test MSE @100": statistics.median(r[1] for r in runs),
                "Poisson1D rel. L2 @30": statistics.median(engd_pinn(p1, hyper, s) for s in seeds),
                "Poisson2D rel. L2 @30": statistics.median(engd_pinn(p2, hyper, s) for s in seeds),
            }
        )
    rows.append(
        {
            "method": "Adam lr 1e-2, 2000 steps",
            "test MSE @100": statistics.median(adam_regression(s) for s in seeds),
        }
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.natgrad.hyperparameters")
    parser.add_argument("--part", choices=("spring", "engd", "all"), default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.part in ("spring", "all"):
        rows = spring_sweep(args.seeds)
        cols = ["lr", "damping", "momentum", "norm_cap", "1-D median", "1-D worst"]
        print("SPRING, relative L2 (1-D: 50 steps of 32+2 points; 2-D: 100 steps of 64+16)")
        print(markdown_table(rows, [*cols, "2-D median", "2-D worst"]))
    if args.part in ("engd", "all"):
        rows = engd_sweep(args.seeds)
        cols = [
            "method",
            "damping",
            "damping_floor",
            "test MSE @20",
            "test MSE @100",
            "Poisson1D rel. L2 @30",
            "Poisson2D rel. L2 @30",
        ]
        print("\nENGD: regression test MSE (median over seeds) and PINN relative L2")
        print(markdown_table(rows, cols))
    print(f"\nseeds {args.seeds}")


if __name__ == "__main__":
    main()
