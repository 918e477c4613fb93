"""In-place zeroth-order estimates: parameters restored, fused step == materialised step."""

import torch

from dxopt.estimators import LOZO, SPSA

from ._problems import residual_mlp


def _float32(params):
    return {n: p.float().clone() for n, p in params.items()}


def test_in_place_perturbations_restore_parameters():
    loss_fn, params, batch = residual_mlp()
    params = _float32(params)
    batch = (batch[0].float(), batch[1])
    before = {n: p.clone() for n, p in params.items()}
    for est in (SPSA(eps=1e-3, n_directions=4, seed=0), SPSA(keep_fraction=0.25), LOZO(rank=2)):
        for _ in range(3):
            est.estimate(loss_fn, params, batch)
    for name in params:
        # 9 estimates of up to 4 perturb/unperturb triples each: float32 rounding only.
        torch.testing.assert_close(params[name], before[name], rtol=0, atol=1e-5)


def test_fused_step_equals_gradient_step_without_materialising():
    loss_fn, params, batch = residual_mlp()
    materialised = {n: p.clone() for n, p in params.items()}
    est = SPSA(eps=1e-4, n_directions=3, seed=7).estimate(loss_fn, materialised, batch)
    fused = SPSA(eps=1e-4, n_directions=3, seed=7).step_(loss_fn, params, batch, lr=0.1)
    assert fused.grads is None and fused.cost.forwards == 6
    assert fused.info["seeds"] == est.info["seeds"]
    for name in params:
        assert params[name].grad is None
        torch.testing.assert_close(params[name], materialised[name] - 0.1 * est.grads[name])


def test_sparse_spsa_only_touches_top_magnitude_entries():
    params = {"w": torch.tensor([0.1, -5.0, 0.2, 3.0, 0.0, 0.01], dtype=torch.float64)}
    est = SPSA(keep_fraction=1 / 3, n_directions=4, seed=0).estimate(
        lambda p, b: (p["w"] * b).sum() ** 2 / 2 + p["w"].square().sum(), params, torch.ones(6)
    )
    nonzero = est.grads["w"] != 0
    assert nonzero.tolist() == [False, True, False, True, False, False]
