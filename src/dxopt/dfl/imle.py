"""Implicit maximum-likelihood estimation: I-MLE (Niepert, Minervini & Franceschi, "Implicit
MLE: backpropagating through discrete exponential family distributions", NeurIPS 2021) and
AI-MLE (Minervini, Franceschi & Niepert, "Adaptive perturbation-based gradient estimation for
discrete latent variable models", AAAI 2023).

The papers maximise :math:`\\langle \\theta, z\\rangle` over a discrete set; a cost vector
:math:`c` of a ``sense="min"`` oracle is the score :math:`\\theta = -c` (``"max"``:
:math:`\\theta = c`), i.e. :math:`\\theta = -s c`. Perturb-and-MAP with noise :math:`\\epsilon`
(temperature :math:`\\sigma`) is then :math:`x(c - s\\sigma\\epsilon)`, and the layer returns the
sample mean of ``n_samples`` draws, an estimate of :math:`\\mathbb E[x(\\hat c - s\\sigma
\\epsilon)]`. For an incoming gradient :math:`g` the backward replaces the downstream loss by the
target distribution of the scores :math:`\\theta' = \\theta - \\lambda g` (cost
:math:`c + s\\lambda g`) with the same noise draws :math:`p_j = \\hat c - s\\sigma\\epsilon_j`:

.. math::
    \\nabla_{\\hat c} \\approx \\frac{s}{\\lambda}\\,\\frac1n\\sum_j \\big(x(p_j + s\\lambda g)
    - x(p_j)\\big) \\quad\\text{(one-sided)}, \\qquad
    \\frac{1}{2\\lambda}\\,\\frac1n\\sum_j \\big(x(p_j + \\lambda g) - x(p_j - \\lambda g)\\big)
    \\quad\\text{(central)},

in the maximisation convention :math:`(\\mathrm{MAP}(\\theta + \\epsilon) - \\mathrm{MAP}(\\theta'
+ \\epsilon))/\\lambda`, the paper's estimator divided by :math:`\\lambda`. With Gumbel noise on
the simplex the layer's expectation is :math:`\\mathrm{softmax}(-s\\hat c / \\sigma)` and the
estimator's expectation the finite difference of that softmax along :math:`g`.

Noise: the sum-of-Gamma distribution of Niepert et al. (their Eq. for :math:`k`-subsets, with
:math:`\\kappa = k`):
:math:`\\epsilon = \\frac{1}{\\kappa}\\big(\\sum_{i=1}^{m} G_i - \\log m\\big)`,
:math:`G_i \\sim \\mathrm{Gamma}(\\text{shape } 1/\\kappa, \\text{scale } \\kappa / i)`, whose sum
over :math:`\\kappa` independent copies tends to a standard Gumbel as :math:`m \\to \\infty`
(:func:`sum_of_gamma`); also ``"gumbel"`` and ``"normal"``.

AI-MLE sets the step per sample as :math:`\\lambda = \\alpha\\,\\|\\hat c\\| / \\|g\\|` and adapts
:math:`\\alpha` after every backward: with :math:`\\rho` the fraction of non-zero gradient
entries and its moving average :math:`\\bar\\rho \\leftarrow \\mu\\bar\\rho + (1-\\mu)\\rho`,
:math:`\\alpha \\leftarrow \\alpha + \\eta` while :math:`\\bar\\rho` is below the target density,
else :math:`\\alpha \\leftarrow \\max(\\eta, \\alpha - \\eta)` (defaults :math:`\\alpha_0 = 1`,
:math:`\\eta = 10^{-3}`, :math:`\\mu = 0.9`, target 1, as PyEPO's ``adaptiveImplicitMLE``; PyEPO
uses the norms of the whole batch, here each sample's). A sample with :math:`g = 0` gets a zero
gradient.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from dxopt._core import check_choice, check_int, check_positive, check_range
from dxopt._core.torch_compat import standard_gamma
from dxopt.dfl.base import OracleLoss

__all__ = ["AIMLE", "IMLE", "sum_of_gamma"]


def sum_of_gamma(
    shape: tuple[int, ...],
    *,
    kappa: float = 5.0,
    n_iterations: int = 10,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Draws of the sum-of-Gamma noise (Niepert et al. 2021),
    :math:`\\frac1\\kappa(\\sum_{i=1}^{m} G_i - \\log m)`,
    :math:`G_i \\sim \\mathrm{Gamma}(1/\\kappa, \\text{scale } \\kappa/i)`, :math:`m` =
    ``n_iterations``: mean :math:`(H_m - \\log m)/\\kappa`, variance
    :math:`\\sum_{i \\le m} i^{-2} / \\kappa` (:math:`H_m` the harmonic number), and the sum of
    :math:`\\kappa` independent draws tends to a standard Gumbel as :math:`m \\to \\infty`."""
    kappa = check_positive("kappa", kappa)
    m = check_int("n_iterations", n_iterations)
    alpha = torch.full((m, *shape), 1.0 / kappa, dtype=torch.float64)
    gammas = standard_gamma(alpha, generator=generator)
    scale = (kappa / torch.arange(1, m + 1, dtype=torch.float64)).reshape(m, *([1] * len(shape)))
    return (((gammas * scale).sum(0) - math.log(m)) / kappa).to(dtype)


