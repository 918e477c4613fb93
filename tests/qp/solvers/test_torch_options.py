"""One options record for the torch solver (TorchOptions) and one place that builds and
rebuilds its result (TorchQPResult.outputs / from_outputs)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dxopt.qp.autograd.torch_entry import TORCH_OPTIONS, torch_qp_solve
from dxopt.qp.solvers.torch_types import TorchOptions, TorchQPResult

D = torch.float64


def test_the_record_checks_and_takes_only_the_solver_options() -> None:
    assert TORCH_OPTIONS == ("eps_inf", "max_iter", "check_every", "max_refinement")
    opts = TorchOptions.of({"max_iter": 7}, eps_abs=1e-8, eps_rel=1e-9, polish=False)
    assert opts == TorchOptions(eps_abs=1e-8, eps_rel=1e-9, polish=False, max_iter=7)
    with pytest.raises(ValueError, match=r"the torch solver takes .* unknown options \['tol'\]"):
        TorchOptions.of({"tol": 1.0}, eps_abs=1e-9, eps_rel=0.0, polish=True)
    with pytest.raises(ValueError, match="max_iter: expected an integer >= 1, got 0"):
        TorchOptions(max_iter=0)
    with pytest.raises(ValueError, match="eps_rel: expected a non-negative finite number"):
        TorchOptions(eps_rel=-1.0)
    for old_name in ("max_refine", "refine_steps"):  # the deprecated names of max_refinement
        with pytest.warns(DeprecationWarning, match=f"'{old_name}' is renamed 'max_refinement'"):
            old = TorchOptions.of({old_name: 2}, eps_abs=1e-9, eps_rel=0.0, polish=True)
        assert old.max_refinement == 2


def test_the_result_round_trips_through_its_outputs() -> None:
    """The Function's outputs are the result's fields; the differentiable path rebuilds the
    same result as the detached one (same solve, same tensors)."""
    P = torch.eye(3, dtype=D)
    q = torch.tensor([-1.0, 0.5, 2.0], dtype=D)
    G, h = torch.eye(3, dtype=D), torch.full((3,), 0.25, dtype=D)
    plain = torch_qp_solve(P, q, G=G, h=h)
    back = TorchQPResult.from_outputs(plain.outputs(), plain.factor.max_refine)
    for f in dataclasses.fields(TorchQPResult):
        a, b = getattr(plain, f.name), getattr(back, f.name)
        assert a is b or a == b
    q_leaf = q.clone().requires_grad_()
    with_grad = torch_qp_solve(P, q_leaf, G=G, h=h)
    torch.testing.assert_close(with_grad.x.detach(), plain.x, rtol=0, atol=0)
    assert with_grad.factor.max_refine == plain.factor.max_refine
    # x = min(-q, 0.25): row 0 active (dx0/dq = 0), rows 1, 2 free (dx/dq = -1)
    torch.testing.assert_close(plain.x[0], torch.tensor([0.25, -0.5, -2.0], dtype=D))
    with_grad.x.sum().backward()
    assert q_leaf.grad is not None
    torch.testing.assert_close(q_leaf.grad, torch.tensor([0.0, -1.0, -1.0], dtype=D))
