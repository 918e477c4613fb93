"""The multi-period mean-variance QP posed at each decision time (see ``run.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PortfolioSpec:
    """Constants of the multi-period problem.

    Attributes:
        assets: number of assets N.
        horizon: planning periods H.
        risk_aversion: :math:`\\gamma`.
        cost: quadratic transaction (market-impact) cost :math:`\\kappa`.
        trade_limit: :math:`\\tau`, the most one asset's weight may change in one period.
        linear_cost: proportional cost charged on realized turnover (evaluation only).
    """

    assets: int
    horizon: int
    risk_aversion: float = 5.0
    cost: float = 1e-2
    trade_limit: float = 0.1
    linear_cost: float = 1e-3

    @property
    def n_weights(self) -> int:
        return self.assets * self.horizon


def constraint_matrices(spec: PortfolioSpec) -> tuple[Tensor, Tensor, Tensor]:
    """``A, b`` (full investment in every period) and ``G`` (long-only, trade limits)."""
    N, H, K = spec.assets, spec.horizon, spec.n_weights
    eye = torch.eye(K, dtype=torch.float64)
    A = torch.zeros(H, K, dtype=torch.float64)
    for k in range(H):
        A[k, k * N : (k + 1) * N] = 1.0
    b = torch.ones(H, dtype=torch.float64)
    diff = eye.clone()  # (D w)_k = w_k - w_{k-1}; w_0 enters through h
    for k in range(1, H):
        diff[k * N : (k + 1) * N, (k - 1) * N : k * N] = -torch.eye(N, dtype=torch.float64)
    G = torch.cat([-eye, diff, -diff])  # w >= 0, |w_k - w_{k-1}| <= tau elementwise
    return A, b, G


def objective(spec: PortfolioSpec, cov: Tensor, mu: Tensor, w0: Tensor) -> tuple[Tensor, Tensor]:
    """Batched ``P`` ``(B, K, K)`` and ``q`` ``(B, K)`` for covariances ``cov`` ``(B, N, N)``,
    predicted returns ``mu`` ``(B, H, N)`` and current holdings ``w0`` ``(B, N)``."""
    N, H, K = spec.assets, spec.horizon, spec.n_weights
    B = cov.shape[0]
    P = torch.zeros(B, K, K, dtype=torch.float64)
    eye_n = torch.eye(N, dtype=torch.float64)
    kap = spec.cost
    for k in range(H):
        blk = slice(k * N, (k + 1) * N)
        diag = 2 * kap if k < H - 1 else kap
        P[:, blk, blk] = spec.risk_aversion * cov + diag * eye_n
        if k > 0:
            prev = slice((k - 1) * N, k * N)
            P[:, blk, prev] = -kap * eye_n
            P[:, prev, blk] = -kap * eye_n
    q = -mu.reshape(B, K)
    first = torch.zeros_like(q)
    first[:, :N] = kap * w0
    return P, q - first


def rhs(spec: PortfolioSpec, w0: Tensor) -> Tensor:
    """Batched ``h`` ``(B, 3K)``: the holdings ``w0`` enter the first period's trade rows."""
    N, K = spec.assets, spec.n_weights
    B = w0.shape[0]
    h = torch.zeros(B, 3 * K, dtype=torch.float64)
    h[:, K : 3 * K] = spec.trade_limit
    h[:, K : K + N] += w0
    h[:, 2 * K : 2 * K + N] -= w0
    return h
