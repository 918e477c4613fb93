"""Eliminate CVXPY's defined variables from the canonical QP (a presolve, in torch).

CVXPY's QP canonicalisation introduces variables defined by equalities: ``sum_squares(F @ x -
g)`` becomes :math:`\\tfrac12 t^\\top (2I) t` with :math:`t - Fx + g = 0`; a dynamics row
:math:`x_{k+1} - A x_k - B u_k = 0` defines the next state. The canonical QP then has a
singular :math:`P` (zero on the original variables), twice the variables and extra equality
rows, which makes the solve slower and its degenerate cases likelier. This module removes
them: with the equality rows split into the defining rows :math:`E` and the rest :math:`R`,
and the variables into the defined ones :math:`T` and the kept ones :math:`X`,

.. math:: A_{ET}\\, z_T + A_{EX}\\, z_X = b_E \\iff z_T = w_0 - W z_X,\\quad
    W = A_{ET}^{-1}A_{EX},\\ w_0 = A_{ET}^{-1} b_E,

so :math:`z = S z_X + s_0` with :math:`S = [I; -W]`, :math:`s_0 = [0; w_0]`, and the
reduced QP in :math:`z_X` has

.. math:: P' = S^\\top P S,\\ q' = S^\\top (P s_0 + q),\\ A' = A_R S,\\ b' = b_R - A_R s_0,
    \\ G' = G S,\\ h' = h - G s_0

(Nocedal & Wright, *Numerical Optimization*, 2nd ed., section 15.3, elimination of
variables). The multipliers of the defining rows follow from the stationarity in
:math:`z_T`: :math:`\\mu_E = -A_{ET}^{-\\top}(P_{T\\cdot} z + q_T + A_{RT}^\\top \\mu_R +
G_T^\\top \\nu)`. Everything is torch on the map's outputs, so gradients flow through the
reduction exactly (it is the same QP, written in fewer variables).

:func:`find_elimination` chooses the rows greedily so that :math:`A_{ET}` is lower triangular
with constant nonzero diagonal (invertible for every parameter value): row by row, a
variable without bounds whose coefficient there is a nonzero constant and that appears in no
row chosen before. CVXPY's own variables are preferred over the user's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from dxopt.qp.frontend._compile import CompiledQP

__all__ = [
    "FOLDED",
    "Elimination",
    "Folded",
    "find_elimination",
    "fold",
    "piece_rows",
    "recover",
    "reduce",
]


@dataclass(frozen=True)
class Elimination:
    """The split of the canonical QP (see the module docstring).

    Attributes:
        kept, gone: canonical variables kept (:math:`X`) and eliminated (:math:`T`).
        rows, rest: defining equality rows (:math:`E`, in the order of ``gone``) and the rest.
        inverse: :math:`A_{ET}^{-1}` when :math:`A_{ET}` is a constant (``None`` otherwise).
        identity: :math:`A_{ET} = I` (no solve at all).
        diagonal: the diagonal of :math:`A_{ET}^{-1}` when it is a constant diagonal matrix
            (CVXPY writes most defining rows as :math:`-t + \\ldots = 0`): rows are scaled.
        order: the inverse permutation of ``[kept, gone]`` (rebuilds :math:`z`).
    """

    kept: np.ndarray
    gone: np.ndarray
    rows: np.ndarray
    rest: np.ndarray
    inverse: np.ndarray | None
    identity: bool
    order: np.ndarray
    diagonal: np.ndarray | None = None


def _entries_of_a(compiled: CompiledQP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each entry of ``A`` (p x n): present?, constant?, its constant value."""
    c = compiled
    block = c.blocks["A"]
    matrix = c.matrix
    const_col = c.num_columns - 1
    counts = np.diff(matrix.indptr[block.start : block.stop + 1])
    present = (counts > 0).reshape(c.p, c.n)
    constant = np.zeros(c.p * c.n, dtype=bool)
    value = np.zeros(c.p * c.n)
    for k in np.flatnonzero(counts == 1):
        at = matrix.indptr[block.start + k]
        if matrix.indices[at] == const_col:
            constant[k], value[k] = True, matrix.data[at]
    return present, constant.reshape(c.p, c.n), value.reshape(c.p, c.n)


