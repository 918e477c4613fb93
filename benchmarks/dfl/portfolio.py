"""The portfolio row of the DFL benchmark: dxopt.dfl against PyEPO on the risk-constrained
portfolio (a second-order cone program), method by method.

Data: ``pyepo.data.portfolio.genData`` (PyEPO's factor model, Tang & Khalil, arXiv 2206.14234),
``num_train + num_test`` samples of ``num_assets`` returns from 5 features; the training labels
``w*``, ``z*`` come from PyEPO's Gurobi ``portfolioModel`` (``optDataset``), with the risk
budget :math:`x^\\top\\Sigma x \\le \\gamma\\,\\mathrm{mean}(\\Sigma)`, :math:`\\gamma = 2.25`
(PyEPO's default). PyEPO trains with that model; dxopt with
:class:`dxopt.dfl.PortfolioOracle` (certified by :mod:`dxopt.conic`), on the same data, the
same initial weights and the same mini-batch order (:mod:`benchmarks.dfl.methods`). Both
libraries' test decisions are judged by the same exact oracle (dxopt's): the normalised regret
:math:`\\sum_i (z^*_i - c_i^\\top x(\\hat c_i)) / \\sum_i |z^*_i|`. ``QPTL`` here is
:class:`dxopt.dfl.PortfolioLayer` (the quadratically smoothed portfolio, differentiated by the
conic backward) trained on the regret of its smooth decision; PyEPO has no counterpart.

Run: ``python -m benchmarks.dfl.portfolio [--quick] [--out DIR]``; it writes ``portfolio.json``
and ``portfolio.md`` to ``--out`` (default: a temporary folder; it never edits BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import machine_info, machine_line, markdown_table, set_threads, write_json
from benchmarks.dfl.data import NUM_FEAT, Instance, _quiet, instance_from
from benchmarks.dfl.methods import (
    PYEPO_METHODS,
    Hyper,
    Loss,
    SolveCounter,
    Trainer,
    linear_model,
    pyepo_loss,
    regret_loss,
    train_lockstep,
)

METHODS = ("2S", "SPO+", "DBB", "PFYL", "NCE", "QPTL")
GAMMA = 2.25
HYPER = {m: Hyper() for m in METHODS} | {"DBB": Hyper(lambd=10.0), "QPTL": Hyper(eps=0.01)}


def make_portfolio(
    *, num_assets: int, num_train: int, num_test: int, deg: int, seed: int, noise: float = 1.0
) -> tuple[Instance, Any, Any, torch.Tensor]:
    """The instance, PyEPO's model, PyEPO's training ``optDataset`` and the covariance."""
    import pyepo

    cov, x, r = pyepo.data.portfolio.genData(
        num_train + num_test, NUM_FEAT, num_assets, deg=deg, noise_level=noise, seed=seed
    )
    model = _quiet(pyepo.model.grb.portfolioModel, num_assets, cov, gamma=GAMMA)
    train = _quiet(pyepo.data.dataset.optDataset, model, x[:num_train], r[:num_train])
    inst = instance_from(
        train,
        x[num_train:],
        r[num_train:],
        problem="pf",
        deg=deg,
        seed=seed,
        noise=noise,
        weights=None,
        capacity=None,
        minimize=False,
    )
    return inst, model, train, torch.as_tensor(cov, dtype=torch.float64)


def dxopt_portfolio_loss(
    method: str, inst: Instance, cov: torch.Tensor, hp: Hyper, seed: int
) -> tuple[Loss, Any]:
    """dxopt's ``method`` on the portfolio and a counter of its solves."""
    from dxopt import dfl

    if method == "QPTL":
        layer = dfl.PortfolioLayer(cov, gamma=GAMMA, mu=hp.eps)
        calls = [0]

        def smooth(c_hat: torch.Tensor, c: Any, w: Any, z: torch.Tensor) -> torch.Tensor:
            calls[0] += c_hat.shape[0]
            return regret_loss(layer(c_hat), c, z, minimize=False)

        return smooth, lambda: calls[0]
    oracle = dfl.PortfolioOracle(cov, gamma=GAMMA)
    count = lambda: int(oracle.cost.forwards)  # noqa: E731
    if method == "2S":
        return (lambda c_hat, c, w, z: torch.nn.functional.mse_loss(c_hat, c)), count
    if method == "SPO+":
        spo = dfl.SPOPlus(oracle)
        return (lambda c_hat, c, w, z: spo(c_hat, c, w, z)), count
    if method == "DBB":
        dbb = dfl.DBB(oracle, lambd=hp.lambd)
        return (lambda c_hat, c, w, z: regret_loss(dbb(c_hat), c, z, False)), count
    if method == "PFYL":
        pfy = dfl.PerturbedFenchelYoung(oracle, n_samples=hp.n_samples, sigma=hp.sigma, seed=seed)
        return (lambda c_hat, c, w, z: pfy(c_hat, w)), count
    if method == "NCE":
        pool = dfl.SolutionPool(inst.w_train, sense="max")
        nce = dfl.NCE(oracle, pool, solve_ratio=hp.solve_ratio, seed=seed)
        return (lambda c_hat, c, w, z: nce(c_hat, w)), count
    raise ValueError(f"method: expected one of {METHODS}, got {method!r}.")


