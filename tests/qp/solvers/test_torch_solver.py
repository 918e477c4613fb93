"""The torch-native batched QP solver (``dxopt.qp.solvers.torch_*``) and its backward.

References: daqp through qpsolvers (solutions), an exact reduced-KKT adjoint built here with
numpy on the active set verified from daqp's solution (gradients), float64 central finite
differences (gradcheck, on problems with strict complementarity margins), and closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
import qpsolvers
import torch

from dxopt.qp import QPBackwardError, QPStatus, solve
from dxopt.qp.autograd.torch_entry import torch_qp_solve
from dxopt.qp.solvers.torch_types import STATUS_CODES

NAMES = ("P", "q", "A", "b", "G", "h")


def random_qp(n: int, m: int, p: int, seed: int) -> dict[str, np.ndarray]:
    """dQP's random dense QP: P = MM^T + 1e-4 I, x = 1 strictly feasible."""
    rng = np.random.default_rng(seed)
    M = rng.uniform(size=(n, n))
    G, A = rng.uniform(size=(m, n)), rng.uniform(size=(p, n))
    return {
        "P": M @ M.T + 1e-4 * np.eye(n),
        "q": rng.uniform(size=n),
        "A": A,
        "b": A.sum(1),
        "G": G,
        "h": G.sum(1) + 1.0,
    }


