"""Benchmark of the torch-native batched QP solver (``solver="torch"``).

Batches of dQP's random dense QPs (:func:`benchmarks.qp.generators.batched_dense`, ``m = n``,
``p = n/2``): 128 x n=50, 1024 x n=20 and 1024 x n=100, each at 1 and 2 torch threads
(``torch.set_num_threads`` set explicitly). Methods, all on the CPU in float64:

- ``torch``: :func:`dxopt.qp.solvers.torch_ipm.torch_qp_solve`, forward and forward+backward of
  ``L = sum(w * x)`` with gradients for all six inputs;
- ``daqp loop``: a Python loop of raw ``qpsolvers`` daqp solves (forward only, the reference
  point of the targets);
- ``qpth``: qpth's batched interior point ``QPFunction`` (Amos & Kolter, arXiv 1703.00443),
  forward+backward (install with ``make bench-peers``; recorded as missing otherwise).

Accuracy: ``max |x - x_daqp|`` over the batch, and the relative gradient error over
``(q, h, b, G, A)`` against the exact reduced-KKT reference of :mod:`benchmarks.qp.reference`
on the first samples of the batch. Forward and backward are timed in the same call; the
time is the median of ``--repeats`` calls after a warm-up, or one call for the
1024 x n=100 case (so the full run stays under 5 minutes). Writes
``results/qp_torch.json``, ``results/qp_torch.md``, ``results/qp_torch.png`` and the
``qp_torch`` block of BENCHMARKS.md (a subsection of the QP section). Run
``dxopt bench qp_torch`` (full, about 3-4 minutes on 2 cores) or ``--quick`` (< 1 minute);
``--cases 128x50`` runs a subset of the full set (``results/qp_torch_cases.*``).
"""

from __future__ import annotations

import argparse
import json
import os
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
from benchmarks.qp.generators import QPProblem, batched_dense
from benchmarks.qp.reference import reference_grads

COMMAND = "dxopt bench qp_torch"
FULL = ((128, 50), (1024, 20), (1024, 100))
QUICK = ((16, 20),)
NAMES = ("P", "q", "A", "b", "G", "h")
BLOCKS = ("q", "h", "b", "G", "A")


def _timed(once: Callable[[], tuple[float, float, Any]], repeats: int) -> tuple[float, float, Any]:
    """Median forward and backward seconds of ``once`` (which returns ``(fwd, bwd, out)``);
    an untimed warm-up call first unless ``repeats == 1`` (large cases)."""
    if repeats > 1:
        once()
    runs = [once() for _ in range(repeats)]
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        runs[-1][2],
    )


def _inputs(probs: list[QPProblem]) -> list[Any]:
    import torch

    return [torch.from_numpy(np.stack([getattr(p, k) for p in probs])) for k in NAMES]


def _grads(inputs: list[Any]) -> dict[str, np.ndarray]:
    return {k: t.grad.numpy().copy() for k, t in zip(NAMES, inputs) if t.grad is not None}


def run_torch(probs: list[QPProblem], w: np.ndarray, repeats: int) -> dict[str, Any]:
    import torch

    from dxopt.qp.autograd.torch_entry import torch_qp_solve

    base = _inputs(probs)
    w_t = torch.from_numpy(w)

    def once() -> tuple[float, float, Any]:
        ins = [t.clone().requires_grad_() for t in base]
        t0 = time.perf_counter()
        r = torch_qp_solve(*ins)
        t1 = time.perf_counter()
        (w_t * r.x).sum().backward()
        return t1 - t0, time.perf_counter() - t1, (r, _grads(ins))

    t_f, t_b, (r, grads) = _timed(once, repeats)
    solved = int((r.status == 0).sum())
    iters = int(r.iterations.max())
    return {
        "forward_s": t_f,
        "fwd_bwd_s": t_f + t_b,
        "x": r.x.detach().numpy(),
        "grads": grads,
        "note": f"{solved}/{len(probs)} solved, {iters} iterations",
    }


def run_daqp(probs: list[QPProblem], repeats: int) -> dict[str, Any]:
    import qpsolvers

    problems = [qpsolvers.Problem(p.P, p.q, p.G, p.h, p.A, p.b) for p in probs]

    def once() -> tuple[float, float, Any]:
        t0 = time.perf_counter()
        x = np.stack([qpsolvers.solve_problem(pr, solver="daqp").x for pr in problems])
        return time.perf_counter() - t0, 0.0, x

    t, _, x = _timed(once, repeats)
    return {"forward_s": t, "fwd_bwd_s": None, "x": x, "grads": {}, "note": ""}


def run_qpth(probs: list[QPProblem], w: np.ndarray, repeats: int) -> dict[str, Any]:
    try:
        from qpth.qp import QPFunction
    except ImportError:
        return {"missing": "qpth not installed (make bench-peers)"}
    import torch

    base = _inputs(probs)
    w_t = torch.from_numpy(w)

    def once() -> tuple[float, float, Any]:
        ins = [t.clone().requires_grad_() for t in base]
        t0 = time.perf_counter()
        x = QPFunction(verbose=-1)(ins[0], ins[1], ins[4], ins[5], ins[2], ins[3])
        t1 = time.perf_counter()
        (w_t * x).sum().backward()
        return t1 - t0, time.perf_counter() - t1, (x, _grads(ins))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_f, t_b, (x, grads) = _timed(once, repeats)
    return {
        "forward_s": t_f,
        "fwd_bwd_s": t_f + t_b,
        "x": x.detach().numpy(),
        "grads": grads,
        "note": "",
    }


