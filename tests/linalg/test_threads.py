"""dxopt.linalg.threads.small_work: one intra-op thread for small blocks, restored after."""

from __future__ import annotations

import pytest
import torch

from dxopt.linalg.threads import small_work


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_caps_small_work_and_restores(two_threads):
    with small_work(1e3):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_large_work_keeps_the_threads(two_threads):
    with small_work(1e9):
        assert torch.get_num_threads() == 2
    with small_work(1e3, limit=0):
        assert torch.get_num_threads() == 2


def test_restores_when_the_block_raises(two_threads):
    with pytest.raises(RuntimeError, match="boom"), small_work(1.0):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(("n", "expected"), [(50, {1}), (257, {2})])
def test_torch_qp_solver_runs_small_matrices_at_one_thread(two_threads, monkeypatch, n, expected):
    """The torch QP solver's factorizations see one thread for small batched matrices (n and
    m at most 256) and the caller's threads for larger ones."""
    import dxopt.qp.solvers.torch_ipm as ts
    from dxopt.qp.autograd.torch_entry import torch_qp_solve

    seen = []
    chol = ts.cholesky_flagged

    def spy(H):
        seen.append(torch.get_num_threads())
        return chol(H)

    monkeypatch.setattr(ts, "cholesky_flagged", spy)
    d = torch.float64
    eye = torch.eye(n, dtype=d)
    torch_qp_solve(eye, torch.ones(n, dtype=d), G=-eye, h=torch.zeros(n, dtype=d))
    assert seen and set(seen) == expected
    assert torch.get_num_threads() == 2


def _blas_counts() -> list[int]:
    from dxopt.linalg.threads import _blas_libraries

    return [lib.get_num_threads() for lib in _blas_libraries()]


def test_blas_threads_limits_numpys_and_scipys_blas_and_restores():
    """``blas_threads`` finds scipy's BLAS (its kernels call it) and numpy's, limits both and
    puts each library's own count back, also when the block raises."""
    from dxopt.linalg.threads import _blas_libraries, blas_threads

    apis = {lib.internal_api for lib in _blas_libraries()}
    assert apis, "no BLAS library found"
    paths = " ".join(lib.filepath for lib in _blas_libraries())
    assert "scipy" in paths
    libs = _blas_libraries()
    before = _blas_counts()
    libs[0].set_num_threads(2)
    try:
        start = _blas_counts()
        with blas_threads(1):
            assert _blas_counts() == [1] * len(libs)
        assert _blas_counts() == start
        with pytest.raises(RuntimeError, match="boom"), blas_threads(1):
            raise RuntimeError("boom")
        assert _blas_counts() == start
        with blas_threads(start[0]):  # already at the limit: left alone
            assert _blas_counts()[0] == start[0]
        assert _blas_counts() == start
    finally:
        for lib, n in zip(libs, before):
            lib.set_num_threads(n)
