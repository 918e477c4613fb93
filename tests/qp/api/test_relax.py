"""``infeasible="relax"``: the closest feasible problem (dxopt.qp.api.relax) against closed
forms, its derivative against float64 finite differences of the same relaxed map, and the
feasible samples of a mixed batch bit for bit those of the mode off."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import dxopt.qp as dqp
from dxopt import Status

D = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=D)


def test_two_opposite_rows_in_1d_closed_form() -> None:
    """x <= h1 and x >= -h2 with h1 + h2 < 0: both rows shift by -(h1 + h2)/2, the shifted set
    is the point x = (h1 - h2)/2, whatever q; dx/dh = (1/2, -1/2), dx/dq = 0. The last two
    cases put the unconstrained minimum -q on that point (both multipliers zero): the pinned
    rows still carry the derivative."""
    G = t([1.0], [-1.0])
    cases = ((0.0, -1.0, 0.0), (0.5, -3.0, 2.0), (-1.0, -0.5, -4.0), (-1.0, -1.0, 0.0),
             (0.0, -1.0, -0.5))  # fmt: skip
    for h1, h2, q0 in cases:
        h = t(h1, h2).requires_grad_()
        q = t(q0).requires_grad_()
        sol = dqp.solve(torch.eye(1, dtype=D), q, G=G, h=h, infeasible="relax")
        shift = -(h1 + h2) / 2
        assert sol.status == (Status.RELAXED,)
        assert sol.x.item() == pytest.approx((h1 - h2) / 2, abs=1e-9)
        assert sol.info.relax_shift[0] == pytest.approx(math.sqrt(2) * shift, abs=1e-9)
        sol.x.sum().backward()
        assert h.grad is not None and q.grad is not None
        torch.testing.assert_close(h.grad, t(0.5, -0.5), atol=1e-8, rtol=0)
        assert abs(q.grad.item()) < 1e-8
    with pytest.raises(dqp.QPSolveError, match="infeasible"):  # the mode off: as today
        dqp.solve(torch.eye(1, dtype=D), t(0.0), G=G, h=t(0.0, -1.0))


def test_inconsistent_equality_pair_closed_form() -> None:
    """x1 = b1 and x1 = b2: shifts (b2 - b1)/2 and (b1 - b2)/2, x1 = (b1 + b2)/2 and the free
    x2 = -q2 (P = I): dx1/db = (1/2, 1/2), dx2/dq2 = -1, ||s|| = |b1 - b2|/sqrt(2)."""
    A = t([1.0, 0.0], [1.0, 0.0])
    b = t(0.0, 1.0).requires_grad_()
    q = t(0.3, -1.0).requires_grad_()
    sol = dqp.solve(torch.eye(2, dtype=D), q, A=A, b=b, infeasible="relax")
    assert sol.status == (Status.RELAXED,)
    torch.testing.assert_close(sol.x.detach(), t(0.5, 1.0), atol=1e-9, rtol=0)
    assert sol.info.relax_shift[0] == pytest.approx(1 / math.sqrt(2), abs=1e-9)
    assert sol.eq_duals is not None  # multipliers of the shifted rows: P x + q + A'mu = 0
    resid = sol.x.detach() + q.detach() + A.T @ sol.eq_duals.detach()
    assert float(resid.abs().max()) < 1e-8
    (sol.x * t(1.0, 2.0)).sum().backward()
    assert b.grad is not None and q.grad is not None
    torch.testing.assert_close(b.grad, t(0.5, 0.5), atol=1e-8, rtol=0)
    torch.testing.assert_close(q.grad, t(0.0, -2.0), atol=1e-8, rtol=0)


def test_conflicting_bounds_shift_lb_down_and_ub_up() -> None:
    """lb = 1 > ub = 0 in the first coordinate: lb moves down and ub up by 1/2 each, x1 = 1/2;
    the second coordinate keeps its bounds [0, 1] and x2 = clamp(-q2, 0, 1)."""
    lb = t(1.0, 0.0).requires_grad_()
    ub = t(0.0, 1.0).requires_grad_()
    sol = dqp.solve(torch.eye(2, dtype=D), t(0.0, -3.0), lb=lb, ub=ub, infeasible="relax")
    assert sol.status == (Status.RELAXED,)
    torch.testing.assert_close(sol.x.detach(), t(0.5, 1.0), atol=1e-9, rtol=0)
    assert sol.info.relax_shift[0] == pytest.approx(1 / math.sqrt(2), abs=1e-9)
    assert sol.lb_duals is not None and sol.lb_duals.shape == (2,)
    sol.x[0].backward()
    assert lb.grad is not None and ub.grad is not None
    torch.testing.assert_close(lb.grad, t(0.5, 0.0), atol=1e-8, rtol=0)
    torch.testing.assert_close(ub.grad, t(0.5, 0.0), atol=1e-8, rtol=0)


def test_random_shifts_satisfy_the_projection_optimality_conditions() -> None:
    """Random batches (equalities, rows, box bounds; singular P in one): every infeasible sample
    is RELAXED, and at its point x, s_A = A x - b and s_G = max(G x - h, 0) (bounds as rows)
    have the reported norm and satisfy A's_A + G's_G = 0, the KKT conditions that make s the
    least-squares smallest shift (convex problem: necessary and sufficient)."""
    gen = torch.Generator().manual_seed(5)
    relaxed = 0
    for trial in range(4):
        B, n, m, p = 4, 6, 9, 2
        M = torch.randn(B, n, n, generator=gen, dtype=D)
        P = M @ M.transpose(1, 2) / n + (0.0 if trial == 0 else 0.1) * torch.eye(n, dtype=D)
        q = torch.randn(B, n, generator=gen, dtype=D)
        A = torch.randn(B, p, n, generator=gen, dtype=D)
        b = torch.randn(B, p, generator=gen, dtype=D)
        G = torch.randn(B, m, n, generator=gen, dtype=D)
        h = torch.randn(B, m, generator=gen, dtype=D) - 1.5
        lb, ub = torch.full((B, n), -2.0, dtype=D), torch.full((B, n), 2.0, dtype=D)
        off = dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, on_failure="nan")
        sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, infeasible="relax")
        for i, status in enumerate(off.status):
            if status is not Status.INFEASIBLE:
                assert sol.status[i] is status and torch.equal(sol.x[i], off.x[i])
                continue
            relaxed += 1
            assert sol.status[i] is Status.RELAXED
            x = sol.x[i].detach()
            rows = torch.cat([G[i], -torch.eye(n, dtype=D), torch.eye(n, dtype=D)])
            rhs = torch.cat([h[i], -lb[i], ub[i]])
            s_a, s_g = A[i] @ x - b[i], (rows @ x - rhs).clamp(min=0)
            norm = float(torch.cat([s_a, s_g]).norm())
            assert norm == pytest.approx(sol.info.relax_shift[i], abs=1e-8)
            stationarity = A[i].T @ s_a + rows.T @ s_g
            assert float(stationarity.abs().max()) < 1e-8 * (1 + norm), stationarity
    assert relaxed >= 6


def _problem() -> dict[str, torch.Tensor]:
    """n = 3, one equality, four rows of which two conflict (g'x <= -1 and -g'x <= -1): the
    relaxation's active set is generic (no weakly active row), so the relaxed map is smooth."""
    gen = torch.Generator().manual_seed(38)
    M = torch.randn(3, 3, generator=gen, dtype=D)
    g = torch.randn(3, generator=gen, dtype=D)
    G = torch.stack([g, -g + 0.1 * torch.randn(3, generator=gen, dtype=D)])
    G = torch.cat([G, torch.randn(2, 3, generator=gen, dtype=D)])
    return {
        "P": M @ M.T + 0.5 * torch.eye(3, dtype=D),
        "q": torch.randn(3, generator=gen, dtype=D),
        "A": torch.randn(1, 3, generator=gen, dtype=D),
        "b": torch.randn(1, generator=gen, dtype=D),
        "G": G,
        "h": torch.tensor([-1.0, -1.0, 5.0, 5.0], dtype=D),
    }


