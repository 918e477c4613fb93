"""dtype and device handling of dxopt.qp: float32 in -> float32 out, CUDA round trip.

float32 results are compared with a float64 solve of the *same* (float32-rounded) data, so
the only differences are the computation's own. dxopt solves in float64 internally and rounds
the outputs, so the measured difference is 4.9e-8 (relative, x, multipliers and every
gradient); the tolerance ``FLOAT32_RTOL`` = 1e-6 (about 8 float32 epsilons) is still far below
any error a wrong float32 path (a lost cast, a float32 factorisation) would make.
"""

from __future__ import annotations

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
    sol = dqp.solve(*(leaves.get(k) for k in NAMES), backward=backward)
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
        dqp.solve(*(args[k] for k in NAMES))
    message = str(error.value)
    assert "float32" in message and "float64" in message, message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_unsupported_dtypes_are_rejected(dtype: torch.dtype) -> None:
    problem = complementary_qp(4, m=3, seed=2)
    args = [None if t is None else t.to(dtype) for t in problem.args()]
    with pytest.raises((ValueError, TypeError), match=r"dtype|float"):
        dqp.solve(*args)


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
        dqp.solve(*(args[k] for k in NAMES))


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
        dqp.solve(*(args[k] for k in NAMES))
