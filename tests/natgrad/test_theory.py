"""The sketch-and-project theory of SNG (arXiv:2508.21022) as exact and statistical checks.

Squared volume sampling (SVS) draws a row set :math:`S`, :math:`|S| = k`, with probability
:math:`\\det(K_{SS}) / e_k(K)`, :math:`K = JJ^\\top + \\lambda I` (Cauchy-Binet gives the
normaliser). Jacobi's formula :math:`\\sum_S I_S^\\top \\operatorname{adj}(K_{SS}) I_S =
p_{k-1}(K)` with :math:`p_{k-1}(X) = \\sum_{i<k} (-1)^i e_{k-1-i}(K) X^i`, and
:math:`J^\\top q(JJ^\\top + \\lambda I) = q(J^\\top J + \\lambda I) J^\\top`, give

.. math::

    \\mathbb{E}_S\\big[J_S^\\top (J_SJ_S^\\top + \\lambda I)^{-1} r_S\\big]
    = \\frac{p_{k-1}(J^\\top J + \\lambda I)}{e_k(K)}\\, J^\\top r ,

a preconditioned gradient step although direction and preconditioner share the rows.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dxopt.natgrad import SNG, SPRING, Poisson2D, kernel_direction, tanh_mlp

DT = torch.float64


def elementary_symmetric(values: torch.Tensor, k: int) -> torch.Tensor:
    """e_0..e_k of ``values`` by the standard recursion."""
    e = torch.zeros(k + 1, dtype=values.dtype)
    e[0] = 1.0
    for v in values:
        e[1:] = e[1:] + v * e[:-1].clone()
    return e


def svs_enumeration(jac: torch.Tensor, r: torch.Tensor, k: int, damping: float):
    """Normaliser and SVS expectation of the SNG direction by enumerating all subsets."""
    total, weighted = torch.zeros((), dtype=DT), torch.zeros(jac.shape[1], dtype=DT)
    for subset in itertools.combinations(range(jac.shape[0]), k):
        rows = list(subset)
        js, rs = jac[rows], r[rows]
        w = torch.linalg.det(js @ js.T + damping * torch.eye(k, dtype=DT))
        direction = kernel_direction(js, rs, damping=damping).direction
        total += w
        weighted += w * direction
    return total, weighted / total


def svs_closed_form(jac: torch.Tensor, r: torch.Tensor, k: int, damping: float):
    kappa = torch.linalg.eigvalsh(jac @ jac.T + damping * torch.eye(jac.shape[0], dtype=DT))
    e = elementary_symmetric(kappa, k)
    x = jac.T @ jac + damping * torch.eye(jac.shape[1], dtype=DT)
    poly = torch.zeros_like(x)
    power = torch.eye(jac.shape[1], dtype=DT)
    for i in range(k):
        poly += (-1) ** i * e[k - 1 - i] * power
        power = power @ x
    return e[k], poly @ (jac.T @ r) / e[k], poly / e[k]


@pytest.mark.parametrize(
    ("n_rows", "n_params", "k", "damping"),
    [(7, 5, 3, 0.0), (7, 5, 1, 0.0), (6, 9, 4, 0.0), (7, 5, 3, 0.3), (8, 6, 5, 1e-2)],
)
def test_svs_expectation_equals_preconditioned_step(n_rows, n_params, k, damping):
    gen = torch.Generator().manual_seed(n_rows * 100 + k)
    jac = torch.randn(n_rows, n_params, generator=gen, dtype=DT)
    r = torch.randn(n_rows, generator=gen, dtype=DT)
    total, expectation = svs_enumeration(jac, r, k, damping)
    e_k, closed, precond = svs_closed_form(jac, r, k, damping)
    assert float(abs(total - e_k) / e_k) < 1e-12
    assert float((expectation - closed).abs().max()) < 1e-10
    # The preconditioner is symmetric positive semidefinite.
    evals = torch.linalg.eigvalsh(0.5 * (precond + precond.T))
    assert float(evals.min()) > -1e-12
    if k == 1 and damping == 0.0:  # M_1 = I / ||J||_F^2
        expected = torch.eye(n_params, dtype=DT) / (jac**2).sum()
        assert torch.allclose(precond, expected, atol=1e-14)


def test_svs_expectation_vanishes_off_range_but_uniform_does_not():
    gen = torch.Generator().manual_seed(3)
    jac = torch.randn(7, 3, generator=gen, dtype=DT)
    q, _ = torch.linalg.qr(jac, mode="complete")
    r = q[:, 3:] @ torch.randn(4, generator=gen, dtype=DT)  # r orthogonal to range(J)
    _, expectation = svs_enumeration(jac, r, 2, 0.0)
    assert float(expectation.abs().max()) < 1e-12
    uniform = torch.stack(
        [
            kernel_direction(jac[list(s)], r[list(s)], damping=0.0).direction
            for s in itertools.combinations(range(7), 2)
        ]
    ).mean(0)
    assert float(uniform.abs().max()) > 1e-3


def _svs_subsets(jac: torch.Tensor, k: int):
    subsets = list(itertools.combinations(range(jac.shape[0]), k))
    weights = torch.stack([torch.linalg.det(jac[list(s)] @ jac[list(s)].T) for s in subsets])
    return subsets, weights / weights.sum()


def test_sng_linear_least_squares_converges_at_predicted_rate():
    """SNG (eta = 1, lambda = 0) on a consistent system A x = b with sigma_i = i^(-1).

    Each step is e_{t+1} = (I - P_S) e_t with P_S the projector on the row space of A_S, so
    E[e_{t+1}] = (I - E P_S) E[e_t] exactly and E||e_{t+1}||^2 <= rho ||e_t||^2 with
    rho = 1 - lambda_min(E P_S), E P_S = M_k A^T A (the sketch-and-project rate,
    arXiv:2508.21022). We check the mean error vector against (I - E P_S)^T e_0 and the
    mean squared error against rho^T with 4-sigma Monte Carlo bounds.
    """
    n, k, steps, runs = 8, 3, 20, 4000
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=DT))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=DT))
    sigma = torch.arange(1, n + 1, dtype=DT) ** -1.0
    a = u @ torch.diag(sigma) @ v.T
    _, _, precond = svs_closed_form(a, torch.zeros(n, dtype=DT), k, 0.0)
    expected_projector = precond @ a.T @ a
    sym = 0.5 * (expected_projector + expected_projector.T)
    evals, evecs = torch.linalg.eigh(sym)
    rho = 1.0 - float(evals[0])
    assert 0.0 < rho < 1.0
    subsets, probs = _svs_subsets(a, k)
    # The SNG step is linear in the error: x - d(x) - x* = (I - P_S)(x - x*). Read P_S off
    # kernel_direction applied to the columns of the identity, then iterate all runs at once.
    steps_matrices = torch.stack(
        [
            torch.eye(n, dtype=DT)
            - torch.stack(
                [
                    kernel_direction(a[list(s)], a[list(s)] @ col, damping=0.0).direction
                    for col in torch.eye(n, dtype=DT)
                ],
                dim=1,
            )
            for s in subsets
        ]
    )
    # Start on the slowest eigendirection of E[P_S]: x0 = 0, x* = -e0.
    e0 = evecs[:, 0]
    errors = e0.expand(runs, n).clone()
    for t in range(steps):
        draws = torch.multinomial(probs, runs, replacement=True, generator=gen)
        errors = (steps_matrices[draws] @ errors.unsqueeze(-1)).squeeze(-1)
        if t == 0:  # one step matches the rate: E||e_1||^2 = rho ||e_0||^2 exactly
            first = (errors**2).sum(1)
            assert abs(float(first.mean()) - rho) <= 4 * float(first.std()) / math.sqrt(runs)
    mean_pred = torch.linalg.matrix_power(torch.eye(n, dtype=DT) - expected_projector, steps) @ e0
    se = errors.std(0) / math.sqrt(runs)
    assert bool(((errors.mean(0) - mean_pred).abs() <= 4 * se + 1e-15).all())
    sq = (errors**2).sum(1) / float(e0 @ e0)
    measured = float(sq.mean())
    assert measured <= rho**steps + 4 * float(sq.std()) / math.sqrt(runs)
    # Jensen: ||E e_T||^2 = rho^(2T) <= E||e_T||^2, so the per-step rate lies in [rho^2, rho].
    per_step = measured ** (1 / steps)
    assert rho**2 <= per_step <= rho + 1e-2


def test_spring_with_zero_momentum_is_exactly_sng():
    problem = Poisson2D()
    model_a, model_b = tanh_mlp(2, (8,), seed=1), tanh_mlp(2, (8,), seed=1)
    kw = {"lr": 0.3, "damping": 1e-6, "norm_cap": 1e-2}
    sng = SNG(model_a, problem.residual(model_a), **kw)
    spring = SPRING(model_b, problem.residual(model_b), momentum=0.0, **kw)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        batch = problem.sample(12, 4, gen)
        rep_a, rep_b = sng.step(batch), spring.step(batch)
        assert rep_a == rep_b
    for pa, pb in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(pa, pb)
