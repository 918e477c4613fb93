"""The batched NNLS of CaVE's cone projection (:mod:`dxopt.dfl._nnls`) against
:func:`scipy.optimize.nnls` and exact answers: random cones, a knapsack's cone (signed unit
vectors and a weight row, more generators than dimensions), duplicate, opposite and zero
generators, a point inside the cone, in the polar cone, at zero; its certificate, and the
fallback of :func:`dxopt.dfl.cone_projection` for samples that do not certify."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import nnls

import dxopt.dfl.cave as cave_module
from dxopt import DxoptWarning
from dxopt.dfl import cone_projection
from dxopt.dfl._nnls import CERTIFIED, MAX_ITER, nnls_batch


def _scipy_projection(N: np.ndarray, a: np.ndarray) -> np.ndarray:
    keep = np.abs(N).sum(1) > 0
    if not keep.any():
        return np.zeros_like(a)
    return nnls(N[keep].T, a)[0] @ N[keep]


def _assert_kkt(N: np.ndarray, a: np.ndarray, lam: np.ndarray, tol: float) -> None:
    """lam >= 0, w = N(a - N'lam) <= tol |n_i| |a| everywhere and |w_i| <= that where lam > 0."""
    r = a - lam @ N
    w = N @ r
    scale = tol * np.linalg.norm(N, axis=1) * np.linalg.norm(a)
    assert (lam >= 0).all()
    assert (w <= scale).all()
    assert (np.abs(w[lam > 0]) <= scale[lam > 0]).all()


def _check_against_scipy(N: np.ndarray, A: np.ndarray, *, all_certified: bool) -> np.ndarray:
    lam, status, _ = nnls_batch(N, A)
    if all_certified:
        assert (status == CERTIFIED).all(), np.bincount(status)
    for s in np.flatnonzero(status == CERTIFIED):
        ref = _scipy_projection(N[s], A[s])
        assert np.abs(lam[s] @ N[s] - ref).max() <= 1e-12 * max(np.linalg.norm(A[s]), 1.0)
        _assert_kkt(N[s], A[s], lam[s], 1e-12)
    assert (lam[status != CERTIFIED] == 0).all()
    # the public projection (with its fallback) equals scipy's on every sample
    p, lam_t = cone_projection(torch.as_tensor(A), torch.as_tensor(N))
    for s in range(A.shape[0]):
        ref = _scipy_projection(N[s], A[s])
        assert np.abs(p[s].numpy() - ref).max() <= 1e-12 * max(np.linalg.norm(A[s]), 1.0)
        assert np.allclose(lam_t[s].numpy() @ N[s], p[s].numpy(), atol=1e-14)
    return status


def test_random_cones_certify_and_equal_scipy():
    rng = np.random.default_rng(0)
    for B, m, d in ((40, 3, 6), (40, 8, 8), (30, 20, 30), (10, 49, 48)):
        N = rng.standard_normal((B, m, d))
        A = rng.standard_normal((B, d))
        _check_against_scipy(N, A, all_certified=True)  # independent generators
    # more generators than dimensions (dependent): certified or fallen back, equal either way
    N = rng.standard_normal((30, 12, 5))
    A = rng.standard_normal((30, 5))
    status = _check_against_scipy(N, A, all_certified=False)
    assert (status == CERTIFIED).sum() >= 15


def test_knapsack_cone_with_more_generators_than_dimensions():
    """The binding normals of a 0/1 knapsack solution: the signed unit vectors of its bounds
    and the weight row (d + 1 generators in d dimensions), as CaVE meets them."""
    rng = np.random.default_rng(1)
    B, d = 40, 12
    signs = rng.choice([-1.0, 1.0], size=(B, d))
    N = np.zeros((B, d + 1, d))
    N[:, :d] = signs[:, :, None] * np.eye(d)
    N[:, d] = rng.integers(1, 8, size=d)
    A = rng.standard_normal((B, d)) + 0.5
    _check_against_scipy(N, A, all_certified=True)


def test_degenerate_generators():
    rng = np.random.default_rng(2)
    d = 5
    base = rng.standard_normal((4, d))
    dup = np.concatenate([base, base[:2], -base[2:3], np.zeros((2, d))])  # duplicate, opposite, 0
    N = np.stack([dup[rng.permutation(dup.shape[0])] for _ in range(20)])
    A = rng.standard_normal((20, d))
    _check_against_scipy(N, A, all_certified=False)
    lam = nnls_batch(N, A)[0]
    zero = np.abs(N).sum(2) == 0
    assert (lam[zero] == 0).all()  # padding rows are not generators


def test_unit_rows_duplicate_opposite_and_spanned():
    """Unit rows are eliminated: a repeated unit row, both signs of one coordinate (a free
    coordinate), scaled units, a general row inside their span and one outside it."""
    rng = np.random.default_rng(5)
    d = 4
    e = np.eye(d)
    gens = np.stack(
        [e[0], e[0], -e[0], 2.5 * e[1], e[0] + e[1], -0.5 * e[2], e[2] - e[3], 0 * e[0]]
    )
    N = np.stack([gens[rng.permutation(gens.shape[0])] for _ in range(30)])
    A = 2.0 * rng.standard_normal((30, d))
    status = _check_against_scipy(N, A, all_certified=False)
    assert (status == CERTIFIED).sum() >= 25
    # the exact projection: coordinate 0 free, 1 >= 0, and the cone {-e2, e2 - e3} on (2, 3)
    lam, status, _ = nnls_batch(N, A)
    p = np.einsum("bm,bmd->bd", lam, N)
    ok = status == CERTIFIED
    assert np.abs(p[ok, 0] - A[ok, 0]).max() <= 1e-14
    assert np.abs(p[ok, 1] - np.maximum(A[ok, 1], 0.0)).max() <= 1e-14


def test_inside_polar_and_zero():
    rng = np.random.default_rng(3)
    N = rng.standard_normal((3, 4, 6))
    mu = rng.uniform(0.5, 2.0, size=(3, 4))
    inside = np.einsum("bm,bmd->bd", mu, N)
    lam, status, _ = nnls_batch(N, inside)
    assert (status == CERTIFIED).all()
    p = np.einsum("bm,bmd->bd", lam, N)
    assert np.abs(p - inside).max() <= 1e-12 * np.abs(inside).max()  # a in K: p = a
    assert np.abs(lam - mu).max() <= 1e-10  # independent generators: lam unique
    # polar cone of the orthant, and zero: lam = 0 exactly
    eye = np.broadcast_to(np.eye(6), (3, 6, 6)).copy()
    for a in (-rng.uniform(0.1, 1.0, size=(3, 6)), np.zeros((3, 6))):
        lam, status, _ = nnls_batch(eye, a)
        assert (status == CERTIFIED).all() and (lam == 0).all()
    # p = 0 exactly when a is in the polar cone: a tiny positive inner product is a projection
    lam, status, _ = nnls_batch(np.eye(2)[None], np.array([[1e-30, -1.0]]))
    assert status[0] == CERTIFIED and lam[0, 0] == 1e-30 and lam[0, 1] == 0.0


def test_uncertified_samples_fall_back_to_scipy(monkeypatch):
    rng = np.random.default_rng(4)
    N = rng.standard_normal((25, 6, 6))
    A = rng.standard_normal((25, 6))
    # the start F = {n_i'a > 0} is wrong somewhere: one exchange is not enough there
    lam, status, _ = nnls_batch(N, A, max_iter=1)
    stopped = status == MAX_ITER
    assert stopped.sum() >= 3 and (lam[stopped] == 0).all()
    assert (nnls_batch(N, A)[2][stopped] >= 2).all()
    counted = []

    def capped(N_, A_, *, tol):
        counted.append(1)
        return nnls_batch(N_, A_, tol=tol, max_iter=1)

    monkeypatch.setattr(cave_module, "nnls_batch", capped)
    p, _, fallbacks = cave_module._cone_projection(torch.as_tensor(A), torch.as_tensor(N), 1e-12)
    assert counted and fallbacks == int(stopped.sum())
    for s in range(25):
        assert np.abs(p[s].numpy() - _scipy_projection(N[s], A[s])).max() <= 1e-12


def test_a_fallback_that_misses_the_kkt_conditions_warns(monkeypatch):
    N = np.broadcast_to(np.eye(3), (2, 3, 3)).copy()
    A = np.array([[1.0, -1.0, 2.0], [-1.0, -1.0, -1.0]])
    monkeypatch.setattr(
        cave_module, "nnls_batch", lambda N_, A_, *, tol: nnls_batch(N_, A_, tol=tol, max_iter=0)
    )
    # scipy's answer for sample 0 replaced by lam = 0 (w = (1, 0, 2) > 0: not optimal)
    monkeypatch.setattr(cave_module, "nnls", lambda M, b: (np.zeros(M.shape[1]), 0.0))
    with pytest.warns(DxoptWarning, match=r"1 sample\(s\) \(first: 0\).*KKT"):
        p, _, fallbacks = cave_module._cone_projection(
            torch.as_tensor(A), torch.as_tensor(N), 1e-12
        )
    assert fallbacks == 2 and (p == 0).all()


def test_cone_projection_refuses_bad_input():
    a, N = torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="cone_projection: expected a"):
        cone_projection(a, N[:, :, :2])
    with pytest.raises(ValueError, match="a"):
        cone_projection(torch.full((2, 3), float("nan"), dtype=torch.float64), N)
    with pytest.raises(ValueError, match="tol"):
        cone_projection(a, N, tol=-1.0)