def find_elimination(compiled: CompiledQP, user_columns: np.ndarray) -> Elimination | None:
    """The defined variables of ``compiled`` (``None`` when there are none).

    Args:
        compiled: the compiled problem.
        user_columns: boolean ``(n,)``: columns of the user's variables (eliminated last).
    """
    c = compiled
    if c.p == 0 or "A" not in c.blocks:
        return None
    present, constant, value = _entries_of_a(c)
    free = np.ones(c.n, dtype=bool)
    if c.lb is not None:
        free &= ~np.isfinite(c.lb)
    if c.ub is not None:
        free &= ~np.isfinite(c.ub)
    scale = np.abs(value).max(initial=0.0)
    column_counts = present.sum(0)
    taken = np.zeros(c.n, dtype=bool)  # eliminated, or present in a chosen row
    rows, gone = [], []
    for r in range(c.p):
        ok = free & ~taken & constant[r] & (np.abs(value[r]) > 1e-12 * max(scale, 1.0))
        candidates = np.flatnonzero(ok)
        if candidates.size == 0:
            continue
        # CVXPY's variables first, then the sparsest column
        j = int(candidates[np.lexsort((column_counts[candidates], user_columns[candidates]))[0]])
        rows.append(r)
        gone.append(j)
        taken |= present[r]
    if not rows:
        return None
    rows_a, gone_a = np.array(rows), np.array(gone)
    kept = np.setdiff1d(np.arange(c.n), gone_a)
    rest = np.setdiff1d(np.arange(c.p), rows_a)
    block = present[np.ix_(rows_a, gone_a)]
    inverse, identity = None, False
    if constant[np.ix_(rows_a, gone_a)][block].all():
        a_et = np.where(constant[np.ix_(rows_a, gone_a)], value[np.ix_(rows_a, gone_a)], 0.0)
        identity = bool(np.array_equal(a_et, np.eye(len(rows))))
        inverse = np.linalg.inv(a_et)
    order = np.argsort(np.concatenate([kept, gone_a]))
    diagonal = None
    if (
        inverse is not None
        and not identity
        and np.count_nonzero(inverse - np.diag(np.diag(inverse))) == 0
    ):
        diagonal = np.diag(inverse).copy()
    return Elimination(kept, gone_a, rows_a, rest, inverse, identity, order, diagonal)


