"""Block elimination of saddle-point systems (dxopt.linalg.schur) against dense solves."""

from __future__ import annotations

import pytest
import torch

from dxopt.linalg import schur_factor, small_work
from dxopt.linalg.schur import lower_gram

F64 = torch.float64


def _pd(batch: int, n: int, seed: int, ridge: float = 0.5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    M = torch.randn(batch, n, n, generator=gen, dtype=F64) / n**0.5
    return M @ M.mT + ridge * torch.eye(n, dtype=F64)


def _dense_solve(P, C, r1, r2):  # type: ignore[no-untyped-def]
    n, k = P.shape[-1], C.shape[-2]
    K = torch.zeros(P.shape[0], n + k, n + k, dtype=F64)
    K[:, :n, :n] = P
    K[:, :n, n:] = C.mT
    K[:, n:, :n] = C
    z = torch.linalg.solve(K, torch.cat([r1, r2], -1))
    return z[:, :n], z[:, n:]


@pytest.mark.parametrize(("n", "k"), [(7, 3), (30, 12), (20, 0)])
def test_solve_equals_the_dense_saddle_point_solve(n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(1)
    P = _pd(4, n, 0)
    C = torch.randn(4, k, n, generator=gen, dtype=F64)
    r1 = torch.randn(4, n, generator=gen, dtype=F64)
    r2 = torch.randn(4, k, generator=gen, dtype=F64)
    F = schur_factor(P, C)
    assert F is not None and bool((F.dependent(1e-10) == 0).all())
    u, w = F.solve(r1, r2)
    u_ref, w_ref = _dense_solve(P, C, r1, r2)
    torch.testing.assert_close(u, u_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, w_ref, rtol=1e-10, atol=1e-10)


def test_shared_P_is_factored_once_and_gives_the_batched_answer() -> None:
    gen = torch.Generator().manual_seed(2)
    P = _pd(1, 9, 3)
    C = torch.randn(5, 4, 9, generator=gen, dtype=F64)
    r1, r2 = (
        torch.randn(5, 9, generator=gen, dtype=F64),
        torch.randn(5, 4, generator=gen, dtype=F64),
    )
    shared, batched = schur_factor(P[0], C), schur_factor(P.expand(5, -1, -1), C)
    assert shared is not None and batched is not None
    for a, b in zip(shared.solve(r1, r2), batched.solve(r1, r2)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_lower_gram_is_exact_on_and_below_the_diagonal() -> None:
    Y = torch.randn(2, 15, 600, generator=torch.Generator().manual_seed(4), dtype=F64)
    full, lower = Y.mT @ Y, lower_gram(Y)
    torch.testing.assert_close(lower.tril(), full.tril(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.0, 1e-8, 1e8, -3.0])
def test_dependence_read_out_is_scale_invariant(alpha: float) -> None:
    """A duplicated row scaled by alpha is dependent at any scale; a zero row is set aside;
    the pivots of the independent rows do not change when a row is rescaled."""
    gen = torch.Generator().manual_seed(5)
    P = _pd(1, 12, 6, ridge=1e-3)
    B = torch.randn(1, 4, 12, generator=gen, dtype=F64)
    dup = torch.cat([B, alpha * B[:, 1:2], torch.zeros(1, 1, 12, dtype=F64)], 1)
    F = schur_factor(P, dup)
    assert F is not None
    assert F.dependent(1e-10).tolist() == [1]
    assert float(F.pivots[0, 4]) < 1e-12  # the duplicate
    assert abs(float(F.pivots[0, 5]) - 1.0) < 1e-12 and not bool(F.nonzero[0, 5])  # zero row
    scaled = B.clone()
    scaled[:, 2] *= alpha
    G0, G1 = schur_factor(P, B), schur_factor(P, scaled)
    assert G0 is not None and G1 is not None
    torch.testing.assert_close(G1.pivots, G0.pivots, rtol=1e-9, atol=0)
    assert G1.dependent(1e-10).tolist() == [0]


@pytest.mark.parametrize("seed", range(4))
def test_dependent_counts_equal_the_rank_deficiency(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    n, r, k = 15, 6, 9  # k rows spanning an r-dimensional space
    C = torch.randn(3, k, r, generator=gen, dtype=F64) @ torch.randn(
        3, r, n, generator=gen, dtype=F64
    )
    F = schur_factor(_pd(3, n, seed), C)
    assert F is not None
    assert F.dependent(1e-10).tolist() == [k - r] * 3


def test_not_positive_definite_P_returns_none() -> None:
    P = torch.diag(torch.tensor([1.0, 1.0, 0.0], dtype=F64))[None]
    assert schur_factor(P, torch.ones(1, 1, 3, dtype=F64)) is None


def test_small_work_uses_one_thread_and_restores() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with small_work(10.0):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with small_work(1e12):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("k", [30, 410])
def test_large_single_system_lapack_path_equals_the_torch_path(
    k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One system with n >= 400 goes through scipy's LAPACK (dpotrf/dtrsm/dsyrk): same
    factorization, solves and dependence read-out as the batched torch kernels."""
    import dxopt.linalg.schur as schur

    pytest.importorskip("threadpoolctl")  # the thread control the LAPACK path needs
    gen = torch.Generator().manual_seed(8)
    n = 420
    P = _pd(1, n, 9)[0]
    C = torch.randn(1, k, n, generator=gen, dtype=F64)
    C[0, -1] = 3.0 * C[0, 0]  # one dependent row
    r1, r2 = (
        torch.randn(1, n, generator=gen, dtype=F64),
        torch.randn(1, k, generator=gen, dtype=F64),
    )
    monkeypatch.setattr(schur, "_mkl_on_amd", lambda: True)
    assert schur._use_lapack(P, C)
    big = schur_factor(P, C)
    monkeypatch.setattr(schur, "_LAPACK_MIN", 10**9)
    assert not schur._use_lapack(P, C)
    ref = schur_factor(P, C)
    assert big is not None and ref is not None
    assert big.dependent(1e-10).tolist() == ref.dependent(1e-10).tolist() == [1]
    torch.testing.assert_close(big.L.tril(), ref.L[0].tril()[None], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(big.S_lower.tril(), ref.S_lower.tril(), rtol=1e-9, atol=1e-9)
    C_ok = C[:, :-1]
    monkeypatch.setattr(schur, "_LAPACK_MIN", 400)
    big = schur_factor(P, C_ok)
    assert big is not None and big.dependent(1e-10).tolist() == [0]
    u, w = big.solve(r1, r2[:, :-1])
    u_ref, w_ref = _dense_solve(P[None], C_ok, r1, r2[:, :-1])
    scale = float(torch.cat([u_ref, w_ref], -1).norm())
    assert float(torch.cat([u - u_ref, w - w_ref], -1).norm()) <= 1e-8 * scale