def batch(n: int, m: int, p: int, size: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    return [random_qp(n, m, p, seed + i) for i in range(size)]


def tensors(probs: list[dict[str, np.ndarray]], dtype=torch.float64) -> list[torch.Tensor]:
    return [torch.tensor(np.stack([pr[k] for pr in probs]), dtype=dtype) for k in NAMES]


def daqp(pr: dict[str, np.ndarray]):
    args = {k: (pr[k] if pr[k].size else None) for k in NAMES}
    problem = qpsolvers.Problem(args["P"], args["q"], args["G"], args["h"], args["A"], args["b"])
    sol = qpsolvers.solve_problem(problem, solver="daqp")
    assert sol.found
    return sol


def kkt_reference(pr: dict[str, np.ndarray], gx: np.ndarray) -> dict[str, np.ndarray]:
    """Exact gradients of ``L = gx . x*`` on daqp's verified, strictly active set."""
    sol = daqp(pr)
    x = sol.x
    P, A, G, h = (pr[k] for k in ("P", "A", "G", "h"))
    z = np.zeros(G.shape[0]) if sol.z is None else sol.z
    y = np.zeros(A.shape[0]) if sol.y is None else sol.y
    slack = h - G @ x
    act = np.nonzero(z > 1e-9)[0]
    assert np.all(np.abs(slack[act]) < 1e-9), "reference: active rows must have zero slack"
    inactive = np.setdiff1d(np.arange(G.shape[0]), act)
    assert np.all(slack[inactive] > 1e-7), "reference: needs strict complementarity"
    C = np.concatenate([A, G[act]])
    n, k = P.shape[0], C.shape[0]
    K = np.block([[P, C.T], [C, np.zeros((k, k))]])
    assert np.linalg.matrix_rank(C) == k, "reference: LICQ must hold"
    sol_k = np.linalg.solve(K, np.concatenate([gx, np.zeros(k)]))
    u, v = sol_k[:n], sol_k[n:]
    v_eq, v_g = v[: A.shape[0]], np.zeros(G.shape[0])
    v_g[act] = v[A.shape[0] :]
    return {
        "x": x,
        "P": -0.5 * (np.outer(u, x) + np.outer(x, u)),
        "q": -u,
        "A": -(np.outer(y, u) + np.outer(v_eq, x)),
        "b": v_eq,
        "G": -(np.outer(z, u) + np.outer(v_g, x)),
        "h": v_g,
    }


@pytest.mark.parametrize(("n", "m", "p"), [(10, 5, 0), (20, 20, 10), (30, 40, 15), (8, 0, 3)])
def test_matches_daqp_float64(n, m, p):
    probs = batch(n, m, p, 12, seed=n + m)
    r = torch_qp_solve(*tensors(probs))
    assert all(s is QPStatus.SOLVED for s in r.statuses)
    assert r.polished.all()
    for i, pr in enumerate(probs):
        sol = daqp(pr)
        np.testing.assert_allclose(r.x[i].numpy(), sol.x, atol=1e-8, rtol=0)
        if m:
            np.testing.assert_allclose(r.ineq_duals[i].numpy(), sol.z, atol=1e-6, rtol=1e-6)
        if p:
            np.testing.assert_allclose(r.eq_duals[i].numpy(), sol.y, atol=1e-6, rtol=1e-6)
    assert float(r.primal_residual.max()) < 1e-9 and float(r.dual_residual.max()) < 1e-9
    assert (r.ineq_duals >= 0).all()


def test_broadcast_shared_matrices_and_unbatched_call():
    pr = random_qp(12, 10, 4, seed=3)
    qs = torch.tensor(np.stack([pr["q"] * (1 + 0.3 * i) for i in range(5)]))
    P, A, b, G, h = (torch.tensor(pr[k]) for k in ("P", "A", "b", "G", "h"))
    r = torch_qp_solve(P, qs, A, b, G, h)
    assert r.x.shape == (5, 12) and r.eq_duals.shape == (5, 4) and r.ineq_duals.shape == (5, 10)
    for i in range(5):
        sol = daqp({**pr, "q": qs[i].numpy()})
        np.testing.assert_allclose(r.x[i].numpy(), sol.x, atol=1e-8, rtol=0)
    single = torch_qp_solve(P, torch.tensor(pr["q"]), A, b, G, h)
    assert single.x.shape == (1, 12)
    np.testing.assert_allclose(single.x[0].numpy(), daqp(pr).x, atol=1e-8, rtol=0)


def test_closed_forms_without_inequalities():
    # min 1/2|x|^2 + q.x  s.t. sum(x) = 1  ->  x = -q + (1 + sum q)/n
    q = torch.tensor([[0.3, -1.0, 2.0, 0.5]], dtype=torch.float64)
    r = torch_qp_solve(
        torch.eye(4, dtype=torch.float64),
        q,
        torch.ones(1, 4, dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
    )
    expected = -q + (1 + q.sum()) / 4
    torch.testing.assert_close(r.x, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(r.eq_duals, -((1 + q.sum()) / 4).reshape(1, 1), atol=1e-12, rtol=0)
    r = torch_qp_solve(
        2 * torch.eye(3, dtype=torch.float64), torch.tensor([2.0, -4.0, 0.0], dtype=torch.float64)
    )
    torch.testing.assert_close(r.x[0], torch.tensor([-1.0, 2.0, 0.0], dtype=torch.float64))


def test_gradients_match_exact_kkt_reference_with_broadcasting():
    """Batched q, h, b; shared P, A, G get the batch-summed gradient."""
    base = random_qp(15, 12, 5, seed=7)
    rng = np.random.default_rng(0)
    probs = [
        {
            **base,
            "q": base["q"] + 0.5 * rng.standard_normal(15),
            "h": base["h"] - 0.3 * rng.uniform(size=12),
        }
        for _ in range(6)
    ]
    gx = rng.standard_normal((6, 15))
    refs = [kkt_reference(pr, gx[i]) for i, pr in enumerate(probs)]
    P, A, G = (torch.tensor(base[k], requires_grad=True) for k in ("P", "A", "G"))
    q, b, h = (
        torch.tensor(np.stack([pr[k] for pr in probs]), requires_grad=True) for k in ("q", "b", "h")
    )
    r = torch_qp_solve(P, q, A, b, G, h)
    (torch.tensor(gx) * r.x).sum().backward()
    for name, t in zip(NAMES, (P, q, A, b, G, h)):
        ref = np.stack([rf[name] for rf in refs])
        if t.ndim == (2 if name in ("P", "A", "G") else 1):
            ref = ref.sum(0)
        np.testing.assert_allclose(t.grad.numpy(), ref, atol=1e-6, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(r.x.detach().numpy(), np.stack([rf["x"] for rf in refs]), atol=1e-8)


def test_gradients_match_finite_differences():
    """gradcheck of x, y and z in float64 on strictly complementary problems."""
    probs = batch(6, 6, 2, 2, seed=11)
    for pr in probs:  # certify the margins that make central differences valid
        sol = daqp(pr)
        slack = pr["h"] - pr["G"] @ sol.x
        assert np.all((sol.z > 1e-3) | (slack > 1e-3))
    ins = [t.requires_grad_() for t in tensors(probs)]

    def fn(P, q, A, b, G, h):
        r = torch_qp_solve(0.5 * (P + P.mT), q, A, b, G, h)
        return r.x, r.eq_duals, r.ineq_duals

    # fast mode: random projections of the Jacobian, a few dozen solves instead of hundreds
    assert torch.autograd.gradcheck(fn, ins, eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=True)


def test_duplicated_active_rows_split_the_gradient_equally():
    """LICQ fails: min 1/2|x|^2 - x_1 s.t. x_1 <= 1/2 twice. x = (1/2, 0); dx_1/dq_1 = 0 and
    the minimum-norm adjoint splits dx_1/dh = 1 equally between the two copies."""
    d = torch.float64
    q = torch.tensor([-1.0, 0.0], dtype=d, requires_grad=True)
    G = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=d, requires_grad=True)
    h = torch.tensor([0.5, 0.5], dtype=d, requires_grad=True)
    r = torch_qp_solve(torch.eye(2, dtype=d), q, G=G, h=h)
    torch.testing.assert_close(r.x[0].detach(), torch.tensor([0.5, 0.0], dtype=d))
    r.x[0, 0].backward()
    torch.testing.assert_close(q.grad, torch.zeros(2, dtype=d), atol=1e-12, rtol=0)
    torch.testing.assert_close(h.grad, torch.tensor([0.5, 0.5], dtype=d), atol=1e-10, rtol=0)


def _mixed_batch(dtype):
    P = torch.stack(
        [torch.eye(2), torch.eye(2), torch.diag(torch.tensor([1.0, 0.0])), torch.eye(2)]
    )
    q = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, -1.0], [-3.0, -3.0]])
    G = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 1.0]],
            [[1.0, 0.0], [-1.0, 0.0]],
            [[-1.0, 0.0], [0.0, -1.0]],
            [[1.0, 1.0], [-1.0, 0.0]],
        ]
    )
    h = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0], [1.0, 0.0]])
    return [t.to(dtype) for t in (P, q, G, h)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_infeasible_and_unbounded_samples_in_a_batch(dtype):
    """Sample 1: x <= -1 and x >= 1 (infeasible); sample 2: x_2 -> inf decreases the cost."""
    P, q, G, h = _mixed_batch(dtype)
    r = torch_qp_solve(P, q, G=G, h=h)
    assert r.statuses == (QPStatus.SOLVED, QPStatus.INFEASIBLE, QPStatus.UNBOUNDED, QPStatus.SOLVED)
    assert r.solved.tolist() == [True, False, False, True]
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(r.x[0], torch.tensor([-1.0, -1.0], dtype=dtype), atol=tol, rtol=0)
    torch.testing.assert_close(r.x[3], torch.tensor([0.5, 0.5], dtype=dtype), atol=tol, rtol=0)


def test_equality_only_infeasible_and_unbounded():
    d = torch.float64
    A, b = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=d), torch.tensor([0.0, 1.0], dtype=d)
    r = torch_qp_solve(torch.eye(2, dtype=d), torch.zeros(2, dtype=d), A, b)
    assert r.statuses == (QPStatus.INFEASIBLE,)
    r = torch_qp_solve(
        torch.diag(torch.tensor([1.0, 0.0], dtype=d)), torch.tensor([0.0, -1.0], dtype=d)
    )
    assert r.statuses == (QPStatus.UNBOUNDED,)


