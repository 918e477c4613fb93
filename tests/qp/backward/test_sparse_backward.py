"""The sparse backward's unit-row elimination (:class:`dxopt.linalg.sparse.KKTFactor`) and the
LICQ count read off the same split (:func:`dxopt.qp.certify.dependence.count_dependent_sparse`).

References: numpy's SVD rank (the dependent-row count is ``#nonzero rows - rank``), the dense
LU solve of the full saddle-point matrix, the dense backward path, and the closed-form simplex
VJP. Cases: duplicated and opposite unit rows, a bound row that is a combination of other
active rows, rows scaled by 1e-8 and 1e8, a zero row, all columns covered by unit rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from qp_zoo import simplex_projection, simplex_qp, simplex_vjp, sparse_complementary_qp

import dxopt.qp as dqp
from dxopt.linalg.sparse import FactorizationError, kkt_factor, take_rows, unit_rows
from dxopt.qp.backward import vertex as _vertex
from dxopt.qp.certify import dependence as _degenerate

F64 = torch.float64
N = 8


def _e(j: int, scale: float = 1.0) -> np.ndarray:
    row = np.zeros(N)
    row[j] = scale
    return row


def _ones(scale: float = 1.0) -> np.ndarray:
    return np.full(N, scale)


def _combo(scale: float = 1.0) -> list[np.ndarray]:
    """Bound row e_0 with c1 = e_0 + e_1 + e_2 and c2 = e_0 - e_1 - e_2: e_0 = (c1 + c2)/2."""
    c1 = _e(0) + _e(1) + _e(2)
    c2 = _e(0) - _e(1) - _e(2)
    return [_e(0, -scale), scale * c1, c2 / scale, _e(5)]


CASES = {
    "independent": [_e(0, -1), _e(3, -1), _e(4, -1), _ones()],
    "duplicated_unit": [_e(0, -1), _e(3, -1), _e(0, -1), _ones()],
    "opposite_unit": [_e(2, -1), _e(2, 1), _ones()],
    "bound_is_combination": _combo(),
    "bound_is_combination_scaled": _combo(1e8),
    "unit_sum_of_units": [_e(1), _e(2), _e(1) + _e(2), _e(6, 1e-8)],
    "scaled_independent": [_e(0, -1e-8), _e(3, 1e8), _ones(1e-8), _e(5) - _e(6)],
    "scaled_duplicates": [_e(4, -1e-8), _e(4, 1e8), _ones(1e8), _ones(-1e-8)],
    "zero_row": [_e(0, -1), np.zeros(N), _ones(), _e(3)],
    "zero_row_dependent": [_e(0, -1), np.zeros(N), _e(0, 2), _ones()],
    "all_columns_covered": [_e(j, -1.0 - j) for j in range(N)],
    "all_columns_covered_and_sum": [_e(j, -1.0 - j) for j in range(N)] + [_ones()],
    "no_unit": [_ones(), _e(0) - _e(1), _e(0) + _e(1), _e(2) - _e(3)],
    "no_unit_dependent": [_ones(), _e(0) - _e(1), _e(0) + _e(1), 2 * _e(0) + _e(4) - _e(4)],
}


def _svd_count(C: np.ndarray) -> int:
    """``#nonzero rows - rank`` of the row-normalised ``C`` (rank is not scale invariant)."""
    norms = np.linalg.norm(C, axis=1)
    nonzero = norms > 0
    return int(nonzero.sum()) - int(np.linalg.matrix_rank(C[nonzero] / norms[nonzero, None]))


@pytest.mark.parametrize("dense_gram", [300, 0])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dependent_count_equals_svd_rank_deficiency_and_dense_count(
    case: str, dense_gram: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_degenerate, "_DENSE_GRAM", dense_gram)  # 0: the SuperLU Gram branch
    C = np.array(CASES[case])
    expected = _svd_count(C)
    gen = np.random.default_rng(0)
    for perm in (np.arange(C.shape[0]), gen.permutation(C.shape[0])):
        Cs = sp.csr_matrix(C[perm])
        assert _degenerate.count_dependent_sparse(Cs) == expected, case
        assert _degenerate.count_dependent_sparse(Cs, unit_rows(Cs)) == expected
        dense = int(_degenerate.count_dependent_dense(torch.from_numpy(C[perm])[None])[0])
        assert dense == expected
    independent = {"independent", "scaled_independent", "zero_row", "all_columns_covered"}
    if case not in independent | {"no_unit"}:
        assert expected > 0
    else:
        assert expected == 0


