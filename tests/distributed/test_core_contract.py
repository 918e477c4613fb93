"""dxopt.distributed on dxopt._core: its errors derive from DxoptError (input errors also from
ValueError/TypeError), its option checks are the shared validators' (same messages), and its
stats give a Cost record. No Ray cluster needed."""

from __future__ import annotations

import pytest
import torch

from dxopt._core import Cost, DxoptError
from dxopt.distributed import (
    DistributedError,
    DistributedTypeError,
    DistributedValueError,
    ExecutorStats,
    RayExecutor,
)
from dxopt.distributed._chunks import layout_of


def test_error_bases() -> None:
    assert issubclass(DistributedValueError, DxoptError) and issubclass(
        DistributedValueError, ValueError
    )
    assert issubclass(DistributedTypeError, DxoptError) and issubclass(
        DistributedTypeError, TypeError
    )
    assert issubclass(DistributedError, DxoptError) and issubclass(DistributedError, RuntimeError)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_workers": 0}, DistributedValueError, "num_workers: expected an integer >= 1"),
        ({"num_workers": True}, DistributedValueError, "num_workers"),
        ({"chunk_size": 2.5}, DistributedValueError, "chunk_size"),
        ({"torch_threads": -1}, DistributedValueError, "torch_threads"),
        ({"max_stored_chunks": 0}, DistributedValueError, "max_stored_chunks"),
        ({"num_cpus_per_worker": 0.0}, DistributedValueError, "num_cpus_per_worker"),
        ({"num_cpus_per_worker": float("inf")}, DistributedValueError, "num_cpus_per_worker"),
        ({"start_timeout": -1}, DistributedValueError, "start_timeout: .*seconds"),
        ({"address": 3}, DistributedTypeError, "address"),
        ({"progress": "print"}, DistributedTypeError, "progress: expected a callable"),
    ],
)
def test_bad_options_are_input_errors_naming_the_option(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        RayExecutor(**kwargs)


def test_bad_inputs_are_input_errors() -> None:
    q = torch.zeros(3, 2, dtype=torch.float64)
    P = torch.eye(2, dtype=torch.float64)
    with pytest.raises(DistributedTypeError, match=r"P: expected a torch\.Tensor"):
        layout_of(([[1.0]], q, None, None, None, None, None, None, None))
    with pytest.raises(DistributedValueError, match="dense tensors"):
        layout_of((P.to_sparse(), q, None, None, None, None, None, None, None))
    with pytest.raises(DistributedValueError, match="batch sizes"):
        layout_of((P, q, None, None, None, None, None, None, torch.zeros(4, 2)))


def test_stats_cost_record() -> None:
    stats = ExecutorStats(chunks=4, backward_chunks=3, seconds=1.5)
    assert stats.cost == Cost(forwards=4, backwards=3)
    assert stats.cost.seconds == 1.5
    assert ExecutorStats().cost == Cost()
