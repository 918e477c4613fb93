import pytest
import torch

from dxopt.linalg import conjugate_gradient, spd_solve


def _spd(n: int, seed: int, cond: float = 1e3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    evals = torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n, dtype=torch.float64)
    return Q @ torch.diag(evals) @ Q.T


def test_spd_solve_plain_cholesky_matches_linalg_solve():
    K = _spd(20, 0)
    b = torch.randn(20, dtype=torch.float64)
    x, info = spd_solve(K, b)
    assert info.method == "cholesky" and not info.used_fallback
    torch.testing.assert_close(x, torch.linalg.solve(K, b), rtol=1e-10, atol=1e-12)
    assert info.residual < 1e-12


def test_spd_solve_batched_matrix_rhs():
    K = torch.stack([_spd(8, s) for s in range(3)])
    B = torch.randn(3, 8, 2, dtype=torch.float64)
    X, _ = spd_solve(K, B)
    torch.testing.assert_close(K @ X, B, rtol=1e-9, atol=1e-10)


def test_spd_solve_singular_reports_fallback_and_gives_least_squares_solution():
    v = torch.randn(6, 2, dtype=torch.float64)
    K = v @ v.T  # rank 2
    b = K @ torch.randn(6, dtype=torch.float64)  # consistent right-hand side
    x, info = spd_solve(K, b, jitters=())
    assert info.method == "eigh-pinv" and info.used_fallback
    torch.testing.assert_close(K @ x, b, rtol=1e-8, atol=1e-10)


def test_spd_solve_rejects_bad_shapes():
    with pytest.raises(ValueError, match="K: expected a square"):
        spd_solve(torch.zeros(3, 4), torch.zeros(3))
    with pytest.raises(ValueError, match="b: expected 3 rows"):
        spd_solve(torch.eye(3), torch.zeros(4))


def test_conjugate_gradient_converges_and_reports():
    K = _spd(30, 1, cond=100.0)
    b = torch.randn(30, dtype=torch.float64)
    res = conjugate_gradient(lambda v: K @ v, b, rtol=1e-12)
    assert res.converged and res.iterations <= 60
    torch.testing.assert_close(res.x, torch.linalg.solve(K, b), rtol=1e-9, atol=1e-10)


def test_conjugate_gradient_reports_non_convergence():
    K = _spd(50, 2, cond=1e8)
    b = torch.randn(50, dtype=torch.float64)
    res = conjugate_gradient(lambda v: K @ v, b, rtol=1e-14, maxiter=3)
    assert not res.converged and res.iterations == 3
    assert res.residual_norm > 1e-14 * float(b.norm())


def test_conjugate_gradient_jacobi_preconditioner_helps():
    d = torch.logspace(0, 6, 40, dtype=torch.float64)
    K = torch.diag(d) + 1e-3 * torch.ones(40, 40, dtype=torch.float64)
    b = torch.ones(40, dtype=torch.float64)
    plain = conjugate_gradient(lambda v: K @ v, b, rtol=1e-10, maxiter=1000)
    prec = conjugate_gradient(
        lambda v: K @ v, b, rtol=1e-10, maxiter=1000, preconditioner=lambda r: r / torch.diagonal(K)
    )
    assert prec.converged and prec.iterations < plain.iterations
