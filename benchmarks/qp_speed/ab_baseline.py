"""A/B timing of the current ``dxopt.qp`` against the frozen 0.1 code (issue 9: no slowdown of
more than 10% on the dense, batched and simplex families of ``dxopt bench qp``).

The cases are the ``dxopt_penalty``/``dxopt_kkt`` cells of those families in the plan of
:mod:`benchmarks.qp.run` (``--quick``: its quick plan). Two worker subprocesses are started,
one importing ``dxopt`` from this checkout's ``src`` and one from the baseline's ``src``
(``--baseline``, default ``/work/wt/baseline/src``); both build the same problems with
:mod:`benchmarks.qp.generators` and time ``dxopt.qp.solve`` (forward) and the backward of
``L = w . x`` with :func:`benchmarks.qp.peers.run_dxopt`'s inputs (gradients for ``q, h, b``, and
``G, A`` on the dense families) at ``--threads`` torch threads. The driver interleaves them:
for every round and case it asks A, then B, then swaps the order in the next round, so
machine load hits both alike. Reported per case: medians of forward, backward and total, and
the ratio current / baseline of the total; a case is a slowdown when that ratio exceeds 1.10.

Run ``python -m benchmarks.qp_speed.ab_baseline [--quick] [--rounds R] [--families ...]
[--max-n N]``; it writes ``results/ab_baseline{_quick}.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO_ROOT,
    markdown_table,
    results_dir,
    update_benchmarks_md,
    write_json,
)

FAMILIES = ("dense", "batched", "simplex")
LIMIT = 1.10
DEFAULT_BASELINE = "/work/wt/baseline/src"

WORKER = r"""
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(int(sys.argv[1]))
from benchmarks.qp.worker import Case, cotangent, problems, _matrices
from benchmarks.qp import peers
import dxopt.qp as dqp
cache = {}
for line in sys.stdin:
    spec = json.loads(line)
    key = json.dumps(spec, sort_keys=True)
    if key not in cache:
        case = Case(spec["family"], spec["n"], "dxopt_" + spec["backward"], batch=spec["batch"],
                    m=spec["m"], p=spec["p"])
        probs = problems(case)
        inputs = peers._torch_inputs(probs, matrices=_matrices(case),
                                     sparse_torch=probs[0].sparse)
        cache[key] = (inputs, torch.from_numpy(np.asarray(cotangent(case), dtype=np.float64)))
    inputs, w = cache[key]
    peers._reset(inputs)
    t0 = time.perf_counter()
    sol = dqp.solve(inputs["P"], inputs["q"], inputs["A"], inputs["b"], inputs["G"],
                    inputs["h"], backward=spec["backward"], solver="auto")
    t1 = time.perf_counter()
    (w * sol.x).sum().backward()
    t2 = time.perf_counter()
    print(json.dumps({"forward_s": t1 - t0, "backward_s": t2 - t1}), flush=True)
