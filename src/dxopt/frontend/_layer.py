""":class:`CvxpyLayer`: any DPP (or DGP) CVXPY problem as a differentiable layer.

Routing: a problem CVXPY classifies as a QP (and ``gp=False``, ``solver=None``) goes to
:class:`dxopt.qp.CvxpyQPLayer` (active-set forward, exact backward); every other one is
compiled once into a sparse affine map to the data of :func:`dxopt.conic.solve`
(:mod:`dxopt.frontend._compile`) and each call is one batched, certified, differentiable cone
solve. Gradients reach the parameters through the map (its vjp is the transposed sparse
product, :class:`dxopt.qp.frontend._affine.AffineMap`). With ``gp=True`` the layer takes the
(positive) parameter values, passes :math:`\\log\\theta` to the map and returns
:math:`e^{z}` of the log-variables (CVXPY's DGP reduction; Agrawal, Diamond and Boyd,
"Disciplined geometric programming", Optimization Letters 2019).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dxopt._core import Status
from dxopt.conic import ConicOptions, solve_with
from dxopt.frontend._blocks import SPARSE_FROM, conic_blocks
from dxopt.frontend._compile import CompiledConic, ConicOutput, check_problem, compile_conic
from dxopt.qp.api.compiled import opaque_call, register_opaque
from dxopt.qp.api.layer import QPLayer
from dxopt.qp.frontend._affine import SparseLinear, affine_map
from dxopt.qp.frontend._compile import import_cvxpy
from dxopt.qp.frontend._layer import CvxpyQPLayer
from dxopt.qp.problem.functorch import functorch_active

__all__ = ["CvxpyLayer", "CvxpyLayerSolution"]

#: cvxpy solver names -> the conic engine's first backend
SOLVERS = {"CLARABEL": "clarabel", "SCS": "scs"}
#: solver_args keys per engine -> the option(s) they set
_CONIC_KEYS = {
    "tol": ("atol", "rtol"),
    "eps": ("atol", "rtol"),
    "atol": ("atol",),
    "eps_abs": ("atol",),
    "rtol": ("rtol",),
    "eps_rel": ("rtol",),
    "max_iter": ("max_iter",),
    "max_iters": ("max_iter",),
    "infeas_tol": ("infeas_tol",),
    "kink_tol": ("kink_tol",),
    "on_failure": ("on_failure",),
    "fallback": ("fallback",),
    "polish": ("polish",),
    "infeasible": ("infeasible",),
    "backward": ("backward",),
    "route": ("route",),
}
_QP_KEYS = {
    "tol": ("eps_abs",),
    "eps": ("eps_abs",),
    "atol": ("eps_abs",),
    "eps_abs": ("eps_abs",),
    "rtol": ("eps_rel",),
    "eps_rel": ("eps_rel",),
    "on_failure": ("on_failure",),
    "fallback": ("fallback",),
    "polish": ("polish",),
}


@dataclass(frozen=True)
class CvxpyLayerSolution:
    """What one call gave: the outputs, a per-sample status and the engine that solved it."""

    values: tuple[Tensor, ...]
    status: tuple[Status, ...]
    engine: str  # "qp" or "conic"
    raw: Any = None
    """The engine's own solution (a :class:`dxopt.conic.ConicSolution` or a
    :class:`dxopt.qp.CvxpyQPSolution`): what ``warm_start=`` of the next call takes it from."""


def _translate(engine: str, args: dict[str, Any] | None, where: str) -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise TypeError(
            f"{where}: expected a dict such as {{'tol': 1e-8}}, got {type(args).__name__}."
        )
    table = _CONIC_KEYS if engine == "conic" else _QP_KEYS
    out: dict[str, Any] = {}
    for key, value in args.items():
        if key not in table:
            other = _QP_KEYS if engine == "conic" else _CONIC_KEYS
            why = (
                f" ({key!r} applies to the {'QP' if engine == 'conic' else 'conic'} engine only)"
                if key in other
                else ""
            )
            raise ValueError(
                f"{where}: unknown key {key!r} for the {engine} engine{why}; expected some of "
                f"{sorted(table)}."
            )
        for name in table[key]:
            out[name] = value
    return out


def _gather(out: ConicOutput, x: Tensor, y: Tensor, gp: bool) -> Any:
    """One output: ``vec[..., index] * scale`` (CVXPY's column-major layout), or the tuple of
    a constraint's dual variables."""
    if out.parts:
        return tuple(_gather(p, x, y, gp) for p in out.parts)
    vec = x if out.kind == "x" else y
    index = torch.tensor(np.asarray(out.index, dtype=np.int64))
    value = vec[..., index.reshape(-1)].reshape(tuple(vec.shape[:-1]) + tuple(out.shape))
    if out.scale is not None:
        value = value * torch.tensor(np.asarray(out.scale), dtype=value.dtype)
    if gp and out.kind == "x":
        value = torch.exp(value)
    return value


class CvxpyLayer(nn.Module):
    """A DPP CVXPY problem (or a DGP one with ``gp=True``) as a differentiable layer.

    cvxpylayers' calling convention: ``CvxpyLayer(problem, parameters=[...],
    variables=[...])``, then ``layer(*values, solver_args={...})`` with one tensor per
    parameter (its shape, or a leading batch dimension; batched and shared values mix) returns
    a tuple with one entry per item of ``variables``: a variable of the problem (symmetric
    ones included), or a constraint / one of its dual variables (the multiplier, in CVXPY's
    ``dual_value`` layout: equality and inequality constraints, ``cp.SOC``, ``cp.ExpCone``,
    ``cp.PowCone3D`` and ``X >> 0``; a constraint with several dual variables, ``cp.SOC``
    ``(t, X)`` or a 3-d cone ``(x, y, z)``, gives a tuple of tensors as ``dual_value`` gives a
    list, each of its dual variable's shape; :mod:`dxopt.frontend._duals`). Shared ``P``/``A``
    blocks of a large problem are passed to :mod:`dxopt.conic` sparse
    (:mod:`dxopt.frontend._blocks`).

    Args:
        problem: a :class:`cvxpy.Problem`, DPP (DGP-DPP with ``gp=True``).
        parameters: all of its parameters, in the order the values are passed.
        variables: what the layer returns (see above).
        gp: log-log convex programming: parameters and variables positive, solved in logs.
        solver: ``None`` (QPs to :mod:`dxopt.qp`, the rest to :mod:`dxopt.conic` with
            Clarabel first), or a cvxpy name, ``"CLARABEL"`` or ``"SCS"``: the conic engine,
            with that backend first (a QP then goes to :mod:`dxopt.conic` too).
        solver_args: defaults for every call (keys: ``tol``/``eps`` (both tolerances),
            ``atol``/``eps_abs``, ``rtol``/``eps_rel``, ``on_failure``, ``fallback``,
            ``polish``; conic only: ``max_iter``/``max_iters``, ``infeas_tol``,
            ``kink_tol``, ``infeasible`` (``"relax"``: infeasible samples train on their
            closest feasible problem, :mod:`dxopt.conic.relax`), ``backward``
            (``dxopt.conic.Smoothed(mu)``, :mod:`dxopt.conic.smoothed`), ``route``
            (``"auto"``, ``"dense"``, ``"sparse"``: :mod:`dxopt.conic.sparse_route`)); a call's
            ``solver_args`` override them.

    Attributes:
        engine: ``"qp"`` or ``"conic"``.
        last_status: the per-sample :class:`dxopt.Status` of the last call (with
            ``on_failure`` other than ``"raise"``, failed samples come back as NaN, and
            infeasible/unbounded ones carry a checked certificate).

    Raises:
        ImportError: cvxpy is missing.
        TypeError, ValueError: not DCP/DGP or not DPP (naming the offending objective or
            constraint), parameters that do not match the problem's, cones dxopt does not
            take, unknown solvers or ``solver_args`` keys.

    Example:
        >>> import cvxpy as cp, torch
        >>> from dxopt.frontend import CvxpyLayer
        >>> x, c = cp.Variable(3), cp.Parameter(3)
        >>> softmax = cp.Problem(cp.Minimize(-c @ x - cp.sum(cp.entr(x))), [cp.sum(x) == 1])
        >>> layer = CvxpyLayer(softmax, parameters=[c], variables=[x])
        >>> (p,) = layer(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
        >>> bool(torch.allclose(p, torch.softmax(torch.tensor([1.0, 2.0, 3.0]).double(), 0)))
        True
    """

    def __init__(
        self,
        problem: Any,
        parameters: list[Any] | tuple[Any, ...],
        variables: list[Any] | tuple[Any, ...],
        *,
        gp: bool = False,
        solver: str | None = None,
        solver_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        cp = import_cvxpy()
        if solver is not None and (not isinstance(solver, str) or solver.upper() not in SOLVERS):
            raise ValueError(
                f"solver: expected None or one of the cvxpy names {sorted(SOLVERS)} (dxopt's "
                f"backends), got {solver!r}; other cvxpy solvers have no dxopt counterpart."
            )
        check_problem(cp, problem, parameters, variables, gp)
        self.gp = gp
        self.solver = None if solver is None else solver.upper()
        self.engine = "qp" if (not gp and solver is None and problem.is_qp()) else "conic"
        self.solver_args = _translate(self.engine, solver_args, "solver_args")
        self.param_shapes = tuple(tuple(p.shape) for p in parameters)
        self.param_names = tuple(p.name() for p in parameters)
        self.last_status: tuple[Status, ...] = ()
        #: dense entries of a shared P or A above which it is passed sparse (_blocks)
        self.sparse_from = SPARSE_FROM
        if self.engine == "qp":
            self.qp_layer: CvxpyQPLayer | None = CvxpyQPLayer(
                problem, list(parameters), list(variables), **self.solver_args
            )
            self.compiled: CompiledConic | None = None
        else:
            self.qp_layer = None
            self.compiled = compile_conic(problem, parameters, variables, gp=gp)
            self._map = SparseLinear(self.compiled.matrix)
            self._rows = torch.from_numpy(self.compiled.rows.astype("int64"))
            if self.solver is not None:
                self.solver_args.setdefault("solver", SOLVERS[self.solver])
            ConicOptions(**self.solver_args)  # checks the values now
        self._opaque_key = register_opaque(self)  # the layer as one op under torch.compile

    # ------------------------------------------------------------------------------ checks
    def _check(self, values: tuple[Any, ...]) -> int | None:
        if len(values) != len(self.param_shapes):
            raise ValueError(
                f"values: expected {len(self.param_shapes)} tensors (one per parameter: "
                f"{list(self.param_names)}), got {len(values)}."
            )
        batch: int | None = None
        dtype = None
        for name, shape, v in zip(self.param_names, self.param_shapes, values):
            if not isinstance(v, Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(v).__name__}.")
            if v.dtype not in (torch.float32, torch.float64):
                raise TypeError(f"{name}: expected float32 or float64, got {v.dtype}.")
            if dtype is None:
                dtype = v.dtype
            elif v.dtype != dtype:
                raise TypeError(
                    f"{name}: expected the dtype of the other values ({dtype}), got {v.dtype}; "
                    "convert all parameter values to one dtype."
                )
            if tuple(v.shape) == shape:
                continue
            if v.dim() == len(shape) + 1 and tuple(v.shape[1:]) == shape:
                if batch is not None and v.shape[0] != batch:
                    raise ValueError(
                        f"{name}: batch size {v.shape[0]} differs from another value's {batch}."
                    )
                batch = int(v.shape[0])
                continue
            raise ValueError(
                f"{name}: expected shape {shape} or (B, *{shape}), got {tuple(v.shape)}."
            )
        if self.gp:
            for name, v in zip(self.param_names, values):
                if bool((v <= 0).any()):
                    raise ValueError(f"{name}: gp=True takes positive values, got some <= 0.")
        return batch

    # ------------------------------------------------------------------------------ solve
    def solve(
        self,
        *values: Tensor,
        solver_args: dict[str, Any] | None = None,
        warm_start: CvxpyLayerSolution | None = None,
    ) -> CvxpyLayerSolution:
        """Solve for the given values: :class:`CvxpyLayerSolution` with the statuses.

        ``warm_start``: this layer's previous solution (same batch size): the conic route
        tries its point first, certified as a cold answer (:mod:`dxopt.conic.warm`); the QP
        route passes it to :meth:`dxopt.qp.CvxpyQPLayer.solve`."""
        if warm_start is not None and not (
            isinstance(warm_start, CvxpyLayerSolution) and warm_start.engine == self.engine
        ):
            raise TypeError(
                "warm_start: expected a CvxpyLayerSolution of this layer (from layer.solve), "
                f"got {type(warm_start).__name__}"
            )
        raw = None if warm_start is None else warm_start.raw
        if self.qp_layer is not None:
            return self._solve_qp(values, solver_args, raw)
        return self._solve_conic(values, solver_args, raw)

    def _solve_qp(
        self, values: tuple[Any, ...], solver_args: dict[str, Any] | None, warm: Any = None
    ) -> CvxpyLayerSolution:
        layer = self.qp_layer
        assert layer is not None
        extra = _translate("qp", solver_args, "solver_args")
        saved = layer.qp
        if extra:
            layer.qp = QPLayer(**{**saved.options, **extra})
        try:
            sol = layer.solve(*values, warm_start=warm)
        finally:
            layer.qp = saved
        self.last_status = sol.status
        return CvxpyLayerSolution(sol.values, sol.status, "qp", sol)

    def _solve_conic(
        self, values: tuple[Any, ...], solver_args: dict[str, Any] | None, warm: Any = None
    ) -> CvxpyLayerSolution:
        c = self.compiled
        assert c is not None
        if functorch_active():
            raise TypeError(
                "CvxpyLayer: this problem has cones (it is not a QP), and its engine "
                "dxopt.conic does not run under torch.func transforms (vmap, grad, jacrev, "
                "jacfwd). Differentiate it with plain autograd (loss.backward(), "
                "torch.autograd.grad) and pass a batch instead of vmap; QPs (sent to "
                "dxopt.qp) support torch.func."
            )
        batch = self._check(values)
        options = ConicOptions(
            **{**self.solver_args, **_translate("conic", solver_args, "solver_args")}
        )
        B = 1 if batch is None else batch
        flat = []
        for shape, v in zip(self.param_shapes, values):
            w = torch.log(v) if self.gp else v
            w = w.reshape(-1, math.prod(shape))
            flat.append(w.expand(B, -1) if w.shape[0] == 1 else w)
        like = values[0] if values else torch.zeros((), dtype=torch.float64)
        flat.append(torch.ones(B, 1, dtype=like.dtype, device=like.device))
        theta = torch.cat(flat, dim=1)
        entries = affine_map(theta, self._map)
        n = c.n
        batched = (
            set()
            if batch is None
            else {i for i, v in enumerate(values) if v.dim() == len(self.param_shapes[i]) + 1}
        )
        P, q, A, b = conic_blocks(c, entries, batched, sparse_from=self.sparse_from)
        if batch is not None and q.dim() == 1:
            q = q.expand(B, n)
        sol = solve_with(P, q, A, b, cones=c.cones, options=options, warm_start=warm)
        status = tuple(sol.status)
        self.last_status = status
        outs = tuple(_gather(out, sol.x, sol.y, c.gp) for out in c.outputs)
        return CvxpyLayerSolution(outs, status, "conic", sol)

    def forward(
        self, *values: Tensor, solver_args: dict[str, Any] | None = None
    ) -> tuple[Tensor, ...]:
        """The requested variables and multipliers (cvxpylayers' return convention). Under
        :func:`torch.compile` (``fullgraph=True`` included) the whole call is one opaque op
        (:func:`dxopt.qp.api.compiled.opaque_call`): same outputs and gradients as eager (the
        backward runs the layer again); per-call ``solver_args`` are refused there (pass them
        to the constructor)."""
        if torch.compiler.is_compiling():
            if solver_args is not None:
                raise TypeError(
                    "solver_args: per-call solver_args are not supported under torch.compile; "
                    "pass them to CvxpyLayer(..., solver_args=...) instead"
                )
            return opaque_call(self._opaque_key, values)
        return self.solve(*values, solver_args=solver_args).values

    def _opaque_forward(self, *values: Tensor) -> tuple[Tensor, ...]:
        """The eager forward, for :mod:`dxopt.qp.api.compiled`."""
        return self.solve(*values).values

    def _opaque_shapes(self, *values: Tensor) -> list[tuple[int, ...]]:
        """The output shapes for ``values`` (from their shapes alone)."""
        batch: tuple[int, ...] = ()
        for shape, v in zip(self.param_shapes, values):
            if v.dim() == len(shape) + 1:
                batch = (int(v.shape[0]),)
        if self.compiled is not None:
            shapes = [tuple(out.shape) for out in self.compiled.outputs]
        else:
            assert self.qp_layer is not None
            shapes = [tuple(out.shape) for out in self.qp_layer.compiled.outputs]
        return [(*batch, *shape) for shape in shapes]

    def extra_repr(self) -> str:
        if self.compiled is None:
            return f"engine=qp, parameters={list(self.param_names)}"
        c = self.compiled
        return (
            f"engine=conic, n={c.n}, m={c.m}, cones={len(c.cones)}, gp={self.gp}, "
            f"parameters={list(self.param_names)}"
        )
