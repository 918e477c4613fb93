"""The smoothed backward (``backward=Smoothed(mu)``): the exact derivative of the log-barrier
solution x(mu), checked against closed forms, float64 finite differences of x(mu) itself and
the exact backward as mu -> 0."""

import itertools
import math

import pytest
import torch

import dxopt.qp as qp
from dxopt._core import Status
from dxopt.qp.backward.smoothed import BarrierData, Smoothed, central_path

D = torch.float64


def _problem(seed=0, n=4, m=6, p=1):
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(n, n, generator=g, dtype=D)
    P = M @ M.T + torch.eye(n, dtype=D)
    q = torch.randn(n, generator=g, dtype=D)
    G = torch.randn(m, n, generator=g, dtype=D)
    h = torch.rand(m, generator=g, dtype=D) * 0.2 + 0.05
    A = torch.randn(p, n, generator=g, dtype=D)
    b = A @ (0.01 * torch.randn(n, generator=g, dtype=D))
    return P, q, A, b, G, h


def _barrier_x(P, q, A, b, G, h, mu, sol):
    """x(mu) of one problem by the module's Newton, started at the QP solution ``sol`` of the
    unperturbed problem (the start is made interior by the Newton itself)."""
    data = BarrierData(P[None], q[None], G[None], h[None], A[None], b[None])
    pt = central_path(
        data, sol.x[None], sol.ineq_duals[None].clamp(min=0), sol.eq_duals[None], mu=mu
    )
    return pt.x[0]


def test_one_dimensional_closed_form():
    # min 1/2 x^2 + q x - mu log(h - x): x = ((h - q) - sqrt((h + q)^2 + 4 mu)) / 2
    mu = 1e-2
    for hv in (0.3, 1.0, 2.0):
        P = torch.eye(1, dtype=D)
        q = torch.tensor([-1.0], dtype=D, requires_grad=True)
        h = torch.tensor([hv], dtype=D, requires_grad=True)
        sol = qp.solve(P, q, G=torch.eye(1, dtype=D), h=h, backward=Smoothed(mu=mu))
        sol.x.sum().backward()
        root = math.sqrt((hv - 1.0) ** 2 + 4 * mu)
        assert sol.x.item() == pytest.approx(min(hv, 1.0), abs=1e-9)  # the forward is exact
        assert h.grad.item() == pytest.approx(0.5 * (1 - (hv - 1.0) / root), rel=1e-10)
        assert q.grad.item() == pytest.approx(0.5 * (-1 - (hv - 1.0) / root), rel=1e-10)


@pytest.mark.parametrize("p", [0, 1])
def test_gradient_matches_finite_differences_of_barrier_solution(p):
    P, q, A, b, G, h = _problem(p=p)
    mu = 1e-2
    w = torch.linspace(-1.0, 1.0, 4, dtype=D)
    params = [t.clone().requires_grad_(True) for t in (P, q, A, b, G, h)]
    sol = qp.solve(
        params[0], params[1], A=params[2], b=params[3], G=params[4], h=params[5],
        backward=Smoothed(mu=mu),
    )  # fmt: skip
    (w @ sol.x).backward()
    sol = qp.solve(P, q, A=A, b=b, G=G, h=h)
    base = [P, q, A, b, G, h]
    g = torch.Generator().manual_seed(1)
    for k, t in enumerate(base):
        if t.numel() == 0:
            continue
        for _ in range(2):  # random directions, several step sizes
            e = torch.randn(t.shape, generator=g, dtype=D)
            if k == 0:
                e = e + e.T
            analytic = float((params[k].grad * e).sum())
            errs = []
            for eps in (1e-4, 1e-5, 1e-6):
                up, dn = list(base), list(base)
                up[k], dn[k] = t + eps * e, t - eps * e
                fd = float(w @ (_barrier_x(*up, mu, sol) - _barrier_x(*dn, mu, sol))) / (2 * eps)
                errs.append(abs(fd - analytic))
            assert min(errs) < 1e-6 * (1 + abs(analytic)), (k, errs, analytic)


