"""The methods compared by the QP benchmark, each timed forward and backward separately.

Every ``run_<method>`` takes a list of problems (length 1 unless batched) and the loss
cotangent ``w`` (``L = sum(w * x*)``), and returns ``(timings, grads)``: ``timings`` holds
median forward/backward seconds (and build seconds where a method compiles the problem),
``grads`` the numpy gradients of ``L`` with respect to ``q, h, b`` (and ``G, A`` when
``matrices``) plus ``x``. Peers: dxopt (penalty and KKT backward), qpth (Amos & Kolter,
arXiv 1703.00443), cvxpylayers (Agrawal et al., arXiv 1910.12430), raw qpsolvers solves and
one dense Cholesky as physical reference points. A missing package raises
:class:`PeerUnavailable`, which the worker records as "not installed".
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from benchmarks.qp.generators import QPProblem

Grads = dict[str, np.ndarray]
Once = Callable[[], tuple[float, float, Grads]]

RAW_SOLVER_OPTIONS: dict[str, dict[str, Any]] = {
    "daqp": {},
    "piqp": {"eps_abs": 1e-9, "eps_rel": 0.0},
    "proxqp": {"eps_abs": 1e-9, "eps_rel": 0.0},
    "clarabel": {"tol_gap_abs": 1e-9, "tol_gap_rel": 0.0, "tol_feas": 1e-9},
    "osqp": {"eps_abs": 1e-9, "eps_rel": 0.0, "max_iter": 20000},
}


class PeerUnavailable(RuntimeError):
    """The peer's package is not installed."""


def measure(once: Once, *, repeats: int = 3, slow_s: float = 60.0) -> tuple[dict, Grads]:
    """Median forward/backward seconds of ``once`` (see the module docstring).

    The first call is an untimed warm-up (one-time costs: imports, compiled kernels, fresh
    memory), recorded as ``first_s`` (forward plus backward); a call over ``slow_s`` is not
    repeated (a first call over ``slow_s`` is then the only run).
    """
    fwd, bwd, grads = once()
    first = fwd + bwd
    runs: list[tuple[float, float]] = [] if first < slow_s else [(fwd, bwd)]
    while len(runs) < repeats and fwd + bwd < slow_s:
        fwd, bwd, grads = once()
        runs.append((fwd, bwd))
    timings = {
        "forward_s": statistics.median(r[0] for r in runs),
        "backward_s": statistics.median(r[1] for r in runs),
        "runs": len(runs),
        "first_s": first,
    }
    return timings, grads


def _torch_inputs(probs: list[QPProblem], *, matrices: bool, sparse_torch: bool) -> dict:
    import torch

    def dense(mat: Any) -> np.ndarray:
        return mat.toarray() if sp.issparse(mat) else np.asarray(mat)

    def tensor(key: str, grad: bool) -> Any:
        vals = [getattr(p, key) for p in probs]
        if vals[0] is None:
            return None
        if sp.issparse(vals[0]) and sparse_torch and len(probs) == 1:
            csr = sp.csr_matrix(vals[0])
            t = torch.sparse_csr_tensor(
                torch.from_numpy(csr.indptr.astype(np.int64)),
                torch.from_numpy(csr.indices.astype(np.int64)),
                torch.from_numpy(csr.data.astype(np.float64)),
                size=csr.shape,
            )
        else:
            arr = np.stack([dense(v) for v in vals]) if len(probs) > 1 else dense(vals[0])
            t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))
        return t.requires_grad_(grad)

    return {
        "P": tensor("P", False),
        "q": tensor("q", True),
        "A": tensor("A", matrices),
        "b": tensor("b", True),
        "G": tensor("G", matrices),
        "h": tensor("h", True),
    }


def _collect(inputs: dict, x: Any, batched: bool) -> Grads:
    out: Grads = {"x": x.detach().numpy().copy()}
    for key in ("q", "h", "b", "G", "A"):
        t = inputs.get(key)
        if t is not None and t.requires_grad and t.grad is not None:
            g = t.grad
            out[key] = (g.to_dense() if g.is_sparse else g).numpy().copy()
    return out


def _reset(inputs: dict) -> None:
    for t in inputs.values():
        if t is not None:
            t.grad = None


def run_dxopt(
    probs: list[QPProblem], w: np.ndarray, *, backward: str, matrices: bool, solver: str
) -> tuple[dict, Grads]:
    """dxopt's ``qp.solve`` with the ``penalty`` or ``kkt`` backward."""
    import torch

    import dxopt.qp as dqp

    inputs = _torch_inputs(probs, matrices=matrices, sparse_torch=probs[0].sparse)
    w_t = torch.from_numpy(np.asarray(w, dtype=np.float64))
    info: dict[str, Any] = {}

    def once() -> tuple[float, float, Grads]:
        _reset(inputs)
        t0 = time.perf_counter()
        sol = dqp.solve(
            inputs["P"], inputs["q"], A=inputs["A"], b=inputs["b"], G=inputs["G"],
            h=inputs["h"], backward=backward, solver=solver,
        )  # fmt: skip
        t1 = time.perf_counter()
        (w_t * sol.x).sum().backward()
        t2 = time.perf_counter()
        info["info"] = repr(getattr(sol, "info", None))[:400]
        return t1 - t0, t2 - t1, _collect(inputs, sol.x, len(probs) > 1)

    timings, grads = measure(once)
    timings.update(info)
    return timings, grads


