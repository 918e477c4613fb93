"""Accuracy columns of ``dxopt bench conic``: solutions and gradients in float64 at tight
tolerances, against an independent reference.

For one sample of a problem (parameter values :math:`\\theta`), a seeded random direction
:math:`d` in parameter space and a seeded random weight :math:`w`, the quantity checked is the
directional derivative of :math:`\\varphi(t) = w^\\top x(\\theta + t d)`, where :math:`x` is
the user's CVXPY variable (the uniquely defined part: CVXPY's canonical ``x`` also holds
epigraph and auxiliary columns, e.g. of ``abs(x) <= 1``, that are not unique).

- **Reference slope**: :math:`\\varphi` on CVXPY's own cone data at :math:`\\theta + t d`
  by ``dxopt.conic``'s certified forward at ``atol = rtol =`` :data:`FD_TOL` (Clarabel, then
  Newton polish to round-off, every residual checked; its backward is not used), the slope
  by :func:`kink_aware_slope` (one-sided slopes at several steps: a kink, where the
  one-sided slopes do not approach each other like the step, or unresolved differences give
  *no verdict*). The same slope from raw Clarabel points (``fd_clarabel``: the tightest of
  :data:`REF_TOLS` Clarabel reports ``Solved``) is a cross-check; it resolves less often,
  Clarabel stopping at about 1e-10. ``x_err`` is against that Clarabel point,
  ``x_err_scs`` against SCS at ``eps = 1e-12`` through CVXPY (a first-order method that
  reaches such tolerances on these sizes; ``-`` where it did not report optimal): where
  Clarabel's point is the looser one, every method shows the same ``x_err``.
- **Methods**, each asked for tolerance :data:`TIGHT` (``note`` says what it ran with): each
  method's gradient dotted with the direction: the layers (dxopt's
  ``CvxpyLayer``, cvxpylayers) with respect to the parameters; the raw-data methods
  (``dxopt.conic.solve``, Moreau) with respect to the cone data ``(P, q, A, b)``, dotted
  with the data's direction (the data are affine in :math:`\\theta`, so the direction is
  ``(data(theta + d) - data(theta - d)) / 2`` exactly).

``grad_rel_err = |g - g_fd| / max(|g_fd|, floor)`` (:data:`FLOOR`); the target (issue 37):
at most :data:`TARGET` on every non-degenerate problem.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from benchmarks.conic.peers import moreau_batch
from benchmarks.conic.problems import ConeData, Problem, cone_data

__all__ = ["FD_TOL", "REF_TOLS", "STEPS", "TARGET", "Slope", "accuracy_rows", "kink_aware_slope"]

TARGET = 1e-6
FD_TOL = 1e-12
REF_TOLS = (1e-12, 1e-11, 1e-10, 1e-9)
FLOOR = 1e-2
"""Relative errors are to ``max(|fd|, FLOOR * sum_i |w_i x_i|)``: the direction moves
:math:`\\theta` by a tenth of its norm per unit ``t``, so an O(1) relative sensitivity gives
slopes of order ``0.1 * sum |w_i x_i|``; a zero slope is judged against the floor."""
STEPS = (2e-3, 1e-3, 5e-4, 2.5e-4)
F64 = torch.float64


@dataclass(frozen=True)
class Slope:
    """A finite-difference slope: ``value`` (``None``: no verdict), its estimated error and
    ``verdict``: ``"smooth"``, ``"kink"`` or ``"unresolved"``."""

    value: float | None
    error: float
    verdict: str


def kink_aware_slope(
    phi: Callable[[float], float],
    steps: Sequence[float] = STEPS,
    *,
    resolve: float = 0.1,
    floor: float = 0.0,
) -> Slope:
    """The slope of ``phi`` at 0, or why there is none.

    One-sided slopes :math:`f_h = (\\varphi(h) - \\varphi(0))/h`, :math:`b_h = (\\varphi(0) -
    \\varphi(-h))/h` at the halving ``steps``. On a smooth ``phi`` their gap
    :math:`f_h - b_h \\approx h\\varphi''` halves with ``h``; above the resolution asked for,
    a gap that stays (the last within 3/4 to 2 times the first) is a kink and one that grows
    like :math:`1/h` is noise (``"unresolved"``).
    Otherwise the central slopes (error :math:`O(h^2)`) are Richardson-extrapolated,
    :math:`R = (4c_{h/2} - c_h)/3`, and the last two estimates' difference is the error
    estimate; above ``resolve * TARGET`` relative it is ``"unresolved"`` (solver noise).
    "Relative" is to ``max(|slope|, floor)``: a slope that is zero (a solution that does not
    move) is judged against ``floor``, not against itself."""
    f0 = phi(0.0)
    fwd = np.array([(phi(h) - f0) / h for h in steps])
    bwd = np.array([(f0 - phi(-h)) / h for h in steps])
    if not (np.isfinite(fwd).all() and np.isfinite(bwd).all() and np.isfinite(f0)):
        return Slope(None, float("inf"), "unresolved")
    central = 0.5 * (fwd + bwd)
    rich = (4 * central[1:] - central[:-1]) / 3
    value = float(rich[-1])
    error = float(abs(rich[-1] - rich[-2]))
    scale = max(abs(value), floor, 1e-300)
    gap = np.abs(fwd - bwd)
    visible = gap[-1] > resolve * TARGET * scale
    if visible and gap[-1] > 2 * gap[0]:  # grows like 1/h: noise, not a kink
        return Slope(None, float(gap[-1]), "unresolved")
    if visible and gap[-1] > 0.75 * gap[0]:  # a jump that stays: a kink
        return Slope(None, float(gap[-1]), "kink")
    if error > resolve * TARGET * scale:
        return Slope(value, error, "unresolved")
    return Slope(value, error, "smooth")


# ------------------------------------------------------------------------- the variable
def _variable_index(prob: Problem) -> tuple[int, Any]:
    """The variable's first canonical column and how its block maps to its value."""
    import cvxpy as cp

    data, chain, _ = prob.problem.get_problem_data(cp.CLARABEL)
    pp = data[cp.settings.PARAM_PROB]
    var = prob.variable
    ids = chain.compose_var_id_map().get(var.id, [var.id])
    return int(pp.var_id_to_col[ids[0]]), var


