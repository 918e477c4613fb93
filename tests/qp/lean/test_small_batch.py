"""The lean batch path (dxopt.qp.lean.small_batch) against the general path and finite
differences: same solutions, statuses, info, gradients (summed over the batch for shared
inputs) and diagnostics; a batch with any sample it must not decide (degenerate, weak, zero
row, infeasible, bad input) goes to the general path as a whole."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from _fd import directional_verdicts

import dxopt.qp as dqp
import dxopt.qp.api.route as api
from dxopt.qp.lean import small_batch as _small_batch

NAMES = ("P", "q", "A", "b", "G", "h")
LEAN = "SmallQPFunction"  # the lean paths' autograd.Function (general path: QPFunction)


def _problems(B: int, n: int, m: int, p: int, seed: int, dtype=torch.float64) -> dict:
    """``B`` random strictly convex QPs with a feasible interior (about half the rows
    active), stacked along a first axis."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {k: [] for k in NAMES}
    for _ in range(B):
        M = rng.standard_normal((n, n))
        out["P"].append(M @ M.T + 0.5 * np.eye(n))
        out["q"].append(rng.standard_normal(n))
        x0 = rng.standard_normal(n)
        A = rng.standard_normal((p, n))
        out["A"].append(A)
        out["b"].append(A @ x0)
        G = rng.standard_normal((m, n))
        out["G"].append(G)
        out["h"].append(G @ x0 + rng.uniform(0.0, 1.0, m) * (rng.random(m) < 0.5))
    data = {k: torch.tensor(np.stack(v), dtype=dtype) for k, v in out.items()}
    if not p:
        data["A"] = data["b"] = None
    if not m:
        data["G"] = data["h"] = None
    return data


def _share(data: dict, keys: tuple[str, ...]) -> dict:
    """The inputs ``keys`` shared by the batch (the first sample's, without the batch axis)."""
    return {k: (v[0].clone() if k in keys and v is not None else v) for k, v in data.items()}


def _run(data: dict, lean: bool, monkeypatch, *, backward="penalty", **kw):
    """Solve (daqp unless ``kw`` names a solver: the lean batch path with daqp gives the
    general path's points bit for bit), backpropagate ``w.x + u.nu + v.mu`` and return the
    solution and gradients."""
    kw = {"solver": "daqp", **kw}
    with monkeypatch.context() as mp:
        if not lean:
            mp.setattr(api, "small_batch_inputs", lambda *a, **k: 0)
        ins = {k: None if v is None else v.clone().requires_grad_() for k, v in data.items()}
        sol = dqp.solve(**{k: ins[k] for k in NAMES}, backward=backward, **kw)
        used = LEAN in type(sol.x.grad_fn).__name__
        rng = np.random.default_rng(7)
        loss = (
            torch.tensor(rng.standard_normal(tuple(sol.x.shape)), dtype=sol.x.dtype) * sol.x
        ).sum()
        for d in (sol.eq_duals, sol.ineq_duals):
            if d is not None:
                loss = (
                    loss
                    + (torch.tensor(rng.standard_normal(tuple(d.shape)), dtype=d.dtype) * d).sum()
                )
        loss.backward()
        grads = {k: None if v is None else v.grad for k, v in ins.items()}
    return sol, grads, used


def _compare(data: dict, backward: str, monkeypatch, **kw) -> None:
    lean, g_lean, used = _run(data, True, monkeypatch, backward=backward, **kw)
    ref, g_ref, used_ref = _run(data, False, monkeypatch, backward=backward, **kw)
    assert used and not used_ref
    assert lean.status == ref.status
    torch.testing.assert_close(lean.x, ref.x, rtol=0, atol=0)
    for a, b in ((lean.eq_duals, ref.eq_duals), (lean.ineq_duals, ref.ineq_duals)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    for k in NAMES:
        if g_ref[k] is None:
            assert g_lean[k] is None, k
            continue
        assert g_lean[k].shape == g_ref[k].shape == data[k].shape, k
        tol = 1e-12 if data["q"].dtype == torch.float64 else 1e-5
        scale = float(g_ref[k].abs().max()) if g_ref[k].numel() else 0.0
        torch.testing.assert_close(g_lean[k], g_ref[k], rtol=tol, atol=tol * (1 + scale))
    info, info_ref = lean.info, ref.info
    for name in ("solver", "sample_solvers", "sample_tolerances", "polished"):
        assert getattr(info, name) == getattr(info_ref, name)
    for a, b in ((info.primal_residual, info_ref.primal_residual),
                 (info.dual_residual, info_ref.dual_residual)):  # fmt: skip
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)  # round-off of two orders
    d, d_ref = dataclasses.asdict(info.backward), dataclasses.asdict(info_ref.backward)
    residual, residual_ref = d.pop("residual"), d_ref.pop("residual")
    assert residual <= 1e-12 and residual_ref <= 1e-12
    np.testing.assert_allclose(d.pop("beta"), d_ref.pop("beta"), rtol=1e-9)
    assert d == d_ref