def run_qpth(probs: list[QPProblem], w: np.ndarray, *, matrices: bool) -> tuple[dict, Grads]:
    """qpth's batched primal-dual interior point QPFunction (dense only)."""
    try:
        from qpth.qp import QPFunction
    except ImportError as exc:
        raise PeerUnavailable("qpth") from exc
    import torch

    inputs = _torch_inputs(probs, matrices=matrices, sparse_torch=False)
    empty = torch.empty(0, dtype=torch.float64)
    w_t = torch.from_numpy(np.asarray(w, dtype=np.float64))

    def once() -> tuple[float, float, Grads]:
        _reset(inputs)
        t0 = time.perf_counter()
        args = [inputs[k] if inputs[k] is not None else empty for k in ("P", "q", "G", "h")]
        args += [inputs[k] if inputs[k] is not None else empty for k in ("A", "b")]
        x = QPFunction(verbose=-1)(*args)
        if len(probs) == 1:
            x = x.reshape(-1)
        t1 = time.perf_counter()
        (w_t * x).sum().backward()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, _collect(inputs, x, len(probs) > 1)

    return measure(once)


def run_cvxpylayers(prob: QPProblem, w: np.ndarray, *, matrices: bool) -> tuple[dict, Grads]:
    """cvxpylayers with Clarabel; the DPP compilation is timed separately as ``build_s``."""
    try:
        import cvxpy as cp
        from cvxpylayers.torch import CvxpyLayer
    except ImportError as exc:
        raise PeerUnavailable("cvxpylayers") from exc
    import torch

    t_build = time.perf_counter()
    x = cp.Variable(prob.n)
    params: list[Any] = [cp.Parameter(prob.n)]
    values: list[np.ndarray] = [prob.q]
    keys = ["q"]
    cons = []
    P = prob.P
    objective = 0.5 * cp.quad_form(x, cp.psd_wrap(P)) + params[0] @ x
    for mat_key, vec_key, is_eq in (("A", "b", True), ("G", "h", False)):
        mat, vec = getattr(prob, mat_key), getattr(prob, vec_key)
        if mat is None:
            continue
        vec_p = cp.Parameter(vec.size)
        if matrices:
            mat_p = cp.Parameter(mat.shape)
            params.append(mat_p)
            values.append(np.asarray(mat.toarray() if sp.issparse(mat) else mat))
            keys.append(mat_key)
            lhs = mat_p @ x
        else:
            lhs = mat @ x
        params.append(vec_p)
        values.append(vec)
        keys.append(vec_key)
        cons.append(lhs == vec_p if is_eq else lhs <= vec_p)
    problem = cp.Problem(cp.Minimize(objective), cons)
    layer = CvxpyLayer(
        problem, parameters=params, variables=[x], solver="DIFFCP",
        solver_args={"solve_method": "Clarabel"},
    )  # fmt: skip
    build_s = time.perf_counter() - t_build
    tensors = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values]
    inputs = dict(zip(keys, tensors))
    w_t = torch.from_numpy(np.asarray(w, dtype=np.float64))

    def once() -> tuple[float, float, Grads]:
        _reset(inputs)
        t0 = time.perf_counter()
        (x_t,) = layer(*tensors)
        t1 = time.perf_counter()
        (w_t * x_t).sum().backward()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, _collect(inputs, x_t, False)

    timings, grads = measure(once)
    timings["build_s"] = build_s
    return timings, grads


def run_raw(prob: QPProblem, *, solver: str) -> tuple[dict, Grads]:
    """One raw ``qpsolvers`` solve without differentiation (same tolerance as dxopt)."""
    import qpsolvers

    if solver not in qpsolvers.available_solvers:
        raise PeerUnavailable(solver)
    problem = qpsolvers.Problem(prob.P, prob.q, prob.G, prob.h, prob.A, prob.b)
    found: list[bool] = []

    def once() -> tuple[float, float, Grads]:
        t0 = time.perf_counter()
        sol = qpsolvers.solve_problem(problem, solver=solver, **RAW_SOLVER_OPTIONS[solver])
        found.append(bool(sol.found))
        x = np.full(prob.n, np.nan) if sol.x is None else np.asarray(sol.x)
        return time.perf_counter() - t0, 0.0, {"x": x}

    timings, grads = measure(once)
    timings["backward_s"] = None
    timings["found"] = all(found)
    return timings, grads


def run_raw_loop(probs: list[QPProblem], *, solver: str) -> tuple[dict, Grads]:
    """A plain Python loop of raw qpsolvers solves over a batch."""
    import qpsolvers

    problems = [qpsolvers.Problem(p.P, p.q, p.G, p.h, p.A, p.b) for p in probs]

    def once() -> tuple[float, float, Grads]:
        t0 = time.perf_counter()
        xs = [qpsolvers.solve_problem(pr, solver=solver, **RAW_SOLVER_OPTIONS[solver]).x
              for pr in problems]  # fmt: skip
        x = np.stack([np.full(p.n, np.nan) if v is None else v for p, v in zip(probs, xs)])
        return time.perf_counter() - t0, 0.0, {"x": x}

    timings, grads = measure(once)
    timings["backward_s"] = None
    return timings, grads


def run_cholesky(probs: list[QPProblem]) -> tuple[dict, Grads]:
    """One dense Cholesky of the (batched) n x n objective matrix, in torch float64."""
    import torch

    P = np.stack([p.P.toarray() if sp.issparse(p.P) else p.P for p in probs])
    P_t = torch.from_numpy(P if len(probs) > 1 else P[0])

    def once() -> tuple[float, float, Grads]:
        t0 = time.perf_counter()
        torch.linalg.cholesky(P_t)
        return time.perf_counter() - t0, 0.0, {}

    timings, grads = measure(once, repeats=5)
    timings["backward_s"] = None
    return timings, grads