def test_statuses_are_the_shared_status_and_the_old_enum_warns():
    """The torch solver speaks dxopt.qp.QPStatus: its int codes index one table, and the old
    TorchQPStatus enum still works for one release, with a DeprecationWarning."""
    P, q, G, h = _mixed_batch(torch.float64)
    r = torch_qp_solve(P, q, G=G, h=h, max_iter=1)  # one iteration: nothing certified yet
    assert all(isinstance(s, QPStatus) for s in r.statuses)
    assert r.statuses == tuple(STATUS_CODES[c] for c in r.status.tolist())
    assert QPStatus.MAX_ITER in r.statuses  # the CPU path's name for an iteration limit
    import dxopt.qp.solvers.torch_ipm as ipm

    with pytest.warns(DeprecationWarning, match="TorchQPStatus is deprecated"):
        old = ipm.TorchQPStatus
    names = ("SOLVED", "MAX_ITER", "PRIMAL_INFEASIBLE", "DUAL_INFEASIBLE", "NUMERICAL_ERROR")
    assert [STATUS_CODES[int(old[name])] for name in names] == [
        QPStatus.SOLVED,
        QPStatus.MAX_ITER,
        QPStatus.INFEASIBLE,
        QPStatus.UNBOUNDED,
        QPStatus.FAILED,
    ]
    with pytest.raises(AttributeError):
        _ = ipm.NoSuchName