class _PerturbAndMAP(torch.autograd.Function):
    @staticmethod
    def forward(c_hat: Tensor, perturbed: Tensor, x: Tensor, layer: Any) -> Tensor:
        return x.mean(-2).reshape(c_hat.shape)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        c_hat, perturbed, x, layer = inputs
        ctx.save_for_backward(c_hat, perturbed, x)
        ctx.layer = layer

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        c_hat, perturbed, x = ctx.saved_tensors
        layer = ctx.layer
        B, n, d = x.shape
        g = grad.reshape(B, 1, d)
        lambd = layer._step(c_hat.detach().reshape(B, d), g.reshape(B, d)).reshape(B, 1, 1)
        live = (lambd > 0).to(x.dtype)
        safe = torch.where(lambd > 0, lambd, torch.ones_like(lambd))
        s = layer.sign
        if layer.two_sides:
            shifted = torch.cat([perturbed + safe * g, perturbed - safe * g], dim=1)
            xs = layer.solve(shifted.reshape(-1, d)).reshape(B, 2 * n, d)
            est = (xs[:, :n] - xs[:, n:]).mean(1, keepdim=True) / (2 * safe)
        else:
            xs = layer.solve((perturbed + s * safe * g).reshape(-1, d)).reshape(B, n, d)
            est = s * (xs - x).mean(1, keepdim=True) / safe
        out = (est * live).reshape(c_hat.shape)
        layer._adapt(out)
        return out, None, None, None


