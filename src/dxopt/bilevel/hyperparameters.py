r"""A real task: per-feature L2 regularization selection for logistic regression.

On scikit-learn's bundled breast-cancer data (569 samples, 30 standardized features, no
download), split into training and validation halves:

.. math::

    g(x, w) = \frac{1}{N_t}\sum_{i \in \text{train}} \log(1 + e^{-s_i a_i^\top w})
        + \frac{\rho}{2}\sum_j e^{x_j} w_j^2, \qquad
    f(x, w) = \frac{1}{N_v}\sum_{i \in \text{val}} \log(1 + e^{-s_i a_i^\top w}),

with labels :math:`s_i = \pm 1` and base strength :math:`\rho`. The hyperparameters
:math:`x_j` are log-scale penalties (:math:`x = 0` gives :math:`\rho` on every feature); the
lower level is :math:`\rho\min_j e^{x_j}`-strongly convex. This is the regularization
selection task of benchopt's bilevel benchmark (Dagréou et al., arXiv 2201.13409).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dxopt.bilevel.autograd_oracle import AutogradOracle

__all__ = ["RegularizationTask", "breast_cancer_regularization"]


@dataclass(frozen=True)
class RegularizationTask:
    """The oracle plus what is needed to pick step sizes and to score the result.

    Attributes:
        oracle: an :class:`AutogradOracle` with ``dim_x = dim_y`` = number of features.
        smoothness: an upper bound on :math:`L_g` at :math:`x = 0`.
        strong_convexity: :math:`\\mu` at :math:`x = 0` (:math:`\\rho`).
        features_val, labels_val: the validation split (labels in {-1, +1}).
    """

    oracle: AutogradOracle
    smoothness: float
    strong_convexity: float
    features_val: torch.Tensor
    labels_val: torch.Tensor

    def validation_accuracy(self, w: torch.Tensor) -> float:
        return float(((self.features_val @ w) * self.labels_val > 0).double().mean())


def breast_cancer_regularization(
    *, base_strength: float = 1e-2, validation_fraction: float = 0.5, seed: int = 0
) -> RegularizationTask:
    """Build the task (features standardized on the training split).

    Raises:
        ValueError: for a non-positive ``base_strength`` or a fraction outside (0, 1).
    """
    if not base_strength > 0:
        raise ValueError(f"base_strength: expected rho > 0, got {base_strength!r}.")
    if not 0 < validation_fraction < 1:
        raise ValueError(
            f"validation_fraction: expected a value in (0, 1), got {validation_fraction!r}."
        )
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    A = torch.as_tensor(data.data, dtype=torch.float64)
    s = torch.as_tensor(data.target, dtype=torch.float64) * 2.0 - 1.0
    perm = torch.randperm(A.shape[0], generator=torch.Generator().manual_seed(seed))
    n_val = round(validation_fraction * A.shape[0])
    val, train = perm[:n_val], perm[n_val:]
    mean, std = A[train].mean(0), A[train].std(0).clamp_min(1e-12)
    A = (A - mean) / std
    A_t, s_t, A_v, s_v = A[train], s[train], A[val], s[val]
    rho = float(base_strength)

    def lower(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.softplus(-s_t * (A_t @ w)).mean()
        return loss + 0.5 * rho * torch.sum(torch.exp(x) * w * w)

    def upper(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(-s_v * (A_v @ w)).mean()

    d = A.shape[1]
    oracle = AutogradOracle(upper, lower, dim_x=d, dim_y=d)
    gram_top = float(torch.linalg.eigvalsh(A_t.T @ A_t / A_t.shape[0])[-1])
    return RegularizationTask(
        oracle=oracle,
        smoothness=0.25 * gram_top + rho,
        strong_convexity=rho,
        features_val=A_v,
        labels_val=s_v,
    )
