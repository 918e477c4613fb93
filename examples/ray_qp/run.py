"""Decision-focused learning with a QP layer whose batch is solved on a Ray cluster.

Each sample ``i`` has features :math:`z_i \\in \\mathbb R^k` and an unseen cost vector
:math:`c_i = W^\\star z_i + \\varepsilon_i`. A linear model predicts :math:`\\hat c_i = W z_i`
and the decision is the regularised allocation

.. math::

    x_i(\\hat c_i) = \\arg\\min_x\\ \\tfrac{\\lambda}{2}\\|x\\|^2 + \\hat c_i^\\top x
    \\quad\\text{s.t.}\\quad \\mathbf 1^\\top x = 1,\\ 0 \\le x \\le u,

trained end to end on the realised cost :math:`\\tfrac1B\\sum_i c_i^\\top x_i(\\hat c_i)`
(Donti, Amos & Kolter, arXiv 1703.04529). The batch of QPs goes through
``dqp.QPLayer(executor=RayExecutor(...))``: chunks are solved on long-lived Ray actors and the
backward returns to the actor that solved each chunk. The first step is checked against the
local layer (same loss and gradient). ``ray.init()`` is called here with a local 2-CPU cluster,
or ``ray.init(address=...)`` with ``--address`` for a running one. Run
``dxopt demo ray_qp`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

import dxopt.qp as dqp
from dxopt.distributed import RayExecutor


def make_task(batch: int, n: int, k: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Features, true costs and the shared constraint data of the allocation QP."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    W_star = torch.randn(n, k, generator=g, dtype=dt)
    z = torch.randn(batch, k, generator=g, dtype=dt)
    c = z @ W_star.T + 0.5 * torch.randn(batch, n, generator=g, dtype=dt)
    return {
        "z": z,
        "c": c,
        "P": 0.1 * torch.eye(n, dtype=dt),
        "A": torch.ones(1, n, dtype=dt),
        "b": torch.ones(1, dtype=dt),
        "lb": torch.zeros(n, dtype=dt),
        "ub": torch.full((n,), max(0.3, 2.0 / n), dtype=dt),
    }


def realised_cost(layer: dqp.QPLayer, W: torch.Tensor, task: dict[str, torch.Tensor]) -> Any:
    sol = layer(task["P"], task["z"] @ W.T, A=task["A"], b=task["b"], lb=task["lb"], ub=task["ub"])
    return (task["c"] * sol.x).sum(-1).mean(), sol


def run(
    *,
    batch: int,
    n: int,
    k: int,
    steps: int,
    workers: int,
    chunk_size: int,
    address: str | None = None,
    executor: RayExecutor | None = None,
) -> dict[str, Any]:
    """Train for ``steps`` steps; ``executor``: a started one to use instead of a new one."""
    import ray

    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address)
    task = make_task(batch, n, k)
    W = torch.zeros(n, k, dtype=torch.float64, requires_grad=True)
    local = dqp.QPLayer()
    own = executor is None
    if executor is None:
        executor = RayExecutor(num_workers=workers, chunk_size=chunk_size).start()
    try:
        remote = dqp.QPLayer(executor=executor)
        loss_l, _ = realised_cost(local, W, task)
        (g_local,) = torch.autograd.grad(loss_l, W)
        loss_r, _ = realised_cost(remote, W, task)
        (g_remote,) = torch.autograd.grad(loss_r, W)
        check = float((g_local - g_remote).abs().max())
        print(f"step 0: loss local {loss_l.item():.6f}, Ray {loss_r.item():.6f}; "
              f"max |grad difference| = {check:.1e}")  # fmt: skip
        opt = torch.optim.Adam([W], lr=0.1)
        history = []
        t0 = time.perf_counter()
        for step in range(steps):
            opt.zero_grad()
            loss, sol = realised_cost(remote, W, task)
            loss.backward()
            opt.step()
            history.append(loss.item())
            solved = sum(s.ok for s in sol.status)
            print(f"step {step + 1}: realised cost {loss.item():+.4f} ({solved}/{batch} solved)")
        elapsed = time.perf_counter() - t0
        stats = executor.stats
    finally:
        if own:
            executor.shutdown()
    with torch.no_grad():
        uniform = float(task["c"].mean(-1).mean())  # x = 1/n (feasible since 1/n <= u)
    print(f"{steps} steps of {batch} QPs (fwd + bwd) in {elapsed:.1f} s "
          f"({steps * batch / elapsed:.0f} QPs/s on {workers} workers); uniform allocation "
          f"costs {uniform:+.4f}; executor stats: {stats}")  # fmt: skip
    return {"grad_check": check, "history": history, "uniform": uniform, "stats": stats}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--batch", type=int, default=None, help="QPs per step (default 4000)")
    parser.add_argument("--n", type=int, default=20, help="assets per QP")
    parser.add_argument("--features", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="default 10")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=500)
    parser.add_argument("--address", default=None, help="a running Ray cluster's address")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run(
        batch=args.batch or (200 if args.quick else 4000),
        n=args.n,
        k=args.features,
        steps=args.steps or (2 if args.quick else 10),
        workers=args.workers,
        chunk_size=50 if args.quick else args.chunk_size,
        address=args.address,
    )


if __name__ == "__main__":
    main()
