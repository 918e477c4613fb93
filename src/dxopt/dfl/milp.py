"""A mixed-integer linear oracle on HiGHS for the user's own problem:

.. math:: x(c) \\in \\arg\\min_x c^\\top x \\ (\\text{or } \\arg\\max) \\quad \\text{s.t.}\\quad
    A_{ub} x \\le b_{ub},\\ A_{eq} x = b_{eq},\\ l \\le M x \\le u \\ (\\text{further rows}),\\
    lb \\le x \\le ub,\\ x_j \\in \\mathbb Z \\ (j \\in I),

built once (one ``highspy.Highs`` model; only the cost changes between solves), solved for a
batch of cost vectors by HiGHS' branch and cut (Huangfu & Hall, "Parallelizing the dual revised
simplex method", Math. Prog. Comp. 2018, for its LP engine), each solve warm-started with the
best of the solutions found so far for the new cost (the feasible set is fixed, so every earlier
answer is a feasible incumbent), under a per-sample time limit, node limit and relative gap.

Replacing PyEPO's ``optGrbModel`` (Tang & Khalil, arXiv 2206.14234), one to one:

=======================================  ===================================================
PyEPO (``pyepo.model.grb.optGrbModel``)  :class:`MILPOracle`
=======================================  ===================================================
``_getModel()`` building ``(m, x)``      the constructor's matrices: ``A_ub, b_ub``,
                                         ``A_eq, b_eq``, ``constraints``, ``bounds``,
                                         ``integrality`` (``vtype=GRB.BINARY``: ``bounds=(0,
                                         1), integrality=1``)
``modelSense = EPO.MINIMIZE / MAXIMIZE``  ``sense="min"`` / ``"max"``
``num_cost``                             :attr:`dim`
``setObj(c)`` then ``solve()``           ``oracle(c)`` for ``(d,)`` or a batch ``(B, d)``;
                                         :meth:`solve` also returns objectives, bounds,
                                         gaps, nodes and a status per sample
``TimeLimit``, ``NodeLimit``, ``MIPGap``   ``time_limit`` (seconds per sample), ``node_limit``,
                                         ``mip_rel_gap``
``relax()``                              :meth:`relax` (an :class:`~dxopt.dfl.LPOracle`)
``copy()``                               :meth:`copy`
``addConstr(coefs, rhs)``                :meth:`with_constraint` (a new oracle)
``optDataset(model, x, c)``              ``DFLData(x, c).with_solutions(oracle)``
``SPOPlus(model, processes=...)``        ``SPOPlus(oracle)`` (one batched call; no pool of
                                         processes)
=======================================  ===================================================

Per-sample status (:attr:`~dxopt.dfl.OracleBase.last_status`, :class:`dxopt.Status`):
``SOLVED`` (optimal; with ``mip_rel_gap > 0``, only when the final gap is 0),
``INACCURATE`` (stopped at a positive relative gap ``<= mip_rel_gap``: "gap reached"),
``BUDGET_EXHAUSTED`` (the time or node limit stopped it; the answer is the incumbent),
``INFEASIBLE``, ``UNBOUNDED``, ``FAILED`` (no feasible answer at all). Answers that are not
``SOLVED`` follow ``on_failure``; samples without any feasible answer always raise an
:class:`~dxopt.dfl.OracleError` except under ``on_failure="nan"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt._core import Cost, Status, check_int, check_on_failure, check_positive, handle_failure
from dxopt.dfl._checks import as_array
from dxopt.dfl._highs import import_highspy, new_highs, pass_model
from dxopt.dfl.oracles import LPOracle, OracleBase, OracleError, Sense

__all__ = ["MILPOracle", "MILPSolution"]


@dataclass(frozen=True)
class MILPSolution:
    """What :meth:`MILPOracle.solve` found, per sample (in the oracle's ``sense``).

    Attributes:
        x: ``(B, d)`` (or ``(d,)``) solutions, in the costs' dtype and device (NaN rows where
            no answer, under ``on_failure="nan"``).
        objective: ``(B,)`` float64 :math:`c^\\top x`; bound: ``(B,)`` HiGHS' dual bound on
            the optimum; gap: ``(B,)`` relative gap :math:`|obj - bound| / \\max(|obj|, 1)`
            as HiGHS reports it (0 when proven optimal); nodes: ``(B,)`` branch-and-bound nodes.
        status: one :class:`dxopt.Status` per sample; cost: the call's :class:`dxopt.Cost`.
    """

    x: Tensor
    objective: Tensor
    bound: Tensor
    gap: Tensor
    nodes: Tensor
    status: tuple[Status, ...]
    cost: Cost

    @property
    def certified(self) -> bool:
        """True when every sample is a proven optimum (``Status.SOLVED``)."""
        return all(s is Status.SOLVED for s in self.status)


def _matrix(name: str, value: Any, dim: int | None) -> Any:
    """A constraint matrix (dense or ``scipy.sparse``) as a CSR float64 matrix, finite."""
    import scipy.sparse as sp

    if sp.issparse(value):
        mat = sp.csr_matrix(value, dtype=np.float64)
        data = mat.data
    else:
        arr = as_array(name, value)
        if arr.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D (rows, d) matrix, got shape {arr.shape}.")
        mat, data = sp.csr_matrix(arr), arr
    if dim is not None and mat.shape[1] != dim:
        raise ValueError(
            f"{name}: expected {dim} columns (the number of variables), got {mat.shape[1]}."
        )
    if not np.isfinite(data).all():
        raise ValueError(f"{name}: expected finite entries, got inf/NaN; fix the model's data.")
    return mat


def _bound_vector(name: str, value: Any, dim: int, default: float) -> np.ndarray:
    if value is None:
        return np.full(dim, default)
    arr = np.array(value.detach().cpu() if isinstance(value, Tensor) else value, dtype=object)
    arr = np.where(arr == None, default, arr).astype(float)  # noqa: E711 - linprog's None
    if arr.ndim == 0:
        return np.full(dim, float(arr))
    if arr.shape != (dim,):
        raise ValueError(f"{name}: expected a number or shape ({dim},), got shape {arr.shape}.")
    if np.isnan(arr).any():
        raise ValueError(f"{name}: expected numbers (None or +-inf for no bound), got NaN.")
    return arr


def _bounds(bounds: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``bounds`` as in :func:`scipy.optimize.linprog` / :func:`~scipy.optimize.milp`: a
    :class:`scipy.optimize.Bounds`, one ``(lb, ub)`` pair for every variable (numbers, ``None``
    or ``(d,)`` vectors), or a sequence of ``d`` pairs."""
    if bounds is None:
        bounds = (0.0, None)
    if hasattr(bounds, "lb") and hasattr(bounds, "ub"):
        pair: Any = (bounds.lb, bounds.ub)
    elif (
        len(bounds) == 2
        and all(b is None or np.ndim(b) in (0, 1) for b in bounds)
        and not (dim == 2 and all(np.ndim(b) == 1 and len(b) == 2 for b in bounds if b is not None))
    ):
        pair = bounds
    else:
        if len(bounds) != dim or any(np.ndim(b) != 1 or len(b) != 2 for b in bounds):
            raise ValueError(
                f"bounds: expected (lb, ub) for every variable or a sequence of {dim} (lb, ub) "
                f"pairs, got {bounds!r:.80}."
            )
        pair = tuple(zip(*bounds, strict=True))
    lo = _bound_vector("bounds (lb)", pair[0], dim, -np.inf)
    hi = _bound_vector("bounds (ub)", pair[1], dim, np.inf)
    if (lo > hi).any():
        j = int(np.argmax(lo > hi))
        raise ValueError(f"bounds: lb[{j}] = {lo[j]} > ub[{j}] = {hi[j]}; the model is infeasible.")
    return lo, hi


