"""MemoryTracker against hand-computed byte counts, and per-method orderings."""

import torch

from dxopt.estimators import SPSA, Backprop, CheckpointPlan, ForwardGradient, MemoryTracker

from ._problems import residual_mlp


def test_hand_computed_two_layer_case():
    # x: (B, n) input without grad, W: (n, m) parameter. Forward h = relu(x W), loss = h.sum().
    # New storages: x W (B·m·4 bytes), relu output (B·m·4), the scalar sum (4). relu saves its
    # output, not its input, so x W is freed right after relu: peak 2·B·m·4 (during relu),
    # then B·m·4 + 4. Saved for backward: x (mm needs it for dW; no saved W since x needs no
    # grad) and relu's output.
    b, n, m = 32, 16, 8
    x = torch.randn(b, n)
    w = torch.randn(n, m, requires_grad=True)
    with MemoryTracker() as tracker:
        loss = torch.relu(x @ w).sum()
    report = tracker.report
    assert report.peak_bytes == 2 * b * m * 4
    assert report.saved_bytes == b * n * 4 + b * m * 4
    assert report.saved_activation_bytes == b * m * 4  # x existed before the block
    assert report.allocated_bytes == 2 * b * m * 4 + 4
    del loss


def test_freed_tensors_leave_the_live_count():
    with MemoryTracker() as tracker:
        for _ in range(10):
            t = torch.ones(1000, dtype=torch.float64) * 2  # 8000 bytes, freed each iteration
            del t
    assert tracker.report.peak_bytes == 8000 * 2  # ones + product alive together
    assert tracker.report.allocated_bytes == 10 * 2 * 8000


def _measure(estimator):
    loss_fn, params, batch = residual_mlp(n_blocks=6, width=64, batch=256)
    estimator.estimate(loss_fn, params, batch)  # first call: validation probe, warm-up
    with MemoryTracker() as tracker:
        estimator.estimate(loss_fn, params, batch)
    return tracker.report


def test_method_ordering_on_a_residual_mlp():
    bp = _measure(Backprop())
    ckpt = _measure(Backprop(checkpoint=CheckpointPlan(strategy="per_block")))
    fg = _measure(ForwardGradient())
    zo = _measure(SPSA())
    activation = 256 * 64 * 8  # one (batch, width) float64 activation
    assert fg.saved_bytes == 0 and zo.saved_bytes == 0
    assert bp.saved_bytes >= 6 * 2 * activation  # each block keeps its tanh out + input
    # checkpointed: only the 6 block inputs plus the head's input stay saved (+ small tensors).
    assert 7 * activation <= ckpt.saved_bytes < 7 * activation + 64 * 64 * 8 * 3
    assert ckpt.peak_bytes < bp.peak_bytes
    assert zo.peak_bytes < bp.peak_bytes


def test_selective_checkpoint_counts_what_its_cache_keeps():
    """Issue 35, item 19. Each block h + tanh(h Wᵀ): per_block keeps the block input h;
    selective(save_ops=("mm",)) keeps h and the product h Wᵀ (its cache, outside autograd's
    saved-tensor hooks), i.e. exactly one more (batch, width) float64 activation per block,
    the same count as no checkpointing (h and the tanh output). It reported per_block's."""
    activation = 256 * 64 * 8
    none = _measure(Backprop(checkpoint=CheckpointPlan(strategy="none")))
    per_block = _measure(Backprop(checkpoint=CheckpointPlan(strategy="per_block")))
    selective = _measure(
        Backprop(checkpoint=CheckpointPlan(strategy="selective", save_ops=("mm",)))
    )
    assert selective.saved_activation_bytes == per_block.saved_activation_bytes + 6 * activation
    assert selective.saved_activation_bytes == none.saved_activation_bytes
    # saving nothing selectively is per_block
    nothing = _measure(Backprop(checkpoint=CheckpointPlan(strategy="selective", save_ops=())))
    assert nothing.saved_activation_bytes == per_block.saved_activation_bytes
