"""PG against its closed form by enumeration (both senses, the three differences), its limit
and its bracketing of the decision cost, and PyEPO's ``perturbationGradient``; NID against its
definition (the projections' exact Jacobians) and PyEPO's ``negativeIdentity``."""

from __future__ import annotations

import pytest
import torch
from tests.dfl._enum import enum_oracle, enum_value, pyepo_model, subsets

from dxopt.dfl import NID, PG, KnapsackOracle, ShortestPathOracle


def _data(sense, seed=0, n=32):
    V = subsets(6, 3)
    gen = torch.Generator().manual_seed(seed)
    c = torch.rand(n, 6, generator=gen, dtype=torch.float64) + 0.2
    c_hat = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    return V, enum_oracle(V, sense), c_hat, c


@pytest.mark.parametrize("sense", ["min", "max"])
@pytest.mark.parametrize(
    "difference,a,b", [("backward", 0, 1), ("central", 1, 1), ("forward", 1, 0)]
)
def test_pg_equals_its_closed_form_by_enumeration(sense, difference, a, b):
    V, oracle, c_hat, c = _data(sense)
    s = 1.0 if sense == "min" else -1.0
    h = 0.3
    pg = PG(oracle, sigma=h, difference=difference, reduction="none")
    c_hat = c_hat.requires_grad_(True)
    loss = pg(c_hat, c)
    up, low = c_hat.detach() + a * h * c, c_hat.detach() - b * h * c
    exact = s * (enum_value(V, up, sense) - enum_value(V, low, sense)) / ((a + b) * h)
    assert torch.allclose(loss.detach(), exact, atol=1e-12)
    loss.sum().backward()
    grad = s * (oracle(up) - oracle(low)) / ((a + b) * h)
    assert torch.allclose(c_hat.grad, grad, atol=1e-12)
    assert pg.cost.forwards == 2 * c.shape[0]


@pytest.mark.parametrize("sense", ["min", "max"])
def test_pg_brackets_the_decision_cost_and_tends_to_it(sense):
    _, oracle, c_hat, c = _data(sense, seed=1, n=64)
    s = 1.0 if sense == "min" else -1.0
    decision = s * (c * oracle(c_hat)).sum(1)
    # V concave (min) / convex (max): backward >= s c^T x(c_hat) >= forward, for any h
    back = PG(oracle, sigma=0.7, reduction="none")(c_hat, c)
    fwd = PG(oracle, sigma=0.7, difference="forward", reduction="none")(c_hat, c)
    assert (back >= decision - 1e-12).all() and (fwd <= decision + 1e-12).all()
    assert (back > decision + 1e-6).any()  # the bracket is not trivially tight at h = 0.7
    # where x is constant on [c_hat - h c, c_hat] the backward loss is exactly the decision cost
    h = 1e-6
    same = (oracle(c_hat - h * c) == oracle(c_hat)).all(1)
    small = PG(oracle, sigma=h, reduction="none")(c_hat, c)
    assert same.sum() >= 60
    assert torch.allclose(small[same], decision[same], atol=1e-8)


def test_pg_equals_pyepo():
    pyepo_func = pytest.importorskip("pyepo.func", reason="pyepo (test-only reference) missing")
    gen = torch.Generator().manual_seed(2)
    sp = ShortestPathOracle((4, 4))
    ks = KnapsackOracle(torch.rand(2, 10, generator=gen, dtype=torch.float64) * 3 + 1, 8.0)
    for oracle in (sp, ks):
        c = torch.rand(12, oracle.dim, generator=gen, dtype=torch.float64) + 0.1
        c_hat = torch.randn(12, oracle.dim, generator=gen, dtype=torch.float64)
        for two_sides, difference in ((False, "backward"), (True, "central")):
            a = c_hat.clone().requires_grad_(True)
            b = c_hat.clone().requires_grad_(True)
            ours = PG(oracle, sigma=0.2, difference=difference)(a, c)
            theirs = pyepo_func.PG(pyepo_model(oracle), sigma=0.2, two_sides=two_sides)(b, c)
            ours.backward()
            theirs.backward()
            # PyEPO divides by h + 1e-8
            assert torch.allclose(ours, theirs.to(ours.dtype), rtol=1e-6, atol=1e-9)
            assert torch.allclose(a.grad, b.grad.to(a.dtype), rtol=1e-6, atol=1e-9)


def _nid_case(sense, seed=3):
    V = subsets(5, 2)
    oracle = enum_oracle(V, sense)
    gen = torch.Generator().manual_seed(seed)
    c_hat = torch.randn(10, 5, generator=gen, dtype=torch.float64)
    g = torch.randn(10, 5, generator=gen, dtype=torch.float64)
    return oracle, c_hat, g


@pytest.mark.parametrize("sense", ["min", "max"])
def test_nid_forward_and_backward_equal_the_definition(sense):
    oracle, c_hat, g = _nid_case(sense)
    s = 1.0 if sense == "min" else -1.0
    d = c_hat.shape[1]
    eye = torch.eye(d, dtype=torch.float64)
    centre = eye - torch.full((d, d), 1.0 / d, dtype=torch.float64)
    for projection in ("none", "norm", "mean", "standardize"):
        c = c_hat.clone().requires_grad_(True)
        y = NID(oracle, projection=projection)(c)
        # every projection leaves the answer of a 2-subset oracle unchanged
        assert torch.equal(y, oracle(c_hat))
        (y * g).sum().backward()
        for i in range(c_hat.shape[0]):
            ci = c_hat[i] - c_hat[i].mean() if projection in ("mean", "standardize") else c_hat[i]
            u = ci / ci.norm()
            J = {
                "none": eye,
                "norm": (eye - torch.outer(u, u)) / ci.norm(),
                "mean": centre,
                "standardize": (eye - torch.outer(u, u)) @ centre / ci.norm(),
            }[projection]
            assert torch.allclose(c.grad[i], -s * J.T @ g[i], atol=1e-12), projection


def test_nid_refuses_a_zero_row_and_equals_pyepo():
    oracle, c_hat, g = _nid_case("min")
    c_hat[4] = 0.0
    with pytest.raises(ValueError, match="row 4 is zero"):
        NID(oracle)(c_hat)
    with pytest.raises(ValueError, match="row 4 is constant"):
        NID(oracle, projection="standardize")(c_hat + 1.0)
    pyepo_func = pytest.importorskip("pyepo.func", reason="pyepo (test-only reference) missing")
    gen = torch.Generator().manual_seed(4)
    ks = KnapsackOracle(torch.rand(1, 8, generator=gen, dtype=torch.float64) * 3 + 1, 6.0)
    for oracle in (ShortestPathOracle((3, 3)), ks):
        c = torch.randn(6, oracle.dim, generator=gen, dtype=torch.float64)
        g = torch.randn(6, oracle.dim, generator=gen, dtype=torch.float64)
        a, b = c.clone().requires_grad_(True), c.clone().requires_grad_(True)
        ya = NID(oracle, projection="none")(a)
        yb = pyepo_func.NID(pyepo_model(oracle))(b)
        (ya * g).sum().backward()
        (yb * g).sum().backward()
        assert torch.equal(ya, yb.to(ya.dtype))
        assert torch.allclose(a.grad, b.grad.to(a.dtype), atol=0)
