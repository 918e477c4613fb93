"""The public loss base: the docstring's example runs as written and trains; its user-written
subclass has the value and subgradient it defines; every shipped loss and layer that calls an
oracle is an ``OracleLoss``."""

from __future__ import annotations

import inspect
import re
import textwrap

import torch

import dxopt.dfl as dfl
from dxopt.dfl import OracleLoss, ShortestPathOracle, normalized_regret


def _docstring_example() -> dict:
    """Run the code block of ``OracleLoss``'s docstring as written; its namespace."""
    doc = inspect.cleandoc(OracleLoss.__doc__ or "")
    block = re.search(r"::\n\n((?:    .*\n|\n)+)", doc)
    assert block is not None, "OracleLoss's docstring has no example block"
    namespace: dict = {}
    exec(compile(textwrap.dedent(block.group(1)), "OracleLoss.__doc__", "exec"), namespace)
    return namespace


EXAMPLE = _docstring_example()
Perceptron = EXAMPLE["Perceptron"]


def test_docstring_example_trains_as_written():
    oracle, data, model = EXAMPLE["oracle"], EXAMPLE["data"], EXAMPLE["model"]
    torch.manual_seed(0)
    untrained = torch.nn.Linear(5, oracle.dim)  # the example's model before training
    before = float(normalized_regret(oracle, untrained(data.features).detach(), data.costs))
    after = float(normalized_regret(oracle, model(data.features).detach(), data.costs))
    assert before > 0.1
    assert after < 0.05 * before  # as the float64 copy of this example did
    assert EXAMPLE["loss_fn"].cost.forwards == 15 * 200  # one solve per sample and epoch


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