def test_backward_refuses_unsolved_samples_and_passes_zero_cotangents():
    P, q, G, h = (t.requires_grad_() for t in _mixed_batch(torch.float64))
    r = torch_qp_solve(P, q, G=G, h=h)
    with pytest.raises(QPBackwardError, match=r"samples \[1, 2\] were not solved or not polished"):
        r.x.sum().backward(retain_graph=True)
    keep = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)[:, None]
    (keep * r.x).sum().backward()
    assert torch.isfinite(q.grad).all()
    # sample 0: x = -q = (-1, -1), both constraints x <= 1 inactive: dx/dq = -I, dx/dh = 0
    torch.testing.assert_close(q.grad[0], -torch.ones(2, dtype=torch.float64), atol=1e-10, rtol=0)
    torch.testing.assert_close(h.grad[0], torch.zeros(2, dtype=torch.float64), atol=1e-10, rtol=0)
    assert (q.grad[1:3] == 0).all() and (h.grad[1:3] == 0).all()
    unpolished = torch_qp_solve(P, q, G=G, h=h, polish=False)
    with pytest.raises(QPBackwardError, match=r"samples \[0, 1, 2, 3\]"):
        unpolished.x.sum().backward()


def test_float32_accuracy():
    probs = batch(20, 20, 10, 16, seed=5)
    r = torch_qp_solve(*tensors(probs, torch.float32))
    assert all(s is QPStatus.SOLVED for s in r.statuses)
    x64 = np.stack([daqp(pr).x for pr in probs])
    scale = np.abs(x64).max()
    assert np.abs(r.x.numpy() - x64).max() <= 1e-3 * scale
    ins = [t.requires_grad_() for t in tensors(probs, torch.float32)]
    gx = np.random.default_rng(2).standard_normal((16, 20))
    (torch.tensor(gx, dtype=torch.float32) * torch_qp_solve(*ins).x).sum().backward()
    ref = np.stack([kkt_reference(pr, gx[i])["q"] for i, pr in enumerate(probs)])
    err = np.linalg.norm(ins[1].grad.numpy() - ref) / np.linalg.norm(ref)
    assert err < 1e-3