def variable_value(x: np.ndarray, start: int, var: Any) -> np.ndarray:
    """The variable's value (C-order flat) from a canonical ``x`` ``(..., n)``: its block
    column-major, or for a symmetric variable the upper triangle row by row (CVXPY's reduced
    form, as cvxpylayers unpacks it)."""
    if var.attributes.get("symmetric") or var.attributes.get("PSD"):
        k = var.shape[0]
        rows, cols = np.triu_indices(k)
        block = x[..., start : start + rows.size]
        full = np.zeros((*x.shape[:-1], k, k))
        full[..., rows, cols] = block
        full[..., cols, rows] = block
        return full.reshape(*x.shape[:-1], -1)
    block = x[..., start : start + var.size]
    shape = tuple(var.shape)
    out = block.reshape(*x.shape[:-1], *reversed(shape)) if shape else block
    if len(shape) == 2:
        out = np.swapaxes(out, -1, -2)
    return out.reshape(*x.shape[:-1], -1)


def _set(prob: Problem, values: Sequence[np.ndarray]) -> None:
    for par, v in zip(prob.parameters, values, strict=True):
        par.value = v


def _data_at(prob: Problem, values: Sequence[np.ndarray]) -> ConeData:
    single = Problem(prob.name, prob.size, prob.problem, prob.parameters, prob.variable,
                     [torch.tensor(v)[None] for v in values])  # fmt: skip
    return cone_data(single)[0]


def _clarabel_x(d: ConeData) -> np.ndarray:
    """Clarabel's point at the tightest of :data:`REF_TOLS` it reports ``Solved`` (NaN if
    none)."""
    import clarabel

    from benchmarks.conic.peers import clarabel_cones

    n = d.q.shape[0]
    P = sp.triu(d.P).tocsc() if d.P is not None else sp.csc_matrix((n, n))
    for tol in REF_TOLS:
        s = clarabel.DefaultSettings()
        s.verbose = False
        s.max_iter = 500
        s.tol_gap_abs = s.tol_gap_rel = s.tol_feas = tol
        cones = clarabel_cones(d)
        sol = clarabel.DefaultSolver(P, d.q, sp.csc_matrix(d.A), d.b, cones, s).solve()
        if str(sol.status) in ("Solved", "SolverStatus.Solved"):
            return np.asarray(sol.x)
    return np.full(n, np.nan)


def _dxopt_x(d: ConeData) -> np.ndarray:
    """``dxopt.conic``'s certified (polished) forward at :data:`FD_TOL` (NaN if refused)."""
    from benchmarks.conic.peers import dxopt_data
    from dxopt import conic

    P, q, A, b, cones = dxopt_data([d])
    sol = conic.solve(P, q, A, b, cones=cones, atol=FD_TOL, rtol=FD_TOL, on_failure="nan")
    return sol.x[0].numpy()


