"""LPData and the LP oracle's certificate: every HiGHS answer is certified like a QP answer
(primal / dual residuals, signs, complementarity against the requested tolerances), and an
answer that fails it gets a per-sample status and the shared on_failure policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dxopt import DxoptWarning, Status
from dxopt.dfl import LPOracle, OracleError, ShortestPathOracle
from dxopt.dfl.lp import LPData, certify_lp

D = torch.float64


def test_lp_data_parses_once_and_refuses_bad_data():
    data = LPData.parse("test", A=torch.ones(1, 3), b=[1.0], lb=0.0, ub=np.array([1, 2, np.inf]))
    assert data.dim == 3 and data.A.shape == (1, 3) and data.b.tolist() == [1.0]
    assert data.lb.tolist() == [0.0, 0.0, 0.0] and data.has_upper.tolist() == [True, True, False]
    assert data.G is None and data.h is None
    with pytest.raises(ValueError, match="read-only"):
        data.lb[0] = 5.0
    with pytest.raises(ValueError, match="b: expected shape"):
        LPData.parse("test", A=torch.ones(2, 3), b=[1.0])
    with pytest.raises(ValueError, match="G: expected a 2-D matrix with 3 columns"):
        LPData.parse("test", A=torch.ones(1, 3), b=[1.0], G=torch.ones(1, 4), h=[1.0])
    with pytest.raises(ValueError, match="lb\\[1\\]"):
        LPData.parse("test", lb=[0.0, 2.0], ub=1.0)


def test_certificate_accepts_an_optimum_and_rejects_wrong_answers():
    """min c'x on the simplex {1'x = 1, x >= 0}: the vertex e_k of the smallest cost is optimal
    with mu = -c_k and nu_l = c - c_k >= 0 (exact); another vertex has a negative multiplier
    (rejected), a point off the simplex violates Ax = b (rejected)."""
    data = LPData.parse("test", A=np.ones((1, 3)), b=[1.0], lb=0.0)
    c = np.array([[2.0, 0.5, 1.0]])

    def cert(x: np.ndarray, k: int):
        nu_lower = c - c[0, k]
        return certify_lp(data, c, x[None], np.array([[-c[0, k]]]), np.zeros((1, 0)),
                          nu_lower, np.zeros((1, 3)), eps_abs=1e-9, eps_rel=0.0)  # fmt: skip

    good = cert(np.array([0.0, 1.0, 0.0]), 1)
    assert good.ok.tolist() == [True] and good.primal[0] == 0.0 and good.dual[0] == 0.0
    worse = cert(np.array([1.0, 0.0, 0.0]), 0)  # nu_l = c - 2 < 0: the sign check fails
    assert worse.ok.tolist() == [False] and worse.dual[0] > 0.5
    off = cert(np.array([0.0, 1.0 + 1e-6, 0.0]), 1)
    assert off.ok.tolist() == [False] and off.primal[0] == pytest.approx(1e-6)
    within = cert(np.array([0.0, 1.0 + 1e-10, 0.0]), 1)  # within eps_abs
    assert within.ok.tolist() == [True]


def test_highs_answers_are_certified_with_their_residuals():
    sp = ShortestPathOracle((4, 4))
    lp = sp.as_lp(solver="highs")
    c = torch.rand(12, sp.dim, generator=torch.Generator().manual_seed(0), dtype=D) - 0.2
    x = lp(c)
    assert torch.equal(x, sp(c))
    assert lp.last_status == (Status.SOLVED,) * 12
    cert = lp.last_certificate
    assert cert is not None and cert.ok.all()
    assert cert.primal.max() <= 1e-12 and cert.dual.max() <= 1e-12
    high = LPOracle(A=torch.ones(1, 3), b=torch.ones(1), G=torch.tensor([[1.0, 0.0, 0.0]]),
                    h=torch.tensor([0.5]), lb=0.0, sense="max")  # fmt: skip
    out = high(torch.tensor([[3.0, 1.0, 2.0]], dtype=D))
    assert out.tolist() == [[0.5, 0.0, 0.5]] and high.last_certificate.ok.all()


class _WrongAnswers:
    """A HiGHS model whose reported optimum is moved off the feasible set by ``shift`` (what a
    solver bug or a loose tolerance would return)."""

    def __init__(self, hs, shift: float) -> None:
        self._hs, self._shift = hs, shift

    def __getattr__(self, name):
        return getattr(self._hs, name)

    def getSolution(self):  # highspy's name
        sol = self._hs.getSolution()
        sol.col_value = [v + self._shift for v in sol.col_value]
        return sol


@pytest.mark.parametrize("on_failure", ["raise", "warn", "ignore", "nan"])
def test_an_uncertified_highs_answer_follows_on_failure(on_failure):
    lp = LPOracle(A=torch.ones(1, 3), b=torch.ones(1), lb=0.0, ub=1.0, on_failure=on_failure)
    lp._highs = _WrongAnswers(lp._highs, 1e-4)
    c = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0]], dtype=D)
    if on_failure == "raise":
        with pytest.raises(OracleError, match="not certified"):
            lp(c)
        return
    if on_failure == "warn":
        with pytest.warns(DxoptWarning, match="not certified"):
            x = lp(c)
    else:
        x = lp(c)
    assert lp.last_status == (Status.INACCURATE,) * 2
    assert lp.last_certificate.primal.min() == pytest.approx(3e-4)
    assert torch.isnan(x).all() == (on_failure == "nan")


def test_the_lp_keywords_are_written_once_and_shown_in_every_signature():
    import inspect

    from dxopt.dfl import QPTL, LogBarrierLP, binding_normals
    from dxopt.dfl.lp import LP_KEYWORDS

    assert LP_KEYWORDS == ("A", "b", "G", "h", "lb", "ub")
    for owner in (LPOracle, QPTL, LogBarrierLP, binding_normals):
        params = inspect.signature(owner).parameters
        assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in LP_KEYWORDS)
        assert all(params[k].default is None for k in LP_KEYWORDS)
    assert "qp_options" in inspect.signature(QPTL).parameters
    for owner in (LPOracle, LogBarrierLP):
        with pytest.raises(TypeError, match=r"unexpected keyword.*'c'"):
            owner(lb=0.0, ub=np.ones(2), c=np.ones(2))
    with pytest.raises(TypeError, match=r"unexpected keyword.*'Aeq'"):
        binding_normals(torch.zeros(2), ub=np.ones(2), Aeq=np.ones((1, 2)))


def test_the_certificate_covers_every_sample_of_the_last_call():
    """Samples HiGHS reports infeasible get ok=False and NaN residuals (not the previous
    call's certificate): the record always has one row per cost vector of the last call."""
    lp = LPOracle(A=torch.ones(1, 2), b=torch.tensor([1.0]), lb=0.0, ub=1.0)
    lp(torch.ones(3, 2, dtype=D))
    assert lp.last_certificate.ok.tolist() == [True] * 3
    infeasible = LPOracle(A=torch.ones(1, 2), b=torch.tensor([5.0]), lb=0.0, ub=1.0,
                          on_failure="ignore")  # fmt: skip
    infeasible(torch.ones(2, 2, dtype=D))
    cert = infeasible.last_certificate
    assert cert.ok.tolist() == [False, False] and np.isnan(cert.primal).all()
    assert infeasible.last_status == (Status.INFEASIBLE,) * 2


def test_certificate_rows_are_built_once_per_lp_data(monkeypatch):
    """The certificate's rows and canonical problem are cached on the LPData: later batches
    do not rebuild them, and the cached certificate equals that of a fresh LPData (rows built
    anew) on the same answers and multipliers, to the last bit."""
    import dxopt.dfl.lp as lp_mod

    sp = ShortestPathOracle((4, 4))
    lp = sp.as_lp(solver="highs")
    built, calls = [], []
    real_rows, real_certify = lp_mod._certificate_rows, lp_mod.certify_lp
    monkeypatch.setattr(lp_mod, "_certificate_rows", lambda d: built.append(d) or real_rows(d))
    monkeypatch.setattr(
        lp_mod, "certify_lp", lambda *a, **k: calls.append((a, k)) or real_certify(*a, **k)
    )
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        c = torch.rand(8, sp.dim, generator=gen, dtype=D) - 0.2
        assert torch.equal(lp(c), sp(c))
    assert built == [lp.data] and len(calls) == 3
    data = lp.data
    for args, kw in calls:
        fresh = LPData.parse("test", A=data.A, b=data.b, G=data.G, h=data.h, lb=data.lb, ub=data.ub)
        want = real_certify(fresh, *args[1:], **kw)
        got = real_certify(data, *args[1:], **kw)
        assert got.ok.all()
        for name in ("ok", "primal", "dual"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    assert len(built) == 1 + 3  # only the fresh LPData built theirs