_F64 = torch.float64
BAD_INPUTS = {
    "A without b": {"A": torch.ones(1, 3, dtype=_F64)},
    "h without G": {"h": torch.ones(2, dtype=_F64)},
    "G of 4 columns": {"G": torch.ones(2, 4, dtype=_F64), "h": torch.ones(2, dtype=_F64)},
    "h of the wrong length": {"G": torch.ones(2, 3, dtype=_F64), "h": torch.ones(3, dtype=_F64)},
    "float32 q, float64 P": {"q": torch.ones(3, dtype=torch.float32)},
    "batch sizes 4 and 2": {
        "q": torch.ones(4, 3, dtype=_F64),
        "P": torch.eye(3, dtype=_F64).expand(2, 3, 3),
    },
    "int64 P": {"P": torch.eye(3, dtype=torch.int64)},
    "q a list": {"q": [1.0, 2.0, 3.0]},
    "P a vector": {"P": torch.ones(3, dtype=_F64)},
    "q a column": {"q": torch.ones(3, 1, dtype=_F64)},
    "NaN in h": {
        "G": torch.eye(3, dtype=_F64),
        "h": torch.tensor([1.0, float("nan"), 1.0], dtype=_F64),
    },
    "Inf in q": {"q": torch.tensor([1.0, float("inf"), 1.0], dtype=_F64)},
    "P indefinite": {"P": torch.diag(torch.tensor([1.0, -1.0, 1.0], dtype=_F64))},
    "P not symmetric": {"P": torch.eye(3, dtype=_F64) + torch.triu(torch.ones(3, 3), 1).double()},
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_raise_the_cpu_paths_errors(case):
    """One validator: the same bad input gives the same exception type and message from the
    default solver, from solve(solver="torch") and from torch_qp_solve."""
    args = {"P": torch.eye(3, dtype=_F64), "q": torch.ones(3, dtype=_F64)}
    args.update(BAD_INPUTS[case])
    errors = []
    for call in (
        lambda: solve(**args),
        lambda: solve(**args, solver="torch"),
        lambda: torch_qp_solve(**args),
    ):
        with pytest.raises((ValueError, TypeError)) as info:
            call()
        errors.append(info.value)
    assert len({type(e) for e in errors}) == 1, [type(e) for e in errors]
    assert len({str(e) for e in errors}) == 1, [str(e) for e in errors]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_iter": 0}, "max_iter: expected an integer >= 1, got 0"),
        ({"check_every": 1.5}, "check_every: expected an integer >= 1"),
        ({"max_refinement": -1}, "max_refinement: expected an integer >= 0"),
        ({"eps_abs": -1.0}, "eps_abs: expected a non-negative finite number"),
        ({"eps_inf": float("nan")}, "eps_inf: expected a non-negative finite number"),
    ],
)
def test_bad_options_raise_value_errors_naming_them(kwargs, match):
    args = {"P": torch.eye(3, dtype=_F64), "q": torch.ones(3, dtype=_F64)}
    with pytest.raises(ValueError, match=match):
        torch_qp_solve(**args, **kwargs)


def test_max_refinement_and_its_deprecated_names():
    """``max_refinement`` caps the refinement passes of the polish's KKT solve (keyword and
    solver_options; the name :class:`dxopt.qp.PenaltyBackward` uses); the old names
    ``max_refine`` and ``refine_steps`` still work, each with a DeprecationWarning naming the
    new one, and passing an old and the new name together is a TypeError."""
    probs = batch(8, 6, 2, 3, seed=11)
    data = tensors(probs, torch.float64)
    new = torch_qp_solve(*data, max_refinement=3)
    assert new.factor.max_refine == 3
    for old_name in ("max_refine", "refine_steps"):
        with pytest.warns(DeprecationWarning, match=f"'{old_name}' is renamed 'max_refinement'"):
            old = torch_qp_solve(*data, **{old_name: 3})
        assert old.factor.max_refine == 3
        torch.testing.assert_close(old.x, new.x, rtol=0, atol=0)
        with pytest.raises(TypeError, match=old_name):
            torch_qp_solve(*data, **{old_name: 3, "max_refinement": 3})
    P, q, A, b, G, h = data
    kw = {"A": A, "b": b, "G": G, "h": h, "solver": "torch"}
    sol = solve(P, q, **kw, solver_options={"max_refinement": 2})
    for old_name in ("max_refine", "refine_steps"):
        with pytest.warns(DeprecationWarning, match=f"'{old_name}' is renamed 'max_refinement'"):
            sol_old = solve(P, q, **kw, solver_options={old_name: 2})
        torch.testing.assert_close(sol_old.x, sol.x, rtol=0, atol=0)
    q_grad = q.clone().requires_grad_()
    with_grad = solve(P, q_grad, **kw, solver_options={"max_refinement": 2})
    with_grad.x.sum().backward()
    assert with_grad.info.backward.method == "torch"
    assert with_grad.info.backward.refinement_steps == 2  # the backward's cap too
    with pytest.raises(ValueError, match="max_refinement: expected an integer >= 0"):
        solve(P, q, **kw, solver_options={"max_refinement": -1})


