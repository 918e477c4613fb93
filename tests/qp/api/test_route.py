"""The router (dxopt.qp.api.route) and the option set (dxopt.qp.problem.options).

- every representative call records the route the old code took (the table was checked
  against commit 046a2aa, where the decisions were spread over solve, _torch_route,
  small_inputs, small_batch_inputs, lean_method, default_solver and _forward_state), with the
  same ``info.solver``;
- each route's answer is the general route's on the same call: x, the duals and every
  gradient to 1e-8 in float64;
- the fields of QPOptions are the keyword options of solve and QPLayer, and one option set
  reaches every route (the executor receives it whole).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.api.route import ROUTES, plan
from dxopt.qp.api.solve import solve_with
from dxopt.qp.problem.executor import QPData
from dxopt.qp.problem.options import QPOptions

F64 = torch.float64
PROBLEM_DATA = ("P", "q", "A", "b", "G", "h", "lb", "ub", "warm_start")


def _qp(n: int, m: int, p: int, batch: int | None = None, seed: int = 0) -> dict[str, Any]:
    """A strictly convex QP with a few active inequality rows (x = 0 strictly feasible)."""
    gen = torch.Generator().manual_seed(seed)
    shape = () if batch is None else (batch,)
    M = torch.randn(*shape, n, n, generator=gen, dtype=F64)
    P = M @ M.transpose(-1, -2) + 0.5 * torch.eye(n, dtype=F64)
    q = 3.0 * torch.randn(*shape, n, generator=gen, dtype=F64)
    G = torch.randn(*shape, m, n, generator=gen, dtype=F64)
    h = torch.rand(*shape, m, generator=gen, dtype=F64) + 0.1
    data: dict[str, Any] = {"P": P, "q": q, "G": G, "h": h}
    if p:
        data["A"] = torch.randn(*shape, p, n, generator=gen, dtype=F64)
        data["b"] = torch.zeros(*shape, p, dtype=F64)
    return data


def _lp(n: int) -> dict[str, Any]:
    """A bounded pure LP (P = 0) with n >= 65: "auto" sends it to piqp."""
    gen = torch.Generator().manual_seed(3)
    return {
        "P": torch.zeros(n, n, dtype=F64),
        "q": torch.randn(n, generator=gen, dtype=F64),
        "lb": -torch.ones(n, dtype=F64),
        "ub": torch.ones(n, dtype=F64),
    }


class _Subclass(dqp.KKTBackward):
    """A configured method the lean kernels do not compute (a subclass)."""


# name -> (data, options, expected route, expected info.solver); the routes and solvers
# are those of commit 046a2aa on the same calls (see the module docstring)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str, str]] = {
    "one small": (_qp(6, 4, 1), {}, "lean_single", "daqp"),
    "one small, kkt": (_qp(6, 4, 1), {"backward": "kkt"}, "lean_single", "daqp"),
    "one small, piqp": (_qp(6, 4, 0), {"solver": "piqp"}, "lean_single", "piqp"),
    "one small, bounds": (
        {**_qp(5, 3, 0), "lb": -torch.ones(5, dtype=F64), "ub": 0.2 * torch.ones(5, dtype=F64)},
        {}, "lean_single", "daqp",
    ),
    "one large": (_qp(70, 20, 2), {}, "lean_batch", "dual_active_set"),
    "one small, compiled": (_qp(6, 4, 1), {"solver": "dual_active_set"}, "lean_batch",
                            "dual_active_set"),
    "batch": (_qp(6, 4, 1, batch=5), {}, "lean_batch", "dual_active_set"),
    "batch, daqp": (_qp(6, 4, 1, batch=5), {"solver": "daqp"}, "lean_batch", "daqp"),
    "batch, warm start": (
        {**_qp(6, 4, 1, batch=3), "warm_start": torch.zeros(3, 6, dtype=F64)}, {},
        "lean_batch", "daqp",
    ),
    "batch, max_workers": (_qp(6, 4, 1, batch=3), {"max_workers": 2}, "general", "daqp"),
    "batch, solver_options": (
        _qp(6, 4, 1, batch=3),
        {"solver": "dual_active_set", "solver_options": {"iter_limit": 1000}}, "general", "daqp",
    ),
    "one small, no psd check": (_qp(6, 4, 1), {"check_psd": False}, "general", "daqp"),
    "one small, subclass": (_qp(6, 4, 1), {"backward": _Subclass()}, "general", "daqp"),
    "one small, no polish": (_qp(6, 4, 1), {"polish": False}, "lean_single", "daqp"),
    "one small, proxqp options": (
        _qp(6, 4, 0), {"solver": "proxqp", "solver_options": {"max_iter": 500}}, "general",
        "proxqp",
    ),
    "sparse P": (
        {**_qp(6, 4, 0), "P": _qp(6, 4, 0)["P"].to_sparse()}, {}, "general", "piqp"
    ),
    "pure LP": (_lp(70), {}, "general", "piqp"),
    "torch on the CPU": (_qp(6, 4, 1), {"solver": "torch"}, "device", "torch"),
    "torch, subclass": (_qp(6, 4, 1), {"solver": "torch", "backward": _Subclass()}, "general",
                        "torch"),
}  # fmt: skip


def _leaves(data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        if isinstance(v, torch.Tensor) and k != "warm_start":
            v = v.detach().clone()
            if v.layout == torch.strided:
                v.requires_grad_()
        out[k] = v
    return out


def _run(data: dict[str, Any], options: dict[str, Any], route: str | None = None) -> tuple:
    leaves = _leaves(data)
    args = [leaves.get(k) for k in PROBLEM_DATA]
    sol = solve_with(*args, QPOptions(**options), route=route)
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(sol.x.shape, generator=gen, dtype=F64)
    loss = (w * sol.x).sum()
    if sol.ineq_duals is not None:
        loss = loss + sol.ineq_duals.square().sum()
    grads = {}
    wrt = {k: v for k, v in leaves.items() if isinstance(v, torch.Tensor) and v.requires_grad}
    if wrt:
        for k, g in zip(wrt, torch.autograd.grad(loss, list(wrt.values()), allow_unused=True)):
            grads[k] = g
    return sol, grads


@pytest.mark.parametrize("case", list(CASES))
def test_route_is_recorded_and_unchanged(case: str) -> None:
    data, options, route, solver = CASES[case]
    sol = dqp.solve(**_leaves(data), **options)
    assert sol.info.route == route
    assert sol.info.solver == solver


@pytest.mark.parametrize("case", list(CASES))
def test_every_route_gives_the_general_routes_answer(case: str) -> None:
    data, options, route, _ = CASES[case]
    sol, grads = _run(data, options)
    ref, ref_grads = _run(data, options, route="general")
    assert sol.info.route == route and ref.info.route == "general"
    assert all(s.ok for s in sol.status) and all(s.ok for s in ref.status)
    for name in ("x", "eq_duals", "ineq_duals", "lb_duals", "ub_duals"):
        a, b = getattr(sol, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-8, msg=name)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        r = ref_grads[name]
        assert (g is None) == (r is None), name
        if g is not None:
            g = g.to_dense() if g.layout != torch.strided else g
            r = r.to_dense() if r.layout != torch.strided else r
            torch.testing.assert_close(g, r, rtol=0, atol=1e-8, msg=f"d/d{name}")


def test_a_declined_lean_call_records_the_general_route() -> None:
    """A lean route that declines at run time (here: a zero row of G, which the lean forward
    leaves to the general route's rules) hands the call to the general route and says so."""
    data = _qp(5, 3, 0)
    data["G"][0] = 0.0  # a zero row of G: the lean forward declines
    data["h"][0] = 1.0
    sol = dqp.solve(**_leaves(data))
    assert sol.info.route == "general" and sol.info.solver == "daqp"
    options = QPOptions()
    method = dqp.PenaltyBackward()
    planned = plan(tuple(data.get(k) for k in ("P", "q", "A", "b", "G", "h")), options, method,
                   warm_start=None)  # fmt: skip
    assert planned.name == "lean_single"  # planned lean, declined when run


def test_the_options_are_the_keywords_of_solve_and_qplayer() -> None:
    """One option set: the fields of QPOptions are exactly the keyword options of solve and
    QPLayer (the problem data aside), with the same defaults; QPLayer stores them."""
    names = QPOptions.names()
    fields = {f.name: f.default for f in dataclasses.fields(QPOptions)}
    solve_params = inspect.signature(dqp.solve).parameters
    layer_params = inspect.signature(dqp.QPLayer.__init__).parameters
    solve_options = {k: p.default for k, p in solve_params.items() if k not in PROBLEM_DATA}
    layer_options = {k: p.default for k, p in layer_params.items() if k != "self"}
    assert solve_options == fields
    assert layer_options == fields
    layer = dqp.QPLayer(solver="daqp", eps_abs=1e-10)
    assert layer.qp_options == QPOptions(solver="daqp", eps_abs=1e-10)
    assert tuple(layer.options) == names


def test_one_option_set_reaches_the_executor() -> None:
    """The executor receives the call's QPOptions whole (executor=None), so a new option
    reaches it without another list of names."""
    received: list[QPOptions] = []
    received_data: list[QPData] = []

    class Recorder:
        def solve(self, data: QPData, *, options: QPOptions) -> dqp.QPSolution:
            received.append(options)
            received_data.append(data)
            P, q, A, b, G, h, lb, ub, warm_start = data.tensors()
            return dqp.solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, warm_start=warm_start,
                             **options.as_keywords())  # fmt: skip

    data = _qp(4, 2, 0)
    lb = torch.full((4,), -5.0, dtype=torch.float64)
    sol = dqp.solve(**data, lb=lb, executor=Recorder(), eps_abs=1e-10, polish=False,
                    backward="kkt")  # fmt: skip
    assert received == [QPOptions(eps_abs=1e-10, polish=False, backward="kkt")]
    # the call's data arrives whole, as given (bounds not yet rows of G)
    sent = received_data[0].tensors()
    given = (data["P"], data["q"], data.get("A"), data.get("b"), data["G"], data["h"], lb, None)
    assert all(a is b for a, b in zip(sent, (*given, None), strict=True))
    assert sol.info.route == "lean_single"  # the recorder's own local solve


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("on_failure", "skip", ValueError),
        ("solver", "daqpp", ValueError),
        ("solver", 3, TypeError),
        ("check_psd", 1, TypeError),
        ("fallback", "no", TypeError),
        ("polish", None, TypeError),
        ("eps_abs", -1.0, ValueError),
        ("eps_rel", float("nan"), ValueError),
        ("max_workers", 0, ValueError),
        ("solver_options", [("a", 1)], TypeError),
        ("backward", "adjoint", ValueError),
        ("executor", object(), TypeError),
    ],
)
def test_bad_options_are_refused_by_name_everywhere(option: str, value: Any, error: type) -> None:
    """solve, QPLayer and QPOptions refuse the same bad option with the same error, naming it
    (also after the same option set with a good value was cached)."""
    data = _qp(3, 2, 0)
    dqp.solve(**data)  # the default option set is cached
    for make in (
        lambda: dqp.solve(**data, **{option: value}),
        lambda: dqp.QPLayer(**{option: value}),
        lambda: QPOptions(**{option: value}),
    ):
        with pytest.raises(error, match=option):
            make()


def test_routes_are_named() -> None:
    assert set(ROUTES) == {"executor", "lean_single", "lean_batch", "device", "general"}
