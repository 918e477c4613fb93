"""dtype and device handling of dxopt.qp: float32 in -> float32 out, CUDA round trip.

float32 results are compared with a float64 solve of the *same* (float32-rounded) data, so
the only differences are the computation's own. dxopt solves in float64 internally and rounds
the outputs, so the measured difference is 4.9e-8 (relative, x, multipliers and every
gradient); the tolerance ``FLOAT32_RTOL`` = 1e-6 (about 8 float32 epsilons) is still far below
any error a wrong float32 path (a lost cast, a float32 factorisation) would make.

``solver="torch"`` computes on the inputs' device and in their dtype (float32 iterates and
residual checks, float64 factorizations and refinement residuals; see
:mod:`dxopt.qp.solvers.torch_driver`): measured against daqp in float64 on the same rounded data,
2e-8 to 7e-8 relative for x, multipliers and every gradient with cond(P) = 1, 1e2, 1e4, 1e6,
so the same ``FLOAT32_RTOL`` applies.
"""

from __future__ import annotations

import math

import pytest
import torch
from _ref_problems import relative_error
from qp_zoo import QPData, complementary_qp, sparse_complementary_qp, stack
from torch import Tensor

import dxopt.qp as dqp

BACKWARDS = ("penalty", "kkt")
NAMES = ("P", "q", "A", "b", "G", "h")
FLOAT32_RTOL = 1e-6  # ~ 8 float32 epsilons, relative in norm (measured: 4.9e-8)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def _leaves(problem: QPData, dtype: torch.dtype, device: str = "cpu") -> dict[str, Tensor]:
    return {
        k: getattr(problem, k).to(dtype=dtype, device=device).detach().clone().requires_grad_()
        for k in NAMES
        if getattr(problem, k) is not None
    }


def _run(problem: QPData, dtype: torch.dtype, backward: str, device: str = "cpu") -> tuple:
    leaves = _leaves(problem, dtype, device)
    sol = dqp.solve(**{k: leaves.get(k) for k in NAMES}, backward=backward)
    gen = torch.Generator().manual_seed(0)
    loss = (torch.randn(sol.x.shape, generator=gen).to(sol.x) * sol.x).sum()
    for duals in (sol.eq_duals, sol.ineq_duals):
        if duals is not None:
            loss = loss + (torch.randn(duals.shape, generator=gen).to(duals) * duals).sum()
    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
    return sol, grads, leaves


def _rounded(problem: QPData) -> QPData:
    """The problem with every tensor rounded to float32 and stored back in float64."""
    return QPData(
        *(
            t.to(torch.float32).to(torch.float64)
            if isinstance(t, Tensor) and t.is_floating_point()
            else t
            for t in problem
        )
    )


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("batched", [False, True])
def test_float32_matches_float64_and_keeps_dtype(backward: str, batched: bool) -> None:
    problem = complementary_qp(10, m=8, p=2, seed=21)
    if batched:
        problem = stack([problem, complementary_qp(10, m=8, p=2, seed=22)])
    problem = _rounded(problem)
    sol32, grads32, leaves32 = _run(problem, torch.float32, backward)
    sol64, grads64, _ = _run(problem, torch.float64, backward)

    for value in (sol32.x, sol32.eq_duals, sol32.ineq_duals):
        assert value is not None and value.dtype == torch.float32
    for name, grad in grads32.items():
        assert grad.dtype == torch.float32, f"d/d{name} came back as {grad.dtype}"
        assert grad.shape == leaves32[name].shape
    pairs = [("x", sol32.x, sol64.x), ("eq", sol32.eq_duals, sol64.eq_duals)]
    pairs += [("ineq", sol32.ineq_duals, sol64.ineq_duals)]
    pairs += [(f"d/d{k}", grads32[k], grads64[k]) for k in grads64]
    for label, ours, reference in pairs:
        error = relative_error(ours, reference)
        assert error <= FLOAT32_RTOL, f"{backward}: {label} float32 relative error {error:.2e}"


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_float32_sparse_inputs(backward: str, layout: torch.layout) -> None:
    problem = _rounded(sparse_complementary_qp(12, m=10, p=2, seed=5))
    if layout == torch.sparse_csr:
        problem = QPData(
            *(t.to_sparse_csr() if isinstance(t, Tensor) and t.is_sparse else t for t in problem)
        )
    sol32, grads32, leaves32 = _run(problem, torch.float32, backward)
    _, grads64, _ = _run(problem, torch.float64, backward)
    assert sol32.x.dtype == torch.float32
    for name, grad in grads32.items():
        assert grad.dtype == torch.float32
        assert grad.layout == leaves32[name].layout, f"d/d{name} layout {grad.layout}"
        ours = grad.to_dense() if grad.layout != torch.strided else grad
        reference = grads64[name]
        reference = reference.to_dense() if reference.layout != torch.strided else reference
        error = relative_error(ours, reference)
        assert error <= FLOAT32_RTOL, f"{backward}: d/d{name} float32 relative error {error:.2e}"