class MILPOracle(OracleBase):
    """:math:`x(c) \\in \\arg\\min_x c^\\top x` (``argmax`` with ``sense="max"``) over a fixed
    mixed-integer feasible set, by HiGHS; the one-to-one replacement of PyEPO's
    ``optGrbModel`` (see the module's table).

    Args (keyword-only; the names of :func:`scipy.optimize.linprog`):
        A_ub, b_ub: rows :math:`A_{ub} x \\le b_{ub}`; A_eq, b_eq: rows :math:`A_{eq} x = b_{eq}`
            (dense, tensors or ``scipy.sparse``).
        constraints: further rows :math:`l \\le Mx \\le u`, as
            :class:`scipy.optimize.LinearConstraint` or ``(M, l, u)`` triples.
        bounds: ``(lb, ub)`` for every variable, a sequence of per-variable pairs or a
            :class:`scipy.optimize.Bounds`; ``None`` entries are infinite; the default
            ``(0, None)`` is linprog's.
        integrality: ``1`` (integer) / ``0`` (continuous) per variable, or one number for all
            (scipy's convention; default: all integer, the reason for this oracle).
        dim: the number of variables, when no matrix or vector fixes it.
        sense: ``"min"`` or ``"max"``.
        time_limit: seconds per sample (``None``: none); node_limit: branch-and-bound nodes per
            sample (``None``: none); mip_rel_gap: stop at this relative gap (default 0: prove
            optimality, up to HiGHS' absolute gap ``1e-6`` and feasibility tolerance).
        warm_start: start each solve from the best, for the new cost, of the last
            ``pool_size`` distinct answers (and of :meth:`add_solutions`).
        on_failure: for answers that are not proven optima: ``"warn"`` (default: return the
            incumbent, warn with a :class:`dxopt.DxoptWarning`), ``"raise"``, ``"ignore"``
            (status only) or ``"nan"`` (NaN rows).
        threads: HiGHS' thread count (``None``: HiGHS' choice).
        presolve: run HiGHS' presolve before each solve (default, HiGHS' own default). Off,
            each solve starts branch and cut on the model as built: on small models that
            HiGHS solves at the root node, such as the JAIR scheduling MILPs (411-1545 binary
            variables), presolving every new cost costs more than it saves.
    """

    def __init__(
        self,
        *,
        A_ub: Any = None,
        b_ub: Any = None,
        A_eq: Any = None,
        b_eq: Any = None,
        constraints: Any = (),
        bounds: Any = (0.0, None),
        integrality: Any = 1,
        dim: int | None = None,
        sense: Sense = "min",
        time_limit: float | None = None,
        node_limit: int | None = None,
        mip_rel_gap: float = 0.0,
        warm_start: bool = True,
        pool_size: int = 32,
        on_failure: str = "warn",
        threads: int | None = None,
        presolve: bool = True,
    ) -> None:
        import scipy.sparse as sp

        for mat, rhs, names in ((A_ub, b_ub, "A_ub, b_ub"), (A_eq, b_eq, "A_eq, b_eq")):
            if (mat is None) != (rhs is None):
                raise ValueError(f"{names}: give both the matrix and its right-hand side.")
        triples = [
            (c.A, c.lb, c.ub) if hasattr(c, "A") else tuple(c) for c in list(constraints or ())
        ]
        if any(len(t) != 3 for t in triples):
            raise ValueError("constraints: expected LinearConstraint objects or (M, l, u) triples.")
        shapes = [np.shape(M)[-1] for M in (A_ub, A_eq) if M is not None]
        shapes += [M.shape[-1] if sp.issparse(M) else np.shape(M)[-1] for M, _, _ in triples]
        shapes += [np.shape(integrality)[0]] if np.ndim(integrality) == 1 else []
        if dim is None and not shapes:
            raise ValueError("dim: give the number of variables (no matrix or vector fixes it).")
        d = check_int("dim", dim if dim is not None else int(shapes[0]))
        if any(s != d for s in shapes):
            raise ValueError(
                f"A_ub, A_eq, constraints, integrality: column counts {shapes} != {d}."
            )
        super().__init__(dim=d, sense=sense)
        rows, lower, upper = [], [], []
        if A_ub is not None:
            M = _matrix("A_ub", A_ub, d)
            rows.append(M)
            upper.append(as_array("b_ub", b_ub, (M.shape[0],)))
            lower.append(np.full(M.shape[0], -np.inf))
        if A_eq is not None:
            M = _matrix("A_eq", A_eq, d)
            rows.append(M)
            rhs = as_array("b_eq", b_eq, (M.shape[0],))
            lower.append(rhs)
            upper.append(rhs)
        for k, (M_k, lo_k, hi_k) in enumerate(triples):
            M = _matrix(f"constraints[{k}]", M_k, d)
            rows.append(M)
            lower.append(_bound_vector(f"constraints[{k}] (lower)", lo_k, M.shape[0], -np.inf))
            upper.append(_bound_vector(f"constraints[{k}] (upper)", hi_k, M.shape[0], np.inf))
        self.matrix = sp.vstack(rows, format="csr") if rows else sp.csr_matrix((0, d))
        self.row_lower = np.concatenate(lower) if lower else np.zeros(0)
        self.row_upper = np.concatenate(upper) if upper else np.zeros(0)
        self.lb, self.ub = _bounds(bounds, d)
        integ = (
            np.broadcast_to(np.asarray(integrality), (d,))
            if np.ndim(integrality) == 0
            else (np.asarray(integrality))
        )
        if not np.isin(integ, (0, 1)).all():
            raise ValueError(
                "integrality: expected 0 (continuous) or 1 (integer) per variable, got "
                f"{np.unique(integ).tolist()}; semi-continuous variables are not supported."
            )
        self.integer = integ.astype(bool).copy()
        self.time_limit = None if time_limit is None else check_positive("time_limit", time_limit)
        self.node_limit = None if node_limit is None else check_int("node_limit", node_limit)
        self.mip_rel_gap = check_positive("mip_rel_gap", mip_rel_gap, allow_zero=True)
        self.warm_start = bool(warm_start)
        self.pool_size = check_int("pool_size", pool_size)
        self.on_failure = check_on_failure(on_failure, ("raise", "warn", "ignore", "nan"))
        self.threads = None if threads is None else check_int("threads", threads)
        if not isinstance(presolve, bool):
            raise TypeError(f"presolve: expected True or False, got {presolve!r}.")
        self.presolve = presolve
        self.exact = self.time_limit is None and self.node_limit is None and mip_rel_gap == 0
        self._pool = np.zeros((0, d))
        self._info: dict[str, np.ndarray] = {}
        self._build()

    def _build(self) -> None:
        highspy = import_highspy("MILPOracle")
        hs = new_highs("MILPOracle")
        pass_model(
            hs, matrix=self.matrix, row_lower=self.row_lower, row_upper=self.row_upper,
            col_lower=self.lb, col_upper=self.ub, integer=self.integer,
        )  # fmt: skip
        hs.setOptionValue("mip_rel_gap", float(self.mip_rel_gap))
        if self.time_limit is not None:
            hs.setOptionValue("time_limit", float(self.time_limit))
        if self.node_limit is not None:
            hs.setOptionValue("mip_max_nodes", int(self.node_limit))
        if self.threads is not None:
            hs.setOptionValue("threads", int(self.threads))
        if not self.presolve:
            hs.setOptionValue("presolve", "off")
        self._hs, self._highspy = hs, highspy
        self._cols = np.arange(self.dim, dtype=np.int32)

    # -- the PyEPO-like model operations ---------------------------------------------------
    def _kwargs(self) -> dict[str, Any]:
        return {
            "constraints": [(self.matrix, self.row_lower, self.row_upper)],
            "bounds": (self.lb, self.ub), "integrality": self.integer.astype(int),
            "dim": self.dim, "sense": self.sense, "time_limit": self.time_limit,
            "node_limit": self.node_limit, "mip_rel_gap": self.mip_rel_gap,
            "warm_start": self.warm_start, "pool_size": self.pool_size,
            "on_failure": self.on_failure, "threads": self.threads, "presolve": self.presolve,
        }  # fmt: skip

    def copy(self, **options: Any) -> MILPOracle:
        """A new oracle on the same model and options (its own HiGHS instance and pool);
        keyword ``options`` of the constructor (``time_limit``, ``presolve``, ...) replace
        this oracle's."""
        kw = self._kwargs()
        unknown = sorted(set(options) - set(kw))
        if unknown:
            raise TypeError(
                f"copy: unknown options {unknown}; expected constructor options such as "
                "time_limit, node_limit, mip_rel_gap, warm_start, pool_size, presolve."
            )
        return MILPOracle(**{**kw, **options})

    def with_constraint(self, coefs: Any, rhs: float, *, kind: str = "<=") -> MILPOracle:
        """A new oracle with one more row ``coefs @ x <= rhs`` (``kind``: ``"<="``, ``">="``
        or ``"=="``), as PyEPO's ``addConstr``."""
        row = as_array("coefs", coefs, (self.dim,))[None]
        lo = {"<=": -np.inf, ">=": rhs, "==": rhs}.get(kind)
        if lo is None:
            raise ValueError(f"kind: expected '<=', '>=' or '==', got {kind!r}.")
        hi = np.inf if kind == ">=" else rhs
        kw = self._kwargs()
        kw["constraints"] = [*kw["constraints"], (row, [lo], [hi])]
        return MILPOracle(**kw)

    def relax(self, *, solver: str = "highs") -> LPOracle:
        """The LP relaxation (integrality dropped) as an :class:`~dxopt.dfl.LPOracle`, PyEPO's
        ``relax()``."""
        eq = self.row_lower == self.row_upper
        M = self.matrix.toarray()
        G = [M[~eq & np.isfinite(self.row_upper)], -M[~eq & np.isfinite(self.row_lower)]]
        h = [self.row_upper[~eq & np.isfinite(self.row_upper)]]
        h.append(-self.row_lower[~eq & np.isfinite(self.row_lower)])
        Gm, hv = np.vstack(G), np.concatenate(h)
        return LPOracle(
            A=M[eq] if eq.any() else None, b=self.row_lower[eq] if eq.any() else None,
            G=Gm if Gm.shape[0] else None, h=hv if Gm.shape[0] else None,
            lb=self.lb, ub=self.ub, sense=self.sense, solver=solver,
        )  # fmt: skip

    # -- warm starts ------------------------------------------------------------------------
    def add_solutions(self, x: Any) -> None:
        """Offer feasible solutions ``(d,)`` or ``(K, d)`` (e.g. the training optima) as warm
        starts; only the last ``pool_size`` distinct ones are kept."""
        rows = as_array("x", x).reshape(-1, self.dim)
        if not np.isfinite(rows).all():
            raise ValueError("x: expected finite solutions.")
        for r in rows:
            if self._pool.shape[0] and (self._pool == r).all(1).any():
                continue
            self._pool = np.vstack([self._pool, r])[-self.pool_size :]

    def _warm(self, cost: np.ndarray) -> None:
        if not self.warm_start or self._pool.shape[0] == 0:
            return
        start = self._pool[int(np.argmin(self._pool @ cost))]
        sol = self._highspy.HighsSolution()
        sol.col_value = start.tolist()
        sol.value_valid = True
        self._hs.setSolution(sol)

    # -- solving ----------------------------------------------------------------------------
    def _classify(self, model_status: Any, info: Any) -> Status:
        ms = self._highspy.HighsModelStatus
        has_answer = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
        if model_status == ms.kOptimal:
            if self.mip_rel_gap > 0 and self.integer.any() and info.mip_gap > 0:
                return Status.INACCURATE
            return Status.SOLVED
        if model_status in (ms.kInfeasible,):
            return Status.INFEASIBLE
        if model_status in (ms.kUnbounded, ms.kUnboundedOrInfeasible):
            return Status.UNBOUNDED
        limits = (ms.kTimeLimit, ms.kSolutionLimit, ms.kIterationLimit, ms.kInterrupt)
        if model_status in limits and has_answer:
            return Status.BUDGET_EXHAUSTED
        return Status.FAILED

    @staticmethod
    def _consistent(cost: np.ndarray, x: Any, run_info: Any) -> bool:
        """The answer's cost equals the objective HiGHS reports (to 1e-9 relative)."""
        value = float(cost @ np.asarray(x, dtype=np.float64))
        reported = float(run_info.objective_function_value)
        return abs(value - reported) <= 1e-9 * max(1.0, abs(value), float(np.abs(cost).sum()))

    def _solve(self, c: np.ndarray) -> np.ndarray:
        hs, B = self._hs, c.shape[0]
        out = np.full_like(c, np.nan)
        info = {k: np.full(B, np.nan) for k in ("objective", "bound", "gap", "nodes")}
        status: list[Status] = []
        for i in range(B):
            cost = self.sign * c[i]
            hs.changeColsCost(self.dim, self._cols, cost)
            self._warm(cost)
            hs.run()
            run_info = hs.getInfo()
            st = self._classify(hs.getModelStatus(), run_info)
            if st.ok and not self._consistent(cost, hs.getSolution().col_value, run_info):
                # HiGHS 1.16 can report kOptimal with an answer whose cost is not the objective
                # it reports after a warm start (seen on the JAIR scheduling MILP, 0.7% off):
                # never pass it on; re-solve cold, and fail if that is inconsistent too
                hs.clearSolver()
                hs.run()
                run_info = hs.getInfo()
                st = self._classify(hs.getModelStatus(), run_info)
                if st.ok and not self._consistent(cost, hs.getSolution().col_value, run_info):
                    st = Status.FAILED
            status.append(st)
            if st in (Status.SOLVED, Status.INACCURATE, Status.BUDGET_EXHAUSTED):
                out[i] = hs.getSolution().col_value
                info["objective"][i] = self.sign * run_info.objective_function_value
                if self.integer.any():
                    info["bound"][i] = self.sign * run_info.mip_dual_bound
                    info["gap"][i], info["nodes"][i] = run_info.mip_gap, run_info.mip_node_count
                else:
                    info["bound"][i], info["gap"][i], info["nodes"][i] = info["objective"][i], 0, 0
                self.add_solutions(out[i])
        self._status, self._info = tuple(status), info
        self._report(status, out)
        return out

    def _report(self, status: list[Status], out: np.ndarray) -> None:
        missing = [i for i, s in enumerate(status) if not s.ok and s is not Status.BUDGET_EXHAUSTED]
        missing = [i for i in missing if status[i] is not Status.INACCURATE]
        loose = [i for i, s in enumerate(status) if s is not Status.SOLVED and i not in missing]
        what = ", ".join(f"{i}: {status[i].value}" for i in (missing or loose)[:5])
        if missing and self.on_failure != "nan":
            raise OracleError(
                f"MILPOracle: {len(missing)} of {len(status)} samples have no feasible answer "
                f"({what}); check the model (infeasible / unbounded for these costs) or raise "
                "time_limit / node_limit.",
                status=status[missing[0]],
            )
        if self.on_failure == "nan":
            out[[i for i, s in enumerate(status) if s is not Status.SOLVED]] = np.nan
        elif loose:
            handle_failure(
                self.on_failure,
                f"MILPOracle: {len(loose)} of {len(status)} answers are not proven optimal "
                f"({what}); they are incumbents (time/node limit) or within mip_rel_gap; raise "
                "the limits or set mip_rel_gap=0 for exact answers.",
                error=OracleError,
                status=status[loose[0]],
                stacklevel=5,
            )

    def solve(self, c: Tensor) -> MILPSolution:
        """Solve like ``oracle(c)`` and return the answers with their per-sample objectives,
        dual bounds, gaps, node counts and statuses."""
        before = self.cost
        x = self(c)
        after = self.cost
        cost = Cost(
            forwards=after.forwards - before.forwards, seconds=after.seconds - before.seconds
        )
        shape = c.shape[:-1]
        info = {k: torch.from_numpy(v).reshape(shape) for k, v in self._info.items()}
        return MILPSolution(x=x, status=self.last_status, cost=cost, **info)

    def __getstate__(self) -> dict[str, Any]:
        return {"kwargs": self._kwargs(), "pool": self._pool}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["kwargs"])  # type: ignore[misc]
        self._pool = state["pool"]
