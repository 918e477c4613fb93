"""Statistical checks of the stochastic estimators on a quadratic (seeded Monte Carlo).

On L(θ) = ½θᵀAθ + bᵀθ the central difference is exact, so SPSA along z equals the forward
gradient along z: both are (gᵀz)z. For Gaussian z, E[(gᵀz)z] = g and, averaging k
independent tangents, E‖ĝ‖² = (d + 1 + k)/k ‖g‖² since E[(gᵀz)²‖z‖²] = (d + 2)‖g‖².
"""

import math

import pytest
import torch

from dxopt.estimators import LOZO, SPSA, ZOSVRG, FmADSVRG, ForwardGradient

from ._problems import flat, quadratic

Z = 4.5  # two-sided bound per coordinate: a false alarm is < 1e-4 per test at this seed


def _samples(estimator, loss_fn, params, batch, n):
    return torch.stack([flat(estimator.estimate(loss_fn, params, batch).grads) for _ in range(n)])


def _assert_mean(samples, expected):
    mean = samples.mean(0)
    stderr = samples.std(0) / math.sqrt(samples.shape[0])
    assert torch.all((mean - expected).abs() <= Z * stderr + 1e-12), (mean, expected, stderr)


@pytest.mark.parametrize(
    "estimator",
    [
        ForwardGradient(k=1, distribution="gaussian", seed=3),
        ForwardGradient(k=2, distribution="rademacher", seed=4),
        SPSA(eps=1e-2, n_directions=1, seed=5),
        SPSA(eps=1e-2, n_directions=2, distribution="rademacher", seed=6),
    ],
    ids=["fg-gauss", "fg-rademacher-k2", "spsa-gauss", "spsa-rademacher-n2"],
)
def test_unbiased_on_quadratic(estimator):
    loss_fn, params, batch, exact = quadratic()
    samples = _samples(estimator, loss_fn, params, batch, 800)
    _assert_mean(samples, flat(exact))


def test_spsa_equals_forward_gradient_on_quadratic_with_shared_seeds():
    loss_fn, params, batch, _ = quadratic()
    zo = SPSA(eps=0.5, seed=9).estimate(loss_fn, params, batch)
    fg = ForwardGradient(seed=9).estimate(loss_fn, params, batch)
    torch.testing.assert_close(flat(zo.grads), flat(fg.grads))


@pytest.mark.parametrize("k", [1, 4])
def test_gaussian_forward_gradient_second_moment(k):
    loss_fn, params, batch, exact = quadratic()
    d = sum(p.numel() for p in params.values())
    g2 = float(flat(exact).square().sum())
    n = 2000 if k == 1 else 800
    samples = _samples(ForwardGradient(k=k, seed=10 + k), loss_fn, params, batch, n)
    sq = samples.square().sum(1)
    expected = (d + 1 + k) / k * g2
    stderr = float(sq.std()) / math.sqrt(sq.numel())
    assert abs(float(sq.mean()) - expected) <= Z * stderr, (float(sq.mean()), expected, stderr)
    # variance E‖ĝ - g‖² = (d + 1)/k ‖g‖², the "(d + 2)/k" rule of thumb up to one ‖g‖²/k.
    err = (samples - flat(exact)).square().sum(1)
    stderr = float(err.std()) / math.sqrt(err.numel())
    assert abs(float(err.mean()) - (d + 1) / k * g2) <= Z * stderr


def test_projection_is_shrunk_by_k_over_d():
    loss_fn, params, batch, exact = quadratic()
    d, k = 5, 2
    est = ForwardGradient(k=k, combine="projection", seed=11)
    samples = _samples(est, loss_fn, params, batch, 800)
    _assert_mean(samples, k / d * flat(exact))
    # with k = d tangents the projection recovers the gradient exactly.
    full = ForwardGradient(k=d, combine="projection", seed=12).estimate(loss_fn, params, batch)
    torch.testing.assert_close(flat(full.grads), flat(exact))


def test_lozo_unbiased_on_matrix_quadratic():
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    params = {
        "w": torch.zeros(3, 4, dtype=torch.float64),
        "bias": torch.zeros(2, dtype=torch.float64),
    }

    def loss_fn(p, batch):
        return 0.5 * (p["w"] - batch).square().sum() + p["bias"].sum()

    exact = torch.cat([-target.reshape(-1), torch.ones(2, dtype=torch.float64)])
    samples = _samples(LOZO(eps=1e-2, rank=2, lazy_steps=1, seed=1), loss_fn, params, target, 2000)
    _assert_mean(samples, exact)


@pytest.mark.parametrize("cls", [ZOSVRG, FmADSVRG])
def test_svrg_control_variate_is_unbiased(cls):
    loss_fn, params, batch, _ = quadratic()
    est = cls(refresh_every=10**6, anchor_directions=4, eps=1e-2, seed=2)
    first = est.estimate(loss_fn, params, batch)
    assert first.info["refreshed"]
    mu = flat(est.anchor_estimate)
    moved = {n: p + 0.3 for n, p in params.items()}
    a_mat, _b = batch
    theta0 = torch.cat([params["a"], params["b"]])
    theta1 = torch.cat([moved["a"], moved["b"]])
    samples = _samples(est, loss_fn, moved, batch, 600)
    # E[g] = ∇L(θ) - ∇L(θ̄) + μ, and ∇L(θ) - ∇L(θ̄) = A(θ - θ̄) on the quadratic.
    _assert_mean(samples, a_mat @ (theta1 - theta0) + mu)
