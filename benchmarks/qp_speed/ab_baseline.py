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
machine load hits both alike. Each request times a block of calls (about ``BLOCK_S``; one call
for slow cases, up to ``MAX_CALLS`` for tiny ones, whose single calls vary by 2x on this machine)
and returns the block's medians. Reported per case: medians over rounds of forward and total,
and the ratio current / baseline of the total; a case is a slowdown when that ratio exceeds
``--limit`` (default 1.10).

Run ``python -m benchmarks.qp_speed.ab_baseline [--quick] [--rounds R] [--families ...]
[--max-n N]``; it writes ``results/ab_baseline{_quick}.json`` and ``.md``.

The same harness checks a refactoring against the code before it: ``--baseline`` names that
code's ``src``, ``--limit 1.05`` the allowed slowdown, ``--tiny`` adds the lean paths' cells
(one dense QP of n = 10 and n = 30, the lean single path; a batch of 128 x n = 50 is the
``batched`` family), and ``--section`` the BENCHMARKS.md section and result file name
(e.g. ``--section qp_ab_layout``: the issue-29 check).
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
ALL_FAMILIES = (*FAMILIES, "sparse", "chains")
LIMIT = 1.10
BLOCK_S = 0.05  # each timing request runs calls for about this long (tiny cases: many calls)
MAX_CALLS = 200
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
    forward, backward = [], []
    for _ in range(spec.get("calls", 1)):
        peers._reset(inputs)
        t0 = time.perf_counter()
        sol = dqp.solve(inputs["P"], inputs["q"], A=inputs["A"], b=inputs["b"], G=inputs["G"],
                        h=inputs["h"], backward=spec["backward"], solver="auto")
        t1 = time.perf_counter()
        (w * sol.x).sum().backward()
        t2 = time.perf_counter()
        forward.append(t1 - t0)
        backward.append(t2 - t1)
    total = [f + b for f, b in zip(forward, backward)]
    out = {"forward_s": forward, "backward_s": backward, "total_s": total}
    print(json.dumps({k: float(np.median(v)) for k, v in out.items()}), flush=True)
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


def cases(
    quick: bool, families: tuple[str, ...], max_n: int | None, tiny: bool = False
) -> list[dict[str, Any]]:
    """The dxopt cells of ``families`` in :func:`benchmarks.qp.run.plan` (``tiny``: first the
    lean single path's cells, dense n = 10 and n = 30, both backward methods)."""
    from benchmarks.qp.run import plan

    out = []
    if tiny:
        for n in (10, 30):
            for backward in ("penalty", "kkt"):
                out.append({"family": "dense", "n": n, "backward": backward, "batch": 1,
                            "m": 0, "p": 0})  # fmt: skip
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
    specs: list[dict[str, Any]],
    src_a: str,
    src_b: str,
    threads: int,
    rounds: int,
    limit: float = LIMIT,
) -> list[dict[str, Any]]:
    workers = {"current": Worker(src_a, threads), "baseline": Worker(src_b, threads)}
    times: dict[int, dict[str, list[dict[str, float]]]] = {
        i: {"current": [], "baseline": []} for i in range(len(specs))
    }
    try:
        for spec in specs:  # warm-up: imports, first-call costs; then the block size
            for w in workers.values():
                w.time(spec)
            one = max(workers["baseline"].time(spec)["total_s"], 1e-6)
            spec["calls"] = int(min(max(round(BLOCK_S / one), 1), MAX_CALLS))
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
            tot = statistics.median(t["total_s"] for t in times[i][name])
            row[f"{name}_fwd_ms"] = 1e3 * fwd
            row[f"{name}_total_ms"] = 1e3 * tot
            row[f"{name}_best_ms"] = 1e3 * min(t["total_s"] for t in times[i][name])
        row["calls_per_block"] = spec["calls"]
        row["ratio"] = row["current_total_ms"] / row["baseline_total_ms"]
        row["ratio_best"] = row["current_best_ms"] / row["baseline_best_ms"]
        row["verdict"] = "ok" if row["ratio"] <= limit else "SLOWER"
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
    "calls_per_block",
    "ratio",
    "ratio_best",
    "verdict",
)


