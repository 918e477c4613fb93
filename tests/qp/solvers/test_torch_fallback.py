"""``solver="torch"`` (the device path) gets the CPU path's certificate, fallback chain and
degenerate rules (issue 28 item 1; the ``solver="torch"`` repro of issue 30).

References: problems with a known solution and known multipliers (built from them), the
CPU path's own gradients (``solver="daqp"``, the same backward), kink-aware one-sided finite
differences in float64 (``_fd.py``) and the numpy certificate of ``dxopt.qp.certify.polish``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _fd import directional_verdicts
from benchmarks.qp_torch.problems import known_solution_batch as random_batch

import dxopt.qp as dqp
from dxopt.qp import QPStatus
from dxopt.qp.certify.polish import _make, certify
from dxopt.qp.certify.torch_certify import certify as torch_certify

D = torch.float64
KEYS = ("P", "q", "A", "b", "G", "h")
pytestmark = pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")


def _grads(data: dict[str, torch.Tensor], solver: str, backward: str, seed: int = 3) -> tuple:
    leaves = {k: v.detach().clone().requires_grad_() for k, v in data.items()}
    sol = dqp.solve(**leaves, solver=solver, backward=backward)
    w = torch.randn(sol.x.shape, generator=torch.Generator().manual_seed(seed), dtype=D)
    loss = (w.to(sol.x) * sol.x).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return sol, dict(zip(leaves, grads))


def test_float32_random_inequalities_are_all_solved_and_accurate() -> None:
    """float32, n = 20, cond(P) <= 7: the old torch path left about 2% of the samples FAILED
    (QPSolveError with the default on_failure); now every one is solved, to float32 rounding
    of the float64 solution of the same (float32-rounded) data."""
    data, _ = random_batch(300, 20, 30, seed=0)
    data32 = {k: v.float() for k, v in data.items()}
    sol = dqp.solve(**data32, solver="torch", on_failure="nan")
    assert sol.x.dtype == torch.float32
    assert all(s is QPStatus.SOLVED for s in sol.status)
    ref = dqp.solve(**{k: v.double() for k, v in data32.items()}, solver="daqp")
    err = (sol.x.double() - ref.x).abs() / (1.0 + ref.x.abs())
    assert float(err.max()) <= 1e-5
    cpu32 = dqp.solve(**data32, solver="auto", on_failure="nan")  # float32 auto on the CPU
    assert sum(s.ok for s in sol.status) >= sum(s.ok for s in cpu32.status)


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_float64_weakly_active_rows_solved_exactly_and_differentiated(backward: str) -> None:
    """Active rows with a zero multiplier: the old torch path failed on about 7% of these
    samples and refused the backward of others; now every sample is solved to the requested
    accuracy and differentiated with the CPU path's weak-row rule (the same gradient)."""
    data, xs = random_batch(40, 12, 16, seed=1, weak=3)
    sol, grads = _grads(data, "torch", backward)
    assert all(s is QPStatus.SOLVED for s in sol.status)
    assert float((sol.x.detach() - torch.tensor(xs)).abs().max()) <= 1e-9
    _ref, ref_grads = _grads(data, "daqp", backward)
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], atol=1e-8, rtol=1e-7, msg=k)


def _fd_check(data: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], w: torch.Tensor):
    def loss(d: dict[str, torch.Tensor]) -> float:
        sol = dqp.solve(**d, solver="torch", backward="kkt", on_failure="nan")
        return float((w * sol.x).sum())  # NaN where the move makes it infeasible: no verdict

    return directional_verdicts(data, grads, loss, hull=True)


def _degenerate_case(kind: str) -> dict[str, torch.Tensor]:
    if kind == "opposite":  # x1 + x2 <= 1 and -(x1 + x2) <= -1: an equality by two rows
        G = [[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 1.0]]
        return {
            "P": torch.eye(3, dtype=D),
            "q": torch.tensor([-1.0, -2.0, 0.5], dtype=D),
            "G": torch.tensor(G, dtype=D),
            "h": torch.tensor([1.0, -1.0, 2.0], dtype=D),
        }
    # a degenerate vertex: rows e1, e2, e1 + e2 all active at x = (1, 1)
    return {
        "P": torch.eye(2, dtype=D),
        "q": torch.tensor([-3.0, -2.5], dtype=D),
        "G": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=D),
        "h": torch.tensor([1.0, 1.0, 2.0], dtype=D),
    }