class IMLE(OracleLoss):
    """The I-MLE layer (Niepert et al. 2021), see :mod:`dxopt.dfl.imle`: returns the mean of
    ``n_samples`` perturb-and-MAP solutions :math:`x(\\hat c - s\\sigma\\epsilon_j)` (one batched
    oracle call), and backpropagates by the target-distribution difference of solutions (one
    more call, two with ``two_sides=True``).

    Args:
        oracle: the solution oracle.
        n_samples: noise draws per sample (default 10).
        sigma: the noise temperature :math:`\\sigma > 0` (default 1).
        lambd: the step :math:`\\lambda > 0` of the target distribution (default 10).
        noise: ``"sum_of_gamma"`` (default, with ``kappa`` = 5 and ``n_iterations`` = 10, as
            PyEPO), ``"gumbel"`` or ``"normal"``.
        two_sides: the central difference instead of the one-sided one.
        seed: the seed of the noise generator (and of the pool's draws).
        **kwargs: ``pool``, ``solve_ratio`` of :class:`~dxopt.dfl.OracleLoss`.

    Call: ``x = imle(c_hat)`` ``(B, d)``, then any loss of ``x`` (``reduction`` unused). PyEPO's
    ``implicitMLE`` perturbs :math:`\\hat c + \\sigma\\epsilon` for both senses; feeding it
    :math:`-s\\epsilon` reproduces this layer.
    """

    def __init__(
        self,
        oracle: Any,
        *,
        n_samples: int = 10,
        sigma: float = 1.0,
        lambd: float = 10.0,
        noise: str = "sum_of_gamma",
        kappa: float = 5.0,
        n_iterations: int = 10,
        two_sides: bool = False,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(oracle, seed=seed, **kwargs)
        self.n_samples = check_int("n_samples", n_samples)
        self.sigma = check_positive("sigma", sigma, hint="the noise temperature must be > 0")
        self.lambd = check_positive("lambd", lambd)
        self.noise = check_choice("noise", noise, ("sum_of_gamma", "gumbel", "normal"))
        self.kappa = check_positive("kappa", kappa)
        self.n_iterations = check_int("n_iterations", n_iterations)
        self.two_sides = bool(two_sides)
        self.generator = torch.Generator().manual_seed(int(seed))

    def sample_noise(self, shape: tuple[int, ...]) -> Tensor:
        """``shape`` float64 draws of the chosen noise from this layer's generator."""
        if self.noise == "sum_of_gamma":
            return sum_of_gamma(
                shape, kappa=self.kappa, n_iterations=self.n_iterations, generator=self.generator
            )
        if self.noise == "gumbel":
            u = torch.rand(shape, generator=self.generator, dtype=torch.float64)
            return -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))
        return torch.randn(shape, generator=self.generator, dtype=torch.float64)

    def _step(self, c_hat: Tensor, g: Tensor) -> Tensor:
        return torch.full(c_hat.shape[:1], self.lambd, dtype=c_hat.dtype, device=c_hat.device)

    def _adapt(self, grad: Tensor) -> None:
        return None

    def forward(self, c_hat: Tensor) -> Tensor:
        self.check_costs(c_hat)
        flat = c_hat.detach().reshape(-1, c_hat.shape[-1])
        B, d = flat.shape
        eps = self.sample_noise((B, self.n_samples, d)).to(c_hat.device, c_hat.dtype)
        perturbed = flat.unsqueeze(1) - self.sign * self.sigma * eps
        x = self.solve(perturbed.reshape(-1, d)).reshape(B, self.n_samples, d)
        out: Tensor = _PerturbAndMAP.apply(c_hat, perturbed, x, self)
        return out


class AIMLE(IMLE):
    """Adaptive I-MLE (Minervini et al. 2023), see :mod:`dxopt.dfl.imle`: :class:`IMLE` with
    the per-sample step :math:`\\lambda = \\alpha\\,\\|\\hat c\\| / \\|g\\|`, :math:`\\alpha`
    adapted towards ``target_density`` non-zero gradient entries after every backward.

    Args:
        alpha: the initial :math:`\\alpha > 0` (default 1).
        alpha_step: :math:`\\eta`, the change of :math:`\\alpha` per backward (default 1e-3).
        momentum: :math:`\\mu` of the density's moving average (default 0.9).
        target_density: the target fraction of non-zero gradient entries, in (0, 1].
        **kwargs: those of :class:`IMLE` except ``lambd``.
    """

    def __init__(
        self,
        oracle: Any,
        *,
        alpha: float = 1.0,
        alpha_step: float = 1e-3,
        momentum: float = 0.9,
        target_density: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if "lambd" in kwargs:
            raise TypeError("lambd: AIMLE sets the step itself; use IMLE for a fixed lambd.")
        super().__init__(oracle, **kwargs)
        self.alpha = check_positive("alpha", alpha)
        self.alpha_step = check_positive("alpha_step", alpha_step)
        self.momentum = check_range("momentum", momentum, 0.0, 1.0, closed=(True, False))
        self.target_density = check_range(
            "target_density", target_density, 0.0, 1.0, closed=(False, True)
        )
        self.density = 1.0

    def _step(self, c_hat: Tensor, g: Tensor) -> Tensor:
        g_norm = g.norm(dim=-1)
        ratio = c_hat.norm(dim=-1) / torch.where(g_norm > 0, g_norm, torch.ones_like(g_norm))
        return torch.where(g_norm > 0, self.alpha * ratio, torch.zeros_like(g_norm))

    def _adapt(self, grad: Tensor) -> None:
        rho = float((grad != 0).to(torch.float64).mean())
        self.density = self.momentum * self.density + (1.0 - self.momentum) * rho
        if self.density < self.target_density:
            self.alpha += self.alpha_step
        else:
            self.alpha = max(self.alpha_step, self.alpha - self.alpha_step)
