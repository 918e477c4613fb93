"""Failure table of ``solver="torch"`` (the device path) on random well-conditioned QPs.

For each configuration (n = 20 and n = 50, float32 and float64, with and without weakly
active rows), ``--size`` random inequality QPs (``m = 3n/2`` rows, cond(P) <= 7, a known
solution with about 30% of the rows active; "weak": 3 further rows per sample active with a
zero multiplier) are solved by ``dxopt.qp.solve(..., solver="torch", on_failure="nan")`` on
``--device`` in chunks of ``--chunk``, and differentiated (``L = w . x``, gradients for
``q`` and ``h``). The table reports:

- ``torch_unsolved``: samples the torch solver itself does not certify (before the fallback);
- ``to_cpu``: samples sent to the CPU path (not certified, or degenerate: weakly active or
  dependent rows), solved there in float64 and brought back;
- ``failures``: samples whose final status is not SOLVED, and ``others_solve``: how many of
  those daqp or piqp in float64 solve (the target is 0);
- ``auto_cpu_failures``: failures of ``solver="auto"`` on the CPU on the same data (the
  float32 target: the device path solves at least as many);
- ``x_err``: the largest :math:`\\|x - x_{ref}\\|_\\infty / (1 + \\|x_{ref}\\|_\\infty)` over
  the solved samples, against daqp in float64 on the same (dtype-rounded) data;
- ``grad_err``: the largest relative error of the ``q``/``h`` gradients against the CPU path
  (``solver="daqp"``, the same backward) on the first chunk;
- ``refusals``: samples in chunks whose backward raised ``QPBackwardError`` (target 0);
- ``seconds``: forward+backward of the device path, the whole configuration.

Run ``python -m benchmarks.qp_torch.failures`` (about 3-4 minutes on 2 cores at 1 thread;
``--quick``: 500 problems per configuration). Writes ``results/failures.json`` and
``results/failures.md`` and the ``qp_torch_failures`` block of BENCHMARKS.md (``--no-md``:
leave BENCHMARKS.md alone).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import torch

from benchmarks.common import machine_info, machine_line, markdown_table, publish, results_dir
from benchmarks.qp_torch.problems import known_solution_batch

COMMAND = "python -m benchmarks.qp_torch.failures"
COLUMNS = (
    "n", "dtype", "weak", "size", "torch_unsolved", "to_cpu", "failures", "others_solve",
    "auto_cpu_failures", "x_err", "x_err_known", "grad_err", "refusals", "seconds",
)  # fmt: skip


def _others_solve(data: dict[str, torch.Tensor], samples: list[int]) -> int:
    """How many of ``samples`` daqp or piqp (float64, no fallback) solves."""
    import dxopt.qp as dqp

    if not samples:
        return 0
    idx = torch.tensor(samples)
    sub = {k: v[idx].double() for k, v in data.items()}
    solved = np.zeros(len(samples), dtype=bool)
    for solver in ("daqp", "piqp"):
        sol = dqp.solve(**sub, solver=solver, fallback=False, on_failure="nan")
        solved |= np.array([s.ok for s in sol.status])
    return int(solved.sum())


def run_config(
    n: int, dtype: torch.dtype, weak: int, size: int, chunk: int, device: str, seed: int
) -> dict[str, Any]:
    import dxopt.qp as dqp
    from dxopt.qp.autograd.torch_entry import torch_qp_solve

    m = 3 * n // 2
    row: dict[str, Any] = {"n": n, "dtype": str(dtype).replace("torch.", ""), "weak": weak}
    row.update(size=size, torch_unsolved=0, to_cpu=0, failures=0, others_solve=0)
    row.update(auto_cpu_failures=0, x_err=0.0, x_err_known=None, grad_err=0.0, refusals=0)
    row["seconds"] = 0.0
    for k, lo in enumerate(range(0, size, chunk)):
        B = min(chunk, size - lo)
        exact, known = known_solution_batch(B, n, m, seed + lo, weak=weak)
        data = {k: v.to(dtype) for k, v in exact.items()}
        on_dev = {k: v.to(device) for k, v in data.items()}
        raw = torch_qp_solve(on_dev["P"], on_dev["q"], G=on_dev["G"], h=on_dev["h"])
        row["torch_unsolved"] += int((~raw.solved).sum())
        leaves = {k: v.clone().requires_grad_(k in "qh") for k, v in on_dev.items()}
        w = torch.randn(B, n, generator=torch.Generator().manual_seed(lo), dtype=torch.float64)
        start = time.perf_counter()
        sol = dqp.solve(**leaves, solver="torch", on_failure="nan")
        ok = np.array([s.ok for s in sol.status])
        try:
            x = torch.where(torch.isnan(sol.x), 0.0, sol.x)
            grads = torch.autograd.grad((w.to(x) * x).sum(), [leaves["q"], leaves["h"]])
        except dqp.QPBackwardError:
            row["refusals"] += B
            grads = None
        row["seconds"] += time.perf_counter() - start
        row["to_cpu"] += sum(s != "torch" for s in sol.info.sample_solvers)
        failed = np.flatnonzero(~ok).tolist()
        row["failures"] += len(failed)
        row["others_solve"] += _others_solve(data, failed)
        auto = dqp.solve(**data, solver="auto", on_failure="nan")
        row["auto_cpu_failures"] += sum(not s.ok for s in auto.status)
        ref = dqp.solve(**{k: v.double() for k, v in data.items()}, solver="daqp",
                        on_failure="nan")  # fmt: skip
        xs, xr = sol.x.detach().cpu().double()[ok], ref.x[ok]
        err = (xs - xr).abs().amax(-1) / (1.0 + xr.abs().amax(-1))
        row["x_err"] = max(row["x_err"], float(err.max()) if err.numel() else 0.0)
        if dtype == torch.float64:  # the known solution (float32 rounds the data: another QP)
            xk = torch.from_numpy(known)[ok]
            err = (xs - xk).abs().amax(-1) / (1.0 + xk.abs().amax(-1))
            row["x_err_known"] = max(row["x_err_known"] or 0.0, float(err.max()))
        if k == 0 and grads is not None:
            cpu = {k: v.double().clone().requires_grad_(k in "qh") for k, v in data.items()}
            csol = dqp.solve(**cpu, solver="daqp", on_failure="nan")
            cx = torch.where(torch.isnan(csol.x), 0.0, csol.x)
            ref_g = torch.autograd.grad((w * cx).sum(), [cpu["q"], cpu["h"]])
            both = ok & np.array([s.ok for s in csol.status])
            for g, r in zip(grads, ref_g):
                g, r = g.detach().cpu().double()[both], r[both]
                rel = float((g - r).norm() / r.norm().clamp_min(1e-300))
                row["grad_err"] = max(row["grad_err"], rel)
    return row


def main(argv: list[str] | None = None) -> None:
    import warnings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 problems per configuration")
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-md", action="store_true", help="leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    size = 500 if args.quick else args.size
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the CPU path's degenerate warnings: counted, not shown
    load0 = os.getloadavg()[0]
    rows = []
    for n in (20, 50):
        for dtype in (torch.float32, torch.float64):
            for weak in (0, 3):
                row = run_config(n, dtype, weak, size, args.chunk, args.device, args.seed)
                print(row, flush=True)
                rows.append(row)
    load1 = os.getloadavg()[0]
    info = machine_info()
    out = results_dir("qp_torch")
    from benchmarks.common import write_json

    write_json(out / "failures.json", {"machine": info, "device": args.device, "rows": rows,
                                       "load": [load0, load1]})  # fmt: skip
    text = "\n".join(
        [
            '### Torch solver (`solver="torch"`): failures on random well-conditioned QPs',
            "",
            f"Command: `{COMMAND}`{' --quick' if args.quick else ''}. {machine_line(info)} "
            f"Device: {args.device}; 1 torch thread. Load average (1 min) at start "
            f"{load0:.2f}, at end {load1:.2f}. {size} problems per row, m = 3n/2 inequality "
            "rows, cond(P) <= 7, a known solution with about 30% of the rows active; "
            "`weak`: rows per sample active with a zero multiplier. `torch_unsolved`: not "
            "certified by the torch solver itself; `to_cpu`: sent to the CPU fallback chain "
            "and degenerate rules (uncertified or degenerate); `failures`: final status not "
            "SOLVED, `others_solve`: of those, solved by daqp or piqp in float64 (target 0); "
            '`auto_cpu_failures`: `solver="auto"` on the CPU, same data; `x_err`: max '
            "relative x error against daqp in float64 on the same data; `x_err_known`: against "
            "the known solution (float64 rows; float32 rounding makes another QP); "
            "`grad_err`: q/h gradients against the CPU path (first chunk; where every sample "
            "takes the CPU path this compares the CPU path with itself, hence 0 or round-off); "
            "`refusals`: backward refusals (target 0); `seconds`: forward+backward of the "
            "device path (the CPU path's share included).",
            "",
            markdown_table(rows, COLUMNS),
        ]
    )
    publish(out, "failures", text, area=None if args.no_md else "qp_torch_failures")


if __name__ == "__main__":
    main()
