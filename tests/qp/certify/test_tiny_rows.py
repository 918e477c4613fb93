"""Rows far smaller than ``eps_abs`` are enforced (:func:`dxopt.qp.certify.tolerances.row_floor`).

A row of norm 1e-12 violated by 1.5e-13 (15% of its own size) used to pass at the default
``eps_abs = 1e-9``: the absolute floor made the row vacuous, and dxopt returned a point 0.087
away from the solution as SOLVED, silently (daqp and piqp stop there). A *tiny row*
(:math:`0 < \\|g_i\\|_\\infty < 1` and own scale :math:`\\max((|G||x|)_i, |h_i|) <
\\varepsilon_{abs}`) now has the absolute part :math:`\\varepsilon_{abs}\\|g_i\\|_\\infty` (its
violation over its norm within ``eps_abs``): every certificate rejects the point, the polish adds
the row, and every route returns the solution with the exact gradient. Rows of norm 1e-6 or
1e6, unit rows at a solution near 0 and zero rows are judged as before.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.certify import polish as _polish
from dxopt.qp.certify import torch_certify as _torch_certify
from dxopt.qp.certify.tolerances import RELATIVE_FLOOR, ROUNDOFF, row_floor
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.problem.types import QPStatus
from dxopt.qp.solvers.kernels import batch as _kbatch
from dxopt.qp.solvers.kernels import certify as _kcertify

F64 = torch.float64
EPS_ABS = 1e-9  # the default
EXPECTED = torch.tensor([-0.55, 0.95, -0.30], dtype=F64)  # projection onto sum(x) = 0.1
UNCONSTRAINED = torch.tensor([-0.5, 1.0, -0.25], dtype=F64)


def _problem() -> tuple[torch.Tensor, ...]:
    P = 2.0 * torch.eye(3, dtype=F64)
    q = torch.tensor([1.0, -2.0, 0.5], dtype=F64)  # unconstrained x = (-0.5, 1, -0.25)
    G = torch.tensor([[1e-12, 1e-12, 1e-12], [1.0, 0.0, 0.0]], dtype=F64)
    h = torch.tensor([0.1e-12, 5.0], dtype=F64)  # the first row cuts x off: sum(x) <= 0.1
    return P, q, G, h


ROUTES: dict[str, dict[str, Any]] = {
    "lean": {},
    "general_daqp": {"solver": "daqp", "check_psd": False},
    "device": {"solver": "torch"},
    "clarabel": {"solver": "clarabel"},
    "piqp": {"solver": "piqp"},
    "proxqp": {"solver": "proxqp"},
    "osqp": {"solver": "osqp"},
}


def _installed(options: dict[str, Any]) -> None:
    solver = options.get("solver")
    if solver is not None and solver != "torch":
        import qpsolvers

        if solver not in qpsolvers.available_solvers:
            pytest.skip(f"{solver} is not installed")


def test_the_row_is_enforced_at_a_tight_tolerance() -> None:
    P, q, G, h = _problem()
    sol = dqp.solve(P, q, G=G, h=h, eps_abs=1e-16)
    torch.testing.assert_close(sol.x, EXPECTED, rtol=0, atol=1e-8)


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_tiny_row_is_enforced_at_the_default_tolerance(route: str, batch: bool) -> None:
    """The solution, and the exact gradient of ``sum(x)``: with ``P = 2I`` and the row ``g``
    active, :math:`x = -q/2 + g(g^\\top q + 2h_1)/(2g^\\top g)`, so
    :math:`\\partial\\,\\mathrm{sum}(x)/\\partial q = -\\tfrac12 + (g^\\top 1) g/(2g^\\top g) = 0`
    and :math:`\\partial\\,\\mathrm{sum}(x)/\\partial h = (g^\\top 1/g^\\top g,\\ 0) =
    (10^{12}, 0)`."""
    _installed(ROUTES[route])
    data = [t.expand(2, *t.shape).clone() if batch else t.clone() for t in _problem()]
    q, h = data[1].requires_grad_(), data[3].requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # backends' own chatter
        sol = dqp.solve(data[0], q, G=data[2], h=h, **ROUTES[route])
    assert all(s is QPStatus.SOLVED for s in sol.status), sol.status
    torch.testing.assert_close(sol.x.detach(), EXPECTED.expand_as(sol.x), rtol=0, atol=1e-8)
    sol.x.sum().backward()
    assert q.grad is not None and h.grad is not None
    torch.testing.assert_close(q.grad, torch.zeros_like(q), rtol=0, atol=1e-6)
    want_h = torch.tensor([1e12, 0.0], dtype=F64).expand_as(h)
    torch.testing.assert_close(h.grad, want_h, rtol=1e-6, atol=1e-6)


def test_a_tiny_equality_row_is_enforced() -> None:
    P, q, G, h = _problem()
    for options in (ROUTES["lean"], ROUTES["general_daqp"], ROUTES["device"]):
        sol = dqp.solve(P, q, A=G[:1], b=h[:1], G=G[1:], h=h[1:], **options)
        torch.testing.assert_close(sol.x, EXPECTED, rtol=0, atol=1e-8)


# --- each route's certificate, on the same two points -------------------------------------


def _verdicts(x: np.ndarray, nu: np.ndarray) -> dict[str, bool]:
    """Each certificate's verdict on ``(x, nu)`` for :func:`_problem` at the default
    tolerances (``eps_rel = 0``: the relative floor)."""
    P, q, G, h = (t.numpy() for t in _problem())
    m, n = G.shape
    g_inf = np.abs(G).max(1)
    out: dict[str, bool] = {}
    scratch = (np.empty(n), np.empty(0), np.empty(m))
    ok, _, _ = _kcertify.certify_point(
        P, q, G, h, m, x, nu, np.zeros(0, np.bool_), g_inf, EPS_ABS, RELATIVE_FLOOR, ROUNDOFF,
        *scratch,
    )  # fmt: skip
    out["lean_single"] = bool(ok)
    out["lean_batch"] = bool(
        _kbatch.certify_batch(
            P[None], q[None], G[None], h[None], m, x[None], nu[None], g_inf[None], EPS_ABS,
            RELATIVE_FLOOR, ROUNDOFF, np.zeros(1, np.int64), np.empty((1, n)), np.empty((1, 0)),
            np.empty((1, m)), np.zeros(1), np.zeros(1),
        )
    )  # fmt: skip
    none = np.zeros(0)
    cert = _polish.certify(_polish._make(P, q, None, None, G, h, EPS_ABS, 0.0), x, none, nu)
    out["general"] = cert.ok
    problem = canonical_problem(*(torch.tensor(v) for v in (P, q)), None, None, *_problem()[2:])
    accepted = _polish.batch_accept_exact(
        problem, x[None], np.zeros((1, 0)), nu[None], g_inf, eps_abs=EPS_ABS, eps_rel=0.0
    )
    out["general_batch"] = bool(accepted.ok[0])
    T = [torch.tensor(v)[None] for v in (P, q, np.zeros((0, n)), np.zeros(0), G, h)]
    out["device"] = bool(
        _torch_certify.certify(
            *T, torch.tensor(x)[None], torch.zeros(1, 0, dtype=F64), torch.tensor(nu)[None],
            EPS_ABS, 0.0,
        )[0]
    )  # fmt: skip
    return out


def test_every_certificate_rejects_the_point_that_ignores_the_tiny_row() -> None:
    verdicts = _verdicts(UNCONSTRAINED.numpy(), np.zeros(2))
    assert not any(verdicts.values()), verdicts


def test_every_certificate_accepts_the_solution() -> None:
    # P x + q + nu g = 0 at x = EXPECTED: nu = 0.1 / 1e-12
    verdicts = _verdicts(EXPECTED.numpy(), np.array([0.1 / 1e-12, 0.0]))
    assert all(verdicts.values()), verdicts


def test_the_polish_adds_the_tiny_row() -> None:
    P, q, G, h = (t.numpy() for t in _problem())
    out = _polish.polish(
        P, q, None, None, G, h, UNCONSTRAINED.numpy(), np.zeros(0), np.zeros(2),
        eps_abs=EPS_ABS, eps_rel=0.0,
    )  # fmt: skip
    assert out.polished and out.certificate.ok and out.active.tolist() == [True, False]
    np.testing.assert_allclose(out.x, EXPECTED.numpy(), rtol=0, atol=1e-12)
    P_t, q_t, G_t, h_t = (torch.tensor(v)[None] for v in (P, q, G, h))
    x_t, z_t = UNCONSTRAINED[None], torch.zeros(1, 2, dtype=F64)
    none = torch.zeros(1, 2, dtype=torch.bool)
    new = _torch_certify.polish_update(P_t, q_t, G_t, h_t, x_t, z_t, none, eps_abs=EPS_ABS)
    assert new.tolist() == [[True, False]]


# --- what stays as it was ---------------------------------------------------------------------


def test_the_floor_applies_only_below_eps_abs_and_to_rows_of_norm_below_one() -> None:
    scale = np.array([5e-10, 2e-9, 5e-10, 5e-10, 0.0])
    norm = np.array([1e-12, 1e-12, 1.0, 0.0, 1e-3])
    want = np.array([1e-21, 1e-9, 1e-9, 1e-9, 1e-12])
    np.testing.assert_allclose(row_floor(EPS_ABS, scale, norm), want, rtol=1e-15)
    got = row_floor(EPS_ABS, torch.tensor(scale), torch.tensor(norm))
    torch.testing.assert_close(got, torch.tensor(want, dtype=F64), rtol=1e-15, atol=0)


def test_rows_of_norms_1e_6_and_1e6_are_not_tiny() -> None:
    """The badly scaled but ordinary problem: at its solution no row's floor moves."""
    rng = np.random.default_rng(0)
    G = rng.standard_normal((8, 5)) * np.where(np.arange(8) % 2 == 0, 1e-6, 1e6)[:, None]
    x = rng.standard_normal(5)
    h = G @ x + np.abs(G).max(1) * rng.uniform(0.0, 1.0, 8)
    own = np.maximum(np.abs(G) @ np.abs(x), np.abs(h))
    assert (row_floor(EPS_ABS, own, np.abs(G).max(1)) == EPS_ABS).all()


