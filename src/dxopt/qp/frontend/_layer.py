"""``CvxpyQPLayer``: a CVXPY problem as a differentiable, batched dxopt QP layer.

The problem is compiled once (:mod:`dxopt.qp.frontend._compile`) into the sparse affine map
:math:`M` with ``[vec(P); q; vec(A); b; vec(G); h] = M [\\theta; 1]``. Each call stacks the
parameter tensors into :math:`\\theta` (C order, a leading batch dimension where a parameter
has one), applies :math:`M` (:class:`dxopt.qp.frontend._affine.AffineMap`), and calls
:func:`dxopt.qp.solve`. Gradients reach the parameters through the same map: for a loss
:math:`L`, :math:`\\bar\\theta = M^\\top [\\bar P; \\bar q; \\bar A; \\bar b; \\bar G; \\bar h]`
with the QP data's adjoints from the solve's backward (dXPP penalty or exact KKT). CVXPY's
defined variables are eliminated first (:mod:`dxopt.qp.frontend._eliminate`), inside the map
when the reduction stays affine in the parameters, else by a few torch products per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dxopt._core import Status
from dxopt.qp.api.compiled import opaque_call, register_opaque
from dxopt.qp.api.layer import QPLayer
from dxopt.qp.frontend._affine import SparseLinear, affine_map
from dxopt.qp.frontend._compile import CompiledQP, compile_problem
from dxopt.qp.frontend._eliminate import (
    Folded,
    Reduction,
    find_elimination,
    fold,
    piece_rows,
    recover,
    reduce,
)
from dxopt.qp.problem.functorch import functorch_active
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPSolution

__all__ = ["CvxpyQPLayer", "CvxpyQPSolution", "from_cvxpy"]

_MATRICES = ("P", "A", "G")
#: the KKT size (n + p + m) below which the default route is dense (see ``_auto_sparse``)
SPARSE_MIN_KKT = 2000
_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class CvxpyQPSolution:
    """The result of :meth:`CvxpyQPLayer.solve`.

    Attributes:
        values: the requested variables and multipliers, in the order and shapes they were
            named (a leading batch dimension when any parameter has one); differentiable.
        status: one :class:`dxopt.Status` per sample.
        solutions: the :class:`dxopt.qp.QPSolution` of the canonical QP (one; one per sample
            when sparse matrices depend on batched parameters), with ``info``.
    """

    values: tuple[Tensor, ...]
    status: tuple[Status, ...]
    solutions: tuple[QPSolution, ...]


@dataclass(frozen=True)
class _Piece:
    """A piece of the QP data the map produces: its map rows, shape and parameters."""

    rows: np.ndarray
    shape: tuple[int, ...]
    params: frozenset[int]


@dataclass(frozen=True)
class _Plan:
    """How one batching pattern splits the map: rows needed per sample and shared rows."""

    batched: SparseLinear | None
    shared: SparseLinear | None
    where: dict[str, tuple[bool, int]]  # piece -> (per sample?, its index in that part)
    sizes: dict[bool, list[int]]  # the pieces' sizes in each part


def _fortran_unflatten(vec: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``(..., size)`` entries in Fortran order -> ``(..., *shape)`` (CVXPY's layout)."""
    lead = vec.shape[:-1]
    if len(shape) == 1:
        return vec
    if len(shape) == 0:
        return vec.reshape(lead)
    out = vec.reshape(*lead, *reversed(shape))
    k, nl = len(shape), len(lead)
    return out.permute(*range(nl), *(nl + k - 1 - i for i in range(k)))


