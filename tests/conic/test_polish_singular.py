"""The polish on a singular Jacobian: entropic optimal transport, whose marginal equalities
are redundant (the duals are not unique), must certify at tight tolerances (issue 37)."""

from __future__ import annotations

import math

import torch

import dxopt.conic as dc

D = torch.float64


def _entropic_ot(reg: float) -> tuple[torch.Tensor, ...]:
    """``min <C, T> - reg sum entr(T)`` s.t. row and column sums ``1/3``; variables
    ``x = (T (9), v (9))`` with ``(v_ij, T_ij, 1)`` in the exponential cone (``v <= entr``)."""
    n = 3
    C = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 1.5], [2.0, 1.5, 0.0]], dtype=D)
    q = torch.cat([C.reshape(-1), torch.full((n * n,), -reg, dtype=D)])
    rows = []
    for i in range(n):  # row sums, then column sums
        rows.append([1.0 if k // n == i else 0.0 for k in range(n * n)])
    for j in range(n):
        rows.append([1.0 if k % n == j else 0.0 for k in range(n * n)])
    eq = torch.tensor(rows, dtype=D)
    A = torch.zeros(2 * n + 3 * n * n, 2 * n * n, dtype=D)
    b = torch.zeros(2 * n + 3 * n * n, dtype=D)
    A[: 2 * n, : n * n] = eq
    b[: 2 * n] = 1.0 / n
    for k in range(n * n):
        r0 = 2 * n + 3 * k
        A[r0, n * n + k] = -1.0  # s_r = v
        A[r0 + 1, k] = -1.0  # s_s = T
        b[r0 + 2] = 1.0  # s_t = 1
    cones = [dc.ZeroCone(2 * n)] + [dc.ExpCone() for _ in range(n * n)]
    return C, q, A, b, cones


def _closed_form(C: torch.Tensor, reg: float) -> torch.Tensor:
    """Sinkhorn to convergence: ``T = diag(u) exp(-C / reg) diag(v)`` with the marginals."""
    K = torch.exp(-C / reg)
    a = torch.full((3,), 1.0 / 3, dtype=D)
    u = torch.ones(3, dtype=D)
    for _ in range(5000):
        v = a / (K.T @ u)
        u = a / (K @ v)
    return u[:, None] * K * v[None, :]


def test_entropic_ot_certifies_at_1e_minus_9() -> None:
    reg = 0.1
    C, q, A, b, cones = _entropic_ot(reg)
    sol = dc.solve(None, q, A, b, cones=cones, atol=1e-9, rtol=1e-9)
    assert sol.status[0].ok
    assert sol.info.primal_residual[0] <= 1e-9 and sol.info.dual_residual[0] <= 1e-9
    T = sol.x[:9].reshape(3, 3)
    T_ref = _closed_form(C, reg)
    torch.testing.assert_close(T, T_ref, atol=1e-9, rtol=1e-6)
    # the entropy term's multiplier: v_ij = entr(T_ij) at the optimum
    v = sol.x[9:].reshape(3, 3)
    torch.testing.assert_close(v, -T_ref * torch.log(T_ref), atol=1e-9, rtol=1e-6)
    assert math.isfinite(float(sol.x.sum()))


def test_polish_batch_with_converged_samples_sdp() -> None:
    """A batch where some samples are at round-off before others: the inactive samples' steps
    must not reach the PSD projection as NaN (eigh raised on batch element 30 of 32)."""
    import pytest

    pytest.importorskip("cvxpy")
    from benchmarks.conic import peers
    from benchmarks.conic.problems import cone_data, sdp

    P, q, A, b, cones = peers.dxopt_data(cone_data(sdp(32, seed=0)))
    sol = dc.solve(P, q, A, b, cones=cones, atol=1e-8, rtol=1e-8)
    assert all(st.ok for st in sol.status)
    assert max(sol.info.primal_residual) <= 1e-8


def test_entropic_ot_later_polish_rounds_are_chord_steps_with_the_regularised_lu(
    monkeypatch,
) -> None:
    """The redundant marginals make the plain step fail: the first round takes the
    regularised step; the next rounds try chord steps with that round's LU of
    :math:`J + \\delta I` (a plain chord with the singular ``J`` fails, as its Newton step
    did), so the polish builds one Jacobian, where it used to build one per round, and still
    ends at round-off with the Sinkhorn answer."""
    from dxopt.conic import polish

    built: list[int] = []
    original = polish.jacobian

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(polish, "jacobian", counted)
    reg = 0.1
    C, q, A, b, cones = _entropic_ot(reg)
    sol = dc.solve(None, q, A, b, cones=cones, atol=1e-9, rtol=1e-9)
    assert sol.status[0].ok and sol.info.polished[0]
    assert len(built) == 1
    assert sol.info.primal_residual[0] <= 1e-13 and sol.info.dual_residual[0] <= 1e-13
    torch.testing.assert_close(sol.x[:9].reshape(3, 3), _closed_form(C, reg), atol=1e-9, rtol=1e-6)