@pytest.mark.parametrize("route", ["lean", "general_daqp", "device", "clarabel"])
def test_small_rows_at_a_solution_at_zero_still_solve(route: str) -> None:
    """Every row has norm 1e-3 and own scale 0 at the solution ``x = 0`` (all tiny): a backend's
    point near 0 is not poisoned into a failure; the solution and its gradient are exact."""
    _installed(ROUTES[route])
    rng = np.random.default_rng(1)
    n, m = 5, 4
    G = 1e-3 * rng.standard_normal((m, n))
    nu = np.array([1.0, 2.0, 0.0, 0.0]) * 1e3  # rows 0, 1 active with multipliers
    q = -(G.T @ nu)  # x = 0 is optimal for P = I, h = 0
    h = np.zeros(m)
    qt, ht = torch.tensor(q, requires_grad=True), torch.tensor(h, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sol = dqp.solve(torch.eye(n, dtype=F64), qt, G=torch.tensor(G), h=ht, **ROUTES[route])
    assert sol.status[0] is QPStatus.SOLVED, sol.status
    assert float(sol.x.detach().abs().max()) <= 1e-9
    sol.x.sum().backward()
    # exact: x = -(I - Ga' (Ga Ga')^-1 Ga) q + Ga' (Ga Ga')^-1 h_a on the active rows
    Ga = G[:2]
    K = np.linalg.solve(Ga @ Ga.T, Ga)
    w = np.ones(n)
    np.testing.assert_allclose(qt.grad.numpy(), -(w - K.T @ (Ga @ w)), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(ht.grad.numpy()[:2], K @ w, rtol=1e-6)
    np.testing.assert_allclose(ht.grad.numpy()[2:], 0.0, atol=1e-6)


DEGENERATE = {  # G rows (x 1e-12 where tiny) and h; each enforces sum(x) <= 0.1 or is infeasible
    "duplicated": ([[1e-12] * 3, [1e-12] * 3, [1.0, 0.0, 0.0]], [0.1e-12, 0.1e-12, 5.0]),
    "parallel_to_a_unit_row": ([[1e-12] * 3, [1.0] * 3], [0.1e-12, 0.1]),
    "opposite": ([[1e-12] * 3, [-1e-12] * 3], [0.1e-12, -0.1e-12]),
    "infeasible": ([[1e-12] * 3, [-1e-12] * 3], [0.1e-12, -0.2e-12]),
}


@pytest.mark.parametrize("route", ["lean", "general_daqp", "device"])
@pytest.mark.parametrize("case", list(DEGENERATE))
def test_degenerate_tiny_rows(case: str, route: str) -> None:
    """Duplicated, parallel and opposite tiny rows: the solution, and the derivative along the
    direction that moves the bound ``sum(x) <= c`` of every row that holds it by the same
    amount (``h_i`` by ``g_i``'s scale times ``d``, with the row's sign), which does not depend
    on how the degenerate rule splits the gradient among the rows: ``d sum(x) / dc = 1``. An
    infeasible pair is reported infeasible."""
    P, q, _, _ = _problem()
    rows, rhs = DEGENERATE[case]
    G, h = torch.tensor(rows, dtype=F64), torch.tensor(rhs, dtype=F64).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # QPDegenerateWarning: the degenerate rule is used
        sol = dqp.solve(P, q, G=G, h=h, on_failure="nan", **ROUTES[route])
    if case == "infeasible":
        assert sol.status[0] is QPStatus.INFEASIBLE, sol.status
        return
    assert sol.status[0] is QPStatus.SOLVED, sol.status
    torch.testing.assert_close(sol.x, EXPECTED, rtol=0, atol=1e-8)
    sol.x.sum().backward()
    assert h.grad is not None
    # row i holds c = sign_i h_i / scale_i: dh_i = sign_i scale_i dc
    scale = torch.tensor([1e-12 if abs(r[0]) < 1 else 1.0 for r in rows], dtype=F64)
    sign = torch.tensor([1.0 if r[0] > 0 else -1.0 for r in rows], dtype=F64)
    holds = torch.tensor([r[0] > 0 and rhs[i] < 1.0 for i, r in enumerate(rows)])
    if case == "opposite":  # the equality pair: both rows hold it
        holds = torch.ones(2, dtype=torch.bool)
    directional = float((h.grad * sign * scale * holds).sum())
    assert abs(directional - 1.0) <= 1e-6, (h.grad, directional)
