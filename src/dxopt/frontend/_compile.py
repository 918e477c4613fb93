"""Compile a DPP (or DGP) CVXPY problem into an affine map from parameters to cone-program data.

CVXPY's own reduction chain for Clarabel (:meth:`cvxpy.Problem.get_problem_data` with
``solver=cp.CLARABEL``, ``gp=True`` for log-log convex problems) returns a ``ParamConeProg``
whose data are affine in the parameter vector :math:`\\theta_1 = [\\theta; 1]` (DPP; Agrawal
et al., "Differentiable Convex Optimization Layers", NeurIPS 2019, section 4):

.. math:: \\operatorname{vec}_F(P) = T_P\\theta_1,\\quad [q; d] = T_q\\theta_1,\\quad
    \\operatorname{vec}_F([C \\mid c]) = T_C\\theta_1,

with the constraints :math:`Cz + c \\in K` in Clarabel's row order (zero, nonnegative,
second-order, PSD in the scaled upper-triangle ``svec``, exponential, power). In the form of
:func:`dxopt.conic.solve` (:math:`Az + s = b`, :math:`s \\in K`) that is :math:`A = -C`,
:math:`b = c`, so :math:`s = Cz + c` and the dual :math:`y \\in K^*` is CVXPY's
(``constraint.dual_value`` for zero and nonnegative rows).

:func:`compile_conic` rewrites the three tensors into ONE CSR matrix :math:`M` whose rows are
the nonzero entries of ``P`` (C order), ``q``, ``A`` (C order) and ``b`` (``rows`` says
where each sits) and whose columns are the user parameters flattened in C order, then a
constant column: one call is ``data[rows] = M theta_1``. The build is sparse throughout
(its cost is that of CVXPY's canonicalisation plus ``O(nnz)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from dxopt.conic import (
    Cone,
    ExpCone,
    NonnegCone,
    PowerCone,
    PSDCone,
    SecondOrderCone,
    ZeroCone,
)
from dxopt.frontend._duals import dual_layout, fortran_index
from dxopt.qp.frontend._compile import (
    check_lists,
    check_parameters,
    coo_entries,
    import_cvxpy,
    param_columns,
)

__all__ = ["CompiledConic", "ConicOutput", "check_problem", "compile_conic"]

_HINT = "See https://www.cvxpy.org/tutorial/dcp/ (or /dgp/ with gp=True)."


@dataclass(frozen=True)
class ConicOutput:
    """A requested output: canonical ``x`` columns or dual ``y`` rows ``[start, stop)``,
    gathered as ``vec[..., index] * scale`` (``index`` of the output's ``shape``); a
    constraint with several dual variables (``cp.SOC``, ``cp.ExpCone``) has one ``part`` per
    dual variable and comes back as a tuple (CVXPY's ``dual_value`` list)."""

    kind: str  # "x" or "y"
    start: int
    stop: int
    shape: tuple[int, ...]
    name: str
    index: Any = None  # int64 array of ``shape``: positions in x or y
    scale: Any = None  # float array of ``shape`` or None (factor 1)
    parts: tuple[ConicOutput, ...] = ()


@dataclass(frozen=True)
class CompiledConic:
    """The affine map and the layout of the cone program it feeds."""

    matrix: Any  # scipy CSR (len(rows), columns + 1)
    rows: Any  # int64: the flat (P, q, A, b) position of each row of ``matrix``
    total: int  # n*n + n + m*n + m
    n: int
    m: int
    cones: tuple[Cone, ...]
    has_P: bool
    block_params: dict[str, frozenset[int]]  # "P"/"q"/"A"/"b" -> indices of parameters used
    param_shapes: tuple[tuple[int, ...], ...]
    param_names: tuple[str, ...]
    outputs: tuple[ConicOutput, ...]
    gp: bool


def _expr_name(expr: Any) -> str:
    text = str(expr)
    return text if len(text) < 120 else text[:117] + "..."


def _first_offender(items: Any, test: str) -> str:
    """The first constraint (or objective) that fails ``test`` (``is_dcp``, ``is_dpp``, ...)."""
    for where, expr in items:
        if not getattr(expr, test)():
            return f"{where} {_expr_name(expr)}"
    return "the problem"


def check_problem(cp: Any, problem: Any, parameters: Any, variables: Any, gp: bool) -> None:
    """Refuse what the front end cannot take, naming the argument and the offending part."""
    if not isinstance(problem, cp.Problem):
        raise TypeError(f"problem: expected a cvxpy.Problem, got {type(problem).__name__}.")
    if not isinstance(gp, bool):
        raise TypeError(f"gp: expected True or False, got {gp!r}.")
    check_lists(parameters, variables)
    parts = [("objective", problem.objective)] + [("constraint", c) for c in problem.constraints]
    if gp:
        if not problem.is_dgp():
            raise ValueError(
                "problem: expected a log-log convex (DGP) problem with gp=True, got one that is "
                f"not DGP: {_first_offender(parts, 'is_dgp')}. {_HINT}"
            )
        dpp = problem.is_dgp(dpp=True)
    else:
        if not problem.is_dcp():
            extra = " (it is DGP: pass gp=True)" if problem.is_dgp() else ""
            raise ValueError(
                "problem: expected a DCP problem, got one that is not DCP: "
                f"{_first_offender(parts, 'is_dcp')}{extra}. {_HINT}"
            )
        dpp = problem.is_dpp()
    if not dpp:
        offender = "the problem"
        for where, expr in parts:
            sub = cp.Problem(cp.Minimize(0), [expr]) if where == "constraint" else None
            ok = (
                (sub.is_dgp(dpp=True) if gp else sub.is_dpp())
                if sub is not None
                else (cp.Problem(expr).is_dgp(dpp=True) if gp else cp.Problem(expr).is_dpp())
            )
            if not ok:
                offender = f"{where} {_expr_name(expr)}"
                break
        raise ValueError(
            "problem: expected a DPP-compliant problem (parameters enter affinely), got one that "
            f"is not DPP: {offender}. See https://www.cvxpy.org/tutorial/dpp/ and rewrite it, "
            "e.g. with an auxiliary parameter for a product of parameters."
        )
    if any(v.attributes["boolean"] or v.attributes["integer"] for v in problem.variables()):
        raise ValueError("problem: expected continuous variables, got boolean/integer ones.")
    check_parameters(cp, problem, parameters)


def _cones(dims: Any) -> tuple[Cone, ...]:
    cones: list[Cone] = []
    if dims.zero:
        cones.append(ZeroCone(int(dims.zero)))
    if dims.nonneg:
        cones.append(NonnegCone(int(dims.nonneg)))
    cones += [SecondOrderCone(int(k)) for k in dims.soc]
    cones += [PSDCone(int(k)) for k in dims.psd]
    cones += [ExpCone() for _ in range(int(dims.exp))]
    cones += [PowerCone(float(a)) for a in dims.p3d]
    if len(dims.pnd):
        raise ValueError(
            "problem: it has an n-dimensional power cone (cp.PowConeND), which dxopt.conic does "
            "not take; write it with 3-dimensional power cones."
        )
    return tuple(cones)


def _rows(cone_name: str, c: Any) -> int:
    """Rows of a canonical constraint: ``c.size`` (for ``SvecPSD`` its triangle; its argument
    is the svec vector, not the matrix)."""
    del cone_name
    return int(c.size)


def _output(cp: Any, problem: Any, pp: Any, chain: Any, item: Any, gp: bool) -> ConicOutput:
    if isinstance(item, cp.Variable) and item.id in {v.id for v in problem.variables()}:
        symmetric = bool(item.attributes.get("symmetric") or item.attributes.get("PSD"))
        if any(item.attributes.get(a) for a in ("NSD", "diag", "hermitian")):
            raise ValueError(
                f"variables: {item.name()} is a structured (NSD/diag/hermitian) variable, which "
                "CVXPY stores in a reduced form; declare a plain cp.Variable((k, k)) and "
                "constrain it."
            )
        ids = chain.compose_var_id_map().get(item.id, [item.id])
        if len(ids) != 1 or ids[0] not in pp.var_id_to_col:
            raise ValueError(f"variables: {item.name()} has no single canonical column block.")
        start = int(pp.var_id_to_col[ids[0]])
        shape = tuple(item.shape)
        if symmetric:  # CVXPY's reduced form: the upper triangle, row by row
            k = shape[0]
            rows, cols = np.triu_indices(k)
            index = np.empty((k, k), dtype=np.int64)
            index[rows, cols] = index[cols, rows] = start + np.arange(rows.size)
            return ConicOutput("x", start, start + rows.size, shape, item.name(), index)
        index = fortran_index(start, shape)
        return ConicOutput("x", start, start + item.size, shape, item.name(), index)
    constraint, part = None, None
    for c in problem.constraints:
        if item is c:
            constraint = c
            break
        for j, d in enumerate(c.dual_variables):
            if item is d:
                constraint, part = c, j
                break
        if constraint is not None:
            break
    if constraint is None:
        raise ValueError(
            "variables: expected variables of the problem, constraints of the problem or their "
            f"dual variables (constraint.dual_variables[0]), got {item!r}."
        )
    if gp:
        raise ValueError(
            f"variables: constraint duals are not available with gp=True (asked for {constraint})."
        )
    canon_id = chain.compose_constr_id_map().get(constraint.id, constraint.id)
    row = 0
    for c in pp.constraints:
        kind = type(c).__name__
        size = _rows(kind, c)
        if c.id == canon_id:
            layout = dual_layout(constraint, kind, row, size)
            if layout is None:
                raise ValueError(
                    f"variables: the dual of {constraint} (a {kind} cone in the canonical "
                    "program) is not available; duals are returned for equality, inequality, "
                    "cp.SOC, cp.ExpCone, cp.PowCone3D and PSD (>>) constraints."
                )
            name = str(constraint)
            outs = tuple(
                ConicOutput("y", row, row + size, tuple(p.index.shape), name, p.index, p.scale)
                for p in layout
            )
            if part is not None:
                return outs[part]
            if len(outs) == 1:
                return outs[0]
            return ConicOutput("y", row, row + size, (), name, parts=outs)
        row += size
    raise ValueError(
        f"variables: the constraint {constraint} has no rows in the canonical program (CVXPY "
        "turned it into a bound or dropped it); ask for another output."
    )


def compile_conic(problem: Any, parameters: Any, variables: Any, *, gp: bool) -> CompiledConic:
    """Compile ``problem`` (DPP, or DGP with ``gp=True``) for the parameter order and outputs.

    Raises:
        ImportError: cvxpy is not installed.
        TypeError, ValueError: as :func:`check_problem`, cones dxopt does not take, outputs that
            are neither variables nor (equality/inequality) constraints of the problem.
    """
    cp = import_cvxpy()
    check_problem(cp, problem, parameters, variables, gp)
    from cvxpy.error import SolverError

    try:
        data, chain, _ = problem.get_problem_data(solver=cp.CLARABEL, gp=gp)
    except SolverError as error:
        raise ValueError(
            f"problem: CVXPY could not reduce it to a cone program ({error})."
        ) from error
    pp = data[cp.settings.PARAM_PROB]
    dims = data["dims"]
    n = int(pp.x.size)
    m = int(data["A"].shape[0])
    cones = _cones(dims)
    cols, _, sizes = param_columns(parameters, pp, chain)
    num_columns = int(cols[-1]) + 1
    for key in ("lower_bounds", "upper_bounds"):
        bound = data.get(key)
        if bound is not None and np.isfinite(np.asarray(bound, dtype=float)).any():
            raise ValueError(  # pragma: no cover - Clarabel's data keep no bounds today
                f"problem: CVXPY kept variable {key} in the canonical data; not supported."
            )
    starts = {"P": 0, "q": n * n, "A": n * n + n, "b": n * n + n + m * n}
    total = starts["b"] + m
    rows_out: list[np.ndarray] = []
    cols_out: list[np.ndarray] = []
    vals_out: list[np.ndarray] = []

    def emit(rows: np.ndarray, ks: np.ndarray, vals: np.ndarray) -> None:
        keep = cols[ks] >= 0
        rows_out.append(rows[keep])
        cols_out.append(cols[ks][keep])
        vals_out.append(vals[keep])

    has_P = pp.P is not None
    if has_P:
        r, k, v = coo_entries(pp.P)
        emit(starts["P"] + (r % n) * n + r // n, k, v)
    r, k, v = coo_entries(pp.q)
    keep = r < n  # row n: the objective's constant
    emit(starts["q"] + r[keep], k[keep], v[keep])
    if m:
        r, k, v = coo_entries(pp.A)
        i, j = r % m, r // m
        offset = j == n
        emit(starts["A"] + i[~offset] * n + j[~offset], k[~offset], -v[~offset])  # A = -C
        emit(starts["b"] + i[offset], k[offset], v[offset])  # b = c
    rows_all = np.concatenate(rows_out)
    # only the entries that a parameter or a constant sets get a row of M (O(nnz), never
    # O(n * m)); ``rows`` says where each sits in the flat (P, q, A, b) vector
    rows, compact = np.unique(rows_all, return_inverse=True)
    matrix = sp.csr_array(
        (np.concatenate(vals_out), (compact, np.concatenate(cols_out))),
        shape=(rows.size, num_columns),
    )
    matrix.sum_duplicates()
    owner = np.repeat(np.arange(len(parameters)), sizes)
    coo = matrix.tocoo()
    flat_rows, used_cols = rows[coo.row], coo.col
    block_params: dict[str, frozenset[int]] = {}
    for name, (lo, hi) in {
        "P": (0, n * n),
        "q": (starts["q"], starts["A"]),
        "A": (starts["A"], starts["b"]),
        "b": (starts["b"], total),
    }.items():
        inside = (flat_rows >= lo) & (flat_rows < hi) & (used_cols < num_columns - 1)
        block_params[name] = frozenset(owner[np.unique(used_cols[inside])].tolist())
    return CompiledConic(
        matrix=matrix,
        rows=rows,
        total=total,
        n=n,
        m=m,
        cones=cones,
        has_P=has_P,
        block_params=block_params,
        param_shapes=tuple(tuple(p.shape) for p in parameters),
        param_names=tuple(p.name() for p in parameters),
        outputs=tuple(_output(cp, problem, pp, chain, v, gp) for v in variables),
        gp=gp,
    )
