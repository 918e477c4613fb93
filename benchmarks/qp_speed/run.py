"""Fixed per-call cost of :func:`dxopt.qp.solve` against the raw solvers (issue 10).

Everything runs in one process, side by side, with ``torch.set_num_threads`` set explicitly for
each thread count; within a case the methods are interleaved round by round (so machine load
hits them alike), in a new seeded random order each round (so that no method always runs right
after the same one: in a fixed order the ``dxopt daqp`` and ``dxopt auto`` rows of the tiny case,
the same code path, came out 5-12% apart by their places), and the median of the rounds is
reported. A method faster than 50 ms per call is timed after one untimed lead-in call
(faster than 5 ms: as a block of calls), whose time after the previous method's work (caches
evicted by the torch solver's and qpth's rows) is reported apart, as ``cold_call_ms``.
Problems are dQP's random dense QPs (:func:`benchmarks.qp.generators.random_dense`,
``m = n``, ``p = n/2`` unless given). Methods:

- ``raw daqp (qpsolvers)``: a Python loop of ``qpsolvers.solve_problem(..., solver="daqp")``
  (default settings), forward only: the unit of the ratios;
- ``raw daqp (direct)``: a loop of ``daqp.solve`` calls on prebuilt arrays, forward only;
- ``dxopt daqp``: :func:`dxopt.qp.solve` with ``solver="daqp"`` (validation, certificate,
  polish where needed), forward, and forward plus the backward of ``L = sum(w * x)`` with
  gradients for ``q, h, b`` (the inputs a decision-focused model learns);
- ``dxopt auto``: the same with the default ``solver="auto"`` (for a batch of small dense
  problems on the CPU: the compiled dual active-set solver of
  :mod:`dxopt.qp.solvers.dual_active_set`, daqp for any sample it does not solve; one problem:
  daqp);
- ``dxopt torch``: the same with ``solver="torch"`` (the batched torch interior point);
- ``qpth``: qpth's batched interior point (Amos & Kolter, arXiv 1703.00443), forward+backward,
  when it is importable (``make bench-peers``).

Cases: one tiny QP (n = 10, m = 5, no equalities), batch 128 x n=50 (m = 50, p = 25) of
dQP's problems and of :mod:`benchmarks.qp_speed.illcond`'s (ill-conditioned ``P``, dense
positive ``G``, a few active rows; the same 1.0 target), and
batches 1024 x n=20 and 1024 x n=100, each at every ``--threads`` count; the QPTL shortest
path 5x5, batch 32 (:mod:`benchmarks.qp_speed.qptl`: a degenerate QP by structure; its row
reports backward/forward, target <= 2, issue 30); plus the dense
n = 1000/2000 rows of :mod:`benchmarks.qp_speed.dense` when that module exists. ``x_err`` is
``max |x - x_raw|``; ``grad_err`` the relative error of dxopt's ``(q, h, b)`` gradient against the
exact reduced-KKT reference (:mod:`benchmarks.qp.reference`) on the first samples.

Run ``dxopt bench qp_speed [--threads 1 2]`` (full: a few minutes) or ``--quick`` (tiny case
and 16 x n=20 at the first thread count, < 30 s). Writes ``results/qp_speed{_quick}.json``,
``.md``, ``.png``; the full run replaces the ``qp_speed`` section of BENCHMARKS.md
(``--no-md`` to skip).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import (
    SMOKE_NOTE,
    fmt,
    machine_info,
    machine_line,
    markdown_table,
    publish,
    results_dir,
    smoke_verdicts,
    write_json,
)
from benchmarks.qp.generators import QPProblem, random_dense
from benchmarks.qp_speed.qptl import CASE as QPTL_CASE
from benchmarks.qp_speed.qptl import TARGET as QPTL_TARGET
from benchmarks.qp_speed.qptl import run_qptl

COMMAND = "dxopt bench qp_speed"
TINY_TARGET = 10.0  # tiny fwd+bwd over the raw qpsolvers daqp solve
BATCH_TARGET = 1.0  # 128 x n=50 fwd+bwd (best solver) over the raw qpsolvers daqp loop (issue 38)
ILL_CASE = "128 x n=50 ill-conditioned"  # the same target on benchmarks.qp_speed.illcond's kind
COLUMNS = (
    "case",
    "threads",
    "method",
    "forward_ms",
    "fwd_bwd_ms",
    "cold_call_ms",
    "x_raw",
    "x_err",
    "grad_err",
    "note",
)
GRAD_KEYS = ("q", "h", "b")


def _problems(batch: int, n: int, m: int, p: int, kind: str = "") -> list[QPProblem]:
    """dQP's random problems, or with ``kind="ill-conditioned"`` those of
    :mod:`benchmarks.qp_speed.illcond`."""
    if kind:
        from benchmarks.qp_speed.illcond import ill_conditioned

        return [ill_conditioned(n, seed=i, m=m, p=p) for i in range(batch)]
    return [random_dense(n, seed=i, m=m, p=p) for i in range(batch)]


def _stack(probs: list[QPProblem], key: str, batched: bool) -> Any:
    import torch

    vals = [getattr(pr, key) for pr in probs]
    if vals[0] is None:
        return None
    arr = np.stack(vals) if batched else vals[0]
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))


def _numpy(out: tuple[Any, dict[str, Any]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A method's ``(x, grads)`` (tensors) as numpy, for the error columns."""
    x, grads = out
    return np.asarray(x), {k: np.asarray(g) for k, g in grads.items()}