@pytest.mark.parametrize("kind", ["opposite", "vertex"])
@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_opposite_rows_and_degenerate_vertex_are_differentiated(kind: str, backward: str) -> None:
    """The old torch path said SOLVED and then refused the backward; the CPU backends
    differentiate these cases. Now solver="torch" gives the CPU path's gradient, inside the
    one-sided finite differences."""
    data = _degenerate_case(kind)
    sol, grads = _grads(data, "torch", backward)
    assert sol.status == (QPStatus.SOLVED,)
    ref, ref_grads = _grads(data, "daqp", backward)
    torch.testing.assert_close(sol.x, ref.x, atol=1e-10, rtol=0)
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], atol=1e-8, rtol=1e-7, msg=k)
    w = torch.randn(sol.x.shape, generator=torch.Generator().manual_seed(3), dtype=D)
    if kind == "opposite":
        # moving G or h pulls the two opposite rows apart (or makes the sample infeasible):
        # the feasible side's quotient is the piece where one row leaves, while the rule
        # splits the multiplier between the rows (the CPU path's choice, compared above):
        # finite-difference verdicts on P and q only
        grads = {k: v for k, v in grads.items() if k in ("P", "q")}
    assert _fd_check(data, grads, w) >= (1 if kind == "opposite" else 2)


def _dfl_repro(requires_grad: bool = True) -> dict[str, torch.Tensor]:
    q = torch.tensor([0.92, 0.04, 0.7, 0.18], dtype=D, requires_grad=requires_grad)
    A = torch.tensor([[-1.0, -1, 0, 0], [1, 0, -1, 0], [0, 1, 0, -1]], dtype=D)
    return {
        "P": 0.5 * torch.eye(4, dtype=D),
        "q": q,
        "A": A,
        "b": torch.tensor([-1.0, 0.0, 0.0], dtype=D),
        "lb": torch.zeros(4, dtype=D),
        "ub": torch.ones(4, dtype=D),
    }


def test_issue30_dfl_repro_backward_kkt_on_the_torch_solver() -> None:
    """Issue 30: ``solver="torch", backward="kkt"`` raised QPBackwardError on this flow LP
    (QPTL); now it returns the CPU path's gradient (a degenerate vertex, differentiated by
    the CPU path's rule), checked against one-sided differences."""
    grads = {}
    for solver in ("torch", "daqp"):
        data = _dfl_repro()
        sol = dqp.solve(**data, solver=solver, backward="kkt")
        (sol.x * torch.arange(1.0, 5.0, dtype=D)).sum().backward()
        assert sol.info.sample_solvers != ("torch",)  # the degenerate sample: the CPU path
        torch.testing.assert_close(sol.x.detach(), torch.tensor([0.0, 1, 0, 1], dtype=D))
        grads[solver] = data["q"].grad
    torch.testing.assert_close(grads["torch"], grads["daqp"], atol=1e-10, rtol=0)
    data = {k: v.detach() for k, v in _dfl_repro().items()}

    def loss(d: dict[str, torch.Tensor]) -> float:
        sol = dqp.solve(**d, **{k: data[k] for k in ("P", "A", "b", "lb", "ub")}, solver="torch")
        return float((sol.x * torch.arange(1.0, 5.0, dtype=D)).sum())

    assert directional_verdicts({"q": data["q"]}, {"q": grads["torch"]}, loss, hull=True) == 1


def test_torch_func_and_forward_mode_on_a_degenerate_batch() -> None:
    """jacrev, jacfwd and forward-mode AD through solver="torch" on a batch with a regular
    and a degenerate sample: the CPU path's derivatives (no QPBackwardError)."""
    from torch.autograd import forward_ad
    from torch.func import jacfwd, jacrev

    data = {k: v.detach() for k, v in _dfl_repro(False).items()}
    q = torch.stack([data["q"], torch.tensor([0.1, 0.2, -0.3, 0.4], dtype=D)])
    rest = {k: data[k] for k in ("P", "A", "b", "lb", "ub")}

    def f(solver: str):
        return lambda q: dqp.solve(q=q, **rest, solver=solver, backward="kkt").x

    for transform in (jacrev, jacfwd):
        torch.testing.assert_close(
            transform(f("torch"))(q), transform(f("daqp"))(q), atol=1e-9, rtol=0
        )
    t = torch.randn(q.shape, generator=torch.Generator().manual_seed(0), dtype=D)
    tangents = {}
    for solver in ("torch", "daqp"):
        with forward_ad.dual_level():
            x = dqp.solve(q=forward_ad.make_dual(q, t), **rest, solver=solver, backward="kkt").x
            tangents[solver] = forward_ad.unpack_dual(x).tangent
    torch.testing.assert_close(tangents["torch"], tangents["daqp"], atol=1e-9, rtol=0)