def piece_rows(
    compiled: CompiledQP, e: Elimination
) -> dict[str, tuple[np.ndarray, tuple[int, ...]]]:
    """The map rows (dense layout) and shapes of the blocks the reduction reads."""
    c = compiled
    n = c.n

    def mat(name: str, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
        start = c.blocks[name].start
        return (start + rows[:, None] * n + cols[None, :]).ravel(), (rows.size, cols.size)

    def vec(name: str, idx: np.ndarray) -> tuple[np.ndarray, tuple[int]]:
        return c.blocks[name].start + idx, (idx.size,)

    X, T, E, R = e.kept, e.gone, e.rows, e.rest
    pieces = {
        "P_XX": mat("P", X, X), "P_XT": mat("P", X, T), "P_TT": mat("P", T, T),
        "q_X": vec("q", X), "q_T": vec("q", T),
        "A_EX": mat("A", E, X), "A_ET": mat("A", E, T), "b_E": vec("b", E),
        "A_RX": mat("A", R, X), "A_RT": mat("A", R, T), "b_R": vec("b", R),
    }  # fmt: skip
    if "G" in c.blocks and c.m:
        rows_g = np.arange(c.m)
        pieces.update(G_X=mat("G", rows_g, X), G_T=mat("G", rows_g, T), h=vec("h", rows_g))
    return pieces


def _mm(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    return None if a is None or b is None else a @ b


def _mv(a: Tensor | None, v: Tensor | None) -> Tensor | None:
    return None if a is None or v is None else (a @ v.unsqueeze(-1)).squeeze(-1)


def _sub(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if b is None:
        return a
    return -b if a is None else a - b


def _ptt(x: dict[str, Tensor | None], v: Tensor | None, *, vector: bool) -> Tensor | None:
    """:math:`P_{TT} v` (a constant diagonal :math:`P_{TT}`, ``P_TT_diag``, scales rows)."""
    diag = x.get("P_TT_diag")
    if diag is not None and v is not None:
        return diag * v if vector else diag.unsqueeze(-1) * v
    return _mv(x["P_TT"], v) if vector else _mm(x["P_TT"], v)


@dataclass
class Reduction:
    """The per-call quantities that :func:`recover` needs."""

    W: Tensor
    w0: Tensor | None
    a_et: Tensor | None


def reduce(
    x: dict[str, Tensor | None], e: Elimination, inverse: Tensor | None, like: Tensor
) -> tuple[dict[str, Tensor | None], Reduction]:
    """The reduced data ``P, q, A, b, G, h`` from the pieces ``x`` (``None``: structurally
    zero; so may be the results) and what recovery needs. ``inverse``: :math:`A_{ET}^{-1}` as
    a tensor when constant (its diagonal when ``e.diagonal`` is set); ``like``: the
    parameters' dtype and device."""
    a_ex, b_e = x["A_EX"], x["b_E"]
    a_et = None
    if a_ex is None:  # the defining rows do not involve the kept variables: z_T = w0
        a_ex = torch.zeros(e.rows.size, e.kept.size, dtype=like.dtype, device=like.device)
    if e.identity:
        W, w0 = a_ex, b_e
    elif e.diagonal is not None and inverse is not None:
        W, w0 = inverse.unsqueeze(-1) * a_ex, None if b_e is None else inverse * b_e
    elif inverse is not None:
        W, w0 = inverse @ a_ex, _mv(inverse, b_e)
    else:
        a_et = x["A_ET"]
        assert a_et is not None
        rhs = a_ex if b_e is None else torch.cat([a_ex, b_e.unsqueeze(-1)], -1)
        sol = torch.linalg.solve_triangular(a_et, rhs, upper=False)
        W, w0 = (sol, None) if b_e is None else (sol[..., :-1], sol[..., -1])
    p_xt = x["P_XT"]
    pw = _mm(p_xt, W)
    ptt_w = _ptt(x, W, vector=False)
    P = _sub(x["P_XX"], None if pw is None else pw + pw.mT)
    if ptt_w is not None:
        quad = W.mT @ ptt_w
        P = quad if P is None else P + quad
    # q' = q_X + P_XT w0 - W^T (P_TT w0 + q_T)
    inner = x["q_T"]
    ptt_w0 = _ptt(x, w0, vector=True)
    if ptt_w0 is not None:
        inner = ptt_w0 if inner is None else inner + ptt_w0
    q = x["q_X"]
    pxt_w0 = _mv(p_xt, w0)
    if pxt_w0 is not None:
        q = pxt_w0 if q is None else q + pxt_w0
    q = _sub(q, _mv(W.mT, inner))
    data: dict[str, Tensor | None] = {"P": P, "q": q}
    data["A"] = _sub(x["A_RX"], _mm(x["A_RT"], W))
    data["b"] = _sub(x["b_R"], _mv(x["A_RT"], w0))
    if "h" in x:
        data["G"] = _sub(x["G_X"], _mm(x["G_T"], W))
        data["h"] = _sub(x["h"], _mv(x["G_T"], w0))
    return data, Reduction(W, w0, a_et)


def recover(
    z_kept: Tensor,
    eq_rest: Tensor | None,
    ineq: Tensor | None,
    x: dict[str, Tensor | None],
    red: Reduction,
    e: Elimination,
    inverse: Tensor | None,
    *,
    defining_duals: bool,
) -> tuple[Tensor, Tensor | None]:
    """The canonical ``z`` and the equality multipliers (rows in CVXPY's order; only with
    ``defining_duals``, else ``None``) from the reduced solution."""
    z_t = -_mv(red.W, z_kept)  # type: ignore[operator]
    if red.w0 is not None:
        z_t = z_t + red.w0
    order = torch.as_tensor(e.order, device=z_kept.device)
    z = torch.cat([z_kept, z_t.expand(*z_kept.shape[:-1], -1)], -1).index_select(-1, order)
    if not defining_duals:
        return z, None
    # r_T = P_TX z_X + P_TT z_T + q_T + A_RT^T mu_R + G_T^T nu ;  mu_E = -A_ET^{-T} r_T
    terms = [
        _mv(None if x["P_XT"] is None else x["P_XT"].mT, z_kept),
        _ptt(x, z_t, vector=True),
        x["q_T"],
        _mv(None if x["A_RT"] is None else x["A_RT"].mT, eq_rest),
        _mv(None if x.get("G_T") is None else x["G_T"].mT, ineq),  # type: ignore[union-attr]
    ]
    r_t = sum(t for t in terms if t is not None)
    assert isinstance(r_t, Tensor)
    if e.identity:
        mu_e = -r_t
    elif e.diagonal is not None and inverse is not None:
        mu_e = -inverse * r_t
    elif inverse is not None:
        mu_e = -_mv(inverse.mT, r_t)  # type: ignore[operator]
    else:
        assert red.a_et is not None
        mu_e = -torch.linalg.solve_triangular(red.a_et.mT, r_t.unsqueeze(-1), upper=True)[..., 0]
    batch = z.shape[:-1]
    mu_e = mu_e.expand(*batch, -1)
    parts = [mu_e] if eq_rest is None else [mu_e, eq_rest.expand(*batch, -1)]
    eq_order = torch.as_tensor(np.argsort(np.concatenate([e.rows, e.rest])), device=z.device)
    return z, torch.cat(parts, -1).index_select(-1, eq_order)


#: Pieces that must be constant for the reduction to be affine in the parameters.
_FOLD_CONSTANT = ("A_EX", "A_ET", "P_XT", "P_TT", "A_RT", "G_T")
#: What a folded map produces: the reduced data, then w0 and q_T for the recovery.
FOLDED = ("P", "q", "A", "b", "G", "h", "w0", "q_T")


@dataclass(frozen=True)
class Folded:
    """The reduction folded into the map (it is affine when ``_FOLD_CONSTANT`` are constant).

    Attributes:
        matrix: CSR: its rows are the entries of ``FOLDED`` (C order), ``data = matrix theta_1``.
        layout: each produced block's rows in ``matrix`` and its shape.
        constants: the constant pieces and ``W`` (float64), for the recovery.
    """

    matrix: sp.csr_array
    layout: dict[str, tuple[np.ndarray, tuple[int, ...]]]
    constants: dict[str, np.ndarray | None]


def fold(
    matrix: sp.csr_array,
    layout: dict[str, tuple[np.ndarray, tuple[int, ...]]],
    constant: dict[str, bool],
    e: Elimination,
    *,
    chunk: int = 256,
) -> Folded | None:
    """Fold the reduction into the map when it is affine (``None`` otherwise): the reduced
    data at :math:`\\theta = 0` and at each unit vector, column block by column block (a dense
    temporary of ``chunk`` columns at a time), keeping exact nonzeros only."""
    from dxopt.qp.frontend._affine import SparseLinear, apply_linear

    if not all(constant.get(name, True) for name in _FOLD_CONSTANT):
        return None
    names = list(layout)
    rows = np.concatenate([layout[k][0] for k in names])
    linear = SparseLinear(matrix[rows])
    columns = int(matrix.shape[1])
    inverse = None
    if e.inverse is not None and not e.identity:
        inverse = torch.from_numpy(e.inverse if e.diagonal is None else e.diagonal)
    like = torch.zeros((), dtype=torch.float64)

    def evaluate(
        theta: Tensor,
    ) -> tuple[Tensor, dict[str, tuple[int, ...]], dict[str, Tensor | None]]:
        flat = apply_linear(theta, linear)
        pieces: dict[str, Tensor | None] = {}
        at = 0
        for k in names:
            size = layout[k][0].size
            pieces[k] = flat[:, at : at + size].reshape(-1, *layout[k][1]) if size else None
            at += size
        data, red = reduce(pieces, e, inverse, like)
        produced = {**data, "w0": red.w0, "q_T": pieces.get("q_T")}
        nx, nt, nr = e.kept.size, e.gone.size, e.rest.size
        shapes = {"P": (nx, nx), "q": (nx,), "A": (nr, nx), "b": (nr,), "w0": (nt,), "q_T": (nt,)}
        if "h" in pieces:
            m = layout["h"][1][0]
            shapes.update(G=(m, e.kept.size), h=(m,))
        blocks = []
        batch = theta.shape[0]
        for k in FOLDED:
            if k not in shapes:
                continue
            size = int(np.prod(shapes[k]))
            value = produced.get(k)
            if value is None:
                blocks.append(theta.new_zeros(batch, size))
            else:
                blocks.append(value.expand(batch, *shapes[k]).reshape(batch, size))
        return torch.cat(blocks, 1), shapes, pieces

    base_theta = torch.zeros(1, columns, dtype=torch.float64)
    base_theta[0, -1] = 1.0
    base, shapes, base_pieces = evaluate(base_theta)
    coo_rows: list[np.ndarray] = []
    coo_cols: list[np.ndarray] = []
    coo_vals: list[np.ndarray] = []
    nz = np.flatnonzero(base[0].numpy())
    coo_rows.append(nz)
    coo_cols.append(np.full(nz.size, columns - 1))
    coo_vals.append(base[0].numpy()[nz])
    for start in range(0, columns - 1, chunk):
        stop = min(start + chunk, columns - 1)
        theta = torch.zeros(stop - start, columns, dtype=torch.float64)
        theta[:, -1] = 1.0
        theta[torch.arange(stop - start), torch.arange(start, stop)] = 1.0
        block = (evaluate(theta)[0] - base).numpy()
        r, c = np.nonzero(block.T)
        coo_rows.append(r)
        coo_cols.append(c + start)
        coo_vals.append(block.T[r, c])
    total = int(base.shape[1])
    folded = sp.csr_array(
        (np.concatenate(coo_vals), (np.concatenate(coo_rows), np.concatenate(coo_cols))),
        shape=(total, columns),
    )
    out_layout: dict[str, tuple[np.ndarray, tuple[int, ...]]] = {}
    at = 0
    for k in FOLDED:
        if k in shapes:
            size = int(np.prod(shapes[k]))
            out_layout[k] = (np.arange(at, at + size), shapes[k])
            at += size
    consts: dict[str, np.ndarray | None] = {}
    for k in ("P_XT", "P_TT", "A_RT", "G_T", "A_ET"):
        value = base_pieces.get(k)
        consts[k] = None if value is None else value[0].numpy().copy()
    a_ex = base_pieces.get("A_EX")
    W = np.zeros((e.gone.size, e.kept.size)) if a_ex is None else a_ex[0].numpy()
    assert e.inverse is not None  # A_ET is constant here
    consts["W"] = W if e.identity else e.inverse @ W
    return Folded(folded, out_layout, consts)