def _relaxed_x(data: dict[str, torch.Tensor], backward: object = "penalty") -> torch.Tensor:
    sol = dqp.solve(
        data["P"], data["q"], A=data["A"], b=data["b"], G=data["G"], h=data["h"],
        infeasible="relax", backward=backward,  # type: ignore[arg-type]
    )  # fmt: skip
    assert sol.status == (Status.RELAXED,)
    return sol.x


@pytest.mark.parametrize(
    "backward",
    ["penalty", "kkt", dqp.PenaltyBackward(degenerate="vertex"),
     dqp.KKTBackward(degenerate="min_norm")],
    ids=["penalty", "kkt", "vertex", "min_norm"],
)  # fmt: skip
def test_derivative_matches_finite_differences_of_the_relaxed_map(backward: object) -> None:
    """For each input, the directional derivative along a random direction: autograd against
    the forward and the backward one-sided differences of the relaxed map (shift recomputed at
    every point) at two step sizes; the four slopes agree (no kink) and equal autograd, with
    either multiplier rule for the shifted problem's dependent rows. (With the shift held
    fixed, the slope along A misses by several percent here: that derivative is not offered.)"""
    data = _problem()
    base = {k: v.clone().requires_grad_() for k, v in data.items()}
    w = torch.tensor([1.0, -2.0, 0.5], dtype=D)
    (_relaxed_x(base, backward) @ w).backward()
    gen = torch.Generator().manual_seed(1)
    for name, value in data.items():
        d = torch.randn(value.shape, generator=gen, dtype=D)
        if name == "P":
            d = (d + d.T) / 2
        grad = base[name].grad
        assert grad is not None and bool(torch.isfinite(grad).all())
        ad = float((grad * d).sum())
        f0 = float(_relaxed_x(data) @ w)
        slopes = []
        for step in (1e-5, 1e-6):
            for sign in (1.0, -1.0):
                moved = dict(data)
                moved[name] = value + sign * step * d
                slopes.append(sign * (float(_relaxed_x(moved) @ w) - f0) / step)
        assert max(slopes) - min(slopes) < 1e-4 * (1 + abs(ad)), (name, slopes)
        assert all(abs(s - ad) < 1e-4 * (1 + abs(ad)) for s in slopes), (name, ad, slopes)
    assert base["P"].grad is not None and float(base["P"].grad.abs().sum()) > 0
    assert base["h"].grad is not None and float(base["h"].grad[:2].abs().sum()) > 0


