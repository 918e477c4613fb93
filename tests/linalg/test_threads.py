"""dxopt.linalg.limit_threads: caps torch's intra-op threads inside a block, restores after."""

from __future__ import annotations

import pytest
import torch

from dxopt.linalg.threads import limit_threads


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_caps_and_restores(two_threads):
    with limit_threads(1) as inside:
        assert inside == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_restores_when_the_block_raises(two_threads):
    with pytest.raises(RuntimeError, match="boom"), limit_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_never_raises_the_count_and_ignores_other_devices(two_threads):
    with limit_threads(4) as inside:
        assert inside == 2 and torch.get_num_threads() == 2
    with limit_threads(1, device="cuda") as inside:  # no CUDA needed: nothing is allocated
        assert inside == 2 and torch.get_num_threads() == 2
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_bad_thread_count_raises_value_error(bad):
    with pytest.raises(ValueError, match="num_threads must be a positive int"), limit_threads(bad):
        pass


def test_torch_qp_solver_runs_small_problems_at_one_thread(two_threads, monkeypatch):
    """The torch QP solver's factorizations see one thread for small batched matrices."""
    import dxopt.qp._torch_solver as ts

    seen = []
    chol = ts._chol

    def spy(H):
        seen.append(torch.get_num_threads())
        return chol(H)

    monkeypatch.setattr(ts, "_chol", spy)
    d = torch.float64
    ts.torch_qp_solve(
        torch.eye(3, dtype=d),
        torch.ones(3, dtype=d),
        G=-torch.eye(3, dtype=d),
        h=torch.zeros(3, dtype=d),
    )
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2