def _scs_variable(prob: Problem, values: Sequence[np.ndarray]) -> np.ndarray | None:
    """The variable (C-order flat) from CVXPY + SCS at ``eps = 1e-12``, if optimal."""
    import cvxpy as cp

    _set(prob, values)
    try:
        prob.problem.solve(solver=cp.SCS, eps_abs=1e-12, eps_rel=1e-12, max_iters=200_000)
    except cp.error.SolverError:
        return None
    if prob.problem.status != cp.OPTIMAL or prob.variable.value is None:
        return None
    return np.asarray(prob.variable.value, dtype=float).reshape(-1)


# ------------------------------------------------------------------------- the methods
def _layer_grad(layer: Callable[..., Any], values, direction, weight, args=None):
    leaves = [torch.tensor(v, dtype=F64, requires_grad=True) for v in values]
    out = layer(*leaves) if args is None else layer(*leaves, solver_args=args)
    x = out[0].reshape(-1)
    grads = torch.autograd.grad((torch.tensor(weight) * x).sum(), leaves, allow_unused=True)
    g = sum(float((gr * torch.tensor(d)).sum()) for gr, d in zip(grads, direction)
            if gr is not None)  # fmt: skip
    return g, x.detach().numpy()


def _dxopt_layer(prob: Problem) -> Callable[..., Any]:
    from dxopt.frontend import CvxpyLayer

    layer = CvxpyLayer(prob.problem, parameters=prob.parameters, variables=[prob.variable],
                       solver_args={"tol": TIGHT})  # fmt: skip

    def run(values, direction, weight):
        return (*_layer_grad(layer, values, direction, weight), f"tolerance {TIGHT:g}")

    return run


TIGHT = 1e-10
"""The tolerance every peer is asked for (``note`` says where a peer refused it)."""


def _cvxpylayers(prob: Problem, solver: str | None) -> Callable[..., Any]:
    """cvxpylayers (diffcp) with SCS (``solver=None``) or Clarabel as diffcp's solver, asked
    for :data:`TIGHT` through ``solver_args`` (diffcp hands them to the solver)."""
    from cvxpylayers.torch import CvxpyLayer

    layer = CvxpyLayer(prob.problem, parameters=prob.parameters, variables=[prob.variable])
    if solver is None:
        base: dict[str, Any] = {}
        tight: dict[str, Any] = {"eps_abs": TIGHT, "eps_rel": TIGHT, "max_iters": 100_000}
    else:
        base = {"solve_method": solver}
        tight = {"tol_gap_abs": TIGHT, "tol_gap_rel": TIGHT, "tol_feas": TIGHT}

    def run(values, direction, weight):
        try:
            g, x = _layer_grad(layer, values, direction, weight, {**base, **tight})
            return g, x, f"tolerance {TIGHT:g}"
        except Exception as exc:  # a peer that refuses the tight options runs at its defaults
            g, x = _layer_grad(layer, values, direction, weight, base)
            return g, x, f"defaults (tight options refused: {type(exc).__name__})"

    return run


def _raw_batch(prob: Problem, values, direction) -> list[ConeData]:
    plus = [v + d for v, d in zip(values, direction)]
    minus = [v - d for v, d in zip(values, direction)]
    return [_data_at(prob, vals) for vals in (values, plus, minus)]


def _dxopt_raw(prob: Problem, start: int, var: Any) -> Callable[..., Any]:
    from benchmarks.conic.peers import dxopt_data
    from dxopt import conic

    def run(values, direction, weight):
        P, q, A, b, cones = dxopt_data(_raw_batch(prob, values, direction))
        leaves = [t.clone().requires_grad_() for t in (q, A, b)]
        P_leaf = P.clone().requires_grad_() if P is not None else None
        sol = conic.solve(P_leaf, *leaves, cones=cones, atol=TIGHT, rtol=TIGHT)
        xv = _torch_variable(sol.x[0], start, var)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the note says what the warning says
            (xv * torch.tensor(weight)).sum().backward()
        inputs = ([P_leaf] if P_leaf is not None else []) + leaves
        g = sum(float((t.grad[0] * (t.detach()[1] - t.detach()[2]) / 2).sum()) for t in inputs)
        note = f"tolerance {TIGHT:g}"
        if sol.info.backward.singular and sol.info.backward.singular[0]:
            note += "; singular J (canonical solution not unique): minimum-norm adjoint"
        if sol.info.kink[0]:
            note += "; at a cone kink: one-sided rule"
        return g, xv.detach().numpy(), note

    return run


def _torch_variable(x: torch.Tensor, start: int, var: Any) -> torch.Tensor:
    """:func:`variable_value` in torch (differentiable), for one sample."""
    idx = variable_value(np.arange(x.shape[-1], dtype=float), start, var).astype(np.int64)
    return x[torch.from_numpy(idx)]


