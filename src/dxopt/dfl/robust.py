"""kNN-robust training targets (Schutte, Postek & Yorke-Smith, "Robust losses for
decision-focused learning", IJCAI 2024, arXiv 2310.04328).

A realised cost :math:`c_i` is one noisy draw of :math:`\\mathbb E[c \\mid z_i]`; the paper
replaces it, before any loss, by an estimate from the :math:`k` nearest neighbours
:math:`N_k(i)` of the features :math:`z_i` (Euclidean, the sample itself excluded), mixed with
the sample's own cost by the weight :math:`w \\in [0, 1]`:

.. math::
    c_i^{(j)} = w\\,c_i + (1 - w)\\,c_{n_j}, \\ n_j \\in N_k(i), \\qquad
    \\tilde c_i = \\frac1k \\sum_j c_i^{(j)} = w\\,c_i + \\frac{1-w}{k}\\sum_{n \\in N_k(i)} c_n,

and, with an oracle, the robust solution and objective targets
:math:`\\tilde x_i = \\frac1k\\sum_j x(c_i^{(j)})`,
:math:`\\tilde z_i = \\frac1k\\sum_j c_i^{(j)\\top} x(c_i^{(j)})` (PyEPO's ``optDatasetKNN``,
defaults :math:`k = 10`, :math:`w = 0.5`). Ties in distance are broken by the smaller index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dxopt._core import check_int, check_range, check_tensor

__all__ = ["KNNTargets", "knn_targets"]


@dataclass(frozen=True)
class KNNTargets:
    """The kNN-robust targets: ``costs`` :math:`\\tilde c` ``(N, d)``, ``neighbours`` ``(N, k)``
    (indices, nearest first), and with an oracle ``solutions`` :math:`\\tilde x` ``(N, d)`` and
    ``objectives`` :math:`\\tilde z` ``(N,)`` (else ``None``)."""

    costs: Tensor
    neighbours: Tensor
    solutions: Tensor | None
    objectives: Tensor | None


def knn_targets(
    features: Tensor, costs: Tensor, *, k: int = 10, weight: float = 0.5, oracle: Any = None
) -> KNNTargets:
    """The kNN-robust targets of Schutte et al. (see :mod:`dxopt.dfl.robust`).

    Args:
        features: ``(N, p)`` features :math:`z`.
        costs: ``(N, d)`` realised costs :math:`c`.
        k: neighbours per sample, ``1 <= k < N``.
        weight: the sample's own weight :math:`w` in ``[0, 1]`` (1: no smoothing).
        oracle: optional :class:`~dxopt.dfl.Oracle`; the ``N k`` mixed costs are one call.

    Returns:
        :class:`KNNTargets`; train e.g. ``SPOPlus`` on ``(c_hat, t.costs, t.solutions,
        t.objectives)``.
    """
    check_tensor("features", features, ndim=2, finite=True)
    check_tensor("costs", costs, ndim=2, floating=True, finite=True)
    n = features.shape[0]
    if costs.shape[0] != n:
        raise ValueError(
            f"costs: expected {n} rows (one per row of features), got {costs.shape[0]}."
        )
    k = check_int("k", k, hint=f"k must be below the number of samples {n}")
    if k >= n:
        raise ValueError(f"k: expected 1 <= k < {n} (the sample itself is excluded), got {k}.")
    weight = check_range("weight", weight, 0.0, 1.0, closed=(True, True))
    z = features.detach().to(torch.float64)
    dist = torch.cdist(z, z, compute_mode="donot_use_mm_for_euclid_dist")
    dist.fill_diagonal_(float("inf"))
    # stable sort: equal distances keep index order (ties broken by the smaller index)
    neighbours = torch.sort(dist, dim=1, stable=True).indices[:, :k]
    c = costs.detach()
    mixed = weight * c.unsqueeze(1) + (1.0 - weight) * c[neighbours]  # (N, k, d)
    solutions = objectives = None
    if oracle is not None:
        x = oracle(mixed.reshape(-1, c.shape[1])).reshape(mixed.shape)
        solutions = x.mean(1)
        objectives = (mixed * x).sum(-1).mean(1)
    return KNNTargets(
        costs=mixed.mean(1), neighbours=neighbours, solutions=solutions, objectives=objectives
    )