CASES = [(2, 5, 3, 1), (7, 10, 5, 0), (7, 10, 5, 3), (4, 20, 30, 5), (3, 64, 40, 10),
         (5, 8, 0, 3), (5, 8, 0, 0), (2, 1, 1, 0)]  # fmt: skip


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize(("B", "n", "m", "p"), CASES)
def test_lean_batch_equals_general(B, n, m, p, backward, monkeypatch):
    _compare(_problems(B, n, m, p, seed=B + n + m + p), backward, monkeypatch)


@pytest.mark.parametrize(
    "shared", [("P",), ("G", "h"), ("A", "b"), ("P", "A", "b"), ("P", "G", "h", "A", "b")]
)
def test_shared_inputs_get_summed_gradients(shared, monkeypatch):
    _compare(_share(_problems(6, 8, 6, 2, seed=20), shared), "penalty", monkeypatch)


@pytest.mark.parametrize("shape", ["batched", "shared"])
def test_warm_starts(shape, monkeypatch):
    """A warm start per sample, or one for all: daqp starts from it, as on the general path."""
    data = _problems(5, 8, 6, 2, seed=31)
    start = torch.tensor(np.random.default_rng(5).standard_normal((5, 8)), dtype=torch.float64)
    _compare(data, "kkt", monkeypatch, warm_start=start if shape == "batched" else start[0])


def test_float32_batch(monkeypatch):
    _compare(_problems(4, 6, 4, 1, seed=21, dtype=torch.float32), "kkt", monkeypatch)


def test_bounds_and_constraints_without_rows(monkeypatch):
    data = _problems(3, 6, 0, 2, seed=22)  # box bounds (they bind) and equalities
    inside = torch.linspace(-0.25, 0.15, 6, dtype=torch.float64)
    data["b"] = data["A"] @ inside  # a feasible point inside the box
    lb = -0.3 * torch.ones(3, 6, dtype=torch.float64)
    _compare(data, "penalty", monkeypatch, lb=lb, ub=0.2 * torch.ones(6, dtype=torch.float64))
    data = _problems(3, 6, 4, 0, seed=22)
    data["A"], data["b"] = torch.zeros(3, 0, 6, dtype=torch.float64), torch.zeros(3, 0)
    data["b"] = data["b"].double()
    _compare(data, "kkt", monkeypatch)


def test_gradients_match_finite_differences():
    """Directional derivatives of L = w.x in every input (batched and shared) against
    one-sided differences at three steps (at a kink either side is valid; unstable
    quotients are no verdict)."""
    data = _share(_problems(4, 6, 5, 2, seed=23), ("P", "A"))
    w = torch.tensor(np.random.default_rng(3).standard_normal((4, 6)), dtype=torch.float64)
    ins = {k: v.clone().requires_grad_() for k, v in data.items()}
    sol = dqp.solve(**{k: ins[k] for k in NAMES})
    assert LEAN in type(sol.x.grad_fn).__name__
    (w * sol.x).sum().backward()

    def loss(args: dict) -> float:
        return float((w * dqp.solve(**{j: args[j] for j in NAMES}).x).sum())

    verdicts = directional_verdicts(data, {k: v.grad for k, v in ins.items()}, loss)
    assert verdicts >= 5


def _with_sample(data: dict, i: int, **changes) -> dict:
    out = {k: None if v is None else v.clone() for k, v in data.items()}
    for k, v in changes.items():
        out[k][i] = v
    return out


