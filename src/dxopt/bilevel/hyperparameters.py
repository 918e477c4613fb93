r"""A real task: per-feature L2 regularization selection for logistic regression.

On scikit-learn's bundled breast-cancer data (569 samples, 30 standardized features, no
download), split into training and validation parts:

.. math::

    g(x, w) = \frac{1}{N_t}\sum_{i \in \text{train}} \log(1 + e^{-s_i a_i^\top w})
        + \frac{\rho}{2}\sum_j e^{x_j} w_j^2, \qquad
    f(x, w) = \frac{1}{N_v}\sum_{i \in \text{val}} \log(1 + e^{-s_i a_i^\top w}),

with labels :math:`s_i = \pm 1` and base strength :math:`\rho`. The hyperparameters
:math:`x_j` are log-scale penalties (:math:`x = 0` gives :math:`\rho` on every feature); the
lower level is :math:`\rho\min_j e^{x_j}`-strongly convex. This is the regularization
selection task of benchopt's bilevel benchmark (Dagréou et al., arXiv 2201.13409).

The oracles are analytic (:math:`\sigma` the logistic function, :math:`z = s\odot Aw`):
:math:`\nabla_w g = -A^\top(s\odot\sigma(-z))/N_t + \rho e^x\odot w`,
:math:`\nabla_x g = \tfrac{\rho}{2} e^x\odot w^2`,
:math:`\nabla^2_{ww} g\,v = A^\top(\sigma(z)\sigma(-z)\odot Av)/N_t + \rho e^x\odot v`,
:math:`\nabla^2_{xw} g\,v = \rho e^x\odot w\odot v`; ``upper``/``lower`` give the values
for an :class:`AutogradOracle` cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "LogisticRegularization",
    "MinibatchLogisticRegularization",
    "RegularizationTask",
    "breast_cancer_regularization",
]


class LogisticRegularization:
    """Analytic bilevel oracle of the per-feature L2 selection task (``dim_x = dim_y = d``).

    Args:
        features_train, labels_train, features_val, labels_val: the two splits (labels
            in {-1, +1}).
        base_strength: :math:`\\rho > 0`.
    """

    def __init__(
        self,
        *,
        features_train: torch.Tensor,
        labels_train: torch.Tensor,
        features_val: torch.Tensor,
        labels_val: torch.Tensor,
        base_strength: float,
    ) -> None:
        if not base_strength > 0:
            raise ValueError(
                f"base_strength: expected rho > 0 (the lower level's strong convexity), got "
                f"{base_strength!r}."
            )
        for name, A, s in (
            ("labels_train", features_train, labels_train),
            ("labels_val", features_val, labels_val),
        ):
            if A.ndim != 2 or s.shape != (A.shape[0],):
                raise ValueError(
                    f"{name}: expected shape ({A.shape[0]},) to match the feature rows of a 2-D "
                    f"feature matrix, got labels {tuple(s.shape)} for features {tuple(A.shape)}."
                )
        d = features_train.shape[1]
        if features_val.shape[1] != d:
            raise ValueError(
                f"features_val: expected {d} columns like features_train, got "
                f"{features_val.shape[1]}."
            )
        self.A_t, self.s_t = features_train.double(), labels_train.double()
        self.A_v, self.s_v = features_val.double(), labels_val.double()
        self.rho = float(base_strength)
        self.dim_x = self.dim_y = d
        self.dtype = torch.float64
        self._w_star: torch.Tensor | None = None

    def lower(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.softplus(-self.s_t * (self.A_t @ w)).mean()
        return loss + 0.5 * self.rho * torch.sum(torch.exp(x) * w * w)

    def upper(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(-self.s_v * (self.A_v @ w)).mean() + 0.0 * x.sum()

    def grad_f(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.s_v * torch.sigmoid(-self.s_v * (self.A_v @ w))
        return torch.zeros_like(x), -(self.A_v.T @ r) / self.A_v.shape[0]

    def grad_g(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ex = torch.exp(x)
        r = self.s_t * torch.sigmoid(-self.s_t * (self.A_t @ w))
        gw = -(self.A_t.T @ r) / self.A_t.shape[0] + self.rho * ex * w
        return 0.5 * self.rho * ex * w * w, gw

    def _curvature(self, w: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(self.s_t * (self.A_t @ w))
        return p * (1.0 - p) / self.A_t.shape[0]

    def hvp_yy(self, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.A_t.T @ (self._curvature(w) * (self.A_t @ v)) + self.rho * torch.exp(x) * v

    def jvp_xy(self, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.rho * torch.exp(x) * w * v

    def _hessian(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        D = self._curvature(w)
        return (self.A_t.T * D) @ self.A_t + torch.diag(self.rho * torch.exp(x))

    def lower_solution(self, x: torch.Tensor, *, tol: float = 1e-13) -> torch.Tensor:
        """Newton's method from the previous solution (not counted; g is self-concordant-like
        and strongly convex, full steps with a backtracking safeguard)."""
        w = torch.zeros(self.dim_y, dtype=self.dtype) if self._w_star is None else self._w_star
        for _ in range(100):
            g = self.grad_g(x, w)[1]
            if float(torch.linalg.vector_norm(g)) <= tol:
                break
            step = torch.linalg.solve(self._hessian(x, w), g)
            t, g0 = 1.0, float(self.lower(x, w))
            while float(self.lower(x, w - t * step)) > g0 - 0.25 * t * float(g @ step):
                t *= 0.5
                if t < 1e-10:
                    break
            w = w - t * step
        self._w_star = w
        return w

    def upper_value(self, x: torch.Tensor, w: torch.Tensor) -> float:
        return float(self.upper(x, w))

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        w = self.lower_solution(x)
        _, fw = self.grad_f(x, w)
        return -self.rho * torch.exp(x) * w * torch.linalg.solve(self._hessian(x, w), fw)


class MinibatchLogisticRegularization:
    """Stochastic oracles of the same task: every call uses a fresh random minibatch of the
    training rows (``grad_g``, HVP, JVP) or validation rows (``grad_f``), drawn uniformly
    without replacement, so each oracle is an unbiased estimate of the full-batch one.
    Evaluation (``exact_hypergradient``, ``upper_value``) stays full-batch.

    Args:
        full: the full-batch oracle.
        batch_size: rows per call.
        generator: seeded torch generator.
    """

    def __init__(
        self, full: LogisticRegularization, *, batch_size: int, generator: torch.Generator
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}.")
        self.full, self.batch_size, self.gen = full, batch_size, generator
        self.dim_x, self.dim_y, self.dtype = full.dim_x, full.dim_y, full.dtype

    def _sample(self) -> LogisticRegularization:
        f = self.full
        it = torch.randperm(f.A_t.shape[0], generator=self.gen)[: self.batch_size]
        iv = torch.randperm(f.A_v.shape[0], generator=self.gen)[: self.batch_size]
        return LogisticRegularization(
            features_train=f.A_t[it],
            labels_train=f.s_t[it],
            features_val=f.A_v[iv],
            labels_val=f.s_v[iv],
            base_strength=f.rho,
        )

    def grad_f(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._sample().grad_f(x, w)

    def grad_g(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._sample().grad_g(x, w)

    def hvp_yy(self, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._sample().hvp_yy(x, w, v)

    def jvp_xy(self, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.full.jvp_xy(x, w, v)  # the penalty term does not depend on the data

    def upper_value(self, x: torch.Tensor, w: torch.Tensor) -> float:
        return self.full.upper_value(x, w)

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        return self.full.exact_hypergradient(x)


@dataclass(frozen=True)
class RegularizationTask:
    """The oracle plus what is needed to pick step sizes and to score the result.

    Attributes:
        oracle: the analytic :class:`LogisticRegularization` oracle.
        smoothness: an upper bound on :math:`L_g` at :math:`x = 0`.
        strong_convexity: :math:`\\mu` at :math:`x = 0` (:math:`\\rho`).
    """

    oracle: LogisticRegularization
    smoothness: float
    strong_convexity: float

    def validation_loss(self, x: torch.Tensor) -> float:
        """:math:`H(x) = f(x, w^*(x))` (not counted)."""
        return self.oracle.upper_value(x, self.oracle.lower_solution(x))

    def validation_accuracy(self, w: torch.Tensor) -> float:
        return float(((self.oracle.A_v @ w) * self.oracle.s_v > 0).double().mean())


def breast_cancer_regularization(
    *, base_strength: float = 1e-2, validation_fraction: float = 0.5, seed: int = 0
) -> RegularizationTask:
    """Build the task (features standardized with the training split's statistics).

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
    oracle = LogisticRegularization(
        features_train=A[train],
        labels_train=s[train],
        features_val=A[val],
        labels_val=s[val],
        base_strength=base_strength,
    )
    gram_top = float(torch.linalg.eigvalsh(A[train].T @ A[train] / len(train))[-1])
    return RegularizationTask(
        oracle=oracle, smoothness=0.25 * gram_top + base_strength, strong_convexity=base_strength
    )