def test_tends_to_exact_backward_linearly_in_mu():
    P, q, A, b, G, h = _problem(seed=3)
    w = torch.linspace(-1.0, 1.0, 4, dtype=D)

    def grads(backward):
        params = [t.clone().requires_grad_(True) for t in (P, q, A, b, G, h)]
        sol = qp.solve(
            params[0], params[1], A=params[2], b=params[3], G=params[4], h=params[5],
            backward=backward,
        )  # fmt: skip
        (w @ sol.x).backward()
        return torch.cat([t.grad.flatten() for t in params]), sol

    exact, sol = grads(qp.KKTBackward())
    nu, slack = sol.ineq_duals, h - G @ sol.x
    assert bool(((nu > 1e-3) | (slack > 1e-3)).all())  # strictly complementary
    assert bool((nu > 1e-3).any())  # some row active
    errs = [float((grads(Smoothed(mu=mu))[0] - exact).abs().max()) for mu in (1e-5, 1e-6, 1e-7)]
    assert errs[0] > 1e-4  # the smoothing is visible
    for a, c in itertools.pairwise(errs):
        assert 5.0 < a / c < 20.0, errs  # O(mu)


def test_continuous_across_active_set_switch():
    # x*(h) = min(h, 1): the exact dx/dh jumps from 1 to 0 at h = 1; the loss x has a kink.
    hs = torch.linspace(0.5, 1.5, 101, dtype=D)[:, None]
    P, q, G = torch.eye(1, dtype=D), torch.tensor([-1.0], dtype=D), torch.eye(1, dtype=D)
    out = {}
    for name, backward in (("kkt", qp.KKTBackward()), ("smoothed", Smoothed(mu=1e-2))):
        h = hs.clone().requires_grad_(True)
        qp.solve(P, q, G=G, h=h, backward=backward).x.sum().backward()
        out[name] = h.grad.flatten()
    jumps = out["smoothed"].diff().abs()
    assert float(out["kkt"].diff().abs().max()) == pytest.approx(1.0)
    assert float(jumps.max()) < 0.05
    assert out["smoothed"][0] > 0.9 and out["smoothed"][-1] < 0.1


def test_batch_float32_matches_float64_samples():
    P, q, A, b, G, h = _problem(seed=4)
    qs = torch.stack([q, -q, 0.5 * q])
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=D)
    q32 = qs.float().requires_grad_(True)
    h32 = h.float().requires_grad_(True)
    sol = qp.solve(P.float(), q32, A=A.float(), b=b.float(), G=G.float(), h=h32,
                   backward=Smoothed(mu=1e-2))  # fmt: skip
    (sol.x @ w.float()).sum().backward()
    assert q32.grad.dtype == torch.float32 and h32.grad.shape == h.shape
    hsum = torch.zeros_like(h)
    for i in range(3):
        qi, hi = qs[i].clone().requires_grad_(True), h.clone().requires_grad_(True)
        s = qp.solve(P, qi, A=A, b=b, G=G, h=hi, backward=Smoothed(mu=1e-2))
        (s.x @ w).backward()
        assert torch.allclose(q32.grad[i].double(), qi.grad, rtol=1e-3, atol=1e-4)
        hsum += hi.grad
    assert torch.allclose(h32.grad.double(), hsum, rtol=1e-3, atol=1e-4)  # shared h: summed


def test_layer_and_options_take_smoothed():
    P, q, A, b, G, h = _problem(seed=5)
    layer = qp.QPLayer(backward=Smoothed(mu=1e-2))
    q1 = q.clone().requires_grad_(True)
    layer(P, q1, A=A, b=b, G=G, h=h).x.sum().backward()
    q2 = q.clone().requires_grad_(True)
    qp.solve(P, q2, A=A, b=b, G=G, h=h, backward=Smoothed(mu=1e-2)).x.sum().backward()
    assert torch.equal(q1.grad, q2.grad)


@pytest.mark.parametrize("bad", [0.0, -1e-3, float("nan"), float("inf"), "1e-3", None])
def test_bad_mu_raises_naming_the_argument(bad):
    with pytest.raises(ValueError, match="mu"):
        Smoothed(mu=bad)
    with pytest.raises(ValueError, match="max_iter"):
        Smoothed(max_iter=0)


