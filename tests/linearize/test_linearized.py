"""LinearizedModel against the network and its Taylor expansion (float64 references)."""

from __future__ import annotations

import pytest
import torch
from tests.linearize.conftest import LoRALinear, random_direction
from torch import nn
from torch.func import functional_call

from dxopt.linearize import LinearizedModel, TaskVector


def _at(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return functional_call(model, {**dict(model.named_parameters()), **params}, (x,))


def test_equals_the_model_at_the_pretrained_point(tiny, images):
    lin = LinearizedModel(tiny)
    assert torch.equal(lin(images), tiny(images))
    lin.eval()
    assert torch.equal(lin(images), tiny(images))


def test_taylor_error_is_second_order(tiny, images):
    d = random_direction(tiny)
    theta0 = {n: p.detach() for n, p in tiny.named_parameters()}
    errors = []
    for h in (1e-2, 5e-3, 2.5e-3):
        step = TaskVector(d) * h
        lin = step.apply_to(LinearizedModel(tiny))
        exact = _at(tiny, {n: theta0[n] + step[n] for n in d}, images)
        errors.append((lin(images) - exact).abs().max().item())
    ratios = [errors[0] / errors[1], errors[1] / errors[2]]
    assert all(3.6 < r < 4.4 for r in ratios), (errors, ratios)


def test_jvp_matches_central_differences_and_is_affine(tiny, images):
    d = random_direction(tiny)
    theta0 = {n: p.detach() for n, p in tiny.named_parameters()}
    h = 1e-5
    plus = _at(tiny, {n: theta0[n] + h * d[n] for n in d}, images)
    minus = _at(tiny, {n: theta0[n] - h * d[n] for n in d}, images)
    fd = (plus - minus) / (2 * h)
    f0 = tiny(images)
    lin1 = TaskVector(d).apply_to(LinearizedModel(tiny))
    lin3 = TaskVector(d).apply_to(LinearizedModel(tiny), 3.0)
    torch.testing.assert_close(lin1(images) - f0, fd, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(lin3(images) - f0, 3 * (lin1(images) - f0), rtol=1e-12, atol=1e-12)


def test_gradient_wrt_deltas_is_the_transposed_jacobian(tiny, images):
    lin = TaskVector(random_direction(tiny)).apply_to(LinearizedModel(tiny), 0.1)
    w = torch.randn(6, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (lin(images) * w).sum().backward()
    # Reference: the vector-Jacobian product J^T w of the network at theta_0.
    params = [p for _, p in tiny.named_parameters()]
    ref = torch.autograd.grad((tiny(images) * w).sum(), params)
    for (n, d), r in zip(lin.delta_params().items(), ref):
        assert d.grad is not None
        torch.testing.assert_close(d.grad, r, rtol=1e-12, atol=1e-12, msg=n)
    assert all(p.grad is None for p in lin.base.parameters())


def test_only_trainable_parameters_are_linearized_with_lora():
    torch.manual_seed(0)
    model = nn.Sequential(LoRALinear(4, 3, 2), nn.Tanh(), LoRALinear(3, 2, 1)).double()
    lin = LinearizedModel(model)
    assert lin.names == ("0.A", "0.B", "2.A", "2.B")
    x = torch.randn(5, 4, dtype=torch.float64)
    d = random_direction(model)
    h = 1e-6
    lin = TaskVector(d).apply_to(lin)
    theta0 = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    plus = _at(model, {n: theta0[n] + h * d[n] for n in d}, x)
    minus = _at(model, {n: theta0[n] - h * d[n] for n in d}, x)
    torch.testing.assert_close(lin(x) - model(x), (plus - minus) / (2 * h), rtol=1e-7, atol=1e-9)


def test_buffers_are_used_and_batchnorm_updates_are_refused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
    with torch.no_grad():
        model[1].running_mean.fill_(0.5)
        model[1].running_var.fill_(2.0)
    model.eval()
    x = torch.randn(7, 3, dtype=torch.float64)
    lin = LinearizedModel(model).eval()
    assert torch.equal(lin(x), model(x))
    lin.train()
    with pytest.raises(ValueError, match="running statistics"):
        lin(x)
    stats_free = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False))
    lin2 = LinearizedModel(stats_free.double()).train()
    torch.testing.assert_close(lin2(x), stats_free(x), rtol=0, atol=0)


def test_dropout_follows_train_and_eval():
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5), nn.Linear(8, 2)).double()
    lin = LinearizedModel(model)
    x = torch.randn(4, 3, dtype=torch.float64)
    lin.train()
    torch.manual_seed(5)
    a = lin(x)
    model.train()
    torch.manual_seed(5)
    torch.testing.assert_close(a, model(x), rtol=0, atol=0)
    lin.eval()
    model.eval()
    torch.testing.assert_close(lin(x), model(x), rtol=0, atol=0)


def test_tuple_outputs_and_keyword_arguments():
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x, *, scale=1.0):
            h = torch.tanh(self.fc(x))
            return h * scale, {"sq": h.pow(2)}

    torch.manual_seed(0)
    model = TwoHeads().double()
    d = random_direction(model)
    lin = TaskVector(d).apply_to(LinearizedModel(model), 1e-3)
    x = torch.randn(2, 3, dtype=torch.float64)
    a, b = lin(x, scale=2.0)
    a0, b0 = model(x, scale=2.0)
    assert a.shape == a0.shape and b["sq"].shape == b0["sq"].shape
    assert (a - a0).abs().max() < 1e-2 and (a - a0).abs().max() > 0


def test_nonlinear_model_is_the_network_at_theta0_plus_delta(tiny, images):
    d = random_direction(tiny)
    lin = TaskVector(d).apply_to(LinearizedModel(tiny), 0.2)
    net = lin.nonlinear_model()
    theta0 = {n: p.detach() for n, p in tiny.named_parameters()}
    ref = _at(tiny, {n: theta0[n] + 0.2 * d[n] for n in d}, images)
    torch.testing.assert_close(net(images), ref, rtol=1e-12, atol=1e-12)
