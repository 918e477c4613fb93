"""Calling the n = 5000 sparse conic layer: forward and forward+backward, dxopt vs cvxpylayers.

The layer of benchmarks/conic/construction.py: ``min ||D x - y||_2 + lam ||x||_1`` s.t.
``||x||_2 <= r`` (bidiagonal ``D``, parameters ``y`` and ``r``; canonical n = 2n + 2,
m = 4n + 2 for dxopt). With the issue's ``lam = 1`` the solution is ``x = 0`` for every
parameter (``|D'e|_i <= 1`` for the unit residual direction ``e``), a point where the
Jacobian is singular: the backward is refused there, which the table reports. ``lam = 0.01``
with ``r = ||y|| / 2`` (the ball active) is a regular point, timed forward and
forward+backward. Each peer runs in a fresh subprocess (its own peak RSS) under a
wall-clock cap (``--timeout``) and an address-space cap (``--mem-gib``); one thread.
Each peer's directional derivative of ``dL/dy``
(``L = sum(x)``) along a random direction is compared with central differences of dxopt's
forward at tol 1e-10 (``slope_rel_err``); ``dxopt-kink0`` is dxopt with ``kink_tol=0`` (no
point classified as a kink, so no one-sided rule).

``--crossover`` instead times one forward+backward of dxopt's dense and sparse routes on
least squares with a box and a norm ball (sparse ``P``, ``A``) at growing ``n`` (in this
process), the measurement behind :data:`dxopt.conic.sparse_problem.SPARSE_MIN`.

Run: ``nice python benchmarks/conic/large.py --n 5000`` and
``nice python benchmarks/conic/large.py --crossover``; JSON and Markdown go to
benchmarks/conic/results/large.{json,md} (crossover: large_crossover.{json,md}).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks.common import machine_info, markdown_table, positive_int, results_dir, write_json  # noqa: E402

CHILD = r"""
import json, resource, sys, time, warnings
import numpy as np, scipy.sparse as sp, cvxpy as cp, torch
torch.set_num_threads(1)
n, peer, lam, out = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
D = sp.diags([np.ones(n - 1), -np.ones(n - 1)], [0, 1], shape=(n - 1, n))
x, y, r = cp.Variable(n), cp.Parameter(n - 1), cp.Parameter(nonneg=True)
prob = cp.Problem(cp.Minimize(cp.norm(D @ x - y, 2) + lam * cp.norm(x, 1)), [cp.norm(x, 2) <= r])
if peer.startswith("dxopt"):
    from dxopt.frontend import CvxpyLayer
    kw = {"solver_args": {"kink_tol": 0.0}} if peer == "dxopt-kink0" else {}
else:
    from cvxpylayers.torch import CvxpyLayer
    kw = {}
t0 = time.perf_counter()
layer = CvxpyLayer(prob, parameters=[y, r], variables=[x], **kw)
row = {"build_s": time.perf_counter() - t0}
yv = torch.tensor(np.random.default_rng(0).standard_normal(n - 1))
rv = torch.tensor(0.5 * float(yv.norm()), dtype=torch.float64)
d = torch.tensor(np.random.default_rng(1).standard_normal(n - 1))
t0 = time.perf_counter()
(xs,) = layer(yv, rv)
row["forward_s"] = time.perf_counter() - t0
yg, rg = yv.clone().requires_grad_(), rv.clone().requires_grad_()
t0 = time.perf_counter()
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (xg,) = layer(yg, rg)
        xg.sum().backward()
    row["fwd_bwd_s"] = time.perf_counter() - t0
    row["dL_dy_d"] = float(yg.grad @ d)
    np.savez(out, x=xs.detach().numpy(), gy=yg.grad.numpy())
except Exception as err:  # the refusal is a result, reported as such
    row["backward"] = f"{type(err).__name__}: {str(err)[:90]}"
    np.savez(out, x=xs.detach().numpy())
row["x_nnz"] = int((xs.detach().abs() > 1e-6).sum())
if peer.startswith("dxopt"):
    row["status"] = layer.last_status[0].value
if peer == "dxopt" and lam != 1.0:  # the reference slope: central differences, tight solves
    fd = CvxpyLayer(prob, parameters=[y, r], variables=[x], solver_args={"tol": 1e-10})
    h = 1e-6
    up, down = fd(yv + h * d, rv)[0].sum(), fd(yv - h * d, rv)[0].sum()
    row["fd_slope"] = float(up - down) / (2 * h)