def _batch() -> dict[str, torch.Tensor]:
    """Four samples of a 2-D box QP with batched q, G, h; samples 1 and 3 get x1 <= -1 and
    x1 >= 1 as their first two rows (infeasible), samples 0 and 2 a plain box."""
    gen = torch.Generator().manual_seed(7)
    G = torch.cat([torch.eye(2, dtype=D), -torch.eye(2, dtype=D)]).expand(4, 4, 2).clone()
    h = torch.ones(4, 4, dtype=D)
    for i in (1, 3):
        G[i, 1] = t(-1.0, 0.0)  # -x1 <= -1 against x1 <= -1
        h[i, 0] = h[i, 1] = -1.0
    return {
        "P": torch.eye(2, dtype=D) + 0.1 * torch.ones(2, 2, dtype=D),
        "q": torch.randn(4, 2, generator=gen, dtype=D) * 2,
        "G": G,
        "h": h,
    }


@pytest.mark.parametrize("solver", ["auto", "daqp"])
def test_mixed_batch_feasible_samples_bit_for_bit(solver: str) -> None:
    """The feasible samples' x, multipliers and per-sample gradients equal (torch.equal) those of
    infeasible='fail' with on_failure='nan'; the relaxed ones equal their own solve."""
    data = _batch()
    feasible = torch.tensor([0, 2])
    w = torch.tensor([[1.0, -1.0], [0.0, 0.0], [2.0, 0.5], [0.0, 0.0]], dtype=D)
    out = {}
    for mode, failure in (("fail", "nan"), ("relax", "raise")):
        inputs = {k: v.clone().requires_grad_() for k, v in data.items()}
        sol = dqp.solve(
            inputs["P"], inputs["q"], G=inputs["G"], h=inputs["h"], solver=solver,
            on_failure=failure, infeasible=mode,
        )  # fmt: skip
        (sol.x[feasible] * w[feasible]).sum().backward()
        out[mode] = (sol, {k: v.grad for k, v in inputs.items()})
    off, relaxed = out["fail"][0], out["relax"][0]
    assert off.status[1] is Status.INFEASIBLE and off.status[3] is Status.INFEASIBLE
    assert relaxed.status == (Status.SOLVED, Status.RELAXED, Status.SOLVED, Status.RELAXED)
    assert relaxed.info.relax_shift[0] == 0.0 and relaxed.info.relax_shift[1] > 0
    assert torch.equal(off.x[feasible], relaxed.x[feasible])
    assert off.ineq_duals is not None and relaxed.ineq_duals is not None
    assert torch.equal(off.ineq_duals[feasible], relaxed.ineq_duals[feasible])
    for name in ("q", "G", "h"):
        g_off, g_relax = out["fail"][1][name], out["relax"][1][name]
        assert g_off is not None and g_relax is not None
        assert torch.equal(g_off[feasible], g_relax[feasible]), name
        assert float(g_relax[1].abs().max()) == 0.0  # no loss on the relaxed rows here
    g_off, g_relax = out["fail"][1]["P"], out["relax"][1]["P"]  # shared P: summed
    assert g_off is not None and g_relax is not None and torch.equal(g_off, g_relax)
    # the relaxed samples: x1 = 0 (rows x1 <= -1, x1 >= 1 meet halfway), as solved alone
    for i in (1, 3):
        alone = dqp.solve(
            data["P"], data["q"][i], G=data["G"][i], h=data["h"][i], infeasible="relax"
        )
        torch.testing.assert_close(relaxed.x[i].detach(), alone.x.detach(), atol=1e-9, rtol=0)
        assert abs(float(relaxed.x[i, 0].detach())) < 1e-9