@pytest.mark.parametrize("odd", ["q", "G", "h"])
def test_mixed_dtypes_raise_value_error_naming_the_argument(odd: str) -> None:
    problem = complementary_qp(5, m=4, p=1, seed=1)
    args = {k: getattr(problem, k) for k in NAMES}
    args[odd] = args[odd].to(torch.float32)
    with pytest.raises(ValueError, match=rf"\b{odd}\b") as error:
        dqp.solve(**{k: args[k] for k in NAMES})
    message = str(error.value)
    assert "float32" in message and "float64" in message, message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_unsupported_dtypes_are_rejected(dtype: torch.dtype) -> None:
    problem = complementary_qp(4, m=3, seed=2)
    args = [None if t is None else t.to(dtype) for t in problem.args()]
    with pytest.raises((ValueError, TypeError), match=r"dtype|float"):
        dqp.solve(**dict(zip("PqAbGh", args)))


@pytest.mark.parametrize("on_meta", ["all", "q", "h"])
def test_meta_tensors_are_rejected_with_a_clear_message(on_meta: str) -> None:
    """Tensors without data (device "meta") cannot be solved: a ValueError naming the argument."""
    problem = complementary_qp(4, m=3, seed=3)
    args = {k: getattr(problem, k) for k in NAMES}
    for name in NAMES if on_meta == "all" else (on_meta,):
        if args[name] is not None:
            args[name] = args[name].to("meta")
    named = "P" if on_meta == "all" else on_meta
    with pytest.raises(ValueError, match=rf"\b{named}\b.*meta|meta.*\b{named}\b"):
        dqp.solve(**{k: args[k] for k in NAMES})