def test_unit_rows_ignores_explicit_zeros_and_keeps_duplicates_in_the_rest() -> None:
    C = sp.csr_matrix(
        (np.array([2.0, 0.0, -1.0, 3.0, 1.0, 1.0]), np.array([1, 3, 1, 0, 0, 2]),
         np.array([0, 2, 3, 4, 6])), shape=(4, 4),
    )  # fmt: skip
    s = unit_rows(C)
    assert s.unit.tolist() == [0, 2] and s.cols.tolist() == [1, 0]
    assert s.vals.tolist() == [2.0, 3.0]
    assert s.other.tolist() == [1, 3] and s.free.tolist() == [2, 3]
    np.testing.assert_array_equal(s.R.toarray(), [[0.0, 0.0], [1.0, 0.0]])
    np.testing.assert_allclose(s.norms, [2.0, 1.0, 3.0, np.sqrt(2.0)])
    assert _degenerate.count_dependent_sparse(C) == 1  # row 1 = -e_1 duplicates row 0


def _random_system(seed: int, scales: bool) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    rng = np.random.default_rng(seed)
    n = 30
    B = sp.random(n, n, density=0.1, random_state=seed) + sp.eye(n)
    P = sp.csr_matrix(B @ B.T * 0.5)
    unit_cols = rng.choice(n, size=12, replace=False)
    signs = rng.choice([-1.0, 1.0], size=12)
    if scales:
        signs = signs * np.array([1e-8, 1e8, 1.0] * 4)
    U = sp.csr_matrix((signs, (np.arange(12), unit_cols)), shape=(12, n))
    other = sp.vstack([sp.random(3, n, density=0.4, random_state=seed + 1), np.ones((1, n))])
    rows = sp.vstack([U[:5], other, U[5:]], format="csr")
    return P, rows[rng.permutation(rows.shape[0])]


