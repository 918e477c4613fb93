"""Hypothesis strategies for the ``dxopt.qp`` property tests.

Each strategy draws the *keyword arguments* of a problem builder (``_ref_problems.feasible_qp``
or ``qp_zoo.complementary_qp``), so a falsifying example prints as a reproducible call.
"""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def feasible_problems(draw: st.DrawFn) -> dict[str, int | float]:
    """Keyword arguments of ``feasible_qp`` (shown as such in a falsifying example)."""
    n = draw(st.integers(1, 12))
    return {
        "seed": draw(st.integers(0, 2**31 - 1)),
        "n": n,
        "m": draw(st.integers(0, 16)),
        "p": draw(st.integers(0, max(0, min(4, n - 1)))),
        "ridge": draw(st.sampled_from([1e-3, 1e-1, 1.0])),
        "rank": draw(st.integers(0, n)),
    }


@st.composite
def complementary_problems(draw: st.DrawFn) -> dict[str, int | float]:
    """Keyword arguments of ``qp_zoo.complementary_qp``."""
    n = draw(st.integers(2, 14))
    p = draw(st.integers(0, min(3, n - 1)))
    m = draw(st.integers(0, 14))
    return {
        "n": n,
        "m": m,
        "p": p,
        "n_active": draw(st.integers(0, min(m, n - p))),
        "margin": draw(st.sampled_from([0.1, 0.5, 1.0])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


@st.composite
def weakly_active_problems(draw: st.DrawFn) -> dict[str, int | float]:
    """``complementary_qp`` keyword arguments with ``weak`` >= 1 rows of zero slack and zero
    multiplier (LICQ kept: strictly active + weak + equality rows <= n)."""
    n = draw(st.integers(3, 12))
    p = draw(st.integers(0, min(2, n - 2)))
    weak = draw(st.integers(1, n - p - 1))
    n_active = draw(st.integers(0, n - p - weak))
    m = draw(st.integers(n_active + weak, n_active + weak + 6))
    seed = draw(st.integers(0, 2**31 - 1))
    return {"n": n, "m": m, "p": p, "n_active": n_active, "weak": weak, "seed": seed}
