"""The exact reduction of the Jacobian (:mod:`dxopt.conic.reduce`): against ``pinv`` on
random systems with eliminated rows and decoupled variables, and in the backward, where a
structurally singular sample is solved through it instead of an SVD (issue 37 speed)."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.conic._problems import F64

import dxopt.conic as dc
from dxopt.conic import backward as bw
from dxopt.conic.forward import solve_forward
from dxopt.conic.kkt import jacobian
from dxopt.conic.problem import conic_problem
from dxopt.conic.reduce import reduce_jacobian, reduced_solve
from dxopt.conic.types import ConicOptions


def _system(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``J`` of ``k = 4`` samples (n = 5, m = 7) with random active sets, a dense 2 x 2 cone
    block in odd samples, and in even samples a variable that only inactive rows touch."""
    g = torch.Generator().manual_seed(seed)
    k, n, m = 4, 5, 7
    A = torch.randn(1, m, n, generator=g, dtype=F64)
    A[0, :, n - 1] = 0.0
    A[0, m - 1, n - 1], A[0, m - 2, n - 1] = 1.0, -1.0
    L = torch.randn(k, n, n, generator=g, dtype=F64)
    P = 0.1 * L @ L.transpose(-1, -2) + torch.eye(n, dtype=F64)
    D = torch.zeros(k, m, m, dtype=F64)
    for i in range(k):
        D[i] = torch.diag((torch.rand(m, generator=g) < 0.5).to(F64))
        if i % 2:
            D[i, :2, :2] = torch.tensor([[0.6, 0.2], [0.2, 0.3]], dtype=F64)
        else:  # variable n - 1 decoupled: no P entry, its rows inactive
            P[i, n - 1, :] = P[i, :, n - 1] = 0.0
            D[i, m - 2 :, :] = D[i, :, m - 2 :] = 0.0
    return jacobian(P, A, D), D, A, n


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("adjoint", [True, False])
def test_reduced_solve_is_the_minimum_norm_least_squares_solution(seed: int, adjoint: bool):
    J, D, A, n = _system(seed)
    red, Jr, _ = reduce_jacobian(J, D, A, n)
    assert red.has_z.tolist() == [True, False, True, False]
    assert bool(red.E[0].any()) and not red.trivial
    r = torch.randn(
        J.shape[0], J.shape[-1], generator=torch.Generator().manual_seed(seed), dtype=F64
    )

    def solve_r(rhs: torch.Tensor) -> torch.Tensor:
        M = Jr.transpose(-1, -2) if adjoint else Jr
        return torch.linalg.solve(M, rhs[..., None])[..., 0]

    z = reduced_solve(red, A, r, solve_r, adjoint=adjoint)
    M = J.transpose(-1, -2) if adjoint else J
    ref = (torch.linalg.pinv(M, rtol=1e-12) @ r[..., None])[..., 0]
    torch.testing.assert_close(z, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("batched_a", [False, True])
def test_structurally_singular_sample_is_solved_without_an_svd(monkeypatch, batched_a) -> None:
    """``t`` free in ``[-1, 1]`` and absent from the objective (sample 0), next to a regular
    sample with ``t`` held at its bound (sample 1): the backward must give ``pinv(J') g`` for
    sample 0 through the reduction (``lstsq`` is not called), flag it singular with condition
    ``inf``, and leave sample 1 regular (with ``A`` shared and one ``A`` per sample)."""
    c = torch.tensor([[0.3], [0.4]], dtype=F64)
    P = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    q = torch.cat([-c, torch.tensor([[0.0], [1.0]], dtype=F64)], dim=-1)
    A = torch.tensor([[0.0, 1.0], [0.0, -1.0], [1.0, 0.0]], dtype=F64)
    b = torch.tensor([1.0, 1.0, 10.0], dtype=F64)
    if batched_a:  # one A per sample (as CVXPY's data gives), only sample 0 singular
        A = A.expand(2, 3, 2).contiguous()
    prob = conic_problem(P, q, A, b, [dc.NonnegCone(3)], check_psd=True)
    state = solve_forward(prob, ConicOptions())

    def no_svd(*args: object, **kwargs: object) -> None:
        raise AssertionError("lstsq called")

    monkeypatch.setattr(torch.linalg, "lstsq", no_svd)
    gx = torch.tensor([[1.0, 0.5], [1.0, 0.5]], dtype=F64)  # 0.5 on t: inconsistent for 0
    zeros = torch.zeros(2, 3, dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        _, gq, _, gb = bw.adjoint_gradients(state, gx, zeros, zeros)
    info = state.info.backward
    assert info.singular == (True, False)
    assert info.condition[0] == float("inf") and info.condition[1] < 1e3
    sys = state.cache["system"]
    for i in range(2):
        gw = sys.D[i].T @ zeros[i] - zeros[i]
        u = torch.linalg.pinv(sys.J[i].T, rtol=bw.PINV_RTOL) @ torch.cat([gx[i], gw])
        torch.testing.assert_close(gq[i], -u[:2], atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(gb[i], u[2:], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(gq[0, 0], torch.tensor(-1.0, dtype=F64), atol=1e-12, rtol=0)
    # forward mode: pinv(J) dF
    dq = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
    dP = torch.zeros(1, 2, 2, dtype=F64)
    dA = torch.zeros(1, 3, 2, dtype=F64)
    db = torch.tensor([[0.1, 0.2, 0.3], [0.1, 0.2, 0.3]], dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        dx, _, _ = bw.tangents(state, dP, dq, dA, db)
    for i in range(2):
        rhs = torch.cat([dq[i], -db[i]])
        z = -torch.linalg.pinv(sys.J[i], rtol=bw.PINV_RTOL) @ rhs
        torch.testing.assert_close(dx[i], z[:2], atol=1e-12, rtol=1e-10)


def test_decoupled_polish_takes_chord_steps_with_its_reduced_factor(monkeypatch) -> None:
    """``max c'x`` on the unit ball next to a free ``t`` in ``[-1, 1]`` (decoupled: ``J`` is
    singular through ``t`` only), polished from a point 1e-4 off the solution: the first
    round's reduced Newton step leaves ``F`` near 1e-8, the later ones are chord steps with
    that round's reduced LU (one reduction in all, where every round used to build its own),
    and the point ends at round-off: ``x = c / |c|``, ``F`` below the polish's floor."""
    from dxopt.conic import certify, polish
    from dxopt.conic.kkt import project_dual, residual_map

    c = torch.tensor([0.6, -0.8], dtype=F64) * 1.3
    P = torch.zeros(3, 3, dtype=F64)
    q = torch.cat([-c, torch.zeros(1, dtype=F64)])
    A = torch.tensor([[0, 0, 0], [-1, 0, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], dtype=F64)
    b = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0], dtype=F64)
    cones = [dc.SecondOrderCone(3), dc.NonnegCone(2)]
    prob = conic_problem(P, q, A, b, cones, check_psd=True)
    x_star = torch.cat([c / c.norm(), torch.zeros(1, dtype=F64)])
    y_star = torch.cat([c.norm()[None], -c, torch.zeros(2, dtype=F64)])  # the SOC multiplier
    s_star = b - A @ x_star
    g = torch.Generator().manual_seed(0)
    x0 = (x_star + 1e-4 * torch.randn(3, generator=g, dtype=F64))[None]
    w0 = (y_star - s_star + 1e-4 * torch.randn(5, generator=g, dtype=F64))[None]
    calls: list[int] = []
    original = polish.reduce_jacobian

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(polish, "reduce_jacobian", counted)
    data = certify.subset(prob, [0])
    y0 = project_dual(prob.cones, prob.slices, w0)
    f0 = residual_map(*data, y0, x0, w0).abs().amax()
    x, w, y, polished, _ = polish.polish(prob, data, x0, w0)
    F = residual_map(*data, y, x, w)
    assert bool(polished[0]) and f0 > 1e-6
    assert len(calls) == 1
    assert F.abs().amax() <= polish.POLISH_ROUNDOFF * 2.0
    torch.testing.assert_close(x[0, :2], x_star[:2], atol=1e-14, rtol=0)
