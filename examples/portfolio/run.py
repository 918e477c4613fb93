"""Multi-period portfolio on real S&P 500 prices: decision-focused learning with a QP layer.

At each weekly decision time :math:`t`, holding :math:`w_0` (the previous weights after the
week's price drift), we plan :math:`H` periods of weights :math:`w_1, \\dots, w_H \\in
\\mathbb R^N` (:math:`N = 20` stocks of ``skfolio.datasets.load_sp500_dataset``) by the
long-only, fully invested mean-variance QP with quadratic transaction costs and a per-period
trade limit (Gârleanu & Pedersen, *Dynamic trading with predictable returns and transaction
costs*, J. Finance 2013; Boyd et al., *Multi-period trading via convex optimization*,
arXiv 1705.00109):

.. math::

    \\min_{w_1..w_H} \\sum_{k=1}^{H} \\Big[ \\tfrac{\\gamma}{2} w_k^\\top \\Sigma_t w_k
        - \\hat\\mu_{t,k}^\\top w_k + \\tfrac{\\kappa}{2} \\|w_k - w_{k-1}\\|_2^2 \\Big]
    \\quad\\text{s.t.}\\quad \\mathbf 1^\\top w_k = 1,\\; w_k \\ge 0,\\;
    |w_k - w_{k-1}| \\le \\tau \\;(k = 1..H),

with :math:`\\Sigma_t` the shrunk 52-week sample covariance and :math:`\\hat\\mu_{t,k}` the
returns predicted for week :math:`t+k` by a small network (shared across assets) from each
stock's past 12 weekly returns. Only :math:`w_1` is traded (model-predictive control). One QP
per decision time is solved by :func:`dxopt.qp.solve`, batched over decision times.

- **Decision-focused (DFL)**: the network is trained end-to-end through the QP layer on the
  realized utility :math:`\\sum_k w_k^\\top r_{t+k} - \\tfrac\\gamma2 w_k^\\top\\Sigma_t w_k
  - \\tfrac\\kappa2\\|w_k - w_{k-1}\\|^2` (Donti, Amos & Kolter, arXiv 1703.04529).
- **Predict-then-optimize (PTO)**: the same network trained on the MSE of the returns.
- **Equal weights**: :math:`1/N`, rebalanced weekly.

Training uses 2006–2017, evaluation the held-out 2018–2022; realized returns are charged a
proportional cost of 10 bp on turnover :math:`\\|w_1 - w_0\\|_1`. Run ``dxopt demo portfolio``
(``--quick`` for a seconds-long smoke run).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

import dxopt.qp as dqp
from examples.portfolio.data import MarketData, covariance, features, future, load_weekly
from examples.portfolio.problem import PortfolioSpec, constraint_matrices, objective, rhs

OUT_DIR = Path(__file__).resolve().parent / "out"
if "site-packages" in OUT_DIR.parts or "dist-packages" in OUT_DIR.parts:
    OUT_DIR = Path.cwd() / "dxopt-portfolio-out"  # installed from a wheel: never write there
LAGS, WINDOW = 12, 52
SPLIT = np.datetime64("2018-01-01")


class ReturnModel(nn.Module):
    """Per-asset MLP: 12 vol-scaled past returns -> H predicted returns (times volatility)."""

    def __init__(self, horizon: int, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(LAGS, hidden), nn.Tanh(), nn.Linear(hidden, horizon))
        self.net.to(torch.float64)

    def forward(self, x: Tensor, vol: Tensor) -> Tensor:
        """``x`` ``(B, N, LAGS)``, ``vol`` ``(B, N)`` -> ``(B, H, N)``."""
        return (0.1 * self.net(x) * vol[..., None]).transpose(1, 2)


def decide(spec: PortfolioSpec, mu: Tensor, cov: Tensor, w0: Tensor, backward: str) -> Tensor:
    """Solve the batched multi-period QP; returns planned weights ``(B, H, N)``."""
    A, b, G = constraint_matrices(spec)
    P, q = objective(spec, cov, mu, w0)
    sol = dqp.solve(P, q, A=A, b=b, G=G, h=rhs(spec, w0), backward=backward)
    return sol.x.reshape(-1, spec.horizon, spec.assets)


def realized_utility(spec: PortfolioSpec, w: Tensor, r: Tensor, cov: Tensor, w0: Tensor):
    """Per-sample realized utility of planned weights ``w`` against realized returns ``r``."""
    ret = (w * r).sum(dim=(1, 2))
    risk = torch.einsum("bhi,bij,bhj->b", w, cov, w)
    prev = torch.cat([w0[:, None, :], w[:, :-1, :]], dim=1)
    trade = ((w - prev) ** 2).sum(dim=(1, 2))
    return ret - 0.5 * spec.risk_aversion * risk - 0.5 * spec.cost * trade


def train(data: MarketData, spec: PortfolioSpec, times: Tensor, *, mode: str, steps: int,
          batch: int, seed: int, backward: str) -> ReturnModel:  # fmt: skip
    """Train a :class:`ReturnModel` by ``mode`` = ``"dfl"`` (through the QP) or ``"mse"``."""
    torch.manual_seed(seed)
    model = ReturnModel(spec.horizon)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    w_prev = torch.full((int(times.max()) + 2, spec.assets), 1.0 / spec.assets,
                        dtype=torch.float64)  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for _ in tqdm(range(steps), desc=f"train {mode}", file=sys.stderr, leave=False):
        t = times[torch.randint(len(times), (batch,), generator=gen)]
        mu = model(features(data, t, LAGS), data.vol[t])
        r = future(data, t, spec.horizon)
        if mode == "mse":
            loss = (((mu - r) / data.vol[t][:, None, :]) ** 2).mean()
        else:
            cov, w0 = covariance(data, t, WINDOW), w_prev[t]
            w = decide(spec, mu, cov, w0, backward)
            loss = -realized_utility(spec, w, r, cov, w0).mean() * 52
            w_prev[t + 1] = w[:, 0].detach()  # the next week starts from this decision
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def backtest(data: MarketData, spec: PortfolioSpec, times: Tensor, models: dict, backward: str):
    """Walk forward week by week; returns net weekly returns, turnover and weights per strategy."""
    names = [*models, "equal weights"]
    N = spec.assets
    w0 = torch.full((len(names), N), 1.0 / N, dtype=torch.float64)
    out = {k: {"net": [], "turnover": [], "weights": []} for k in names}
    for t in tqdm(times.tolist(), desc="backtest", file=sys.stderr, leave=False):
        tt = torch.tensor([t])
        with torch.no_grad():
            mus = torch.cat([m(features(data, tt, LAGS), data.vol[tt]) for m in models.values()])
            k = len(models)
            w = decide(spec, mus, covariance(data, tt, WINDOW).expand(k, N, N), w0[:k], backward)
        new = torch.cat([w[:, 0], torch.full((1, N), 1.0 / N, dtype=torch.float64)])
        r = data.returns[t + 1]
        turnover = (new - w0).abs().sum(dim=1)
        gross = new @ r
        net = gross - spec.linear_cost * turnover
        for i, name in enumerate(names):
            out[name]["net"].append(float(net[i]))
            out[name]["turnover"].append(float(turnover[i]))
            out[name]["weights"].append(new[i].tolist())
        w0 = new * (1 + r) / (1 + gross[:, None])  # drift to the end of the week
    return out


def metrics(net: list[float], turnover: list[float]) -> dict[str, float]:
    arr = np.asarray(net)
    ann_ret, ann_vol = float(arr.mean() * 52), float(arr.std(ddof=1) * math.sqrt(52))
    return {
        "ann. return": ann_ret,
        "ann. volatility": ann_vol,
        "Sharpe": ann_ret / ann_vol if ann_vol > 0 else float("nan"),
        "avg weekly turnover": float(np.mean(turnover)),
        "final wealth": float(np.prod(1 + arr)),
    }


def plot(dates: np.ndarray, results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for name, res in results.items():
        ax.plot(dates, np.cumprod(1 + np.asarray(res["net"])), label=name)
    ax.set_ylabel("wealth (net of 10 bp costs)")
    ax.set_title("Held-out 2018-2022: S&P 500 stocks, weekly multi-period QP")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(*, steps: int, batch: int, horizon: int, seed: int, test_weeks: int | None,
        backward: str, out_dir: Path) -> dict:  # fmt: skip
    """Train both models, backtest the three strategies, write the plot; returns the results."""
    data = load_weekly()
    spec = PortfolioSpec(assets=len(data.assets), horizon=horizon)
    first = WINDOW  # enough history for features and covariances
    last = len(data.dates) - horizon - 1
    all_t = torch.arange(first, last)
    is_train = torch.from_numpy(data.dates[all_t.numpy() + horizon] < SPLIT)
    train_t, test_t = all_t[is_train], all_t[~is_train]
    if test_weeks is not None:
        test_t = test_t[:test_weeks]
    models = {
        "decision-focused": train(data, spec, train_t, mode="dfl", steps=steps, batch=batch,
                                  seed=seed, backward=backward),
        "predict-then-optimize": train(data, spec, train_t, mode="mse", steps=steps,
                                       batch=batch, seed=seed, backward=backward),
    }  # fmt: skip
    results = backtest(data, spec, test_t, models, backward)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_path = out_dir / "wealth.png"
    plot(data.dates[test_t.numpy() + 1], results, plot_path)
    table = {name: metrics(res["net"], res["turnover"]) for name, res in results.items()}
    summary = {"metrics": table, "plot": str(plot_path), "test_weeks": len(test_t),
               "train_weeks": len(train_t), "results": results}  # fmt: skip
    (out_dir / "results.json").write_text(json.dumps({k: summary[k] for k in
                                                      ("metrics", "test_weeks", "train_weeks")},
                                                     indent=2))  # fmt: skip
    return summary


def format_table(table: dict[str, dict[str, float]]) -> str:
    cols = ["ann. return", "ann. volatility", "Sharpe", "avg weekly turnover", "final wealth"]
    lines = ["| strategy | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.3f}" for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="dxopt demo portfolio",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--steps", type=int, default=40, help="training steps per model")
    parser.add_argument("--batch", type=int, default=32, help="decision times per step")
    parser.add_argument("--horizon", type=int, default=3, help="planning periods H")
    parser.add_argument("--seed", type=int, default=0, help="seed of the networks and batches")
    parser.add_argument(
        "--backward",
        choices=["penalty", "kkt"],
        default="penalty",
        help="the QP layer's backward: penalty (dXPP) or exact KKT",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (3 steps, 20 test weeks) into a temporary folder",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: out/ next to this script, ./dxopt-portfolio-out from an "
        "installed wheel; with --quick a temporary folder)",
    )
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="dxopt-portfolio-")) if args.quick else OUT_DIR
    torch.set_num_threads(2)
    steps, batch, weeks = (3, 4, 20) if args.quick else (args.steps, args.batch, None)
    summary = run(steps=steps, batch=batch, horizon=args.horizon, seed=args.seed,
                  test_weeks=weeks, backward=args.backward, out_dir=args.out)  # fmt: skip
    print(f"Held-out period: {summary['test_weeks']} weeks; trained on "
          f"{summary['train_weeks']} weeks, {steps} steps of {batch} decision times.")  # fmt: skip
    print(format_table(summary["metrics"]))
    print(f"wealth curves: {summary['plot']}")


if __name__ == "__main__":
    main()
