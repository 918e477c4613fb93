"""The public loss base: a user-written subclass (the docstring's example) has the value and
subgradient it defines, and it trains a linear model on shortest paths; every shipped loss and
layer that calls an oracle is an ``OracleLoss``."""

from __future__ import annotations

import torch

import dxopt.dfl as dfl
from dxopt.dfl import OracleLoss, ShortestPathOracle, normalized_regret


class Perceptron(OracleLoss):
    """The docstring's example: s * c_hat^T (x_true - x(c_hat))."""

    def forward(self, c_hat, x_true):  # type: ignore[no-untyped-def]
        self.check_costs(c_hat)
        x_hat = self.solve(c_hat.detach())
        gap = self.sign * (c_hat * (x_true - x_hat)).sum(-1)
        return self.reduce(gap)


def test_user_subclass_value_gradient_and_cost():
    oracle = ShortestPathOracle((3, 3))
    gen = torch.Generator().manual_seed(0)
    c = torch.rand(8, oracle.dim, generator=gen, dtype=torch.float64)
    c_hat = torch.randn(8, oracle.dim, generator=gen, dtype=torch.float64).requires_grad_(True)
    x_true = oracle(c)
    loss_fn = Perceptron(oracle, reduction="sum")
    loss = loss_fn(c_hat, x_true)
    x_hat = oracle(c_hat.detach())
    assert torch.allclose(loss, (c_hat.detach() * (x_true - x_hat)).sum(), atol=1e-12)
    assert (Perceptron(oracle, reduction="none")(c_hat, x_true) >= -1e-12).all()
    loss.backward()
    assert torch.equal(c_hat.grad, x_true - x_hat)
    assert loss_fn.cost.forwards == 8


def test_user_subclass_trains_a_linear_model():
    data = dfl.shortest_path(
        200, 5, grid=(3, 3), deg=2, noise_width=0.0, seed=1, dtype=torch.float64
    )
    oracle = ShortestPathOracle((3, 3))
    x_true = oracle(data.costs)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, oracle.dim).double()
    loss_fn = Perceptron(oracle)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    before = float(normalized_regret(oracle, model(data.features).detach(), data.costs))
    for _ in range(15):
        for i in range(0, 200, 20):
            opt.zero_grad()
            loss_fn(model(data.features[i : i + 20]), x_true[i : i + 20]).backward()
            opt.step()
    after = float(normalized_regret(oracle, model(data.features).detach(), data.costs))
    assert before > 0.1
    assert after < 0.05 * before


def test_shipped_losses_are_oracle_losses():
    for name in (
        "SPOPlus",
        "DBB",
        "PerturbedOptimizer",
        "PerturbedFenchelYoung",
        "NCE",
        "CMAP",
        "PG",
        "IMLE",
        "AIMLE",
        "NID",
        "CaVE",
        "RegularizedFrankWolfe",
        "FrankWolfeFenchelYoung",
    ):
        assert issubclass(getattr(dfl, name), OracleLoss), name