def _grad_error(grads: dict[str, np.ndarray], refs: list[dict[str, np.ndarray]]) -> float | None:
    if not grads or not refs:
        return None
    num = den = 0.0
    for i, ref in enumerate(refs):
        for k in BLOCKS:
            num += float(np.sum((grads[k][i] - ref[k]) ** 2))
            den += float(np.sum(ref[k] ** 2))
    return float(np.sqrt(num / den))


def run_case(batch: int, n: int, threads: int, repeats: int, n_ref: int) -> list[dict[str, Any]]:
    import torch

    torch.set_num_threads(threads)
    probs = batched_dense(batch, n, n, -(-n // 2), seed=0)
    w = np.random.default_rng(1).standard_normal((batch, n))
    refs = [reference_grads(p, w[i], matrices=True)[0] for i, p in enumerate(probs[:n_ref])]
    daqp = run_daqp(probs, repeats)
    rows = []
    for method, rec in (
        ("daqp loop", daqp),
        ("torch", run_torch(probs, w, repeats)),
        ("qpth", run_qpth(probs, w, repeats)),
    ):
        row: dict[str, Any] = {"case": f"{batch} x n={n}", "threads": threads, "method": method}
        if "missing" in rec:
            rows.append({**row, "note": rec["missing"]})
            continue
        row.update(forward_s=rec["forward_s"], fwd_bwd_s=rec["fwd_bwd_s"], note=rec["note"])
        row["x_err_vs_daqp"] = float(np.abs(rec["x"] - daqp["x"]).max())
        row["grad_rel_err"] = _grad_error(rec["grads"], refs)
        row["fwd_bwd_over_daqp"] = (
            None if rec["fwd_bwd_s"] is None else rec["fwd_bwd_s"] / daqp["forward_s"]
        )
        rows.append(row)
    torch_row = next(r for r in rows if r["method"] == "torch")
    for r in rows:
        if r.get("fwd_bwd_s") and r["method"] == "qpth":
            torch_row["qpth_over_torch"] = r["fwd_bwd_s"] / torch_row["fwd_bwd_s"]
    return rows


def _plot(rows: list[dict[str, Any]], path: os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["case"], r["threads"]) for r in rows}, key=lambda c: (c[1], c[0]))
    labels = [f"{c}\n{t} thr" for c, t in cases]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4))
    width = 0.25
    for j, method in enumerate(("daqp loop", "torch", "qpth")):
        vals = []
        for c, t in cases:
            r = next(
                (r for r in rows if (r["case"], r["threads"], r["method"]) == (c, t, method)), {}
            )
            vals.append(r.get("fwd_bwd_s") or r.get("forward_s") or np.nan)
        xs = np.arange(len(cases)) + (j - 1) * width
        label = method + (" (forward only)" if method == "daqp loop" else " (fwd+bwd)")
        ax.bar(xs, vals, width, label=label)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(cases)), labels)
    ax.set_ylabel("seconds (median)")
    ax.set_title("Batched dense QPs (m = n, p = n/2), CPU float64")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _targets(rows: list[dict[str, Any]], *, quick: bool = False) -> str:
    """Issue 10's CPU target for the torch solver, per thread count, plus the 1024 rows (no
    verdicts in a ``--quick`` smoke run)."""
    out = []
    for r in rows:
        if r["method"] != "torch" or r.get("fwd_bwd_s") is None:
            continue
        qpth = next(
            (
                o
                for o in rows
                if (o["case"], o["threads"], o["method"]) == (r["case"], r["threads"], "qpth")
            ),
            {},
        )
        ratio = r.get("qpth_over_torch")
        if r["case"] == "128 x n=50":
            accurate = bool(qpth) and (
                r["x_err_vs_daqp"] <= max(qpth["x_err_vs_daqp"], 1e-12)
                and (r["grad_rel_err"] or 0) <= (qpth["grad_rel_err"] or 0)
            )
            verdict = "MET" if ratio is not None and ratio >= 3 and accurate else "MISSED"
            target = "qpth fwd+bwd / torch fwd+bwd >= 3 at equal or better accuracy"
        else:
            verdict, target = "reported", "fwd+bwd vs raw daqp loop and qpth"
        out.append(
            {
                "case": r["case"],
                "threads": r["threads"],
                "target": target,
                "torch fwd+bwd / daqp loop": fmt(r.get("fwd_bwd_over_daqp")),
                "qpth / torch": fmt(ratio),
                "verdict": verdict,
            }
        )
    cols = ["case", "threads", "target", "torch fwd+bwd / daqp loop", "qpth / torch", "verdict"]
    if quick:
        return markdown_table(smoke_verdicts(out), cols) + f"\n\n{SMOKE_NOTE}"
    return markdown_table(out, cols)


