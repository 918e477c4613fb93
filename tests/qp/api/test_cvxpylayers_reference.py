"""dxopt.qp against cvxpylayers, an independent implementation (cone program + diffcp).

Tolerances come from the reference's own accuracy (see ``_ref_cvxpylayers``): with SCS at
1e-10 and diffcp's dense derivative, cvxpylayers reproduces the known solution of such
problems to <= 3.1e-9 and the exact reduced-KKT gradients to <= 2.6e-9 (relative; measured on
60 problems of these sizes). Each test first checks that the reference reached
``REFERENCE_ATOL`` on its own problem (known solution), then requires

- x and multipliers within ``SOLUTION_ATOL`` of the reference,
- KKT-backward gradients within ``KKT_RTOL`` (the reference's error with a 40x margin),
- penalty-backward gradients within ``PENALTY_RTOL``: the issue's penalty-vs-KKT target
  (1e-6) plus the reference's error.

Gradients are taken of a random linear functional of x *and* of both multiplier vectors, so
the derivatives of the duals are checked too. Measured (this file, 2026-11-29): the largest
relative gradient difference to cvxpylayers is 1.4e-9 for both backwards.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

pytest.importorskip("cvxpylayers")
pytest.importorskip("diffcp")

from _ref_cvxpylayers import reference_solve
from _ref_problems import relative_error
from qp_zoo import QPData, complementary_qp, sparse_complementary_qp, stack

import dxopt.qp as dqp

REFERENCE_ATOL = 1e-7
SOLUTION_ATOL = 1e-7
KKT_RTOL = 1e-7
PENALTY_RTOL = 1.1e-6
GRADIENT_RTOL = {"kkt": KKT_RTOL, "penalty": PENALTY_RTOL}

# (n, m, p): unconstrained, equality-only, inequality-only, both blocks.
SIZES = [(5, 0, 0), (6, 0, 2), (8, 10, 0), (12, 15, 4), (15, 20, 5)]
BACKWARDS = ["penalty", "kkt"]
NAMES = ("q", "A", "b", "G", "h")


def _leaves(problem: QPData) -> dict[str, Tensor]:
    """Fresh leaf tensors: the Hessian factor L (P = LᵀL) and q, A, b, G, h when present."""
    leaves = {"L": torch.linalg.cholesky(problem.P).mT.contiguous().requires_grad_()}
    for name in NAMES:
        value = getattr(problem, name)
        if value is not None:
            leaves[name] = value.detach().clone().requires_grad_()
    return leaves


def _cotangents(problem: QPData, seed: int) -> dict[str, Tensor | None]:
    gen = torch.Generator().manual_seed(seed)

    def draw(like: Tensor | None) -> Tensor | None:
        if like is None:
            return None
        return torch.randn(like.shape, generator=gen, dtype=torch.float64)

    return {"x": draw(problem.x), "eq": draw(problem.eq_duals), "ineq": draw(problem.ineq_duals)}


def _loss(x: Tensor, eq: Tensor | None, ineq: Tensor | None, w: dict[str, Tensor | None]) -> Tensor:
    assert w["x"] is not None
    loss = (w["x"] * x).sum()
    if eq is not None and w["eq"] is not None:
        loss = loss + (w["eq"] * eq).sum()
    if ineq is not None and w["ineq"] is not None:
        loss = loss + (w["ineq"] * ineq).sum()
    return loss


def _gradients(leaves: dict[str, Tensor], loss: Tensor) -> dict[str, Tensor]:
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[k] for k in names], allow_unused=True)
    return {k: (torch.zeros_like(leaves[k]) if g is None else g) for k, g in zip(names, grads)}


def _run_reference(problem: QPData, w: dict[str, Tensor | None]) -> tuple:
    leaves = _leaves(problem)
    get = leaves.get
    ref = reference_solve(leaves["L"], leaves["q"], get("A"), get("b"), get("G"), get("h"))
    return ref, _gradients(leaves, _loss(ref.x, ref.eq_duals, ref.ineq_duals, w))


def _run_dxopt(problem: QPData, w: dict[str, Tensor | None], backward: str) -> tuple:
    leaves = _leaves(problem)
    get = leaves.get
    P = leaves["L"].mT @ leaves["L"]
    sol = dqp.solve(
        P, leaves["q"], A=get("A"), b=get("b"), G=get("G"), h=get("h"), backward=backward
    )
    return sol, _gradients(leaves, _loss(sol.x, sol.eq_duals, sol.ineq_duals, w))


def _assert_reference_accurate(problem: QPData, ref) -> None:
    """The reference reached the accuracy our tolerances assume (known solution)."""
    assert problem.x is not None
    torch.testing.assert_close(ref.x.detach(), problem.x, rtol=0, atol=REFERENCE_ATOL)
    if problem.eq_duals is not None:
        torch.testing.assert_close(
            ref.eq_duals.detach(), problem.eq_duals, rtol=0, atol=REFERENCE_ATOL
        )
    if problem.ineq_duals is not None:
        torch.testing.assert_close(
            ref.ineq_duals.detach(), problem.ineq_duals, rtol=0, atol=REFERENCE_ATOL
        )


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize(("n", "m", "p"), SIZES)
def test_solution_and_gradients_match_cvxpylayers(n: int, m: int, p: int, backward: str) -> None:
    problem = complementary_qp(n, m=m, p=p, seed=100 + n)
    w = _cotangents(problem, seed=n)
    ref, ref_grads = _run_reference(problem, w)
    _assert_reference_accurate(problem, ref)
    sol, grads = _run_dxopt(problem, w, backward)

    torch.testing.assert_close(sol.x.detach(), ref.x.detach(), rtol=0, atol=SOLUTION_ATOL)
    for ours, theirs in ((sol.eq_duals, ref.eq_duals), (sol.ineq_duals, ref.ineq_duals)):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=SOLUTION_ATOL)
    assert set(grads) == set(ref_grads)
    for name, expected in ref_grads.items():
        error = relative_error(grads[name], expected)
        assert error <= GRADIENT_RTOL[backward], f"{backward}: d/d{name} relative error {error:.2e}"


@pytest.mark.parametrize("backward", BACKWARDS)
def test_batched_with_shared_parameters_matches_cvxpylayers(backward: str) -> None:
    """Batched q, b, h with shared L (P), A, G: shared gradients are summed in both libraries."""
    n, m, p, seeds = 8, 10, 2, (1, 2, 3)
    base = complementary_qp(n, m=m, p=p, seed=7)
    assert base.x is not None and base.G is not None and base.A is not None
    # Per-sample problems sharing P, A, G; each is strictly complementary by construction.
    problems = []
    for seed in seeds:
        other = complementary_qp(n, m=m, p=p, seed=seed)
        assert other.x is not None and other.ineq_duals is not None and other.eq_duals is not None
        slack = other.h - other.G @ other.x  # type: ignore[operator]
        x = base.x + 0.1 * other.x
        nu, mu = other.ineq_duals, other.eq_duals
        q = -(base.P @ x + base.G.T @ nu + base.A.T @ mu)
        h = base.G @ x + slack
        problems.append(QPData(base.P, q, base.A, base.A @ x, base.G, h, x, mu, nu, other.active))
    batch = stack(problems)
    gen = torch.Generator().manual_seed(0)
    w_x = torch.randn(len(seeds), n, generator=gen, dtype=torch.float64)

    def run(solve) -> tuple[Tensor, dict[str, Tensor]]:
        L = torch.linalg.cholesky(base.P).mT.contiguous().requires_grad_()
        q = batch.q.clone().requires_grad_()
        h = batch.h.clone().requires_grad_()  # type: ignore[union-attr]
        A = base.A.clone().requires_grad_()  # type: ignore[union-attr]
        G = base.G.clone().requires_grad_()  # type: ignore[union-attr]
        b = batch.b.clone().requires_grad_()  # type: ignore[union-attr]
        x = solve(L, q, A, b, G, h)
        grads = torch.autograd.grad((w_x * x).sum(), [L, q, A, b, G, h])
        return x.detach(), dict(zip(["L", "q", "A", "b", "G", "h"], grads))

    x_ref, ref_grads = run(lambda L, q, A, b, G, h: reference_solve(L, q, A, b, G, h).x)
    x_ours, grads = run(
        lambda L, q, A, b, G, h: dqp.solve(L.mT @ L, q, A=A, b=b, G=G, h=h, backward=backward).x
    )
    torch.testing.assert_close(x_ref, batch.x, rtol=0, atol=REFERENCE_ATOL)
    torch.testing.assert_close(x_ours, x_ref, rtol=0, atol=SOLUTION_ATOL)
    for name, expected in ref_grads.items():
        error = relative_error(grads[name], expected)
        assert error <= GRADIENT_RTOL[backward], f"{backward}: d/d{name} relative error {error:.2e}"


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_sparse_inputs_match_cvxpylayers_on_their_pattern(
    backward: str, layout: torch.layout
) -> None:
    """Sparse P, A, G: gradients keep the input's layout and pattern and match the reference."""
    problem = sparse_complementary_qp(12, m=14, p=3, density=0.3, seed=4)
    dense = QPData(*(t.to_dense() if t is not None and t.is_sparse else t for t in problem))
    w = _cotangents(dense, seed=9)
    ref, ref_grads = _run_reference(dense, w)
    _assert_reference_accurate(dense, ref)

    def leaf(name: str) -> Tensor:
        value = getattr(problem, name).detach().clone()
        if value.is_sparse and layout == torch.sparse_csr:
            value = value.to_sparse_csr()
        return value.requires_grad_()

    leaves = {name: leaf(name) for name in ("P", *NAMES)}
    sol = dqp.solve(**{k: leaves[k] for k in ("P", *NAMES)}, backward=backward)
    torch.testing.assert_close(sol.x.detach(), ref.x.detach(), rtol=0, atol=SOLUTION_ATOL)
    _loss(sol.x, sol.eq_duals, sol.ineq_duals, w).backward()
    for name in NAMES:
        grad = leaves[name].grad
        assert grad is not None, f"no gradient for {name}"
        expected = ref_grads[name]
        if leaves[name].layout != torch.strided:
            assert grad.layout == layout, f"d/d{name} came back as {grad.layout}, not {layout}"
            pattern = leaves[name].detach().to_sparse_coo().coalesce().indices()
            grad = grad.to_sparse_coo().coalesce()
            assert torch.equal(grad.indices(), pattern), f"d/d{name} changed the sparsity pattern"
            grad, expected = grad.values(), expected[pattern[0], pattern[1]]
        error = relative_error(grad, expected)
        assert error <= GRADIENT_RTOL[backward], f"{backward}: d/d{name} relative error {error:.2e}"


