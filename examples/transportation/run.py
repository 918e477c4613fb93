"""Forecast demands in the constraints: decision-focused learning of a transportation plan.

Three depots with known stocks :math:`s_i` ship to six stores whose demands :math:`d_j` are
forecast from 5 features. The plan for a forecast :math:`\\hat d` is the transportation
problem, smoothed by :math:`\\tfrac\\epsilon2\\|\\cdot\\|^2` so that it has one solution that
moves smoothly with :math:`\\hat d`:

.. math::

    \\min_{x \\ge 0,\\ u \\ge 0}\\ \\sum_{ij} c_{ij} x_{ij} + p \\sum_j u_j
        + \\tfrac\\epsilon2 (\\|x\\|^2 + \\|u\\|^2)
    \\quad\\text{s.t.}\\quad \\sum_j x_{ij} \\le s_i, \\qquad
        \\sum_i x_{ij} + u_j \\ge \\hat d_j,

with :math:`u_j` the demand the plan leaves unmet. **The prediction enters the right-hand side
of the constraints**, not the objective: :func:`dxopt.qp.solve` differentiates the solution
with respect to ``h`` (and ``A``, ``b``, ``G``), so the forecaster can be trained on what the
plan costs once the true demand :math:`d` is known,

.. math:: \\text{cost}(x; d) = \\sum_{ij} c_{ij} x_{ij} + p \\sum_j (d_j - y_j)_+
    + k \\sum_j (y_j - d_j)_+, \\qquad y_j = \\sum_i x_{ij},

with a shortage price :math:`p = 10` and a holding cost :math:`k = 1` per unit. PyEPO cannot
train this model: its layers take predicted *objective* coefficients only (PyEPO issues #4
and #51 on GitHub).

Demands are log-normal around a nonlinear function of the features, so the forecast that
minimises the squared error (**two-stage**) plans for the mean, while with shortages ten times
dearer than leftovers the best plan covers a high quantile (the newsvendor ratio
:math:`p / (p + k) \\approx 0.91`; Arrow, Harris & Marschak, Econometrica 1951) and must share
the stock where the depots cannot cover every store. **Decision-focused** training (Donti,
Amos & Kolter, NeurIPS 2017) learns both from the realised cost. Reported: the mean realised
cost on held-out days (mean ± sd over seeds; lower is better) and the cost of planning with the
true demand (a lower bound). Run ``dxopt demo transportation`` (``--quick``: seconds).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import dxopt.qp as dqp
from dxopt._demos.report import (
    add_output_options,
    bar_plot,
    output_folder,
    paired_verdict,
    resolve_output,
    write_results,
)

INSTALLED_OUT = "dxopt-transportation-out"
OUT_DIR = output_folder(__file__, INSTALLED_OUT)
DEPOTS, STORES, NUM_FEAT = 3, 6, 5
SHORTAGE, HOLDING = 10.0, 1.0
METHODS = ("two-stage", "decision-focused")


@dataclass(frozen=True)
class Network:
    """The fixed world: unit shipping costs ``(DEPOTS, STORES)``, depot stocks ``(DEPOTS,)``,
    the demand model's matrices and each store's base demand."""

    ship_cost: Tensor
    stock: Tensor
    B1: Tensor
    B2: Tensor
    base: Tensor

    @staticmethod
    def make(seed: int = 0) -> Network:
        g = torch.Generator().manual_seed(seed)
        depots = torch.rand(DEPOTS, 2, generator=g, dtype=torch.float64)
        stores = torch.rand(STORES, 2, generator=g, dtype=torch.float64)
        ship = 0.5 + torch.cdist(depots, stores)  # a fixed handling cost plus the distance
        base = 5.0 + 5.0 * torch.rand(STORES, generator=g, dtype=torch.float64)
        stock = torch.full((DEPOTS,), 1.15 * float(base.sum()) / DEPOTS, dtype=torch.float64)
        B1 = torch.randn(STORES, NUM_FEAT, generator=g, dtype=torch.float64)
        B2 = torch.randn(STORES, NUM_FEAT, generator=g, dtype=torch.float64)
        return Network(ship, stock, B1, B2, base)

    def sample(self, n: int, seed: int) -> tuple[Tensor, Tensor]:
        """``n`` days: features ``(n, 5)`` and demands ``(n, 6)``: log-normal noise (sd 0.4)
        around ``base * exp(0.4 tanh(B1 f / sqrt 5) + 0.2 sin(B2 f))``."""
        g = torch.Generator().manual_seed(seed)
        f = torch.randn(n, NUM_FEAT, generator=g, dtype=torch.float64)
        signal = 0.4 * torch.tanh(f @ self.B1.T / math.sqrt(NUM_FEAT)) + 0.2 * torch.sin(
            f @ self.B2.T
        )
        noise = 0.4 * torch.randn(n, STORES, generator=g, dtype=torch.float64)
        return f, self.base * torch.exp(signal + noise)


def plan(net: Network, d_hat: Tensor, *, eps: float = 0.05) -> Tensor:
    """Shipments ``(B, DEPOTS, STORES)`` of the smoothed transportation plan for the forecasts
    ``d_hat`` ``(B, STORES)``, differentiable in ``d_hat`` (it enters ``h``)."""
    B, n_x = d_hat.shape[0], DEPOTS * STORES
    n = n_x + STORES
    dt = d_hat.dtype
    P = eps * torch.eye(n, dtype=dt)
    q = torch.cat([net.ship_cost.reshape(-1), torch.full((STORES,), SHORTAGE, dtype=dt)])
    supply = torch.zeros(DEPOTS, n, dtype=dt)  # sum_j x_ij <= s_i
    for i in range(DEPOTS):
        supply[i, i * STORES : (i + 1) * STORES] = 1.0
    cover = torch.zeros(STORES, n, dtype=dt)  # -(sum_i x_ij + u_j) <= -d_j
    for j in range(STORES):
        cover[j, j:n_x:STORES] = -1.0
        cover[j, n_x + j] = -1.0
    G = torch.cat([supply, cover])
    h = torch.cat([net.stock.expand(B, DEPOTS).to(dt), -d_hat], dim=1)
    sol = dqp.solve(P, q, G=G, h=h, lb=torch.zeros(n, dtype=dt))
    return sol.x[:, :n_x].reshape(B, DEPOTS, STORES)


def realised_cost(net: Network, x: Tensor, d: Tensor) -> Tensor:
    """Per-day cost ``(B,)`` of shipments ``x`` once the demand ``d`` is known."""
    delivered = x.sum(dim=1)
    shipping = (x * net.ship_cost).sum(dim=(1, 2))
    short = torch.relu(d - delivered).sum(dim=1)
    left = torch.relu(delivered - d).sum(dim=1)
    return shipping + SHORTAGE * short + HOLDING * left


def train(
    method: str,
    net: Network,
    f: Tensor,
    d: Tensor,
    *,
    epochs: int,
    lr: float,
    batch: int,
    seed: int,
) -> tuple[nn.Module, float]:
    """A linear forecaster ``nn.Linear(5, 6)`` trained by MSE or through the plan."""
    torch.manual_seed(seed)
    model = nn.Linear(NUM_FEAT, STORES).to(torch.float64)
    with torch.no_grad():  # start from the mean demand, as a forecaster would
        model.bias.copy_(d.mean(dim=0))
        model.weight.mul_(0.1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(len(f), generator=gen)
        for i in range(0, len(f), batch):
            idx = order[i : i + batch]
            d_hat = model(f[idx])
            if method == "two-stage":
                loss = nn.functional.mse_loss(d_hat, d[idx])
            else:
                loss = realised_cost(net, plan(net, d_hat), d[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model, time.perf_counter() - start


def held_out_cost(net: Network, d_hat: Tensor, d: Tensor) -> float:
    """Mean realised cost of planning with ``d_hat`` on the held-out days."""
    with torch.no_grad():
        return float(realised_cost(net, plan(net, d_hat), d).mean())


def verdict(dfl_costs: list[float], two_stage: list[float]) -> str:
    """Paired comparison over seeds (lower cost is better)."""
    return paired_verdict(dfl_costs, two_stage, score="cost per day", digits=3)


def run(
    *,
    seeds: list[int],
    num_train: int,
    num_test: int,
    epochs: int,
    lr: float = 0.05,
    batch: int = 32,
    out_dir: Path,
) -> dict:
    """Train both forecasters for every seed; writes ``results.json`` and ``cost.png``."""
    net = Network.make(0)
    costs: dict[str, list[float]] = {m: [] for m in (*METHODS, "true demand")}
    seconds = dict.fromkeys(METHODS, 0.0)
    for seed in seeds:
        f, d = net.sample(num_train + num_test, seed=1000 + seed)
        f_tr, d_tr, f_te, d_te = f[:num_train], d[:num_train], f[num_train:], d[num_train:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
            for method in METHODS:
                model, secs = train(
                    method, net, f_tr, d_tr, epochs=epochs, lr=lr, batch=batch, seed=seed
                )
                seconds[method] += secs
                with torch.no_grad():
                    costs[method].append(held_out_cost(net, model(f_te), d_te))
            costs["true demand"].append(held_out_cost(net, d_te, d_te))
    table = {
        m: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
        for m, v in costs.items()
    }
    summary = {
        "seeds": seeds,
        "num_train": num_train,
        "num_test": num_test,
        "epochs": epochs,
        "costs": costs,
        "train_seconds": seconds,
        "verdict": verdict(costs["decision-focused"], costs["two-stage"]),
    }
    plot_path = out_dir / "cost.png"
    summary["plot"] = str(plot_path) if plot(table, len(seeds), plot_path) else None
    write_results(out_dir, summary)
    summary["table"] = table
    return summary


def plot(table: dict, n_seeds: int, path: Path) -> bool:
    """Bars of the held-out cost per plan (error bars: sd over seeds)."""

    def draw(ax: Any) -> None:
        names = list(table)
        ax.bar(
            names,
            [table[n][0] for n in names],
            yerr=[table[n][1] for n in names],
            capsize=4,
            color=["C0", "C1", "C7"],
        )

    return bar_plot(
        path,
        draw,
        title=f"Transportation plan from forecast demands, {n_seeds} seed(s)",
        ylabel="realised cost per day (held out; lower is better)",
        size=(6, 4),
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="dxopt demo transportation", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds, space separated"
    )
    parser.add_argument("--num-train", type=int, default=400, help="training days")
    parser.add_argument("--num-test", type=int, default=1000, help="held-out days")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs")
    add_output_options(parser, quick="one seed, 96 days, 2 epochs", installed_name=INSTALLED_OUT)
    args = parser.parse_args(argv)
    args.out = resolve_output(args, OUT_DIR, "dxopt-transport-")
    torch.set_num_threads(1)
    if args.quick:
        args.seeds, args.num_train, args.num_test, args.epochs = args.seeds[:1], 96, 200, 2
    summary = run(
        seeds=args.seeds,
        num_train=args.num_train,
        num_test=args.num_test,
        epochs=args.epochs,
        out_dir=args.out,
    )
    print(
        f"Transportation, {DEPOTS} depots x {STORES} stores, forecast demands in the "
        f"constraints: {args.num_train} training and {args.num_test} held-out days, "
        f"{args.epochs} epochs, seeds {args.seeds}."
    )
    print("| plan from | realised cost per day | train s |\n|---|---|---|")
    for name, (mean, sd) in summary["table"].items():
        secs = summary["train_seconds"].get(name)
        print(f"| {name} | {mean:.3f} ± {sd:.3f} | {'-' if secs is None else f'{secs:.1f}'} |")
    print(f"\nDecision-focused against two-stage (paired over seeds): {summary['verdict']}")
    if summary["plot"]:
        print(f"plot: {summary['plot']}")
    return summary


if __name__ == "__main__":
    main()