def test_uncertified_samples_go_through_the_fallback_chain() -> None:
    """A torch solve that cannot certify (one interior-point iteration) is finished by the CPU
    fallback chain, not reported FAILED; ``fallback=False`` keeps the old behaviour."""
    data, xs = random_batch(6, 8, 10, seed=4)
    sol = dqp.solve(**data, solver="torch", solver_options={"max_iter": 1})
    assert all(s is QPStatus.SOLVED for s in sol.status)
    assert sol.info.sample_solvers.count("torch") < 6  # the rest: the CPU chain's backends
    assert float((sol.x - torch.tensor(xs)).abs().max()) <= 1e-9
    off = dqp.solve(**data, solver="torch", solver_options={"max_iter": 1}, fallback=False,
                    on_failure="nan")  # fmt: skip
    failed = [not s.ok for s in off.status]
    assert sum(failed) == 6 - sol.info.sample_solvers.count("torch")
    # the shared vocabulary: an interior point stopped at its iteration limit is MAX_ITER, as a
    # CPU backend's attempt would be (the device path used to report it FAILED)
    assert {s for s in off.status if not s.ok} == {QPStatus.MAX_ITER}
    assert torch.isnan(off.x[torch.tensor(failed)]).all()


def test_cpu_route_of_the_torch_solver_uses_the_fallback_chain() -> None:
    """solver="torch" with a backward object takes the float64 CPU route: its points are
    polished and certified like any backend's (the old route reported these one-iteration
    points FAILED), and what it does not solve goes on through the chain."""
    data, xs = random_batch(6, 8, 10, seed=5, weak=2)
    sol = dqp.solve(**data, solver="torch", backward=dqp.KKTBackward(),
                    solver_options={"max_iter": 1})  # fmt: skip
    assert all(s is QPStatus.SOLVED for s in sol.status)
    assert all(sol.info.polished)  # the CPU polish, from the torch solver's points
    assert float((sol.x - torch.tensor(xs)).abs().max()) <= 1e-9
    with pytest.raises(ValueError, match="solver_options"):
        dqp.solve(**data, solver="torch", backward=dqp.KKTBackward(),
                  solver_options={"maxiter": 1})  # fmt: skip
    sol = dqp.solve(**data, solver="torch", backward=dqp.KKTBackward())
    assert all(s is QPStatus.SOLVED for s in sol.status)
    assert float((sol.x - torch.tensor(xs)).abs().max()) <= 1e-9


def test_device_certificate_is_the_cpu_certificate() -> None:
    """The torch certificate accepts exactly the points the numpy certificate of
    dxopt.qp.certify.polish accepts as settled, on points perturbed around the tolerance."""
    data, xs = random_batch(1, 6, 8, seed=6)
    P, q, G, h = (data[k][0].numpy() for k in ("P", "q", "G", "h"))
    x0 = xs[0]
    nu0 = np.linalg.lstsq(G[h - G @ x0 < 1e-12].T, -(P @ x0 + q), rcond=None)[0]
    nu_full = np.zeros(8)
    nu_full[h - G @ x0 < 1e-12] = nu0
    rng = np.random.default_rng(0)
    eps = 1e-6
    agree = disagree = 0
    for scale in (1e-9, 3e-7, 1e-6, 3e-6, 1e-5):
        for _ in range(20):
            x = x0 + scale * rng.standard_normal(6)
            nu = np.maximum(nu_full + scale * rng.standard_normal(8), 0.0)
            cert = certify(_make(P, q, None, None, G, h, eps, 0.0), x, np.zeros(0), nu)
            want = cert.ok and cert.settled
            t = [torch.tensor(a)[None] for a in (P, q, np.zeros((0, 6)), np.zeros(0), G, h)]
            got = bool(torch_certify(*t, torch.tensor(x)[None], torch.zeros(1, 0, dtype=D),
                                     torch.tensor(nu)[None], eps, 0.0))  # fmt: skip
            agree += got == want
            disagree += got != want
    assert disagree == 0 and agree == 100


