"""The curvature penalty against an explicit Gauss-Newton matrix; the distillation pieces."""

from __future__ import annotations

import math

import pytest
import torch
from tests.linearize.conftest import random_direction
from torch import nn
from torch.func import functional_call, jacrev

from dxopt.linearize import (
    CurvaturePenalty,
    TaskVector,
    alpha_range,
    call_along_ray,
    distillation_loss,
    sample_alpha,
)


def _explicit_gauss_newton(model, x, normalize):
    names = [n for n, _ in model.named_parameters()]
    theta0 = {n: p.detach() for n, p in model.named_parameters()}
    flat0 = torch.cat([theta0[n].reshape(-1) for n in names])

    def feats(flat):
        params, i = {}, 0
        for n in names:
            k = theta0[n].numel()
            params[n] = flat[i : i + k].reshape(theta0[n].shape)
            i += k
        out = functional_call(model, params, (x,))
        return nn.functional.normalize(out, dim=1) if normalize else out

    jac = jacrev(feats)(flat0)  # (B, F, P)
    return torch.einsum("bfp,bfq->pq", jac, jac) / x.shape[0], names


@pytest.mark.parametrize("normalize", [True, False])
def test_penalty_is_the_gauss_newton_quadratic_form(tiny, images, normalize):
    pen = CurvaturePenalty(tiny, images, normalize=normalize)
    d = random_direction(tiny)
    G, names = _explicit_gauss_newton(tiny, images, normalize)
    v = torch.cat([d[n].reshape(-1) for n in names])
    ref = v @ G @ v
    tau = {n: t.clone().requires_grad_(True) for n, t in d.items()}
    value = pen(tau)
    torch.testing.assert_close(value, ref, rtol=1e-10, atol=0)
    value.backward()
    grad = torch.cat([tau[n].grad.reshape(-1) for n in names])
    torch.testing.assert_close(grad, 2 * G @ v, rtol=1e-9, atol=1e-12)
    # Quadratic: R(0) = 0 and R(2 tau) = 4 R(tau).
    assert pen(TaskVector(d) * 0.0).item() == 0.0
    torch.testing.assert_close(pen(TaskVector(d) * 2.0), 4 * ref, rtol=1e-10, atol=0)


def test_minibatch_penalty_averages_to_the_full_one(tiny, images):
    d = random_direction(tiny)
    full = CurvaturePenalty(tiny, images)(d).item()
    per_example = [CurvaturePenalty(tiny, images[i : i + 1])(d).item() for i in range(6)]
    assert full == pytest.approx(sum(per_example) / 6, rel=1e-12)
    pen = CurvaturePenalty(tiny, images, batch_size=3, generator=torch.Generator().manual_seed(0))
    draws = [pen(d).item() for _ in range(20)]
    assert all(min(per_example) <= v <= max(per_example) for v in draws)


def test_distillation_loss_is_zero_when_student_equals_teacher():
    s = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    for norm in ("squared_l2", "l1", "cosine"):
        loss = distillation_loss(s, s.detach().clone(), norm=norm)
        assert abs(loss.item()) < 1e-15, norm
    loss = distillation_loss(s, s.detach().clone())
    loss.backward()
    assert s.grad is not None and s.grad.abs().max().item() == 0.0


def test_distillation_loss_values_and_teacher_is_detached():
    s = torch.tensor([[1.0, 2.0], [0.0, -1.0]], dtype=torch.float64)
    t = torch.tensor([[0.0, 0.0], [0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    assert distillation_loss(s, t).item() == pytest.approx((5.0 + 4.0) / 2)
    assert distillation_loss(s, t, norm="l1").item() == pytest.approx((3.0 + 2.0) / 2)
    cos = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 3.0]])
    assert distillation_loss(*cos, norm="cosine").item() == pytest.approx(1.0)
    assert not distillation_loss(s, t).requires_grad


def test_student_equal_to_teacher_along_the_ray_gives_zero_loss(tiny, images):
    theta0 = {n: p.detach().clone() for n, p in tiny.named_parameters()}
    student = TaskVector(random_direction(tiny)).apply_to(tiny, 0.1)
    teacher = TaskVector(random_direction(tiny)).apply_to(tiny, 0.1)
    teacher.load_state_dict(student.state_dict())
    for alpha in (0.5, 1.0, 2.0):
        s = call_along_ray(student, theta0, alpha, images)
        t = call_along_ray(teacher, theta0, alpha, images)
        assert distillation_loss(s, t).item() == 0.0


def test_call_along_ray_endpoints(tiny, images):
    theta0 = {n: p.detach().clone() for n, p in tiny.named_parameters()}
    moved = TaskVector(random_direction(tiny)).apply_to(tiny, 0.1)
    torch.testing.assert_close(call_along_ray(moved, theta0, 0.0, images), tiny(images))
    torch.testing.assert_close(call_along_ray(moved, theta0, 1.0, images), moved(images))
    half = TaskVector.from_models(tiny, moved).apply_to(tiny, 0.5)
    torch.testing.assert_close(call_along_ray(moved, theta0, 0.5, images), half(images))


def test_alpha_curriculum():
    assert alpha_range(0.0) == (1.0, 1.0)
    assert alpha_range(1.0) == (0.5, 2.0)
    lo, hi = alpha_range(0.25)
    assert lo == pytest.approx(0.75) and hi == pytest.approx(1.5)
    g = torch.Generator().manual_seed(0)
    draws = [sample_alpha(0.25, generator=g) for _ in range(200)]
    assert min(draws) >= 0.75 and max(draws) <= 1.5
    assert abs(sum(draws) / 200 - 1.125) < 3 * (0.75 / math.sqrt(12)) / math.sqrt(200)
