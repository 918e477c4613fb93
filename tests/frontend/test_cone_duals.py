"""CvxpyLayer's constraint duals for cp.SOC, cp.ExpCone and PSD (>>) constraints.

References: CVXPY's own ``dual_value`` after a direct Clarabel solve at tight tolerances, the
closed forms of each block, and central differences of the duals (the blocks are strictly
complementary, so the duals are unique and smooth in the parameters).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

cp = pytest.importorskip("cvxpy")

from dxopt.frontend import CvxpyLayer  # noqa: E402

D = torch.float64
TIGHT = {"tol": 1e-10}


def _problem():
    """Three independent blocks with unique, closed-form duals.

    - ball: ``min |x - c|^2`` s.t. ``SOC(r, x)``: with ``|c| > r``, ``x = r c/|c|`` and the
      multiplier ``(lam, -lam x/r)``, ``lam = 2(|c| - r)``;
    - exp: ``max a'u - |u|^2/2`` s.t. ``ExpCone(u, 1, e)`` (``u <= log e``): with
      ``a > log e``, ``u = log e`` and the multiplier of the ``(u, 1, e)`` rows
      ``mu (-1, log e - 1, 1/e)``, ``mu = a - log e``;
    - psd: ``min <C, X>`` s.t. ``X >> 0``, ``tr X = 1``: ``X = v v'`` for the smallest
      eigenpair, the PSD multiplier ``Z = C - lam_min I``.
    """
    x, u, X = cp.Variable(3), cp.Variable(2), cp.Variable((3, 3), symmetric=True)
    c, r = cp.Parameter(3), cp.Parameter(nonneg=True)
    a, e = cp.Parameter(2), cp.Parameter(2, pos=True)
    C = cp.Parameter((3, 3), symmetric=True)
    soc = cp.SOC(r, x)
    exp = cp.ExpCone(u, np.ones(2), e)
    psd = X >> 0
    objective = cp.sum_squares(x - c) - a @ u + 0.5 * cp.sum_squares(u) + cp.trace(C @ X)
    prob = cp.Problem(cp.Minimize(objective), [soc, exp, psd, cp.trace(X) == 1])
    return prob, [c, r, a, e, C], (x, u, X), (soc, exp, psd)


def _values(rng: np.random.Generator) -> list[np.ndarray]:
    c = rng.standard_normal(3)
    c *= 2.0 / np.linalg.norm(c)
    G = rng.standard_normal((3, 3))
    C = G @ G.T + np.diag([0.0, 1.0, 2.0])
    return [c, np.array(0.8), np.array([1.5, 0.9]), np.array([2.0, 1.5]), C]


def _cvxpy_duals(prob, params, cons, values):
    for p, v in zip(params, values, strict=True):
        p.value = v
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    assert prob.status == cp.OPTIMAL
    soc, exp, psd = cons
    return (
        [np.asarray(d) for d in soc.dual_value],
        [np.asarray(d) for d in exp.dual_value],
        (np.asarray(psd.dual_value)),
    )


def test_soc_exp_psd_duals_match_cvxpy_and_closed_forms() -> None:
    prob, params, _, cons = _problem()
    soc, exp, psd = cons
    layer = CvxpyLayer(prob, parameters=params, variables=[soc, exp, psd], solver_args=TIGHT)
    assert layer.engine == "conic"
    values = _values(np.random.default_rng(0))
    soc_d, exp_d, psd_d = layer(*[torch.tensor(v, dtype=D) for v in values])
    ref_soc, ref_exp, ref_psd = _cvxpy_duals(prob, params, cons, values)
    # CVXPY's dual_value lists: SOC (t part, x part), ExpCone (x, y, z parts)
    assert isinstance(soc_d, tuple) and len(soc_d) == 2
    assert isinstance(exp_d, tuple) and len(exp_d) == 3
    assert tuple(soc_d[0].shape) == soc.dual_variables[0].shape == (1,)
    assert tuple(soc_d[1].shape) == soc.dual_variables[1].shape == (3,)
    for got, ref in zip(soc_d + exp_d, ref_soc + ref_exp, strict=True):
        np.testing.assert_allclose(got.numpy(), ref.reshape(got.shape), atol=1e-7, rtol=0)
    assert psd_d.shape == (3, 3)
    np.testing.assert_allclose(psd_d.numpy(), ref_psd, atol=1e-7, rtol=0)
    # closed forms (see _problem)
    c, r, a, e, C = values
    lam = 2 * (np.linalg.norm(c) - r)
    np.testing.assert_allclose(soc_d[0].numpy(), [lam], atol=1e-8)
    np.testing.assert_allclose(soc_d[1].numpy(), -lam * c / np.linalg.norm(c), atol=1e-8)
    mu = a - np.log(e)
    for got, ref in zip(exp_d, (-mu, mu * (np.log(e) - 1), mu / e), strict=True):
        np.testing.assert_allclose(got.numpy(), ref, atol=1e-8)
    lam_min = np.linalg.eigvalsh(C)[0]
    np.testing.assert_allclose(psd_d.numpy(), C - lam_min * np.eye(3), atol=1e-8)


def test_single_dual_variables_and_batches() -> None:
    """constraint.dual_variables[i] gives that part alone; a batch gives a leading axis."""
    prob, params, _, cons = _problem()
    soc, exp, _ = cons
    outs = [soc.dual_variables[1], exp.dual_variables[2]]
    layer = CvxpyLayer(prob, parameters=params, variables=outs, solver_args=TIGHT)
    full = CvxpyLayer(prob, parameters=params, variables=[soc, exp], solver_args=TIGHT)
    rng = np.random.default_rng(1)
    batch = [np.stack(col) for col in zip(*[_values(rng) for _ in range(2)], strict=True)]
    tensors = [torch.tensor(v, dtype=D) for v in batch]
    x_part, z_part = layer(*tensors)
    soc_full, exp_full = full(*tensors)
    assert x_part.shape == (2, 3) and z_part.shape == (2, 2)
    torch.testing.assert_close(x_part, soc_full[1], atol=1e-12, rtol=0)
    torch.testing.assert_close(z_part, exp_full[2], atol=1e-12, rtol=0)


def test_dual_gradients_match_central_differences() -> None:
    """Directional derivatives of the duals by autograd against central differences (two
    steps, which must agree: the point is smooth) along random parameter directions."""
    prob, params, _, cons = _problem()
    soc, exp, psd = cons
    layer = CvxpyLayer(prob, parameters=params, variables=[soc, exp, psd], solver_args=TIGHT)
    values = _values(np.random.default_rng(2))
    rng = np.random.default_rng(3)
    weights = [torch.tensor(rng.standard_normal(s)) for s in [(1,), (3,), (2,), (2,), (2,)]]
    weights.append(torch.tensor(rng.standard_normal((3, 3))))

    def loss(vals: list[torch.Tensor]) -> torch.Tensor:
        soc_d, exp_d, psd_d = layer(*vals)
        return sum((w * p).sum() for w, p in zip(weights, [*soc_d, *exp_d, psd_d]))

    leaves = [torch.tensor(v, dtype=D, requires_grad=True) for v in values]
    grads = torch.autograd.grad(loss(leaves), leaves)
    for _ in range(2):
        dirs = [rng.standard_normal(np.shape(v)) for v in values]
        dirs[4] = dirs[4] + dirs[4].T  # C stays symmetric
        exact = sum(float((g * torch.tensor(d)).sum()) for g, d in zip(grads, dirs))
        slopes = []
        for h in (1e-4, 1e-5):
            with torch.no_grad():
                up = loss([torch.tensor(v + h * d, dtype=D) for v, d in zip(values, dirs)])
                down = loss([torch.tensor(v - h * d, dtype=D) for v, d in zip(values, dirs)])
            slopes.append(float(up - down) / (2 * h))
        assert abs(slopes[0] - slopes[1]) < 1e-5 * (1 + abs(slopes[0]))  # smooth here
        assert abs(exact - slopes[1]) < 1e-5 * (1 + abs(slopes[1]))


def test_power_cone_duals_match_cvxpy() -> None:
    """cp.PowCone3D with vector arguments and per-element exponents: its rows are triples
    like the exponential cone's."""
    x, y, z, a = cp.Variable(3), cp.Variable(3), cp.Variable(3), cp.Parameter(3)
    pow3 = cp.PowCone3D(x, y, z, np.array([0.3, 0.5, 0.7]))
    objective = -a @ z + cp.sum_squares(x) + cp.sum_squares(y) + cp.sum_squares(z)
    bounds = [x <= np.array([1.0, 2.0, 3.0]), y <= np.array([2.0, 1.0, 0.5])]
    prob = cp.Problem(cp.Minimize(objective), [pow3, *bounds])
    layer = CvxpyLayer(prob, parameters=[a], variables=[pow3, z], solver_args=TIGHT)
    av = np.array([1.0, 2.0, 3.0])
    duals, zv = layer(torch.tensor(av, dtype=D))
    a.value = av
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    assert isinstance(duals, tuple) and len(duals) == 3
    for got, ref in zip(duals, pow3.dual_value, strict=True):  # cvxpy's solve: to ~1e-7
        np.testing.assert_allclose(got.numpy(), np.asarray(ref), atol=1e-6, rtol=0)
    # stationarity in z (z is free but for the cone): the z part equals -a + 2 z exactly
    np.testing.assert_allclose(duals[2].numpy(), -av + 2 * zv.numpy(), atol=1e-9, rtol=0)


def test_symmetric_variable_output_matches_cvxpy() -> None:
    """A symmetric variable (CVXPY's reduced upper-triangle form) as a layer output."""
    X = cp.Variable((3, 3), symmetric=True)
    C = cp.Parameter((3, 3), symmetric=True)
    prob = cp.Problem(cp.Minimize(cp.trace(C @ X)), [X >> 0, cp.trace(X) == 1, X[0, 2] >= 0.1])
    layer = CvxpyLayer(prob, parameters=[C], variables=[X], solver_args=TIGHT)
    G = np.random.default_rng(4).standard_normal((3, 3))
    Cv = G @ G.T + np.diag([0.0, 1.0, 2.0])
    (Xd,) = layer(torch.tensor(Cv, dtype=D))
    C.value = Cv
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    assert Xd.shape == (3, 3)
    np.testing.assert_allclose(Xd.numpy(), X.value, atol=1e-6)
    assert float(Xd[0, 2]) == float(Xd[2, 0])