def test_a_degenerate_sample_sends_the_backward_to_the_general_path(monkeypatch):
    """Sample 1 has two copies of an active row (LICQ fails): the forward is lean, the backward
    declines, and the general path's degenerate policy decides for the batch."""
    data = _problems(3, 6, 3, 0, seed=24)
    G, h = data["G"], data["h"]
    G = torch.cat([G, G[:, :1]], dim=1)
    h = torch.cat([h, h[:, :1]], dim=1)
    x_free = torch.linalg.solve(data["P"][1], -data["q"][1])
    h[1, 0] = h[1, 3] = float(G[1, 0] @ x_free) - 1.0
    data["G"], data["h"] = G, h
    with pytest.warns(dqp.QPDegenerateWarning):
        lean, g_lean, used = _run(data, True, monkeypatch)
    with pytest.warns(dqp.QPDegenerateWarning):
        ref, g_ref, _ = _run(data, False, monkeypatch)
    assert used
    d, d_ref = lean.info.backward, ref.info.backward
    assert d.dependent_rows == d_ref.dependent_rows and d.dependent_rows[1] > 0
    assert (d.n_active, d.n_weak, d.licq) == (d_ref.n_active, d_ref.n_weak, d_ref.licq)
    np.testing.assert_allclose(d.beta, d_ref.beta, rtol=1e-9)
    for k in NAMES:
        if g_ref[k] is not None:
            torch.testing.assert_close(g_lean[k], g_ref[k])


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_shared_inputs_with_a_declined_sample(backward, monkeypatch):
    """Shared P and G, sample 0 weakly active: its gradient (from the general path) and the
    lean samples' are summed into the shared inputs' gradients."""
    data = _share(_problems(4, 6, 3, 0, seed=30), ("P", "G"))
    x_free = torch.linalg.solve(data["P"], -data["q"][0])
    data["h"][0] = data["G"] @ x_free + 100.0
    data["h"][0, 0] = float(data["G"][0] @ x_free)  # zero slack, zero multiplier
    lean, g_lean, used = _run(data, True, monkeypatch, backward=backward)
    ref, g_ref, _ = _run(data, False, monkeypatch, backward=backward)
    assert used and lean.info.backward.n_weak[0] == 1
    assert lean.info.backward.n_weak == ref.info.backward.n_weak
    for k in ("P", "q", "G", "h"):
        assert g_lean[k].shape == g_ref[k].shape == data[k].shape
        torch.testing.assert_close(g_lean[k], g_ref[k], rtol=1e-10, atol=1e-12)


def test_a_weak_sample_sends_the_backward_to_the_general_path(monkeypatch):
    data = _problems(3, 5, 2, 0, seed=25)
    x_free = torch.linalg.solve(data["P"][2], -data["q"][2])
    data["h"][2] = data["G"][2] @ x_free + torch.tensor([0.0, 1.0], dtype=torch.float64)
    lean, g_lean, used = _run(data, True, monkeypatch)
    ref, g_ref, _ = _run(data, False, monkeypatch)
    assert used and lean.info.backward.n_weak == ref.info.backward.n_weak
    assert lean.info.backward.n_weak[2] == 1
    for k in NAMES:
        if g_ref[k] is not None:
            torch.testing.assert_close(g_lean[k], g_ref[k])


@pytest.mark.parametrize("case", ["zero_row", "infeasible", "psd_singular"])
def test_samples_the_forward_leaves_to_the_general_path(case, monkeypatch):
    data = _problems(3, 5, 3, 1, seed=26)
    if case == "zero_row":
        data["G"][1, 0] = 0.0
        data["h"][1, 0] = 1.0
    elif case == "infeasible":  # sample 2: g^T x <= -1 and -g^T x <= -1
        data["G"][2, 1] = -data["G"][2, 0]
        data["h"][2, :2] = -1.0
    else:
        data["P"][0] = torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    kw = {"on_failure": "nan"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lean, g_lean, used = _run(data, True, monkeypatch, **kw)
        ref, g_ref, _ = _run(data, False, monkeypatch, **kw)
    assert not used
    assert lean.status == ref.status
    torch.testing.assert_close(lean.x, ref.x, rtol=0, atol=0, equal_nan=True)
    for k in NAMES:
        if g_ref[k] is not None:
            torch.testing.assert_close(g_lean[k], g_ref[k], equal_nan=True)


@pytest.mark.parametrize(
    ("change", "error"),
    [("nan", ValueError), ("asymmetric", ValueError), ("indefinite", ValueError)],
)
def test_bad_input_gets_the_general_error(change, error):
    data = _problems(3, 4, 2, 0, seed=27)
    if change == "nan":
        data["q"][1, 2] = float("nan")
    elif change == "asymmetric":
        data["P"][2, 0, 1] += 1.0
    else:
        data["P"][0] = -torch.eye(4, dtype=torch.float64)
    with pytest.raises(error):
        dqp.solve(**{k: data[k] for k in NAMES})


def test_in_place_change_after_the_solve_does_not_change_the_gradient():
    data = _problems(3, 5, 3, 1, seed=28)
    grads = []
    for change in (False, True):
        ins = {k: v.clone().requires_grad_() for k, v in data.items()}
        sol = dqp.solve(**{k: ins[k] for k in NAMES})
        assert LEAN in type(sol.x.grad_fn).__name__
        if change:
            with torch.no_grad():
                ins["q"].mul_(3.0)
                ins["G"].add_(1.0)
        sol.x.sum().backward()
        grads.append({k: ins[k].grad.clone() for k in NAMES})
    for k in NAMES:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=0, atol=0)


