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
from datetime import timedelta
from pathlib import Path

import torch
from qp_zoo import complementary_qp
from torch import Tensor, nn

import dxopt.qp as dqp

N_VARIABLES = 6
N_FEATURES = 4
BATCH = 8
STEPS = 2
LEARNING_RATE = 0.05
STACK_DUMP_S = 40.0
RENDEZVOUS = "gloo rendezvous (init_process_group)"
NOT_STARTED = "not started (spawning the process)"


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
    all backwards: start-up dominates).

    The rank writes the stage it has reached to ``rank{r}.stage`` and, if it is still running
    after :data:`STACK_DUMP_S` seconds, the Python stacks of its threads to ``rank{r}.stacks``:
    :func:`run_ddp` puts both into its error, so a hang says where it hung.
    """
    import faulthandler

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    folder = Path(out_dir)
    stacks = open(folder / f"rank{rank}.stacks", "w")  # noqa: SIM115 (open until exit)
    faulthandler.dump_traceback_later(STACK_DUMP_S, file=stacks)

    def stage(text: str) -> None:
        (folder / f"rank{rank}.stage").write_text(text)

    if os.path.exists("/sys/class/net/lo"):  # Linux loopback: keep gloo off other interfaces
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    stage(RENDEZVOUS)
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
            stage(f"training with backward={backward!r}")
            model = DistributedDataParallel(QPRegressor(backward))
            records[backward] = train(model, features[shard], targets[shard])
        stage("saving the records")
        torch.save(records, folder / f"rank{rank}.pt")
        stage("done")
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


class EnvironmentHang(RuntimeError):
    """The ranks hung twice, and nowhere in dxopt: every rank was still starting or in the gloo
    rendezvous, or the stacks every rank dumped show no frame of the dxopt package (a hang in
    process start, the process group or its collectives: an environment fault, not a dxopt
    result; the import of dxopt itself is tested everywhere else)."""


def _report(out_dir: Path, world_size: int) -> tuple[list[str], list[str]]:
    """Each rank's stage and its dumped stacks (empty if it dumped none)."""
    stages, stacks = [], []
    for rank in range(world_size):
        stage_file = out_dir / f"rank{rank}.stage"
        stages.append(stage_file.read_text() if stage_file.exists() else NOT_STARTED)
        stack_file = out_dir / f"rank{rank}.stacks"
        stacks.append(stack_file.read_text() if stack_file.exists() else "")
    return stages, stacks


def hung_outside_dxopt(stages: list[str], stacks: list[str]) -> bool:
    """True if no rank can be hanging in dxopt's code: every rank is starting or in the
    rendezvous, or every rank dumped its stacks and none shows a frame of the dxopt package."""
    if all(stage in (NOT_STARTED, RENDEZVOUS) for stage in stages):
        return True
    package = str(Path(dqp.__file__).resolve().parents[1]) + os.sep
    return all(text.strip() and package not in text for text in stacks)


def run_ddp(
    backwards: tuple[str, ...],
    out_dir: Path,
    *,
    world_size: int = 2,
    timeout_s: float = 120.0,
) -> list[dict[str, dict[str, Tensor]]]:
    """Spawn ``world_size`` ranks; return per rank ``{backward: records}``.

    The ranks are terminated if they have not finished after ``timeout_s`` seconds and started
    once more with a fresh rendezvous file (a TCP rendezvous on a picked free port hung in two
    full runs; alone the ranks finish in about 5 s). A second timeout raises
    :class:`EnvironmentHang` if no rank hangs in dxopt's code (:func:`hung_outside_dxopt`),
    else ``TimeoutError``; both carry the stage and the Python stacks of each rank.
    """
    import torch.multiprocessing as mp

    for attempt in range(2):  # a rendezvous can hang (seen in 2 full runs): start once more
        run_dir = out_dir / f"attempt{attempt}"
        run_dir.mkdir(parents=True, exist_ok=True)
        context = mp.start_processes(
            ddp_worker,
            args=(world_size, str(run_dir / "rendezvous"), tuple(backwards), str(run_dir)),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError
            break
        except TimeoutError:
            if attempt:
                stages, stacks = _report(run_dir, world_size)
                dumped = "\n".join(f"--- rank {r} ---\n{t}" for r, t in enumerate(stacks))
                kind = EnvironmentHang if hung_outside_dxopt(stages, stacks) else TimeoutError
                raise kind(
                    f"DDP ranks did not finish within {timeout_s} s (twice); stage per rank: "
                    f"{stages}\n{dumped}"
                ) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                    process.join(5)
    return [torch.load(run_dir / f"rank{rank}.pt") for rank in range(world_size)]
