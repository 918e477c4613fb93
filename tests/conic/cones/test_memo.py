"""The projection memo of the root-finding cones (exponential, power): inside a
``memo_scope`` a repeated input is answered from the memo with the very same values, a
different input (one entry changed, another cone, another ``alpha``) is solved afresh, inputs
with autograd history and calls outside a scope never touch it, and the engine's forward and
backward give the same results with and without it."""

from __future__ import annotations

import pytest
import torch

import dxopt.conic.cones._surface as surface
from dxopt import conic
from dxopt.conic.cones._surface import ProjectionMemo, memo_scope
from dxopt.conic.cones.exp import ExpCone, ExpDualCone
from dxopt.conic.cones.power import PowerCone


@pytest.fixture
def root_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the scalar root-finds (the expensive part the memo saves)."""
    calls: list[int] = []
    original = surface.safeguarded_root

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    import dxopt.conic.cones.exp as exp
    import dxopt.conic.cones.power as power

    monkeypatch.setattr(exp, "safeguarded_root", counted)
    monkeypatch.setattr(power, "safeguarded_root", counted)
    return calls


def _points(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(12, 3, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("cone", [ExpCone(), ExpDualCone(), PowerCone(0.3)], ids=str)
def test_a_repeated_input_is_answered_from_the_memo_exactly(cone, root_calls):
    v = _points(0)
    fresh_p, fresh_d = cone.project(v), cone.dproject(v)
    fresh_k = cone.kink(v, 1e-3)
    before = len(root_calls)
    assert before == 3  # outside a scope: every call solves
    with memo_scope(ProjectionMemo()):
        p1 = cone.project(v)
        d1 = cone.dproject(v)
        k1 = cone.kink(v, 1e-3)
        p2 = cone.project(v.clone())
    # project and dproject share one input: one solve; the kink test (of -v for the dual
    # cone, of v itself otherwise) reuses it or adds one
    assert len(root_calls) - before <= 2
    assert torch.equal(p1, fresh_p) and torch.equal(p2, fresh_p)
    assert torch.equal(d1, fresh_d) and torch.equal(k1, fresh_k)


def test_a_different_input_is_solved_afresh(root_calls):
    K = ExpCone()
    v = _points(1)
    w = v.clone()
    w[7, 1] += 1e-3  # one entry of one row
    expected = K.project(w)
    with memo_scope(ProjectionMemo()):
        K.project(v)
        n = len(root_calls)
        got = K.project(w)
        assert len(root_calls) == n + 1
        # another alpha of the power cone is another projection
        PowerCone(0.3).project(v)
        m = len(root_calls)
        other = PowerCone(0.6).project(v)
        assert len(root_calls) == m + 1
    assert torch.equal(got, expected)
    assert torch.equal(other, PowerCone(0.6).project(v))


def test_the_memo_keeps_its_last_entries_only(root_calls):
    K = ExpCone()
    memo = ProjectionMemo()
    with memo_scope(memo):
        for seed in range(ProjectionMemo.SIZE + 2):
            K.project(_points(10 + seed))
        n = len(root_calls)
        K.project(_points(10 + ProjectionMemo.SIZE + 1))  # the newest: kept
        assert len(root_calls) == n
        K.project(_points(10))  # the oldest: dropped
        assert len(root_calls) == n + 1


def test_autograd_inputs_are_not_memoised(root_calls):
    K = ExpCone()
    v = _points(2).requires_grad_()
    with memo_scope(ProjectionMemo()):
        a = K.project(v)
        b = K.project(v)
    assert len(root_calls) == 2
    (g,) = torch.autograd.grad(b.sum(), v)
    assert torch.isfinite(g).all() and torch.equal(a.detach(), b.detach())


def test_the_engine_gives_the_same_answer_with_the_memo_disabled(monkeypatch):
    """An exp-cone program's solution and gradients: with the memo's lookups only, exactly
    those without any memo; with its warm starts too, the same to 1e-12."""

    # min -x1 + x2 s.t. (x1 - 1, c, x2) in K_exp, i.e. x2 >= c e^{(x1 - 1)/c}: x = (1, c)
    def run() -> tuple[torch.Tensor, ...]:
        q = torch.tensor([-1.0, 1.0], dtype=torch.float64, requires_grad=True)
        A = torch.tensor([[-1.0, 0.0], [0.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
        A.requires_grad_()
        b = torch.tensor([-1.0, 1.3, 0.0], dtype=torch.float64, requires_grad=True)
        sol = conic.solve(None, q, A, b, cones=[ExpCone()], atol=1e-10, rtol=1e-10)
        (sol.x.sum() + sol.y.sum()).backward()
        out = (sol.x.detach(), sol.y.detach(), q.grad, A.grad, b.grad)
        assert all(t is not None for t in out)
        return out  # type: ignore[return-value]

    full = run()
    assert torch.allclose(full[0], torch.tensor([1.0, 1.3], dtype=torch.float64), atol=1e-7)
    monkeypatch.setattr(ProjectionMemo, "latest", lambda self, tag, v: None)
    lookups_only = run()
    monkeypatch.setattr(ProjectionMemo, "lookup", lambda self, tag, v: None)
    without = run()
    for a, b, c in zip(full, lookups_only, without):
        assert torch.equal(b, c)
        assert (a - c).abs().amax() <= 1e-12 * max(1.0, float(c.abs().amax()))


def test_a_nearby_point_warm_starts_the_root_to_the_same_projection(monkeypatch):
    """The memo's newest entry of the same shape starts the case-4 root-find: fewer Newton
    rounds, the same projection and Jacobian to round-off (its hint may also be far off or
    come from rows of another case: the bracket keeps the root)."""
    import dxopt.conic.cones.exp as exp

    iterations: list[int] = []
    original = exp.safeguarded_root

    def counted(fun, lo, hi, **kwargs):  # type: ignore[no-untyped-def]
        n = [0]

        def f(x):  # type: ignore[no-untyped-def]
            n[0] += 1
            return fun(x)

        out = original(f, lo, hi, **kwargs)
        iterations.append(n[0])
        return out

    monkeypatch.setattr(exp, "safeguarded_root", counted)
    K = ExpCone()
    v = _points(3)
    near = v + 1e-6 * _points(4)
    far = -_points(5)  # other rows, other cases: a hint for the wrong points
    cold_p, cold_d = K.project(near), K.dproject(near)
    cold_far = K.project(far)
    cold_iters = iterations[0]
    with memo_scope(ProjectionMemo()):
        K.project(v)
        iterations.clear()
        warm_p = K.project(near)
        warm_d = K.dproject(near)
        assert iterations and iterations[0] < cold_iters
        warm_far = K.project(far)
    scale = near.abs().amax()
    assert (warm_p - cold_p).abs().amax() <= 8 * torch.finfo(torch.float64).eps * scale
    assert (warm_d - cold_d).abs().amax() <= 1e-12
    assert (warm_far - cold_far).abs().amax() <= 8 * torch.finfo(
        torch.float64
    ).eps * far.abs().amax()


def test_the_psd_cone_decomposes_a_repeated_point_once(monkeypatch):
    from dxopt.conic.cones.psd import PSDCone

    K = PSDCone(3)
    v = torch.randn(5, K.dim, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    fresh = (K.project(v), K.dproject(v), K.kink(v, 1e-3))
    calls: list[int] = []
    eigh = torch.linalg.eigh

    def counted(X):  # type: ignore[no-untyped-def]
        calls.append(1)
        return eigh(X)

    monkeypatch.setattr(torch.linalg, "eigh", counted)
    with memo_scope(ProjectionMemo()):
        memo = (K.project(v), K.dproject(v), K.kink(v, 1e-3))
        K.project(-v)
    assert len(calls) == 2  # v once, -v once
    for a, b in zip(fresh, memo):
        assert torch.equal(a, b)
