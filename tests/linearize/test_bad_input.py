"""Bad input gets a ValueError/TypeError that names the argument."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dxopt.linearize import (
    CurvaturePenalty,
    LinearizedModel,
    alpha_range,
    call_along_ray,
    distillation_loss,
)


def test_linearized_model_bad_input(tiny):
    with pytest.raises(TypeError, match=r"model: expected a torch.nn.Module"):
        LinearizedModel(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"names: .*not parameters"):
        LinearizedModel(tiny, names=["fc.nope"])
    with pytest.raises(TypeError, match="names: expected an iterable"):
        LinearizedModel(tiny, names="fc.weight")
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="nothing to linearize"):
        LinearizedModel(frozen)
    assert LinearizedModel(frozen, names=["weight"]).names == ("weight",)


def test_curvature_penalty_bad_input(tiny, images):
    with pytest.raises(TypeError, match="reference_inputs"):
        CurvaturePenalty(tiny, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        CurvaturePenalty(tiny, images, batch_size=100)
    with pytest.raises(ValueError, match="names"):
        CurvaturePenalty(tiny, images, names=["x"])
    pen = CurvaturePenalty(tiny, images, names=["fc.weight"])
    with pytest.raises(ValueError, match=r"tau: .*not among"):
        pen({"fc.bias": torch.zeros(5, dtype=torch.float64)})
    with pytest.raises(ValueError, match=r"tau\['fc.weight'\]: expected shape"):
        pen({"fc.weight": torch.zeros(2, dtype=torch.float64)})


def test_distillation_bad_input(tiny, images):
    with pytest.raises(ValueError, match="teacher: expected the student's shape"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="norm: expected one of"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 3), norm="kl")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="student, teacher"):
        distillation_loss([1.0], torch.zeros(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="progress"):
        alpha_range(1.5)
    with pytest.raises(ValueError, match="low, high"):
        alpha_range(0.5, low=1.5)
    with pytest.raises(ValueError, match=r"pretrained: .*not parameters"):
        call_along_ray(tiny, {"nope": torch.zeros(1)}, 1.0, images)


def test_shared_validators_name_the_argument(tiny, images):
    model, x = tiny, images
    # a bool or a float batch size passed the old range test (True == 1, 2.0 <= n)
    for bad in (True, 2.0):
        with pytest.raises(ValueError, match=r"batch_size: expected an integer >= 1"):
            CurvaturePenalty(model, x, batch_size=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"progress: expected a number in \[0.0, 1.0\]"):
        alpha_range(float("inf"))
    with pytest.raises(ValueError, match="norm: expected one of 'squared_l2', 'l1', 'cosine'"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 3), norm="l2")  # type: ignore[arg-type]