def test_second_order_is_refused():
    data = _problems(2, 4, 2, 0, seed=29)
    q = data["q"].clone().requires_grad_()
    sol = dqp.solve(data["P"], q, G=data["G"], h=data["h"])
    assert LEAN in type(sol.x.grad_fn).__name__
    (g,) = torch.autograd.grad(sol.x.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="second"):
        g.sum().backward()


def test_what_takes_the_lean_batch_path():
    P = torch.eye(3, dtype=torch.float64).expand(4, 3, 3)
    q = torch.ones(4, 3, dtype=torch.float64)
    G, h = torch.ones(2, 3, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    assert _small_batch.small_batch_inputs(P, q, None, None, G, h) == 4
    assert _small_batch.small_batch_inputs(P[0], q[0], None, None, G, h) == 0  # one problem
    assert _small_batch.small_batch_inputs(P[:1], q[:1], None, None, G, h) == 0  # B = 1
    assert _small_batch.small_batch_inputs(P, q[:2], None, None, G, h) == 0  # batch sizes differ
    assert _small_batch.small_batch_inputs(P, q.float(), None, None, G, h) == 0  # mixed dtypes
    assert _small_batch.small_batch_inputs(P, q, None, None, G, None) == 0  # G without h
    big = torch.eye(65, dtype=torch.float64).expand(2, 65, 65)
    assert _small_batch.small_batch_inputs(big, torch.ones(2, 65, dtype=torch.float64),
                                           None, None, None, None) == 0  # fmt: skip
    # options the lean batch path does not take
    for kw in ({"max_workers": 2}, {"solver": "piqp"}, {"solver_options": {"iter_limit": 100}},
               {"warm_start": torch.zeros(4, 3, dtype=torch.int64)}):  # fmt: skip
        sol = dqp.solve(P, q.clone().requires_grad_(), G=G, h=h, **kw)
        assert LEAN not in type(sol.x.grad_fn).__name__, kw


def _harden(data: dict, i: int, kind: int, rng: np.random.Generator) -> None:
    """Make sample ``i`` hard in one way (``kind``): rows scaled by 1e-8..1e8, a
    near-duplicate active row, a row with slack 1e-10 (nearly weak), a near-zero q, an
    ill-conditioned P (eigenvalues 1e-6..1e2)."""
    G, h = data["G"], data["h"]
    if kind == 0:
        scale = torch.tensor(10.0 ** rng.uniform(-8, 8, G.shape[1]))
        G[i], h[i] = G[i] * scale[:, None], h[i] * scale
    elif kind == 1:
        G[i, 1], h[i, 1] = G[i, 0] * (1 + 1e-9), h[i, 0] * (1 + 1e-9)
    elif kind == 2:
        x = dqp.solve(**{k: data[k][i] for k in NAMES}).x
        h[i, 0] = float(G[i, 0] @ x) + 1e-10
    elif kind == 3:
        data["q"][i] = data["q"][i] * 1e-9
    else:
        _, vecs = torch.linalg.eigh(data["P"][i])
        n = vecs.shape[0]
        Pi = (vecs * torch.logspace(-6, 2, n, dtype=torch.float64)) @ vecs.T
        data["P"][i] = 0.5 * (Pi + Pi.T)


def test_adversarial_batches_agree_with_the_general_path(monkeypatch):
    """Batches with one hard sample (:func:`_harden`): wherever the lean batch path answers it
    answers what the general path does (declined samples: the general path's answer)."""
    used_count = 0
    for seed in range(15):
        data = _problems(3, 8, 6, 1, seed=40 + seed)
        _harden(data, 1, seed % 5, np.random.default_rng(seed))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
            ref, g_ref, _ = _run(data, False, monkeypatch)
            sol, g, used = _run(data, True, monkeypatch)
        used_count += used
        torch.testing.assert_close(sol.x, ref.x, rtol=1e-12, atol=1e-12)
        for k in NAMES:
            scale_k = float(g_ref[k].abs().max())
            torch.testing.assert_close(g[k], g_ref[k], rtol=1e-8, atol=1e-8 * (1 + scale_k))
        for name in ("n_weak", "dependent_rows", "n_active"):
            assert getattr(sol.info.backward, name) == getattr(ref.info.backward, name), name
    assert used_count >= 8  # the lean path is not simply refusing every hard batch


@pytest.mark.parametrize("shared", [(), ("P", "G"), ("A", "b")])
def test_every_sample_declined_takes_the_general_gradients_whole(shared, monkeypatch):
    """A duplicated active row in every sample (LICQ fails): the lean backward declines the
    whole batch and hands over the general path's gradients as they are (no copy into its own
    arrays); they equal the general path's, shared inputs included."""
    data = _share(_problems(3, 8, 6, 2, seed=21), shared)
    x = dqp.solve(**{k: data[k] for k in NAMES}, solver="daqp").x.detach()
    G = data["G"]
    data["G"] = torch.cat([G, G[..., :1, :]], dim=-2)
    h = torch.cat([data["h"], data["h"][:, :1]], dim=-1)
    h[:, 0] = h[:, -1] = (G[..., 0, :] * x).sum(-1) - 1.0  # row 0 and its copy cut every point
    data["h"] = h
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        lean, g_lean, used = _run(data, True, monkeypatch)
        ref, g_ref, _ = _run(data, False, monkeypatch)
    assert used
    assert len(lean.info.backward.dependent_rows) == 3
    assert all(d > 0 for d in lean.info.backward.dependent_rows)
    assert lean.info.backward.dependent_rows == ref.info.backward.dependent_rows
    for k in NAMES:
        if g_ref[k] is not None:
            torch.testing.assert_close(g_lean[k], g_ref[k])


@pytest.mark.parametrize(
    "case", ["all solved", "some declined", "some declined, shared", "all declined", "no gradient"]
)
def test_uninitialized_gradient_memory_never_comes_out(case, monkeypatch):
    """The lean batch backward writes into uninitialized (possibly reused) arrays: filled with
    NaN here, every gradient still equals the general path's, whether every sample is solved,
    some or all decline (a duplicated active row cuts their points), or the general path
    gives no gradient for an input (then it is zero)."""
    from dxopt.qp.lean import small_batch as _small_batch

    data = _problems(4, 8, 6, 2, seed=5)
    if case.endswith("shared"):  # shared gradients are summed into the declined rows
        data = _share(data, ("P", "G"))
    if case != "all solved":
        x = dqp.solve(**{k: data[k] for k in NAMES}, solver="daqp").x.detach()
        G = data["G"]
        data["G"] = torch.cat([G, G[..., :1, :]], dim=-2)
        h = torch.cat([data["h"], data["h"][:, :1]], dim=-1)
        cut = (G[..., 0, :] * x).sum(-1) - 1.0
        rows = slice(0, 2) if case.startswith("some declined") else slice(None)
        h[rows, 0] = h[rows, -1] = cut[rows]
        data["h"] = h
    monkeypatch.setattr(
        _small_batch, "host_array", lambda shape, dtype=np.float64: np.full(shape, np.nan, dtype)
    )
    if case == "no gradient":  # a general path that returns no gradient for q
        real = _small_batch.eager_gradients

        def without_q(*args, **kwargs):
            out = list(real(*args, **kwargs))
            out[1] = None
            return tuple(out)

        monkeypatch.setattr(_small_batch, "eager_gradients", without_q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        lean, g_lean, used = _run(data, True, monkeypatch)
        _, g_ref, _ = _run(data, False, monkeypatch)
    assert used
    n_declined = sum(d > 0 for d in lean.info.backward.dependent_rows)
    assert n_declined == (0 if case == "all solved" else 2 if case.startswith("some") else 4)
    for k in NAMES:
        assert not torch.isnan(g_lean[k]).any(), k
        if case == "no gradient" and k == "q":
            assert (g_lean[k] == 0).all()
        else:
            torch.testing.assert_close(g_lean[k], g_ref[k])
