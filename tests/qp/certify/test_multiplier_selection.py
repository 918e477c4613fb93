"""Issue 35 item 2: one backend-independent multiplier selection at degenerate points, and the
backward's derivative of each returned entry is the derivative of what is returned.

(a) dependent equality rows ``A = [a1; a2; a1 + a2]``; (b) a duplicated active inequality row
(``P = I2``, two copies of ``x0 <= 1``). Before, daqp, auto and torch returned a vertex
(``[nu, 0]``, third equality multiplier 0) and piqp/clarabel an interior point's split, while
the backward differentiated the minimum-norm multipliers: per-entry derivatives off by up to
0.5. The reference multipliers are the closed form :math:`-(C^\\top)^+(Px + q)` (numpy's
pseudo-inverse, independent of the library), and each entry of the Jacobian (autograd) is
checked against kink-aware float64 one-sided finite differences of the returned entry. A
non-degenerate control keeps the backend's multipliers untouched, and a dependent set whose
minimum-norm multipliers leave the orthant keeps a valid selection and says so.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from tests.qp._fd import STEPS

import dxopt.qp as dqp
from dxopt.qp.certify.multipliers import select_multipliers

F64 = torch.float64
SOLVERS = ["auto", "daqp", "piqp", "clarabel", "torch", "dual_active_set"]


def _case_a(theta: torch.Tensor) -> dict[str, torch.Tensor]:
    """Dependent equality rows; theta = (q, b[:2]); b[2] = b[0] + b[1] keeps them consistent."""
    a1, a2 = torch.tensor([1.0, 1.0, 0.0], dtype=F64), torch.tensor([0.0, 1.0, 1.0], dtype=F64)
    q, b01 = theta[..., :3], theta[..., 3:]
    b = torch.cat([b01, b01.sum(-1, keepdim=True)], -1)
    return {"P": torch.eye(3, dtype=F64), "q": q, "A": torch.stack([a1, a2, a1 + a2]), "b": b}


def _case_b(theta: torch.Tensor) -> dict[str, torch.Tensor]:
    """Two copies of the active row x0 <= h; theta = (q, h0) with both copies at h0."""
    q, h0 = theta[..., :2], theta[..., 2:]
    G = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
    return {"P": torch.eye(2, dtype=F64), "q": q, "G": G, "h": torch.cat([h0, h0], -1)}


def _case_regular(theta: torch.Tensor) -> dict[str, torch.Tensor]:
    """Control: independent active rows x0 <= 1, x1 <= 1 and one equality (unique duals)."""
    G = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=F64)
    A = torch.tensor([[1.0, 1.0, 1.0]], dtype=F64)
    h = torch.tensor([1.0, 1.0, 5.0], dtype=F64)
    return {"P": torch.eye(3, dtype=F64), "q": theta, "G": G, "h": h, "A": A, "b": theta[..., :1]}


CASES = {
    "a": (_case_a, [0.3, -0.2, 0.5, 1.0, 2.0], "eq_duals"),
    "b": (_case_b, [-2.0, 0.5, 1.0], "ineq_duals"),
}


def _duals(case: Callable[..., dict[str, torch.Tensor]], key: str, solver: str) -> Callable:
    def f(theta: torch.Tensor) -> torch.Tensor:
        sol = dqp.solve(**case(theta), solver=solver)
        assert all(s == dqp.QPStatus.SOLVED for s in sol.status)
        return getattr(sol, key)

    return f


def _min_norm(data: dict[str, torch.Tensor], x: np.ndarray, key: str) -> np.ndarray:
    """The closed form -(C^T)^+ (P x + q) on the active rows (every row of A; the rows of G
    with zero slack), scattered back to the multiplier vector."""
    P, q = data["P"].numpy(), data["q"].numpy()
    r = -(P @ x + q)
    if key == "eq_duals":
        return np.linalg.pinv(data["A"].numpy().T) @ r
    G, h = data["G"].numpy(), data["h"].numpy()
    T = np.abs(h - G @ x) < 1e-9
    nu = np.zeros(G.shape[0])
    nu[T] = np.linalg.pinv(G[T].T) @ r
    return nu


def _check_jacobian(f: Callable[[torch.Tensor], torch.Tensor], theta: torch.Tensor) -> None:
    """Every entry of the autograd Jacobian against one-sided differences (both sides stable
    and equal here: the test points are off the kinks)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        J = torch.autograd.functional.jacobian(f, theta).reshape(-1, theta.numel())
        base = f(theta).detach().reshape(-1)
        flat = theta.reshape(-1)
        for j in range(flat.numel()):
            e = torch.zeros_like(flat)
            e[j] = 1.0
            sides = []
            for sign in (1.0, -1.0):
                rows = [
                    sign * (f((flat + sign * t * e).reshape(theta.shape)).reshape(-1) - base) / t
                    for t in STEPS
                ]
                quotients = torch.stack(rows)
                spread = (quotients.amax(0) - quotients.amin(0)).abs()
                assert bool((spread <= 1e-5 * (1 + quotients.abs().amax(0))).all()), (j, sign)
                sides.append(quotients[-1])
            torch.testing.assert_close(sides[0], sides[1], rtol=0, atol=1e-5)  # no kink here
            torch.testing.assert_close(J[:, j], sides[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("name", ["a", "b"])
def test_one_selection_and_its_exact_derivative(name: str, solver: str, batched: bool) -> None:
    case, theta0, key = CASES[name]
    theta = torch.tensor(theta0, dtype=F64)
    if batched:
        theta = torch.stack([theta, theta + 0.1])
    f = _duals(case, key, solver)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        sol = dqp.solve(**case(theta), solver=solver)
    rows = theta.reshape(-1, len(theta0))
    got, X = getattr(sol, key).reshape(len(rows), -1), sol.x.reshape(len(rows), -1)
    for k, row in enumerate(rows):
        ref = _min_norm(case(row), X[k].numpy(), key)
        np.testing.assert_allclose(got[k].numpy(), ref, rtol=0, atol=1e-7)
    _check_jacobian(f, theta)


def test_the_selection_is_backend_independent() -> None:
    for name in ("a", "b"):
        case, theta0, key = CASES[name]
        theta = torch.tensor(theta0, dtype=F64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
            duals = [getattr(dqp.solve(**case(theta), solver=s), key) for s in SOLVERS]
        for d in duals[1:]:
            torch.testing.assert_close(d, duals[0], rtol=0, atol=1e-7)


@pytest.mark.parametrize("solver", SOLVERS)
def test_independent_rows_keep_the_backend_multipliers(solver: str) -> None:
    """The control: LICQ holds, the multipliers are unique and not touched (the selection
    declines), and their Jacobian is exact."""
    theta = torch.tensor([-2.0, -3.0, 0.5], dtype=F64)
    data = _case_regular(theta)
    sol = dqp.solve(**data, solver=solver)
    args = [None if v is None else v.numpy() for v in (data["P"], data["q"], data["A"])]
    none = select_multipliers(
        *args, data["G"].numpy(), data["h"].numpy(), sol.x.numpy(), sol.eq_duals.numpy(),
        sol.ineq_duals.numpy(), eps_abs=1e-9, eps_rel=0.0,
    )  # fmt: skip
    assert none is None
    _check_jacobian(_duals(_case_regular, "ineq_duals", solver), theta)
    _check_jacobian(_duals(_case_regular, "eq_duals", solver), theta)