def run_portfolio(
    *,
    methods: tuple[str, ...] = METHODS,
    num_assets: int = 50,
    num_train: int = 1000,
    num_test: int = 1000,
    deg: int = 1,
    seed: int = 0,
    epochs: int = 5,
) -> list[dict[str, Any]]:
    """Train every (method, library) pair in lockstep; one row per pair."""
    from dxopt import dfl

    inst, model, train_ds, cov = make_portfolio(
        num_assets=num_assets, num_train=num_train, num_test=num_test, deg=deg, seed=seed
    )
    judge = dfl.PortfolioOracle(cov, gamma=GAMMA)
    rows: list[dict[str, Any]] = []
    for method in methods:
        hp = HYPER[method]
        trainers: list[tuple[str, Trainer]] = []
        if method in PYEPO_METHODS:
            counter = SolveCounter(model)
            loss = pyepo_loss(method, model, inst, train_ds, hp, seed)
            net = linear_model(inst, seed)
            calls = lambda counter=counter: counter.calls  # noqa: E731
            trainers.append(("pyepo", Trainer(net, loss, inst, hp, seed=seed, count_calls=calls)))
        loss, calls = dxopt_portfolio_loss(method, inst, cov, hp, seed)
        net = linear_model(inst, seed)
        trainers.append(("dxopt", Trainer(net, loss, inst, hp, seed=seed, count_calls=calls)))
        train_lockstep([t for _, t in trainers], epochs)
        for library, trainer in trainers:
            with torch.no_grad():
                c_hat = trainer.model(inst.x_test).double()
            regret = dfl.normalized_regret(judge, c_hat, inst.c_test.double())
            rec = trainer.record
            rows.append(
                {
                    "problem": f"portfolio {num_assets}",
                    "method": method,
                    "library": library,
                    "deg": deg,
                    "seed": seed,
                    "test_regret": float(regret),
                    "s_per_epoch": rec.seconds_per_epoch,
                    "solves_per_epoch": rec.oracle_calls_per_epoch,
                }
            )
    return rows


COLUMNS = ("problem", "method", "library", "test_regret", "s_per_epoch", "solves_per_epoch")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke size: 10 assets, 64 / 64")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: temp)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--assets", type=int, default=50)
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--deg", type=int, default=1)
    args = parser.parse_args(argv)
    set_threads(1)
    size = (10, 64, 64, 2) if args.quick else (args.assets, args.train, 1000, args.epochs)
    rows = run_portfolio(
        methods=tuple(args.methods),
        num_assets=size[0],
        num_train=size[1],
        num_test=size[2],
        epochs=size[3],
        deg=args.deg,
    )
    info = machine_info()
    out = args.out or Path(tempfile.mkdtemp(prefix="dxopt-dfl-portfolio-"))
    payload = {"machine": info, "quick": args.quick, "gamma": GAMMA, "runs": rows}
    write_json(out / "portfolio.json", payload)
    table = markdown_table(rows, COLUMNS)
    (out / "portfolio.md").write_text(f"{table}\n\n{machine_line(info)}\n")
    print(table)
    print(f"wrote {out}")
    return payload


if __name__ == "__main__":
    main()
