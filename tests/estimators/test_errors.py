"""Bad input gets a clear error naming the argument."""

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
)

ALL = [Backprop(), ForwardGradient(), SPSA(), LOZO(), ZOSVRG(), FmADSVRG()]
IDS = ["bp", "fg", "spsa", "lozo", "zo-svrg", "fmad-svrg"]


def _params():
    return {"w": torch.ones(3), "unused": torch.ones(2)}


@pytest.mark.parametrize("estimator", ALL, ids=IDS)
def test_non_scalar_loss(estimator):
    with pytest.raises(ValueError, match="loss_fn: expected a scalar loss, got shape \\(3,\\)"):
        estimator.estimate(lambda p, b: p["w"] * b, {"w": torch.ones(3)}, torch.ones(3))


@pytest.mark.parametrize("estimator", ALL, ids=IDS)
def test_unused_parameter(estimator):
    with pytest.raises(ValueError, match="params: the loss does not use \\['unused'\\]"):
        estimator.estimate(lambda p, b: (p["w"] * b).sum(), _params(), torch.ones(3))


@pytest.mark.parametrize("estimator", ALL, ids=IDS)
def test_integer_parameter(estimator):
    with pytest.raises(TypeError, match="params\\['w'\\]: expected a floating dtype"):
        estimator.estimate(lambda p, b: p["w"].sum(), {"w": torch.ones(3, dtype=torch.int64)}, 0)


def test_params_must_be_a_mapping():
    with pytest.raises(TypeError, match="params: expected a mapping"):
        Backprop().estimate(lambda p, b: p.sum(), torch.ones(2), None)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ForwardGradient(k=0), "k: expected an integer >= 1, got 0"),
        (lambda: SPSA(n_directions=0), "n_directions: expected an integer >= 1"),
        (lambda: ZOSVRG(n_directions=0), "n_directions: expected an integer >= 1"),
        (lambda: SPSA(eps=0.0), "eps: expected a positive finite number, got 0.0"),
        (lambda: SPSA(eps=-1e-3), "eps: expected a positive finite number"),
        (lambda: LOZO(eps=0.0), "eps: expected a positive finite number"),
        (lambda: FmADSVRG(eps=0.0), "eps: expected a positive finite number"),
        (lambda: ForwardGradient(combine="sum"), "combine: expected one of 'mean', 'projection'"),
        (lambda: SPSA(distribution="uniform"), "distribution: expected one of"),
        (lambda: SPSA(keep_fraction=0.0), "keep_fraction: expected a number in \\(0, 1\\]"),
        (lambda: CheckpointPlan(strategy="all"), "strategy: expected one of"),
        (lambda: CheckpointPlan(strategy="segments", segments=0), "segments: expected"),
        (lambda: CheckpointPlan(strategy="selective", save_ops=("nope",)), "save_ops: 'nope'"),
    ],
)
def test_bad_options(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_checkpoint_type():
    with pytest.raises(TypeError, match="checkpoint: expected a CheckpointPlan or None"):
        Backprop(checkpoint="per_block")  # type: ignore[arg-type]