@pytest.mark.parametrize("scales", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kkt_factor_matches_the_dense_solve(seed: int, scales: bool) -> None:
    P, C = _random_system(seed, scales)
    assert _degenerate.count_dependent_sparse(C) == 0
    n, k = P.shape[0], C.shape[0]
    K = np.block([[P.toarray(), C.toarray().T], [C.toarray(), np.zeros((k, k))]])
    rhs = np.random.default_rng(seed + 10).standard_normal(n + k)
    z = kkt_factor(P, C).solve(rhs)
    assert np.linalg.norm(K @ z - rhs) <= 1e-12 * np.linalg.norm(K, 2) * np.linalg.norm(z)
    ref = np.linalg.solve(K, rhs)
    np.testing.assert_allclose(z[:n], ref[:n], rtol=1e-7, atol=1e-9 * np.abs(ref[:n]).max())


def test_kkt_factor_with_every_column_covered_and_without_unit_rows() -> None:
    n = 6
    P = sp.csr_matrix(np.diag(np.arange(1.0, n + 1)))
    rng = np.random.default_rng(3)
    for C in (sp.csr_matrix(np.diag(rng.uniform(0.5, 2.0, n))), sp.csr_matrix(np.ones((1, n)))):
        k = C.shape[0]
        K = np.block([[P.toarray(), C.toarray().T], [C.toarray(), np.zeros((k, k))]])
        rhs = rng.standard_normal(n + k)
        np.testing.assert_allclose(kkt_factor(P, C).solve(rhs), np.linalg.solve(K, rhs))


def test_kkt_factor_refuses_a_singular_reduced_matrix() -> None:
    """P vanishes on the free coordinates and no other row pins them: K is singular."""
    P = sp.csr_matrix(np.diag([1.0, 1.0, 0.0, 0.0]))
    C = sp.csr_matrix(np.array([[1.0, 0, 0, 0], [0, 0, 1.0, -1.0]]))
    with pytest.raises(FactorizationError, match="reduced KKT matrix"):
        kkt_factor(P, C)


def test_kkt_factor_never_hands_superlu_a_singular_matrix() -> None:
    """SuperLU of an exactly singular matrix can crash the process (it did, at random, on
    Maros-Meszaros QSHARE1B): the factor is of the regularised matrix, so every singular
    case is a FactorizationError, every time, and the empty-C case (K = P) too."""
    rng = np.random.default_rng(3)
    for trial in range(40):
        n = 30
        B = rng.standard_normal((n, n - 5))
        P = sp.csr_matrix(B @ B.T)  # rank n - 5
        if trial % 2:
            C = sp.csr_matrix((0, n))  # K = P, singular
        else:
            C = sp.csr_matrix(rng.standard_normal((2, n)) * (rng.random((2, n)) < 0.1))
            C = sp.vstack([C, C[:1]]).tocsr()  # a duplicated row: singular K
        with pytest.raises(FactorizationError):
            kkt_factor(P, C)
    # nonsingular: the refined regularised solve is the exact one
    P = sp.csr_matrix(np.diag(np.arange(1.0, 7.0)) * 1e6)
    C = sp.csr_matrix(np.array([[1.0, 1, 0, 0, 0, 0], [0, 0, 1e-6, 0, 0, 1.0]]))
    K = np.block([[P.toarray(), C.T.toarray()], [C.toarray(), np.zeros((2, 2))]])
    rhs = rng.standard_normal(8)
    np.testing.assert_allclose(kkt_factor(P, C).solve(rhs), np.linalg.solve(K, rhs), rtol=1e-12)


def _grads(data, method, grad_x):  # type: ignore[no-untyped-def]
    leaves = [t.clone().requires_grad_() for t in (data.q, data.b, data.h)]
    sol = dqp.solve(
        data.P, leaves[0], A=data.A, b=leaves[1], G=data.G, h=leaves[2], backward=method
    )
    out = torch.autograd.grad((sol.x * grad_x).sum(), leaves)
    return out, sol.info.backward


@pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")
@pytest.mark.parametrize("backward", ["kkt", "penalty"])
@pytest.mark.parametrize(
    "variant", ["plain", "duplicated", "scaled", "scaled_duplicates", "zero_row", "combination"]
)
def test_sparse_and_dense_paths_agree_on_simplex_variants(backward: str, variant: str) -> None:
    """The simplex with extra G rows: duplicated bounds, bounds scaled by 1e-8/1e8 (alone and
    duplicated with another scale), a zero row, and a row ``-x_0 - x_1 <= 0`` that with the
    bounds on x_0, x_1 is dependent. The sparse and the dense path give the same gradient, the
    same dependent-row count and the same fallback; without dependent rows it is the closed
    form."""
    n = 40
    base = simplex_qp(n, seed=4)
    G, h = base.G, base.h
    assert G is not None and h is not None and base.x is not None
    off = torch.nonzero(base.x == 0).flatten()[:6]
    if variant.startswith("scaled"):  # bound rows of x_i >= 0 scaled by 1e-8 and 1e8
        scale = torch.ones(n, dtype=F64)
        scale[off[:2]], scale[off[2:4]] = 1e-8, 1e8
        G = G * scale[:, None]
    extra = {
        "plain": torch.zeros(0, n, dtype=F64),
        "duplicated": G[off[:3]],
        "scaled": torch.zeros(0, n, dtype=F64),
        "scaled_duplicates": torch.cat([1e8 * G[off[0]], 1e-8 * G[off[2]]]),
        "zero_row": torch.zeros(1, n, dtype=F64),
        "combination": G[off[0]] + G[off[1]],
    }[variant].reshape(-1, n)
    data = base._replace(
        G=torch.cat([G, extra]), h=torch.cat([h, torch.zeros(extra.shape[0], dtype=F64)])
    )
    grad_x = torch.randn(n, generator=torch.Generator().manual_seed(7), dtype=F64)
    cls = dqp.KKTBackward if backward == "kkt" else dqp.PenaltyBackward
    results = {}
    for solver in ("sparse", "dense"):
        results[solver] = _grads(data, cls(linear_solver=solver, degenerate="min_norm"), grad_x)
    (g_sp, d_sp), (g_de, d_de) = results["sparse"], results["dense"]
    assert d_sp.dependent_rows == d_de.dependent_rows
    assert d_sp.pseudo_inverse == d_de.pseudo_inverse
    if not any(d_sp.pseudo_inverse):  # (K^+ r is checked by its normal equations instead)
        assert d_sp.residual <= 1e-8 and d_de.residual <= 1e-8
    for a, b in zip(g_sp, g_de):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    dependent = variant in ("duplicated", "scaled_duplicates", "combination")
    assert (max(d_sp.dependent_rows) > 0) == dependent
    if not dependent:
        expected = simplex_vjp(base.x, grad_x)
        torch.testing.assert_close(g_sp[0], expected["q"], rtol=1e-7, atol=1e-9)
        torch.testing.assert_close(g_sp[1], expected["b"], rtol=1e-7, atol=1e-9)
        # a row scaled by s has the multiplier, so the h gradient, divided by s
        h_scale = scale if variant == "scaled" else torch.ones(n, dtype=F64)
        torch.testing.assert_close(g_sp[2][:n], expected["h"] / h_scale, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_sparse_simplex_uses_the_exact_factor_and_matches_the_closed_form(backward: str) -> None:
    data = simplex_qp(3000, seed=2, sparse=True)
    assert data.x is not None
    grad_x = torch.randn(3000, generator=torch.Generator().manual_seed(8), dtype=F64)
    (gq, gb, gh), diag = _grads(data, backward, grad_x)
    expected = simplex_vjp(data.x, grad_x)
    for got, key in ((gq, "q"), (gb, "b"), (gh, "h")):
        assert float((got - expected[key]).norm()) <= 1e-9 * float(expected[key].norm()) + 1e-12
    assert diag.licq and diag.residual <= 1e-12
    if backward == "penalty":
        assert diag.refinement_steps == 0  # the exact factor: no GMRES iteration needed


def test_take_rows_equals_scipy_indexing_and_stacking() -> None:
    M = sp.random(12, 9, density=0.3, random_state=1, format="csr")
    extra = sp.random(3, 9, density=0.5, random_state=2, format="csr")
    rows = np.array([0, 4, 5, 11])
    got = take_rows(M, rows, extra)
    np.testing.assert_array_equal(got.toarray(), sp.vstack([M[rows], extra]).toarray())
    np.testing.assert_array_equal(take_rows(M, rows[:0]).toarray(), np.zeros((0, 9)))


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
@pytest.mark.parametrize("bounds", [False, True])
def test_sparse_and_dense_paths_agree_on_general_sparse_rows(backward: str, bounds: bool) -> None:
    """Random sparse rows (few unit rows: the penalty backward keeps the penalty matrix) and
    the same with 20 bounds that cut x* (many unit rows active: the exact factor)."""
    data = sparse_complementary_qp(30, m=24, p=3, density=0.2, seed=5)
    assert data.G is not None and data.h is not None and data.x is not None
    G, h = data.G.to_dense(), data.h
    if bounds:  # x_j >= x*_j + 0.5 on 20 coordinates: cuts x*, most bounds get active
        G = torch.cat([G, -torch.eye(30, dtype=F64)[:20]])
        h = torch.cat([h, -data.x[:20] - 0.5])
    dense = data._replace(P=data.P.to_dense(), A=data.A.to_dense(), G=G, h=h)  # type: ignore[union-attr]
    grad_x = torch.randn(30, generator=torch.Generator().manual_seed(9), dtype=F64)
    cls = dqp.KKTBackward if backward == "kkt" else dqp.PenaltyBackward
    (g_sp, d_sp), (g_de, d_de) = (
        _grads(dense, cls(linear_solver=solver), grad_x) for solver in ("sparse", "dense")
    )
    assert d_sp.licq and d_de.licq and d_sp.residual <= 1e-10
    assert d_sp.n_active == d_de.n_active
    if backward == "penalty" and bounds:  # many unit rows: the exact factor, no GMRES step
        assert d_sp.refinement_steps == 0
    # (few unit rows: the penalty matrix; its factor is refined to the exact penalty solve, so
    # GMRES may need no step there either)
    for a, b in zip(g_sp, g_de):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_batched_sparse_simplex_matches_the_closed_form_per_sample(backward: str) -> None:
    """Sparse P, G, A shared by a batch of q: each sample has its own active set, split and
    factor."""
    n, batch = 50, 4
    data = simplex_qp(n, seed=1, sparse=True)
    gen = torch.Generator().manual_seed(3)
    y = torch.randn(batch, n, generator=gen, dtype=F64)
    grad_x = torch.randn(batch, n, generator=gen, dtype=F64)
    q = (-y).requires_grad_()
    sol = dqp.solve(data.P, q, A=data.A, b=data.b, G=data.G, h=data.h, backward=backward)
    (grad_q,) = torch.autograd.grad((sol.x * grad_x).sum(), q)
    for i in range(batch):
        expected = simplex_vjp(simplex_projection(y[i]), grad_x[i])["q"]
        torch.testing.assert_close(grad_q[i], expected, rtol=1e-9, atol=1e-12)
    assert sol.info.backward.licq and sol.info.backward.residual <= 1e-12


def _parallel_groups_reference(Cn: sp.csr_matrix) -> int:
    """Distinct rows up to sign (largest entry made positive), rounded to 9 decimals."""
    dense = Cn.toarray()
    keys = set()
    for row in dense:
        nz = np.flatnonzero(row)
        sign = np.sign(row[nz][np.argmax(np.abs(row[nz]))]) if nz.size else 1.0
        keys.add((tuple(nz.tolist()), tuple((np.round(row[nz] * sign, 9) + 0.0).tolist())))
    return len(keys)


def test_parallel_groups_sparse_equals_a_row_by_row_reference() -> None:
    rng = np.random.default_rng(0)
    for trial in range(200):
        k, n = int(rng.integers(1, 25)), int(rng.integers(1, 10))
        B = sp.random(k, n, density=rng.uniform(0.05, 0.6), random_state=trial, format="csr")
        B.data = rng.choice([-2.0, -1.0, 0.5, 1.0, 3.0, 0.0], size=B.data.size)  # ties, zeros
        C = sp.vstack([B, -1.0 * B[:2], 1e-8 * B[1:3], 1e8 * B[:1]], format="csr")
        norms = np.sqrt(np.asarray(C.multiply(C).sum(1)).ravel())
        Cn = sp.csr_matrix(sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ C)
        groups = _vertex._parallel_groups_sparse(Cn)
        assert groups == _parallel_groups_reference(Cn), trial
        if (norms > 0).all():
            assert groups == _vertex._parallel_groups(Cn.toarray())
    assert _vertex._parallel_groups_sparse(sp.csr_matrix((0, 4))) == 0


def test_penalty_preconditioner_stays_factorable_on_chains() -> None:
    """Chains of difference constraints (few unit rows, many other active rows: the penalty
    matrix preconditions GMRES). Its weights are bounded (beta >= 1e-6) so the regularised
    factor of P + G_J^T W G_J refines; with beta = 1e-8 it stalled and every call fell back to
    the exact KKT factorization (a second, larger one). The gradient is the exact one."""
    k, points = 2, 60
    lap = sp.diags([-np.ones(points - 1), 2 * np.ones(points), -np.ones(points - 1)], [-1, 0, 1])
    L1 = sp.kron(lap, sp.identity(k)).tocsr()
    P = (0.5 * sp.identity(points * k) + L1.T @ L1).tocoo()
    D = sp.lil_matrix((points, points))
    for i in range(points):
        D[i, i], D[i, (i + 1) % points] = 1.0, -1.0
    G = sp.vstack([sp.kron(D.tocsr(), sp.identity(k)), -sp.kron(D.tocsr(), sp.identity(k))])
    G = G.tocoo()

    def coo(M: sp.coo_matrix) -> torch.Tensor:
        idx = torch.from_numpy(np.vstack([M.row, M.col]).astype(np.int64))
        return torch.sparse_coo_tensor(idx, torch.from_numpy(M.data), M.shape).coalesce()

    rng = np.random.default_rng(0)
    q0 = torch.tensor(-10.0 * rng.standard_normal(points * k), dtype=F64)
    h = torch.ones(G.shape[0], dtype=F64)
    grads = {}
    for backward in ("penalty", "kkt"):
        q = q0.clone().requires_grad_()
        sol = dqp.solve(coo(P), q, G=coo(G), h=h, backward=backward)
        (torch.linspace(-1, 1, points * k, dtype=F64) * sol.x).sum().backward()
        grads[backward] = q.grad
        if backward == "penalty":
            assert int((sol.ineq_duals > 0).sum()) > 20  # many difference rows active
            assert sol.info.backward.method == "penalty"
            assert sol.info.backward.linear_solver == "splu+gmres"
            assert sol.info.backward.residual <= 1e-12
    torch.testing.assert_close(grads["penalty"], grads["kkt"], rtol=1e-10, atol=1e-12)
