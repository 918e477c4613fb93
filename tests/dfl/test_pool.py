"""SolutionPool's hash set of rows (duplicates within and across calls, the first-seen order,
dtypes and devices, the converted tensors kept and extended rather than rebuilt) and the NCE
loss against its definition on a small pool, value and gradient."""

from __future__ import annotations

import pytest
import torch

from dxopt.dfl import NCE, CallableOracle, SolutionPool

F64 = torch.float64


def test_duplicates_within_and_across_calls_keep_the_first_seen_order():
    pool = SolutionPool(torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]))
    assert len(pool) == 2
    assert pool.add(torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])) == 1
    assert pool.add(torch.tensor([0.0, 1.0, 1.0])) == 0  # a single (d,) row, already there
    assert pool.add(torch.tensor([[-0.0, 0.0, 0.0], [0.0, -0.0, 0.0]])) == 1  # -0.0 is 0.0
    expected = [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert pool.solutions.tolist() == expected  # first seen first (not sorted)
    assert pool.solutions.dtype == F64 and pool.dim == 3
    mean = pool.mean(torch.zeros(1, dtype=torch.float32))
    assert mean.dtype == torch.float32 and mean.tolist() == [0.5, 0.5, 0.5]
    pool.add(torch.tensor([1.0, 1.0, 1.0]))  # a new row: the mean follows
    torch.testing.assert_close(pool.mean(pool.solutions), pool.solutions.mean(0))
    with pytest.raises(ValueError, match="empty"):
        SolutionPool(dim=3).mean(pool.solutions)


def test_dtypes_devices_and_the_kept_conversions():
    pool = SolutionPool(dim=2)
    assert len(pool) == 0
    assert pool.add(torch.tensor([[1, 0], [0, 1]])) == 2  # integer rows
    assert pool.add(torch.tensor([[1.0, 0.0]], dtype=torch.float32)) == 0  # same values
    like = torch.zeros(1, dtype=torch.float32)
    t32 = pool.as_tensor(like)
    assert t32.dtype == torch.float32 and t32.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert pool.add(torch.tensor([1.0, 0.0], dtype=F64)) == 0
    assert pool.as_tensor(like) is t32  # nothing new: the conversion is kept
    assert pool.add(torch.tensor([[0.5, 0.5]], dtype=F64)) == 1
    extended = pool.as_tensor(like)
    assert extended.tolist() == [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
    assert t32.shape == (2, 2)  # a tensor handed out before is never modified
    if torch.cuda.is_available():
        on_gpu = pool.as_tensor(torch.zeros(1, device="cuda"))
        assert on_gpu.device.type == "cuda" and on_gpu.shape == (3, 2)
        assert pool.add(torch.tensor([[0.0, 0.0]], device="cuda")) == 1
        assert pool.as_tensor(torch.zeros(1, device="cuda")).shape == (4, 2)


def test_bad_rows_are_refused():
    pool = SolutionPool(dim=3)
    with pytest.raises(ValueError, match="x: expected shape"):
        pool.add(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="x: expected finite"):
        pool.add(torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(TypeError, match="x: expected a torch"):
        pool.add([0.0, 1.0, 1.0])


@pytest.mark.parametrize("sense", ["min", "max"])
def test_nce_equals_its_definition_on_a_small_pool(sense):
    """NCE = mean over the batch of (1/|G|) sum_w s (c_hat.x* - c_hat.w) over the pool after
    the refresh; its gradient in c_hat_b is s (x*_b - mean_w w) / B."""
    gen = torch.Generator().manual_seed(0)
    vertices = (torch.rand(7, 5, generator=gen) < 0.5).to(F64)

    def solve(c):
        scores = c @ vertices.T
        return vertices[scores.argmin(-1) if sense == "min" else scores.argmax(-1)]

    oracle = CallableOracle(solve, dim=5, batched=True, sense=sense)
    pool = SolutionPool(vertices[:3], sense=sense)
    nce = NCE(oracle, pool, solve_ratio=1.0)  # every batch adds the oracle's answers
    s = 1.0 if sense == "min" else -1.0
    for _ in range(3):
        c_hat = torch.randn(4, 5, generator=gen, dtype=F64).requires_grad_()
        x_true = vertices[torch.randint(0, 7, (4,), generator=gen)]
        loss = nce(c_hat, x_true)
        gamma = pool.solutions  # the pool after this batch's refresh
        assert len(gamma) == len(torch.unique(torch.cat([gamma, solve(c_hat.detach())]), dim=0))
        expected = sum(
            s * (c_hat[b] @ x_true[b] - c_hat[b] @ w) for b in range(4) for w in gamma
        ) / (4 * len(gamma))
        assert abs(loss.item() - expected.item()) <= 1e-12
        loss.backward()
        grad = s * (x_true - gamma.mean(0)) / 4
        torch.testing.assert_close(c_hat.grad, grad, atol=1e-14, rtol=0)


def test_two_forwards_around_a_refresh_then_one_backward():
    """The pool handed to the first forward is not modified by the second one's refresh, so
    autograd can use both (an in-place growth would break the first backward)."""
    gen = torch.Generator().manual_seed(1)
    vertices = torch.eye(6, dtype=F64)
    oracle = CallableOracle(lambda c: vertices[(c @ vertices.T).argmin(-1)], dim=6, batched=True)
    nce = NCE(oracle, SolutionPool(vertices[:1]), solve_ratio=1.0)
    c_hat = torch.randn(3, 6, generator=gen, dtype=F64).requires_grad_()
    total = nce(c_hat, vertices[:3]) + nce(-c_hat, vertices[:3])
    total.backward()
    assert c_hat.grad is not None and torch.isfinite(c_hat.grad).all()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_nce_reductions_and_a_single_vector(reduction):
    vertices = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)
    oracle = CallableOracle(lambda c: vertices[(c @ vertices.T).argmin(-1)], dim=3, batched=True)
    nce = NCE(oracle, SolutionPool(vertices), solve_ratio=0.0, reduction=reduction)
    c_hat = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], dtype=F64)
    x_true = vertices[[1, 0]]
    per_row = torch.stack(
        [sum(c_hat[b] @ x_true[b] - c_hat[b] @ w for w in vertices) / 3 for b in range(2)]
    )
    expected = {"none": per_row, "sum": per_row.sum(), "mean": per_row.mean()}[reduction]
    torch.testing.assert_close(nce(c_hat, x_true), expected, atol=1e-14, rtol=0)
    single = nce(c_hat[0], x_true[0])  # a (d,) cost vector: its own loss
    torch.testing.assert_close(single, per_row[0], atol=1e-14, rtol=0)