def test_failure_table_script_smoke(tmp_path, monkeypatch) -> None:
    """benchmarks/qp_torch/failures.py on a few problems: every configuration row, no
    failure another backend solves, no backward refusal; BENCHMARKS.md untouched."""
    from benchmarks.common import BENCHMARKS_MD
    from benchmarks.qp_torch import failures

    before = BENCHMARKS_MD.read_text()
    monkeypatch.setattr(failures, "results_dir", lambda area: tmp_path)
    failures.main(["--size", "12", "--chunk", "12", "--no-md"])
    text = (tmp_path / "failures.md").read_text()
    rows = [r for r in text.splitlines() if r.startswith("| 20 ") or r.startswith("| 50 ")]
    assert len(rows) == 8
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        row = dict(zip(failures.COLUMNS, cells))
        assert row["others_solve"] == "0" and row["refusals"] == "0", r
    assert BENCHMARKS_MD.read_text() == before


def test_mixed_batch_keeps_regular_samples_on_the_device() -> None:
    """A batch of regular and weakly active samples: the regular ones stay with the torch
    solver, the others take the CPU path; gradients (reverse and forward mode) of the whole
    batch equal the CPU path's."""
    from torch.autograd import forward_ad

    a, xa = random_batch(5, 10, 14, seed=7)
    b, xb = random_batch(5, 10, 14, seed=8, weak=2)
    data = {k: torch.cat([a[k], b[k]]) for k in a}
    sol, grads = _grads(data, "torch", "kkt")
    assert sol.info.sample_solvers[:5] == ("torch",) * 5
    assert "torch" not in sol.info.sample_solvers[5:]
    torch.testing.assert_close(sol.x.detach(), torch.tensor(np.concatenate([xa, xb])),
                               atol=1e-9, rtol=0)  # fmt: skip
    _, ref_grads = _grads(data, "daqp", "kkt")
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], atol=1e-8, rtol=1e-7, msg=k)
    t = torch.randn(data["h"].shape, generator=torch.Generator().manual_seed(1), dtype=D)
    tangents = {}
    for solver in ("torch", "daqp"):
        with forward_ad.dual_level():
            h = forward_ad.make_dual(data["h"], t)
            x = dqp.solve(**{**data, "h": h}, solver=solver, backward="kkt").x
            tangents[solver] = forward_ad.unpack_dual(x).tangent
    torch.testing.assert_close(tangents["torch"], tangents["daqp"], atol=1e-8, rtol=1e-7)


def test_singular_P_takes_the_cpu_path() -> None:
    """An LP (P = 0) and a P singular on the feasible face: the device backward would not be
    the derivative there; the CPU path solves and differentiates them."""
    c = torch.tensor([[1.0, 2.0, -1.0], [0.5, -1.0, 1.0]], dtype=D, requires_grad=True)
    box = {"lb": -torch.ones(3, dtype=D), "ub": torch.ones(3, dtype=D)}
    grads = {}
    for solver in ("torch", "daqp"):
        sol = dqp.solve(P=torch.zeros(2, 3, 3, dtype=D), q=c, **box, solver=solver)
        assert all(s is QPStatus.SOLVED for s in sol.status)
        torch.testing.assert_close(sol.x.detach(), -torch.sign(c.detach()))
        if solver == "torch":
            assert "torch" not in sol.info.sample_solvers
        (grads[solver],) = torch.autograd.grad(sol.lb_duals.sum(), c)
    torch.testing.assert_close(grads["torch"], grads["daqp"], atol=1e-10, rtol=0)


def test_ill_conditioned_vertex_backward_is_refined_not_refused() -> None:
    """A sample of the failure table (20 active rows in R^20, normalised smallest singular
    value 4e-3): four refinement passes left the device adjoint residual at 1.4e-10 and the
    backward refused it; the refinement now runs to round-off (the CPU path's gradient)."""
    table, _ = random_batch(1000, 20, 30, 7000)  # the failure table's n = 20 configuration
    data = {k: v[423:424] for k, v in table.items()}
    sol, grads = _grads(data, "torch", "kkt")
    assert sol.info.sample_solvers == ("torch",)
    _, ref_grads = _grads(data, "daqp", "kkt")
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], atol=1e-9, rtol=1e-7, msg=k)