def _section(rows: list[dict[str, Any]], info: dict[str, Any], load: tuple, args: Any) -> str:
    table = markdown_table(
        [
            {
                **r,
                **{
                    k: fmt(r.get(k))
                    for k in (
                        "forward_s",
                        "fwd_bwd_s",
                        "fwd_bwd_over_daqp",
                        "qpth_over_torch",
                        "x_err_vs_daqp",
                        "grad_rel_err",
                    )
                },
            }
            for r in rows
        ],
        [
            "case",
            "threads",
            "method",
            "forward_s",
            "fwd_bwd_s",
            "fwd_bwd_over_daqp",
            "qpth_over_torch",
            "x_err_vs_daqp",
            "grad_rel_err",
            "note",
        ],
    )
    suffix = "_quick" if args.quick else ("_cases" if args.cases else "")
    cmd = COMMAND + (" --quick" if args.quick else "")
    if args.cases:
        cmd += " --cases " + " ".join(args.cases)
    return (
        '### Torch solver (`solver="torch"`): batched dense QPs\n\n'
        f"Command: `{cmd}`. {machine_line(info)} Load average (1 min) at start "
        f"{load[0]:.2f}, at end {load[1]:.2f} (a shared machine: absolute times move with "
        "the load; ratios within one case are measured back to back). Median of "
        f"{args.repeats} after one warm-up (one call for 1024 x n=100). `fwd_bwd_over_daqp`: "
        "torch/qpth forward+backward over the raw daqp loop's forward; `qpth_over_torch`: "
        "qpth forward+backward over the torch solver's; `grad_rel_err`: relative error over "
        "(q, h, b, G, A) against the exact "
        f"reduced-KKT reference on the first {args.n_ref} samples of each batch. GPU: none "
        "was available to this run; the prepared GPU benchmark (batch 4096 x n=50, torch "
        "float64/float32 on the GPU against the CPU daqp loop and qpth on the same GPU, "
        "under 3 minutes) is `python -m benchmarks.qp_torch.gpu` and writes "
        "`benchmarks/qp_torch/results/qp_torch_gpu.json`. The torch solver runs its small "
        "batched matrices at one torch thread whatever the caller's setting "
        "(`dxopt.linalg.threads.small_work`), so the 2-thread rows differ from the 1-thread "
        "rows "
        'only outside the solver. `solver="auto"` on the CPU picks torch only for batches '
        "of at least 512 problems with n <= 10 (`python -m benchmarks.qp_torch.auto_rule`, "
        "`benchmarks/qp_torch/results/auto_rule.json`).\n\n"
        + (
            "A subset of the full set of cases (`--cases`); run the full command "
            f"`{COMMAND}` for the others.\n\n"
            if args.cases
            else ""
        )
        + _targets(rows, quick=args.quick)
        + "\n\n"
        + table
        + f"\n\n![torch solver](benchmarks/qp_torch/results/qp_torch{suffix}.png)\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small case (< 1 minute)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per method")
    parser.add_argument("--n-ref", type=int, default=32, help="samples with a reference grad")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-md", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument(
        "--cases",
        nargs="+",
        default=None,
        help="run only these cases of the full set, e.g. 128x50 (results in qp_torch_cases.*)",
    )
    parser.add_argument(
        "--render", action="store_true", help="rebuild the tables and plot from the saved JSON"
    )
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.quick:
        args.threads = args.threads[:1]
    out = results_dir("qp_torch")
    suffix = "_quick" if args.quick else ("_cases" if args.cases else "")
    cases = QUICK if args.quick else FULL
    if args.cases:
        wanted = {tuple(int(v) for v in c.lower().split("x")) for c in args.cases}
        cases = tuple(c for c in FULL if c in wanted)
        if len(cases) != len(wanted):
            raise ValueError(
                f"--cases: expected some of {[f'{b}x{n}' for b, n in FULL]}, got {args.cases}"
            )
    if args.render:
        saved = json.loads((out / f"qp_torch{suffix}.json").read_text())
        rows, info, load = saved["rows"], saved["machine"], tuple(saved["load"])
        duration = saved.get("duration_s")
    else:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(args.threads)))
        start, load0 = time.perf_counter(), os.getloadavg()[0]
        rows = []
        for threads in args.threads:
            for batch, n in cases:
                repeats = args.repeats if batch * n * n < 5e6 else 1
                rows += run_case(batch, n, threads, repeats, min(args.n_ref, batch))
                print(f"done {batch} x n={n} at {threads} threads", flush=True)
        load, info = (load0, os.getloadavg()[0]), machine_info()
        duration = time.perf_counter() - start
        payload = {"machine": info, "load": list(load), "duration_s": duration, "rows": rows}
        write_json(out / f"qp_torch{suffix}.json", payload)
    section = _section(rows, info, load, args)
    if duration is not None:
        section += f"\nWhole run: {duration:.0f} s.\n"
    area = None if args.quick or args.no_md else "qp_torch"
    publish(out, f"qp_torch{suffix}", section, area=area, plot=lambda path: _plot(rows, path))


if __name__ == "__main__":
    main()