"""


class Worker:
    """A subprocess importing ``dxopt`` from ``src``; :meth:`time` runs one case once."""

    def __init__(self, src: str, threads: int) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([src, str(REPO_ROOT)])
        env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(REPO_ROOT),
        )

    def time(self, spec: dict[str, Any]) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker for {spec} died (exit code {self.proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def cases(quick: bool, families: tuple[str, ...], max_n: int | None) -> list[dict[str, Any]]:
    """The dxopt cells of ``families`` in :func:`benchmarks.qp.run.plan`."""
    from benchmarks.qp.run import plan

    out = []
    for c in plan(quick):
        if c.family not in families or not c.method.startswith("dxopt_"):
            continue
        if max_n is not None and c.n > max_n:
            continue
        backward = c.method.split("_", 1)[1]
        spec = {"family": c.family, "n": c.n, "backward": backward, "batch": c.batch,
                "m": c.m, "p": c.p}  # fmt: skip
        out.append(spec)
    return out


def run(
    specs: list[dict[str, Any]], src_a: str, src_b: str, threads: int, rounds: int
) -> list[dict[str, Any]]:
    workers = {"current": Worker(src_a, threads), "baseline": Worker(src_b, threads)}
    times: dict[int, dict[str, list[dict[str, float]]]] = {
        i: {"current": [], "baseline": []} for i in range(len(specs))
    }
    try:
        for spec in specs:  # warm-up: imports, first-call costs
            for w in workers.values():
                w.time(spec)
        for r in range(rounds):
            order = ("current", "baseline") if r % 2 == 0 else ("baseline", "current")
            for i, spec in enumerate(specs):
                for name in order:
                    times[i][name].append(workers[name].time(spec))
    finally:
        for w in workers.values():
            w.close()
    rows = []
    for i, spec in enumerate(specs):
        size = f"{spec['batch']} x n={spec['n']}" if spec["batch"] > 1 else f"n={spec['n']}"
        row: dict[str, Any] = {"family": spec["family"], "size": size, "backward": spec["backward"]}
        for name in ("current", "baseline"):
            fwd = statistics.median(t["forward_s"] for t in times[i][name])
            tot = statistics.median(t["forward_s"] + t["backward_s"] for t in times[i][name])
            row[f"{name}_fwd_ms"] = 1e3 * fwd
            row[f"{name}_total_ms"] = 1e3 * tot
        row["ratio"] = row["current_total_ms"] / row["baseline_total_ms"]
        row["verdict"] = "ok" if row["ratio"] <= LIMIT else "SLOWER"
        rows.append(row)
    return rows


COLUMNS = (
    "family",
    "size",
    "backward",
    "current_fwd_ms",
    "baseline_fwd_ms",
    "current_total_ms",
    "baseline_total_ms",
    "ratio",
    "verdict",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick plan's cells")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per case")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the workers")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the 0.1 code's src/")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--max-n", type=int, default=None, help="skip cells with larger n")
    args = parser.parse_args(argv)
    if not Path(args.baseline, "dxopt", "qp").is_dir():
        raise SystemExit(f"--baseline: {args.baseline} has no dxopt/qp package")
    specs = cases(args.quick, tuple(args.families), args.max_n)
    load0, start = os.getloadavg()[0], time.perf_counter()
    rows = run(specs, str(REPO_ROOT / "src"), args.baseline, args.threads, args.rounds)
    load = (load0, os.getloadavg()[0])
    full = not args.quick and set(args.families) == set(FAMILIES) and args.max_n is None
    # a partial run never overwrites the full table (nor BENCHMARKS.md)
    suffix = "_quick" if args.quick else ("" if full else "_partial")
    out = results_dir("qp_speed")
    payload = {"load": list(load), "threads": args.threads, "rounds": args.rounds, "rows": rows,
               "duration_s": time.perf_counter() - start}  # fmt: skip
    write_json(out / f"ab_baseline{suffix}.json", payload)
    slower = [f"{r['family']} {r['size']} {r['backward']}" for r in rows if r["ratio"] > LIMIT]
    command = "python -m benchmarks.qp_speed.ab_baseline " + " ".join(argv or sys.argv[1:])
    text = (
        f"Command: `{command.strip()}`.\n\n"
        f"A/B against the 0.1 code ({args.baseline}), {args.threads} torch thread(s), median of "
        f"{args.rounds} interleaved rounds; load average {load[0]:.2f} -> {load[1]:.2f}. "
        f"`ratio` = current / baseline forward+backward; > {LIMIT:.2f} is a slowdown.\n\n"
        + markdown_table(rows, COLUMNS)
        + f"\n\nSlower than {LIMIT:.2f}x: {', '.join(slower) if slower else 'none'}.\n"
    )
    (out / f"ab_baseline{suffix}.md").write_text(text)
    print(text)
    if full:
        heading = "## QP: no slowdown against 0.1 (issue 9)\n\n"
        update_benchmarks_md("qp_ab_baseline", heading + text)
        print("BENCHMARKS.md section 'qp_ab_baseline' updated")


if __name__ == "__main__":
    main()