def test_newton_failure_is_refused_with_status():
    P, q, A, b, G, h = _problem(seed=6)
    q = q.clone().requires_grad_(True)
    sol = qp.solve(P, q, A=A, b=b, G=G, h=h, backward=Smoothed(mu=1e-6, max_iter=1))
    with pytest.raises(qp.QPBackwardError, match="Newton") as info:
        sol.x.sum().backward()
    assert info.value.status is Status.MAX_ITER


def test_forward_mode_is_refused():
    P, q, A, b, G, h = _problem(seed=7)

    def f(qq):
        return qp.solve(P, qq, A=A, b=b, G=G, h=h, backward=Smoothed(mu=1e-2)).x

    with pytest.raises(RuntimeError, match="forward-mode"):
        torch.func.jvp(f, (q,), (torch.ones_like(q),))


def test_jacrev_matches_eager():
    P, q, A, b, G, h = _problem(seed=8)
    backward = Smoothed(mu=1e-2)

    def f(GG):
        return qp.solve(P, q, A=A, b=b, G=GG, h=h, backward=backward).x

    jac = torch.func.jacrev(f)(G)  # the torch.func path (AdjointSolve)
    rows = []
    for i in range(4):
        Gi = G.clone().requires_grad_(True)
        f(Gi)[i].backward()
        rows.append(Gi.grad)
    assert torch.allclose(jac, torch.stack(rows), rtol=1e-10, atol=1e-12)


def test_cvxpy_layer_takes_smoothed():
    cp = pytest.importorskip("cvxpy")
    x = cp.Variable(2)
    theta = cp.Parameter(2)
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(x) - theta @ x), [x <= 1.0])
    layer = qp.CvxpyQPLayer(prob, [theta], [x], backward=Smoothed(mu=1e-2))
    t = torch.tensor([0.95, 1.05], dtype=D, requires_grad=True)
    (sol,) = layer(t)
    sol.sum().backward()
    # per coordinate: min 1/2 x^2 - t x - mu log(1 - x): dx/dt = (1 + (1 - t)/root) / 2
    for k, tv in enumerate((0.95, 1.05)):
        root = math.sqrt((1.0 - tv) ** 2 + 4e-2)
        assert t.grad[k].item() == pytest.approx(0.5 * (1 + (1.0 - tv) / root), rel=1e-8)


def test_sparse_matches_dense_and_keeps_the_pattern():
    P, q, A, b, G, h = _problem(seed=9)
    G = G * (G.abs() > 0.5)  # some structural zeros
    out = []
    for sparse in (False, True):
        Pi, Gi = (P.to_sparse(), G.to_sparse()) if sparse else (P, G)
        Gi = Gi.clone().requires_grad_(True)
        qi = q.clone().requires_grad_(True)
        sol = qp.solve(Pi, qi, A=A, b=b, G=Gi, h=h, backward=Smoothed(mu=1e-2))
        sol.x.sum().backward()
        out.append((qi.grad, Gi.grad))
    assert torch.allclose(out[0][0], out[1][0], rtol=1e-9, atol=1e-12)
    assert out[1][1].layout == torch.sparse_coo
    dense = out[1][1].to_dense()
    assert torch.allclose(dense, out[0][1] * (G != 0), rtol=1e-9, atol=1e-12)


def test_failed_sample_gets_zero_gradient_and_others_are_unaffected():
    P, G = torch.eye(1, dtype=D), torch.cat([torch.eye(1, dtype=D), -torch.eye(1, dtype=D)])
    q = torch.tensor([-1.0], dtype=D)
    # sample 1 is infeasible (x <= 0 and x >= 1)
    h = torch.tensor([[0.5, 0.0], [0.0, -1.0]], dtype=D, requires_grad=True)
    sol = qp.solve(P, q, G=G, h=h, backward=Smoothed(mu=1e-2), on_failure="nan")
    torch.nan_to_num(sol.x).sum().backward()
    assert torch.equal(h.grad[1], torch.zeros(2, dtype=D))
    h0 = h[:1].detach().clone().requires_grad_(True)
    qp.solve(P, q, G=G, h=h0, backward=Smoothed(mu=1e-2)).x.sum().backward()
    assert torch.allclose(h.grad[0], h0.grad[0], rtol=1e-12, atol=1e-14)