@pytest.mark.parametrize("keep", [[0, 2], 0], ids=["batch", "single"])
def test_feasible_calls_are_the_mode_off(keep: list[int] | int) -> None:
    """A call without an infeasible sample (a batch, and one problem on the lean path) with
    the default on_failure='raise': x, multipliers and gradients torch.equal to the mode off."""
    data = _batch()
    out = []
    for mode in ("fail", "relax"):
        q = data["q"][keep].clone().requires_grad_()
        h = data["h"][keep].clone().requires_grad_()
        sol = dqp.solve(data["P"], q, G=data["G"][keep], h=h, infeasible=mode)
        grads = torch.autograd.grad((sol.x * torch.tensor([1.0, -3.0], dtype=D)).sum(), (q, h))
        out.append((sol, grads))
    (a, grads_a), (b, grads_b) = out
    assert a.status == b.status and a.info.relax_shift == b.info.relax_shift == ()
    assert a.info.route == b.info.route
    assert torch.equal(a.x, b.x) and a.ineq_duals is not None and b.ineq_duals is not None
    assert torch.equal(a.ineq_duals, b.ineq_duals)
    assert all(torch.equal(u, v) for u, v in zip(grads_a, grads_b))


def test_unbounded_relaxed_problem_is_a_failure_with_its_shift() -> None:
    """min -x2 s.t. x1 <= -1, x1 >= 1 (an LP, x2 free): the shifted problem pins x1 = 0 and is
    unbounded in x2, certified UNBOUNDED; its shift norm sqrt(2) is still reported."""
    P, q = torch.zeros(2, 2, dtype=D), t(0.0, -1.0)
    G, h = t([1.0, 0.0], [-1.0, 0.0]), t(-1.0, -1.0)
    sol = dqp.solve(P, q, G=G, h=h, infeasible="relax", on_failure="nan")
    assert sol.status == (Status.UNBOUNDED,) and bool(torch.isnan(sol.x).all())
    assert sol.info.relax_shift[0] == pytest.approx(math.sqrt(2), abs=1e-9)
    with pytest.raises(dqp.QPSolveError, match="unbounded"):
        dqp.solve(P, q, G=G, h=h, infeasible="relax")


