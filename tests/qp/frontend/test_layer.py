"""CvxpyQPLayer: exact references, batching, sparse data, structured parameters, the affine
map's own derivatives, and the refusals (not a QP, not DPP, bad values, no cvxpy)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch

pytest.importorskip("cvxpy")

import cvxpy as cp
from qp_zoo import simplex_projection

from dxopt.qp import CvxpyQPLayer, CvxpyQPSolution, from_cvxpy
from dxopt.qp.frontend._affine import AffineMap, SparseLinear, device_product

from ._central import central_quotient
from ._problems import box_least_squares, cvxpy_solution, mpc, optnet, simplex

F64 = torch.float64


def test_simplex_projection_and_its_jacobian_are_exact() -> None:
    """x = proj(y) (sort-based closed form) and J = diag(s) - s s^T / |S| on the support S."""
    case = simplex(n=7, batch=5, seed=4)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs[:1], backward="kkt")
    y = case.values[0].clone().requires_grad_()
    (x,) = layer(y)
    expected = simplex_projection(y.detach())
    assert float((x.detach() - expected).abs().max()) <= 1e-10
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    (grad,) = torch.autograd.grad((w * x).sum(), y)
    s = (expected > 0).to(F64)
    mean = (w * s).sum(-1, keepdim=True) / s.sum(-1, keepdim=True)
    assert float((grad - s * (w - mean)).abs().max()) <= 1e-10


def test_mixed_batching_equals_a_loop_and_sums_shared_gradients() -> None:
    """Batched and unbatched values mix as in cvxpylayers; an unbatched parameter's gradient is
    the sum over the batch (autograd's rule)."""
    batch = 4
    case = optnet(batch=batch, seed=5)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs)
    shared = {0, 2, 3, 4}  # L, A, b, G shared by the batch; q and h per sample
    values = [v[0] if i in shared else v for i, v in enumerate(case.values)]
    gen = torch.Generator().manual_seed(1)
    x0 = torch.linalg.lstsq(values[2], values[3]).solution  # A x0 = b
    slack = torch.rand(batch, values[4].shape[0], generator=gen, dtype=F64)
    values[5] = values[4] @ x0 + slack - 0.3  # some rows active, feasible (x0 +- small step)
    values[5] = torch.maximum(values[5], values[4] @ x0)
    leaves = [v.clone().requires_grad_() for v in values]
    outputs = layer(*leaves)
    assert [o.shape[0] for o in outputs] == [batch] * 3
    weights = [torch.randn(o.shape, generator=gen, dtype=F64) for o in outputs]
    grads = torch.autograd.grad(sum((w * o).sum() for w, o in zip(weights, outputs)), leaves)
    loop_grads = [torch.zeros_like(v) for v in values]
    for i in range(batch):
        sample = [v.clone().requires_grad_() if k in shared else v[i].clone().requires_grad_()
                  for k, v in enumerate(values)]  # fmt: skip
        outs = layer(*sample)
        for o, mine in zip(outs, outputs):
            assert float((o - mine[i]).detach().abs().max()) <= 1e-9
        g = torch.autograd.grad(sum((w[i] * o).sum() for w, o in zip(weights, outs)), sample)
        for k, gk in enumerate(g):
            if k in shared:
                loop_grads[k] += gk
            else:
                loop_grads[k][i] = gk
    for mine, loop in zip(grads, loop_grads):
        assert float((mine - loop).abs().max()) <= 1e-8 * (1 + float(loop.abs().max()))


