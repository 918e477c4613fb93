"""Shared fixtures for the bilevel tests."""

from collections.abc import Iterator

import pytest
import torch

from dxopt.bilevel import RegularizationTask, breast_cancer_regularization


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """These tests use tiny operands, for which intra-op threads only add synchronization
    (measured: a 284x30 matrix-vector product 100x slower with 2 threads on a loaded
    2-core machine). The previous setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def regularization_task() -> RegularizationTask:
    return breast_cancer_regularization()
