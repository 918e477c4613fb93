"""Cone programs (SOCP, portfolio risk, exp cone, SDP) against Clarabel, cvxpylayers, Moreau.

The problems of :mod:`benchmarks.conic.problems` at batch 1 and 128, timed in one process with
``torch.set_num_threads(1)`` (medians over rounds, methods interleaved in a seeded random order):

- ``raw Clarabel loop``: a Python loop of Clarabel solves on the raw cone data, forward only
  (the physical reference);
- ``cvxpylayers default`` / ``cvxpylayers Clarabel``: ``CvxpyLayer`` forward + backward of
  ``L = sum(w * x)``;
- ``Moreau``: ``moreau.torch.Solver`` (CPU, batched) on the raw data, forward + backward with
  respect to the program's values (where it is installed);
- ``dxopt.conic``: :func:`benchmarks.conic.peers.run_dxopt`, one batched
  :func:`dxopt.conic.solve` call, forward + backward of ``L = sum(w * x)`` in ``P, q, A, b``.

Targets (issue 37), per problem: at batch 128 dxopt's forward+backward within 1.25x the raw
loop, at least 8x faster than cvxpylayers (default), faster than Moreau; at batch 1 within 2x
the raw loop. A full run prints MET/MISSED with the figure; ``--quick`` prints no verdicts.

``x_err`` is ``max |x - x_ref|`` over the user's CVXPY variable only, against the raw loop:
CVXPY's canonical ``x`` (what the raw loop, Moreau and ``dxopt.conic`` return) also holds
epigraph and auxiliary columns that are not unique (``abs(x) <= 1`` in ``socp``: any
``t`` with ``|x| <= t <= 1``), so comparing whole canonical vectors measured which
optimal ``t`` each interior-point method picked, not an error.

The accuracy table (:mod:`benchmarks.conic.accuracy`): per problem, float64 at tight
tolerances, the variable's error and each method's gradient error against kink-aware finite
differences; target: within 1e-6 relative for dxopt on every problem with a verdict. Run
``dxopt bench conic`` or ``--quick`` (batch 1 and 4, two rounds: a smoke run). Writes
``results/conic{_quick}.json``, ``.md`` and ``.png``, with the load average at start and end
(the machine may be shared); a full run also replaces the ``conic`` section of BENCHMARKS.md
(the command, a summary of which targets were met and missed with their figures, the tables
and the plot); ``--quick`` and ``--no-md`` leave BENCHMARKS.md alone.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    SMOKE_NOTE,
    machine_info,
    machine_line,
    markdown_table,
    results_dir,
    update_benchmarks_md,
    verdict,
    write_json,
)
from benchmarks.conic import peers
from benchmarks.conic.accuracy import TARGET, accuracy_rows, variable_value
from benchmarks.conic.problems import PROBLEMS

COLUMNS = ("problem", "batch", "method", "ms", "vs_raw", "x_err", "grad_rel_err", "note")
TARGET_COLUMNS = ("problem", "target", "figure", "verdict")
ACCURACY_COLUMNS = ("problem", "method", "x_err", "x_err_scs", "grad", "fd", "fd_err",
                    "fd_clarabel", "grad_rel_err", "verdict", "note")  # fmt: skip
CANONICAL = ("raw Clarabel loop", "Moreau", "dxopt.conic")
BIG = 128


def _ms(rows: list[dict[str, Any]], name: str, batch: int, method: str) -> float | None:
    for r in rows:
        if r["problem"] == name and r["batch"] == batch and r["method"] == method:
            return r.get("ms")
    return None


def targets(rows: list[dict[str, Any]], *, quick: bool) -> list[dict[str, Any]]:
    """Issue 37's targets per problem, from the timed rows (no figure: no verdict)."""
    out = []
    big = max(r["batch"] for r in rows)
    for name in dict.fromkeys(r["problem"] for r in rows):
        dx_big, dx_1 = _ms(rows, name, big, "dxopt.conic"), _ms(rows, name, 1, "dxopt.conic")
        checks = [
            (f"batch {big}: <= 1.25x raw Clarabel loop", dx_big,
             _ms(rows, name, big, "raw Clarabel loop"), lambda d, p: d / p, lambda v: v <= 1.25),
            (f"batch {big}: >= 8x faster than cvxpylayers default", dx_big,
             _ms(rows, name, big, "cvxpylayers default"), lambda d, p: p / d, lambda v: v >= 8),
            (f"batch {big}: faster than Moreau CPU", dx_big,
             _ms(rows, name, big, "Moreau"), lambda d, p: p / d, lambda v: v > 1),
            ("batch 1: <= 2x one raw Clarabel solve", dx_1,
             _ms(rows, name, 1, "raw Clarabel loop"), lambda d, p: d / p, lambda v: v <= 2),
        ]  # fmt: skip
        for label, d, p, ratio, ok in checks:
            if d is None or p is None:
                out.append({"problem": name, "target": label, "figure": "-", "verdict": "-"})
                continue
            v = ratio(d, p)
            out.append({"problem": name, "target": label, "figure": f"{v:.2f}x",
                        "verdict": verdict(ok(v), quick=quick, met="MET")})  # fmt: skip
    return out


