"""Compile a DPP-compliant CVXPY problem into an affine map from parameters to QP data.

CVXPY's own canonicalisation does the work: :meth:`cvxpy.Problem.get_problem_data` for a QP
solver (DAQP, a dxopt dependency; PIQP, OSQP or ProxQP if DAQP is missing) returns a
``ParamConeProg`` whose data are affine in the parameter vector :math:`\\theta` (DPP,
Agrawal et al., "Differentiable Convex Optimization Layers", NeurIPS 2019, section 4):

.. math:: \\operatorname{vec}_F(P) = T_P\\,\\theta_1,\\quad [q; d] = T_q\\,\\theta_1,\\quad
    \\operatorname{vec}_F([C \\mid c]) = T_C\\,\\theta_1,\\qquad \\theta_1 = [\\theta; 1],

with the canonical problem :math:`\\min \\tfrac12 z^\\top P z + q^\\top z + d` subject to
:math:`C_E z + c_E = 0` (its ``Zero`` cones, first) and :math:`C_I z + c_I \\ge 0` (its
``NonNeg`` cones), and variable bounds :math:`lb \\le z \\le ub` where the canonical form
keeps them. In dxopt's form (:func:`dxopt.qp.solve`) that is

.. math:: A = C_E,\\ b = -c_E,\\qquad G = -C_I,\\ h = c_I,

so the multipliers of the ``Zero`` and ``NonNeg`` rows are dxopt's ``eq_duals`` and
``ineq_duals`` with CVXPY's signs (``constraint.dual_value``): the Lagrangian of both is
:math:`f + \\mu^\\top(Ax - b) + \\nu^\\top(Gx - h)`.

:func:`compile_problem` rewrites the three tensors (one sparse matrix each) into one CSR
matrix :math:`M` whose rows are the entries of the dxopt blocks and whose columns are the user
parameters flattened in C order (torch's ``reshape``), then a constant column, so one call is
``data = M theta_1`` (:mod:`dxopt.qp.frontend._affine`): no reordering, no Fortran reshape,
no dense blow-up of :math:`M`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = [
    "Block",
    "CompiledQP",
    "Output",
    "check_lists",
    "check_parameters",
    "compile_problem",
    "coo_entries",
    "import_cvxpy",
    "param_columns",
]

#: QP solvers whose cvxpy data are (P, q, A, b, F, g) with variable bounds; the first installed
#: one canonicalises (only its data are used, never its solve).
CANON_SOLVERS = ("DAQP", "PIQP", "OSQP", "PROXQP")

_HINT = (
    "dxopt.qp.CvxpyQPLayer takes quadratic programs only (quadratic or affine objective, "
    "affine equality and inequality constraints, variable bounds). For cones (SOC, "
    "exponential, power, PSD) use dxopt.frontend.CvxpyLayer (same arguments), which sends "
    "them to dxopt.conic."
)


def _not_dcp_parts(problem: Any) -> str:
    """The objective and constraints of ``problem`` that are not DCP, for the refusal."""
    parts = [] if problem.objective.is_dcp() else [f"the objective {problem.objective}"]
    parts += [f"constraint {i} ({c})" for i, c in enumerate(problem.constraints) if not c.is_dcp()]
    return ", ".join(parts) if parts else "the problem as a whole"


def _atom_name(atom: Any) -> str:
    """An atom's name as a user writes it (``norm2`` for ``cp.norm(x)``, ``entr``, ...)."""
    p = getattr(atom, "p", None)
    if "norm" in type(atom).__name__.lower() and p is not None:
        return f"norm{float(p):g}"
    return type(atom).__name__


def _offender(expr: Any, fits: str) -> Any:
    """The innermost atom of ``expr`` that is not ``fits`` (``"is_qpwa"``, ``"is_pwl"``) while
    all its arguments are, or ``None``."""
    if getattr(expr, fits)():
        return None
    for arg in getattr(expr, "args", []):
        inner = _offender(arg, fits)
        if inner is not None:
            return inner
    return expr


