"""The lean path for one small dense QP (dxopt.qp.lean.small, small_backward, lean_check)
against the general path and finite differences: same solution, status, info, gradients and
diagnostics; every case it must not decide (degenerate, weak, zero rows, bad input, failures)
goes to the general path."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from _fd import directional_verdicts

import dxopt.qp as dqp
import dxopt.qp.api.route as api
from dxopt.qp.lean import lean_check
from dxopt.qp.lean import small as _small
from dxopt.qp.problem.options import QPOptions

NAMES = ("P", "q", "A", "b", "G", "h")


def _problem(n: int, m: int, p: int, seed: int, dtype=torch.float64) -> dict:
    """A random strictly convex QP with a feasible interior (about half the rows active)."""
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((n, n))
    data = {"P": M @ M.T + 0.5 * np.eye(n), "q": rng.standard_normal(n)}
    x0 = rng.standard_normal(n)
    if p:
        data["A"] = rng.standard_normal((p, n))
        data["b"] = data["A"] @ x0
    if m:
        data["G"] = rng.standard_normal((m, n))
        data["h"] = data["G"] @ x0 + rng.uniform(0.0, 1.0, m) * (rng.random(m) < 0.5)
    return {k: torch.tensor(data[k], dtype=dtype) if k in data else None for k in NAMES}


def _leaves(data: dict) -> dict:
    return {k: None if v is None else v.clone().requires_grad_() for k, v in data.items()}


def _run(data: dict, lean: bool, monkeypatch, *, backward="penalty", weights=None, **kw):
    """Solve, backpropagate ``w.x + u.nu + v.mu`` and return the solution and gradients."""
    with monkeypatch.context() as mp:
        if not lean:
            mp.setattr(api, "small_inputs", lambda *a: False)
        ins = _leaves(data)
        sol = dqp.solve(**{k: ins[k] for k in NAMES}, backward=backward, **kw)
        used = "SmallQPFunction" in type(sol.x.grad_fn).__name__
        rng = np.random.default_rng(7)
        loss = (torch.tensor(rng.standard_normal(sol.x.shape[0]), dtype=sol.x.dtype) * sol.x).sum()
        if weights == "duals":
            for d in (sol.eq_duals, sol.ineq_duals):
                if d is not None:
                    loss = (
                        loss
                        + (torch.tensor(rng.standard_normal(d.shape[0]), dtype=d.dtype) * d).sum()
                    )
        loss.backward()
        grads = {k: None if v is None else v.grad for k, v in ins.items()}
    return sol, grads, used


SIZES = [(1, 1, 0), (3, 2, 1), (10, 5, 0), (10, 5, 3), (20, 30, 5), (40, 10, 0), (64, 64, 20),
         (8, 0, 3), (8, 0, 0)]  # fmt: skip
CASES = [(n, m, p, seed) for n, m, p in SIZES for seed in range(3)]


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize(("n", "m", "p", "seed"), CASES)
def test_lean_equals_general(n, m, p, seed, backward, monkeypatch):
    _compare(_problem(n, m, p, seed), backward, monkeypatch)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_lean_equals_general_without_active_rows(backward, monkeypatch):
    data = _problem(10, 5, 2, 15)
    data["h"] = data["h"] + 100.0  # every inequality row slack: k = p rows in the adjoint
    _compare(data, backward, monkeypatch)


def _scale(data: dict, sol) -> float:
    """The largest term of the residuals of ``sol``: max |P||x| + |q| + |A'||mu| + |G'||nu|
    and max |A||x| + |b|, |G||x| + |h|."""
    x = sol.x.detach().abs()
    terms = [data["P"].abs() @ x + data["q"].abs()]
    for M, v, d in ((data["A"], data["b"], sol.eq_duals), (data["G"], data["h"], sol.ineq_duals)):
        if M is not None and M.shape[0]:
            terms[0] = terms[0] + M.abs().T @ d.detach().abs()
            terms.append(M.abs() @ x + v.abs())
    return max(float(t.max()) for t in terms)


def _compare(data: dict, backward: str, monkeypatch, *, exact: bool = True, **kw) -> None:
    """The lean path's solution, info, gradients and diagnostics equal the general path's
    (``exact``: the solution and multipliers bit for bit; else to round-off, for backends
    whose last bits depend on the memory alignment of their inputs, as proxqp's do)."""
    tol = 0.0 if exact else 1e-12
    lean, g_lean, used = _run(data, True, monkeypatch, backward=backward, weights="duals", **kw)
    ref, g_ref, used_ref = _run(data, False, monkeypatch, backward=backward, weights="duals", **kw)
    assert used and not used_ref
    assert lean.status == ref.status
    torch.testing.assert_close(lean.x, ref.x, rtol=tol, atol=tol)
    for a, b in ((lean.eq_duals, ref.eq_duals), (lean.ineq_duals, ref.ineq_duals)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for k in NAMES:
        if g_ref[k] is None:
            assert g_lean[k] is None
            continue
        torch.testing.assert_close(
            g_lean[k], g_ref[k], rtol=1e-12, atol=1e-12 * (1 + g_ref[k].abs().max())
        )
    info, info_ref = lean.info, ref.info
    for field in ("solver", "sample_solvers", "sample_tolerances", "polished"):
        assert getattr(info, field) == getattr(info_ref, field)
    # the residuals are sums of terms of size up to ``scale`` evaluated in another order (the
    # lean kernels' loops against the general path's BLAS): equal to their round-off
    floor = 4 * data["q"].shape[0] * float(torch.finfo(torch.float64).eps) * _scale(data, lean)
    for a, b in ((info.primal_residual, info_ref.primal_residual),
                 (info.dual_residual, info_ref.dual_residual)):  # fmt: skip
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=floor)
    d, d_ref = dataclasses.asdict(info.backward), dataclasses.asdict(info_ref.backward)
    residual, residual_ref = d.pop("residual"), d_ref.pop("residual")
    assert residual <= 1e-12 and residual_ref <= 1e-12
    np.testing.assert_allclose(d.pop("beta"), d_ref.pop("beta"), rtol=1e-9)
    assert d == d_ref


@pytest.mark.parametrize(("n", "m", "p", "seed"), [(5, 4, 1, 0), (10, 5, 3, 1), (12, 20, 4, 2)])
def test_gradients_match_finite_differences(n, m, p, seed):
    """Directional derivatives of L = w.x in every input against one-sided differences (at a
    kink either side is a valid derivative; unstable quotients are no verdict)."""
    data = _problem(n, m, p, seed)
    w = torch.tensor(np.random.default_rng(3).standard_normal(n), dtype=torch.float64)
    ins = _leaves(data)
    sol = dqp.solve(**{k: ins[k] for k in NAMES})
    assert "SmallQPFunction" in type(sol.x.grad_fn).__name__
    (w * sol.x).sum().backward()

    def loss(args: dict) -> float:
        return float((w * dqp.solve(**{j: args[j] for j in NAMES}).x).sum())

    verdicts = directional_verdicts(
        data, {k: v.grad for k, v in ins.items() if v is not None}, loss
    )
    assert verdicts >= 4


def test_float32_inputs(monkeypatch):
    data64 = _problem(10, 6, 2, 4)
    data32 = {k: None if v is None else v.float() for k, v in data64.items()}
    sol, grads, used = _run(data32, True, monkeypatch)
    ref, grads_ref, _ = _run(data32, False, monkeypatch)
    assert used and sol.x.dtype == torch.float32
    torch.testing.assert_close(sol.x, ref.x, rtol=0, atol=0)
    for k in NAMES:
        if grads_ref[k] is not None:
            assert grads[k].dtype == torch.float32
            torch.testing.assert_close(grads[k], grads_ref[k])


def test_degenerate_rows_take_the_general_backward(monkeypatch):
    """Two copies of an active row (LICQ fails): the forward is lean, the backward declines and
    the general path's degenerate policy decides; the result equals the general path's."""
    data = _problem(6, 3, 0, 5)
    G, h = data["G"], data["h"]
    data["G"], data["h"] = torch.cat([G, G[:1]]), torch.cat([h, h[:1]])
    data["h"][0] = data["h"][3] = float(G[0] @ torch.linalg.solve(data["P"], -data["q"])) - 1.0
    with pytest.warns(dqp.QPDegenerateWarning):
        lean, g_lean, used = _run(data, True, monkeypatch, weights="duals")
    with pytest.warns(dqp.QPDegenerateWarning):
        ref, g_ref, _ = _run(data, False, monkeypatch, weights="duals")
    assert used
    assert lean.info.backward.dependent_rows == ref.info.backward.dependent_rows != (0,)
    for k in NAMES:
        if g_ref[k] is not None:
            torch.testing.assert_close(g_lean[k], g_ref[k])


def test_weakly_active_row_takes_the_general_backward(monkeypatch):
    """A row with zero slack and zero multiplier (h at the unconstrained minimiser)."""
    data = _problem(5, 2, 0, 6)
    x_free = torch.linalg.solve(data["P"], -data["q"])
    data["h"] = data["G"] @ x_free + torch.tensor([0.0, 1.0], dtype=torch.float64)
    lean, g_lean, used = _run(data, True, monkeypatch)
    ref, g_ref, _ = _run(data, False, monkeypatch)
    assert used and lean.info.backward.n_weak == ref.info.backward.n_weak == (1,)
    for k in NAMES:
        if g_ref[k] is not None:
            torch.testing.assert_close(g_lean[k], g_ref[k])


@pytest.mark.parametrize(("relative", "lean_backward"), [(1e-7, True), (2e-9, False)])
def test_small_multiplier_margin(relative, lean_backward, monkeypatch):
    """An active row whose multiplier is ``relative`` times the dual scale: the lean backward
    takes it above ten times identify_active's floor (1e-8; the general path's own threshold
    is 1e-9, so it classifies the row alike) and declines below; the gradients equal the
    general path's either way."""
    data = _problem(6, 3, 0, 11)
    P, q, G = data["P"], data["q"], data["G"]
    x_free = torch.linalg.solve(P, -q)
    s = float(G[0] @ torch.linalg.solve(P, G[0]))
    scale = float((P.abs() @ x_free.abs() + q.abs()).max())
    # nu_0 = delta / s for the one active row; its g_inf-weighted size over the dual scale
    delta = relative * scale * s / float(G[0].abs().max())
    data["h"] = G @ x_free + torch.tensor([-delta, 5.0, 5.0], dtype=torch.float64)
    calls: list[bool] = []
    original = _small.small_backward

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(_small, "small_backward", spy)
    lean, g_lean, used = _run(data, True, monkeypatch)
    _, g_ref, _ = _run(data, False, monkeypatch)
    nu = lean.ineq_duals.detach()
    x = lean.x.detach()
    dual_scale = max(float((P.abs() @ x.abs() + q.abs()).max()), float(nu[0] * G[0].abs().max()))
    measured = float(nu[0] * G[0].abs().max()) / dual_scale
    assert 0.5 * relative < measured < 2 * relative  # the case is the one named
    assert used and calls == [lean_backward]
    for k in NAMES:
        if g_ref[k] is not None:
            torch.testing.assert_close(g_lean[k], g_ref[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["zero_row", "psd_singular", "infeasible"])
def test_cases_the_forward_leaves_to_the_general_path(case, monkeypatch):
    data = _problem(6, 4, 1, 8)
    if case == "zero_row":
        data["G"][2] = 0.0
        data["h"][2] = 1.0
    elif case == "psd_singular":
        v = torch.ones(6, dtype=torch.float64)
        data["P"] = torch.outer(v, v)  # PSD, singular: daqp's Cholesky fails, the box bounds it
        eye = torch.eye(6, dtype=torch.float64)
        data["G"], data["h"] = torch.cat([eye, -eye]), torch.ones(12, dtype=torch.float64)
    elif case == "empty_G":
        data["G"], data["h"] = (
            torch.zeros(0, 6, dtype=torch.float64),
            torch.zeros(0, dtype=torch.float64),
        )
    elif case == "infeasible":
        data["G"] = torch.cat([data["G"], -data["G"][:1]])
        data["h"] = torch.cat([data["h"], -data["h"][:1] - 1.0])
        with pytest.raises(dqp.QPSolveError):
            _run(data, True, monkeypatch)
        return
    sol, grads, used = _run(data, True, monkeypatch)
    ref, grads_ref, _ = _run(data, False, monkeypatch)
    assert not used
    torch.testing.assert_close(sol.x, ref.x, rtol=0, atol=0)
    for k in NAMES:
        if grads_ref[k] is not None:
            torch.testing.assert_close(grads[k], grads_ref[k])


@pytest.mark.parametrize(
    ("change", "error"),
    [("nan", "NaN"), ("inf_h", "Inf"), ("asymmetric", "symmetric"), ("indefinite", "positive")],
)
def test_bad_input_gets_the_general_error(change, error):
    data = _problem(4, 2, 0, 9)
    if change == "nan":
        data["q"][1] = float("nan")
    elif change == "inf_h":
        data["h"][0] = float("inf")
    elif change == "asymmetric":
        data["P"][0, 1] += 1.0
    else:
        data["P"] = -data["P"]
    with pytest.raises(ValueError, match=error):
        dqp.solve(**{k: data[k] for k in NAMES})


def test_in_place_change_after_the_solve_does_not_change_the_gradient():
    data = _problem(8, 5, 2, 10)
    ins = _leaves(data)
    sol = dqp.solve(**{k: ins[k] for k in NAMES})
    x = sol.x
    with torch.no_grad():
        ins["P"].mul_(3.0)
        ins["G"].add_(1.0)
    x.sum().backward()
    ones = _leaves(data)
    sol2 = dqp.solve(**{k: ones[k] for k in NAMES})
    sol2.x.sum().backward()
    torch.testing.assert_close(ins["q"].grad, ones["q"].grad, rtol=0, atol=0)
    torch.testing.assert_close(ins["G"].grad, ones["G"].grad, rtol=0, atol=0)


def test_second_order_is_refused():
    data = _problem(6, 3, 1, 12)
    ins = _leaves(data)
    sol = dqp.solve(**{k: ins[k] for k in NAMES})
    (g,) = torch.autograd.grad(sol.x.pow(2).sum(), ins["q"], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


def test_inputs_outside_the_lean_path():
    P = torch.eye(3, dtype=torch.float64)
    q = torch.ones(3, dtype=torch.float64)
    assert lean_check.small_inputs(P, q, None, None, None, None)
    assert not lean_check.small_inputs(P[None], q[None], None, None, None, None)  # batched
    # a sparse P passes the cheap checks; the forward finds no numpy view: the general path
    for sparse in (P.to_sparse(), P.to_sparse_csr()):
        data = (sparse, q, None, None, None, None)
        assert _small.small_forward(data, QPOptions()) is None
        assert torch.allclose(dqp.solve(**dict(zip("PqAbGh", data))).x, -q)
    assert not lean_check.small_inputs(P, q.float(), None, None, None, None)  # mixed dtypes
    big = torch.eye(lean_check.SMALL_MAX_N + 1, dtype=torch.float64)
    assert not lean_check.small_inputs(big, big[0], None, None, None, None)
    with torch.autograd.forward_ad.dual_level():
        assert not lean_check.small_inputs(P, q, None, None, None, None)
    one_row = torch.ones(1, 3, dtype=torch.float64)
    assert not lean_check.small_inputs(P, q, one_row, None, None, None)


def test_box_bounds_take_the_lean_path(monkeypatch):
    """lb/ub become rows of G (dxopt.qp.api.bounds) before the lean path; their multipliers and
    gradients equal the general path's."""
    data = _problem(8, 3, 1, 13)
    inside = torch.full((8,), 0.05, dtype=torch.float64)  # feasible for every row and bound
    data["b"], data["h"] = data["A"] @ inside, data["G"] @ inside + 0.1
    lb = torch.full((8,), -0.3, dtype=torch.float64)
    ub = torch.full((8,), 0.2, dtype=torch.float64)
    ub[3] = float("inf")
    out = {}
    for lean in (True, False):
        with monkeypatch.context() as mp:
            if not lean:
                mp.setattr(api, "small_inputs", lambda *a: False)
            ins = _leaves(data)
            lo, hi = lb.clone().requires_grad_(), ub.clone().requires_grad_()
            sol = dqp.solve(**{k: ins[k] for k in NAMES}, lb=lo, ub=hi)
            assert ("SmallQPFunction" in type(sol.x.grad_fn).__name__) == lean
            weights = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)
            ((weights * sol.x).sum() + sol.lb_duals.sum() - sol.ub_duals.sum()).backward()
            out[lean] = (sol, ins["q"].grad, lo.grad, hi.grad)
    (sol, gq, glb, gub), (ref, gq_ref, glb_ref, gub_ref) = out[True], out[False]
    assert int((sol.lb_duals > 0).sum()) + int((sol.ub_duals > 0).sum()) > 0  # bounds bind
    pairs = [(sol.x, ref.x), (sol.lb_duals, ref.lb_duals), (sol.ub_duals, ref.ub_duals)]
    pairs += [(sol.ineq_duals, ref.ineq_duals), (gq, gq_ref), (glb, glb_ref), (gub, gub_ref)]
    for a, b in pairs:
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("which", ["A", "G", "both"])
def test_constraints_without_rows(which, monkeypatch):
    """An A or G with zero rows (as benchmarks and generated models pass them) stays on the
    lean path; the empty multipliers and the zero-size gradients equal the general path's."""
    data = _problem(6, 3, 2, 14)
    for name, vec in (("A", "b"), ("G", "h")):
        if which in (name, "both"):
            data[name] = torch.zeros(0, 6, dtype=torch.float64)
            data[vec] = torch.zeros(0, dtype=torch.float64)
    sol, grads, used = _run(data, True, monkeypatch, weights="duals")
    ref, grads_ref, _ = _run(data, False, monkeypatch, weights="duals")
    assert used
    torch.testing.assert_close(sol.x, ref.x, rtol=0, atol=0)
    for a, b in ((sol.eq_duals, ref.eq_duals), (sol.ineq_duals, ref.ineq_duals)):
        assert a.shape == b.shape
    for k in NAMES:
        assert (grads[k] is None) == (grads_ref[k] is None), k
        if grads_ref[k] is not None:
            torch.testing.assert_close(grads[k], grads_ref[k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lean", [True, False])
def test_jacobian_of_the_lean_path_and_batched_cotangents(lean, monkeypatch):
    """torch.autograd.functional.jacobian (one backward per output) equals torch.func.jacrev
    (the vmappable general path); torch's legacy batched cotangents get a clear error."""
    if not lean:
        monkeypatch.setattr(api, "small_inputs", lambda *a: False)
    data = _problem(6, 4, 1, 16)

    def f(q: torch.Tensor) -> torch.Tensor:
        return dqp.solve(data["P"], q, A=data["A"], b=data["b"], G=data["G"], h=data["h"]).x

    jac = torch.autograd.functional.jacobian(f, data["q"])
    torch.testing.assert_close(jac, torch.func.jacrev(f)(data["q"]), rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="batched cotangents"):
        torch.autograd.functional.jacobian(f, data["q"], vectorize=True)


CONFIGURED = [
    (dqp.PenaltyBackward(beta=1e-3), True),
    (dqp.PenaltyBackward(max_refinement=3, refine_tol=1e-12, beta_min=1e-6), True),
    (dqp.PenaltyBackward(weak_policy="raise", degenerate="vertex"), True),
    (dqp.KKTBackward(max_residual=1e-10, degenerate="min_norm"), True),
    (dqp.KKTBackward(linear_solver="dense"), True),
    (dqp.PenaltyBackward(max_refinement=0), False),  # plain dXPP: the penalty matrix's answer
    (dqp.KKTBackward(active_tol=1e-9), False),  # a slack threshold decides the active set
    (dqp.KKTBackward(linear_solver="sparse"), False),
]


@pytest.mark.parametrize(("method", "lean"), CONFIGURED, ids=[repr(c[0]) for c in CONFIGURED])
def test_configured_backward_methods(method, lean, monkeypatch):
    """A configured PenaltyBackward/KKTBackward takes the lean path when its options cannot
    change a regular problem's adjoint, and gives the general path's gradient and diagnostics."""
    data = _problem(10, 6, 2, 17)
    sol, *_ = _run(data, True, monkeypatch, backward=method)
    assert ("SmallQPFunction" in type(sol.x.grad_fn).__name__) == lean
    if lean:
        _compare(data, method, monkeypatch)


@pytest.mark.parametrize("start", ["solution", "zeros", "float32", "bad_shape"])
def test_warm_start(start, monkeypatch):
    """A warm start (n,) takes the lean path (daqp's primal start) with the general path's
    result; a malformed one goes to the general path and its error."""
    data = _problem(12, 8, 3, 18)
    x_star = dqp.solve(**{k: data[k] for k in NAMES}).x
    zeros = torch.zeros(12, dtype=torch.float64)
    warm = {"solution": x_star, "zeros": zeros, "float32": x_star.float(), "bad_shape": zeros[1:]}
    warm = warm[start]
    if start == "bad_shape":
        with pytest.raises(ValueError, match="warm_start"):
            dqp.solve(**{k: data[k] for k in NAMES}, warm_start=warm)
        return
    sol, grads, used = _run(data, True, monkeypatch, warm_start=warm)
    ref, grads_ref, _ = _run(data, False, monkeypatch, warm_start=warm)
    assert used
    torch.testing.assert_close(sol.x, ref.x, rtol=0, atol=1e-12)
    for k in NAMES:
        torch.testing.assert_close(grads[k], grads_ref[k], rtol=1e-10, atol=1e-12)


def _adversarial(seed: int) -> dict:
    """A small QP with one of: rows scaled by 1e-8..1e8, a near-duplicate active row, a row
    whose slack is 1e-10 (nearly weak), a multiplier near zero, an ill-conditioned P."""
    rng = np.random.default_rng(seed)
    data = _problem(int(rng.integers(2, 16)), int(rng.integers(1, 12)), int(rng.integers(0, 3)),
                    seed)  # fmt: skip
    G, h, P = data["G"], data["h"], data["P"]
    kind = seed % 5
    if kind == 0:
        scale = torch.tensor(10.0 ** rng.uniform(-8, 8, G.shape[0]))
        data["G"], data["h"] = G * scale[:, None], h * scale
    elif kind == 1 and G.shape[0] > 1:
        data["G"][1] = G[0] * (1 + 1e-9)
        data["h"][1] = h[0] * (1 + 1e-9)
    elif kind == 2:
        x = dqp.solve(**{k: data[k] for k in NAMES}).x
        data["h"][0] = float(G[0] @ x) + 1e-10
    elif kind == 3:
        data["q"] = data["q"] * 1e-9
    else:
        _, vecs = torch.linalg.eigh(P)
        data["P"] = (vecs * torch.logspace(-6, 2, P.shape[0], dtype=torch.float64)) @ vecs.T
        data["P"] = 0.5 * (data["P"] + data["P"].T)
    return data


def test_lean_agrees_with_general_on_adversarial_problems(monkeypatch):
    """Wherever the lean path answers (forward and backward), it answers what the general path
    does; where it cannot decide, the general path runs (never a different gradient)."""
    lean_used = 0
    for seed in range(60):
        data = _adversarial(seed)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
                ref, g_ref, _ = _run(data, False, monkeypatch, weights="duals")
        except dqp.QPSolveError:
            with pytest.raises(dqp.QPSolveError):
                _run(data, True, monkeypatch, weights="duals")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
            sol, g, used = _run(data, True, monkeypatch, weights="duals")
        lean_used += used and sol.info.backward.linear_solver == "schur"
        torch.testing.assert_close(sol.x, ref.x, rtol=1e-12, atol=1e-12)
        for k in NAMES:
            if g_ref[k] is not None:
                scale = 1 + float(g_ref[k].abs().max())
                torch.testing.assert_close(g[k], g_ref[k], rtol=1e-8, atol=1e-8 * scale)
    assert lean_used >= 20  # the lean path is not simply refusing everything


@pytest.mark.parametrize("solver", ["piqp", "proxqp", "clarabel", "osqp"])
@pytest.mark.parametrize(("n", "m", "p", "seed"), [(3, 2, 1, 0), (10, 5, 3, 1), (20, 30, 5, 2)])
def test_interior_point_backends_take_the_lean_path(solver, n, m, p, seed, monkeypatch):
    """piqp/proxqp: the backend's point, polished by the general path's own polish, then the
    lean backward; identical to the general path (x, duals, info, gradients, diagnostics)."""
    _compare(_problem(n, m, p, seed), "penalty", monkeypatch, exact=False, solver=solver)
    sol, *_ = _run(_problem(n, m, p, seed), True, monkeypatch, solver=solver)
    assert sol.info.sample_solvers == (solver,)


def test_other_backends_keep_the_general_path(monkeypatch):
    data = _problem(6, 4, 1, 19)
    for solver in ("highs", "scs"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sol, *_ = _run(data, True, monkeypatch, solver=solver)
        assert "SmallQPFunction" not in type(sol.x.grad_fn).__name__


@pytest.mark.parametrize("name", ["P", "q", "G", "h"])
def test_general_path_refuses_a_backward_after_an_in_place_change(name, monkeypatch):
    """The general path reads the canonical problem, which shares memory with float64 CPU
    inputs: after an in-place change of an input its backward raises autograd's in-place
    error instead of differentiating at data the solve never saw (batched inputs, with the
    lean batch path switched off)."""
    monkeypatch.setattr(api, "small_batch_inputs", lambda *a, **k: 0)
    data = _problem(5, 3, 1, 20)
    batched = {k: None if v is None else v.expand(2, *v.shape).clone() for k, v in data.items()}
    ins = _leaves(batched)
    sol = dqp.solve(**{k: ins[k] for k in NAMES})
    with torch.no_grad():
        ins[name].mul_(2.0)
    with pytest.raises(RuntimeError, match="inplace"):
        sol.x.sum().backward()