@pytest.mark.parametrize(
    ("make", "mode"),
    [
        (lambda b: optnet(batch=b, seed=9), "reduced"),
        (lambda b: simplex(batch=b, seed=9), "folded"),
        (lambda b: mpc(batch=b, seed=9), "folded"),
        (lambda b: mpc(batch=b, seed=9, dynamics_parameter=True), "triangular"),
    ],
)
def test_elimination_is_the_same_qp(make, mode) -> None:  # type: ignore[no-untyped-def]
    """Eliminating CVXPY's defined variables (per call, folded into the map, or through a
    parameter-dependent triangular solve) changes neither outputs nor gradients, and the
    canonical problem's multipliers of the defining rows are recovered."""
    case = make(3)
    plain = CvxpyQPLayer(case.problem, case.parameters, case.outputs, eliminate=False)
    reduced = CvxpyQPLayer(case.problem, case.parameters, case.outputs)
    e = reduced.elimination
    assert e is not None and e.gone.size > 0
    assert (reduced._folded is not None) == (mode == "folded")
    assert (e.inverse is None) == (mode == "triangular")
    results = []
    for layer in (plain, reduced):
        leaves = [v.clone().requires_grad_() for v in case.values]
        outputs = layer(*leaves)
        loss = sum((o * (k + 1)).sum() for k, o in enumerate(outputs))
        results.append(([o.detach() for o in outputs], torch.autograd.grad(loss, leaves)))
    for a, b in zip(results[0][0], results[1][0]):
        assert float((a - b).abs().max()) <= 1e-8
    for a, b in zip(results[0][1], results[1][1]):
        assert float((a - b).abs().max()) <= 1e-7 * (1 + float(a.abs().max()))


def _spy_layouts(layer: CvxpyQPLayer) -> list[torch.layout]:
    seen: list[torch.layout] = []
    forward = layer.qp.forward

    def spy(P, q, **kw):  # type: ignore[no-untyped-def]
        seen.extend(t.layout for t in (P, kw["A"], kw["G"]) if t is not None)
        return forward(P, q, **kw)

    layer.qp.forward = spy  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("shared_matrices", [True, False])
def test_sparse_data_stay_sparse_and_agree_with_dense(shared_matrices: bool) -> None:
    case = box_least_squares(n=6, k=9, batch=3, seed=6)
    values = [case.values[0][0], case.values[1]] if shared_matrices else case.values
    dense = CvxpyQPLayer(case.problem, case.parameters, case.outputs, sparse=False)
    sparse = CvxpyQPLayer(case.problem, case.parameters, case.outputs, sparse=True)
    layouts = _spy_layouts(sparse)
    results = []
    for layer in (dense, sparse):
        leaves = [v.clone().requires_grad_() for v in values]
        outputs = layer(*leaves)
        loss = sum((o * (k + 1)).sum() for k, o in enumerate(outputs))
        results.append((outputs, torch.autograd.grad(loss, leaves)))
    assert layouts and all(layout == torch.sparse_coo for layout in layouts)
    assert len(layouts) == (3 if shared_matrices else 9)  # P, A, G: once, or once per sample
    for a, b in zip(results[0][0], results[1][0]):
        assert float((a - b).abs().max()) <= 1e-9
    for a, b in zip(results[0][1], results[1][1]):
        assert float((a - b).abs().max()) <= 1e-7 * (1 + float(a.abs().max()))


def test_psd_parameter_in_quad_form() -> None:
    """quad_form(x, P) with a PSD parameter (DPP in the objective for QP solvers): CVXPY's
    solution, and the gradient (on the upper triangle, as cvxpylayers) equals central
    differences along a symmetric direction."""
    n = 4
    x, P, q = cp.Variable(n), cp.Parameter((n, n), PSD=True), cp.Parameter(n)
    problem = cp.Problem(cp.Minimize(0.5 * cp.quad_form(x, P) + q @ x), [x >= -1, x <= 1])
    layer = CvxpyQPLayer(problem, [P, q], [x])
    rng = np.random.default_rng(7)
    M = rng.standard_normal((n, n))
    Pv, qv = torch.tensor(M @ M.T + np.eye(n)), torch.tensor([4.0, -5.0, 0.3, -0.2], dtype=F64)
    Pl = Pv.clone().requires_grad_()
    (xs,) = layer(Pl, qv)
    P.value, q.value = Pv.numpy(), qv.numpy()
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    assert np.abs(xs.detach().numpy() - x.value).max() <= 1e-7
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=F64)
    (grad,) = torch.autograd.grad((w * xs).sum(), Pl)
    assert float(grad.tril(-1).abs().max()) == 0.0
    direction = rng.standard_normal((n, n))
    direction = direction + direction.T

    def f(v: np.ndarray) -> float:
        with torch.no_grad():
            return float((w * layer(torch.tensor(v), qv)[0]).sum())

    quotient = central_quotient(f, Pv.numpy(), direction)
    assert quotient is not None
    assert abs(float((grad * torch.tensor(direction)).sum()) - quotient) <= 1e-6


