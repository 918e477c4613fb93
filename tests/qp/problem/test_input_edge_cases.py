"""The small fixes of issue 9: bad shapes and tolerances, empty problems, infinite bounds of the
wrong sign, sparse G with bounds, backend option errors, torch.compile."""

from __future__ import annotations

import pytest
import torch

import dxopt.qp as dqp

F64 = torch.float64
P3 = torch.eye(3, dtype=F64)
Q3 = torch.tensor([1.0, -1.0, 0.5], dtype=F64)


def test_one_dimensional_G_names_the_argument():
    with pytest.raises(ValueError, match=r"G: expected a matrix .*G.reshape\(1, -1\)"):
        dqp.solve(P3, Q3, G=torch.ones(3, dtype=F64), h=torch.ones(1, dtype=F64))
    with pytest.raises(ValueError, match=r"A: expected a matrix"):
        dqp.solve(P3, Q3, A=torch.ones(3, dtype=F64), b=torch.ones(1, dtype=F64))


def test_column_vector_q_blames_q_not_P():
    with pytest.raises(ValueError, match=r"^q: .*column vector \(3, 1\).*reshape\(-1\)"):
        dqp.solve(P3, Q3[:, None])


@pytest.mark.parametrize("kw", [{"eps_abs": -1e-9}, {"eps_rel": -1.0}, {"eps_abs": float("nan")}])
def test_negative_or_nan_tolerance_is_refused(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"{name}: expected a finite float >= 0"):
        dqp.solve(P3, Q3, **kw)


def test_empty_batch_returns_empty_outputs_and_gradients():
    q = torch.zeros(0, 3, dtype=F64, requires_grad=True)
    sol = dqp.solve(P3, q, G=torch.eye(3, dtype=F64), h=torch.ones(3, dtype=F64))
    assert sol.x.shape == (0, 3) and sol.status == ()
    sol.x.sum().backward()
    assert q.grad is not None and q.grad.shape == (0, 3)


def test_zero_variables_is_a_feasibility_question():
    h = torch.tensor([1.0, 0.0], dtype=F64, requires_grad=True)
    P0, q0, G0 = (
        torch.zeros(0, 0, dtype=F64),
        torch.zeros(0, dtype=F64),
        torch.zeros(2, 0, dtype=F64),
    )
    sol = dqp.solve(P0, q0, G=G0, h=h)
    assert sol.status == (dqp.QPStatus.SOLVED,) and sol.x.shape == (0,)
    (sol.x.sum() + sol.ineq_duals.sum()).backward()  # type: ignore[union-attr]
    assert torch.equal(h.grad, torch.zeros(2, dtype=F64))
    sol = dqp.solve(P0, q0, G=G0, h=-torch.ones(2, dtype=F64), on_failure="nan")
    assert sol.status == (dqp.QPStatus.INFEASIBLE,)


def test_nan_and_inf_get_their_own_advice():
    with pytest.raises(ValueError, match=r"q: expected finite entries, got NaN\. Check the"):
        dqp.solve(P3, Q3 * float("nan"))
    with pytest.raises(ValueError, match=r"h: expected finite entries, got Inf\. An infinite h_i"):
        dqp.solve(P3, Q3, G=P3, h=torch.tensor([1.0, float("inf"), 1.0], dtype=F64))


@pytest.mark.parametrize(
    "bound", [("lb", float("inf")), ("ub", float("-inf"))], ids=["lb=+inf", "ub=-inf"]
)
@pytest.mark.parametrize("sparse", [False, True])
def test_wrong_signed_infinite_bound_is_infeasible(bound, sparse):
    name, value = bound
    b = torch.zeros(2, 3, dtype=F64) if name == "lb" else torch.ones(2, 3, dtype=F64)
    b[1, 0] = value
    G = P3.to_sparse() if sparse else P3
    sol = dqp.solve(P3, Q3, G=G, h=torch.full((3,), 5.0, dtype=F64), on_failure="nan", **{name: b})
    assert sol.status == (dqp.QPStatus.SOLVED, dqp.QPStatus.INFEASIBLE)
    ref = dqp.solve(P3, Q3, **{name: b[0]})
    torch.testing.assert_close(sol.x[0].detach(), ref.x, atol=1e-9, rtol=0)