def test_dispatch_through_dxopt_qp_solve():
    probs = batch(10, 10, 5, 4, seed=21)
    ins = [t.requires_grad_() for t in tensors(probs)]
    sol = solve(**dict(zip("PqAbGh", ins)), solver="torch")
    assert sol.info.solver == "torch" and all(s is QPStatus.SOLVED for s in sol.status)
    x_ref = np.stack([daqp(pr).x for pr in probs])
    np.testing.assert_allclose(sol.x.detach().numpy(), x_ref, atol=1e-8, rtol=0)
    sol.x.sum().backward()
    ref = np.stack([kkt_reference(pr, np.ones(10))["q"] for pr in probs])
    np.testing.assert_allclose(ins[1].grad.numpy(), ref, atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    probs = batch(20, 20, 10, 32, seed=9)
    cpu = tensors(probs)
    gpu = [t.cuda().requires_grad_() for t in cpu]
    r = torch_qp_solve(*gpu)
    assert r.x.is_cuda and (r.status == 0).all()
    r.x.sum().backward()
    x_ref = np.stack([daqp(pr).x for pr in probs])
    np.testing.assert_allclose(r.x.detach().cpu().numpy(), x_ref, atol=1e-8, rtol=0)
    ref = np.stack([kkt_reference(pr, np.ones(20))["q"] for pr in probs])
    np.testing.assert_allclose(gpu[1].grad.cpu().numpy(), ref, atol=1e-6, rtol=1e-6)


def test_benchmark_quick_runs(tmp_path, monkeypatch):
    from benchmarks.common import BENCHMARKS_MD
    from benchmarks.qp_torch import run

    before = BENCHMARKS_MD.read_text()
    monkeypatch.setattr(run, "results_dir", lambda area: tmp_path)
    run.main(["--quick", "--no-md"])
    text = (tmp_path / "qp_torch_quick.md").read_text()
    assert "| 16 x n=20 | 1 | torch |" in text and "16/16 solved" in text
    assert (tmp_path / "qp_torch_quick.json").exists() and (
        tmp_path / "qp_torch_quick.png"
    ).exists()
    run.main(["--quick", "--no-md", "--render"])  # rebuilt from the JSON: same tables
    assert (tmp_path / "qp_torch_quick.md").read_text() == text
    assert BENCHMARKS_MD.read_text() == before


def test_solve_torch_on_failure_nan_zero_gradient_and_raise():
    """solve(solver="torch"): failed samples are NaN with on_failure="nan" and contribute no
    gradient; with on_failure="raise" a QPSolveError names them."""
    from dxopt.qp import QPSolveError

    P, q, G, h = (t.requires_grad_() for t in _mixed_batch(torch.float64))
    sol = solve(P, q, G=G, h=h, solver="torch", on_failure="nan")
    assert sol.status == (QPStatus.SOLVED, QPStatus.INFEASIBLE, QPStatus.UNBOUNDED, QPStatus.SOLVED)
    assert torch.isnan(sol.x[1:3]).all() and torch.isfinite(sol.x[[0, 3]]).all()
    assert sol.info.solver == "torch" and sol.info.sample_solvers == ("torch", "", "", "torch")
    torch.nansum(sol.x).backward()
    torch.testing.assert_close(q.grad[0], -torch.ones(2, dtype=torch.float64), atol=1e-10, rtol=0)
    assert (q.grad[1:3] == 0).all() and (h.grad[1:3] == 0).all()
    assert sol.info.backward.method == "torch" and sol.info.backward.residual < 1e-10
    with pytest.raises(QPSolveError, match=r"2 of 4 QPs not solved by 'torch'") as err:
        solve(P, q, G=G, h=h, solver="torch")
    assert err.value.failed_indices == (1, 2)


def test_solve_torch_bounds_unbatched_and_options():
    """lb/ub through the device path: x and the bound multipliers match daqp; an unbatched call
    gives unbatched outputs; unknown solver_options are refused by name."""
    pr = random_qp(8, 6, 2, seed=4)
    P, q, A, b, G, h = (torch.tensor(pr[k]) for k in NAMES)
    lb = torch.full((8,), 0.8, dtype=torch.float64)  # x = 1 is strictly feasible
    ub = torch.full((8,), 1.1, dtype=torch.float64)
    ours = solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, solver="torch")
    ref = solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, solver="daqp")
    assert ours.x.shape == (8,) and ours.ineq_duals.shape == (6,) and ours.lb_duals.shape == (8,)
    torch.testing.assert_close(ours.x, ref.x, atol=1e-8, rtol=0)
    assert (ours.lb_duals > 1e-6).any() or (ours.ub_duals > 1e-6).any()  # a bound is active
    for name in ("eq_duals", "ineq_duals", "lb_duals", "ub_duals"):
        torch.testing.assert_close(getattr(ours, name), getattr(ref, name), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match=r"solver_options: the torch solver takes .*'tol'"):
        solve(P, q, A=A, b=b, G=G, h=h, solver="torch", solver_options={"tol": 1e-3})
    ok = solve(P, q, A=A, b=b, G=G, h=h, solver="torch", solver_options={"max_iter": 80})
    torch.testing.assert_close(
        ok.x, solve(P, q, A=A, b=b, G=G, h=h, solver="daqp").x, atol=1e-8, rtol=0
    )


