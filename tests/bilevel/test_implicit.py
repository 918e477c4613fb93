"""The implicit-differentiation layer for nn.Module inner problems (issue 11, bilevel)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from dxopt import DxoptError
from dxopt.bilevel import ImplicitArgmin, ImplicitSolveError, implicit_argmin


def _ridge_data(n: int = 40, d: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    w_true = torch.randn(d, 1, generator=g, dtype=torch.float64)
    Y = X @ w_true + 0.3 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return X[:25], Y[:25], X[25:], Y[25:]


def _ridge_problem():
    Xt, Yt, Xv, Yv = _ridge_data()
    model = nn.Linear(5, 1, bias=False).double()

    def inner_loss(p: dict[str, torch.Tensor], log_lam: torch.Tensor) -> torch.Tensor:
        fit = 0.5 * ((functional_call(model, p, (Xt,)) - Yt) ** 2).mean()
        return fit + 0.5 * log_lam.exp() * (p["weight"] ** 2).sum()

    def closed_form_val_loss(log_lam: torch.Tensor) -> torch.Tensor:
        n = Xt.shape[0]
        A = Xt.T @ Xt / n + log_lam.exp() * torch.eye(5, dtype=torch.float64)
        w = torch.linalg.solve(A, Xt.T @ Yt / n)
        return 0.5 * ((Xv @ w - Yv) ** 2).mean()

    def val_loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return 0.5 * ((functional_call(model, p, (Xv,)) - Yv) ** 2).mean()

    return model, inner_loss, closed_form_val_loss, val_loss, (Xt, Yt)


def test_ridge_hypergradient_matches_the_closed_form() -> None:
    model, inner_loss, closed_form, val_loss, _ = _ridge_problem()
    for value in (-3.0, -0.5, 1.0):
        log_lam = torch.tensor(value, dtype=torch.float64, requires_grad=True)
        layer = ImplicitArgmin(model, inner_loss, tol=1e-8, cg_rtol=1e-12)
        w_star = layer(log_lam)
        assert layer.status.ok
        (grad,) = torch.autograd.grad(val_loss(w_star), log_lam)
        ref_log_lam = log_lam.detach().clone().requires_grad_(True)
        (ref,) = torch.autograd.grad(closed_form(ref_log_lam), ref_log_lam)
        torch.testing.assert_close(grad, ref, rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(val_loss(w_star), closed_form(log_lam.detach()))


def test_solving_apart_from_differentiating_with_a_given_solution() -> None:
    _, inner_loss, closed_form, val_loss, (Xt, Yt) = _ridge_problem()
    log_lam = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    n = Xt.shape[0]
    A = Xt.T @ Xt / n + log_lam.detach().exp() * torch.eye(5, dtype=torch.float64)
    solution = {"weight": torch.linalg.solve(A, Xt.T @ Yt / n).T.contiguous()}
    w_star = implicit_argmin(inner_loss, solution, log_lam, tol=1e-12, cg_rtol=1e-13)
    (grad,) = torch.autograd.grad(val_loss(w_star), log_lam)
    ref_log_lam = log_lam.detach().clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(closed_form(ref_log_lam), ref_log_lam)
    torch.testing.assert_close(grad, ref, rtol=1e-9, atol=1e-13)


def test_a_non_stationary_solution_is_refused() -> None:
    model, inner_loss, _, _, _ = _ridge_problem()
    log_lam = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ImplicitSolveError, match="not a stationary point") as info:
        implicit_argmin(inner_loss, dict(model.named_parameters()), log_lam)
    assert isinstance(info.value, DxoptError) and isinstance(info.value, RuntimeError)

    def unbounded(p: dict[str, torch.Tensor], log_lam: torch.Tensor) -> torch.Tensor:
        return log_lam.exp() * p["weight"].sum()  # no minimizer, zero Hessian

    with pytest.raises(ImplicitSolveError, match="not a stationary point"):
        ImplicitArgmin(model, unbounded, max_iter=2)(log_lam)


def test_an_indefinite_inner_hessian_is_refused_in_backward() -> None:
    w = {"w": torch.zeros(2, dtype=torch.float64)}
    lam = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)

    def saddle(p: dict[str, torch.Tensor], lam: torch.Tensor) -> torch.Tensor:
        return 0.5 * lam * (p["w"][0] ** 2 - p["w"][1] ** 2)

    out = implicit_argmin(saddle, w, lam)
    with pytest.raises(ImplicitSolveError, match="positive definite"):
        out["w"].sum().backward()


def test_bad_arguments_are_named() -> None:
    model, inner_loss, _, _, _ = _ridge_problem()
    lam = torch.tensor(0.0, dtype=torch.float64)
    with pytest.raises(TypeError, match="params: expected a non-empty mapping"):
        implicit_argmin(inner_loss, [], lam)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="hparams\\[0\\]: expected a floating-point tensor"):
        implicit_argmin(inner_loss, dict(model.named_parameters()), 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"model: expected a torch\.nn\.Module"):
        ImplicitArgmin("net", inner_loss)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_failure: expected one of"):
        ImplicitArgmin(model, inner_loss, on_failure="nan")


def _diabetes_splits():
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X = torch.as_tensor(X, dtype=torch.float64)
    y = torch.as_tensor(y, dtype=torch.float64).unsqueeze(1)
    perm = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(0))
    train, val = perm[:300], perm[300:]
    mx, sx = X[train].mean(0), X[train].std(0)
    my, sy = y[train].mean(), y[train].std()
    X, y = (X - mx) / sx, (y - my) / sy
    return X[train], y[train], X[val], y[val]


def test_tunes_an_mlp_weight_decay_on_diabetes() -> None:
    """Hypergradient descent on log(weight decay) of a tanh MLP lowers the validation loss,
    and the first hypergradient agrees with a finite difference of the re-solved problem."""
    Xt, Yt, Xv, Yv = _diabetes_splits()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 1)).double()

    def inner_loss(p: dict[str, torch.Tensor], log_wd: torch.Tensor) -> torch.Tensor:
        fit = ((functional_call(model, p, (Xt,)) - Yt) ** 2).mean()
        return fit + 0.5 * log_wd.exp() * sum((w**2).sum() for w in p.values())

    def val_loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return ((functional_call(model, p, (Xv,)) - Yv) ** 2).mean()

    layer = ImplicitArgmin(model, inner_loss, max_iter=1000, tol=1e-8)
    log_wd = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)

    # the first hypergradient against a central difference (inner re-solved from w*)
    w_star = layer(log_wd)
    (grad,) = torch.autograd.grad(val_loss(w_star), log_wd)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    h, values = 1e-4, []
    for shift in (h, -h):
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(start[n])
        values.append(val_loss(layer(log_wd.detach() + shift)).item())
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    fd = (values[0] - values[1]) / (2 * h)
    assert grad.item() == pytest.approx(fd, rel=1e-4, abs=1e-8)
    assert grad.item() > 0  # heavy decay at wd = 1: lowering it helps

    opt = torch.optim.Adam([log_wd], lr=0.5)
    history = []
    for _ in range(10):
        opt.zero_grad()
        loss = val_loss(layer(log_wd))
        loss.backward()
        opt.step()
        history.append(loss.item())
    final = val_loss(layer(log_wd)).item()
    assert log_wd.item() < -2.0
    assert final < 0.75 * history[0], (history, final)


def test_a_later_warm_started_solve_does_not_change_an_earlier_derivative() -> None:
    model, inner_loss, closed_form, val_loss, _ = _ridge_problem()
    layer = ImplicitArgmin(model, inner_loss, tol=1e-8, cg_rtol=1e-12)
    first = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    loss = val_loss(layer(first))
    layer(torch.tensor(2.0, dtype=torch.float64))  # moves the model's parameters in place
    (grad,) = torch.autograd.grad(loss, first)
    ref_point = first.detach().clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(closed_form(ref_point), ref_point)
    torch.testing.assert_close(grad, ref, rtol=1e-6, atol=1e-12)


def test_float32_model_gets_a_dtype_aware_backward_tolerance() -> None:
    """Default tolerances follow the dtype: a float32 model is differentiated (was refused by
    a float64-level CG tolerance), within float32 accuracy of the float64 closed form."""
    model, _, closed_form, _, (Xt, Yt) = _ridge_problem()
    model = model.float()
    Xt32, Yt32 = Xt.float(), Yt.float()
    _, _, Xv, Yv = _ridge_data()

    def inner32(p: dict[str, torch.Tensor], log_lam: torch.Tensor) -> torch.Tensor:
        fit = 0.5 * ((functional_call(model, p, (Xt32,)) - Yt32) ** 2).mean()
        return fit + 0.5 * log_lam.exp() * (p["weight"] ** 2).sum()

    log_lam = torch.tensor(-1.0, requires_grad=True)
    w_star = ImplicitArgmin(model, inner32)(log_lam)
    val = 0.5 * ((functional_call(model, w_star, (Xv.float(),)) - Yv.float()) ** 2).mean()
    (grad,) = torch.autograd.grad(val, log_lam)
    ref_point = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    (ref,) = torch.autograd.grad(closed_form(ref_point), ref_point)
    assert grad.dtype == torch.float32
    assert abs(grad.item() - ref.item()) <= 1e-3 * abs(ref.item()) + 1e-6