def not_qp_parts(cp: Any, problem: Any) -> str:
    """What keeps a DCP ``problem`` from being a QP: the atoms and cone constraints, each with
    where it is (``"norm2 in constraint 0"``), for the refusal."""
    parts = []
    atom = _offender(problem.objective.args[0], "is_qpwa")
    if atom is not None:
        parts.append(f"{_atom_name(atom)} in the objective")
    plain = (cp.Zero, cp.NonNeg, cp.NonPos, cp.constraints.Equality, cp.constraints.Inequality)
    for i, c in enumerate(problem.constraints):
        if not isinstance(c, plain):
            parts.append(f"a {type(c).__name__} cone in constraint {i}")
            continue
        for arg in c.args:
            atom = _offender(arg, "is_pwl")
            if atom is not None:
                parts.append(f"{_atom_name(atom)} in constraint {i}")
                break
    return ", ".join(parts) if parts else "the problem as a whole"


def import_cvxpy() -> Any:
    """cvxpy, or an ImportError that says how to install it (it is an optional extra)."""
    try:
        import cvxpy
    except ImportError as error:  # pragma: no cover - exercised in an environment without cvxpy
        raise ImportError(
            "dxopt.qp.CvxpyQPLayer / dxopt.qp.from_cvxpy need cvxpy: pip install 'dxopt[cvxpy]' "
            "(or pip install 'cvxpy>=1.5')."
        ) from error
    return cvxpy


@dataclass(frozen=True)
class Block:
    """One block of the dxopt data (``P``, ``q``, ``A``, ``b``, ``G``, ``h``, ``lb``, ``ub``).

    Attributes:
        name: the block's name.
        shape: its dense shape.
        start, stop: its rows in the map (dense layout: C-order entries of ``shape``).
        params: indices of the user parameters it depends on (not the constant column).
    """

    name: str
    shape: tuple[int, ...]
    start: int
    stop: int
    params: frozenset[int]


@dataclass(frozen=True)
class Output:
    """One requested output: a primal variable or the multiplier of a constraint.

    Attributes:
        kind: ``"x"`` (canonical variable), ``"eq"`` or ``"ineq"`` (rows of ``A`` / ``G``).
        start, stop: its entries in that vector.
        shape: the user's shape (entries are in Fortran order, as in CVXPY).
    """

    kind: str
    start: int
    stop: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CompiledQP:
    """The compiled problem: the affine map and where everything lives.

    Attributes:
        matrix: CSR ``(rows, num_columns)``: ``data = matrix @ [theta; 1]``.
        blocks: the dxopt blocks present, by name, in the row order of ``matrix``.
        n, p, m: canonical variables, equality rows, inequality rows.
        param_shapes: the user parameters' shapes, in the user's order.
        param_offsets: each parameter's first column (C-order flattening).
        param_names: the parameters' names, for messages.
        outputs: the requested variables and multipliers, in the user's order.
        lb, ub: constant bounds of the canonical variable (``None`` where there are none).
        user_columns: boolean ``(n,)``: the canonical columns of the problem's own variables
            (the others are CVXPY's).
    """

    matrix: sp.csr_array
    blocks: dict[str, Block]
    n: int
    p: int
    m: int
    param_shapes: tuple[tuple[int, ...], ...]
    param_offsets: tuple[int, ...]
    param_names: tuple[str, ...]
    outputs: tuple[Output, ...]
    lb: np.ndarray | None
    ub: np.ndarray | None
    user_columns: np.ndarray

    @property
    def num_columns(self) -> int:
        return int(self.matrix.shape[1])


def _fortran_to_c(shape: tuple[int, ...]) -> np.ndarray:
    """``out[f]`` = the C-order index of the entry whose Fortran-order index is ``f``."""
    size = int(np.prod(shape)) if shape else 1
    return np.arange(size).reshape(shape if shape else ()).flatten(order="F")