def plot(path: Any, rows: list[dict[str, Any]]) -> None:
    """Median ms per method, one panel per batch size, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    names = list(dict.fromkeys(r["problem"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4), squeeze=False)
    width = 0.8 / len(methods)
    for ax, batch in zip(axes[0], batches, strict=True):
        for j, method in enumerate(methods):
            ms = [_ms(rows, n, batch, method) or 0.0 for n in names]
            ax.bar([i + j * width for i in range(len(names))], ms, width, label=method)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
        ax.set_yscale("log")
        ax.set_ylabel("ms (median)")
        ax.set_title(f"batch {batch}, 1 thread")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _solution(out: Any) -> np.ndarray:
    x = out[0] if isinstance(out, tuple) else out
    if isinstance(x, list):
        return np.stack([np.asarray(v) for v in x])
    return x.detach().reshape(x.shape[0], -1).numpy()


def run_case(name: str, batch: int, rounds: int, seed: int) -> list[dict[str, Any]]:
    prob = PROBLEMS[name](batch, seed=seed)
    weight = torch.ones(batch, *prob.variable.shape, dtype=torch.float64)
    methods: dict[str, Callable[[], Any] | str] = {"raw Clarabel loop": peers.raw_clarabel(prob)}
    for label, solver in (("cvxpylayers default", None), ("cvxpylayers Clarabel", "Clarabel")):
        try:
            methods[label] = peers.cvxpylayers(prob, weight, solver=solver)
        except Exception as exc:  # a peer that cannot take the problem is reported
            methods[label] = f"{type(exc).__name__}: {exc}"[:120]
    why = peers.moreau_available()
    methods["Moreau"] = why if why is not None else peers.moreau_solver(prob)
    try:
        methods["dxopt.conic"] = peers.run_dxopt(prob, batch)
    except NotImplementedError as exc:
        methods["dxopt.conic"] = str(exc)
    times: dict[str, list[float]] = {k: [] for k, v in methods.items() if callable(v)}
    outs: dict[str, Any] = {}
    rng = random.Random(seed)
    for _ in range(rounds + 1):  # the first round warms up
        order = list(times)
        rng.shuffle(order)
        for key in order:
            fn = methods[key]
            assert callable(fn)
            t0 = time.perf_counter()
            outs[key] = fn()
            times[key].append(time.perf_counter() - t0)
    # the raw loop, Moreau and dxopt.conic return CVXPY's canonical x, the layers the variable
    # itself: all are compared on the variable (its canonical block is unique, the epigraph
    # columns are not), against the raw loop
    start, var = _variable_block(prob)

    def value(key: str) -> np.ndarray:
        x = _solution(outs[key]).reshape(batch, -1)
        return variable_value(x, start, var) if key in CANONICAL else x

    ref = value("raw Clarabel loop")
    raw_ms = 1e3 * statistics.median(times["raw Clarabel loop"][1:])
    rows = []
    for key, fn in methods.items():
        row: dict[str, Any] = {"problem": name, "batch": batch, "method": key}
        if callable(fn):
            ms = 1e3 * statistics.median(times[key][1:])
            row.update(ms=ms, vs_raw=ms / raw_ms, x_err=float(np.abs(value(key) - ref).max()))
            row["note"] = "forward" if key == "raw Clarabel loop" else "forward+backward"
        else:
            row["note"] = fn
        rows.append(row)
    return rows


def _variable_block(prob: Any) -> tuple[int, Any]:
    import cvxpy as cp

    data, chain, _ = prob.problem.get_problem_data(cp.CLARABEL)
    ids = chain.compose_var_id_map().get(prob.variable.id, [prob.variable.id])
    return int(data[cp.settings.PARAM_PROB].var_id_to_col[ids[0]]), prob.variable


def accuracy_target(acc: list[dict[str, Any]], *, quick: bool) -> dict[str, Any]:
    """dxopt's gradients within :data:`TARGET` relative on every problem with a verdict."""
    mine = [r for r in acc if r["method"] == "dxopt.conic"]
    judged = [r for r in mine if "grad_rel_err" in r]
    worst = max((r["grad_rel_err"] for r in judged), default=None)
    label = f"dxopt gradients within {TARGET:g} relative on every problem with an FD verdict"
    if worst is None:
        return {"problem": "all", "target": label, "figure": "-", "verdict": "-"}
    figure = f"worst {worst:.2e} over {len(judged)} of {len(mine)} problems"
    return {"problem": "all", "target": label, "figure": figure,
            "verdict": verdict(worst <= TARGET, quick=quick, met="MET")}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dxopt bench conic", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 1 and 4, two rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--problems", nargs="*", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--no-md", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    batches = (1, 4) if args.quick else (1, BIG)
    rounds = args.rounds or (2 if args.quick else 7)
    rows = [
        r for name in args.problems for b in batches for r in run_case(name, b, rounds, args.seed)
    ]
    acc = [r for name in args.problems for r in accuracy_rows(PROBLEMS[name](1), seed=args.seed)]
    for r in rows:  # the batch-1 rows carry their method's gradient error
        match = [a for a in acc if a["problem"] == r["problem"] and a["method"] == r["method"]]
        if r["batch"] == 1 and match and "grad_rel_err" in match[0]:
            r["grad_rel_err"] = match[0]["grad_rel_err"]
    load_end = os.getloadavg()
    info = machine_info()
    goals = [*targets(rows, quick=args.quick), accuracy_target(acc, quick=args.quick)]
    stem = "conic_quick" if args.quick else "conic"
    out = results_dir("conic")
    load = f"load average (1/5/15 min) at start {load_start}, at end {load_end}"
    write_json(out / f"{stem}.json", {"machine": info, "load": [load_start, load_end],
                                      "rows": rows, "accuracy": acc, "targets": goals})  # fmt: skip
    text = (
        f"{machine_line(info)}; 1 thread; {load}\n\n"
        + (f"{SMOKE_NOTE}\n\n" if args.quick else "")
        + "x_err: max |x - x_raw| over the user's CVXPY variable only, against the raw "
        "Clarabel loop (CVXPY's canonical x also holds epigraph columns that are not unique, "
        "e.g. t in |x| <= t <= 1 in socp; the whole canonical vectors differed by 0.40 there "
        "without either point being wrong); grad_rel_err: from the accuracy table below.\n\n"
        + f"{markdown_table(rows, COLUMNS)}\n\n"
        + "Accuracy (sample 0, float64, tight tolerances; x_err over the user's variable "
        "against Clarabel at its tightest Solved tolerance, x_err_scs against CVXPY + SCS at "
        "eps 1e-12 (the solver of cvxpylayers default too); grad = directional derivative of "
        "w'x; fd from dxopt's certified forward at 1e-12, fd_clarabel the same from raw "
        "Clarabel points; benchmarks/conic/accuracy.py):\n\n"
        + f"{markdown_table(acc, ACCURACY_COLUMNS)}\n\n{markdown_table(goals, TARGET_COLUMNS)}\n"
    )
    (out / f"{stem}.md").write_text(text)
    try:
        plot(out / f"{stem}.png", rows)
    except ImportError as exc:  # no matplotlib: the tables stand alone
        print(f"no plot: {exc}")
    if not (args.quick or args.no_md):
        update_benchmarks_md("conic", section(argv, info, goals, text, stem))
    print(text)


