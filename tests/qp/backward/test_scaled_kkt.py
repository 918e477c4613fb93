"""The exact KKT backward on badly scaled problems: a scale-invariant judgement, and an
adjoint with a large residual refused rather than returned.

The problem of ``tests/qp/certify/test_routes_agree.py`` (n = 6, 3 of 8 inequality rows and 2
equality rows active, strictly complementary) with its objective (P, q) and its rows (G, h and
A, b) scaled separately by 1e-6..1e6, and the inverse-scaled one of that file (objective 1e-6,
rows 1e6, equality rows 1e-6). The gradients of ``q``, ``h`` and ``b`` of ``w @ x`` must equal
the exact reduced-KKT gradient (solved on the equilibrated system in numpy) and kink-aware
one-sided finite differences (steps relative to each input's magnitude, so the verdict is
itself scale-invariant). The old code judged the inverse-scaled KKT system unsolved (its
residual test was relative to the unscaled matrix), fell back to the pseudo-inverse, whose SVD
cut-off dropped a direction, and returned a residual of 0.18 as the gradient.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import dxopt.qp as dqp
import dxopt.qp.backward.base as backward_base
from dxopt.qp import KKTBackward, QPBackwardError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "certify"))
from _fd import one_sided
from test_routes_agree import N, _batch, _problem

SCALES = (1e-6, 1e-3, 1.0, 1e3, 1e6)
W = np.random.default_rng(5).standard_normal(N)


def _scaled(objective: float, rows: float) -> dict[str, np.ndarray]:
    d = _problem("well")
    return {
        "P": objective * d["P"], "q": objective * d["q"], "G": rows * d["G"],
        "h": rows * d["h"], "A": rows * d["A"], "b": rows * d["b"],
    }  # fmt: skip


def _exact(d: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    """The exact gradients of ``W @ x`` from the reduced KKT system on the active rows
    (slack zero to round-off; the problem is strictly complementary), solved on the
    equilibrated matrix ``DKD``."""
    slack = d["h"] - d["G"] @ x
    active = np.abs(slack) <= 1e-9 * np.abs(d["G"]).sum(1) * max(1.0, np.abs(x).max())
    assert active.sum() == 3, slack
    C = np.concatenate([d["G"][active], d["A"]])
    k = C.shape[0]
    K = np.block([[d["P"], C.T], [C, np.zeros((k, k))]])
    dx = 1.0 / np.sqrt(np.diag(d["P"]))
    dc = 1.0 / np.linalg.norm(C * dx, axis=1)
    D = np.concatenate([dx, dc])
    z = D * np.linalg.solve(D[:, None] * K * D, D * np.concatenate([W, np.zeros(k)]))
    grad_h = np.zeros(d["h"].shape)
    grad_h[active] = z[N : N + 3]
    return {"q": -z[:N], "h": grad_h, "b": z[N + 3 :]}


def _gradients(d: dict[str, np.ndarray], backward) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    ins = {k: torch.tensor(v, requires_grad=k in ("q", "h", "b")) for k, v in d.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", dqp.QPDegenerateWarning)  # no spurious degeneracy
        sol = dqp.solve(**ins, backward=backward)
        (sol.x * torch.tensor(W)).sum().backward()
    return sol.x.detach().numpy(), {k: ins[k].grad.numpy() for k in ("q", "h", "b")}


def _loss(d: dict[str, np.ndarray]) -> float:
    sol = dqp.solve(**{k: torch.tensor(v) for k, v in d.items()})
    return float(sol.x.numpy() @ W)


def _check(d: dict[str, np.ndarray]) -> None:
    x, grads = _gradients(d, KKTBackward())
    exact = _exact(d, x)
    scale = max(float(np.abs(g).max()) for g in exact.values())
    for key in ("q", "h", "b"):
        err = float(np.abs(grads[key] - exact[key]).max())
        assert err <= 1e-7 * scale, (key, grads[key], exact[key])
    rng = np.random.default_rng(7)
    verdicts = 0
    for key in ("q", "h", "b"):
        base = d[key]
        direction = rng.standard_normal(base.shape) * float(np.abs(base).max())
        quotients = one_sided(lambda v, key=key: _loss({**d, key: v}), base, direction)
        if not quotients:  # unstable on both sides: no verdict
            continue
        analytic = float(grads[key] @ direction)
        tol = 1e-5 * (1.0 + abs(analytic))
        assert min(abs(analytic - q) for q in quotients) <= tol, (key, analytic, quotients)
        verdicts += 1
    assert verdicts == 3  # every input judged (strictly complementary: no kink)


@pytest.mark.parametrize("objective", SCALES)
def test_objective_scaling(objective):
    _check(_scaled(objective, 1.0))


@pytest.mark.parametrize("rows", SCALES)
def test_row_scaling(rows):
    _check(_scaled(1.0, rows))


@pytest.mark.parametrize("sample", [0, 1])
def test_inverse_scaled_problem_is_regular(sample):
    """The inverse-scaled problem of test_routes_agree: the KKT matrix is regular, the KKT
    backward says so (no pseudo-inverse, no warning) and its gradient is the exact one."""
    d = {k: v[sample] for k, v in _batch("scaled_inverse").items()}
    _check(d)
    ins = {k: torch.tensor(v, requires_grad=k == "q") for k, v in d.items()}
    sol = dqp.solve(**ins, backward="kkt")
    (sol.x * torch.tensor(W)).sum().backward()
    info = sol.info.backward
    assert info is not None and not any(info.pseudo_inverse), info
    assert info.residual <= 1e-8, info


def test_pseudo_inverse_with_large_residual_is_refused(monkeypatch):
    """Forced onto the pseudo-inverse fallback (the regular ladder and the exact solve made to
    decline), the inverse-scaled problem's least-squares adjoint leaves a residual of 0.18 on
    a matrix that is nonsingular once equilibrated: it must be refused, not returned."""
    monkeypatch.setattr(backward_base, "regular_adjoint", lambda *a, **k: None)

    def declined(self, data, active, diagnostics):
        raise QPBackwardError("declined (test)")

    monkeypatch.setattr(KKTBackward, "_adjoint", declined)
    d = {k: v[1] for k, v in _batch("scaled_inverse").items()}
    ins = {k: torch.tensor(v, requires_grad=k == "q") for k, v in d.items()}
    sol = dqp.solve(**ins, backward="kkt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(QPBackwardError, match=r"pseudo-inverse.*refused"):
            (sol.x * torch.tensor(W)).sum().backward()


def test_pseudo_inverse_fallback_keeps_a_good_adjoint(monkeypatch):
    """The refusal judges the residual, not the route: forced onto the same
    fallback, a well-scaled regular problem gets its exact adjoint (residual ~ 0)."""
    monkeypatch.setattr(backward_base, "regular_adjoint", lambda *a, **k: None)

    def declined(self, data, active, diagnostics):
        raise QPBackwardError("declined (test)")

    monkeypatch.setattr(KKTBackward, "_adjoint", declined)
    d = _scaled(1.0, 1.0)
    ins = {k: torch.tensor(v, requires_grad=k == "q") for k, v in d.items()}
    sol = dqp.solve(**ins, backward="kkt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (sol.x * torch.tensor(W)).sum().backward()
    x = sol.x.detach().numpy()
    exact = _exact(d, x)["q"]
    assert np.abs(ins["q"].grad.numpy() - exact).max() <= 1e-8 * np.abs(exact).max()
