"""Dense QP backward against one Cholesky factorization of ``P`` (the "backward near one
factorization" targets).

Problems: the dense family of :mod:`benchmarks.qp.generators` (dQP's random dense QP,
``m = n``, ``p = n/2``; about half of the 1.5 n rows end up active). Timed in one process,
side by side, with ``torch.set_num_threads(threads)`` set explicitly (median of ``repeats``
rounds, the cases interleaved within each round so machine load hits them alike):

- ``cholesky``: the faster of ``torch.linalg.cholesky(P)`` and scipy's LAPACK ``dpotrf`` on a
  preallocated copy of ``P`` (copy included), the unit of the ratios; both are timed in the
  same rounds and reported (torch's MKL on this AMD CPU is the slower one, and its fresh
  n x n result can page-fault thousands of times per call depending on the heap's state);
- ``raw daqp``: ``qpsolvers.solve_problem`` with daqp, the fastest raw forward on this family;
- ``dxopt forward``: :func:`dxopt.qp.solve` without a backward;
- ``penalty backward`` / ``kkt backward``: the backward alone, ``L = v^T x`` with a fixed random
  ``v`` and gradients for ``P, q, A, b, G, h`` (``retain_graph=True`` on one forward; the
  gradients compared below come from one more, untimed, backward);
- ``fwd+bwd`` rows: dxopt forward plus that backward, against raw daqp.

Targets: backward <= 3x one Cholesky of ``P``; fwd+bwd <= 1.1x the raw solve. Each row also
records the active row count ``k`` (inequality plus equality rows), the dense backward's
linear solver (``augmented``: :mod:`dxopt.qp.backward.dense_large`; ``schur``: block elimination of
``P``), the largest relative error of its gradients of ``q, A, b, G, h`` against the exact
reduced-KKT reference of :func:`benchmarks.qp.reference.reference_grads` (independent of
dxopt) and the relative difference of the penalty and kkt gradients.
``python -m benchmarks.qp_speed.dense`` runs n = 1000, 2000 (about 2 minutes on an idle 2-core
machine), ``--quick`` n = 200 (seconds). Writes
``results/dense{_quick}.json``, ``.md`` and ``.png``; the full run also replaces the
``qp_speed_dense`` block of BENCHMARKS.md (``--no-md`` to skip).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import (
    machine_info,
    machine_line,
    markdown_table,
    publish,
    results_dir,
    write_json,
)
from benchmarks.qp.generators import random_dense
from benchmarks.qp.reference import reference_grads

__all__ = ["run_dense"]

BACKWARD_TARGET = 3.0  # x one Cholesky of P
FWD_BWD_TARGET = 1.1  # x the raw daqp solve
COLUMNS = ("n", "k", "case", "seconds", "x_cholesky", "x_raw", "target", "verdict", "note")


def _median_rounds(cases: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds per case over ``repeats`` rounds (cases interleaved), after a warm-up."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _one_size(n: int, repeats: int) -> list[dict[str, Any]]:
    import qpsolvers
    import torch

    import dxopt.qp as dqp

    prob = random_dense(n, seed=0)
    raw_problem = qpsolvers.Problem(prob.P, prob.q, prob.G, prob.h, prob.A, prob.b)
    tensors = [torch.from_numpy(np.asarray(a)) for a in (prob.P, prob.q, prob.A, prob.b)]
    tensors += [torch.from_numpy(np.asarray(a)) for a in (prob.G, prob.h)]
    P, q, A, b, G, h = (t.clone().requires_grad_() for t in tensors)
    v = torch.from_numpy(np.random.default_rng(1).standard_normal(n))
    sols = {m: dqp.solve(P, q, A=A, b=b, G=G, h=h, backward=m) for m in ("penalty", "kkt")}
    grads: dict[str, list[torch.Tensor]] = {}

    def backward(method: str) -> Callable[[], None]:
        def run() -> None:  # the backward alone (its gradients are read after the timing)
            for t in (P, q, A, b, G, h):
                t.grad = None
            (sols[method].x * v).sum().backward(retain_graph=True)

        return run

    def forward() -> None:
        with torch.no_grad():
            dqp.solve(P, q, A=A, b=b, G=G, h=h)

    def raw() -> None:
        sol = qpsolvers.solve_problem(raw_problem, solver="daqp")
        if not sol.found:
            raise RuntimeError(f"daqp failed on the dense problem n={n}")

    P0 = P.detach()
    P_np, work = P0.numpy(), np.empty(P0.shape, order="F")

    def lapack_cholesky() -> None:
        from scipy.linalg import lapack

        np.copyto(work, P_np)
        lapack.dpotrf(work, lower=1, overwrite_a=1, clean=0)

    times = _median_rounds(
        {
            "cholesky torch": lambda: torch.linalg.cholesky(P0),
            "cholesky lapack": lapack_cholesky,
            "penalty backward": backward("penalty"),
            "kkt backward": backward("kkt"),
            "raw daqp": raw,
            "dxopt forward": forward,
        },
        repeats,
    )
    for method in sols:  # one more backward each, untimed, for the gradients
        backward(method)()
        grads[method] = [t.grad for t in (P, q, A, b, G, h)]  # type: ignore[misc]
    diff = max(
        float((a - b_).norm() / b_.norm().clamp_min(1e-300))
        for a, b_ in zip(grads["penalty"], grads["kkt"])
    )
    # against the exact reduced-KKT reference (independent of dxopt; q, A, b, G, h)
    ref, _ = reference_grads(prob, v.numpy(), matrices=True)
    position = {"q": 1, "A": 2, "b": 3, "G": 4, "h": 5}
    error = {
        m: max(
            float(np.linalg.norm(grads[m][i].numpy() - ref[name]) / np.linalg.norm(ref[name]))
            for name, i in position.items()
        )
        for m in grads
    }
    info = {m: sols[m].info.backward for m in sols}
    k = int(info["kkt"].n_active[0]) + prob.p  # type: ignore[union-attr]
    chol, raw_s = min(times["cholesky torch"], times["cholesky lapack"]), times["raw daqp"]
    rows: list[dict[str, Any]] = []

    def row(case: str, seconds: float, target: str = "-", met: bool | None = None, note=""):
        rows.append(
            {
                "n": n,
                "k": k,
                "case": case,
                "seconds": seconds,
                "x_cholesky": seconds / chol,
                "x_raw": seconds / raw_s,
                "target": target,
                "verdict": "-" if met is None else ("met" if met else "missed"),
                "note": note,
            }
        )

    for case, key in (("cholesky of P (torch)", "cholesky torch"),
                      ("cholesky of P (scipy dpotrf)", "cholesky lapack")):  # fmt: skip
        row(case, times[key], note="the unit (the faster)" if times[key] == chol else "")
    row("raw daqp", raw_s)
    row("dxopt forward", times["dxopt forward"])
    for method in ("penalty", "kkt"):
        bwd = times[f"{method} backward"]
        solver = info[method].linear_solver  # type: ignore[union-attr]
        note = f"{solver}; vs reference {error[method]:.1e}"
        note += f"; grads vs kkt {diff:.1e}" if method == "penalty" else ""
        row(f"{method} backward", bwd, f"<= {BACKWARD_TARGET:g}x cholesky",
            bwd <= BACKWARD_TARGET * chol, note)  # fmt: skip
    for method in ("penalty", "kkt"):
        total = times["dxopt forward"] + times[f"{method} backward"]
        row(f"fwd+bwd {method}", total, f"<= {FWD_BWD_TARGET:g}x raw",
            total <= FWD_BWD_TARGET * raw_s)  # fmt: skip
    return rows


def run_dense(
    sizes: tuple[int, ...] = (1000, 2000), threads: int = 1, quick: bool = False, repeats: int = 3
) -> list[dict[str, Any]]:
    """Time the cases of the module docstring for every ``n`` in ``sizes`` (``quick``:
    n = 200 only) with ``threads`` torch threads; one dict per (n, case)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows: list[dict[str, Any]] = []
        for n in (200,) if quick else sizes:
            rows += _one_size(n, repeats)
        for r in rows:
            r["threads"] = threads
        return rows
    finally:
        torch.set_num_threads(previous)