def test_float32_and_function_form() -> None:
    case = simplex(seed=8)
    layer = from_cvxpy(case.problem, case.parameters, case.outputs, backward="kkt")
    assert isinstance(layer, CvxpyQPLayer)
    result = layer.solve(case.values[0].float())
    assert isinstance(result, CvxpyQPSolution) and all(s.ok for s in result.status)
    assert all(v.dtype == torch.float32 for v in result.values)
    reference = cvxpy_solution(case, case.values)
    for mine, theirs in zip(result.values, reference):
        np.testing.assert_allclose(mine.double().numpy(), theirs, atol=1e-5)


def test_maximize_and_matrix_shaped_parameter() -> None:
    """Maximize (CVXPY flips the objective) and a 2-D parameter / variable in Fortran layout."""
    X, C = cp.Variable((2, 3)), cp.Parameter((2, 3))
    lower = X >= 0
    problem = cp.Problem(cp.Maximize(cp.sum(cp.multiply(C, X)) - cp.sum_squares(X)), [lower])
    layer = CvxpyQPLayer(problem, [C], [X, lower])
    Cv = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, 0.5]], dtype=F64)
    Xs, dual = layer(Cv)
    assert torch.allclose(Xs, (Cv / 2).clamp_min(0), atol=1e-10)
    assert torch.allclose(dual, (-Cv).clamp_min(0), atol=1e-9)


def test_affine_map_derivatives() -> None:
    """The sparse product's vjp, jvp (forward AD) and second derivative (it is linear)."""
    M = sp.random(7, 5, density=0.4, random_state=np.random.default_rng(0), format="csr")
    linear = SparseLinear(M)
    dense = torch.tensor(M.toarray())
    theta = torch.randn(3, 5, dtype=F64, requires_grad=True)
    assert torch.allclose(AffineMap.apply(theta, linear), theta @ torch.tensor(M.toarray()).T)
    assert torch.autograd.gradcheck(lambda t: AffineMap.apply(t, linear), (theta,))
    assert torch.autograd.gradgradcheck(lambda t: AffineMap.apply(t, linear) ** 2, (theta,))
    import torch.autograd.forward_ad as fwAD

    tangent = torch.randn(3, 5, dtype=F64)
    with fwAD.dual_level():
        out = AffineMap.apply(fwAD.make_dual(theta.detach(), tangent), linear)
        jvp = fwAD.unpack_dual(out).tangent
    assert torch.allclose(jvp, tangent @ torch.tensor(M.toarray()).T)
    # the off-CPU product (torch.sparse.mm), here on the CPU: the same numbers
    assert torch.allclose(device_product(theta.detach(), linear), theta.detach() @ dense.T)
    assert torch.allclose(device_product(theta.detach().float(), linear), (theta @ dense.T).float())


def _problem_with(objective, constraints):  # type: ignore[no-untyped-def]
    return cp.Problem(cp.Minimize(objective), constraints)


def test_cones_are_refused_with_a_pointer_to_the_conic_front_end() -> None:
    x, y = cp.Variable(3), cp.Parameter(3)
    X = cp.Variable((2, 2), symmetric=True)
    cases = [
        _problem_with(cp.norm(x - y), []),  # SOC
        _problem_with(cp.sum(cp.exp(x)) - y @ x, []),  # exponential cone
        _problem_with(cp.sum_squares(x - y), [cp.norm(x) <= 1]),  # SOC constraint
        _problem_with(cp.trace(X) + y[0] * X[0, 1], [X >> 0]),  # PSD
    ]
    for problem in cases:
        params = problem.parameters()
        with pytest.raises(ValueError, match=r"dxopt\.frontend\.CvxpyLayer") as info:
            CvxpyQPLayer(problem, params, [problem.variables()[0]])
        assert "cvxpylayers" not in str(info.value)