def test_sparse_G_with_grad_and_bounds_matches_dense():
    h = torch.tensor([0.2, 5.0, 5.0], dtype=F64)
    lb = torch.tensor([-5.0, 0.3, -5.0], dtype=F64)
    grads = []
    G0 = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0]], dtype=F64)
    for sparse in (False, True):
        G = (G0.to_sparse() if sparse else G0.clone()).requires_grad_()
        sol = dqp.solve(P3, -Q3, G=G, h=h, lb=lb, backward="kkt")
        sol.x.sum().backward()
        grads.append(G.grad.to_dense())  # type: ignore[union-attr]
    # the sparse gradient lives on G's pattern: the dense one restricted to it
    torch.testing.assert_close(grads[1], grads[0] * (G0 != 0), atol=1e-10, rtol=1e-8)
    assert grads[0].abs().sum() > 0


@pytest.mark.parametrize("solver", ["daqp", "clarabel"])
def test_unknown_solver_option_says_it_comes_from_the_backend(solver):
    with pytest.raises(ValueError, match=f"solver_options: the backend '{solver}' rejected"):
        dqp.solve(P3, Q3, G=P3, h=torch.ones(3, dtype=F64), solver=solver,
                  solver_options={"no_such_setting": 1})  # fmt: skip


@pytest.mark.parametrize("batched", [False, True])
def test_unknown_solver_is_refused_by_name(batched):
    """A misspelt backend used to fall through the fallback chain to piqp without a word."""
    P, q = (P3[None], Q3[None]) if batched else (P3, Q3)
    with pytest.raises(ValueError, match=r"solver: expected one of 'auto', 'torch', .*'daqp'.*"
                                         r"got 'dqap'\. Check the spelling"):  # fmt: skip
        dqp.solve(P, q, solver="dqap")
    with pytest.raises(TypeError, match="solver: expected a str"):
        dqp.solve(P, q, solver=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["check_psd", "fallback", "polish"])
def test_flags_must_be_booleans(option):
    """check_psd="no" is truthy: it used to run the check the caller meant to skip."""
    with pytest.raises(TypeError, match=f"{option}: expected True or False, got 'no' \\(str\\)"):
        dqp.solve(P3, Q3, **{option: "no"})


def test_layer_refuses_bad_options_when_built():
    with pytest.raises(ValueError, match="solver: expected one of"):
        dqp.QPLayer(solver="dqap")
    with pytest.raises(TypeError, match="polish: expected True or False"):
        dqp.QPLayer(polish=1)  # type: ignore[arg-type]


def test_solver_options_must_be_a_dict():
    with pytest.raises(TypeError, match=r"solver_options: expected a dict .* got list"):
        dqp.solve(P3, Q3, solver_options=[1])  # type: ignore[arg-type]


@pytest.mark.parametrize("solver", ["daqp", "piqp"])
def test_torch_compile_graph_breaks_around_the_solve(solver):
    class Model(torch.nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            G, h = torch.eye(3, dtype=F64), torch.ones(3, dtype=F64)
            return 2 * dqp.solve(P3, q * 1.0, G=G, h=h, solver=solver).x

    q = Q3.clone().requires_grad_()
    out = torch.compile(Model(), backend="aot_eager")(q)
    out.sum().backward()
    torch.testing.assert_close(out.detach(), -2 * Q3)  # unconstrained optimum -q is feasible
    torch.testing.assert_close(q.grad, torch.full((3,), -2.0, dtype=F64))


def test_torch_compile_breaks_the_graph_once_at_the_solve():
    """With an option the custom op does not carry (``max_workers``) the one graph break is
    the eager solve (``solve`` hands over to its ``torch.compiler.disable``d twin when Dynamo
    traces it); the code around it compiles. With the default options there is no break
    (the custom op of :mod:`dxopt.qp.api.compiled`, ``tests/qp/api/test_compiled.py``)."""

    def f(q: torch.Tensor, **options: object) -> torch.Tensor:
        G, h = torch.eye(3, dtype=F64), torch.ones(3, dtype=F64)
        return 2 * dqp.solve(P3, q * 1.0, G=G, h=h, **options).x  # type: ignore[arg-type]

    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(Q3.clone().requires_grad_(), max_workers=1)
    assert explained.graph_break_count == 1
    assert "_solve_eagerly" in str(explained.break_reasons[0].reason)
    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(Q3.clone().requires_grad_()).graph_break_count == 0