def test_auto_rule_daqp_on_cpu_torch_off_the_cpu():
    """default_solver: dense CPU -> daqp (at every batch size: the lean paths measured
    faster than torch in every cell), sparse -> piqp, dense off the CPU -> torch (the
    problem's recorded device is set directly: no GPU needed, nothing runs on it)."""
    from dataclasses import replace

    from dxopt.qp.problem.canonical import canonical_problem
    from dxopt.qp.solvers.forward import default_solver

    pr = random_qp(5, 3, 1, seed=0)
    dense = canonical_problem(*(torch.tensor(pr[k]) for k in NAMES))
    assert default_solver(dense) == "daqp"
    assert default_solver(replace(dense, device=torch.device("cuda", 0))) == "torch"
    assert default_solver(replace(dense, batch=2048)) == "daqp"
    sparse_args = [torch.tensor(pr[k]) for k in NAMES]
    sparse_args[0] = sparse_args[0].to_sparse()
    sparse = canonical_problem(*sparse_args)
    assert default_solver(sparse) == "piqp"
    assert default_solver(replace(sparse, device=torch.device("cuda", 0))) == "piqp"


def test_auto_rule_measurement_quick_runs(tmp_path, monkeypatch):
    from benchmarks.qp_torch import auto_rule

    monkeypatch.setattr(auto_rule, "results_dir", lambda area: tmp_path)
    auto_rule.main(["--quick"])
    import json

    rows = json.loads((tmp_path / "auto_rule_quick.json").read_text())["rows"]
    assert rows[0]["B"] == 8 and rows[0]["torch_s"] > 0 and rows[0]["daqp_s"] > 0