def _boxed_problem(n: int, m: int, p: int, seed: int) -> tuple[QPData, dict[str, Tensor]]:
    """``complementary_qp`` plus finite box bounds, built backwards from the KKT conditions:
    2 lower and 1 upper bound active with multipliers >= 0.5, the other bounds >= 0.5 away."""
    base = complementary_qp(n, m=m, p=p, n_active=1, seed=seed)
    assert base.x is not None and base.active is not None
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    lower_active = torch.zeros(n, dtype=torch.bool)
    upper_active = torch.zeros(n, dtype=torch.bool)
    lower_active[[0, 2]] = True
    upper_active[1] = True
    lam_lb = torch.where(lower_active, 0.5 + torch.rand(n, generator=gen, dtype=f64), 0.0)
    lam_ub = torch.where(upper_active, 0.5 + torch.rand(n, generator=gen, dtype=f64), 0.0)
    lb = base.x - torch.where(lower_active, 0.0, 0.5 + torch.rand(n, generator=gen, dtype=f64))
    ub = base.x + torch.where(upper_active, 0.0, 0.5 + torch.rand(n, generator=gen, dtype=f64))
    # Stationarity P x + q + Aᵀμ + Gᵀν - λ_lb + λ_ub = 0 (rows -x <= -lb and x <= ub).
    problem = base._replace(q=base.q + lam_lb - lam_ub)
    return problem, {"lb": lb, "ub": ub, "lb_duals": lam_lb, "ub_duals": lam_ub}


