"""Rows far smaller than ``eps_abs``: a known gap, kept visible (strict xfail: it must fail
until fixed).

The primal test is absolute at its floor (``eps_abs``, :mod:`dxopt.qp.certify.tolerances`): a
row of norm 1e-12 can be violated by 1.5e-13 (15% of its own size) and still pass at the
default ``eps_abs = 1e-9``. daqp and piqp stop there too; clarabel, and dxopt at
``eps_abs = 1e-16``, enforce the row. The point dxopt returns is 0.087 away from the solution
in x, with status SOLVED and no warning.
"""

from __future__ import annotations

import pytest
import torch

import dxopt.qp as dqp

F64 = torch.float64


def _problem() -> tuple[torch.Tensor, ...]:
    P = 2.0 * torch.eye(3, dtype=F64)
    q = torch.tensor([1.0, -2.0, 0.5], dtype=F64)  # unconstrained x = (-0.5, 1, -0.25)
    G = torch.tensor([[1e-12, 1e-12, 1e-12], [1.0, 0.0, 0.0]], dtype=F64)
    h = torch.tensor([0.1e-12, 5.0], dtype=F64)  # the first row cuts x off: sum(x) <= 0.1
    return P, q, G, h


def test_the_row_is_enforced_at_a_tight_tolerance() -> None:
    P, q, G, h = _problem()
    sol = dqp.solve(P, q, G=G, h=h, eps_abs=1e-16)
    expected = torch.tensor([-0.55, 0.95, -0.30], dtype=F64)  # projection onto sum(x) = 0.1
    torch.testing.assert_close(sol.x, expected, rtol=0, atol=1e-8)


@pytest.mark.xfail(strict=True, reason="a row of norm 1e-12 is within eps_abs at 15% violation")
def test_a_tiny_row_is_enforced_at_the_default_tolerance() -> None:
    P, q, G, h = _problem()
    sol = dqp.solve(P, q, G=G, h=h)
    expected = torch.tensor([-0.55, 0.95, -0.30], dtype=F64)
    torch.testing.assert_close(sol.x, expected, rtol=0, atol=1e-6)
