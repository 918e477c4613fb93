"""The large dense backward (qp.backward.dense_large: float32 augmented matrix + float64 GMRES,
certified row independence) against exact float64 references: the reduced-KKT solve at a
known active set, the block elimination of P (the Schur route), and the fallbacks on
dependent rows, a singular P and rows the certificate cannot vouch for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _ref_problems import kkt_gradients, relative_error
from qp_zoo import QPData, complementary_qp

import dxopt.qp as dqp
from dxopt.linalg.augmented import augmented_solve, certify_independent_rows
from dxopt.qp.backward import dense_large as _dense_large

F64 = torch.float64
NAMES = ("P", "q", "A", "b", "G", "h")


def _grads(data: QPData, backward: str, grad_x: torch.Tensor, solver: str = "daqp"):  # type: ignore[no-untyped-def]
    """Gradients of ``grad_x . x`` (daqp's points: the general path's backward; ``"auto"``:
    the compiled solver's, whose factors the backward reuses)."""
    leaves = [None if t is None else t.clone().requires_grad_() for t in data.args()]
    sol = dqp.solve(**dict(zip("PqAbGh", leaves)), backward=backward, solver=solver)
    (sol.x * grad_x).sum().backward()
    return {k: t.grad for k, t in zip(NAMES, leaves) if t is not None}, sol


def _schur_route(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_dense_large, "LARGE_N", 10**9)


def _with_P(data: QPData, P: torch.Tensor) -> QPData:
    """The same KKT point (x, multipliers, active set) with another P (q adjusted)."""
    assert data.x is not None
    q = data.q + (data.P - P) @ data.x
    return data._replace(P=P, q=q)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize(
    ("n", "m", "p", "seed"), [(260, 200, 60, 0), (320, 320, 100, 1), (400, 300, 0, 2)]
)
def test_augmented_route_equals_the_reference_and_the_schur_route(
    backward: str, n: int, m: int, p: int, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = complementary_qp(n, m=m, p=p, seed=seed)
    grad_x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    got, sol = _grads(data, backward, grad_x)
    assert sol.info.backward.linear_solver == "augmented"
    assert sol.info.backward.residual <= 1e-12
    ref = kkt_gradients(data, grad_x)
    for name, expected in ref.items():
        assert relative_error(got[name], expected) <= 1e-9, name
    _schur_route(monkeypatch)
    schur, sol_s = _grads(data, backward, grad_x)
    assert sol_s.info.backward.linear_solver == "schur"
    for name in got:
        assert relative_error(got[name], schur[name]) <= 1e-10, name


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize(
    ("n", "m", "p", "weak", "seed"),
    [(260, 200, 60, 0, 0), (320, 320, 100, 0, 1), (400, 300, 0, 0, 2), (300, 240, 40, 6, 4)],
)
def test_compiled_solver_factors_are_reused_exactly(
    backward: str, n: int, m: int, p: int, weak: int, seed: int
) -> None:
    """``solver="auto"`` on one large dense problem: the compiled dual active-set solver, whose
    Cholesky factor of P, rows L^-1 c and working-set factor the backward reuses (the lean
    kernel when the active set is unambiguous, else the general path's ``forward_factors``
    route; weak rows: the general path's policy). Gradients equal the exact reduced-KKT
    reference and daqp's general path."""
    data = complementary_qp(n, m=m, p=p, weak=weak, seed=seed)
    grad_x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    got, sol = _grads(data, backward, grad_x, solver="auto")
    assert sol.info.solver == "dual_active_set"
    assert sol.info.backward.linear_solver in ("schur", "forward_factors")
    assert sol.info.backward.residual <= 1e-12
    daqp_grads, sol_d = _grads(data, backward, grad_x)
    assert sol_d.info.solver == "daqp"
    torch.testing.assert_close(sol.x, sol_d.x, rtol=0, atol=1e-8)
    assert sol.info.backward.n_weak == sol_d.info.backward.n_weak
    for name, expected in daqp_grads.items():
        assert relative_error(got[name], expected) <= 1e-7, name
    if not weak:
        ref = kkt_gradients(data, grad_x)
        for name, expected in ref.items():
            assert relative_error(got[name], expected) <= 1e-9, name


def test_badly_scaled_rows_are_certified_and_solved_exactly() -> None:
    """Rows scaled by 1e-6 .. 1e6 (h scaled alike, multipliers inversely): the certificate is
    scale-invariant and the weights follow each row's norm."""
    data = complementary_qp(300, m=240, p=40, seed=3)
    assert data.G is not None and data.h is not None and data.ineq_duals is not None
    assert data.A is not None and data.b is not None and data.eq_duals is not None
    gen = torch.Generator().manual_seed(5)
    s = 10.0 ** torch.randint(-6, 7, (240,), generator=gen).to(F64)
    t = 10.0 ** torch.randint(-6, 7, (40,), generator=gen).to(F64)
    data = data._replace(
        G=data.G * s[:, None], h=data.h * s, ineq_duals=data.ineq_duals / s,
        A=data.A * t[:, None], b=data.b * t, eq_duals=data.eq_duals / t,
    )  # fmt: skip
    grad_x = torch.randn(300, generator=gen, dtype=F64)
    got, sol = _grads(data, "kkt", grad_x)
    assert sol.info.backward.linear_solver == "augmented"
    ref = kkt_gradients(data, grad_x)
    for name in ("q", "h", "b", "P"):
        assert relative_error(got[name], ref[name]) <= 1e-9, name


def test_singular_P_with_a_nonsingular_kkt_matrix_is_solved_exactly() -> None:
    """P positive semidefinite with a 20-dimensional null space that the active rows cover:
    K is nonsingular (the gradient exists) though P has no Cholesky factor; the augmented
    matrix P + C'WC is positive definite."""
    data = complementary_qp(300, m=200, p=50, seed=4)
    gen = torch.Generator().manual_seed(6)
    B = torch.randn(300, 280, generator=gen, dtype=F64)
    data = _with_P(data, B @ B.T / 300)
    grad_x = torch.randn(300, generator=gen, dtype=F64)
    got, sol = _grads(data, "kkt", grad_x)
    assert sol.info.backward.linear_solver == "augmented"
    ref = kkt_gradients(data, grad_x)
    for name, expected in ref.items():
        assert relative_error(got[name], expected) <= 1e-8, name


def test_P_singular_on_the_null_space_of_the_active_rows_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """P z = 0 for a z with C z = 0: K is singular (x is not unique), the augmented matrix is
    singular too, so the route refuses and the general path gives its pseudo-inverse adjoint
    with a warning, exactly as without the route, for a loss constant on the face (grad_x
    orthogonal to z); a loss that is not is refused on both routes."""
    data = complementary_qp(280, m=150, p=30, seed=12)
    assert data.G is not None and data.A is not None and data.active is not None
    assert data.x is not None
    z = torch.linalg.svd(torch.cat([data.G[data.active], data.A]))[2][-1]
    flat = torch.eye(280, dtype=F64) - torch.outer(z, z)
    gen = torch.Generator().manual_seed(3)
    B = torch.randn(280, 280, generator=gen, dtype=F64)
    data = _with_P(data, flat @ (B @ B.T / 280 + 0.5 * torch.eye(280, dtype=F64)) @ flat)
    grad_x = torch.randn(280, generator=gen, dtype=F64)
    with pytest.raises(dqp.QPBackwardError, match="not unique"):
        _grads(data, "kkt", grad_x)
    grad_x = grad_x - (grad_x @ z) * z  # constant on the face x + t z
    with pytest.warns(dqp.QPDegenerateWarning, match="singular"):
        got, sol = _grads(data, "kkt", grad_x)
    # L is constant on the face, so moving q along z moves x along the face only: dL/dq is
    # orthogonal to z (an LU solve of the singular K once returned a z-part of -3.3)
    assert abs(float(got["q"] @ z)) <= 1e-10 * float(got["q"].norm())
    assert sol.info.backward.linear_solver != "augmented"
    assert sol.info.backward.pseudo_inverse == (True,)
    _schur_route(monkeypatch)
    with pytest.warns(dqp.QPDegenerateWarning, match="singular"):
        schur, _ = _grads(data, "kkt", grad_x)
    with pytest.raises(dqp.QPBackwardError, match="not unique"):
        _grads(data, "kkt", grad_x + 1e-3 * z)
    for name in got:
        assert relative_error(got[name], schur[name]) <= 1e-12, name


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_dependent_active_rows_fall_back_to_the_exact_path(
    backward: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An active row duplicated at another scale (the copy shares the multiplier): the rows
    cannot be certified, so the general path with its dependence test and degenerate policy
    runs, and gives exactly what it gives without the augmented route."""
    base = complementary_qp(280, m=150, p=30, seed=7)
    assert base.G is not None and base.h is not None and base.ineq_duals is not None
    assert base.active is not None
    j = int(torch.nonzero(base.active)[0])
    nu = base.ineq_duals.clone()
    nu[j] *= 0.5  # split between the row and its copy scaled by 3: nu_j g_j = 0.5 nu_j g_j +
    data = base._replace(  # (nu_j / 6)(3 g_j)
        G=torch.cat([base.G, 3 * base.G[j : j + 1]]),
        h=torch.cat([base.h, 3 * base.h[j : j + 1]]),
        ineq_duals=torch.cat([nu, nu[j : j + 1] / 3]),
        active=torch.cat([base.active, base.active[j : j + 1]]),
    )
    grad_x = torch.randn(280, generator=torch.Generator().manual_seed(8), dtype=F64)
    with pytest.warns(dqp.QPDegenerateWarning):
        got, sol = _grads(data, backward, grad_x)
    assert sol.info.backward.linear_solver != "augmented"
    assert sol.info.backward.dependent_rows[0] >= 1
    # x does not depend on which copy carries the multiplier: q's gradient is the reference's
    ref = kkt_gradients(base, grad_x)
    assert relative_error(got["q"], ref["q"]) <= 1e-9
    _schur_route(monkeypatch)
    with pytest.warns(dqp.QPDegenerateWarning):
        schur, _ = _grads(data, backward, grad_x)
    for name in got:
        assert relative_error(got[name], schur[name]) <= 1e-12, name


def _random_rows(k: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((k, n))


def test_certificate_accepts_independent_rows_at_any_scale() -> None:
    C = _random_rows(150, 200, 0)
    scales = 10.0 ** np.random.default_rng(1).integers(-150, 150, size=150)
    assert certify_independent_rows(C, floor=1e-8)
    assert certify_independent_rows(C * scales[:, None], floor=1e-8)
    assert certify_independent_rows(np.eye(200)[:199], floor=1e-8)
    assert certify_independent_rows(np.zeros((0, 5)), floor=1e-8)


@pytest.mark.parametrize("eps", [0.0, 1e-14, 1e-9, 1e-6])
def test_certificate_refuses_dependent_and_nearly_dependent_rows(eps: float) -> None:
    """A row equal to a combination of two others plus ``eps`` times a random direction:
    the smallest eigenvalue of the normalised Gram matrix is about eps^2 (at most 1e-12),
    below the floor 1e-8, so the certificate must fail, at every row scale."""
    C = _random_rows(100, 160, 2)
    noise = np.random.default_rng(3).standard_normal(160)
    C[57] = 1e8 * (C[3] - 2 * C[40] + eps * noise / np.linalg.norm(noise))
    assert not certify_independent_rows(C, floor=1e-8)
    C[57] *= 1e-16
    assert not certify_independent_rows(C, floor=1e-8)


def test_certificate_on_a_column_subset_falls_back_to_all_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With k >= 256 rows the columns of largest norm are tried first. Row 299 is row 0 plus
    1e-2 e_499, and column 499 is zero elsewhere (the smallest column, left out of the
    subset): on the subset rows 0 and 299 are parallel, so the subset cannot certify, and the
    whole Gram matrix (smallest eigenvalue about 1e-7) must."""
    from dxopt.linalg import augmented

    calls: list[int] = []
    original = augmented._gram_certifies

    def spy(unit: np.ndarray, floor: float, n: int) -> bool:
        calls.append(unit.shape[1])
        return original(unit, floor, n)

    monkeypatch.setattr(augmented, "_gram_certifies", spy)
    C = _random_rows(300, 500, 8)
    C[:, 499] = 0.0
    C[299] = C[0]
    C[299, 499] = 1e-2
    assert certify_independent_rows(C, floor=1e-8)
    assert calls == [332, 500]
    calls.clear()
    C[299, 499] = 1e-7  # now nearly dependent on all columns too: refused
    assert not certify_independent_rows(C, floor=1e-8)
    assert calls == [332, 500]
    calls.clear()
    assert certify_independent_rows(_random_rows(300, 500, 9), floor=1e-8)
    assert calls == [332]  # the subset alone certifies


def test_certificate_refuses_zero_rows_nonfinite_rows_and_too_many_rows() -> None:
    C = _random_rows(20, 30, 4)
    C[7] = 0.0
    assert not certify_independent_rows(C, floor=1e-8)
    C[7] = np.inf
    assert not certify_independent_rows(C, floor=1e-8)
    assert not certify_independent_rows(_random_rows(31, 30, 5), floor=1e-8)


def test_certificate_is_exact_at_the_floor() -> None:
    """Rows with known Gram spectrum (orthogonal rows mixed by a known matrix): certified
    just below the smallest eigenvalue, refused just above it."""
    rng = np.random.default_rng(6)
    Q = np.linalg.qr(rng.standard_normal((120, 80)))[0].T  # orthonormal rows
    lam = np.geomspace(1e-6, 1.0, 80)  # the Gram eigenvalues wanted (before normalising)
    V = np.linalg.qr(rng.standard_normal((80, 80)))[0]
    C = V @ (np.sqrt(lam)[:, None] * Q)
    norms = np.linalg.norm(C, axis=1)
    smallest = np.linalg.eigvalsh((C / norms[:, None]) @ (C / norms[:, None]).T)[0]
    assert certify_independent_rows(C, floor=0.9 * smallest)
    assert not certify_independent_rows(C, floor=1.1 * smallest)


def _kkt(P: np.ndarray, C: np.ndarray) -> np.ndarray:
    k = C.shape[0]
    return np.block([[P, C.T], [C, np.zeros((k, k))]])


@pytest.mark.parametrize("seed", range(3))
def test_augmented_solve_equals_the_dense_lu_solve(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, k = 300, 220
    B = rng.standard_normal((n, n))
    P = B @ B.T / n + 1e-3 * np.eye(n)  # condition number about 4e3
    C = rng.standard_normal((k, n)) * 10.0 ** rng.integers(-4, 5, size=k)[:, None]
    r1, r2 = rng.standard_normal(n), rng.standard_normal(k)
    out = augmented_solve(P, C, r1, r2, tol=1e-14)
    rhs = np.concatenate([r1, r2])
    exact = np.linalg.solve(_kkt(P, C), rhs)
    lu_residual = np.linalg.norm(rhs - _kkt(P, C) @ exact) / np.linalg.norm(rhs)
    # rows scaled by up to 1e4 put the attainable residual near 1e-8 (the LU's is no better);
    # GMRES stops on the equilibrated residual, within a few times the LU's in this metric
    assert out is not None and out.iterations <= 12
    assert out.residual <= max(1e-13, 10 * lu_residual)
    assert np.linalg.norm(out.u - exact[:n]) <= 1e-10 * np.linalg.norm(exact[:n])
    assert np.linalg.norm(out.w - exact[n:]) <= 1e-10 * np.linalg.norm(exact[n:])


def test_augmented_solve_checks_the_residual_with_all_of_P() -> None:
    """The GMRES steps read P's lower triangle (symmetric BLAS), the true residual all of P: a P
    symmetric only up to round-off (as the input check allows) is still solved to the round-off
    of the whole matrix, and the reported residual is that of the whole matrix. A
    Fortran-ordered P gives the same bits as its C-ordered copy."""
    rng = np.random.default_rng(11)
    n, k = 280, 200
    B = rng.standard_normal((n, n))
    P = B @ B.T / n + 1e-2 * np.eye(n)
    E = rng.standard_normal((n, n))
    P_asym = P + 1e-14 * np.abs(P).max() * (E - E.T)  # lower and upper triangles differ
    C = rng.standard_normal((k, n))
    r1, r2 = rng.standard_normal(n), rng.standard_normal(k)
    rhs = np.concatenate([r1, r2])
    out = augmented_solve(P_asym, C, r1, r2, tol=1e-14)
    assert out is not None
    true = np.linalg.norm(rhs - _kkt(P_asym, C) @ np.concatenate([out.u, out.w]))
    assert out.residual == pytest.approx(true / np.linalg.norm(rhs), rel=1e-6)
    assert out.residual <= 1e-13
    exact = np.linalg.solve(_kkt(P_asym, C), rhs)
    assert np.linalg.norm(out.u - exact[:n]) <= 1e-11 * np.linalg.norm(exact[:n])
    fortran = augmented_solve(np.asfortranarray(P), C, r1, r2, tol=1e-14)
    plain = augmented_solve(P, C, r1, r2, tol=1e-14)
    assert fortran is not None and plain is not None
    assert np.array_equal(fortran.u, plain.u) and np.array_equal(fortran.w, plain.w)


def test_augmented_solve_refuses_what_it_cannot_factor_or_converge_on() -> None:
    """P negative definite on the null space of C (the augmented matrix is indefinite for
    every weight): the float32 Cholesky factorization fails, ``None``. With a budget of one
    GMRES iteration a system needing more comes back with its true (large) residual."""
    rng = np.random.default_rng(7)
    n, k = 60, 20
    C = rng.standard_normal((k, n))
    P = -np.eye(n)
    assert augmented_solve(P, C, rng.standard_normal(n), rng.standard_normal(k), tol=1e-13) is None
    B = rng.standard_normal((n, n))
    P = B @ B.T + np.eye(n)
    r1, r2 = rng.standard_normal(n), rng.standard_normal(k)
    partial = augmented_solve(P, C, r1, r2, tol=1e-13, max_iterations=1)
    assert partial is not None and partial.iterations == 1
    rhs = np.concatenate([r1, r2])
    true = np.linalg.norm(rhs - _kkt(P, C) @ np.concatenate([partial.u, partial.w]))
    assert partial.residual > 1e-10  # reported honestly, for the caller to refuse
    assert partial.residual == pytest.approx(true / np.linalg.norm(rhs), rel=1e-6)
    nan = augmented_solve(P, C, np.full(n, np.nan), r2, tol=1e-13)  # propagates, no raise
    assert nan is not None and not nan.residual <= 1.0
    with pytest.raises(ValueError, match="C: expected rows that are not zero"):
        augmented_solve(P, np.zeros((1, n)), r1, r2[:1], tol=1e-13)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_small_batches_are_solved_per_sample(backward: str) -> None:
    """Two samples of different active counts (padding rows in the stacked rows), each solved
    on its own by the augmented route and equal to its own reference."""
    from qp_zoo import stack

    problems = [
        complementary_qp(270, m=200, p=40, seed=s, n_active=a) for s, a in ((9, 60), (10, 110))
    ]
    grad_x = torch.randn(2, 270, generator=torch.Generator().manual_seed(11), dtype=F64)
    got, sol = _grads(stack(problems), backward, grad_x)
    assert sol.info.backward.linear_solver == "augmented"
    for i, prob in enumerate(problems):
        ref = kkt_gradients(prob, grad_x[i])
        for name, expected in ref.items():
            assert relative_error(got[name][i], expected) <= 1e-9, (i, name)