def plot(rows: list[dict[str, Any]], limit: float, path: Path) -> None:
    """Bars of current / baseline total time per cell, with the slowdown limit drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['family']} {r['size']} {r['backward']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows)), 4))
    colors = ["tab:red" if r["ratio"] > limit else "tab:blue" for r in rows]
    ax.bar(range(len(rows)), [r["ratio"] for r in rows], color=colors)
    ax.axhline(limit, color="tab:red", linestyle="--", label=f"limit {limit:.2f}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("current / baseline (fwd + bwd)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick plan's cells")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per case")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the workers")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the 0.1 code's src/")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=ALL_FAMILIES)
    parser.add_argument("--max-n", type=int, default=None, help="skip cells with larger n")
    parser.add_argument("--tiny", action="store_true", help="add the lean single path's cells")
    parser.add_argument("--limit", type=float, default=LIMIT, help="ratio above which = slower")
    parser.add_argument(
        "--section",
        default="qp_ab_baseline",
        help="result file stem and BENCHMARKS.md section (e.g. qp_ab_layout)",
    )
    parser.add_argument("--title", default=None, help="the section's heading")
    args = parser.parse_args(argv)
    if not Path(args.baseline, "dxopt", "qp").is_dir():
        raise SystemExit(f"--baseline: {args.baseline} has no dxopt/qp package")
    specs = cases(args.quick, tuple(args.families), args.max_n, args.tiny)
    load0, start = os.getloadavg()[0], time.perf_counter()
    rows = run(specs, str(REPO_ROOT / "src"), args.baseline, args.threads, args.rounds, args.limit)
    load = (load0, os.getloadavg()[0])
    custom = args.section != "qp_ab_baseline"
    full = custom or (not args.quick and set(args.families) == set(FAMILIES) and args.max_n is None)
    # a partial run never overwrites the full table (nor BENCHMARKS.md)
    suffix = "_quick" if args.quick else ("" if full else "_partial")
    out = results_dir("qp_speed")
    payload = {"load": list(load), "threads": args.threads, "rounds": args.rounds, "rows": rows,
               "duration_s": time.perf_counter() - start}  # fmt: skip
    stem = args.section.removeprefix("qp_") if custom else "ab_baseline" + suffix
    write_json(out / f"{stem}.json", payload)
    limit = args.limit
    slower = [f"{r['family']} {r['size']} {r['backward']}" for r in rows if r["ratio"] > limit]
    command = "python -m benchmarks.qp_speed.ab_baseline " + " ".join(argv or sys.argv[1:])
    text = (
        f"Command: `{command.strip()}`.\n\n"
        f"A/B against {'the code at' if custom else 'the 0.1 code'} ({args.baseline}), "
        f"{args.threads} torch thread(s), {args.rounds} interleaved rounds; each round times "
        f"a block of `calls_per_block` calls (about {1e3 * BLOCK_S:.0f} ms) in each worker and "
        f"keeps the block's median per call; load average {load[0]:.2f} -> {load[1]:.2f}. "
        "`ratio` = current / baseline of the median over rounds of forward+backward, the "
        f"verdict's figure (> {limit:.2f} is a slowdown); `ratio_best` = the same of the "
        "fastest round (shown, not judged).\n\n"
        + markdown_table(rows, COLUMNS)
        + f"\n\nSlower than {limit:.2f}x: {', '.join(slower) if slower else 'none'}.\n"
    )
    (out / f"{stem}.md").write_text(text)
    plot(rows, limit, out / f"{stem}.png")
    text += f"\n![{stem}](benchmarks/qp_speed/results/{stem}.png)\n"
    print(text)
    if full:
        title = args.title or "QP: no slowdown against 0.1 (issue 9)"
        update_benchmarks_md(args.section, f"## {title}\n\n" + text)
        print(f"BENCHMARKS.md section {args.section!r} updated")


if __name__ == "__main__":
    main()