def _check_problem(cp: Any, problem: Any, parameters: Any, variables: Any) -> None:
    if not isinstance(problem, cp.Problem):
        raise TypeError(f"problem: expected a cvxpy.Problem, got {type(problem).__name__}.")
    check_lists(parameters, variables)
    if not problem.is_dcp():
        raise ValueError(
            f"problem: expected a DCP problem, got one that is not DCP: {_not_dcp_parts(problem)}. "
            "No convex layer can differentiate it (cvxpylayers cannot either); rewrite it with "
            "DCP atoms (cvxpy's DCP rules: https://www.cvxpy.org/tutorial/dcp/)."
        )
    if any(v.attributes["boolean"] or v.attributes["integer"] for v in problem.variables()):
        raise ValueError("problem: expected continuous variables, got boolean/integer ones.")
    if not problem.is_qp():
        raise ValueError(
            "problem: expected a quadratic program, got one with cones: "
            f"{not_qp_parts(cp, problem)}. {_HINT}"
        )
    if not problem.is_dpp(quad_form_dpp="qp"):
        raise ValueError(
            "problem: expected a DPP-compliant problem (parameters enter affinely, e.g. "
            "A @ x with a parameter A, but not A @ A.T @ x or quad_form(x, P) in a "
            "constraint), got one that is not DPP: see https://www.cvxpy.org/tutorial/dpp/ and "
            "rewrite it, e.g. 0.5 * cp.sum_squares(L @ x) with a parameter factor L, or "
            "cp.quad_form(x, P) with a parameter P in the objective."
        )
    check_parameters(cp, problem, parameters)


def check_lists(parameters: Any, variables: Any) -> None:
    """Require ``parameters`` and ``variables`` to be lists or tuples, ``variables`` non-empty."""
    for arg_name, value in (("parameters", parameters), ("variables", variables)):
        if not isinstance(value, (list, tuple)):
            raise TypeError(
                f"{arg_name}: expected a list or tuple, got {type(value).__name__}. Pass e.g. "
                f"{arg_name}=[{'A, b' if arg_name == 'parameters' else 'x'}]."
            )
    if len(variables) == 0:
        raise ValueError("variables: expected at least one variable or constraint, got none.")


def check_parameters(cp: Any, problem: Any, parameters: Any) -> None:
    """Require ``parameters`` to list each of ``problem``'s parameters exactly once (any
    order), as both CVXPY front ends take them."""
    declared = set(problem.parameters())
    given = list(parameters)
    if not all(isinstance(p, cp.Parameter) for p in given) or set(given) != declared:
        raise ValueError(
            f"parameters: expected exactly the problem's parameters ({len(declared)}: "
            f"{sorted(p.name() for p in declared)}) in any order, got "
            f"{[getattr(p, 'name', lambda p=p: type(p).__name__)() for p in given]}."
        )
    if len(set(given)) != len(given):
        raise ValueError("parameters: a parameter is listed twice.")


def _canonicalise(cp: Any, problem: Any) -> tuple[Any, Any]:
    from cvxpy.error import SolverError
    from cvxpy.utilities import scopes

    installed = set(cp.installed_solvers())
    solver = next((s for s in CANON_SOLVERS if s in installed), None)
    if solver is None:  # pragma: no cover - daqp is a dxopt dependency
        raise ImportError(f"cvxpy sees none of the QP solvers {CANON_SOLVERS}: pip install daqp.")
    try:
        with scopes.quad_form_dpp_scope():
            data, chain, _ = problem.get_problem_data(solver=solver)
    except SolverError as error:
        raise ValueError(
            f"problem: CVXPY could not reduce it to a QP ({error}). {_HINT}"
        ) from error
    return data[cp.settings.PARAM_PROB], chain


def param_columns(
    parameters: Any, param_prob: Any, chain: Any
) -> tuple[np.ndarray, list[int], list[int]]:
    """``cols[k]``: the map column of cvxpy column ``k`` (-1: unused), offsets and sizes."""
    param_id_map = {k: v[0] for k, v in chain.compose_param_id_map().items()}
    total = param_prob.total_param_size
    cols = np.full(total + 1, -1, dtype=np.int64)
    offsets, sizes = [], []
    offset = 0
    for p in parameters:
        shape = tuple(p.shape)
        size = int(np.prod(shape)) if shape else 1
        offsets.append(offset)
        sizes.append(size)
        canon_id = param_id_map.get(p.id, p.id)
        if canon_id in param_prob.param_id_to_col:
            start = param_prob.param_id_to_col[canon_id]
            canon_size = param_prob.param_id_to_size[canon_id]
            if canon_size == size:
                cols[start : start + size] = offset + _fortran_to_c(shape)
            elif any(p.attributes.get(a) for a in ("symmetric", "PSD", "NSD")):
                # lowered to the upper triangle (np.triu_indices order), as cvxpylayers reads it
                rows, cs = np.triu_indices(shape[-1])
                cols[start : start + canon_size] = offset + rows * shape[-1] + cs
            else:
                raise ValueError(
                    f"parameters: {p.name()} has an attribute (diag, sparsity, ...) that CVXPY "
                    "lowers to a reduced vector; declare it without that attribute."
                )
        offset += size
    cols[total] = offset  # the constant column
    return cols, offsets, sizes


