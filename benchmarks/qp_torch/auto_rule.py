"""The measurement behind ``solver="auto"`` on the CPU (`default_solver`).

``dxopt.qp.solve`` forward+backward (``L = w . x``) with ``solver="daqp"`` and
``solver="torch"`` back to back in one process at 1 torch thread, on dQP's random dense QPs
(:func:`benchmarks.qp.generators.batched_dense`, ``m = n``, ``p = n/2``), batch sizes 1 to 2048
and n = 10 to 100 (the cells of ``CELLS``). Medians of 5 (3 for the larger cells) after a
warm-up. Writes ``results/auto_rule.json`` and prints the torch/daqp ratios.
Run ``python -m benchmarks.qp_torch.auto_rule`` (about 2 minutes on 2 cores), ``--quick``
for one cell.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from benchmarks.common import results_dir, write_json
from benchmarks.qp.generators import batched_dense

NAMES = ("P", "q", "A", "b", "G", "h")
CELLS = (
    *((b, 10) for b in (1, 32, 128, 512, 2048)),
    *((b, 20) for b in (1, 128, 1024)),
    *((b, 50) for b in (1, 32, 128)),
    *((b, 100) for b in (1, 32)),
)


def measure(batch: int, n: int, repeats: int) -> dict[str, float]:
    import dxopt.qp as dqp

    probs = batched_dense(batch, n, n, -(-n // 2), seed=0)
    base = [torch.from_numpy(np.stack([getattr(p, k) for p in probs])) for k in NAMES]
    if batch == 1:
        base = [t[0] for t in base]
    w = torch.randn(base[1].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out: dict[str, float] = {"B": batch, "n": n}
    for solver in ("daqp", "torch"):

        def once() -> float:
            ins = [t.clone().requires_grad_() for t in base]
            t0 = time.perf_counter()
            sol = dqp.solve(**dict(zip("PqAbGh", ins)), solver=solver)  # noqa: B023
            (w * sol.x).sum().backward()
            return time.perf_counter() - t0

        once()
        out[f"{solver}_s"] = statistics.median(once() for _ in range(repeats))
    out["torch_over_daqp"] = out["torch_s"] / out["daqp_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one cell (< 30 s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cells = [(8, 10)] if args.quick else list(CELLS)
    load0, rows = os.getloadavg()[0], []
    for b, n in cells:
        rows.append(measure(b, n, 5 if b * n * n < 1e5 else 3))
        print(f"B={b:4d} n={n:3d}: torch/daqp {rows[-1]['torch_over_daqp']:.2f}", flush=True)
    payload = {"load": [load0, os.getloadavg()[0]], "threads": 1, "rows": rows}
    write_json(results_dir("qp_torch") / f"auto_rule{'_quick' if args.quick else ''}.json", payload)


if __name__ == "__main__":
    main()