@pytest.mark.parametrize("backward", BACKWARDS)
def test_box_bounds_match_cvxpylayers(backward: str) -> None:
    """lb <= x <= ub: x, all four multiplier vectors and every gradient (lb, ub included)."""
    problem, box = _boxed_problem(9, m=5, p=2, seed=13)
    gen = torch.Generator().manual_seed(4)
    weights = {
        k: torch.randn(9 if k != "eq" else 2, generator=gen, dtype=torch.float64)
        for k in ("x", "eq", "lb", "ub")
    }
    weights["ineq"] = torch.randn(5, generator=gen, dtype=torch.float64)

    def run(solve) -> tuple:
        leaves = _leaves(problem)
        leaves["lb"] = box["lb"].clone().requires_grad_()
        leaves["ub"] = box["ub"].clone().requires_grad_()
        sol = solve(leaves)
        outputs = {"x": sol.x, "eq": sol.eq_duals, "ineq": sol.ineq_duals}
        outputs |= {"lb": sol.lb_duals, "ub": sol.ub_duals}
        loss = sum((weights[k] * v).sum() for k, v in outputs.items())
        return outputs, _gradients(leaves, loss)

    get = problem._asdict().get
    ref, ref_grads = run(
        lambda t: reference_solve(
            t["L"], t["q"], t["A"], t["b"], t["G"], t["h"], lb=t["lb"], ub=t["ub"]
        )
    )
    ours, grads = run(
        lambda t: dqp.solve(
            t["L"].mT @ t["L"],
            t["q"],
            A=t["A"],
            b=t["b"],
            G=t["G"],
            h=t["h"],
            lb=t["lb"],
            ub=t["ub"],
            backward=backward,
        )
    )
    known = {"x": get("x"), "eq": get("eq_duals"), "ineq": get("ineq_duals")}
    known |= {"lb": box["lb_duals"], "ub": box["ub_duals"]}
    for key, value in known.items():
        torch.testing.assert_close(ref[key].detach(), value, rtol=0, atol=REFERENCE_ATOL)
        torch.testing.assert_close(
            ours[key].detach(), ref[key].detach(), rtol=0, atol=SOLUTION_ATOL
        )
    assert set(grads) == set(ref_grads) == {"L", *NAMES, "lb", "ub"}
    for name, expected in ref_grads.items():
        error = relative_error(grads[name], expected)
        assert error <= GRADIENT_RTOL[backward], f"{backward}: d/d{name} relative error {error:.2e}"