def section(rows: list[dict[str, Any]], info: dict[str, Any], load: tuple[float, float],
            command: str) -> str:  # fmt: skip
    """The Markdown block (table, machine, load, command)."""
    return "\n".join(
        [
            "### Dense backward vs one Cholesky of P",
            "",
            f"`{command}`; {rows[0]['threads'] if rows else '-'} torch thread(s); "
            f"load average {load[0]:.2f} at start, {load[1]:.2f} at end.",
            machine_line(info),
            "",
            "k = active inequality rows + equality rows. x_cholesky / x_raw: seconds over one "
            "Cholesky of P (the faster of torch's and scipy's LAPACK, the copy of P into the "
            "work array included) / over the raw daqp solve, measured in the same rounds.",
            "",
            markdown_table(rows, COLUMNS),
            "",
            "![dense backward](benchmarks/qp_speed/results/dense.png)",
            "",
        ]
    )


def _plot(rows: list[dict[str, Any]], path: os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["n"] for r in rows})
    cases = ("penalty backward", "kkt backward")
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.35
    for j, case in enumerate(cases):
        vals = [next(r["x_cholesky"] for r in rows if (r["n"], r["case"]) == (n, case))
                for n in sizes]  # fmt: skip
        ax.bar(np.arange(len(sizes)) + (j - 0.5) * width, vals, width, label=case)
    ax.axhline(BACKWARD_TARGET, color="k", linestyle="--", label="target (3x)")
    ax.set_xticks(np.arange(len(sizes)), [f"n={n}" for n in sizes])
    ax.set_ylabel("backward / one Cholesky of P")
    ax.set_title("Dense QP backward (dQP dense family), CPU float64")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 200 only (seconds)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-md", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    load0 = os.getloadavg()[0]
    rows = run_dense(tuple(args.sizes), args.threads, args.quick, args.repeats)
    load = (load0, os.getloadavg()[0])
    info = machine_info()
    command = "python -m benchmarks.qp_speed.dense" + (" --quick" if args.quick else "")
    if not args.quick and args.sizes != [1000, 2000]:
        command += " --sizes " + " ".join(str(s) for s in args.sizes)
    text = section(rows, info, load, command)
    out = results_dir("qp_speed")
    suffix = "_quick" if args.quick else ""
    write_json(out / f"dense{suffix}.json", {"machine": info, "load": list(load), "rows": rows})
    area = None if args.quick or args.no_md else "qp_speed_dense"
    publish(out, f"dense{suffix}", text, area=area, plot=lambda path: _plot(rows, path))


if __name__ == "__main__":
    main()