def test_gpu_benchmark_refuses_without_cuda_and_smoke_runs_on_cpu(tmp_path, monkeypatch, capsys):
    import json

    from benchmarks.qp_torch import gpu

    monkeypatch.setattr(gpu, "results_dir", lambda area: tmp_path)
    if not torch.cuda.is_available():
        assert gpu.main([]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
        assert not list(tmp_path.iterdir())
    assert gpu.main(["--device", "cpu", "--batch", "8", "--n", "10", "--n-ref", "4"]) == 0
    rows = json.loads((tmp_path / "qp_torch_gpu_cpu.json").read_text())["rows"]
    torch64 = next(r for r in rows if r["method"] == "torch float64")
    assert torch64["x_err_vs_daqp"] < 1e-8 and torch64["grad_rel_err"] < 1e-8
    torch32 = next(r for r in rows if r["method"] == "torch float32")
    assert torch32["x_err_vs_daqp"] < 1e-5 and torch32["grad_rel_err"] < 1e-5


def test_auto_takes_the_compiled_solver_on_the_cpu_and_torch_when_asked_for_large_batches():
    probs = batch(4, 3, 1, 512, seed=30)
    sol = solve(
        **dict(zip("PqAbGh", tensors(probs)))
    )  # solver="auto": a batch of small dense CPU problems
    assert sol.info.solver == "dual_active_set"
    assert set(sol.info.sample_solvers) == {"dual_active_set"}
    one = solve(**dict(zip("PqAbGh", (t[0] for t in tensors(probs[:1])))))  # one problem: daqp
    assert one.info.solver == "daqp"
    via_torch = solve(**dict(zip("PqAbGh", tensors(probs))), solver="torch")
    assert via_torch.info.solver == "torch" and via_torch.info.sample_solvers[0] == "torch"
    x_ref = np.stack([daqp(pr).x for pr in probs[:16]])
    for s in (sol, via_torch):
        np.testing.assert_allclose(s.x[:16].numpy(), x_ref, atol=1e-8, rtol=0)


def test_torch_qp_solve_under_torch_func():
    """torch_qp_solve itself under vmap, jacfwd and jacrev: the projection onto x <= 1,
    x = min(-q, 1), dx/dq = -diag(-q < 1) in closed form."""
    from torch.func import jacfwd, jacrev, vmap

    d = torch.float64
    P, G, h = torch.eye(3, dtype=d), torch.eye(3, dtype=d), torch.ones(3, dtype=d)
    qs = torch.tensor([[-2.0, 0.3, 1.0], [0.5, -3.0, -0.2]], dtype=d)

    def x_of(q: torch.Tensor) -> torch.Tensor:
        return torch_qp_solve(P, q, G=G, h=h).x[0]

    torch.testing.assert_close(vmap(x_of)(qs), (-qs).clamp(max=1.0), atol=1e-10, rtol=0)
    for q in qs:
        want = -torch.diag((-q < 1.0).to(d))
        for transform in (jacfwd, jacrev):
            torch.testing.assert_close(transform(x_of)(q), want, atol=1e-10, rtol=0)


def test_torch_qp_solve_validates_under_vmap():
    """Under torch.func the inputs are validated inside the Function on the plain tensors (a
    value check cannot branch on a batched tensor): the same NotPSDError as outside, and the
    vmapped solutions are the per-sample ones (x = min(-q, 0) for P = I, x <= 0)."""
    from torch.func import vmap

    from dxopt.qp.problem.canonical import NotPSDError

    eye = torch.eye(3, dtype=_F64)
    h = torch.zeros(3, dtype=_F64)
    qs = torch.tensor([[1.0, -1.0, 2.0], [-1.0, -2.0, 0.5]], dtype=_F64)
    x = vmap(lambda q: torch_qp_solve(eye, q, G=eye, h=h).x[0])(qs)
    torch.testing.assert_close(x, (-qs).clamp(max=0.0), atol=1e-12, rtol=0)
    with pytest.raises(NotPSDError, match="positive semidefinite"):
        vmap(lambda q: torch_qp_solve(-eye, q, G=eye, h=h).x)(qs)
