"""Forward mode on dependent active rows (issue 28, item 2): the jvp is exactly the transpose of
the vjp for every degenerate rule, jacfwd equals jacrev, the forward value lies between the
one-sided derivatives, and the warning names the dependent rows, not a singular P.

The problem: min 1/2 x'Px + q'x s.t. x1 <= h1, x2 <= h2, x1 + x2 <= h3 (the third row is the sum
of the other two), at h = 0 all three active, P positive definite; a free third variable with
an equality row x3 = b keeps the equality part of the rule in play.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from tests.qp._fd import one_sided
from torch.func import jacfwd, jacrev, jvp, vjp

import dxopt.qp as dqp

F64 = torch.float64
P = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 1.5]], dtype=F64)
Q = torch.tensor([-1.0, -2.0, 0.4], dtype=F64)
G = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=F64)
H = torch.zeros(3, dtype=F64)
A = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64)
B = torch.tensor([0.5], dtype=F64)
POLICIES = ("auto", "vertex", "min_norm")
METHODS = (dqp.KKTBackward, dqp.PenaltyBackward)


def _outputs(method, policy: str):
    backward = method(degenerate=policy)

    def f(q, G, h, b):
        sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, backward=backward)
        return torch.cat([sol.x, sol.ineq_duals, sol.eq_duals])

    return f


@pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("method", METHODS)
def test_jacfwd_equals_jacrev_on_dependent_rows(method, policy: str) -> None:
    f = _outputs(method, policy)
    args = (Q, G, H, B)
    for k in range(4):
        rev = jacrev(f, argnums=k)(*args)
        fwd = jacfwd(f, argnums=k)(*args)
        torch.testing.assert_close(fwd, rev, atol=1e-8, rtol=1e-8, msg=f"argument {k}")


@pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("method", METHODS)
def test_jvp_is_the_transpose_of_the_vjp(method, policy: str) -> None:
    f = _outputs(method, policy)
    gen = torch.Generator().manual_seed(3)
    args = (Q, G, H, B)
    for _ in range(3):
        tangents = tuple(torch.randn(a.shape, generator=gen, dtype=F64) for a in args)
        out, dout = jvp(f, args, tangents)
        full = torch.randn(out.shape, generator=gen, dtype=F64)
        x_only = torch.cat([full[:3], torch.zeros(out.shape[0] - 3, dtype=F64)])
        for cot in (full, x_only):  # the rule must not depend on which outputs are seeded
            _, pull = vjp(f, *args)
            grads = pull(cot)
            lhs = float(cot @ dout)
            rhs = sum(float((g * t).sum()) for g, t in zip(grads, tangents))
            assert abs(lhs - rhs) <= 1e-9 * (1.0 + abs(lhs)), (lhs, rhs)


def _loss_of_h(h: np.ndarray) -> float:
    w = torch.tensor([1.0, 5.0, -0.5], dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(w @ dqp.solve(P, Q, A=A, b=B, G=G, h=torch.tensor(h)).x)


@pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")
@pytest.mark.parametrize("policy", ("auto", "vertex"))
def test_forward_value_lies_between_the_one_sided_derivatives(policy: str) -> None:
    w = torch.tensor([1.0, 5.0, -0.5], dtype=F64)
    backward = dqp.KKTBackward(degenerate=policy)

    def loss(h):
        return w @ dqp.solve(P, Q, A=A, b=B, G=G, h=h, backward=backward).x

    gen = torch.Generator().manual_seed(0)
    directions = [*torch.eye(3, dtype=F64), *torch.randn(4, 3, generator=gen, dtype=F64)]
    verdicts = 0
    for d in directions:
        _, claim = jvp(loss, (H,), (d,))
        sides = one_sided(_loss_of_h, H.numpy(), d.numpy())
        if len(sides) < 2:
            continue  # one stable side only: no verdict
        lo, hi = min(sides), max(sides)
        assert lo - 1e-5 <= float(claim) <= hi + 1e-5, (d, float(claim), sides)
        verdicts += 1
    assert verdicts >= 3


@pytest.mark.parametrize("method", METHODS)
def test_forward_mode_warning_names_dependent_rows_not_a_singular_p(method) -> None:
    f = _outputs(method, "auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jacfwd(f, argnums=2)(Q, G, H, B)
    texts = [str(w.message) for w in caught if issubclass(w.category, dqp.QPDegenerateWarning)]
    assert texts and any("linearly dependent" in t and "LICQ" in t for t in texts), texts
    assert not any("singular" in t for t in texts), texts