def test_warn_policy_does_not_warn_for_relaxed_samples() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = dqp.solve(
            torch.eye(1, dtype=D), t(0.0), G=t([1.0], [-1.0]), h=t(-1.0, -1.0),
            infeasible="relax", on_failure="warn",
        )  # fmt: skip
    assert sol.status == (Status.RELAXED,)


def test_training_loop_with_infeasible_samples_converges() -> None:
    """QPLayer(infeasible='relax') inside a linear model q = -W f; a third of the samples carry
    the conflicting rows x1 <= -1, x1 >= 1 (relaxed: x1 = 0). The targets are the layer's
    output at a true W, so the loss can reach 0; it must fall 20x (10x on the relaxed samples
    alone) in 25 Adam steps, with finite gradients."""
    gen = torch.Generator().manual_seed(3)
    B = 12
    feats = torch.randn(B, 3, generator=gen, dtype=D)
    data = _batch()
    G = torch.cat([torch.eye(2, dtype=D), -torch.eye(2, dtype=D)]).expand(B, 4, 2).clone()
    h = torch.full((B, 4), 2.0, dtype=D)
    for i in range(0, B, 3):
        G[i, 1] = t(-1.0, 0.0)
        h[i, 0] = h[i, 1] = -1.0
    layer = dqp.QPLayer(infeasible="relax")
    w_true = torch.tensor([[1.0, -0.5, 0.3], [0.2, 0.8, -1.0]], dtype=D)
    with torch.no_grad():
        target = layer(data["P"], -feats @ w_true.T, G=G, h=h).x
    W = torch.nn.Parameter(torch.zeros(2, 3, dtype=D))
    opt = torch.optim.Adam([W], lr=0.2)
    relaxed_rows = list(range(0, B, 3))
    losses, relaxed_losses = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        for _ in range(25):
            opt.zero_grad()
            sol = layer(data["P"], -feats @ W.T, G=G, h=h)
            err = ((sol.x - target) ** 2).sum(dim=1)
            err.sum().backward()
            assert W.grad is not None and bool(torch.isfinite(W.grad).all())
            losses.append(err.sum().item())
            relaxed_losses.append(err[relaxed_rows].sum().item())
            opt.step()
    assert [i for i, s in enumerate(sol.status) if s is Status.RELAXED] == relaxed_rows
    assert losses[-1] < 0.05 * losses[0], losses[::5]
    assert relaxed_losses[-1] < 0.1 * relaxed_losses[0], relaxed_losses[::5]


def test_bad_mode_and_sparse_input_refused() -> None:
    with pytest.raises(ValueError, match="infeasible: expected 'fail'"):
        dqp.solve(torch.eye(1, dtype=D), t(0.0), infeasible="clip")
    with pytest.raises(ValueError, match="infeasible: expected 'fail'"):
        dqp.QPLayer(infeasible=True)
    G = t([1.0], [-1.0]).to_sparse()
    with pytest.raises(ValueError, match="G: infeasible='relax' takes dense"):
        dqp.solve(torch.eye(1, dtype=D), t(0.0), G=G, h=t(0.0, -1.0), infeasible="relax")


