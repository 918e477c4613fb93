"""Task-vector algebra round trips and editing of ordinary and linearized models."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.linearize.conftest import random_direction

from dxopt.linearize import LinearizedModel, TaskVector


def _vectors(model):
    return TaskVector(random_direction(model, 1)), TaskVector(random_direction(model, 2))


def test_algebra_round_trips(tiny):
    a, b = _vectors(tiny)
    assert ((a + b) - b).allclose(a, rtol=0, atol=1e-15)
    neg = -a
    assert (-neg).allclose(a, rtol=0, atol=0)
    assert (2 * a - a).allclose(a, rtol=0, atol=1e-15)
    assert (a * 0.5 + a / 2.0).allclose(a, rtol=0, atol=1e-15)
    assert sum([a, b, -a]).allclose(b, rtol=0, atol=1e-15)
    assert (a - a).norm() == 0.0
    assert a.dot(a) == pytest.approx(a.norm() ** 2, rel=1e-12)
    assert a.cosine(-a) == pytest.approx(-1.0, rel=1e-12)
    assert (a * torch.tensor(3.0)).allclose(3 * a)


def test_from_models_and_apply_to_round_trip(tiny):
    a, _ = _vectors(tiny)
    edited = a.apply_to(tiny, 0.7)
    assert edited is not tiny
    tv = TaskVector.from_models(tiny, edited)
    assert tv.allclose(0.7 * a, rtol=1e-12, atol=1e-14)
    back = a.apply_to(edited, -0.7)
    for (n, p), q in zip(tiny.named_parameters(), back.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-14, msg=n)
    # In place edits the same object.
    same = copy.deepcopy(tiny)
    assert a.apply_to(same, 1.0, inplace=True) is same


def test_apply_to_linearized_model_sets_its_displacement(tiny, images):
    a, b = _vectors(tiny)
    lin = (a + b).apply_to(LinearizedModel(tiny), 0.01)
    assert TaskVector.from_linearized(lin).allclose(0.01 * (a + b), rtol=1e-12, atol=1e-15)
    assert TaskVector.from_models(tiny, lin).allclose(0.01 * (a + b), rtol=1e-12, atol=1e-15)
    # Adding task vectors adds their first-order effects exactly.
    f0 = tiny(images)
    la = a.apply_to(LinearizedModel(tiny), 0.01)(images) - f0
    lb = b.apply_to(LinearizedModel(tiny), 0.01)(images) - f0
    torch.testing.assert_close(lin(images) - f0, la + lb, rtol=1e-10, atol=1e-12)


def test_subset_task_vectors_apply_only_their_entries(tiny):
    tv = TaskVector({"fc.bias": torch.ones(5, dtype=torch.float64)})
    edited = tv.apply_to(tiny, 2.0)
    torch.testing.assert_close(edited.fc.bias, tiny.fc.bias + 2.0)
    torch.testing.assert_close(edited.fc.weight, tiny.fc.weight, rtol=0, atol=0)
    assert TaskVector.from_models(tiny, edited, names=["fc.bias"]).allclose(2 * tv)


def test_bad_algebra_is_refused(tiny):
    a, _ = _vectors(tiny)
    sub = TaskVector({"fc.bias": torch.ones(5, dtype=torch.float64)})
    with pytest.raises(ValueError, match="different names"):
        a + sub
    with pytest.raises(ValueError, match="shapes"):
        sub + TaskVector({"fc.bias": torch.ones(4, dtype=torch.float64)})
    with pytest.raises(TypeError, match="real number"):
        a * "2"
    with pytest.raises(TypeError, match="real scalar"):
        a * torch.ones(2)
    with pytest.raises(ValueError, match="finite"):
        a * float("nan")
    with pytest.raises(ValueError, match="division by zero"):
        a / 0
    with pytest.raises(TypeError, match="another TaskVector"):
        a + {"fc.bias": torch.ones(5)}
    with pytest.raises(TypeError, match="floating-point"):
        TaskVector({"w": torch.ones(2, dtype=torch.long)})
    with pytest.raises(ValueError, match="at least one"):
        TaskVector({})
    with pytest.raises(ValueError, match="not parameters"):
        TaskVector({"nope": torch.ones(1)}).apply_to(tiny)
    with pytest.raises(ValueError, match="shape"):
        TaskVector({"fc.bias": torch.ones(4, dtype=torch.float64)}).apply_to(tiny)
    with pytest.raises(TypeError, match=r"nn.Module"):
        a.apply_to("model")  # type: ignore[type-var]
