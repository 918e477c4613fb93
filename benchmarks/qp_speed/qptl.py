"""The QPTL shortest-path case of ``dxopt bench qp_speed`` (issue 30).

QPTL (Wilder, Dilkina & Tambe, arXiv 1809.05504) smooths the shortest-path LP on PyEPO's
5 x 5 grid with a small quadratic term: :math:`\\min_x \\tfrac{\\varepsilon}{2}\\|x\\|^2 +
\\hat c^\\top x` subject to flow conservation :math:`Ax = b` (the node-arc incidence matrix of
the grid DAG with right and down moves: 25 nodes, 40 arcs; one unit from the top-left node to
the bottom-right one) and :math:`0 \\le x \\le 1`. Every such QP is degenerate by structure: a
node whose arcs all sit at a bound has a conservation row that depends on those bound rows.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from dxopt.qp import QPDegenerateWarning

__all__ = ["CASE", "grid_incidence", "qptl_batch", "run_qptl"]


def grid_incidence(side: int = 5, *, drop_last: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(A, b)``: flow conservation on the ``side x side`` grid DAG (arcs right, then down,
    in row-major node order; ``A[v, a]`` is +1 where arc ``a`` leaves ``v``, -1 where it
    enters), supply 1 at the top-left node and demand 1 at the bottom-right one.
    ``drop_last`` drops the (redundant) row of the sink node."""
    arcs = []
    for r in range(side):
        for c in range(side):
            v = r * side + c
            if c + 1 < side:
                arcs.append((v, v + 1))
            if r + 1 < side:
                arcs.append((v, v + side))
    A = np.zeros((side * side, len(arcs)))
    for a, (tail, head) in enumerate(arcs):
        A[tail, a], A[head, a] = 1.0, -1.0
    b = np.zeros(side * side)
    b[0], b[-1] = 1.0, -1.0
    return (A[:-1], b[:-1]) if drop_last else (A, b)


def qptl_batch(
    batch: int = 32, *, eps: float = 0.1, seed: int = 0, drop_last: bool = True
) -> dict[str, torch.Tensor]:
    """One QPTL batch: ``P = eps I``, ``q`` (``batch``, 40) positive random costs (PyEPO-like:
    a unit-mean positive spread), shared ``A, b`` and the box ``lb = 0, ub = 1``."""
    A, b = grid_incidence(drop_last=drop_last)
    n = A.shape[1]
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.1, 2.0, size=(batch, n))
    f64 = torch.float64
    return {
        "P": eps * torch.eye(n, dtype=f64),
        "q": torch.tensor(q, dtype=f64),
        "A": torch.tensor(A, dtype=f64),
        "b": torch.tensor(b, dtype=f64),
        "lb": torch.zeros(n, dtype=f64),
        "ub": torch.ones(n, dtype=f64),
    }


CASE = "QPTL shortest path 5x5, batch 32"
TARGET = 2.0  # issue 30: backward <= 2x forward


VARIANTS = (  # (drop the sink's redundant row, b requires grad, case label)
    (True, False, CASE),
    (False, False, CASE + " (all 25 flow rows)"),
    (True, True, CASE + ", b requires grad (row gradients)"),
)


def run_qptl(threads: int, rounds: int) -> list[dict[str, Any]]:
    """Rows of the QPTL case at ``threads`` torch threads: ``dxopt auto`` forward and
    forward+backward (``L = sum(w * x)``, gradient for ``q``, the DFL layer's input), timed
    interleaved by :func:`benchmarks.qp_speed.run._rounds`; ``note`` has backward/forward
    (backward = fwd+bwd - fwd). Three variants (:data:`VARIANTS`): ``A`` without the sink's
    redundant row, all 25 rows (dependent equality rows too), and ``b`` requiring grad as
    well (the row gradients of a prediction entering the constraints: the degenerate vertex
    rule runs on every sample)."""
    from benchmarks.qp_speed.run import _rounds

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    try:
        fns: dict[str, Any] = {}
        for drop, grad_b, case in VARIANTS:
            d = qptl_batch(32, drop_last=drop)
            w = torch.from_numpy(np.random.default_rng(1).standard_normal((32, d["q"].shape[1])))
            fns[f"{case} fwd"] = _call(d, w, backward=False, grad_b=grad_b)
            fns[f"{case} fwd+bwd"] = _call(d, w, backward=True, grad_b=grad_b)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", QPDegenerateWarning)
            if rounds == 1:  # _rounds warms up only for more rounds: one-time costs first
                for fn in fns.values():
                    fn()
            secs, _, _ = _rounds(fns, rounds)
    finally:
        torch.set_num_threads(previous)
    for _, _, case in VARIANTS:
        fwd, both = secs[f"{case} fwd"], secs[f"{case} fwd+bwd"]
        ratio = (both - fwd) / fwd
        rows.append({
            "case": case,
            "threads": threads,
            "method": "dxopt auto",
            "forward_ms": 1e3 * fwd,
            "fwd_bwd_ms": 1e3 * both,
            "bwd_over_fwd": ratio,
            "note": f"backward/forward {ratio:.2f}",
        })  # fmt: skip
    return rows


def _call(
    d: dict[str, torch.Tensor], w: torch.Tensor, *, backward: bool, grad_b: bool = False
) -> Any:
    import dxopt.qp as dqp

    def run() -> Any:
        q = d["q"].clone().requires_grad_(backward)
        b = d["b"]
        if grad_b:  # one right-hand side per sample, as a predicted demand would be
            b = b.expand(q.shape[0], -1).clone().requires_grad_(backward)
        sol = dqp.solve(d["P"], q, A=d["A"], b=b, lb=d["lb"], ub=d["ub"])
        if backward:
            (w * sol.x).sum().backward()
            return sol.x.detach(), q.grad, b.grad
        return sol.x, None

    return run