@CUDA
@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_inputs_return_on_cuda_and_match_cpu(backward: str, dtype: torch.dtype) -> None:
    problem = _rounded(complementary_qp(8, m=6, p=2, seed=8))
    sol_gpu, grads_gpu, _ = _run(problem, dtype, backward, device="cuda")
    sol_cpu, grads_cpu, _ = _run(problem, dtype, backward, device="cpu")
    for value in (sol_gpu.x, sol_gpu.eq_duals, sol_gpu.ineq_duals):
        assert value is not None and value.device.type == "cuda" and value.dtype == dtype
    for name, grad in grads_gpu.items():
        assert grad.device.type == "cuda" and grad.dtype == dtype, name
        torch.testing.assert_close(grad.cpu(), grads_cpu[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sol_gpu.x.cpu(), sol_cpu.x, rtol=1e-6, atol=1e-6)


@CUDA
def test_cpu_and_cuda_inputs_mixed_raise_value_error() -> None:
    problem = complementary_qp(4, m=3, seed=4)
    args = {k: getattr(problem, k) for k in NAMES}
    args["q"] = args["q"].cuda()
    with pytest.raises(ValueError, match=r"device"):
        dqp.solve(**{k: args[k] for k in NAMES})


def _ill_conditioned(cond: float, seed: int) -> QPData:
    """complementary_qp with P's eigenvalues replaced by a log-spaced range 1..cond (the known
    solution is no longer the one of the data; the tests compare two solvers instead)."""
    problem = complementary_qp(10, m=8, p=2, seed=seed)
    _, V = torch.linalg.eigh(problem.P)
    e = torch.logspace(0, math.log10(cond), 10, dtype=torch.float64)
    P = (V * e) @ V.mT
    return _rounded(problem._replace(P=0.5 * (P + P.mT)))


def _run_solver(problem: QPData, dtype: torch.dtype, solver: str, device: str = "cpu") -> tuple:
    leaves = _leaves(problem, dtype, device)
    sol = dqp.solve(**{k: leaves.get(k) for k in NAMES}, solver=solver)
    gen = torch.Generator().manual_seed(0)
    loss = (torch.randn(sol.x.shape, generator=gen).to(sol.x) * sol.x).sum()
    loss = (
        loss + (torch.randn(sol.ineq_duals.shape, generator=gen).to(sol.x) * sol.ineq_duals).sum()
    )
    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
    return sol, grads


@pytest.mark.parametrize("cond", [1.0, 1e2, 1e4, 1e6])
@pytest.mark.parametrize("batched", [False, True])
def test_torch_solver_float32_stays_float32_and_matches_float64(
    cond: float, batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 through solver="torch": float32 outputs and gradients, accurate to float32
    rounding of the float64 (daqp) solution of the same data, also with cond(P) up to 1e6;
    the iteration runs in float32 and every factorization in float64."""
    import dxopt.qp.solvers.torch_ipm as ipm
    import dxopt.qp.solvers.torch_kkt as kkt

    problem = _ill_conditioned(cond, seed=21)
    if batched:
        problem = stack([problem, _ill_conditioned(cond, seed=22)])
    factored, chol = [], kkt.cholesky_flagged
    for module in (ipm, kkt):  # the Newton systems and the polish's penalty factor
        monkeypatch.setattr(
            module, "cholesky_flagged", lambda H: (factored.append(H.dtype), chol(H))[1]
        )
    sol32, grads32 = _run_solver(problem, torch.float32, "torch")
    monkeypatch.undo()
    sol64, grads64 = _run_solver(problem, torch.float64, "daqp")
    assert sol32.info.solver == "torch" and set(factored) == {torch.float64}
    assert sol32.info.backward.method == "torch"
    assert sol32.x.shape == sol64.x.shape
    pairs = [("x", sol32.x, sol64.x), ("eq", sol32.eq_duals, sol64.eq_duals)]
    pairs += [("ineq", sol32.ineq_duals, sol64.ineq_duals)]
    pairs += [(f"d/d{k}", grads32[k], grads64[k]) for k in grads64]
    for label, ours, reference in pairs:
        assert ours.dtype == torch.float32, label
        error = relative_error(ours, reference)
        assert error <= FLOAT32_RTOL, f"cond {cond:g}: {label} float32 relative error {error:.2e}"


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_solver_on_cuda_stays_on_the_device(dtype: torch.dtype) -> None:
    """solver="torch" on CUDA: outputs and gradients on the GPU in the input dtype, equal to
    the CPU run of the same solver within float32/float64 accuracy."""
    problem = _ill_conditioned(1e2, seed=8)
    sol_gpu, grads_gpu = _run_solver(problem, dtype, "torch", device="cuda")
    sol_cpu, grads_cpu = _run_solver(problem, dtype, "torch")
    tol = FLOAT32_RTOL if dtype == torch.float32 else 1e-10
    assert sol_gpu.x.device.type == "cuda" and sol_gpu.x.dtype == dtype
    assert relative_error(sol_gpu.x.cpu(), sol_cpu.x) <= tol
    for name, grad in grads_gpu.items():
        assert grad.device.type == "cuda" and grad.dtype == dtype, name
        assert relative_error(grad.cpu(), grads_cpu[name]) <= tol, name


@CUDA
def test_auto_picks_the_torch_solver_for_cuda_inputs() -> None:
    problem = complementary_qp(6, m=4, p=1, seed=3)
    sol = dqp.solve(
        **dict(zip("PqAbGh", (None if t is None else t.cuda() for t in problem.args())))
    )
    assert sol.info.solver == "torch" and sol.x.is_cuda


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_solver_under_torch_func_stays_on_the_device(dtype: torch.dtype) -> None:
    """torch.func on CUDA inputs: jacrev, jacfwd and vmap run the torch solver on the GPU in
    the input dtype and agree with the CPU run of the same transforms."""
    from torch.func import jacfwd, jacrev, vmap

    problem = complementary_qp(6, m=4, p=1, seed=15)
    args = tuple(None if t is None else t.to(dtype) for t in problem.args())
    solvers: list[str] = []

    def make(device: str):  # type: ignore[no-untyped-def]
        P, q, A, b, G, h = (None if t is None else t.to(device) for t in args)

        def f(q: Tensor) -> Tensor:
            sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, solver="torch")
            solvers.append(sol.info.solver)
            return sol.x

        return f, q

    f_gpu, q_gpu = make("cuda")
    f_cpu, q_cpu = make("cpu")
    tol = FLOAT32_RTOL if dtype == torch.float32 else 1e-10
    for transform in (jacrev, jacfwd):
        J = transform(f_gpu)(q_gpu)
        assert J.device.type == "cuda" and J.dtype == dtype
        assert relative_error(J.cpu(), transform(f_cpu)(q_cpu)) <= tol
    qs = q_cpu + 0.05 * torch.ones(3, 1, dtype=dtype)
    X = vmap(f_gpu)(qs.cuda())
    assert X.device.type == "cuda"
    assert relative_error(X.cpu(), vmap(f_cpu)(qs)) <= tol
    assert set(solvers) == {"torch"}
