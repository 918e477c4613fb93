"""The runners of ``dxopt bench conic``: a raw Clarabel loop (forward only, the physical
reference), cvxpylayers (its default and its Clarabel option), Moreau's CPU backend where it is
installed, and :func:`run_dxopt` (``dxopt.conic.solve``, one batched call).

Each runner returns a callable that runs one forward (and, for the layers, the backward of
``L = sum(w * x)``) on the whole batch and returns the solution ``(batch, ...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from benchmarks.conic.problems import ConeData, Problem, cone_data


def clarabel_cones(d: ConeData) -> list[Any]:
    """The Clarabel cone list of one sample (CVXPY's order: zero, nonneg, soc, exp, power,
    psd)."""
    import clarabel

    cones: list[Any] = []
    if d.zero:
        cones.append(clarabel.ZeroConeT(d.zero))
    if d.nonneg:
        cones.append(clarabel.NonnegativeConeT(d.nonneg))
    cones += [clarabel.SecondOrderConeT(k) for k in d.soc]
    cones += [clarabel.ExponentialConeT() for _ in range(d.exp)]
    cones += [clarabel.PowerConeT(a) for a in d.power]
    cones += [clarabel.PSDTriangleConeT(k) for k in d.psd]
    return cones


def raw_clarabel(prob: Problem, *, tol: float = 1e-8) -> Callable[[], list[np.ndarray]]:
    """A Python loop of Clarabel solves on the raw cone data (built once, outside the timing)."""
    import clarabel

    data = cone_data(prob)
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = tol
    built = []
    for d in data:
        n = d.q.shape[0]
        P = sp.triu(d.P).tocsc() if d.P is not None else sp.csc_matrix((n, n))
        built.append((P, d.q, sp.csc_matrix(d.A), d.b, clarabel_cones(d)))

    def run() -> list[np.ndarray]:
        out = []
        for P, q, A, b, cones in built:
            sol = clarabel.DefaultSolver(P, q, A, b, cones, settings).solve()
            if str(sol.status) not in ("Solved", "SolverStatus.Solved"):
                raise RuntimeError(f"raw Clarabel: status {sol.status}")
            out.append(np.asarray(sol.x))
        return out

    return run


def _fwd_bwd(layer: Callable[..., Any], prob: Problem, weight: torch.Tensor) -> Callable[[], Any]:
    def run() -> Any:
        leaves = [v.clone().requires_grad_() for v in prob.values]
        (x,) = layer(*leaves)
        (weight * x).sum().backward()
        return x.detach(), [leaf.grad for leaf in leaves]

    return run


def cvxpylayers(prob: Problem, weight: torch.Tensor, *, solver: str | None) -> Callable[[], Any]:
    """cvxpylayers' ``CvxpyLayer`` (``solver=None``: its default, diffcp with SCS)."""
    from cvxpylayers.torch import CvxpyLayer

    layer = CvxpyLayer(prob.problem, parameters=prob.parameters, variables=[prob.variable])
    args = {} if solver is None else {"solve_method": solver}

    def call(*leaves: torch.Tensor) -> Any:
        return layer(*leaves, solver_args=args)

    return _fwd_bwd(call, prob, weight)


def moreau_available() -> str | None:
    """``None`` where ``moreau.torch`` imports, else the reason (for the table)."""
    try:
        import moreau.torch  # noqa: F401
    except Exception as exc:  # an absent or broken install is reported, not raised
        return f"moreau unavailable: {type(exc).__name__}: {exc}"
    return None


def dxopt_cones(d: ConeData) -> list[Any]:
    """The :mod:`dxopt.conic` cone list of one sample (CVXPY's row order, as Clarabel's)."""
    from dxopt import conic

    cones: list[Any] = []
    if d.zero:
        cones.append(conic.ZeroCone(d.zero))
    if d.nonneg:
        cones.append(conic.NonnegCone(d.nonneg))
    cones += [conic.SecondOrderCone(k) for k in d.soc]
    cones += [conic.ExpCone() for _ in range(d.exp)]
    cones += [conic.PowerCone(a) for a in d.power]
    cones += [conic.PSDCone(k) for k in d.psd]
    return cones


def dxopt_data(data: list[ConeData]) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor,
                                              torch.Tensor, list[Any]]:  # fmt: skip
    """The batch's dense ``(P, q, A, b)`` (``P`` symmetric, ``None`` for a linear objective)
    and the shared cone list; raises where the samples' cones differ."""
    d0 = data[0]
    n = d0.q.shape[0]
    cones = dxopt_cones(d0)
    for i, d in enumerate(data):
        if (d.zero, d.nonneg, d.soc, d.exp, d.power, d.psd) != (
            d0.zero, d0.nonneg, d0.soc, d0.exp, d0.power, d0.psd
        ):  # fmt: skip
            raise ValueError(f"run_dxopt: sample {i} has other cones than sample 0")
    P: torch.Tensor | None = None
    if any(d.P is not None and d.P.nnz for d in data):
        mats = []
        for d in data:
            if d.P is None:
                mats.append(np.zeros((n, n)))
                continue
            up = sp.triu(d.P)
            mats.append(np.asarray((up + sp.triu(d.P, 1).T).todense()))
        P = torch.tensor(np.stack(mats), dtype=torch.float64)
    q = torch.tensor(np.stack([d.q for d in data]), dtype=torch.float64)
    A = torch.tensor(np.stack([np.asarray(d.A.todense()) for d in data]), dtype=torch.float64)
    b = torch.tensor(np.stack([d.b for d in data]), dtype=torch.float64)
    return P, q, A, b, cones


