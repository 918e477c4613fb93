"""Per-sample statuses: infeasible and unbounded samples in a batch (with checked
certificates), on_failure, and certificates that must not be accepted."""

from __future__ import annotations

import warnings

import pytest
import torch

import dxopt.conic as dc
from dxopt import Status
from dxopt.conic.certify import certify_infeasible, certify_unbounded
from dxopt.conic.problem import conic_problem

from ._problems import F64

# x in R^2; rows: x1 <= h1, -x1 <= h2 (nonneg), then min q'x
A = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=F64)
CONES = [dc.NonnegCone(4)]


def _batch():
    # sample 0: feasible box; sample 1: x1 <= -1 and x1 >= 1 (infeasible); sample 2: LP with
    # the second coordinate unbounded below (no lower bound on x2 and q2 > 0)
    b = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1e9]])
    b = b.to(F64)
    b[2, 3] = 0.0
    A3 = A.expand(3, -1, -1).clone()
    A3[2, 3] = 0.0  # drop the lower bound of x2 in sample 2
    q = torch.tensor([[1.0, -1.0], [1.0, 1.0], [0.0, 1.0]], dtype=F64)
    return q, A3, b


def test_infeasible_and_unbounded_samples_get_their_status_with_nan_outputs():
    q, A3, b = _batch()
    q = q.clone().requires_grad_(True)
    sol = dc.solve(None, q, A3, b, cones=CONES, on_failure="nan")
    assert sol.status == (Status.SOLVED, Status.INFEASIBLE, Status.UNBOUNDED)
    assert torch.allclose(sol.x[0], torch.tensor([-1.0, 1.0], dtype=F64), atol=1e-9)
    assert torch.isnan(sol.x[1:]).all() and torch.isnan(sol.y[1:]).all()
    (grad,) = torch.autograd.grad(sol.x[0].sum(), q)
    assert torch.equal(grad[1:], torch.zeros(2, 2, dtype=F64))


def test_on_failure_raise_names_the_samples_and_warn_warns():
    q, A3, b = _batch()
    with pytest.raises(dc.ConicSolveError, match="1: infeasible, 2: unbounded") as err:
        dc.solve(None, q, A3, b, cones=CONES)
    assert err.value.failed_indices == (1, 2)
    with pytest.warns(Warning, match="no certified solution"):
        sol = dc.solve(None, q, A3, b, cones=CONES, on_failure="warn")
    assert sol.status[1] is Status.INFEASIBLE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = dc.solve(None, q, A3, b, cones=CONES, on_failure="ignore")
    assert not sol.ok


def test_certificates_that_do_not_check_are_refused():
    q, A3, b = _batch()
    prob = conic_problem(None, q, A3, b, CONES, check_psd=True)
    # a valid Farkas vector for sample 1: y = (1, 1, 0, 0): A'y = 0, b'y = -2 < 0
    good = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=F64)
    assert certify_infeasible(prob, [1], good, 1e-8).tolist() == [True]
    # the same vector is no certificate for the feasible sample 0 (b'y = 2 > 0)
    assert certify_infeasible(prob, [0], good, 1e-8).tolist() == [False]
    # A'y != 0: refused
    assert certify_infeasible(
        prob, [1], good * torch.tensor([[1.0, 0.5, 0, 0]], dtype=F64), 1e-8
    ).tolist() == [False]
    # a direction d = (0, -1) improves sample 2 (q'd = -1, -Ad in K); not sample 0
    d = torch.tensor([[0.0, -1.0]], dtype=F64)
    assert certify_unbounded(prob, [2], d, 1e-8).tolist() == [True]
    assert certify_unbounded(prob, [0], d, 1e-8).tolist() == [False]


def test_max_iter_is_reported_not_accepted():
    q, A3, b = _batch()
    sol = dc.solve(None, q[:1], A3[:1], b[:1], cones=CONES, max_iter=1, fallback=False,
                   polish=False, on_failure="ignore")  # fmt: skip
    assert sol.status == (Status.MAX_ITER,)
    assert sol.info.failures[0] and "clarabel (max_iter)" in sol.info.failures[0][0]