@pytest.mark.parametrize("solver", ["osqp", "piqp", "clarabel", "dual_active_set", "torch"])
def test_other_backends_relax_the_same_way(solver: str) -> None:
    """Both solves of the relaxation go through the requested backend (and the fallback
    chain): the same shift, point and gradient, to the requested tolerance."""
    h = t([0.0, -1.0], [1.0, 0.0]).requires_grad_()
    sol = dqp.solve(
        torch.eye(1, dtype=D), torch.zeros(2, 1, dtype=D), G=t([1.0], [-1.0]), h=h,
        infeasible="relax", solver=solver,
    )  # fmt: skip
    assert sol.status == (Status.RELAXED, Status.SOLVED)
    torch.testing.assert_close(sol.x.detach(), t([0.5], [0.0]), atol=1e-8, rtol=0)
    assert sol.info.relax_shift[0] == pytest.approx(1 / math.sqrt(2), abs=1e-8)
    (grad,) = torch.autograd.grad(sol.x.sum(), h)
    torch.testing.assert_close(grad, t([0.5, -0.5], [0.0, 0.0]), atol=1e-8, rtol=0)


def test_under_torch_compile_a_graph_break_with_the_eager_result() -> None:
    layer = dqp.QPLayer(infeasible="relax")
    G = t([1.0], [-1.0])

    def model(h: torch.Tensor) -> torch.Tensor:
        return (layer(torch.eye(1, dtype=D), torch.zeros(2, 1, dtype=D), G=G, h=h).x).sum()

    h = t([0.0, -1.0], [1.0, 0.0]).requires_grad_()
    out = torch.compile(model, backend="aot_eager")(h)
    out.backward()
    assert h.grad is not None and out.item() == pytest.approx(0.5, abs=1e-9)
    torch.testing.assert_close(h.grad, t([0.5, -0.5], [0.0, 0.0]), atol=1e-8, rtol=0)


def test_transforms_and_forward_mode_refused() -> None:
    """The relaxed samples are picked by their status: torch.func and forward-mode AD raise."""
    G, h = t([1.0], [-1.0]), t(0.0, 1.0)

    def f(q: torch.Tensor) -> torch.Tensor:
        return dqp.solve(torch.eye(1, dtype=D), q, G=G, h=h, infeasible="relax").x.sum()

    for transform in (torch.func.grad, torch.func.vmap):
        with pytest.raises(ValueError, match="infeasible: 'relax' is reverse mode only"):
            transform(f)(torch.zeros(1, dtype=D))
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level(), pytest.raises(ValueError, match="reverse mode only"):
        f(fwad.make_dual(torch.zeros(1, dtype=D), torch.ones(1, dtype=D)))


def test_cvxpy_layer_passes_the_mode_through() -> None:
    cp = pytest.importorskip("cvxpy")
    x, c = cp.Variable(2), cp.Parameter(2)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x)), [x[0] <= c[0], x[0] >= c[1]])
    layer = dqp.CvxpyQPLayer(prob, parameters=[c], variables=[x], infeasible="relax")
    assert layer.qp.qp_options.infeasible == "relax"
    value = t(0.0, 1.0).requires_grad_()  # x0 <= 0 and x0 >= 1: x0 = 1/2
    sol = layer.solve(value)
    assert sol.status == (Status.RELAXED,)
    torch.testing.assert_close(sol.values[0].detach(), t(0.5, 0.0), atol=1e-9, rtol=0)
    sol.values[0][0].backward()
    assert value.grad is not None
    torch.testing.assert_close(value.grad, t(0.5, 0.5), atol=1e-8, rtol=0)
    with pytest.raises(dqp.QPSolveError):
        dqp.CvxpyQPLayer(prob, parameters=[c], variables=[x])(t(0.0, 1.0))