def summary(goals: list[dict[str, Any]]) -> str:
    """One sentence per target kind: how many problems met it, and the range of the figures
    of those that missed (a missed target is reported as missed, with its figure)."""
    lines = []
    for label in dict.fromkeys(g["target"] for g in goals):
        rows = [g for g in goals if g["target"] == label and g["verdict"] != "-"]
        if not rows:
            continue
        missed = [g for g in rows if g["verdict"] != "MET"]
        figs = ", ".join(f"{g['problem']} {g['figure']}" for g in missed)
        tail = f"**MISSED** on {len(missed)} ({figs})" if missed else "MET on all"
        if len(rows) == 1:  # one target over all problems: its figure says how well
            tail += f" ({rows[0]['figure']})"
        lines.append(f"- {label}: met on {len(rows) - len(missed)} of {len(rows)}; {tail}")
    return "\n".join(lines)


def section(
    argv: list[str] | None, info: dict[str, Any], goals: list[dict[str, Any]], text: str, stem: str
) -> str:
    """The BENCHMARKS.md section of a full run: command, target summary, tables, plot."""
    import sys

    args = " ".join(sys.argv[1:] if argv is None else argv)
    command = f"OMP_NUM_THREADS=1 PYTHONPATH=src:. python -m benchmarks.conic.run {args}".strip()
    return (
        "## Cone programs (`dxopt bench conic`)\n\n"
        f"Command: `{command}` (written by the run itself), 1 thread, medians after one warm-up "
        "round, methods interleaved in a seeded random order, every peer in the same process. "
        "dxopt.conic: one batched `dxopt.conic.solve` call on the raw cone data (CVXPY's "
        "Clarabel canonicalisation), forward + backward of `sum(w * x)` in `P, q, A, b`, every "
        "point certified.\n\n"
        f"Targets (issue 37):\n\n{summary(goals)}\n\n{text}\n"
        f"![conic](benchmarks/conic/results/{stem}.png)\n"
    )


if __name__ == "__main__":
    main()
