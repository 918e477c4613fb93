"""Forward mode and torch.func on :func:`dxopt.qp.solve` (issue 10).

References: the eager reverse-mode path (``torch.autograd.functional.jacobian`` and
``torch.autograd.grad``, tested against closed forms elsewhere), eager per-sample loops for
vmap, and the transposition identity :math:`\\langle v, Jt\\rangle = \\langle J^\\top v, t\\rangle`
between the jvp and the vjp of the same backward method. Problems are built from their KKT
conditions (``qp_zoo.complementary_qp``), so the active sets are strictly complementary.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from qp_zoo import QPData, complementary_qp, stack
from torch.func import grad, jacfwd, jacrev, jvp, vjp, vmap

import dxopt.qp as dqp

Tensor = torch.Tensor
F64 = torch.float64
METHODS = ["penalty", "kkt"]
NAMES = ("P", "q", "A", "b", "G", "h", "lb", "ub")


def _bounded(problem: QPData, seed: int) -> tuple[Tensor, Tensor]:
    """Bounds with one active ``ub`` row, one active ``lb`` row (they move the solution onto
    them) and the rest inactive or infinite."""
    gen = torch.Generator().manual_seed(seed)
    x = problem.x
    assert x is not None
    n = x.shape[-1]
    lb = x - 1.0 - torch.rand(x.shape, generator=gen, dtype=F64)
    ub = x + 1.0 + torch.rand(x.shape, generator=gen, dtype=F64)
    lb[..., 1] = -float("inf")
    ub[..., 2] = float("inf")
    ub[..., 0] = x[..., 0] - 0.05  # cuts the old solution: this bound becomes active
    lb[..., n - 1] = x[..., n - 1] + 0.05
    return lb, ub


def _problem(batched: bool | str, seed: int = 0) -> tuple[tuple[Tensor, ...], Tensor]:
    """``(P, q, A, b, G, h, lb, ub)`` and the solution; ``batched``: B = 3 stacked problems,
    ``"mixed"``: ``P``, ``A``, ``G`` shared and ``q``, ``b``, ``h``, ``lb`` batched."""
    if batched == "mixed":
        problem = complementary_qp(7, m=5, p=2, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        jitter = [0.01 * torch.randn(3, k, generator=gen, dtype=F64) for k in (7, 2, 5)]
        problem = problem._replace(
            q=problem.q + jitter[0],
            b=problem.b + jitter[1],  # type: ignore[operator]
            h=problem.h + jitter[2].abs(),  # type: ignore[operator]
        )
        lb, ub = _bounded(problem, seed)
        return (*problem.args(), lb.expand(3, -1).clone(), ub), problem.x  # type: ignore[return-value]
    if batched:
        parts = [complementary_qp(7, m=5, p=2, seed=seed + k) for k in range(3)]
        problem = stack(parts)
    else:
        problem = complementary_qp(7, m=5, p=2, seed=seed)
    lb, ub = _bounded(problem, seed)
    args = (*problem.args(), lb, ub)
    return args, problem.x  # type: ignore[return-value]


def _outputs(sol: dqp.QPSolution) -> tuple[Tensor, ...]:
    return (sol.x, sol.eq_duals, sol.ineq_duals, sol.lb_duals, sol.ub_duals)  # type: ignore[return-value]


def _solve_fn(backward: Any, **kw: Any) -> Any:
    def fn(P, q, A, b, G, h, lb, ub):  # type: ignore[no-untyped-def]
        return _outputs(dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, backward=backward, **kw))

    return fn


def _strictly_complementary(args: tuple[Tensor, ...], backward: str) -> None:
    """The test is only meaningful away from active-set changes: every row has slack or
    multiplier above 1e-3."""
    P, q, A, b, G, h, lb, ub = args
    sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, backward=backward)
    slack = h - (G @ sol.x.unsqueeze(-1)).squeeze(-1)
    assert bool(((slack > 1e-3) | (sol.ineq_duals > 1e-3)).all())
    for bound, duals, sign in ((lb, sol.lb_duals, 1.0), (ub, sol.ub_duals, -1.0)):
        finite = torch.isfinite(bound[0] if bound.ndim == 2 else bound)
        gap = sign * (sol.x - bound)[..., finite]
        assert bool(((gap > 1e-3) | (duals > 1e-3)).all())
    assert bool((sol.ub_duals > 1e-3).any()) and bool((sol.lb_duals > 1e-3).any())


def _random_like(ts: tuple[Tensor, ...], seed: int) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in ts)


def _dot(a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> Tensor:
    return sum((torch.nan_to_num(x, posinf=0.0, neginf=0.0) * y).sum() for x, y in zip(a, b))


#: second-order compositions that must raise (a QP has no second derivative here)
SECOND_ORDER = {
    "hessian": lambda f: jacfwd(jacrev(f)),
    "jacrev2": lambda f: jacrev(jacrev(f)),
    "rev-fwd": lambda f: jacrev(jacfwd(f)),
    "jacfwd2": lambda f: jacfwd(jacfwd(f)),
    "grad2": lambda f: grad(lambda q: grad(lambda q: f(q).sum())(q).sum()),
    "vmap-jacrev2": lambda f: lambda q: vmap(jacrev(jacrev(f)))(q.expand(2, -1)),
}


@pytest.mark.parametrize("backward", METHODS)
@pytest.mark.parametrize("batched", [False, True, "mixed"])
def test_jvp_is_the_transpose_of_the_vjp(backward, batched):
    args, _ = _problem(batched)
    _strictly_complementary(args, backward)
    fn = _solve_fn(backward)
    tangents = _random_like(args, 1)
    outs, jt = jvp(fn, args, tangents)
    cotangents = _random_like(outs, 2)
    _, pullback = vjp(fn, *args)
    jtv = pullback(cotangents)
    lhs, rhs = _dot(cotangents, jt), _dot(jtv, tangents)
    scale = sum(float(t.norm()) for t in jt) * sum(float(c.norm()) for c in cotangents)
    assert abs(float(lhs - rhs)) <= 1e-11 * scale, (float(lhs), float(rhs))
    # the torch.func vjp is the eager backward
    leaves = [a.detach().clone().requires_grad_() for a in args]
    sol = dqp.solve(
        **dict(zip("PqAbGh", leaves[:6])), lb=leaves[6], ub=leaves[7], backward=backward
    )
    eager = torch.autograd.grad(_outputs(sol), leaves, cotangents)
    for name, got, want in zip(NAMES, jtv, eager):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-10, msg=name)


@pytest.mark.parametrize("backward", METHODS)
@pytest.mark.parametrize("batched", [False, True, "mixed"])
def test_jacrev_and_jacfwd_match_the_eager_jacobian(backward, batched):
    args, _ = _problem(batched, seed=3)
    P, q, A, b, G, h, lb, ub = args

    def fn(P, q, A, b, G, h):  # type: ignore[no-untyped-def]
        sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, backward=backward)
        return sol.x, sol.eq_duals, sol.ineq_duals, sol.ub_duals

    inputs = (P, q, A, b, G, h)
    eager = torch.autograd.functional.jacobian(fn, inputs)
    argnums = tuple(range(6))
    for transform in (jacrev, jacfwd):
        got = transform(fn, argnums=argnums)(*inputs)
        for i in range(4):
            for j in range(6):
                torch.testing.assert_close(
                    got[i][j], eager[i][j], atol=1e-10, rtol=1e-9,
                    msg=f"{transform.__name__}: d out{i} / d {NAMES[j]}",
                )  # fmt: skip


def test_jvp_grad_vjp_against_the_eager_jacobian():
    args, _ = _problem(False, seed=3)
    P, q, A, b, G, h, lb, ub = args

    def x_of(q: Tensor, h: Tensor) -> Tensor:
        return dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub).x

    Jq, Jh = torch.autograd.functional.jacobian(x_of, (q, h))
    tq, th = _random_like((q, h), 7)
    _, dx = jvp(x_of, (q, h), (tq, th))
    torch.testing.assert_close(dx, Jq @ tq + Jh @ th, atol=1e-11, rtol=1e-10)
    g = grad(lambda q, h: x_of(q, h).pow(2).sum(), argnums=(0, 1))(q, h)
    x = x_of(q, h)
    torch.testing.assert_close(g[0], 2 * x @ Jq, atol=1e-11, rtol=1e-10)
    torch.testing.assert_close(g[1], 2 * x @ Jh, atol=1e-11, rtol=1e-10)
    v = _random_like((x,), 8)[0]
    _, pullback = vjp(x_of, q, h)
    gq, gh = pullback(v)
    torch.testing.assert_close(gq, v @ Jq, atol=1e-11, rtol=1e-10)
    torch.testing.assert_close(gh, v @ Jh, atol=1e-11, rtol=1e-10)


def test_eager_forward_mode_ad_matches_jvp():
    import torch.autograd.forward_ad as fwAD

    problem = complementary_qp(6, m=4, p=1, seed=11)
    P, q, A, b, G, h = problem.args()
    t = _random_like((q,), 12)[0]
    _, ref = jvp(lambda q: dqp.solve(P, q, A=A, b=b, G=G, h=h).x, (q,), (t,))
    with fwAD.dual_level():
        x = dqp.solve(P, fwAD.make_dual(q, t), A=A, b=b, G=G, h=h).x
        tangent = fwAD.unpack_dual(x).tangent
    torch.testing.assert_close(tangent, ref, atol=1e-12, rtol=1e-12)


def _eager_rows(fn: Any, rows: Tensor) -> Tensor:
    return torch.stack([fn(r) for r in rows])


@pytest.mark.parametrize("backward", METHODS)
def test_vmap_is_one_batched_solve_of_every_sample(backward, monkeypatch):
    problem = complementary_qp(6, m=4, p=1, seed=2)
    P, q, A, b, G, h = problem.args()
    gen = torch.Generator().manual_seed(0)
    qs = q + 0.05 * torch.randn(5, 6, generator=gen, dtype=F64)
    hs = h + 0.05 * torch.rand(5, 4, generator=gen, dtype=F64)

    import dxopt.qp.autograd.state as api

    calls: list[int] = []
    original = api.solve_forward

    def counting(problem, **kw):  # type: ignore[no-untyped-def]
        calls.append(problem.size)
        return original(problem, **kw)

    monkeypatch.setattr(api, "solve_forward", counting)
    sol = vmap(lambda q, h: dqp.solve(P, q, A=A, b=b, G=G, h=h, backward=backward))(qs, hs)
    assert calls == [5]  # one batched solve, not a loop over the vmapped samples
    assert isinstance(sol, dqp.QPSolution) and len(sol.status) == 5
    assert all(s == dqp.QPStatus.SOLVED for s in sol.status)
    moved = vmap(lambda q, h: dqp.solve(P, q, A=A, b=b, G=G, h=h).x, in_dims=(1, 0))(qs.T, hs)
    torch.testing.assert_close(moved, sol.x, atol=1e-12, rtol=1e-12)  # in_dims=1 folds too
    for k in range(5):
        ref = dqp.solve(P, qs[k], A=A, b=b, G=G, h=hs[k], backward=backward)
        torch.testing.assert_close(sol.x[k], ref.x, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(sol.ineq_duals[k], ref.ineq_duals, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(sol.eq_duals[k], ref.eq_duals, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("backward", METHODS)
def test_vmap_over_an_already_batched_input_and_of_grad(backward):
    parts = [complementary_qp(6, m=4, p=1, seed=20 + k) for k in range(3)]
    P, q, A, b, G, h = stack(parts).args()  # B = 3
    gen = torch.Generator().manual_seed(1)
    qs = q + 0.05 * torch.randn(4, 3, 6, generator=gen, dtype=F64)  # V = 4 over B = 3
    Ps = P[0] + 0.1 * torch.eye(6, dtype=F64) * torch.arange(1, 5, dtype=F64)[:, None, None]

    def x_of(P1: Tensor, q: Tensor) -> Tensor:  # P shared by the batch, vmapped over
        return dqp.solve(P1, q, A=A, b=b, G=G, h=h, backward=backward).x

    X = vmap(x_of)(Ps, qs)
    assert X.shape == (4, 3, 6)
    for v in range(4):
        torch.testing.assert_close(X[v], x_of(Ps[v], qs[v]), atol=1e-12, rtol=1e-12)

    def loss(P1: Tensor, q: Tensor) -> Tensor:
        return (x_of(P1, q) ** 2).sum()

    gP, gq = vmap(grad(loss, argnums=(0, 1)))(Ps, qs)
    for v in range(4):
        leaves = (Ps[v].clone().requires_grad_(), qs[v].clone().requires_grad_())
        ref = torch.autograd.grad(loss(*leaves), leaves)
        torch.testing.assert_close(gP[v], ref[0], atol=1e-11, rtol=1e-10)
        torch.testing.assert_close(gq[v], ref[1], atol=1e-11, rtol=1e-10)
    J = vmap(jacrev(x_of, argnums=1))(Ps, qs)  # (V, B, n, B, n)
    for v in range(2):
        ref = torch.autograd.functional.jacobian(lambda q, v=v: x_of(Ps[v], q), qs[v])
        torch.testing.assert_close(J[v], ref, atol=1e-11, rtol=1e-10)
    Jf = vmap(jacfwd(x_of, argnums=1))(Ps, qs)
    torch.testing.assert_close(Jf, J, atol=1e-11, rtol=1e-10)


def test_status_under_vmap_is_per_folded_sample():
    problem = complementary_qp(5, m=3, seed=4)
    P, q, _, _, G, h = problem.args()
    hs = torch.stack([h, h, h])
    hs[1, 0] = -1e3  # sample 1: Gx <= h with h far below reach...
    G2 = G.clone()
    Gs = torch.stack([G2, G2, G2])
    Gs[1, 0] = 0.0  # ... and a zero row: 0 <= -1e3 is infeasible
    sol = vmap(lambda G, h: dqp.solve(P, q, G=G, h=h, on_failure="nan"))(Gs, hs)
    assert [s.ok for s in sol.status] == [True, False, True]
    assert bool(torch.isnan(sol.x[1]).all()) and bool(torch.isfinite(sol.x[[0, 2]]).all())
    J = vmap(jacrev(lambda h, G: dqp.solve(P, q, G=G, h=h, on_failure="nan").x))(hs, Gs)
    Jf = vmap(jacfwd(lambda h, G: dqp.solve(P, q, G=G, h=h, on_failure="nan").x))(hs, Gs)
    assert bool((J[1] == 0).all()) and bool((Jf[1] == 0).all())  # failed: zero, like the vjp
    ref = torch.autograd.functional.jacobian(lambda h: dqp.solve(P, q, G=G, h=h).x, h)
    for k in (0, 2):
        torch.testing.assert_close(J[k], ref, atol=1e-11, rtol=1e-10)
        torch.testing.assert_close(Jf[k], ref, atol=1e-11, rtol=1e-10)


@pytest.mark.parametrize("second", list(SECOND_ORDER.values()), ids=list(SECOND_ORDER))
def test_second_derivatives_are_refused(second):
    problem = complementary_qp(5, m=3, seed=6)
    P, q, _, _, G, h = problem.args()

    def f(q: Tensor) -> Tensor:
        return dqp.solve(P, q, G=G, h=h).x

    with pytest.raises(RuntimeError, match="cannot differentiate twice"):
        second(f)(q)


def test_sparse_inputs_under_torch_func():
    problem = complementary_qp(6, m=4, seed=9)
    P, q, _, _, G, h = problem.args()
    Ps = P.to_sparse()
    with pytest.raises(TypeError, match=r"P: expected a dense tensor where torch\.func"):
        jacrev(lambda P: dqp.solve(P, q, G=G, h=h).x)(Ps)
    with pytest.raises(TypeError, match=r"G: expected a dense tensor where torch\.func"):
        grad(lambda G: dqp.solve(P, q, G=G, h=h).x.sum())(G.to_sparse())
    # a sparse constant is fine: only dense inputs are transformed
    J = jacrev(lambda q: dqp.solve(Ps, q, G=G.to_sparse(), h=h).x)(q)
    ref = torch.autograd.functional.jacobian(lambda q: dqp.solve(P, q, G=G, h=h).x, q)
    torch.testing.assert_close(J, ref, atol=1e-10, rtol=1e-9)
    Jf = jacfwd(lambda q: dqp.solve(Ps, q, G=G.to_sparse(), h=h).x)(q)
    torch.testing.assert_close(Jf, ref, atol=1e-10, rtol=1e-9)


def test_float32_inputs_under_torch_func():
    problem = complementary_qp(6, m=4, p=1, seed=13)
    args = problem.args()
    P, q, A, b, G, h = (t.float() for t in args)  # type: ignore[union-attr]
    J = jacrev(lambda q: dqp.solve(P, q, A=A, b=b, G=G, h=h).x)(q)
    Jf = jacfwd(lambda q: dqp.solve(P, q, A=A, b=b, G=G, h=h).x)(q)
    ref = torch.autograd.functional.jacobian(
        lambda q: dqp.solve(args[0], q, **dict(zip("AbGh", args[2:]))).x, args[1]
    )
    assert J.dtype == torch.float32 and Jf.dtype == torch.float32
    torch.testing.assert_close(J.double(), ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(Jf.double(), ref, atol=1e-5, rtol=1e-4)


def test_torch_solver_under_torch_func():
    problem = complementary_qp(6, m=4, p=1, seed=14)
    P, q, A, b, G, h = problem.args()

    def f(q: Tensor) -> Tensor:
        return dqp.solve(P, q, A=A, b=b, G=G, h=h, solver="torch").x

    ref = torch.autograd.functional.jacobian(f, q)
    torch.testing.assert_close(jacrev(f)(q), ref, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(jacfwd(f)(q), ref, atol=1e-10, rtol=1e-9)
    qs = q + 0.05 * torch.randn(3, 6, generator=torch.Generator().manual_seed(0), dtype=F64)
    torch.testing.assert_close(vmap(f)(qs), torch.stack([f(r) for r in qs]))


@pytest.mark.parametrize("backward", METHODS)
def test_duplicated_rows_split_equally_in_both_modes(backward):
    """Two copies of an active row (LICQ fails): the vjp splits the adjoint equally between
    them (the minimum-norm rule of degenerate="auto"), and the jvp is its transpose: moving
    one copy moves x by half (the mean of the one-sided derivatives 0 and 1), both copies by 1."""
    P = torch.eye(2, dtype=F64)
    q = torch.tensor([-2.0, -2.0], dtype=F64)
    G = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
    h = torch.tensor([1.0, 1.0], dtype=F64)

    def x_of(h: Tensor) -> Tensor:
        return dqp.solve(P, q, G=G, h=h, backward=backward).x

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        _, both = jvp(x_of, (h,), (torch.ones(2, dtype=F64),))
        _, one = jvp(x_of, (h,), (torch.tensor([1.0, 0.0], dtype=F64),))
        (gh,) = vjp(x_of, h)[1](torch.tensor([1.0, 0.0], dtype=F64))
    torch.testing.assert_close(both, torch.tensor([1.0, 0.0], dtype=F64), atol=1e-12, rtol=0)
    torch.testing.assert_close(one, torch.tensor([0.5, 0.0], dtype=F64), atol=1e-12, rtol=0)
    torch.testing.assert_close(gh, torch.tensor([0.5, 0.5], dtype=F64), atol=1e-12, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_inputs_under_torch_func():
    problem = complementary_qp(6, m=4, p=1, seed=15)
    args = problem.args()
    P, q, A, b, G, h = (t.cuda() for t in args)  # type: ignore[union-attr]

    def f(q: Tensor) -> Tensor:
        return dqp.solve(P, q, A=A, b=b, G=G, h=h).x

    ref = torch.autograd.functional.jacobian(
        lambda q: dqp.solve(args[0], q, **dict(zip("AbGh", args[2:]))).x, args[1]
    )
    for transform in (jacrev, jacfwd):
        J = transform(f)(q)
        assert J.device.type == "cuda"
        torch.testing.assert_close(J.cpu(), ref, atol=1e-10, rtol=1e-9)
    qs = q + 0.05 * torch.ones(3, 1, dtype=F64, device="cuda")
    torch.testing.assert_close(vmap(f)(qs).cpu(), torch.stack([f(r).cpu() for r in qs]))


# ---------------------------------------------------------------------------------------------
# vmap over lb / ub (one row per entry, infinite bounds exact zero rows)


def _bounds_per_sample(problem: QPData, scale: float) -> tuple[Tensor, Tensor]:
    """V = 3 samples of bounds with different finite patterns, each with an active bound:
    sample 0 an active ``ub``, sample 1 an active ``lb``, sample 2 both; the others inactive
    or infinite (``-inf`` in ``lb``, ``+inf`` in ``ub``)."""
    x = problem.x
    assert x is not None
    inf = float("inf")
    lbs, ubs = torch.stack([x - scale] * 3), torch.stack([x + scale] * 3)
    lbs[0, 1], lbs[1, 3], lbs[2, 0], lbs[2, 4] = -inf, -inf, -inf, -inf
    ubs[1, 5], ubs[2, 2] = inf, inf
    ubs[0, 0] = x[0] - 0.05 * scale
    lbs[1, 2] = x[2] + 0.05 * scale
    ubs[2, 1], lbs[2, 3] = x[1] - 0.05 * scale, x[3] + 0.05 * scale
    return lbs, ubs


@pytest.mark.parametrize("backward", METHODS)
@pytest.mark.parametrize("scale", [1.0, 1e6], ids=["unit", "x~1e6"])
def test_vmap_over_bounds_with_differing_finite_patterns(backward, scale):
    """Per-sample finite patterns under vmap against the eager per-sample solves (compact
    rows): the same x, the duals of the finite entries, exact zeros at the infinite ones, and
    vmap(jacrev)/vmap(jacfwd) with respect to lb and ub against the eager jacobian. ``x~1e6``
    scales the solution (and the bounds) by 1e6: the zero rows' slack 1 is then tiny next to
    the data, which must not make them active."""
    base = complementary_qp(6, m=3, p=1, seed=3)
    P, q, A, b, G, h = base.args()
    q, b, h = q * scale, b * scale, h * scale  # type: ignore[operator]
    problem = base._replace(x=base.x * scale)  # type: ignore[operator]
    lbs, ubs = _bounds_per_sample(problem, scale)

    def solve(lb: Tensor, ub: Tensor) -> dqp.QPSolution:
        return dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, backward=backward)

    sol = vmap(solve)(lbs, ubs)
    assert len(sol.status) == 3 and all(s.ok for s in sol.status)
    assert sol.lb_duals.shape == (3, 6) and sol.ub_duals.shape == (3, 6)
    active = 0
    for k in range(3):
        ref = solve(lbs[k], ubs[k])
        torch.testing.assert_close(sol.x[k], ref.x, atol=1e-9 * scale, rtol=1e-9)
        torch.testing.assert_close(sol.ineq_duals[k], ref.ineq_duals, atol=1e-9, rtol=1e-9)
        pairs = ((lbs, sol.lb_duals, ref.lb_duals), (ubs, sol.ub_duals, ref.ub_duals))
        for bound, duals, want in pairs:
            finite = torch.isfinite(bound[k])
            torch.testing.assert_close(duals[k][finite], want, atol=1e-9, rtol=1e-9)
            assert bool((duals[k][~finite] == 0).all())  # exactly inactive
            active += int((want > 1e-3).sum())
    assert active >= 4  # the designed active bounds are active

    def x_of(lb: Tensor, ub: Tensor) -> Tensor:
        return solve(lb, ub).x

    J = vmap(jacrev(x_of, argnums=(0, 1)))(lbs, ubs)
    Jf = vmap(jacfwd(x_of, argnums=(0, 1)))(lbs, ubs)
    for k in range(3):
        ref = torch.autograd.functional.jacobian(x_of, (lbs[k], ubs[k]))
        assert float(ref[0].abs().sum() + ref[1].abs().sum()) > 0.5  # an active bound moves x
        for i in range(2):
            torch.testing.assert_close(J[i][k], ref[i], atol=1e-10, rtol=1e-9)
            torch.testing.assert_close(Jf[i][k], ref[i], atol=1e-10, rtol=1e-9)


def test_jacobians_with_respect_to_bounds_batched_and_not_vmapped():
    """jacrev/jacfwd w.r.t. lb and ub without vmap (compact rows) and vmap over a batched lb
    (V = 2 over B = 3: one folded solve of 6 samples), against the eager jacobian."""
    args, _ = _problem(True, seed=5)
    P, q, A, b, G, h, lb, ub = args

    def x_of(lb: Tensor, ub: Tensor) -> Tensor:
        return dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, backward="kkt").x

    ref = torch.autograd.functional.jacobian(x_of, (lb, ub))
    assert float(ref[0].abs().sum()) > 0.5 and float(ref[1].abs().sum()) > 0.5
    for transform in (jacrev, jacfwd):
        got = transform(x_of, argnums=(0, 1))(lb, ub)
        for i in range(2):
            torch.testing.assert_close(got[i], ref[i], atol=1e-10, rtol=1e-9)
    lbs = torch.stack([lb, lb.clone()])
    lbs[1, :, 3] = -float("inf")  # a different finite pattern in the second vmapped sample
    X = vmap(x_of, in_dims=(0, None))(lbs, ub)
    J = vmap(jacrev(x_of), in_dims=(0, None))(lbs, ub)
    for v in range(2):
        torch.testing.assert_close(X[v], x_of(lbs[v], ub), atol=1e-12, rtol=1e-12)
        want = torch.autograd.functional.jacobian(lambda lb, v=v: x_of(lb, ub), lbs[v])
        torch.testing.assert_close(J[v], want, atol=1e-10, rtol=1e-9)


def test_vmapped_bounds_infeasible_samples_and_nan():
    """lb = +inf / ub = -inf in one vmapped sample: that sample is INFEASIBLE (zero row
    0'x <= -1), the others solved, with a zero jacobian for the failed one; NaN is refused."""
    problem = complementary_qp(5, m=3, seed=8)
    P, q, _, _, G, h = problem.args()
    x = problem.x
    assert x is not None
    lbs = torch.stack([x - 1.0] * 3)
    ubs = torch.stack([x + 1.0] * 3)
    lbs[0, 2] = float("inf")
    ubs[2, 4] = -float("inf")
    lbs[1, 0] = -float("inf")

    def x_of(lb: Tensor, ub: Tensor) -> Tensor:
        return dqp.solve(P, q, G=G, h=h, lb=lb, ub=ub, on_failure="nan").x

    sol = vmap(lambda lb, ub: dqp.solve(P, q, G=G, h=h, lb=lb, ub=ub, on_failure="nan"))(lbs, ubs)
    S = dqp.QPStatus
    assert sol.status == (S.INFEASIBLE, S.SOLVED, S.INFEASIBLE)
    torch.testing.assert_close(sol.x[1], x_of(lbs[1], ubs[1]), atol=1e-12, rtol=1e-12)
    assert bool(torch.isnan(sol.x[[0, 2]]).all())
    J = vmap(jacrev(x_of))(lbs, ubs)
    Jf = vmap(jacfwd(x_of))(lbs, ubs)
    assert bool((J[[0, 2]] == 0).all()) and bool((Jf[[0, 2]] == 0).all())
    lbs[1, 1] = float("nan")
    with pytest.raises(ValueError, match="h: expected finite entries, got NaN"):
        vmap(x_of)(lbs, ubs)  # the NaN reaches h (the bound rows) and the solve's validation


# ---------------------------------------------------------------------------------------------
# solver="torch" under torch.func: the device path's own jvp and vmap rules


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_torch_solver_jacobians_of_every_input(dtype):
    """jacrev and jacfwd of (x, y, z) w.r.t. all six inputs on solver="torch" against
    torch.autograd.functional.jacobian (the eager backward) and, in float64, against the
    CPU route's exact KKT backward; the transforms stay on the torch solver."""
    problem = complementary_qp(6, m=4, p=2, seed=14)
    args = tuple(t.to(dtype) for t in problem.args())  # type: ignore[union-attr]
    solvers: list[str] = []

    def fn(*inputs: Tensor, solver: str = "torch") -> tuple[Tensor, ...]:
        backward = "kkt" if solver != "torch" else "penalty"
        sol = dqp.solve(**dict(zip("PqAbGh", inputs)), solver=solver, backward=backward)
        solvers.append(sol.info.solver)
        return sol.x, sol.eq_duals, sol.ineq_duals

    ref = torch.autograd.functional.jacobian(fn, args)
    kkt = torch.autograd.functional.jacobian(
        lambda *a: fn(*a, solver="daqp"), tuple(t.double() for t in args)
    )
    tol = {"atol": 1e-10, "rtol": 1e-9} if dtype == F64 else {"atol": 2e-4, "rtol": 1e-3}
    for i in range(3):
        for j in range(6):
            torch.testing.assert_close(ref[i][j].double(), kkt[i][j], **tol)
    solvers.clear()
    for transform in (jacrev, jacfwd):
        got = transform(fn, argnums=tuple(range(6)))(*args)
        for i in range(3):
            for j in range(6):
                assert got[i][j].dtype == dtype
                torch.testing.assert_close(got[i][j], ref[i][j], **tol, msg=f"{i}/{NAMES[j]}")
    assert solvers == ["torch", "torch"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_torch_solver_vmap_is_one_folded_solve(dtype, monkeypatch):
    """vmap over q and lb (per-sample finite patterns) is one call of the torch solver on the
    folded batch; x, vmap(jacrev) and vmap(jacfwd) match the eager per-sample solves."""
    problem = complementary_qp(6, m=4, p=1, seed=21)
    P, q, A, b, G, h = (t.to(dtype) for t in problem.args())  # type: ignore[union-attr]
    x = problem.x.to(dtype)  # type: ignore[union-attr]
    gen = torch.Generator().manual_seed(3)
    qs = q + 0.05 * torch.randn(3, 6, generator=gen, dtype=F64).to(dtype)
    lbs = torch.stack([x - 1.0] * 3)
    lbs[0, 1] = lbs[2, 4] = -float("inf")
    lbs[1, 2] = x[2] + 0.05  # active

    import dxopt.qp.autograd.torch_function as tb

    calls: list[int] = []
    original = tb.solve_detached

    def counting(P, *rest, **kw):  # type: ignore[no-untyped-def]
        calls.append(P.shape[0])
        return original(P, *rest, **kw)

    monkeypatch.setattr(tb, "solve_detached", counting)

    def x_of(q: Tensor, lb: Tensor) -> Tensor:
        return dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, solver="torch").x

    X = vmap(x_of)(qs, lbs)
    assert calls == [3]
    tol = {"atol": 1e-10, "rtol": 1e-9} if dtype == F64 else {"atol": 2e-4, "rtol": 1e-3}
    J = vmap(jacrev(x_of, argnums=(0, 1)))(qs, lbs)
    Jf = vmap(jacfwd(x_of, argnums=(0, 1)))(qs, lbs)
    for k in range(3):
        torch.testing.assert_close(X[k], x_of(qs[k], lbs[k]), **tol)
        ref = torch.autograd.functional.jacobian(x_of, (qs[k], lbs[k]))
        for i in range(2):
            torch.testing.assert_close(J[i][k], ref[i], **tol)
            torch.testing.assert_close(Jf[i][k], ref[i], **tol)
    assert float(Jf[1][1].abs().sum()) > 0.5  # the active lb moves x


def test_torch_solver_failed_and_unpolished_samples():
    """on_failure="nan" under vmap: the failed sample has a zero jacobian, like the vjp;
    polish=False leaves the active set unconfirmed on the device: the CPU path differentiates
    the call, with its own polish=False rules (the same jacobians as solver="daqp")."""
    problem = complementary_qp(5, m=3, seed=4)
    P, q, _, _, G, h = problem.args()
    hs = torch.stack([h, h, h])
    hs[1, 0] = -1e3
    Gs = torch.stack([G, G, G]).clone()
    Gs[1, 0] = 0.0  # 0 <= -1e3: infeasible

    def x_of(h: Tensor, G: Tensor) -> Tensor:
        return dqp.solve(P, q, G=G, h=h, solver="torch", on_failure="nan").x

    sol = vmap(lambda G, h: dqp.solve(P, q, G=G, h=h, solver="torch", on_failure="nan"))(Gs, hs)
    assert [s.ok for s in sol.status] == [True, False, True]
    J = vmap(jacrev(x_of))(hs, Gs)
    Jf = vmap(jacfwd(x_of))(hs, Gs)
    assert bool((J[1] == 0).all()) and bool((Jf[1] == 0).all())
    ref = torch.autograd.functional.jacobian(lambda h: x_of(h, G), h)
    for k in (0, 2):
        torch.testing.assert_close(J[k], ref, atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(Jf[k], ref, atol=1e-10, rtol=1e-9)

    def unpolished(q: Tensor, solver: str = "torch") -> Tensor:
        return dqp.solve(P, q, G=G, h=h, solver=solver, polish=False, eps_abs=1e-6).x

    for transform in (jacrev, jacfwd):
        torch.testing.assert_close(
            transform(unpolished)(q), transform(lambda q: unpolished(q, "daqp"))(q), atol=1e-10,
            rtol=0,
        )  # fmt: skip


@pytest.mark.parametrize(
    "second",
    [v for k, v in SECOND_ORDER.items() if k != "grad2"],
    ids=[k for k in SECOND_ORDER if k != "grad2"],
)
def test_torch_solver_second_derivatives_are_refused(second):
    problem = complementary_qp(5, m=3, seed=6)
    P, q, _, _, G, h = problem.args()

    def f(q: Tensor) -> Tensor:
        return dqp.solve(P, q, G=G, h=h, solver="torch").x

    with pytest.raises(RuntimeError, match="cannot differentiate twice"):
        second(f)(q)


def test_torch_solver_eager_forward_mode_ad_and_double_backward():
    """Eager forward-mode AD on solver="torch" is the torch.func jvp (the implicit one, not
    forward AD through the solver's iterations); create_graph=True then a second backward
    raises."""
    import torch.autograd.forward_ad as fwAD

    problem = complementary_qp(6, m=4, p=1, seed=11)
    P, q, A, b, G, h = problem.args()
    t = _random_like((q,), 12)[0]
    _, ref = jvp(lambda q: dqp.solve(P, q, A=A, b=b, G=G, h=h, solver="torch").x, (q,), (t,))
    J = torch.autograd.functional.jacobian(lambda q: dqp.solve(P, q, A=A, b=b, G=G, h=h).x, q)
    torch.testing.assert_close(ref, J @ t, atol=1e-10, rtol=1e-9)
    with fwAD.dual_level():
        x = dqp.solve(P, fwAD.make_dual(q, t), A=A, b=b, G=G, h=h, solver="torch").x
        tangent = fwAD.unpack_dual(x).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent, ref, atol=1e-12, rtol=1e-12)
    leaf = q.clone().requires_grad_()
    x = dqp.solve(P, leaf, A=A, b=b, G=G, h=h, solver="torch").x
    (g,) = torch.autograd.grad(x.pow(2).sum(), leaf, create_graph=True)
    with pytest.raises(RuntimeError, match="cannot differentiate twice"):
        g.sum().backward()


def test_executor_under_torch_func_is_refused():
    """executor= has reverse-mode autograd only: torch.func and forward-mode AD get a
    ValueError naming the option before the executor is called."""
    import torch.autograd.forward_ad as fwAD

    class Executor:
        def solve(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the executor must not be called")

    problem = complementary_qp(4, m=2, seed=1)
    P, q, _, _, G, h = problem.args()

    def f(q: Tensor) -> Tensor:
        return dqp.solve(P, q, G=G, h=h, executor=Executor()).x  # type: ignore[arg-type]

    for transform in (jacrev, jacfwd, grad, vmap):
        g = (lambda q: f(q).sum()) if transform is grad else f
        arg = q.expand(2, -1) if transform is vmap else q
        with pytest.raises(ValueError, match=r"executor: expected None inside torch\.func"):
            transform(g)(arg)
    with fwAD.dual_level(), pytest.raises(ValueError, match="executor: expected None"):
        f(fwAD.make_dual(q, torch.ones_like(q)))


def test_torch_solver_duplicated_rows():
    """Two copies of an active row (LICQ fails) on solver="torch": moving both copies moves
    x_1 by 1 (a consistent tangent system), the vjp splits equally; moving one copy has no
    derivative (one-sided derivatives 0 and 1): the sample is differentiated by the CPU
    path's degenerate rule, as on solver="daqp" (the minimum-norm mean, above)."""
    P = torch.eye(2, dtype=F64)
    q = torch.tensor([-2.0, -2.0], dtype=F64)
    G = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
    h = torch.tensor([1.0, 1.0], dtype=F64)

    def x_of(h: Tensor) -> Tensor:
        return dqp.solve(P, q, G=G, h=h, solver="torch").x

    _, both = jvp(x_of, (h,), (torch.ones(2, dtype=F64),))
    (gh,) = vjp(x_of, h)[1](torch.tensor([1.0, 0.0], dtype=F64))
    torch.testing.assert_close(both, torch.tensor([1.0, 0.0], dtype=F64), atol=1e-12, rtol=0)
    torch.testing.assert_close(gh, torch.tensor([0.5, 0.5], dtype=F64), atol=1e-10, rtol=0)
    one = (torch.tensor([1.0, 0.0], dtype=F64),)
    _, cpu = jvp(lambda h: dqp.solve(P, q, G=G, h=h, solver="daqp").x, (h,), one)
    torch.testing.assert_close(jvp(x_of, (h,), one)[1], cpu, atol=1e-12, rtol=0)


def test_torch_solver_vmapped_kkt_solve_in_chunks(monkeypatch):
    """jacrev/jacfwd repeat the saved factor once per (co)tangent; above the budget the
    vmapped KKT solve runs in chunks of V, with the same Jacobian as one chunk."""
    parts = [complementary_qp(6, m=4, p=1, seed=30 + k) for k in range(3)]
    P, q, A, b, G, h = stack(parts).args()

    def x_of(q: Tensor) -> Tensor:
        return dqp.solve(P, q, A=A, b=b, G=G, h=h, solver="torch").x

    whole = (jacrev(x_of)(q), jacfwd(x_of)(q))
    import dxopt.qp.autograd.torch_function as tb

    sizes: list[int] = []
    original = tb.kkt_solve

    def counting(f, *rest):  # type: ignore[no-untyped-def]
        sizes.append(f.L.shape[0])
        return original(f, *rest)

    monkeypatch.setattr(tb, "kkt_solve", counting)
    monkeypatch.setattr(tb, "_REPEAT_BUDGET", 2 * 3 * 6 * 6)  # below one copy: chunks of 1
    for transform, want in zip((jacrev, jacfwd), whole):
        sizes.clear()
        torch.testing.assert_close(transform(x_of)(q), want, atol=1e-13, rtol=1e-13)
        assert len(sizes) > 1 and sum(sizes) == 18 * 3 and max(sizes) < 18 * 3  # V = 18
