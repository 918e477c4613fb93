"""dxopt's side of the Maros-Meszaros benchmark: one forward and one backward, as a new user
would call it (torch sparse CSR matrices, default options), with the loss ``L = w . x*``."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from benchmarks.qp.mm_problems import MMProblem, accepted, loss_weights, residuals


def _csr(M: sp.spmatrix) -> Any:
    import torch

    c = sp.csr_matrix(M)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(c.indptr.astype(np.int64)),
            torch.from_numpy(c.indices.astype(np.int64)),
            torch.from_numpy(c.data.astype(np.float64)),
            size=c.shape,
            check_invariants=False,  # scipy's CSR is valid; says so (no warning per call)
        )


def _plain(obj: Any) -> Any:
    """A JSON-friendly copy of dxopt's info/diagnostics objects (whatever fields they have)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "value") and hasattr(obj, "name"):  # enums
        return str(obj.value)
    if isinstance(obj, (int, float, str, bool)) or obj is None:
        return obj
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return repr(obj)[:200]


def run_dxopt(
    prob: MMProblem,
    seed: int,
    *,
    accept_tol: float,
    repeats: int = 3,
    on_forward: Callable[[dict], None] | None = None,
) -> dict:
    """Forward (best of up to ``repeats`` runs when one is < 1 s) and one backward of dxopt.

    Returns ``status`` (``"ok"``, ``"forward failed"``, ``"refused"``, ``"not convex"``: the
    forward refused an indefinite ``P`` with ``NotPSDError``, or ``"error"``), the
    forward time, dxopt's per-sample status and info, the acceptance residuals of its solution,
    the gradients of ``L`` w.r.t. ``q, h, b``, the warnings it raised and the CPU seconds of
    the last forward and of the backward (``forward_cpu_s``, ``backward_cpu_s``: on a shared
    machine the wall times grow with the load, these much less). ``on_forward`` receives a
    copy of the record once the forward is done (the runner keeps it in case the backward
    runs out of time).
    """
    import torch

    import dxopt.qp as dqp

    torch.set_num_threads(1)
    P = _csr(prob.P)
    G = None if prob.G is None else _csr(prob.G)
    A = None if prob.A is None else _csr(prob.A)
    w = torch.from_numpy(loss_weights(prob, seed))
    out: dict[str, Any] = {"status": "ok"}
    caught: list[str] = []
    times: list[float] = []
    sol = None
    q = h = b = None
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        try:
            for _ in range(repeats):
                q = torch.tensor(prob.q, requires_grad=True)
                h = None if prob.h is None else torch.tensor(prob.h, requires_grad=True)
                b = None if prob.b is None else torch.tensor(prob.b, requires_grad=True)
                t0, c0 = time.perf_counter(), time.process_time()
                sol = dqp.solve(P, q, A=A, b=b, G=G, h=h)
                times.append(time.perf_counter() - t0)
                out["forward_cpu_s"] = time.process_time() - c0
                if times[-1] > 1.0:
                    break
        except dqp.QPSolveError as exc:
            out.update(status="forward failed", error=str(exc)[:300])
        except Exception as exc:
            kind = type(exc).__name__
            # a non-convex P is refused by design (a clear NotPSDError), not a failure to solve
            status = "not convex" if kind == "NotPSDError" else "error"
            out.update(status=status, error=f"forward {kind}: {str(exc)[:300]}")
        caught += [f"{r.category.__name__}: {str(r.message)[:200]}" for r in record]
    if sol is None:
        out["warnings"] = sorted(set(caught))
        if times:
            out["forward_s"] = min(times)
        return out
    out["forward_s"] = min(times)
    out["qp_status"] = [str(s.value) for s in sol.status]
    out["info"] = _plain(sol.info)
    x = sol.x.detach().numpy().copy()
    y = None if sol.eq_duals is None else sol.eq_duals.detach().numpy()
    z = None if sol.ineq_duals is None else sol.ineq_duals.detach().numpy()
    res = residuals(prob, x, y, z)
    out.update(x=x, residuals=res, accepted=accepted(res, accept_tol))
    if on_forward is not None:
        on_forward(dict(out, warnings=sorted(set(caught))))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            (w * sol.x).sum().backward()
            out["backward_s"] = time.perf_counter() - t0
            out["backward_cpu_s"] = time.process_time() - c0
        except dqp.QPBackwardError as exc:
            out.update(status="refused", error=str(exc)[:300])
        except Exception as exc:
            out.update(status="error", error=f"backward {type(exc).__name__}: {str(exc)[:300]}")
        caught += [f"{r.category.__name__}: {str(r.message)[:200]}" for r in record]
    out["warnings"] = sorted(set(caught))
    out["degenerate_warning"] = any("Degenerate" in c for c in caught)
    out["backward_info"] = _plain(sol.info.backward)
    if out["status"] == "ok":
        grads = {}
        for key, t in (("q", q), ("h", h), ("b", b)):
            if t is not None:
                g = t.grad
                grads[key] = np.zeros(t.shape) if g is None else g.detach().numpy().copy()
        out["grads"] = grads
        if not all(np.isfinite(g).all() for g in grads.values()):
            out["status"] = "refused"
            out["error"] = "non-finite gradient (flagged NaN)"
    return out
