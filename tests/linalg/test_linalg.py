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
    res = conjugate_gradient(lambda v: K @ v, b, rtol=1e-14, max_iter=3)
    assert not res.converged and res.iterations == 3
    assert res.residual_norm > 1e-14 * float(b.norm())


def test_conjugate_gradient_jacobi_preconditioner_helps():
    d = torch.logspace(0, 6, 40, dtype=torch.float64)
    K = torch.diag(d) + 1e-3 * torch.ones(40, 40, dtype=torch.float64)
    b = torch.ones(40, dtype=torch.float64)
    plain = conjugate_gradient(lambda v: K @ v, b, rtol=1e-10, max_iter=1000)
    prec = conjugate_gradient(
        lambda v: K @ v,
        b,
        rtol=1e-10,
        max_iter=1000,
        preconditioner=lambda r: r / torch.diagonal(K),
    )
    assert prec.converged and prec.iterations < plain.iterations


def _counting(K: torch.Tensor):
    calls = [0]

    def matvec(v: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return K @ v

    return matvec, calls


def test_conjugate_gradient_check_residual_false_charges_no_extra_product():
    K = _spd(25, 3, cond=50.0)
    b = torch.randn(25, dtype=torch.float64)
    checked_mv, checked_calls = _counting(K)
    skipped_mv, skipped_calls = _counting(K)
    checked = conjugate_gradient(checked_mv, b, rtol=1e-12)
    skipped = conjugate_gradient(skipped_mv, b, rtol=1e-12, check_residual=False)
    assert checked_calls[0] == checked.iterations + 1 == checked.matvecs
    assert skipped_calls[0] == skipped.iterations == skipped.matvecs
    assert skipped.converged and skipped.status.ok
    torch.testing.assert_close(skipped.x, torch.linalg.solve(K, b), rtol=1e-9, atol=1e-10)


def test_conjugate_gradient_warm_start_counts_its_residual():
    K = _spd(10, 4)
    b = torch.randn(10, dtype=torch.float64)
    mv, calls = _counting(K)
    res = conjugate_gradient(mv, b, x0=torch.linalg.solve(K, b), rtol=1e-8, check_residual=False)
    assert res.iterations == 0 and calls[0] == res.matvecs == 1


def test_conjugate_gradient_status_and_failure_policy():
    from dxopt._core import DxoptWarning, NotConvergedError, Status

    K = _spd(50, 2, cond=1e8)
    b = torch.randn(50, dtype=torch.float64)
    assert conjugate_gradient(lambda v: K @ v, b, max_iter=3).status is Status.MAX_ITER
    with pytest.raises(NotConvergedError, match="max_iter"):
        conjugate_gradient(lambda v: K @ v, b, max_iter=3, on_failure="raise")
    with pytest.warns(DxoptWarning):
        conjugate_gradient(lambda v: K @ v, b, max_iter=3, on_failure="warn")
    indefinite = torch.diag(torch.tensor([1.0, -1.0], dtype=torch.float64))
    bad = conjugate_gradient(lambda v: indefinite @ v, torch.tensor([0.0, 1.0]).double())
    assert bad.status is Status.FAILED and not bad.converged


def test_conjugate_gradient_maxiter_is_a_deprecated_alias():
    K = _spd(10, 5)
    b = torch.randn(10, dtype=torch.float64)
    with pytest.warns(DeprecationWarning, match="'maxiter' is renamed 'max_iter'"):
        res = conjugate_gradient(lambda v: K @ v, b, maxiter=2)
    assert res.iterations == 2
    with pytest.raises(ValueError, match="max_iter: expected an integer >= 1, got 0"):
        conjugate_gradient(lambda v: K @ v, b, max_iter=0)
