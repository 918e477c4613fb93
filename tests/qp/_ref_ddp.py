"""DistributedDataParallel harness: a model with a QP layer trained on 1 or 2 CPU ranks.

The model maps features to the linear term of a QP, :math:`q = W f + c`, and also
learns the shared (unbatched, broadcast) right-hand side :math:`h` of ``Gx <= h``; its
output is the QP solution :math:`x^\\star(q, h)`. The loss is the *mean* squared error
over the samples a rank holds. DDP averages gradients over ranks, so with equal shards

.. math::

    \\tfrac12\\big(\\nabla \\tfrac{1}{B/2}\\textstyle\\sum_{i\\in S_0} \\ell_i
    + \\nabla \\tfrac{1}{B/2}\\sum_{i\\in S_1} \\ell_i\\big)
    = \\nabla \\tfrac1B \\sum_{i} \\ell_i,

i.e. the gradients (and SGD iterates) must equal a single process on the full batch.
The worker lives in this module (not in the test file) so spawned children import it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
from qp_zoo import complementary_qp
from torch import Tensor, nn

import dxopt.qp as dqp

T = TypeVar("T")

N_VARIABLES = 6
N_FEATURES = 4
BATCH = 8
STEPS = 2
LEARNING_RATE = 0.05


class QPRegressor(nn.Module):
    """Linear encoder -> q; trainable shared h; fixed P, A, b, G; a ``dxopt.qp.QPLayer``."""

    def __init__(self, backward: str) -> None:
        super().__init__()
        problem = complementary_qp(N_VARIABLES, m=5, p=1, n_active=2, seed=11)
        assert problem.G is not None and problem.h is not None and problem.A is not None
        generator = torch.Generator().manual_seed(3)
        self.encoder = nn.Linear(N_FEATURES, N_VARIABLES, dtype=torch.float64)
        with torch.no_grad():
            self.encoder.weight.copy_(
                0.3 * torch.randn(N_VARIABLES, N_FEATURES, generator=generator, dtype=torch.float64)
            )
            self.encoder.bias.copy_(problem.q)
        self.h = nn.Parameter(problem.h.clone())
        self.register_buffer("P", problem.P)
        self.register_buffer("A", problem.A)
        self.register_buffer("b", problem.b)
        self.register_buffer("G", problem.G)
        self.backward_name = backward

    def forward(self, features: Tensor) -> Tensor:

        q = self.encoder(features)
        solution = dqp.solve(
            self.P, q, A=self.A, b=self.b, G=self.G, h=self.h, backward=self.backward_name
        )
        return solution.x


def training_data() -> tuple[Tensor, Tensor]:
    """Fixed features and targets for the full batch."""
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(BATCH, N_FEATURES, generator=generator, dtype=torch.float64)
    targets = torch.randn(BATCH, N_VARIABLES, generator=generator, dtype=torch.float64)
    return features, targets


def train(model: nn.Module, features: Tensor, targets: Tensor) -> dict[str, Tensor]:
    """Run ``STEPS`` SGD steps; record the initial parameters, each step's gradients and the
    final parameters."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    named = dict(model.named_parameters())
    records = {f"initial.{_plain(k)}": v.detach().clone() for k, v in named.items()}
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = ((model(features) - targets) ** 2).sum(dim=-1).mean()
        loss.backward()
        for name, parameter in named.items():
            assert parameter.grad is not None
            records[f"step{step}.grad.{_plain(name)}"] = parameter.grad.detach().clone()
        optimizer.step()
    for name, parameter in named.items():
        records[f"final.{_plain(name)}"] = parameter.detach().clone()
    return records


def _plain(name: str) -> str:
    return name.removeprefix("module.")


def single_process(backward: str) -> dict[str, Tensor]:
    """Reference: one process, full batch."""
    features, targets = training_data()
    return train(QPRegressor(backward), features, targets)


def ddp_worker(
    rank: int, world_size: int, store: str, backwards: tuple[str, ...], out_dir: str
) -> None:
    """One DDP rank: gloo over the loopback interface, rendezvous through the file ``store``
    (a FileStore: no TCP port to pick, so no port race with other processes); for each
    backward, train a fresh model on this rank's shard and save the records (one spawn serves
    all backwards: start-up dominates)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if os.path.exists("/sys/class/net/lo"):  # Linux loopback: keep gloo off other interfaces
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=30),
    )
    try:
        features, targets = training_data()
        shard = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)
        records = {}
        for backward in backwards:
            model = DistributedDataParallel(QPRegressor(backward))
            records[backward] = train(model, features[shard], targets[shard])
        torch.save(records, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ddp(
    backwards: tuple[str, ...],
    out_dir: Path,
    *,
    world_size: int = 2,
    timeout_s: float = 60.0,
    while_waiting: Callable[[], T] | None = None,
) -> tuple[list[dict[str, dict[str, Tensor]]], T | None]:
    """Spawn ``world_size`` ranks; return per rank ``{backward: records}``.

    ``while_waiting`` (e.g. the single-process reference) runs in this process while the ranks
    start up, and its result is returned alongside. The ranks are terminated if they have not
    finished after ``timeout_s`` seconds, and started once more with a fresh rendezvous file (a
    TCP rendezvous on a picked free port hung in two full runs; alone the ranks finish in about
    5 s).
    """
    import torch.multiprocessing as mp

    meanwhile: T | None = None
    for attempt in range(2):  # a rendezvous can hang (seen in 2 full runs): start once more
        context = mp.start_processes(
            ddp_worker,
            args=(
                world_size,
                str(out_dir / f"rendezvous{attempt}"),
                tuple(backwards),
                str(out_dir),
            ),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        try:
            if attempt == 0 and while_waiting is not None:
                meanwhile = while_waiting()
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"DDP ranks did not finish within {timeout_s} s")
            break
        except TimeoutError:
            if attempt:
                raise
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                    process.join(5)
    records = [torch.load(out_dir / f"rank{rank}.pt") for rank in range(world_size)]
    return records, meanwhile