class Case:
    """The callables of one case: each returns ``(x, grads)`` after one forward (and backward)."""

    def __init__(self, probs: list[QPProblem], w: np.ndarray) -> None:
        import torch

        self.probs = probs
        self.batched = len(probs) > 1
        self.inputs = {k: _stack(probs, k, self.batched) for k in ("P", "q", "A", "b", "G", "h")}
        self.w = torch.from_numpy(w if self.batched else w[0])

    def raw_qpsolvers(self) -> Callable[[], Any]:
        import qpsolvers

        problems = [qpsolvers.Problem(p.P, p.q, p.G, p.h, p.A, p.b) for p in self.probs]

        def run() -> Any:
            return np.stack([qpsolvers.solve_problem(pr, solver="daqp").x for pr in problems])

        return run

    def raw_direct(self) -> Callable[[], Any]:
        import daqp

        calls = []
        for pr in self.probs:
            blocks = [M for M in (pr.G, pr.A) if M is not None]
            C = np.concatenate(blocks) if blocks else np.zeros((0, pr.n))
            upper = np.concatenate([v for v in (pr.h, pr.b) if v is not None])
            lower = np.full(upper.size, -1e30)
            sense = np.zeros(upper.size, dtype=np.intc)
            sense[pr.m :] = 5
            calls.append((pr.P, pr.q, C, upper, lower, sense))

        def run() -> Any:
            return np.stack([daqp.solve(*c)[0] for c in calls])

        return run

    def leaves(self, grad: bool) -> dict[str, Any]:
        """The inputs, those in ``GRAD_KEYS`` as leaf tensors of their own that require grad
        (with ``grad``): made once per method, their ``.grad`` reset before each call (as an
        optimizer's ``zero_grad`` does) instead of a clone per input per call (some 1.5 us
        each, 5% of the tiny case's fwd+bwd, and not the layer's work)."""
        return {
            k: (v if v is None or k not in GRAD_KEYS else v.clone().requires_grad_(grad))
            for k, v in self.inputs.items()
        }

    def dxopt(self, solver: str, backward: bool) -> Callable[[], Any]:
        import dxopt.qp as dqp

        ins = self.leaves(backward)
        args = tuple(ins[k] for k in ("P", "q", "A", "b", "G", "h"))
        grad_leaves = [(k, ins[k]) for k in GRAD_KEYS if ins[k] is not None]

        def run() -> Any:
            for _, t in grad_leaves:
                t.grad = None
            sol = dqp.solve(**dict(zip("PqAbGh", args)), solver=solver)
            if not backward:
                return sol.x, {}
            (self.w * sol.x).sum().backward()
            return sol.x.detach(), {k: t.grad for k, t in grad_leaves if t.grad is not None}

        return run

    def qpth(self) -> Callable[[], Any] | None:
        try:
            from qpth.qp import QPFunction
        except ImportError:
            return None
        import torch

        ins = self.leaves(True)
        empty = torch.empty(0, dtype=torch.float64)
        args = [ins[k] if ins[k] is not None else empty for k in ("P", "q", "G", "h", "A", "b")]
        grad_leaves = [(k, ins[k]) for k in GRAD_KEYS if ins[k] is not None]

        def run() -> Any:
            for _, t in grad_leaves:
                t.grad = None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                x = QPFunction(verbose=-1)(*args)
            x = x if self.batched else x.reshape(-1)
            (self.w * x).sum().backward()
            return x.detach(), {k: t.grad for k, t in grad_leaves if t.grad is not None}

        return run