def coo_entries(tensor: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, cols, values)`` of a sparse or dense matrix ``tensor``, duplicates summed
    (int64, int64, float64)."""
    coo = sp.coo_array(tensor)
    coo.sum_duplicates()
    return coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data.astype(np.float64)


def compile_problem(problem: Any, parameters: Any, variables: Any) -> CompiledQP:
    """Compile ``problem`` (DPP, a QP) for the given parameter order and requested outputs.

    Raises:
        ImportError: cvxpy is not installed.
        TypeError, ValueError: not a problem / lists, not DCP, not a QP, not DPP, parameters
            that do not match the problem's, outputs that are neither variables nor
            constraints of the problem.
    """
    cp = import_cvxpy()
    _check_problem(cp, problem, parameters, variables)
    pp, chain = _canonicalise(cp, problem)
    n = int(pp.x.size)
    cols, offsets, sizes = param_columns(parameters, pp, chain)
    num_columns = int(cols[-1]) + 1
    p = int(pp.cone_dims.zero)
    m = int(pp.cone_dims.nonneg)

    # each cvxpy entry (row r, column k, value v) -> (block row, map column, signed value)
    rows_out: list[np.ndarray] = []
    cols_out: list[np.ndarray] = []
    vals_out: list[np.ndarray] = []
    layout = {"P": (n, n), "q": (n,), "A": (p, n), "b": (p,), "G": (m, n), "h": (m,)}
    starts: dict[str, int] = {}
    at = 0
    for name, shape in layout.items():
        starts[name] = at
        at += int(np.prod(shape))

    def emit(rows: np.ndarray, ks: np.ndarray, vals: np.ndarray) -> None:
        keep = cols[ks] >= 0
        rows_out.append(rows[keep])
        cols_out.append(cols[ks][keep])
        vals_out.append(vals[keep])

    if pp.P is not None:
        r, k, v = coo_entries(pp.P)
        i, j = r % n, r // n
        emit(starts["P"] + i * n + j, k, v)
    r, k, v = coo_entries(pp.q)
    keep = r < n  # row n is the objective's constant
    emit(starts["q"] + r[keep], k[keep], v[keep])
    rows_c = p + m
    if rows_c:
        r, k, v = coo_entries(pp.A)
        i, j = r % rows_c, r // rows_c
        eq, offset = i < p, j == n
        # matrix entries sit at row * n + column, offset entries at row (with n == 1 the
        # widths coincide, so the kind of block is said, not inferred from its width)
        for mask, base, matrix_block, sign in (
            (eq & ~offset, starts["A"], True, 1.0),  # A = C_E
            (eq & offset, starts["b"], False, -1.0),  # b = -c_E
            (~eq & ~offset, starts["G"] - p * n, True, -1.0),  # G = -C_I
            (~eq & offset, starts["h"] - p, False, 1.0),  # h = c_I
        ):
            idx = i[mask] * n + j[mask] if matrix_block else i[mask]
            emit(base + idx, k[mask], sign * v[mask])
    matrix = sp.csr_array(
        (np.concatenate(vals_out), (np.concatenate(rows_out), np.concatenate(cols_out))),
        shape=(at, num_columns),
    )
    matrix.sum_duplicates()
    matrix.eliminate_zeros()

    blocks: dict[str, Block] = {}
    owner = np.repeat(np.arange(len(parameters)), sizes)
    for name, shape in layout.items():
        size = int(np.prod(shape))
        if size == 0 and name not in ("P", "q"):
            continue
        start = starts[name]
        used = np.unique(matrix.indices[matrix.indptr[start] : matrix.indptr[start + size]])
        used = used[used < num_columns - 1]
        blocks[name] = Block(name, shape, start, start + size, frozenset(owner[used].tolist()))

    lb, ub = _bounds(pp, n)
    return CompiledQP(
        matrix=matrix,
        blocks=blocks,
        n=n,
        p=p,
        m=m,
        param_shapes=tuple(tuple(p.shape) for p in parameters),
        param_offsets=tuple(offsets),
        param_names=tuple(p.name() for p in parameters),
        outputs=tuple(_output(cp, problem, pp, chain, v) for v in variables),
        lb=lb,
        ub=ub,
        user_columns=_user_columns(problem, pp, chain, n),
    )


def _user_columns(problem: Any, pp: Any, chain: Any, n: int) -> np.ndarray:
    var_map = chain.compose_var_id_map()
    mask = np.zeros(n, dtype=bool)
    for v in problem.variables():
        for canon_id in var_map.get(v.id, [v.id]):
            if canon_id in pp.var_id_to_col:
                start = int(pp.var_id_to_col[canon_id])
                mask[start : start + v.size] = True
    return mask


def _bounds(pp: Any, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    if pp.lb_tensor is not None or pp.ub_tensor is not None:  # pragma: no cover - not DPP today
        raise ValueError("problem: parameter-dependent variable bounds are not supported yet.")
    lb = None if pp.lower_bounds is None else np.asarray(pp.lower_bounds, dtype=np.float64)
    ub = None if pp.upper_bounds is None else np.asarray(pp.upper_bounds, dtype=np.float64)
    if lb is not None and not np.isfinite(lb).any():
        lb = None
    if ub is not None and not np.isfinite(ub).any():
        ub = None
    for bound in (lb, ub):
        if bound is not None and bound.shape != (n,):  # pragma: no cover - cvxpy invariant
            raise ValueError(f"problem: bounds of shape {bound.shape}, expected ({n},).")
    return lb, ub


def _output(cp: Any, problem: Any, pp: Any, chain: Any, item: Any) -> Output:
    """Where a requested primal variable, dual variable or constraint lives."""
    if isinstance(item, cp.Variable) and item.id in {v.id for v in problem.variables()}:
        if any(item.attributes.get(a) for a in ("symmetric", "PSD", "NSD", "diag")):
            raise ValueError(
                f"variables: {item.name()} is a structured (symmetric/diag) variable, which "
                "CVXPY stores in a reduced form; use a plain cp.Variable."
            )
        var_map = {k: v for k, v in chain.compose_var_id_map().items()}
        ids = var_map.get(item.id, [item.id])
        if len(ids) != 1 or ids[0] not in pp.var_id_to_col:
            raise ValueError(f"variables: {item.name()} has no single canonical column block.")
        start = int(pp.var_id_to_col[ids[0]])
        return Output("x", start, start + item.size, tuple(item.shape))
    constraint, offset = _constraint_of(cp, problem, item)
    canon_id = chain.compose_constr_id_map().get(constraint.id, constraint.id)
    row = {"Zero": 0, "NonNeg": 0}
    for c in pp.constraints:
        kind = type(c).__name__
        if c.id == canon_id:
            if kind not in row:  # pragma: no cover - is_qp() refused other cones
                raise ValueError(f"variables: {constraint} became a {kind} cone. {_HINT}")
            start = row[kind] + offset
            size = int(np.prod(item.shape)) if isinstance(item, cp.Variable) else constraint.size
            shape = tuple(item.shape) if isinstance(item, cp.Variable) else tuple(constraint.shape)
            return Output("eq" if kind == "Zero" else "ineq", start, start + size, shape)
        if kind in row:
            row[kind] += c.size
    raise ValueError(
        f"variables: the constraint {constraint} has no rows in the canonical QP (CVXPY "
        "turned it into a variable bound or dropped it); ask for another constraint's dual."
    )


def _constraint_of(cp: Any, problem: Any, item: Any) -> tuple[Any, int]:
    """The problem's constraint an item names (a constraint or one of its dual variables)."""
    for c in problem.constraints:
        if item is c:
            return c, 0
        offset = 0
        for dual in c.dual_variables:
            if item is dual:
                return c, offset
            offset += dual.size
    raise ValueError(
        f"variables: expected variables of the problem, constraints of the problem or their "
        f"dual variables (constraint.dual_variables[0]), got {item!r}."
    )