def run_dxopt(problem: Problem, batch: int, *, tol: float = 1e-8) -> Callable[[], Any]:
    """``dxopt.conic.solve`` (one batched call) on the batch's raw cone data
    (``cone_data(problem)``, built outside the timing): forward and the backward of
    ``L = sum(w * x)`` with respect to ``P, q, A, b``, at the raw loop's tolerance."""
    from dxopt import conic

    data = cone_data(problem)
    if len(data) != batch:
        raise ValueError(f"run_dxopt: batch {batch} but the problem has {len(data)} samples")
    P, q, A, b, cones = dxopt_data(data)
    weight = torch.ones_like(q)

    def run() -> Any:
        leaves = [t.clone().requires_grad_() for t in (q, A, b)]
        P_leaf = P.clone().requires_grad_() if P is not None else None
        sol = conic.solve(P_leaf, *leaves, cones=cones, atol=tol, rtol=tol)
        (weight * sol.x).sum().backward()
        return sol.x.detach()

    return run


def moreau_batch(data: Sequence[Any], **settings: Any) -> tuple[Any, list[torch.Tensor]]:
    """Moreau's batched ``moreau.torch.Solver`` (CPU) for the raw cone data ``data`` (one
    :class:`~benchmarks.conic.problems.ConeData` per sample) on one shared sparsity pattern
    (the union over the batch, the diagonal of ``P`` always in it), and the values
    ``[P, A, q, b]`` (B, ...) it solves; ``settings`` go to ``moreau.Settings``."""
    import moreau
    from moreau.torch import Solver

    d0 = data[0]
    n, m = d0.q.shape[0], d0.b.shape[0]
    Ps = [np.asarray(d.P.todense()) if d.P is not None else np.zeros((n, n)) for d in data]
    As = [np.asarray(d.A.todense()) for d in data]
    p_mask = np.any([P != 0 for P in Ps], axis=0) | np.eye(n, dtype=bool)
    a_mask = np.any([A != 0 for A in As], axis=0)
    p_csr, a_csr = sp.csr_matrix(p_mask.astype(float)), sp.csr_matrix(a_mask.astype(float))
    p_rows, p_cols = np.nonzero(p_mask)
    a_rows, a_cols = np.nonzero(a_mask)
    f64 = torch.float64
    values = [
        torch.tensor(np.stack([P[p_rows, p_cols] for P in Ps]), dtype=f64),
        torch.tensor(np.stack([A[a_rows, a_cols] for A in As]), dtype=f64),
        torch.tensor(np.stack([d.q for d in data]), dtype=f64),
        torch.tensor(np.stack([d.b for d in data]), dtype=f64),
    ]
    cones = moreau.Cones(
        num_zero_cones=d0.zero,
        num_nonneg_cones=d0.nonneg,
        so_cone_dims=list(d0.soc),
        num_exp_cones=d0.exp,
        power_alphas=list(d0.power),
        psd_dims=list(d0.psd),
    )
    solver = Solver(
        n=n,
        m=m,
        P_row_offsets=torch.tensor(p_csr.indptr, dtype=torch.int64),
        P_col_indices=torch.tensor(p_csr.indices, dtype=torch.int64),
        A_row_offsets=torch.tensor(a_csr.indptr, dtype=torch.int64),
        A_col_indices=torch.tensor(a_csr.indices, dtype=torch.int64),
        cones=cones,
        settings=moreau.Settings(device="cpu", batch_size=len(data), enable_grad=True, **settings),
    )
    return solver, values


def moreau_solver(prob: Problem, *, tol: float = 1e-8) -> Callable[[], Any]:
    """Moreau's batched ``moreau.torch.Solver`` (CPU) on the raw cone data: forward and the
    backward of ``L = sum(w * x)`` with respect to the program's ``P, A, q, b`` values (one
    shared sparsity pattern, the union over the batch: :func:`moreau_batch`)."""
    del tol  # Moreau's IPM tolerances are left at their defaults
    data = cone_data(prob)
    solver, values = moreau_batch(data)
    n = data[0].q.shape[0]
    weight = torch.ones(len(data), n, dtype=torch.float64)

    def run() -> Any:
        leaves = [t.clone().requires_grad_() for t in values]
        sol = solver.solve(*leaves)
        x = sol.x if hasattr(sol, "x") else sol[0]
        (weight * x).sum().backward()
        return x.detach()

    return run