_MIN_BLOCK_S = 0.005  # time blocks of calls of at least 5 ms
_LEAD_IN_S = 0.05  # a lead-in call before the timed call(s) of a method faster than this


def _rounds(
    fns: dict[str, Callable[[], Any]], rounds: int
) -> tuple[dict[str, float], dict, dict[str, float]]:
    """Median seconds per call of each method over ``rounds`` interleaved rounds after a
    warm-up (none when ``rounds == 1``); also the last output of each method. The warm-up
    calls each method once (one-time costs: imports, compiled kernels, caches), then
    back-to-back for at least ``_MIN_BLOCK_S``; a method whose calls there took under
    ``_MIN_BLOCK_S`` on average is timed per round as a block of that many calls that lasts at
    least ``_MIN_BLOCK_S`` (divided by their number): a single 20 us call timed right after
    another method's work measures that work's aftermath (caches, allocator, threads), not the
    call itself. The block size comes from the mean of the warm-up calls, not from one call,
    so that one slow call (a cold cache after the previous method) cannot shrink a block to a
    fraction of ``_MIN_BLOCK_S`` and let that block's cold first call weigh more than other
    methods' (it measured 9 calls of 0.11 ms where 46 were due). Each round takes the methods
    in a new order (seeded: the same orders in every run), and each block starts with one
    lead-in call, timed apart: the first call after another method's work pays for that work's
    aftermath (caches evicted: 0.36 ms against 0.085 ms for the tiny case's fwd+bwd after the
    torch solver's and qpth's rows, 0.2 against 0.01 ms for the raw solve), and a block of
    some 50 calls that starts with it carries a tenth of it per call, more or less as the order
    falls (from 9.2 to 10.4 times the raw solve for the same code). Returns the median
    per-call seconds, the last outputs, and the median lead-in seconds (``cold``) of the
    methods faster than ``_LEAD_IN_S`` per call, which get the lead-in call whether timed in
    blocks or by single calls (a batch's workspace of some MB is evicted too: the 128 x n=50
    case's fwd+bwd, 10-17 ms, moved by a third with its place); the slower ones are timed by
    single calls without lead-in (there the aftermath is a few percent, and a second call of
    qpth at 1024 x n=100 would cost 18 s a round)."""
    outs: dict[str, Any] = {}
    repeat = dict.fromkeys(fns, 1)
    lead: set[str] = set()  # a lead-in call before the timed call(s)
    if rounds > 1:
        for name, fn in fns.items():
            fn()  # first call: one-time costs (imports, compilation of kernels, caches)
            calls, t0 = 0, time.perf_counter()
            while True:
                outs[name] = fn()
                calls += 1
                spent = time.perf_counter() - t0
                if spent >= _MIN_BLOCK_S:
                    break
            repeat[name] = max(1, min(1000, math.ceil(_MIN_BLOCK_S * calls / spent)))
            if spent / calls < _LEAD_IN_S:
                lead.add(name)
    times: dict[str, list[float]] = {name: [] for name in fns}
    cold: dict[str, list[float]] = {name: [] for name in lead}
    order, shuffle = list(fns), random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            fn, k = fns[name], repeat[name]
            if name in lead:
                t0 = time.perf_counter()
                outs[name] = fn()
                cold[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(k):
                outs[name] = fn()
            times[name].append((time.perf_counter() - t0) / k)
    median = statistics.median
    return (
        {k: median(v) for k, v in times.items()},
        outs,
        {k: median(v) for k, v in cold.items()},
    )


def _grad_error(grads: dict, probs: list[QPProblem], w: np.ndarray, k: int) -> float | None:
    from benchmarks.qp.reference import reference_grads

    if not grads:
        return None
    num = den = 0.0
    for i, pr in enumerate(probs[:k]):
        ref = reference_grads(pr, w[i], matrices=False)[0]
        for key in GRAD_KEYS:
            if key in grads and key in ref:
                g = grads[key][i] if len(probs) > 1 else grads[key]
                num += float(np.sum((g - ref[key]) ** 2))
                den += float(np.sum(ref[key] ** 2))
    return float(np.sqrt(num / den)) if den else None


def run_case(
    batch: int,
    n: int,
    m: int,
    p: int,
    threads: int,
    rounds: int,
    *,
    qpth: bool = True,
    kind: str = "",
) -> list[dict[str, Any]]:
    """Rows of one case at ``threads`` torch threads (see the module docstring; ``kind``:
    :func:`_problems`)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        probs = _problems(batch, n, m, p, kind)
        w = np.random.default_rng(1).standard_normal((batch, n))
        case = Case(probs, w)
        fns: dict[str, Callable[[], Any]] = {
            "raw daqp (qpsolvers)": case.raw_qpsolvers(),
            "raw daqp (direct)": case.raw_direct(),
            "dxopt daqp fwd": case.dxopt("daqp", False),
            "dxopt daqp fwd+bwd": case.dxopt("daqp", True),
            "dxopt auto fwd": case.dxopt("auto", False),
            "dxopt auto fwd+bwd": case.dxopt("auto", True),
            "dxopt torch fwd+bwd": case.dxopt("torch", True),
        }
        peer = case.qpth() if qpth else None
        if peer is not None:
            fns["qpth fwd+bwd"] = peer
        secs, outs, cold = _rounds(fns, rounds)
    finally:
        torch.set_num_threads(previous)
    raw_s = secs["raw daqp (qpsolvers)"]
    x_raw = np.asarray(outs["raw daqp (qpsolvers)"]).reshape(batch, n)
    name = f"{batch} x n={n}" if batch > 1 else f"tiny n={n}, m={m}"
    name += f" {kind}" if kind else ""
    rows: list[dict[str, Any]] = []
    for method in (
        "raw daqp (qpsolvers)",
        "raw daqp (direct)",
        "dxopt daqp",
        "dxopt auto",
        "dxopt torch",
        "qpth",
    ):
        row: dict[str, Any] = {"case": name, "threads": threads, "method": method}
        timed = method if method.startswith("raw") else f"{method} fwd+bwd"
        if timed in cold:
            row["cold_call_ms"] = 1e3 * cold[timed]
        if method.startswith("raw"):
            row["forward_ms"] = 1e3 * secs[method]
            x = np.asarray(outs[method]).reshape(batch, n)
        elif method in ("dxopt daqp", "dxopt auto"):
            row["forward_ms"] = 1e3 * secs[f"{method} fwd"]
            row["fwd_bwd_ms"] = 1e3 * secs[f"{method} fwd+bwd"]
            x, grads = _numpy(outs[f"{method} fwd+bwd"])
            row["grad_err"] = _grad_error(grads, probs, w, 4)
        else:
            key = f"{method} fwd+bwd"
            if key not in secs:
                rows.append({**row, "note": "not installed (make bench-peers)"})
                continue
            row["fwd_bwd_ms"] = 1e3 * secs[key]
            x, grads = _numpy(outs[key])
            row["grad_err"] = _grad_error(grads, probs, w, 4)
        total = row.get("fwd_bwd_ms", row.get("forward_ms"))
        row["x_raw"] = total / (1e3 * raw_s)
        row["x_err"] = float(np.abs(np.asarray(x).reshape(batch, n) - x_raw).max())
        rows.append(row)
    return rows


def _dense_rows(threads: list[int], quick: bool) -> tuple[list[dict[str, Any]], str]:
    try:
        from benchmarks.qp_speed.dense import run_dense  # written with the backward work
    except ImportError:
        return [], "the dense n = 1000/2000 rows (benchmarks/qp_speed/dense.py) are not present"
    rows = []
    for t in threads:
        rows += run_dense(threads=t, quick=quick)
    return (smoke_verdicts(rows) if quick else rows), ""


def targets(rows: list[dict[str, Any]], *, quick: bool = False) -> list[dict[str, Any]]:
    """The issue-10 targets this benchmark measures, MET or MISSED with the figure (no
    verdicts in a ``--quick`` smoke run)."""
    out = _targets(rows)
    return smoke_verdicts(out) if quick else out


def _targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if r["threads"] != 1:
            continue
        if r["case"].startswith("tiny") and r["method"] == "dxopt daqp":
            out.append(_target("tiny n=10: dxopt fwd+bwd / raw daqp", r["x_raw"], TINY_TARGET))
    kinds = [r for r in rows if r["threads"] == 1 and r["case"] == ILL_CASE]
    best = [r for r in kinds if r["method"].startswith("dxopt") and "x_raw" in r]
    if best:
        r = min(best, key=lambda r: r["x_raw"])
        label = f"{ILL_CASE}: best dxopt fwd+bwd ({r['method']}) / raw daqp loop"
        out.append(_target(label, r["x_raw"], BATCH_TARGET))
    batch = [r for r in rows if r["threads"] == 1 and r["case"] == "128 x n=50"]
    best = [r for r in batch if r["method"].startswith("dxopt") and "x_raw" in r]
    if best:
        r = min(best, key=lambda r: r["x_raw"])
        label = f"128 x n=50: best dxopt fwd+bwd ({r['method']}) / raw daqp loop"
        out.append(_target(label, r["x_raw"], BATCH_TARGET))
        qpth = [q for q in batch if q["method"] == "qpth" and "fwd_bwd_ms" in q]
        if qpth:
            speedup = qpth[0]["fwd_bwd_ms"] / r["fwd_bwd_ms"]
            out.append(
                {
                    "target": "128 x n=50: qpth / best dxopt (>= 20)",
                    "figure": speedup,
                    "verdict": "MET" if speedup >= 20 else "MISSED",
                }
            )
        torch_rows = [q for q in batch if q["method"] == "dxopt torch" and "fwd_bwd_ms" in q]
        if qpth and torch_rows:
            speedup = qpth[0]["fwd_bwd_ms"] / torch_rows[0]["fwd_bwd_ms"]
            out.append(
                {
                    "target": "128 x n=50: qpth / dxopt torch solver (>= 3)",
                    "figure": speedup,
                    "verdict": "MET" if speedup >= 3 else "MISSED",
                }
            )
    return out + _qptl_targets(rows)


def _qptl_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 30: the QPTL case's backward over its forward (1 thread)."""
    return [
        _target(f"{r['case']}: backward / forward", r["bwd_over_fwd"], QPTL_TARGET)
        for r in rows
        if r["threads"] == 1 and "bwd_over_fwd" in r
    ]


def _target(label: str, value: float, limit: float) -> dict[str, Any]:
    """A ratio of times target; a ratio that is not positive and finite (a backward time
    taken as the difference of two medians, below the timer's noise) is no figure."""
    measured = math.isfinite(value) and value > 0
    return {
        "target": f"{label} (<= {limit:g})",
        "figure": value,
        "verdict": ("MET" if value <= limit else "MISSED") if measured else "NO FIGURE (noise)",
    }


def _plot(rows: list[dict[str, Any]], path: os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [(r["case"], r["threads"]) for r in rows if r["method"] == "raw daqp (qpsolvers)"]
    methods = ("raw daqp (direct)", "dxopt daqp", "dxopt torch", "qpth")
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        vals = []
        for case, threads in keys:
            hit = [
                r.get("x_raw")
                for r in rows
                if (r["case"], r["threads"], r["method"]) == (case, threads, method)
            ]
            vals.append(hit[0] if hit and hit[0] is not None else np.nan)
        ax.bar(np.arange(len(keys)) + j * width, vals, width, label=method)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{c}\n{t} thr" for c, t in keys], fontsize=7)
    ax.set_ylabel("time / raw daqp loop (qpsolvers)")
    ax.set_title("dxopt.qp fixed cost: forward+backward over the raw forward (lower is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(
    rows: list[dict[str, Any]],
    dense: list[dict[str, Any]],
    dense_note: str,
    info: dict[str, Any],
    load: tuple[float, float],
    line: str,
    rounds: str,
    *,
    quick: bool = False,
) -> str:
    tgt = targets(rows, quick=quick)
    parts = [
        "## QP call overhead",
        "",
        f"Command: `{line}`. {machine_line(info)} Load average (1 min) at start {load[0]:.2f}, "
        f"at end {load[1]:.2f} (a shared machine: absolute times move with the load; the ratios "
        "within a case are measured interleaved, round by round). Median of "
        f"{rounds} rounds after a warm-up (none for a single round: one call, then calls for at "
        "least 5 ms); a method faster than 5 ms per call is timed per round as a block of "
        "back-to-back calls of at least 5 ms, its size from the warm-up's mean call "
        "(per-call time = block / calls); a method faster than 50 ms per call is timed after "
        "one untimed lead-in call; each round takes the methods in a new seeded random order. "
        "`cold_call_ms`: the median lead-in call (the "
        "first after another method's work, caches evicted; forward+backward where there is "
        "one). `x_raw`: the "
        "method's time (forward+backward where there is one) over the raw qpsolvers daqp "
        "loop's forward; `x_err`: max |x - "
        "x_raw|; `grad_err`: relative error of the (q, h, b) gradient against the exact "
        "reduced-KKT reference on the first 4 samples. GPU: none was used by this run.",
        "",
        "Targets (1 torch thread):",
        "",
        *([SMOKE_NOTE, ""] if quick else []),
        markdown_table(tgt, ("target", "figure", "verdict")) if tgt else "(none measured)",
        "",
        markdown_table(rows, COLUMNS),
    ]
    if dense:
        cols = [c for c in dense[0] if not isinstance(dense[0][c], (list, dict))]
        parts += ["", "Dense n = 1000/2000 (`benchmarks/qp_speed/dense.py`):", ""]
        parts.append(markdown_table(dense, cols))
    elif dense_note:
        parts += ["", f"Not in this run: {dense_note}."]
    parts += [
        "",
        "Issue 9's no-slowdown check against the 0.1 code (dense, batched and simplex cells of "
        "`dxopt bench qp`, interleaved in two worker processes): `python -m "
        "benchmarks.qp_speed.ab_baseline` (results in `benchmarks/qp_speed/results/"
        "ab_baseline.md`).",
        "",
        "![qp_speed](benchmarks/qp_speed/results/qp_speed.png)",
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small cases only (< 30 s)")
    parser.add_argument(
        "--threads", nargs="+", default=["1", "2"],
        help="torch thread counts, e.g. --threads 1 2 (1,2 is accepted too)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per case")
    parser.add_argument("--no-md", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense n=1000/2000 rows")
    args = parser.parse_args(argv)
    args.threads = [int(t) for item in args.threads for t in str(item).split(",") if t]
    threads = args.threads[:1] if args.quick else args.threads
    os.environ.setdefault("OMP_NUM_THREADS", str(max(threads)))
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    # (batch, n, m, p, rounds, kind)
    if args.quick:
        plan = [(1, 10, 5, 0, args.rounds or 20, ""), (16, 20, 20, 10, args.rounds or 3, "")]
    else:
        plan = [
            (1, 10, 5, 0, args.rounds or 100, ""),
            (128, 50, 50, 25, args.rounds or 21, ""),
            (128, 50, 50, 25, args.rounds or 21, "ill-conditioned"),
            (1024, 20, 20, 10, args.rounds or 3, ""),
            (1024, 100, 100, 50, args.rounds or 2, ""),
        ]
    for t in threads:
        for batch, n, m, p, rounds, kind in plan:
            quick_tiny = args.quick and batch == 1
            rows += run_case(batch, n, m, p, t, rounds, qpth=not quick_tiny, kind=kind)
            print(f"done {batch} x n={n} at {t} threads", flush=True)
        rows += run_qptl(t, args.rounds or (5 if args.quick else 21))
        print(f"done {QPTL_CASE} at {t} threads", flush=True)
    dense, dense_note = (
        ([], "skipped (--no-dense)") if args.no_dense else _dense_rows(threads, args.quick)
    )
    load = (load0, os.getloadavg()[0])
    info = machine_info()
    duration = time.perf_counter() - start
    line = COMMAND + (" --quick" if args.quick else "")
    if not args.quick and args.threads != [1, 2]:
        line += " --threads " + " ".join(str(t) for t in args.threads)
    if args.no_dense:
        line += " --no-dense"
    out = results_dir("qp_speed")
    suffix = "_quick" if args.quick else ""
    payload = {
        "machine": info,
        "load": list(load),
        "duration_s": duration,
        "rows": rows,
        "targets": targets(rows, quick=args.quick),
        "dense": dense,
    }
    write_json(out / f"qp_speed{suffix}.json", payload)
    rounds = ", ".join(f"{r} ({b} x n={n}{' ' + k if k else ''})" for b, n, _, _, r, k in plan)
    text = section(rows, dense, dense_note, info, load, line, rounds, quick=args.quick) + (
        f"\nWhole run: {duration:.0f} s.\n"
    )
    area = None if args.quick or args.no_md else "qp_speed"
    publish(out, f"qp_speed{suffix}", text, area=area, plot=lambda path: _plot(rows, path))
    checks = targets(rows, quick=args.quick)
    print("targets:", ", ".join(f"{t['verdict']} {fmt(t['figure'])}" for t in checks))


if __name__ == "__main__":
    main()
