"""Checks of the QP benchmark's generators, its exact reference and a ``--quick`` run."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
from benchmarks.common import BENCHMARKS_MD, REPO_ROOT
from benchmarks.qp import generators as gen
from benchmarks.qp import reference


def _dense(mat):
    return mat.toarray() if sp.issparse(mat) else np.asarray(mat)


@pytest.mark.parametrize(
    ("family", "n"), [("dense", 40), ("sparse", 300), ("simplex", 50), ("chains", 300)]
)
def test_generators_are_feasible_convex_qps(family, n):
    prob = gen.make_problem(family, n, seed=3)
    P = _dense(prob.P)
    assert prob.n == n and P.shape == (n, n)
    np.testing.assert_allclose(P, P.T, atol=1e-12)
    assert np.linalg.eigvalsh(P).min() > -1e-9  # PSD
    if family in ("dense", "sparse"):
        ones = np.ones(n)  # dQP's construction: 1 is feasible with inequality slack 1
        np.testing.assert_allclose(_dense(prob.G) @ ones, prob.h - 1.0, atol=1e-10)
        np.testing.assert_allclose(_dense(prob.A) @ ones, prob.b, atol=1e-10)
        assert prob.m == n and prob.p == -(-n // 2)
    if family == "sparse":
        assert np.abs(P.sum(axis=1)).max() < 1e-12  # graph Laplacian: rows sum to 0
        assert (np.diff(sp.csr_matrix(prob.G).indptr) > 0).all()  # every row has an entry
    if family == "chains":
        assert prob.A is None and prob.m == 2 * n
        assert np.linalg.eigvalsh(P).min() >= 0.5 - 1e-9


def _simplex_lower(y: np.ndarray, lower: np.ndarray, total: float) -> np.ndarray:
    """argmin ||x - y||^2 s.t. x >= lower, sum x = total, by bisection on the shift."""
    lo, hi = (y - lower).min() - total - 1.0, (y - lower).max() + 1.0
    for _ in range(200):
        tau = 0.5 * (lo + hi)
        if np.maximum(y - tau, lower).sum() > total:
            lo = tau
        else:
            hi = tau
    return np.maximum(y - 0.5 * (lo + hi), lower)


def test_simplex_closed_form_gradient_matches_finite_differences():
    prob = gen.simplex_projection(40, seed=1)
    w = np.random.default_rng(2).standard_normal(40)
    g = gen.simplex_closed_form_grad(prob.q, w)
    np.testing.assert_allclose(g["x"], _simplex_lower(-prob.q, -prob.h, 1.0), atol=1e-10)
    eps = 1e-6

    def loss(q, h, b):
        return w @ _simplex_lower(-q, -h, b)

    rng = np.random.default_rng(3)
    for key in ("q", "h", "b"):
        d = rng.standard_normal(1 if key == "b" else 40)
        args = {"q": prob.q, "h": prob.h, "b": 1.0}
        plus = {**args, key: args[key] + eps * (d[0] if key == "b" else d)}
        minus = {**args, key: args[key] - eps * (d[0] if key == "b" else d)}
        fd = (loss(**plus) - loss(**minus)) / (2 * eps)
        assert fd == pytest.approx(float(np.sum(g[key] * d)), rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("family", ["dense", "chains"])
def test_reference_gradient_matches_finite_differences(family):
    prob = gen.make_problem(family, 30 if family == "dense" else 200, seed=4)
    w = np.random.default_rng(5).standard_normal(prob.n)
    grads, ex = reference.reference_grads(prob, w, matrices=family == "dense")
    assert ex is not None and ex.kkt_residual < 1e-8 and not ex.degenerate
    rng = np.random.default_rng(6)
    eps = 1e-6
    keys = ["q", "h", "b", "G", "A"] if family == "dense" else ["q", "h"]
    for key in keys:
        d = rng.standard_normal(np.shape(getattr(prob, key)))
        xp = reference.exact_solution(replace(prob, **{key: getattr(prob, key) + eps * d})).x
        xm = reference.exact_solution(replace(prob, **{key: getattr(prob, key) - eps * d})).x
        fd = w @ (xp - xm) / (2 * eps)
        assert fd == pytest.approx(float(np.sum(grads[key] * d)), rel=1e-5, abs=1e-7), key


def test_quick_benchmark_writes_results_without_touching_benchmarks_md(tmp_path):
    # A fresh process: the benchmark forks its cells, which is unsafe after torch ops ran here.
    before = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else None
    cmd = [sys.executable, "-m", "benchmarks.qp.run", "--quick", "--only", "simplex"]
    proc = subprocess.run([*cmd, "--out", str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "## QP layers" in proc.stdout
    after = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else None
    assert before == after
    payload = json.loads((tmp_path / "qp.json").read_text())
    methods = {r["method"]: r for r in payload["records"]}
    assert set(methods) == {"reference", "dxopt_penalty", "dxopt_kkt", "raw_piqp"}
    for name in ("dxopt_penalty", "dxopt_kkt"):
        rec = methods[name]
        assert rec["status"] == "ok"
        assert rec["forward_s"] > 0 and rec["backward_s"] > 0 and rec["runs"] >= 1
        assert rec["grad_blocks"] == "qhb" and rec["grad_err"] < 1e-6
        assert rec["x_rel_err"] < 1e-6
    assert methods["raw_piqp"]["found"] and methods["raw_piqp"]["backward_s"] is None
    verdicts = [t for t in payload["targets"] if t["target"].startswith("simplex")]
    # a smoke run measures no target: the rows are there, without verdicts
    assert len(verdicts) == 6 and all(t["verdict"] == "smoke run" for t in verdicts)
    assert "Smoke run (`--quick`)" in proc.stdout
    assert (tmp_path / "qp.md").read_text().startswith("## QP layers")
    assert (tmp_path / "qp_simplex.png").stat().st_size > 0


def test_measure_warms_up_once_and_runs_a_slow_first_call_only_once():
    from benchmarks.qp.peers import measure

    calls = []

    def once(times):
        def run():
            fwd, bwd = times[len(calls)]
            calls.append((fwd, bwd))
            return fwd, bwd, {"x": np.zeros(1)}

        return run

    # a slow first call (one-time costs) is the untimed warm-up, recorded as first_s
    timings, _ = measure(once([(2.5, 0.2), (1.0, 0.04), (1.2, 0.05), (1.1, 0.03)]))
    assert len(calls) == 4 and timings["runs"] == 3
    assert timings["forward_s"] == 1.1 and timings["backward_s"] == 0.04
    assert timings["first_s"] == 2.7
    # a first call over slow_s is the only run
    calls.clear()
    timings, _ = measure(once([(70.0, 1.0)]), slow_s=60.0)
    assert len(calls) == 1 and timings["runs"] == 1 and timings["forward_s"] == 70.0
