"""The public base of the losses and layers of :mod:`dxopt.dfl`: subclass :class:`OracleLoss`
to write your own decision-focused loss, as PyEPO users subclass ``optModule``."""

from __future__ import annotations

import warnings
from typing import Any

from torch import Tensor, nn

from dxopt._core import DxoptWarning, check_choice, check_int
from dxopt.dfl._checks import check_cost_vectors
from dxopt.dfl._cost import Metered
from dxopt.dfl.pool import PoolSolver, SolutionPool

__all__ = ["OracleLoss", "reduce_loss"]


def reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    """``loss.mean()`` (``"mean"``), ``loss.sum()`` (``"sum"``) or ``loss`` (``"none"``)."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


class OracleLoss(Metered, nn.Module):
    """Base class of every loss and layer of :mod:`dxopt.dfl` that calls an oracle; subclass it
    to write your own (the counterpart of PyEPO's ``optModule``).

    It holds the oracle (any :class:`~dxopt.dfl.Oracle`: callable on ``(B, d)`` costs, with
    ``.sense``, ``.dim`` and ``.cost``), the sign :math:`s` (:attr:`sign`: ``+1`` for
    ``sense="min"``, ``-1`` for ``"max"``, so that :math:`s\\,c^\\top x` is always the cost to
    minimise), the reduction, an optional :class:`~dxopt.dfl.SolutionPool` with ``solve_ratio``
    (Mulamba et al. 2021) and the record of oracle calls (:attr:`cost`).

    What to implement: :meth:`forward` only. Inside it,

    - :meth:`solve` ``(c)`` returns :math:`x(c)` for a ``(d,)`` or ``(B, d)`` tensor, in one
      batched oracle call (or from the pool, with probability ``1 - solve_ratio``); pass it
      detached costs, it returns solutions without gradient;
    - :meth:`reduce` applies the ``reduction`` chosen at construction;
    - :meth:`check_costs` checks a prediction's shape against the oracle (a ``ValueError``
      naming the argument).

    The gradient is whatever autograd makes of the expression you return: hold the oracle's
    answers fixed (they are piecewise constant in the costs) and write the loss so that its
    autograd is the (sub)gradient you mean, or write a module-level
    :class:`torch.autograd.Function` for a custom backward, as :class:`~dxopt.dfl.DBB` does.

    Example, the structured perceptron / Fenchel-Young loss without noise,
    :math:`\\ell = s\\,\\hat c^\\top(x^* - x(\\hat c)) \\ge 0`, with subgradient
    :math:`s\\,(x^* - x(\\hat c))`::

        import torch
        from dxopt.dfl import OracleLoss, ShortestPathOracle, shortest_path

        class Perceptron(OracleLoss):
            def forward(self, c_hat, x_true):
                self.check_costs(c_hat)
                x_hat = self.solve(c_hat.detach())
                gap = self.sign * (c_hat * (x_true - x_hat)).sum(-1)
                return self.reduce(gap)

        oracle = ShortestPathOracle((3, 3))
        data = shortest_path(200, 5, grid=(3, 3), deg=2, noise_width=0.0, seed=1)
        x_true = oracle(data.costs)
        torch.manual_seed(0)
        model = torch.nn.Linear(5, oracle.dim)
        loss_fn = Perceptron(oracle)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        for epoch in range(15):
            for i in range(0, 200, 20):
                opt.zero_grad()
                loss_fn(model(data.features[i : i + 20]), x_true[i : i + 20]).backward()
                opt.step()

    (``tests/dfl/test_base.py`` runs this example as written.)

    Args:
        oracle: the solution oracle.
        pool: optional :class:`~dxopt.dfl.SolutionPool` (required when ``solve_ratio < 1``).
        solve_ratio: the probability that a batch is solved by the oracle rather than the pool.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per-sample values).
        seed: the seed of the pool's Bernoulli draws (and of subclasses' noise).
        processes: PyEPO's keyword (a pool of worker processes for the solves), accepted and
            without effect: a batch goes to the oracle in one call (compiled kernels, one HiGHS
            model), so there is nothing to spread over processes; values other than 1 warn so.
    """

    def __init__(
        self,
        oracle: Any,
        *,
        pool: SolutionPool | None = None,
        solve_ratio: float = 1.0,
        reduction: str = "mean",
        seed: int = 0,
        processes: int | None = None,
    ) -> None:
        super().__init__()
        if processes is not None and check_int("processes", processes, minimum=0) != 1:
            warnings.warn(
                f"processes={processes} is accepted for PyEPO compatibility and ignored: dxopt "
                "solves a batch in one oracle call (no worker pool); drop the argument.",
                DxoptWarning,
                stacklevel=3,
            )
        if not callable(oracle) or not all(hasattr(oracle, a) for a in ("sense", "dim", "cost")):
            raise TypeError(
                f"oracle: expected a dxopt.dfl oracle (callable with .sense, .dim, .cost), "
                f"got {type(oracle).__name__}; wrap a function with CallableOracle."
            )
        self.oracle = oracle
        self.sign = 1.0 if oracle.sense == "min" else -1.0
        self.reduction = check_choice("reduction", reduction, ("mean", "sum", "none"))
        self.solver = PoolSolver(oracle, pool, solve_ratio=solve_ratio, seed=seed)
        self._meter = self.solver._meter  # cost: the oracle solves made by this loss

    @property
    def pool(self) -> SolutionPool | None:
        return self.solver.pool

    def solve(self, c: Tensor) -> Tensor:
        """:math:`x(c)` for ``(d,)`` or ``(B, d)`` costs (detached), one batched oracle call or
        the pool's best answers; same shape, dtype and device, no gradient."""
        return self.solver(c.detach())

    def reduce(self, loss: Tensor) -> Tensor:
        """The chosen ``reduction`` of per-sample values ``loss``."""
        return reduce_loss(loss, self.reduction)

    def check_costs(self, c: Any, name: str = "c_hat") -> Tensor:
        """Require floating ``(d,)`` / ``(B, d)`` finite costs of the oracle's dimension."""
        check = getattr(self.oracle, "check_costs", None)
        if check is not None:
            out: Tensor = check(c, name)
            return out
        return check_cost_vectors(name, c, int(self.oracle.dim))