row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(row))
"""


def _peer_rows(args: argparse.Namespace) -> list[dict]:
    cap = args.mem_gib * 2**30

    def limit() -> None:  # runs in the child before exec
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    rows = []
    for lam in (1.0, 0.01):
        for peer in args.peers:
            row: dict = {"peer": peer, "n": args.n, "lam": lam}
            with tempfile.TemporaryDirectory() as tmp:
                out = str(Path(tmp) / "out.npz")
                try:
                    done = subprocess.run(
                        [sys.executable, "-c", CHILD, str(args.n), peer, str(lam), out],
                        capture_output=True, text=True, timeout=args.timeout, check=False,
                        preexec_fn=limit, env=env,
                    )  # fmt: skip
                except subprocess.TimeoutExpired:
                    rows.append({**row, "error": f"over the {args.timeout} s cap (killed)"})
                    continue
                if done.returncode != 0:
                    tail = done.stderr.strip()[-200:]
                    if "MemoryError" in tail or done.returncode < 0:
                        tail = f"over the {args.mem_gib} GiB cap? rc {done.returncode}: {tail}"
                    rows.append({**row, "error": tail})
                    continue
                row.update(json.loads(done.stdout.strip().splitlines()[-1]))
            rows.append(row)
        mine = [row for row in rows if row["lam"] == lam]
        fd = next((row["fd_slope"] for row in mine if "fd_slope" in row), None)
        for row in mine:
            if fd is not None and "dL_dy_d" in row:
                row["slope_rel_err"] = abs(row["dL_dy_d"] - fd) / abs(fd)
    return rows


def _ball_box(n: int):
    """Least squares with a box and a norm ball: tridiagonal sparse ``P``, sparse ``A``."""
    import numpy as np
    import torch

    import dxopt.conic as dc

    f64 = torch.float64
    g = torch.Generator().manual_seed(0)
    idx = torch.arange(n)
    main = 2.0 + torch.rand(n, generator=g, dtype=f64)
    off = -0.5 * torch.ones(n - 1, dtype=f64)
    ij = torch.stack([torch.cat([idx, idx[:-1], idx[1:]]), torch.cat([idx, idx[1:], idx[:-1]])])
    P = torch.sparse_coo_tensor(ij, torch.cat([main, off, off]), (n, n)).coalesce()
    rows = torch.cat([idx, n + idx, 2 * n + 1 + idx])
    vals = torch.cat([torch.ones(n), -torch.ones(n), -torch.ones(n)]).to(f64)
    A = torch.sparse_coo_tensor(torch.stack([rows, idx.repeat(3)]), vals, (3 * n + 1, n))
    q = 0.2 * torch.randn(n, generator=g, dtype=f64)
    radius = 0.1 * float(np.sqrt(n))
    b = torch.cat([torch.full((2 * n,), 0.1, dtype=f64), torch.tensor([radius], dtype=f64),
                   torch.zeros(n, dtype=f64)])  # fmt: skip
    return P, q, A.coalesce(), b, [dc.NonnegCone(2 * n), dc.SecondOrderCone(n + 1)]


def _crossover(sizes: list[int], repeats: int, batches: list[int]) -> list[dict]:
    import torch

    import dxopt.conic as dc

    torch.set_num_threads(1)
    rows = []
    for n, batch in ((n, batch) for batch in batches for n in sizes):
        P, q, A, b, cones = _ball_box(n)
        g = torch.Generator().manual_seed(1)
        q = q + 0.05 * torch.randn(batch, n, generator=g, dtype=q.dtype)  # (batch, n)
        row: dict = {"n": n, "n_plus_m": n + A.shape[0], "batch": batch}
        for route in ("dense", "sparse"):
            best = float("inf")
            for _ in range(repeats):
                qv = q.clone().requires_grad_()
                t0 = time.perf_counter()
                sol = dc.solve(P, qv, A, b, cones=cones, route=route)
                sol.x.sum().backward()
                best = min(best, time.perf_counter() - t0)
            row[f"{route}_s"] = best
        row["dense/sparse"] = row["dense_s"] / row["sparse_s"]
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=positive_int, default=5000)
    parser.add_argument("--timeout", type=positive_int, default=900)
    parser.add_argument("--mem-gib", type=positive_int, default=16)
    parser.add_argument("--peers", nargs="+", default=["dxopt", "dxopt-kink0", "cvxpylayers"])
    parser.add_argument("--crossover", action="store_true")
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=[50, 100, 200, 400, 800])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--batch", type=positive_int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    out_dir = results_dir("conic")
    if args.crossover:
        rows = _crossover(args.sizes, args.repeats, args.batch)
        write_json(out_dir / "large_crossover.json", {"machine": machine_info(), "rows": rows})
        cols = ["n", "n_plus_m", "batch", "dense_s", "sparse_s", "dense/sparse"]
        table = markdown_table(rows, cols)
        (out_dir / "large_crossover.md").write_text(
            "### dxopt.conic dense vs sparse route, one forward+backward (best of "
            f"{args.repeats}, 1 thread)\n\nleast squares with a box and a norm ball, sparse "
            f"P and A\n\n{table}\n"
        )
        print(table)
        return
    rows = _peer_rows(args)
    write_json(out_dir / "large.json", {"machine": machine_info(), "rows": rows})
    cols = ["peer", "n", "lam", "build_s", "forward_s", "fwd_bwd_s", "peak_rss_mib", "x_nnz",
            "status", "dL_dy_d", "fd_slope", "slope_rel_err", "backward", "error"]  # fmt: skip
    table = markdown_table(rows, cols)
    (out_dir / "large.md").write_text(
        f"### Calling the sparse conic layer (n = {args.n}), 1 thread\n\n"
        f"caps per peer: {args.timeout} s, {args.mem_gib} GiB address space; "
        "fwd_bwd_s is a second call with the backward\n\n"
        f"{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()
