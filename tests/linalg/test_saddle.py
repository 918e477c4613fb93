"""Saddle-point solves of dxopt.linalg.sparse: regular, singular-consistent, inconsistent."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dxopt.linalg import FactorizationError, lstsq_saddle, saddle_solve, splu


@pytest.mark.parametrize("sparse", [False, True])
def test_regular_system_matches_a_direct_solve(sparse: bool):
    rng = np.random.default_rng(0)
    M = rng.standard_normal((6, 6))
    P, C = M @ M.T + np.eye(6), rng.standard_normal((2, 6))
    K = np.block([[P, C.T], [C, np.zeros((2, 2))]])
    r = rng.standard_normal(8)
    Pm, Cm = (sp.csr_matrix(P), sp.csr_matrix(C)) if sparse else (P, C)
    z, info = saddle_solve(Pm, Cm, r)
    assert info.converged and info.residual <= 1e-13
    np.testing.assert_allclose(z, np.linalg.solve(K, r), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
def test_duplicated_rows_converge_to_a_solution_near_the_minimum_norm_one(sparse: bool):
    P = np.diag([2.0, 1.0, 3.0])
    C = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # LICQ fails
    r = np.array([1.0, -1.0, 0.5, 0.3, 0.3])  # consistent: equal right-hand sides
    Pm, Cm = (sp.csr_matrix(P), sp.csr_matrix(C)) if sparse else (P, C)
    z, info = saddle_solve(Pm, Cm, r)
    assert info.converged
    K = np.block([[P, C.T], [C, np.zeros((2, 2))]])
    assert np.linalg.norm(K @ z - r) <= 1e-12 * np.linalg.norm(r)
    ref = np.linalg.pinv(K) @ r
    np.testing.assert_allclose(z[:3], ref[:3], rtol=1e-10, atol=1e-12)  # x part is unique
    # the multiplier part is the minimum-norm one up to the regularisation (relative 1e-8)
    np.testing.assert_allclose(z[3:], ref[3:], rtol=1e-7, atol=0)


def test_inconsistent_system_is_reported_and_lstsq_gives_the_pseudo_inverse():
    P = np.diag([1.0, 0.0])  # singular on the null space of C = []
    C = np.zeros((0, 2))
    r = np.array([1.0, 2.0])  # not in range(P)
    z, info = saddle_solve(P, C, r)
    assert not info.converged and info.residual > 0.1
    z, normal = lstsq_saddle(P, C, r)
    np.testing.assert_allclose(z, [1.0, 0.0], atol=1e-12)
    assert normal <= 1e-12


def test_splu_maps_singular_factor_to_factorization_error():
    with pytest.raises(FactorizationError, match="sparse LU of the test matrix failed"):
        splu(sp.csc_matrix(np.zeros((3, 3))), what="test matrix")
