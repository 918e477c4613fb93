"""Cone programs (SOCP, portfolio risk, exp cone, SDP) against Clarabel, cvxpylayers, Moreau.

The problems of :mod:`benchmarks.conic.problems` at batch 1 and 128, timed in one process with
``torch.set_num_threads(1)`` (medians over rounds, methods interleaved in a seeded random order):

- ``raw Clarabel loop``: a Python loop of Clarabel solves on the raw cone data, forward only
  (the physical reference);
- ``cvxpylayers default`` / ``cvxpylayers Clarabel``: ``CvxpyLayer`` forward + backward of
  ``L = sum(w * x)``;
- ``Moreau``: ``moreau.torch.Solver`` (CPU, batched) on the raw data, forward + backward with
  respect to the program's values (where it is installed);
- ``dxopt.conic``: :func:`benchmarks.conic.peers.run_dxopt` (reported as not wired until the
  engine lands).

``x_err`` is ``max |x - x_ref|`` against the raw loop for Moreau (both return CVXPY's
canonical ``x``) and against cvxpylayers' default for the other layers. Run
``dxopt bench conic`` or ``--quick`` (batch 1 and 4, two rounds: a smoke run). Writes
``results/conic{_quick}.json`` and ``.md``; it does not edit BENCHMARKS.md (that section
comes with the engine's numbers).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.common import machine_info, machine_line, markdown_table, results_dir, write_json
from benchmarks.conic import peers
from benchmarks.conic.problems import PROBLEMS

COLUMNS = ("problem", "batch", "method", "ms", "vs_raw", "x_err", "note")


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
    # the raw loop and Moreau return CVXPY's canonical x, the layers the variable itself: each
    # is compared with the first method of the same shape
    refs: dict[int, np.ndarray] = {}
    raw_ms = 1e3 * statistics.median(times["raw Clarabel loop"][1:])
    rows = []
    for key, fn in methods.items():
        row: dict[str, Any] = {"problem": name, "batch": batch, "method": key}
        if callable(fn):
            ms = 1e3 * statistics.median(times[key][1:])
            x = _solution(outs[key]).reshape(batch, -1)
            ref = refs.setdefault(x.shape[1], x)
            row.update(ms=ms, vs_raw=ms / raw_ms, x_err=float(np.abs(x - ref).max()))
            row["note"] = "forward" if key == "raw Clarabel loop" else "forward+backward"
        else:
            row["note"] = fn
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dxopt bench conic", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 1 and 4, two rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--problems", nargs="*", default=list(PROBLEMS), choices=list(PROBLEMS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    batches = (1, 4) if args.quick else (1, 128)
    rounds = args.rounds or (2 if args.quick else 7)
    rows = [
        r for name in args.problems for b in batches for r in run_case(name, b, rounds, args.seed)
    ]
    info = machine_info()
    stem = "conic_quick" if args.quick else "conic"
    out = results_dir("conic")
    write_json(out / f"{stem}.json", {"machine": info, "rows": rows})
    table = markdown_table(rows, COLUMNS)
    (out / f"{stem}.md").write_text(f"{machine_line(info)}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