class CvxpyQPLayer(nn.Module):
    """A CVXPY problem whose canonical form is a QP, as a differentiable layer.

    ``CvxpyQPLayer(problem, parameters=[...], variables=[...])`` takes cvxpylayers' calling
    convention (``CvxpyLayer``): ``layer(*values)`` takes one tensor per parameter, in the order
    of ``parameters``, each of the parameter's shape or with one leading batch dimension
    (batched and unbatched values mix; the batched ones share the batch size), and returns a
    tuple with one tensor per entry of ``variables``. The problem must be DPP (parameters enter
    affinely; ``cp.quad_form(x, P)`` with a parameter ``P`` is allowed in the objective) and a
    QP: quadratic or affine objective, affine equalities and inequalities, variable bounds.

    An entry of ``variables`` is a variable of the problem, a constraint of the problem (its
    multiplier, CVXPY's ``constraint.dual_value`` convention: :math:`\\ge 0` for inequalities)
    or one of its dual variables (``constraint.dual_variables[0]``, as cvxpylayers takes them).

    The problem is canonicalised once, by CVXPY (:meth:`cvxpy.Problem.get_problem_data` for a
    QP solver), into a sparse affine map from the parameters to the data of
    :func:`dxopt.qp.solve`; each call is one batched ``solve`` and gradients flow back through
    the map. Symmetric/PSD parameters follow CVXPY's lowering to the upper triangle, as in
    cvxpylayers: the gradient lands on the upper triangle.

    Args:
        problem: a :class:`cvxpy.Problem`.
        parameters: all of its :class:`cvxpy.Parameter` objects, in the order the values are
            passed.
        variables: what the layer returns (see above).
        sparse: pass ``P``, ``A``, ``G`` to the solver as torch sparse matrices (``None``:
            when the canonical KKT system has more than 2000 rows, ``n + p + m``, and its
            matrices are under 5% full; below that the batched dense route is faster). A
            sparse matrix that depends on a batched parameter is solved sample by sample
            (dxopt's sparse matrices are shared by a batch).
        eliminate: remove the variables CVXPY defines by equality rows (``sum_squares``'s
            residuals, states of a dynamics chain) before the solve
            (:mod:`dxopt.qp.frontend._eliminate`; dense problems only): the solver then sees the
            QP in the original variables, with a nonsingular ``P`` where the problem has one.
            The outputs, multipliers included, are those of the canonical problem either way.
        **options: the keyword options of :func:`dxopt.qp.solve` (the fields of
            :class:`dxopt.qp.problem.options.QPOptions`, listed in this signature), held by the
            layer's :class:`~dxopt.qp.QPLayer` (``infeasible="relax"``: a certified-infeasible
            sample is solved as the closest feasible problem of the QP the solver sees, after
            the elimination, status ``RELAXED``; :mod:`dxopt.qp.api.relax`).

    Raises:
        ImportError: cvxpy is missing (``pip install 'dxopt[cvxpy]'``).
        ValueError: not DCP, not a QP (cones: use cvxpylayers), not DPP, parameters that do not
            match the problem's, bad options.

    Example:
        >>> import cvxpy as cp, torch
        >>> from dxopt.qp import CvxpyQPLayer
        >>> x, y = cp.Variable(3), cp.Parameter(3)
        >>> simplex = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [cp.sum(x) == 1, x >= 0])
        >>> layer = CvxpyQPLayer(simplex, parameters=[y], variables=[x])
        >>> (x_star,) = layer(torch.tensor([0.5, 0.2, -1.0], dtype=torch.float64))
        >>> x_star.round(decimals=6)
        tensor([0.6500, 0.3500, 0.0000], dtype=torch.float64)
    """

    def __init__(
        self,
        problem: Any,
        parameters: list[Any] | tuple[Any, ...],
        variables: list[Any] | tuple[Any, ...],
        *,
        sparse: bool | None = None,
        eliminate: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        if sparse is not None and not isinstance(sparse, bool):
            raise TypeError(f"sparse: expected True, False or None, got {sparse!r}.")
        if not isinstance(eliminate, bool):
            raise TypeError(f"eliminate: expected True or False, got {eliminate!r}.")
        QPOptions.from_keywords(options, where="CvxpyQPLayer")  # names and values, checked
        self.qp = QPLayer(**options)
        self.compiled: CompiledQP = compile_problem(problem, parameters, variables)
        c = self.compiled
        self.sparse = self._auto_sparse() if sparse is None else sparse
        self.elimination = (
            None if self.sparse or not eliminate else find_elimination(c, c.user_columns)
        )
        self._eq_duals = any(o.kind == "eq" for o in c.outputs)
        self._pieces = self._make_pieces()
        self._unbatched = (False,) * len(c.param_shapes)
        self._sources = [self._source(o.kind, o.start, o.stop) for o in c.outputs]
        self._opaque_key = register_opaque(self)  # the layer as one op under torch.compile
        self._patterns: dict[tuple[bool, ...], _Plan] = {}
        self._constants: dict[tuple[torch.device, torch.dtype], dict[str, Tensor | None]] = {}

    __init__.__signature__ = QPOptions.with_options(__init__)  # type: ignore[attr-defined]

    # ----------------------------------------------------------------------------- compile
    def _source(self, kind: str, start: int, stop: int) -> tuple[str, int, int]:
        """Where an output is read: a variable whose columns were all kept is read straight
        from the reduced solution (``"kept"``), with no recovery of the eliminated ones."""
        e = self.elimination
        if e is None or kind != "x":
            return kind, start, stop
        at = int(np.searchsorted(e.kept, start))
        if (
            stop - start
            and at + stop - start <= e.kept.size
            and e.kept[at + stop - start - 1] == stop - 1
            and e.kept[at] == start
        ):
            return "kept", at, at + stop - start
        return kind, start, stop

    def _auto_sparse(self) -> bool:
        """The default route. The dense route factors the ``K x K`` KKT matrix (``K = n + p +
        m``) once per batch in a batched LAPACK call, about ``B K^3 / 3`` flops; the sparse route
        solves and differentiates sample by sample in Python-driven sparse factorizations, whose
        per-sample overhead dominates until the dense cubic term does. Dense therefore wins
        below ``K = SPARSE_MIN_KKT`` whatever the fill (e.g. a constrained MPC with 420
        variables); above it, sparse is taken when the matrices are under 5% full."""
        c = self.compiled
        if c.n + c.p + c.m <= SPARSE_MIN_KKT:
            return False
        matrices = [b for k, b in c.blocks.items() if k in _MATRICES]
        entries = sum(b.stop - b.start for b in matrices)
        used = sum(
            int(np.count_nonzero(np.diff(c.matrix.indptr[b.start : b.stop + 1]))) for b in matrices
        )
        return used < 0.05 * max(entries, 1)

    def _make_pieces(self) -> dict[str, _Piece | None]:
        """The map's pieces: the dxopt blocks (dense), their nonzero values (sparse
        matrices), or the blocks the elimination reads (``None``: structurally zero), or the
        reduced blocks when the elimination folds into the map."""
        c = self.compiled
        self._matrix = c.matrix
        self._folded: Folded | None = None
        layout: dict[str, tuple[np.ndarray, tuple[int, ...]]] = {}
        if self.elimination is not None:
            layout = piece_rows(c, self.elimination)
            pieces = self._pieces_of(layout)
            constant = {k: v is None or not v.params for k, v in pieces.items()}
            self._folded = fold(c.matrix, layout, constant, self.elimination)
            if self._folded is None:
                return pieces
            self._matrix = self._folded.matrix
            return self._pieces_of(self._folded.layout)
        for name, block in c.blocks.items():
            rows = np.arange(block.start, block.stop)
            if self.sparse and name in _MATRICES:
                counts = np.diff(c.matrix.indptr[block.start : block.stop + 1])
                rows = block.start + np.flatnonzero(counts)  # sorted C-order positions
            layout[name] = (rows, block.shape)
        pieces = self._pieces_of(layout, drop_zero=False)
        self._sparse_patterns = {}
        if self.sparse:
            for name in _MATRICES:
                piece = pieces.get(name)
                if piece is not None:
                    start, cols = c.blocks[name].start, c.blocks[name].shape[1]
                    positions = np.stack(divmod(piece.rows - start, cols))
                    self._sparse_patterns[name] = torch.from_numpy(positions)
        return pieces

    def _pieces_of(
        self, layout: dict[str, tuple[np.ndarray, tuple[int, ...]]], *, drop_zero: bool = True
    ) -> dict[str, _Piece | None]:
        c, matrix = self.compiled, self._matrix
        sizes = [int(np.prod(s)) for s in c.param_shapes]
        owner = np.repeat(np.arange(len(sizes)), sizes)
        pieces: dict[str, _Piece | None] = {}
        for name, (rows, shape) in layout.items():
            starts, stops = matrix.indptr[rows], matrix.indptr[rows + 1]
            if drop_zero and not (stops > starts).any():
                pieces[name] = None
                continue
            cols = np.concatenate([matrix.indices[a:b] for a, b in zip(starts, stops)] or [[]])
            cols = cols[cols < c.num_columns - 1].astype(np.int64)
            pieces[name] = _Piece(rows, shape, frozenset(owner[cols].tolist()))
        return pieces

    def _plan(self, batched: tuple[bool, ...]) -> _Plan:
        plan = self._patterns.get(batched)
        if plan is not None:
            return plan
        parts: dict[bool, list[np.ndarray]] = {True: [], False: []}
        where: dict[str, tuple[bool, int]] = {}
        for name, piece in self._pieces.items():
            if piece is None or not piece.params:
                continue  # zero or constant: _constant_pieces
            per_sample = any(batched[i] for i in piece.params)
            where[name] = (per_sample, len(parts[per_sample]))
            parts[per_sample].append(piece.rows)
        linear = {
            key: SparseLinear(self._matrix[np.concatenate(rows)]) if rows else None
            for key, rows in parts.items()
        }
        sizes = {key: [r.size for r in rows] for key, rows in parts.items()}
        plan = _Plan(linear[True], linear[False], where, sizes)
        self._patterns[batched] = plan
        return plan

    # ------------------------------------------------------------------------------ calls
    def _check(self, values: tuple[Any, ...]) -> tuple[int | None, tuple[bool, ...]]:
        c = self.compiled
        if len(values) != len(c.param_shapes):
            raise ValueError(
                f"parameters: expected {len(c.param_shapes)} tensors (one per parameter, in the "
                f"order {list(c.param_names)}), got {len(values)}."
            )
        # the common case in one pass: tensors of one float dtype and device, unbatched shapes
        first = values[0] if values else None
        if isinstance(first, Tensor) and first.dtype in _FLOATS:
            dtype, device = first.dtype, first.device
            if all(
                isinstance(v, Tensor) and v.dtype == dtype and v.device == device and v.shape == s
                for v, s in zip(values, c.param_shapes)
            ):
                return None, self._unbatched
        batch: int | None = None
        flags = []
        for i, (value, shape, name) in enumerate(zip(values, c.param_shapes, c.param_names)):
            label = f"parameter {i} ({name})"
            if not isinstance(value, Tensor):
                raise TypeError(f"{label}: expected a torch.Tensor, got {type(value).__name__}.")
            if not value.dtype.is_floating_point or value.is_complex():
                raise TypeError(
                    f"{label}: expected a real floating-point tensor, got {value.dtype}; cast it "
                    "with .double() or .float()."
                )
            assert first is not None
            if value.dtype != first.dtype or value.device != first.device:
                raise ValueError(
                    f"{label}: expected dtype {first.dtype} on {first.device} like parameter 0, "
                    f"got {value.dtype} on {value.device}; pass all values alike."
                )
            if tuple(value.shape) == shape:
                flags.append(False)
                continue
            if value.ndim != len(shape) + 1 or tuple(value.shape[1:]) != shape:
                raise ValueError(
                    f"{label}: expected shape {shape} or (batch, {', '.join(map(str, shape))}), "
                    f"got {tuple(value.shape)}."
                )
            if batch is not None and value.shape[0] != batch:
                raise ValueError(
                    f"{label}: expected batch size {batch} like the other batched parameters, "
                    f"got {value.shape[0]}."
                )
            batch = int(value.shape[0])
            flags.append(True)
        return batch, tuple(flags)

    def _constants_for(self, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor | None]:
        key = (device, dtype)
        if key not in self._constants:
            c = self.compiled
            self._constants[key] = {
                "lb": None if c.lb is None else torch.from_numpy(c.lb).to(device, dtype),
                "ub": None if c.ub is None else torch.from_numpy(c.ub).to(device, dtype),
                "one": torch.ones(1, 1, device=device, dtype=dtype),
            }
        return self._constants[key]

    def _data(self, values: tuple[Tensor, ...]) -> tuple[dict[str, Tensor | None], int | None]:
        """The pieces for these parameter values (a leading batch dimension where they depend
        on a batched parameter; sparse matrices as value vectors)."""
        batch, flags = self._check(values)
        plan = self._plan(flags)
        rows = 1 if batch is None else batch  # an empty batch stays empty
        consts = self._constants_for(values[0].device, values[0].dtype)
        one = consts["one"]
        assert one is not None
        if batch is None:  # one sample: a flat theta, views only where a reshape is needed
            flat = [v if v.ndim == 1 else v.reshape(-1) for v in values]
            theta = torch.cat([*flat, one[0]]).unsqueeze(0)
        else:
            pieces = [
                v.reshape(rows, v[0].numel() if rows else int(np.prod(v.shape[1:])))
                if flag
                else v.reshape(1, -1).expand(rows, -1)
                for v, flag in zip(values, flags)
            ]
            theta = torch.cat([*pieces, one.expand(rows, 1)], dim=1)
        per_sample = None if plan.batched is None else affine_map(theta, plan.batched)
        shared = None
        if plan.shared is not None:  # unbatched parameters only: one row, even for batch 0
            first = theta[:1]
            if not rows:  # the shared rows read no batched parameter: zeros stand in for them
                first = torch.cat([
                    v.new_zeros(1, int(np.prod(v.shape[1:]))) if flag else v.reshape(1, -1)
                    for v, flag in zip(values, flags)
                ] + [one], dim=1)  # fmt: skip
            shared = affine_map(first, plan.shared)[0]
        # one split per part: one backward node (torch's split_backward), not one per piece
        parts = {
            True: () if per_sample is None else per_sample.split(plan.sizes[True], dim=1),
            False: () if shared is None else shared.split(plan.sizes[False]),
        }
        data: dict[str, Tensor | None] = dict(self._constant_pieces(values[0]))
        for name, (is_batched, index) in plan.where.items():
            piece = self._pieces[name]
            assert piece is not None
            flat_shape = (piece.rows.size,) if self.sparse and name in _MATRICES else piece.shape
            part = parts[is_batched][index]
            if len(flat_shape) > 1:  # a vector piece is already in its shape
                part = part.reshape(rows, *flat_shape) if is_batched else part.reshape(flat_shape)
            data[name] = part
        return data, batch

    def _constant_pieces(self, like: Tensor) -> dict[str, Tensor | None]:
        """The pieces that depend on no parameter (and ``None`` for the zero ones), computed
        once per dtype and device; ``P_TT_diag`` when the eliminated block of P is diagonal."""
        cache = self._constants_for(like.device, like.dtype)
        key = "const:pieces"
        if key not in cache:
            out: dict[str, Tensor | None] = {}
            for name, piece in self._pieces.items():
                if piece is None or not piece.params:
                    value = None
                    if piece is not None:
                        column = self._matrix[piece.rows][:, [-1]].toarray()
                        shape = (
                            (piece.rows.size,) if self.sparse and name in _MATRICES else piece.shape
                        )
                        value = torch.from_numpy(column.reshape(shape)).to(like.device, like.dtype)
                    out[name] = value
            ptt = out.get("P_TT", self._pieces.get("P_TT"))
            if isinstance(ptt, Tensor) and bool((ptt == torch.diag(torch.diagonal(ptt))).all()):
                out["P_TT_diag"] = torch.diagonal(ptt).clone()
            cache[key] = out  # type: ignore[assignment]
        return dict(cache[key])  # type: ignore[arg-type]

    def _constant(self, name: str, value: np.ndarray | None, like: Tensor) -> Tensor | None:
        """A compile-time array as a tensor of ``like``'s dtype and device (cached)."""
        if value is None:
            return None
        cache = self._constants_for(like.device, like.dtype)
        key = "const:" + name
        if key not in cache:
            cache[key] = torch.from_numpy(value).to(like.device, like.dtype)
        return cache[key]

    def _bounds(self, like: Tensor) -> tuple[Tensor | None, Tensor | None]:
        consts = self._constants_for(like.device, like.dtype)
        lb, ub = consts["lb"], consts["ub"]
        if self.elimination is not None:
            kept = self.elimination.kept
            lb = None if lb is None else lb[kept]
            ub = None if ub is None else ub[kept]
        return lb, ub

    def _call(
        self, d: dict[str, Tensor | None], like: Tensor, warm: QPSolution | None = None
    ) -> QPSolution:
        P, q = d["P"], d["q"]
        n = self.compiled.n if self.elimination is None else self.elimination.kept.size
        p = self.compiled.p if self.elimination is None else self.elimination.rest.size
        cache = self._constants_for(like.device, like.dtype)

        def zeros(*shape: int) -> Tensor:  # a structurally zero block, made once
            key = f"zeros{shape}"
            if key not in cache:
                cache[key] = torch.zeros(shape, dtype=like.dtype, device=like.device)
            value = cache[key]
            assert value is not None
            return value

        P = zeros(n, n) if P is None else P
        q = zeros(n) if q is None else q
        A, b, G, h = d.get("A"), d.get("b"), d.get("G"), d.get("h")
        if p:
            A = zeros(p, n) if A is None else A
            b = zeros(p) if b is None else b
        if self.compiled.m:
            G = zeros(self.compiled.m, n) if G is None else G
            h = zeros(self.compiled.m) if h is None else h
        lb, ub = self._bounds(like)
        return self.qp.forward(
            P, q, A=A if p else None, b=b if p else None, G=G if self.compiled.m else None,
            h=h if self.compiled.m else None, lb=lb, ub=ub, warm_start=warm,
        )  # fmt: skip

    def _solve_data(
        self,
        data: dict[str, Tensor | None],
        batch: int | None,
        like: Tensor,
        warm: tuple[QPSolution, ...] = (),
    ) -> list[QPSolution]:
        if not self.sparse:
            return [self._call(data, like, warm[0] if warm else None)]
        # sparse mode: matrices are value vectors, (nnz,) or (B, nnz) when they depend on a
        # batched parameter; dxopt's sparse matrices are shared by a batch, so then loop
        if not any((v := data.get(k)) is not None and v.ndim == 2 for k in _MATRICES):
            return [self._call(self._with_sparse(data), like, warm[0] if warm else None)]
        assert batch is not None
        return [
            self._call(self._with_sparse({k: v[i] if v is not None and v.ndim == 2 else v
                                          for k, v in data.items()}), like,
                       warm[i] if len(warm) == batch else None)
            for i in range(batch)
        ]  # fmt: skip

    def _with_sparse(self, data: dict[str, Tensor | None]) -> dict[str, Tensor | None]:
        """``data`` with the matrices' value vectors made torch sparse COO matrices (dense
        ones under torch.func transforms, which differentiate dense matrices only)."""
        out = dict(data)
        dense = functorch_active()  # torch.func differentiates dense matrices only
        for name, pattern in self._sparse_patterns.items():
            values = data[name]
            assert values is not None
            if dense:
                shape = self.compiled.blocks[name].shape
                index = tuple(pattern.to(values.device))
                out[name] = values.new_zeros(shape).index_put(index, values)
                continue
            out[name] = torch.sparse_coo_tensor(
                pattern.to(values.device), values, self.compiled.blocks[name].shape,
                is_coalesced=True, check_invariants=False,
            )  # fmt: skip
        return out

    def solve(self, *values: Tensor, warm_start: CvxpyQPSolution | None = None) -> CvxpyQPSolution:
        """Solve for the given parameter values; :class:`CvxpyQPSolution` with the status.
        ``warm_start``: this layer's previous solution (of the same batch size), whose
        canonical QP solutions start the solves (:func:`dxopt.qp.solve`'s ``warm_start``)."""
        warm: tuple[QPSolution, ...] = ()
        if warm_start is not None:
            if not isinstance(warm_start, CvxpyQPSolution):
                raise TypeError(
                    f"warm_start: expected this layer's previous CvxpyQPSolution (from "
                    f"layer.solve(...)), got {type(warm_start).__name__}."
                )
            warm = warm_start.solutions
        pieces, batch = self._data(values)
        like = values[0]
        e = self.elimination
        if e is None:
            solutions = self._solve_data(pieces, batch, like, warm)
            vectors = [{"x": s.x, "eq": s.eq_duals, "ineq": s.ineq_duals} for s in solutions]
        else:
            inverse = None
            if e.inverse is not None and not e.identity:
                matrix = e.inverse if e.diagonal is None else e.diagonal
                inverse = self._constant("inverse", matrix, like)
            if self._folded is None:
                data, reduction = reduce(pieces, e, inverse, like)
                known = pieces
            else:
                data = pieces
                consts = self._folded.constants
                W = self._constant("W", consts["W"], like)
                assert W is not None
                reduction = Reduction(W, pieces["w0"], None)
                known = {k: self._constant(k, consts[k], like) for k in consts}
                known["q_T"] = pieces["q_T"]
            solutions = [self._call(data, like, warm[0] if warm else None)]
            s = solutions[0]
            z, eq = None, None
            if any(kind != "kept" for kind, _, _ in self._sources):
                z, eq = recover(
                    s.x, s.eq_duals, s.ineq_duals, known, reduction, e, inverse,
                    defining_duals=self._eq_duals,
                )  # fmt: skip
            vectors = [{"x": z, "eq": eq, "ineq": s.ineq_duals, "kept": s.x}]
        outputs = []
        for out, (kind, start, stop) in zip(self.compiled.outputs, self._sources):
            if not vectors:  # an empty batch of per-sample sparse solves: nothing to solve
                empty = torch.zeros(0, stop - start, dtype=like.dtype, device=like.device)
                empty = empty + 0.0 * sum(v.sum() for v in values)  # zero gradients, shaped
                outputs.append(_fortran_unflatten(empty, out.shape))
                continue
            parts = []
            for vec in vectors:
                v = vec[kind]
                assert v is not None
                parts.append(v[..., start:stop])
            flat = parts[0] if len(parts) == 1 else torch.stack(parts)
            outputs.append(_fortran_unflatten(flat, out.shape))
        status = tuple(st for sol in solutions for st in sol.status)
        return CvxpyQPSolution(tuple(outputs), status, tuple(solutions))

    def forward(self, *values: Tensor) -> tuple[Tensor, ...]:
        """The requested variables and multipliers (cvxpylayers' return convention). Under
        :func:`torch.compile` the whole call is one opaque op
        (:func:`dxopt.qp.api.compiled.opaque_call`), same outputs and gradients."""
        if torch.compiler.is_compiling():
            return opaque_call(self._opaque_key, values)
        return self.solve(*values).values

    def _opaque_forward(self, *values: Tensor) -> tuple[Tensor, ...]:
        """The eager forward, for :mod:`dxopt.qp.api.compiled`."""
        return self.solve(*values).values

    def _opaque_shapes(self, *values: Tensor) -> list[tuple[int, ...]]:
        """The output shapes for ``values`` (shapes only), for :mod:`dxopt.qp.api.compiled`."""
        batch, _ = self._check(values)
        lead = () if batch is None else (batch,)
        return [(*lead, *out.shape) for out in self.compiled.outputs]

    def extra_repr(self) -> str:
        c = self.compiled
        gone = 0 if self.elimination is None else self.elimination.gone.size
        return (
            f"n={c.n}, p={c.p}, m={c.m}, eliminated={gone}, parameters={list(c.param_names)}, "
            f"sparse={self.sparse}"
        )


def from_cvxpy(
    problem: Any,
    parameters: list[Any] | tuple[Any, ...],
    variables: list[Any] | tuple[Any, ...],
    **options: Any,
) -> CvxpyQPLayer:
    """Compile a CVXPY QP into a :class:`CvxpyQPLayer` (the function form; same arguments)."""
    return CvxpyQPLayer(problem, parameters, variables, **options)