def _moreau(prob: Problem, start: int, var: Any) -> Callable[..., Any]:
    import moreau

    ipm = moreau.IPMSettings(tol_gap_abs=TIGHT, tol_gap_rel=TIGHT, tol_feas=TIGHT)

    def run(values, direction, weight):
        data = _raw_batch(prob, values, direction)
        solver, tensors = moreau_batch(data, ipm_settings=ipm)
        leaves = [t.clone().requires_grad_() for t in tensors]
        sol = solver.solve(*leaves)
        x = sol.x if hasattr(sol, "x") else sol[0]
        xv = _torch_variable(x[0], start, var)
        (xv * torch.tensor(weight)).sum().backward()
        g = sum(float((t.grad[0] * (t.detach()[1] - t.detach()[2]) / 2).sum()) for t in leaves)
        return g, xv.detach().numpy(), f"tolerance {TIGHT:g}"

    return run


def accuracy_rows(
    prob: Problem, *, seed: int = 0, methods: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """One row per method: ``x_err`` (the variable, against the reference), ``grad_rel_err``
    and the verdict, on sample 0 of ``prob`` (see the module doc); ``methods`` picks some of
    ``dxopt.conic``, ``dxopt.frontend``, ``cvxpylayers default``, ``cvxpylayers Clarabel``,
    ``Moreau`` (default all)."""
    from benchmarks.conic.peers import moreau_available

    rng = np.random.default_rng(seed + 17)
    values = [v[0].numpy().astype(float) for v in prob.values]
    direction = [rng.standard_normal(v.shape) for v in values]
    for par, d in zip(prob.parameters, direction):
        if par.attributes.get("symmetric"):
            d += d.T
    norm = np.sqrt(sum(float((d**2).sum()) for d in direction))
    scale = np.sqrt(sum(float((v**2).sum()) for v in values)) or 1.0
    direction = [d * (0.1 * scale / norm) for d in direction]  # steps relative to |theta|
    start, var = _variable_index(prob)
    weight = rng.standard_normal(var.size)

    def phi(solve: Callable[[ConeData], np.ndarray]) -> Callable[[float], float]:
        def at(t: float) -> float:
            x = solve(_data_at(prob, [v + t * d for v, d in zip(values, direction)]))
            return float(weight @ variable_value(x, start, var))

        return at

    x_ref = variable_value(_clarabel_x(_data_at(prob, values)), start, var)
    x_scs = _scs_variable(prob, values)
    floor = FLOOR * float(np.abs(weight * x_ref).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a DEGENERATE point's warning: the slope says kink
        slope = kink_aware_slope(phi(_dxopt_x), floor=floor)
    cross = kink_aware_slope(phi(_clarabel_x), floor=floor)
    builders: dict[str, Callable[[], Any]] = {
        "dxopt.conic": lambda: _dxopt_raw(prob, start, var),
        "dxopt.frontend": lambda: _dxopt_layer(prob),
        "cvxpylayers default": lambda: _cvxpylayers(prob, None),
        "cvxpylayers Clarabel": lambda: _cvxpylayers(prob, "Clarabel"),
    }
    why = moreau_available()
    builders["Moreau"] = (lambda: why) if why is not None else (lambda: _moreau(prob, start, var))
    runners: dict[str, Callable[..., Any] | str] = {}
    for label, build in builders.items():
        if methods is not None and label not in methods:
            continue
        try:
            runners[label] = build()
        except Exception as exc:  # a layer that refuses the problem is reported
            runners[label] = f"{type(exc).__name__}: {exc}"[:120]
    rows = []
    for label, fn in runners.items():
        row: dict[str, Any] = {"problem": prob.name, "method": label, "fd": slope.value,
                               "fd_err": slope.error, "fd_clarabel": cross.value}  # fmt: skip
        if isinstance(fn, str):
            rows.append({**row, "verdict": "-", "note": fn})
            continue
        try:
            g, x, settings = fn(values, direction, weight)
        except Exception as exc:  # a method that fails is reported with its error
            rows.append({**row, "verdict": "-", "note": f"{type(exc).__name__}: {exc}"[:120]})
            continue
        row.update(grad=g, x_err=float(np.abs(x - x_ref).max()), note=settings)
        if x_scs is not None:
            row["x_err_scs"] = float(np.abs(x - x_scs).max())
        if slope.value is None or slope.verdict != "smooth":
            row.update(
                verdict="no verdict", note=f"{settings}; finite differences: {slope.verdict}"
            )
        else:
            rel = abs(g - slope.value) / max(abs(slope.value), floor, 1e-300)
            row.update(grad_rel_err=rel, verdict="within" if rel <= TARGET else "outside")
        rows.append(row)
    return rows
