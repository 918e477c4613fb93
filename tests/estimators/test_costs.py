"""Cost records: pass counts, and FLOPs against hand counts of the matrix products.

For the two-layer MLP  x (B×d0) → W1 (d1×d0) → relu → W2 (d2×d1) → squared error, the
FlopCounterMode counts only the matmuls (2·m·n·k each):
  forward  F = 2B(d0·d1 + d1·d2)
  backprop 3F - 2B·d0·d1 (no gradient w.r.t. the input x)
  one JVP  3F: torch's forward-mode rule for mm evaluates both product-rule terms, even for
           the input x whose tangent is zero (checked: x @ dual(W)ᵀ counts three mms)
  SPSA     2nF.
"""

import pytest
import torch

from dxopt.estimators import (
    LOZO,
    SPSA,
    ZOSVRG,
    Backprop,
    CheckpointPlan,
    FmADSVRG,
    ForwardGradient,
    run_blocks,
)

B, D0, D1, D2 = 5, 7, 11, 3


def _mlp():
    gen = torch.Generator().manual_seed(0)
    params = {
        "w1": torch.randn(D1, D0, generator=gen, dtype=torch.float64),
        "w2": torch.randn(D2, D1, generator=gen, dtype=torch.float64),
    }
    batch = (torch.randn(B, D0, generator=gen, dtype=torch.float64), torch.zeros(B, D2))

    def loss_fn(p, data):
        x, y = data
        blocks = [lambda h: torch.relu(h @ p["w1"].T), lambda h: h @ p["w2"].T]
        return (run_blocks(blocks, x) - y).square().sum()

    return loss_fn, params, batch


FWD = 2 * B * (D0 * D1 + D1 * D2)
BP = 3 * FWD - 2 * B * D0 * D1
JVP = 3 * FWD


@pytest.mark.parametrize(
    ("estimator", "flops", "counts"),
    [
        (Backprop(), BP, (1, 1, 0)),
        # per-block checkpointing re-runs each block in backward, but non-reentrant recompute
        # stops once the saved tensors it needs exist: block 1 redoes x W1ᵀ (its relu output
        # is needed), block 2 needs only its inputs, so no matmul is redone there.
        (
            Backprop(checkpoint=CheckpointPlan(strategy="per_block")),
            BP + 2 * B * D0 * D1,
            (1, 1, 0),
        ),
        (ForwardGradient(k=3), 3 * JVP, (0, 0, 3)),
        # projection adds the Gram matrix VᵀV from regenerated tangents: k(k+1)/2 inner
        # products, each a (1, n) @ (n, 1) product per parameter, 2·d FLOPs with
        # d = D1·D0 + D2·D1.
        (
            ForwardGradient(k=2, combine="projection"),
            2 * JVP + 3 * 2 * (D1 * D0 + D2 * D1),
            (0, 0, 2),
        ),
        (SPSA(n_directions=4), 4 * 2 * FWD, (8, 0, 0)),
        # LOZO builds U Vᵀ for each matrix per perturbation: 3 per direction (+, -, restore),
        # plus the gradient accumulation: 4 products of 2·m·r·n.
        (LOZO(rank=2), 2 * FWD + 3 * 2 * 2 * (D1 * D0 + D2 * D1), (2, 0, 0)),
        # first SVRG call: anchor (4 directions) + current and anchor at 1 shared direction.
        (ZOSVRG(anchor_directions=4), (4 + 2) * 2 * FWD, (12, 0, 0)),
        (FmADSVRG(anchor_directions=4), (4 + 2) * JVP, (0, 0, 6)),
    ],
    ids=["bp", "bp-ckpt", "fg", "fg-proj", "spsa", "lozo", "zo-svrg", "fmad-svrg"],
)
def test_cost_matches_flop_counter_hand_count(estimator, flops, counts):
    loss_fn, params, batch = _mlp()
    est = estimator.estimate(loss_fn, params, batch, count_flops=True)
    assert est.cost.flops == flops
    assert (est.cost.forwards, est.cost.backwards, est.cost.jvps) == counts


def test_flops_are_none_unless_requested():
    loss_fn, params, batch = _mlp()
    assert Backprop().estimate(loss_fn, params, batch).cost.flops is None
