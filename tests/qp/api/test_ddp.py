"""dxopt.qp under DistributedDataParallel (gloo, 2 CPU processes) equals one process.

Two ranks each train a QP model (see ``_ref_ddp``) on half of a batch for two SGD
steps; the mean loss per rank makes DDP's gradient average equal the full-batch
gradient, so gradients and parameters must match a single process up to round-off.
One spawn serves both backwards (process start-up dominates the run time).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _ref_ddp import STEPS, EnvironmentHang, run_ddp, single_process
from torch import Tensor

BACKWARDS = ("penalty", "kkt")

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available",
)


Records = dict[str, dict[str, Tensor]]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Records], Records]:
    """Records of both ranks, and the single-process references.

    The references run first, so the compiled kernels are in numba's cache before the ranks
    start and load them (three processes compiling at once on a 2-core machine are slow).
    If the ranks hang where no dxopt code is running (process start, the gloo rendezvous or
    its collectives: every rank's stacks free of dxopt frames), the tests skip with the stacks;
    a hang in dxopt's code fails with each rank's stage and stacks.
    """
    out_dir: Path = tmp_path_factory.mktemp("ddp")
    references = {backward: single_process(backward) for backward in BACKWARDS}
    try:
        records = run_ddp(BACKWARDS, out_dir, world_size=2, timeout_s=60.0)
    except EnvironmentHang as hang:
        pytest.skip(f"torch.distributed hung outside dxopt on this machine: {hang}")
    return records, references


@pytest.mark.parametrize("backward", BACKWARDS)
def test_ddp_gradients_and_parameters_match_single_process(
    ddp_run: tuple[list[Records], Records], backward: str
) -> None:
    ddp_records, references = ddp_run
    reference = references[backward]
    expected_keys = {
        f"{prefix}.{name}"
        for prefix in ["initial", *(f"step{s}.grad" for s in range(STEPS)), "final"]
        for name in ("encoder.weight", "encoder.bias", "h")
    }
    assert set(reference) == expected_keys
    for rank, records in enumerate(ddp_records):
        assert set(records[backward]) == expected_keys, f"rank {rank}"
        for key, value in reference.items():
            # Same arithmetic up to the order of the batch sum: round-off only.
            torch.testing.assert_close(
                records[backward][key],
                value,
                rtol=1e-9,
                atol=1e-12,
                msg=lambda m, key=key, rank=rank: f"rank {rank}, {key}: {m}",
            )
    # The gradients are not trivially zero and the parameters moved.
    for step in range(STEPS):
        assert reference[f"step{step}.grad.h"].abs().max() > 1e-6
        assert reference[f"step{step}.grad.encoder.weight"].abs().max() > 1e-6
    for name in ("encoder.weight", "encoder.bias", "h"):
        moved = reference[f"final.{name}"] - reference[f"initial.{name}"]
        assert moved.abs().max() > 1e-6, f"{name} did not move"


def test_ddp_ranks_agree_with_each_other(ddp_run: tuple[list[Records], Records]) -> None:
    """After the all-reduce both ranks hold bit-identical gradients and parameters."""
    first, second = ddp_run[0]
    for backward in BACKWARDS:
        for key, value in first[backward].items():
            assert torch.equal(value, second[backward][key]), f"{backward}: {key}"


def test_a_hang_is_blamed_on_the_environment_only_without_dxopt_frames() -> None:
    """The harness's judge of a hang (:func:`_ref_ddp.hung_outside_dxopt`): a rank whose stacks
    show a frame of the dxopt package, or that dumped none, fails the test; starting, the
    rendezvous, or stacks only in torch/gloo are the environment's."""
    from pathlib import Path

    import _ref_ddp as ref

    import dxopt.qp as dqp

    inside = f'  File "{Path(dqp.__file__).resolve().parent / "api" / "solve.py"}", line 1 in solve'
    outside = '  File "/usr/lib/python3/site-packages/torch/distributed/c10d.py", line 9 in wait'
    training = "training with backward='kkt'"
    assert ref.hung_outside_dxopt([ref.NOT_STARTED, ref.RENDEZVOUS], ["", ""])
    assert ref.hung_outside_dxopt([training, training], [outside, outside])
    assert not ref.hung_outside_dxopt([training, training], [outside, f"{outside}\n{inside}"])
    assert not ref.hung_outside_dxopt([training, ref.RENDEZVOUS], [outside, ""])
