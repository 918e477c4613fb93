"""GPU benchmark of the torch QP solver: batch 4096 x n=50, forward+backward, one short script.

Issue 10's GPU target: ``solver="torch"`` forward+backward on the GPU >= 10x faster than the
raw daqp loop on the CPU and than qpth on the same GPU. Problems: dQP's random dense QPs
(:func:`benchmarks.qp.generators.batched_dense`, ``m = n``, ``p = n/2``). Methods:

- ``torch`` (float64 and float32): :func:`dxopt.qp.solvers.torch_ipm.torch_qp_solve` on the device,
  forward and backward of ``L = sum(w * x)`` with gradients for all six inputs;
- ``daqp loop``: raw ``qpsolvers`` daqp solves, one per sample, on the CPU (forward only);
- ``qpth``: qpth's batched interior point on the same device, float64, forward+backward
  (recorded as missing when qpth is not installed).

Times: ``torch.cuda.synchronize()`` before every clock read; median of ``--repeats`` calls
after one untimed warm-up (CUDA context, cuSOLVER handles); the daqp loop runs once.
Accuracy: ``max |x - x_daqp|`` and the relative gradient error over (q, h, b, G, A) against
the exact reduced-KKT reference of :mod:`benchmarks.qp.reference` on the first ``--n-ref``
samples. Writes ``results/qp_torch_gpu.json`` (``--device cpu`` only for a smoke test, to
``qp_torch_gpu_cpu.json``). Without CUDA the script refuses (exit status 2, no file written).

Run: ``python -m benchmarks.qp_torch.gpu`` (under 3 minutes on one GPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.common import machine_info, results_dir, write_json
from benchmarks.qp.generators import batched_dense
from benchmarks.qp.reference import reference_grads

NAMES = ("P", "q", "A", "b", "G", "h")
BLOCKS = ("q", "h", "b", "G", "A")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], tuple[float, float, Any]], repeats: int) -> tuple[float, float, Any]:
    fn()  # warm-up
    runs = [fn() for _ in range(repeats)]
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        runs[-1][2],
    )


def _grad_error(grads: dict[str, np.ndarray], refs: list[dict[str, np.ndarray]]) -> float:
    num = den = 0.0
    for i, ref in enumerate(refs):
        for k in BLOCKS:
            num += float(np.sum((grads[k][i] - ref[k]) ** 2))
            den += float(np.sum(ref[k] ** 2))
    return float(np.sqrt(num / den))


def run_torch(base: list[torch.Tensor], w: torch.Tensor, repeats: int) -> dict[str, Any]:
    from dxopt.qp.autograd.torch_entry import torch_qp_solve

    dev = base[0].device

    def once() -> tuple[float, float, Any]:
        ins = [t.clone().requires_grad_() for t in base]
        _sync(dev)
        t0 = time.perf_counter()
        r = torch_qp_solve(*ins)
        _sync(dev)
        t1 = time.perf_counter()
        (w * r.x).sum().backward()
        _sync(dev)
        return t1 - t0, time.perf_counter() - t1, (r, ins)

    t_f, t_b, (r, ins) = _timed(once, repeats)
    grads = {k: t.grad.double().cpu().numpy() for k, t in zip(NAMES, ins)}
    solved = int((r.status == 0).sum())
    return {
        "forward_s": t_f,
        "fwd_bwd_s": t_f + t_b,
        "x": r.x.detach().double().cpu().numpy(),
        "grads": grads,
        "note": f"{solved}/{len(r.status)} solved, {int(r.iterations.max())} iterations",
    }


def run_qpth(base: list[torch.Tensor], w: torch.Tensor, repeats: int) -> dict[str, Any]:
    try:
        from qpth.qp import QPFunction
    except ImportError:
        return {"missing": "qpth not installed (make bench-peers)"}
    dev = base[0].device

    def once() -> tuple[float, float, Any]:
        ins = [t.clone().requires_grad_() for t in base]
        _sync(dev)
        t0 = time.perf_counter()
        x = QPFunction(verbose=-1)(ins[0], ins[1], ins[4], ins[5], ins[2], ins[3])
        _sync(dev)
        t1 = time.perf_counter()
        (w * x).sum().backward()
        _sync(dev)
        return t1 - t0, time.perf_counter() - t1, (x, ins)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_f, t_b, (x, ins) = _timed(once, repeats)
    return {
        "forward_s": t_f,
        "fwd_bwd_s": t_f + t_b,
        "x": x.detach().cpu().numpy(),
        "grads": {k: t.grad.cpu().numpy() for k, t in zip(NAMES, ins)},
        "note": "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test)")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-ref", type=int, default=16)
    parser.add_argument("--no-qpth", action="store_true", help="skip qpth")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks.qp_torch.gpu: CUDA is not available on this machine; nothing was run "
            "and no result was written. Run it on a machine with a GPU, or pass --device cpu "
            "for a smoke test of the script.",
            file=sys.stderr,
        )
        return 2
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device: expected cuda or cpu, got {args.device!r}")
    torch.set_num_threads(1)
    load0, start = os.getloadavg()[0], time.perf_counter()
    n, batch = args.n, args.batch
    probs = batched_dense(batch, n, n, -(-n // 2), seed=0)
    w_np = np.random.default_rng(1).standard_normal((batch, n))
    refs = [
        reference_grads(p, w_np[i], matrices=True)[0] for i, p in enumerate(probs[: args.n_ref])
    ]
    import qpsolvers

    problems = [qpsolvers.Problem(p.P, p.q, p.G, p.h, p.A, p.b) for p in probs]
    t0 = time.perf_counter()
    x_daqp = np.stack([qpsolvers.solve_problem(pr, solver="daqp").x for pr in problems])
    daqp_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = [
        {"method": "daqp loop (CPU, forward only)", "forward_s": daqp_s, "fwd_bwd_s": None}
    ]
    host = [torch.from_numpy(np.stack([getattr(p, k) for p in probs])) for k in NAMES]
    for dtype in (torch.float64, torch.float32):
        base = [t.to(device, dtype) for t in host]
        rec = run_torch(base, torch.from_numpy(w_np).to(device, dtype), args.repeats)
        rows.append({"method": f"torch {str(dtype).removeprefix('torch.')}", **rec})
    if not args.no_qpth:
        base = [t.to(device) for t in host]
        rec = run_qpth(base, torch.from_numpy(w_np).to(device), args.repeats)
        rows.append({"method": "qpth float64", **rec})
    for row in rows:
        if "x" in row:
            row["x_err_vs_daqp"] = float(np.abs(row.pop("x") - x_daqp).max())
            row["grad_rel_err"] = _grad_error(row.pop("grads"), refs)
            row["daqp_over_this"] = daqp_s / row["fwd_bwd_s"]
    qpth = next((r for r in rows if r["method"] == "qpth float64" and "fwd_bwd_s" in r), None)
    for row in rows:
        if qpth is not None and row["method"].startswith("torch"):
            row["qpth_over_this"] = qpth["fwd_bwd_s"] / row["fwd_bwd_s"]
    info = machine_info()
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    payload = {
        "machine": info,
        "device": str(device),
        "case": f"{batch} x n={n} (m={n}, p={-(-n // 2)})",
        "load": [load0, os.getloadavg()[0]],
        "duration_s": time.perf_counter() - start,
        "rows": rows,
    }
    suffix = "" if device.type == "cuda" else "_cpu"
    write_json(results_dir("qp_torch") / f"qp_torch_gpu{suffix}.json", payload)
    for row in rows:
        print({k: v for k, v in row.items()}, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
