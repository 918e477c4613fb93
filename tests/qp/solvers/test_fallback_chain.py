"""The fallback chain's stopping tolerances: what each backend is asked for, and when the
looser-tolerance attempt runs (``dxopt.qp.solvers.chain``)."""

from __future__ import annotations

import dataclasses

import pytest
import qpsolvers
import torch

import dxopt.qp as dqp
import dxopt.qp.solvers.backends as backends
import dxopt.qp.solvers.forward as fwd

pytestmark = pytest.mark.skipif(
    not {"piqp", "clarabel"} <= set(qpsolvers.available_solvers), reason="needs piqp and clarabel"
)


def _scaled_qp(scale: float, n: int = 40, m: int = 30) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    M = torch.randn(n, n, generator=g, dtype=torch.float64)
    P = (M @ M.T / n + torch.eye(n, dtype=torch.float64)) * scale
    q = torch.randn(n, generator=g, dtype=torch.float64) * scale
    G = torch.randn(m, n, generator=g, dtype=torch.float64)
    h = torch.rand(m, generator=g, dtype=torch.float64)
    return P, q, G, h


@pytest.mark.parametrize("solver", ["piqp", "osqp", "proxqp", "scs", "clarabel"])
def test_relative_tolerance_never_below_the_floor(solver: str) -> None:
    kw = fwd.backend_kwargs(solver, 1e-9, 0.0, None)
    rel = kw.get("eps_rel", kw.get("tol_gap_rel"))
    assert rel == fwd.BACKEND_RELATIVE_FLOOR
    kw = fwd.backend_kwargs(solver, 1e-9, 1e-6, None)
    assert kw.get("eps_rel", kw.get("tol_gap_rel")) == 1e-6
    # the user's own setting wins
    key = "eps_rel" if "eps_rel" in kw else "tol_gap_rel"
    assert fwd.backend_kwargs(solver, 1e-9, 0.0, {key: 0.0})[key] == 0.0


@pytest.mark.parametrize("scale", [1.0, 1e4, 1e8, 1e10])
def test_badly_scaled_sparse_qp_is_solved_by_the_requested_backend(scale: float) -> None:
    """At scale 1e8 an absolute 1e-9 is below round-off; piqp must stop (relative floor) and
    its polished point must match the dense daqp solution."""
    P, q, G, h = _scaled_qp(scale)
    sol = dqp.solve(P.to_sparse_csr(), q, G=G.to_sparse_csr(), h=h, solver="piqp")
    assert sol.status[0] is dqp.QPStatus.SOLVED
    assert sol.info.sample_solvers == ("piqp",)
    ref = dqp.solve(P, q, G=G, h=h, solver="daqp")
    assert torch.allclose(sol.x, ref.x, rtol=1e-8, atol=1e-8 * float(ref.x.abs().max()))


def test_looser_attempt_skipped_when_the_strict_point_certified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A strict point certified by its duality gap only (unsettled) sends the sample on along
    the chain, but not to the same backend at a looser stop, which cannot settle it; with no
    settled point anywhere, the first gap-certified point is kept."""
    calls: list[tuple[str, float]] = []
    real_solve, real_polish = qpsolvers.solve_problem, backends.polish_solution

    def solve_problem(problem, solver, **kw):  # type: ignore[no-untyped-def]
        calls.append((solver, kw.get("eps_abs", kw.get("tol_feas", kw.get("primal_tol")))))
        return real_solve(problem, solver=solver, **kw)

    def unsettled_polish(*args, **kw):  # type: ignore[no-untyped-def]
        res = real_polish(*args, **kw)
        cert = dataclasses.replace(res.certificate, complementarity=5.0, gap=0.0)
        assert cert.ok and not cert.settled
        return dataclasses.replace(res, certificate=cert)

    monkeypatch.setattr(qpsolvers, "solve_problem", solve_problem)
    monkeypatch.setattr(backends, "polish_solution", unsettled_polish)
    P, q, G, h = _scaled_qp(1.0)
    sol = dqp.solve(P.to_sparse_csr(), q, G=G.to_sparse_csr(), h=h, solver="piqp")
    assert sol.status[0] is dqp.QPStatus.SOLVED
    assert sol.info.sample_solvers == ("piqp",) and sol.info.sample_tolerances == (1e-9,)
    assert [c[0] for c in calls if c[0] != "daqp"] == ["piqp", "clarabel"]
    assert all(tol == 1e-9 for _, tol in calls if tol is not None)