@pytest.mark.parametrize("backward", BACKWARDS)
def test_fully_batched_matrices_match_cvxpylayers(backward: str) -> None:
    """Per-sample L (P), A, G as well as q, b, h: the batched matrix gradients."""
    batch = stack([complementary_qp(7, m=6, p=2, seed=40 + i) for i in range(3)])
    w = torch.randn(3, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def run(solve) -> tuple[Tensor, dict[str, Tensor]]:
        leaves = _leaves(batch)
        get = leaves.get
        x = solve(leaves["L"], leaves["q"], get("A"), get("b"), get("G"), get("h"))
        return x.detach(), _gradients(leaves, (w * x).sum())

    x_ref, ref_grads = run(lambda L, *rest: reference_solve(L, *rest).x)
    x_ours, grads = run(
        lambda L, *rest: dqp.solve(L.mT @ L, **dict(zip("qAbGh", rest)), backward=backward).x
    )
    torch.testing.assert_close(x_ref, batch.x, rtol=0, atol=REFERENCE_ATOL)
    torch.testing.assert_close(x_ours, x_ref, rtol=0, atol=SOLUTION_ATOL)
    for name, expected in ref_grads.items():
        assert grads[name].shape == expected.shape == batch_shape(batch, name)
        error = relative_error(grads[name], expected)
        assert error <= GRADIENT_RTOL[backward], f"{backward}: d/d{name} relative error {error:.2e}"


def batch_shape(batch: QPData, name: str) -> torch.Size:
    return batch.P.shape if name == "L" else getattr(batch, name).shape