def test_a_non_dcp_problem_is_told_which_part_and_not_sent_to_another_layer() -> None:
    x, y = cp.Variable(2), cp.Parameter(2)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [x >= 0, cp.sqrt(x[0]) <= 1])
    with pytest.raises(ValueError, match="not DCP: constraint 1") as info:
        CvxpyQPLayer(problem, [y], [x])
    assert "CvxpyLayer" not in str(info.value) and "use cvxpylayers" not in str(info.value)


def test_dpp_violations_are_refused() -> None:
    x, a, b = cp.Variable(2), cp.Parameter(pos=True), cp.Parameter(2)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(x) + (a * a) * cp.sum(x) + b @ x))
    with pytest.raises(ValueError, match="DPP"):
        CvxpyQPLayer(problem, [a, b], [x])
    P = cp.Parameter((2, 2), PSD=True)
    in_constraint = cp.Problem(cp.Minimize(cp.sum(x)), [cp.quad_form(x, P) <= 1])
    with pytest.raises(ValueError, match=r"DPP|quadratic program"):
        CvxpyQPLayer(in_constraint, [P], [x])


def test_bad_construction_arguments() -> None:
    case = simplex(seed=0)
    x, y = case.outputs[0], case.parameters[0]
    with pytest.raises(TypeError, match="problem"):
        CvxpyQPLayer("min x", [y], [x])
    with pytest.raises(TypeError, match="parameters"):
        CvxpyQPLayer(case.problem, y, [x])
    with pytest.raises(ValueError, match="parameters: expected exactly"):
        CvxpyQPLayer(case.problem, [], [x])
    with pytest.raises(ValueError, match="variables: expected variables of the problem"):
        CvxpyQPLayer(case.problem, [y], [cp.Variable(3)])
    with pytest.raises(TypeError, match="sparse"):
        CvxpyQPLayer(case.problem, [y], [x], sparse="yes")
    with pytest.raises(ValueError, match="on_failure"):
        CvxpyQPLayer(case.problem, [y], [x], on_failure="sometimes")


def test_bad_values_name_the_parameter() -> None:
    case = optnet(seed=0)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs)
    values = list(case.values)
    with pytest.raises(ValueError, match=r"expected 6 tensors"):
        layer(*values[:5])
    bad = [*values[:1], values[1][:3], *values[2:]]
    with pytest.raises(ValueError, match=r"parameter 1 \(q\): expected shape \(6,\)"):
        layer(*bad)
    batched = [values[0], values[1].expand(2, -1), values[2], values[3].expand(3, -1), *values[4:]]
    with pytest.raises(ValueError, match=r"parameter 3 \(b\): expected batch size 2"):
        layer(*batched)
    with pytest.raises(TypeError, match=r"parameter 2 \(A\): expected a torch.Tensor"):
        layer(*values[:2], values[2].numpy(), *values[3:])
    with pytest.raises(TypeError, match=r"parameter 0 \(L\): expected a real floating"):
        layer(values[0].long(), *values[1:])
    with pytest.raises(ValueError, match=r"parameter 4 \(G\): expected dtype torch.float64"):
        layer(*values[:4], values[4].float(), values[5])


def test_without_cvxpy_import_works_and_use_says_how_to_install() -> None:
    code = (
        "import sys; sys.modules['cvxpy'] = None\n"
        "import dxopt.qp\n"
        "try:\n    dxopt.qp.CvxpyQPLayer(None, [], [])\n"
        "except ImportError as e:\n    print('IMPORT-ERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORT-ERROR" in out.stdout and "pip install 'dxopt[cvxpy]'" in out.stdout
