"""The Maros-Meszaros benchmark of ``dxopt.qp``: forward success, time and a gradient verdict.

``dxopt bench qp --suite maros-meszaros [--max-n N]`` runs every problem with ``n <= N``
(default 2000) of the Maros-Meszaros convex QP test set (I. Maros and C. Meszaros, Optimization
Methods and Software 11-12, 1999) as a new user would: torch sparse CSR matrices, default
options, the loss ``L = w . x*`` with a fixed random ``w``. Per problem, each in its own forked
process with a time limit (a hang or a crash is recorded, never stops the run):

- dxopt: forward status, which backend it used (its ``info``), forward time, acceptance of its
  solution (relative primal, dual and gap residuals at most ``--accept-tol``), the gradient of
  ``L`` w.r.t. ``(q, h, b)``, or the refusal (``QPBackwardError``, non-finite gradient);
- the raw backends daqp (dense), piqp, clarabel, proxqp and osqp through ``qpsolvers`` at
  dxopt's default tolerance ``eps_abs = 1e-9``: time and success (same acceptance check);
- the gradient verdict of :mod:`benchmarks.qp.judge` along three random directions (``q``
  only; ``h`` and ``b`` in the range of ``A``; a translation of the feasible set), from
  one-sided finite differences of tight-tolerance clarabel/piqp re-solves at five steps, plus
  the exact reduced-KKT reference gradient where the active set is verified
  (:func:`benchmarks.qp.mm_problems.reference_gradient`); a flagged gradient judged ``wrong``
  there gets the piece check (:func:`judge_piece`: B-subdifferential membership at a nearby
  point of its piece).

The finite-difference evidence does not depend on dxopt and is cached per problem (``--cache``)
so that the same problems can be judged against two versions of the code (``--label before``
with ``PYTHONPATH`` pointing at the old sources, ``--label after`` at the new). Summaries follow
qpbenchmark (success rate; shifted geometric mean, shift 10, of the time ratio to the fastest
solve of the problem, a failure counting as the time limit). ``--render-only --merge
RUN.json`` combines runs over different size ranges into one table (before/after per problem).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import multiprocessing as mp
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.common import (
    machine_info,
    machine_line,
    markdown_table,
    results_dir,
    set_threads,
    update_benchmarks_md,
    write_json,
)
from benchmarks.qp import judge as J
from benchmarks.qp import mm_problems as mmp

COMMAND = "dxopt bench qp --suite maros-meszaros"
QUICK = ("HS21", "HS35", "HS76", "QAFIRO", "DUALC1", "HS21" + mmp.ZERO_ROW)
EVIDENCE_VERSION = 2
REF_RTOL = 1e-3  # relative gradient error against a verified reference that counts as wrong
VERDICTS = (J.MATCH, J.CLARKE, J.PIECE, J.WRONG, J.NO_VERDICT, "refused", "forward failed",
            "error")  # fmt: skip
PASSING = (J.MATCH, J.CLARKE, J.PIECE)
SECTION = "qp-maros-meszaros"


# ------------------------------------------------------------------------- isolated tasks


def _task(kind: str, name: str, seed: int, accept_tol: float, extra: Any = None) -> Any:
    prob = mmp.load(name)
    if kind == "fd":
        return mmp.fd_evidence(prob, seed)
    if kind == "piece":
        return mmp.piece_evidence(prob, seed, *extra)
    if kind == "dxopt":
        from benchmarks.qp.mm_dxopt import run_dxopt

        return run_dxopt(prob, seed, accept_tol=accept_tol)
    if kind.startswith("raw_"):
        return mmp.raw_solve(prob, kind[4:], accept_tol=accept_tol)
    raise ValueError(f"unknown task {kind!r}")


def _child(args: tuple, path: str, mem_gb: float) -> None:
    limit = int(mem_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        result = _task(*args)
    except MemoryError:
        result = {"status": f"error: out of memory (limit {mem_gb:g} GB)"}
    except Exception as exc:  # recorded, never raised
        result = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                  "traceback": traceback.format_exc()[-1500:]}  # fmt: skip
    with open(path, "wb") as fh:
        pickle.dump(result, fh)
    os._exit(0)


def isolated(kind: str, name: str, seed: int, accept_tol: float, timeout_s: float,
             mem_gb: float = 8.0, extra: Any = None) -> tuple[dict, float]:  # fmt: skip
    """Run one task in a forked child with a time and an address-space limit (``extra``: more
    arguments of the task, inherited by the fork)."""
    fd, path = tempfile.mkstemp(prefix="dxopt-mm-", suffix=".pkl")
    os.close(fd)
    os.unlink(path)
    proc = mp.get_context("fork").Process(
        target=_child, args=((kind, name, seed, accept_tol, extra), path, mem_gb)
    )
    t0 = time.perf_counter()
    proc.start()
    proc.join(timeout_s)
    wall = time.perf_counter() - t0
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"status": f"timeout (> {timeout_s:g} s)"}, wall
    try:
        with open(path, "rb") as fh:
            result = pickle.load(fh)
        os.unlink(path)
    except OSError:
        code = proc.exitcode
        why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return {"status": f"crashed ({why})"}, wall
    return result, wall


def preimport() -> None:
    """Import the heavy modules once, so forked children start fast (no torch op here)."""
    mods = ("torch", "qpsolvers", "dxopt.qp", "benchmarks.qp.mm_dxopt", "benchmarks.qp.reference",
            "clarabel", "piqp", "daqp", "osqp", "proxsuite")  # fmt: skip
    for mod in mods:
        with contextlib.suppress(Exception):
            importlib.import_module(mod)


# ---------------------------------------------------------------------------------- judging


def _claim(grads: dict[str, np.ndarray], d: dict[str, Any]) -> float:
    total = 0.0
    for key in ("q", "h", "b"):
        if d.get(key) is not None and key in grads:
            total += float(grads[key] @ d[key])
    return total


def _flagged(dx: dict) -> bool:
    """dxopt said the sample is degenerate: a ``QPDegenerateWarning``, dependent rows or a
    pseudo-inverse adjoint in its backward diagnostics."""
    bw = dx.get("backward_info") or {}
    deps = bw.get("dependent_rows") or []
    return bool(
        dx.get("degenerate_warning")
        or (isinstance(deps, list) and any(int(v or 0) > 0 for v in deps))
        or bw.get("licq") is False
        or any(bool(v) for v in (bw.get("pseudo_inverse") or []))
    )


ROUNDOFF = 1e-13  # relative accuracy of a polished solution (its KKT solve's residual)


def evaluation_noise(prob: mmp.MMProblem, seed: int, ev: dict) -> float:
    """The error bound of one evaluation of ``f = w . x*``: the measured disagreement of the two
    finite-difference solvers (``ev["noise"]``), at least the round-off of a polished solution,
    ``ROUNDOFF * sum_i |w_i| max(|x_i|, 1)``, and at least the gap between ``f(0)`` and a flat
    side of any direction (:func:`benchmarks.qp.judge.flat_offset`). Two polished solutions
    on the same active set are the same KKT solve and agree to the last bit, so the measured
    noise alone can be 0, and a slope of round-off (1e-17 / 1e-3) would then read as a usable
    nonzero slope."""
    x0 = ev.get("x0")
    w = np.abs(mmp.loss_weights(prob, seed))
    scale = float(w @ np.maximum(np.abs(x0), 1.0)) if x0 is not None else float(w.sum())
    noise = max(float(ev["noise"]), ROUNDOFF * scale)
    f0 = ev.get("f0")
    if f0 is not None and np.isfinite(f0):  # an error of f(0) that a flat side shows
        sides = [e[k] for e in ev.get("directions", []) for k in ("plus", "minus") if k in e]
        noise = max(noise, J.flat_offset(float(f0), sides))
    return noise


def judge_problem(prob: mmp.MMProblem, seed: int, ev: dict, dx: dict) -> dict[str, Any]:
    """Verdict of dxopt's gradient (``dx["grads"]``) against the evidence ``ev``."""
    grads = dx["grads"]
    noise = evaluation_noise(prob, seed, ev)
    dirs = mmp.directions(prob, seed)
    per = []
    for d, e in zip(dirs, ev["directions"]):
        plus = {float(t): v for t, v in e["plus"].items()}
        minus = {float(t): v for t, v in e["minus"].items()}
        v = J.judge_direction(_claim(grads, d), ev["f0"], plus, minus, noise=noise)
        per.append((d["kind"], v))
    fd = J.combine([v.verdict for _, v in per])
    out: dict[str, Any] = {
        "fd_verdict": fd,
        "directions": {k: v.verdict for k, v in per},
        "fd_rel_error": {k: v.rel_error for k, v in per},
    }
    verdict, source = fd, "fd"
    ref = ev.get("reference") or {}
    if ref.get("verified"):
        # the reference must itself pass the judge wherever finite differences can tell
        ref_ok = all(
            J.judge_direction(r, ev["f0"], e["plus"], e["minus"], noise=noise).verdict != J.WRONG
            for r, e in zip(ref["directions"], ev["directions"])
        )
        x0 = ev.get("x0")
        floor = max(
            1e-8 * max(abs(r) for r in ref["directions"]),
            1e-10 * float(np.abs(mmp.loss_weights(prob, seed)).sum())
            * max(1.0, float(np.abs(x0).max()) if x0 is not None else 1.0),
        )  # fmt: skip
        errs = [
            abs(v.claimed - r) / max(abs(v.claimed), abs(r), floor)
            for (_, v), r in zip(per, ref["directions"])
        ]
        err = max(errs)
        out.update(ref_err=err, ref_consistent=ref_ok)
        if ref_ok and fd != J.WRONG:
            if err > REF_RTOL:
                verdict, source = J.WRONG, "ref"
            elif fd == J.NO_VERDICT:
                verdict, source = J.MATCH, "ref"
    out.update(verdict=verdict, source=source)
    return out


def judge_piece(prob: mmp.MMProblem, seed: int, piece_ev: dict, grads: dict) -> dict[str, Any]:
    """The piece check of a flagged gradient judged ``wrong`` at a degenerate point.

    At a point where the active rows are dependent the solution map has several affine pieces,
    and along a random line the one-sided slopes see only the two pieces the line enters: the
    derivative of a third piece (an element of the B-subdifferential, so of Clarke's
    generalised gradient) can lie outside them, because ``w . x*`` is not convex and
    :math:`\\partial_C f(0) \\subseteq \\partial_C F(\\theta) d` is only an inclusion. The
    check (:func:`benchmarks.qp.mm_problems.piece_evidence`) moves to the point of the piece the
    gradient names (the tight rows outside its support relaxed, :math:`x^\\star` unchanged)
    and judges the same claim there along the same directions: ``piece`` if it matches (or
    lies between the one-sided slopes) there, else the verdict stays ``wrong``. A gradient that
    spreads over all dependent rows (the minimum-norm one) relaxes nothing and stays ``wrong``.
    """
    if "directions" not in piece_ev:
        return {"piece_verdict": J.WRONG, "piece_why": piece_ev.get("why", "")}
    per = []
    noise = evaluation_noise(prob, seed, piece_ev)
    for d, e in zip(mmp.directions(prob, seed), piece_ev["directions"]):
        plus = {float(t): v for t, v in e["plus"].items()}
        minus = {float(t): v for t, v in e["minus"].items()}
        per.append(J.judge_direction(_claim(grads, d), piece_ev["f0"], plus, minus,
                                     noise=noise).verdict)  # fmt: skip
    fd = J.combine(per)
    out = {"piece_verdict": fd, "piece_directions": dict(zip(mmp.DIRECTION_KINDS, per)),
           "piece_relaxed_rows": piece_ev.get("relaxed_rows"), "piece_why": ""}  # fmt: skip
    if fd in (J.MATCH, J.CLARKE):
        out.update(verdict=J.PIECE, source="piece")
    return out


def _piece(prob: mmp.MMProblem, name: str, ev: dict, grads: dict, args: argparse.Namespace) -> dict:
    """:func:`judge_piece` with its evidence computed in an isolated process (it depends on
    dxopt's gradient, so it is cached with this label's results)."""
    path = None if args.cache is None else args.cache / args.label / f"piece-{name}.pkl"
    if args.reuse and path is not None and path.exists():
        with open(path, "rb") as fh:
            pev = pickle.load(fh)
    else:
        pev, _ = isolated("piece", name, args.seed, 0.0, args.fd_timeout,
                          extra=(ev["x0"], grads))  # fmt: skip
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                pickle.dump(pev, fh)
    if "directions" not in pev and "why" not in pev:  # timeout or crash of the check
        return {"piece_verdict": J.WRONG, "piece_why": str(pev.get("status", ""))}
    return judge_piece(prob, args.seed, pev, grads)


# ----------------------------------------------------------------------------- one problem


def _evidence(name: str, seed: int, cache: Path | None, timeout_s: float) -> tuple[dict, float]:
    path = None if cache is None else cache / f"{name}-s{seed}-v{EVIDENCE_VERSION}.pkl"
    if path is not None and path.exists():
        with open(path, "rb") as fh:
            return pickle.load(fh), 0.0
    ev, wall = isolated("fd", name, seed, 0.0, timeout_s)
    if path is not None and ("directions" in ev or str(ev.get("status")).startswith("timeout")):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            pickle.dump(ev, fh)
    return ev, wall


def _task_cached(kind: str, name: str, args: argparse.Namespace, timeout_s: float) -> dict:
    """:func:`isolated`, or its saved result from an earlier run of the same label with
    ``--reuse`` (re-judge or resume without re-solving)."""
    path = None if args.cache is None else args.cache / args.label / f"{kind}-{name}.pkl"
    if args.reuse and path is not None and path.exists():
        with open(path, "rb") as fh:
            return pickle.load(fh)
    res, wall = isolated(kind, name, args.seed, args.accept_tol, timeout_s)
    res["wall_s"] = wall
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            pickle.dump(res, fh)
    return res


def run_problem(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every task of one problem and the combined record."""
    prob = mmp.load(name)
    rec: dict[str, Any] = {"problem": name, "n": prob.n, "m": prob.m, "p": prob.p}
    raws: dict[str, Any] = {}
    for solver in mmp.RAW_SOLVERS:
        if solver not in args.raw:
            raws[solver] = {"status": "not run (--raw)", "success": False}
            continue
        if solver == "daqp" and prob.n > args.dense_max_n:
            raws[solver] = {"status": f"skipped (dense, n > {args.dense_max_n})", "success": False}
            continue
        res = _task_cached(f"raw_{solver}", name, args, args.raw_timeout)
        raws[solver] = {k: v for k, v in res.items() if k != "traceback"}
    rec["raw"] = raws
    dx = dict(_task_cached("dxopt", name, args, args.timeout))
    wall = dx.pop("wall_s", None)
    grads = dx.pop("grads", None)
    x = dx.pop("x", None)
    dx.pop("traceback", None)
    rec["dxopt"] = dx
    rec["dxopt_wall_s"] = wall
    ok_times = [r["time_s"] for r in raws.values() if r.get("success")]
    rec["fastest_raw_s"] = min(ok_times) if ok_times else None
    rec["fastest_raw"] = (
        min((r["time_s"], s) for s, r in raws.items() if r.get("success"))[1] if ok_times else None
    )
    status = dx.get("status", "error")
    solved = status in ("ok", "refused") and bool(dx.get("accepted"))
    rec["forward_success"] = solved
    rec["silent_forward_error"] = (
        status in ("ok", "refused") and not dx.get("accepted")
        and all(s == "solved" for s in dx.get("qp_status", []))
    )  # fmt: skip
    rec["flagged"] = _flagged(dx)
    if status == "forward failed" or (status in ("ok", "refused") and not solved):
        rec["verdict"] = "forward failed"
    elif status == "refused":
        rec["verdict"] = "refused"
    elif status != "ok":
        rec["verdict"] = "error"
    else:
        ev, ev_wall = _evidence(name, args.seed, args.cache, args.fd_timeout)
        rec["fd_wall_s"] = ev_wall
        if "directions" not in ev:
            rec.update(verdict=J.NO_VERDICT, note=f"finite differences: {ev.get('status')}")
        else:
            assert grads is not None
            rec.update(judge_problem(prob, args.seed, ev, dx | {"grads": grads}))
            if rec["verdict"] == J.WRONG and rec["source"] == "fd" and _flagged(dx):
                rec.update(_piece(prob, name, ev, grads, args))
            ref = ev.get("reference") or {}
            rec["ref_verified"] = bool(ref.get("verified"))
            rec["ref_why"] = ref.get("why", "")
            if x is not None and ev.get("x0") is not None:
                rec["x_diff"] = float(np.abs(x - ev["x0"]).max() / (1 + np.abs(ev["x0"]).max()))
    rec["silently_wrong"] = rec["verdict"] == J.WRONG and not rec["flagged"]
    return rec


# ---------------------------------------------------------------------------------- summary


def shifted_geomean(values: list[float], shift: float = 10.0) -> float | None:
    """qpbenchmark's shifted geometric mean ``exp(mean(log(v + shift))) - shift``."""
    if not values:
        return None
    return float(math.exp(sum(math.log(v + shift) for v in values) / len(values)) - shift)


def summarize(records: list[dict], args_timeout: float) -> dict[str, Any]:
    """Success rates, time ratios and verdict counts (qpbenchmark style)."""
    N = len(records)
    counts = Counter(r["verdict"] for r in records)
    ran = [  # raw backends this run timed (``--raw``); the others are left out, not 0%
        s
        for s in mmp.RAW_SOLVERS
        if any(not str(r["raw"][s].get("status", "")).startswith("not run") for r in records)
    ]
    solvers = ["dxopt", *ran]

    def success(r: dict, s: str) -> bool:
        return bool(r["forward_success"]) if s == "dxopt" else bool(r["raw"][s].get("success"))

    def t(r: dict, s: str) -> float | None:
        return r["dxopt"].get("forward_s") if s == "dxopt" else r["raw"][s].get("time_s")

    rates = {s: 100.0 * sum(success(r, s) for r in records) / max(N, 1) for s in solvers}
    sgm = {}
    for s in solvers:
        ratios = []
        for r in records:
            best = [t(r, o) for o in solvers if success(r, o) and t(r, o)]
            if not best:
                continue
            tb = min(best)  # type: ignore[type-var]
            ts = t(r, s) if success(r, s) else args_timeout
            ratios.append(float(ts) / float(tb))  # type: ignore[arg-type]
        sgm[s] = shifted_geomean(ratios)
    solved = [r for r in records if r["forward_success"]]
    with_grad = [r for r in solved if r["verdict"] not in ("refused", "error", "forward failed")]
    verdictable = [r for r in with_grad if r["verdict"] != J.NO_VERDICT]
    best_raw = max(ran or mmp.RAW_SOLVERS, key=lambda s: rates.get(s, 0.0))
    return {
        "problems": N,
        "verdicts": {v: counts.get(v, 0) for v in VERDICTS},
        "silently_wrong": sum(bool(r["silently_wrong"]) for r in records),
        "flagged": sum(bool(r["flagged"]) for r in records),
        "silent_forward_errors": sum(bool(r["silent_forward_error"]) for r in records),
        "success_rate": rates,
        "shifted_geomean_time_ratio": sgm,
        "best_raw": best_raw,
        "forward_solved": len(solved),
        "gradient_given": len(with_grad),
        "gradient_coverage": 100.0 * len(with_grad) / max(len(solved), 1),
        "verdictable": len(verdictable),
        "verdictable_matching": sum(r["verdict"] in PASSING for r in verdictable),
        "refused_names": [r["problem"] for r in records if r["verdict"] == "refused"],
        "wrong_names": [r["problem"] for r in records if r["verdict"] == J.WRONG],
        "failed_names": [r["problem"] for r in records if r["verdict"] == "forward failed"],
    }


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}e}" if (abs(v) < 1e-2 and v != 0) or abs(v) >= 1e4 else f"{v:.3g}"
    return str(v)


def summary_table(summaries: dict[str, dict]) -> str:
    """Before/after table of the headline figures (one column per label)."""
    labels = list(summaries)
    rows = []

    def row(name: str, fn: Any) -> None:
        rows.append({"": name, **{lab: fn(summaries[lab]) for lab in labels}})

    row("problems", lambda s: s["problems"])
    for v in VERDICTS:
        row(f"verdict: {v}", lambda s, v=v: s["verdicts"].get(v, 0))
    row("silently wrong (wrong, not flagged)", lambda s: s["silently_wrong"])
    row("flagged degenerate", lambda s: s["flagged"])
    row("SOLVED but residuals above tolerance", lambda s: s["silent_forward_errors"])
    row("forward success, dxopt (%)", lambda s: f"{s['success_rate']['dxopt']:.1f}")
    row("forward success, best raw backend (%)",
        lambda s: f"{s['success_rate'][s['best_raw']]:.1f} ({s['best_raw']})")  # fmt: skip
    row("gradient given / forward solved (%)", lambda s: f"{s['gradient_coverage']:.1f}")
    row("verdict-able gradients matching",
        lambda s: f"{s['verdictable_matching']} / {s['verdictable']}")  # fmt: skip
    row("time ratio to fastest, dxopt (shifted geomean)",
        lambda s: _fmt(s["shifted_geomean_time_ratio"]["dxopt"]))  # fmt: skip
    return markdown_table(rows, ["", *labels])


def targets_table(summary: dict) -> str:
    """The issue's targets for this suite, each with its figure and PASS/MISSED."""
    rate = summary["success_rate"]
    best = summary["best_raw"]
    rows = [
        ("zero silently wrong gradients", summary["silently_wrong"], not summary["silently_wrong"]),
        (f"forward success >= best raw ({best}, {rate[best]:.1f}%) + 5 points",
         f"{rate['dxopt']:.1f}%", rate["dxopt"] >= rate[best] + 5.0),
        (">= 95% of forward-solved problems get a gradient",
         f"{summary['gradient_coverage']:.1f}%", summary["gradient_coverage"] >= 95.0),
        ("every verdict-able gradient matches (match, clarke or piece)",
         f"{summary['verdictable_matching']} / {summary['verdictable']}",
         summary["verdictable_matching"] == summary["verdictable"]),
    ]  # fmt: skip
    return markdown_table(
        [{"target": t, "measured": v, "verdict": "PASS" if ok else "MISSED"} for t, v, ok in rows],
        ["target", "measured", "verdict"],
    )


def backend_table(summary: dict) -> str:
    rows = [
        {"solver": s, "success (%)": f"{summary['success_rate'][s]:.1f}",
         "time ratio (shifted geomean)": _fmt(summary["shifted_geomean_time_ratio"][s])}
        for s in summary["success_rate"]
    ]  # fmt: skip
    return markdown_table(rows, ["solver", "success (%)", "time ratio (shifted geomean)"])


def solved_by(rec: dict) -> str:
    """The backend (and tolerance, where not the default) that produced dxopt's solution:
    the per-sample record of the fallback chain where dxopt has one, else its ``info.solver``."""
    info = rec["dxopt"].get("info") or {}
    if not isinstance(info, dict):
        return "-"
    solvers, tols = info.get("sample_solvers") or [], info.get("sample_tolerances") or []
    if not solvers:
        return str(info.get("solver", "-"))
    tol = tols[0] if tols else None
    return str(solvers[0]) + (f" @{tol:g}" if tol is not None and tol != 1e-9 else "")


def problem_table(records: list[dict], before: dict | None = None) -> str:
    """One row per problem; with ``before`` (the baseline's payload) a ``before`` column holds
    the baseline's verdict of the same problem (``not run`` where it has none)."""
    old = {r["problem"]: r["verdict"] for r in (before or {}).get("records", [])}
    rows = []
    for r in records:
        dx = r["dxopt"]
        ratio = None
        if dx.get("forward_s") and r.get("fastest_raw_s"):
            ratio = dx["forward_s"] / r["fastest_raw_s"]
        dirs = r.get("directions") or {}
        rows.append({
            "problem": r["problem"], "n": r["n"], "m": r["m"], "p": r["p"],
            "dxopt": dx.get("status", "-") + ("" if r["forward_success"] or dx.get("status")
                                              != "ok" else " (not accepted)"),
            "solver": solved_by(r),
            "fwd s": _fmt(dx.get("forward_s")),
            "fastest raw": f"{r.get('fastest_raw') or '-'} {_fmt(r.get('fastest_raw_s'))}",
            "ratio": _fmt(ratio),
            "before": old.get(r["problem"], "not run"),
            "verdict": r["verdict"] + (f" ({r['source']})" if r.get("source") == "ref" else ""),
            "q/hb/shift": "/".join(dirs.get(k, "-").replace("no verdict", "nv")
                                   for k in mmp.DIRECTION_KINDS) if dirs else "-",
            "ref err": _fmt(r.get("ref_err")),
            "flagged": "yes" if r["flagged"] else "",
        })  # fmt: skip
    cols = ["problem", "n", "m", "p", "dxopt", "solver", "fwd s", "fastest raw", "ratio",
            *(["before"] if before is not None else []), "verdict", "q/hb/shift", "ref err",
            "flagged"]  # fmt: skip
    return markdown_table(rows, cols)


def plot(payloads: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = list(payloads)
    width = 0.8 / max(len(labels), 1)
    for i, lab in enumerate(labels):
        counts = payloads[lab]["summary"]["verdicts"]
        xs = np.arange(len(VERDICTS)) + i * width
        ax1.bar(xs, [counts.get(v, 0) for v in VERDICTS], width, label=lab)
        ratios = [
            r["dxopt"]["forward_s"] / r["fastest_raw_s"] for r in payloads[lab]["records"]
            if r["forward_success"] and r.get("fastest_raw_s") and r["dxopt"].get("forward_s")
        ]  # fmt: skip
        if ratios:
            ax2.hist(np.log10(ratios), bins=20, alpha=0.5, label=lab)
    ax1.set_xticks(np.arange(len(VERDICTS)) + 0.4 - width / 2, VERDICTS, rotation=30, ha="right")
    ax1.set_ylabel("problems")
    ax1.set_title("gradient verdicts")
    ax1.legend()
    ax2.set_xlabel("log10(dxopt forward time / fastest raw backend)")
    ax2.set_ylabel("problems")
    ax2.set_title("forward time ratio (solved problems)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(payloads: dict[str, dict]) -> str:
    """The BENCHMARKS.md section: headline before/after table, backends, per-problem table."""
    first = next(iter(payloads.values()))
    parts = [
        "## QP layers on the Maros-Meszaros test set",
        "",
        "Every problem with the size limit of the run, passed as a new user would (torch sparse "
        "CSR, default options), loss `L = w . x*`. Each task (dxopt, each raw backend, the "
        "finite differences) ran in its own forked process with a time limit, 1 thread. "
        f"Forward success: solved and relative primal/dual/gap residuals <= "
        f"{first['accept_tol']:g}. Gradient verdict (`benchmarks/qp/judge.py`): one-sided "
        "finite differences of tight-tolerance clarabel/piqp re-solves along three random "
        "directions (q; h and b in range(A); a translation of the feasible set) at steps "
        "1e-3..1e-7 with a step-consistency check; a kink accepts either one-sided slope "
        "(`clarke`: between the two), unstable differences give `no verdict` (each evaluation "
        "carries the measured disagreement of the two solvers, at least the round-off "
        f"{ROUNDOFF:g} sum|w_i| max(|x_i|, 1) of a polished solution). A flagged (degenerate) "
        "gradient judged `wrong` on the lines gets the piece check: at dependent active rows "
        "the solution map has more affine pieces than a line enters, so the derivative of "
        "another piece (a B-subdifferential element) can lie outside the line's one-sided "
        "slopes; the tight rows outside the gradient's support are relaxed by 1% (x* must not "
        "move) and the same claim is judged there along the same directions: `piece` if it "
        "matches there, else still `wrong`. Where the active "
        "set is verified (LICQ, strict complementarity), the exact reduced-KKT gradient is a "
        f"second judge (`wrong` above {REF_RTOL:g} relative error along a direction). "
        "Finite differences and the reference use polished solutions (the exact KKT solve on "
        "the active set read off the interior-point solution). Time ratio: dxopt forward "
        "/ fastest successful solve of the problem, shifted geometric mean (shift 10, a failure "
        "counts as the time limit), as in qpbenchmark.",
        "",
    ]
    for lab, pl in payloads.items():
        info = pl["machine"]
        parts += [
            f"**{lab}**: `{pl['command']}` ({pl.get('code', '')}). {machine_line(info)} "
            f"Load average at start / end: {pl['load_start']} / {pl['load_end']}."
            + (f" {pl['note']}" if pl.get("note") else ""),
            "",
        ]
    sets = {lab: {r["problem"] for r in pl["records"]} for lab, pl in payloads.items()}
    union = set().union(*sets.values())
    for lab, names in sets.items():
        if names != union:
            parts += [
                f"**{lab}** covers {len(names)} of the {len(union)} problems; the others are "
                "`not run` in the per-problem table and absent from its summary column.",
                "",
            ]
    parts += ["### Summary", "", summary_table({k: v["summary"] for k, v in payloads.items()})]
    for lab, pl in payloads.items():
        parts += ["", f"### {lab}: targets", "", targets_table(pl["summary"])]
    for lab, pl in payloads.items():
        s = pl["summary"]
        parts += [
            "", f"### {lab}: backends", "", backend_table(s), "",
            "dxopt's solutions came from: "
            + ", ".join(f"{k} {v}" for k, v in Counter(
                solved_by(r) for r in pl["records"] if r["dxopt"].get("info")
            ).most_common()) + ". "
            f"Wrong: {', '.join(s['wrong_names']) or 'none'}. "
            f"Refused: {', '.join(s['refused_names']) or 'none'}. "
            f"Forward failed: {', '.join(s['failed_names']) or 'none'}.",
        ]  # fmt: skip
    last_label, last = list(payloads.items())[-1]
    before = payloads.get("before") if last_label != "before" else None
    parts += ["", f"### {last_label}: per problem", "", problem_table(last["records"], before)]
    parts += ["", "Plot: `benchmarks/qp/results/maros_meszaros.png`; raw results: "
              "`benchmarks/qp/results/maros_meszaros_<label>.json`."]  # fmt: skip
    return "\n".join(parts)


# -------------------------------------------------------------------------------------- main


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    return obj


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-n", type=int, default=2000, help="largest n (default 2000)")
    parser.add_argument("--min-n", type=int, default=0, help="only problems with n > MIN_N")
    parser.add_argument("--problems", default="", help="comma-separated names (overrides n)")
    parser.add_argument("--quick", action="store_true", help="six tiny problems, temp output")
    parser.add_argument("--label", default="current", help="name of this run (before/after)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="dxopt task limit, s")
    parser.add_argument("--raw-timeout", type=float, default=30.0, help="raw backend limit, s")
    parser.add_argument("--fd-timeout", type=float, default=240.0, help="FD evidence limit, s")
    parser.add_argument("--accept-tol", type=float, default=1e-6)
    parser.add_argument(
        "--raw", default=",".join(mmp.RAW_SOLVERS),
        help="comma-separated raw backends to time (default: all five)",
    )  # fmt: skip
    parser.add_argument("--dense-max-n", type=int, default=3000, help="largest n for daqp")
    parser.add_argument("--cache", type=Path, default=None, help="FD evidence cache folder")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument(
        "--reuse", action="store_true",
        help="reuse the saved dxopt/raw results of this label (re-judge or resume)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-md", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--note", default="", help="a sentence added to this run's report")
    parser.add_argument(
        "--evidence-only", action="store_true",
        help="only fill the finite-difference cache (it does not depend on dxopt)",
    )  # fmt: skip
    parser.add_argument(
        "--render-only", action="store_true",
        help="rebuild the report and BENCHMARKS.md section from the saved before/after JSON",
    )  # fmt: skip
    parser.add_argument(
        "--merge", default="",
        help="comma-separated payload JSONs of other runs (e.g. the 2000 < n <= 10000 run) "
        "merged into the before/after payload of their label: one combined table",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.raw = [s.strip() for s in args.raw.split(",") if s.strip()]
    merge = [Path(p) for p in args.merge.split(",") if p.strip()]
    if args.render_only:
        out = args.out or results_dir("qp")
        payloads = load_payloads(out, merge)
        render(payloads, out, update_md=args.out is None and not args.no_md)
        return
    set_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.quick:
        names = [(p, 0) for p in QUICK]
    elif args.problems:
        names = [(p.strip(), 0) for p in args.problems.split(",") if p.strip()]
    else:
        names = mmp.problem_names(max_n=args.max_n, min_n=args.min_n)
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="dxopt-bench-mm-")) if args.quick else results_dir("qp")
    )
    out.mkdir(parents=True, exist_ok=True)
    if args.no_cache:
        args.cache = None
    elif args.cache is None:
        args.cache = (out if args.quick else results_dir("qp")) / "mm_cache"
    preimport()
    if args.evidence_only:  # fill the finite-difference cache (independent of dxopt)
        for name, _ in tqdm(names, desc="evidence", unit="problem", file=sys.stderr):
            t0 = time.perf_counter()
            ev, _ = _evidence(name, args.seed, args.cache, args.fd_timeout)
            tqdm.write(f"{name}: {ev.get('base_solver', ev.get('status'))} "
                       f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)  # fmt: skip
        return
    load_start = round(os.getloadavg()[0], 2)
    info_start = machine_info()  # the commit and date the run started from
    import dxopt

    src = Path(dxopt.__file__).parent
    dirty = subprocess.run(
        ["git", "status", "--short", "."], cwd=src, capture_output=True, text=True, check=False
    ).stdout.split("\n")
    dirty = [line for line in dirty if line.strip()]
    records = []
    partial = out / f"maros_meszaros_{args.label}.partial.json"
    bar = tqdm(names, desc="maros-meszaros", unit="problem", file=sys.stderr)
    for name, _ in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        rec = run_problem(name, args)
        rec["total_s"] = time.perf_counter() - t0
        records.append(_jsonable(rec))
        tqdm.write(f"{name}: {rec['verdict']} ({rec['total_s']:.1f} s)", file=sys.stderr)
        write_json(partial, {"records": records})
    given = list(argv if argv is not None else sys.argv[1:])
    payload = {
        "command": " ".join([COMMAND, *given]).strip(),
        "label": args.label,
        "code": f"dxopt from {src}"
        + (f", {len(dirty)} files with uncommitted changes" if dirty else ""),
        "machine": info_start,
        "load_start": load_start,
        "load_end": round(os.getloadavg()[0], 2),
        "accept_tol": args.accept_tol,
        "timeout": args.timeout,
        "note": args.note,
        "summary": summarize(records, args.timeout),
        "records": records,
    }
    write_json(out / f"maros_meszaros_{args.label}.json", payload)
    partial.unlink(missing_ok=True)
    payloads = {k: v for k, v in load_payloads(out, merge).items() if k != args.label}
    payloads[args.label] = payload
    render(payloads, out, update_md=not args.quick and args.out is None and not args.no_md)


def load_payloads(out: Path, merge: list[Path] | None = None) -> dict[str, dict]:
    """The saved ``before`` and ``after`` runs found in ``out``, each combined with the runs of
    ``merge`` that have its label (:func:`merge_payloads`)."""
    payloads = {}
    for lab in ("before", "after"):
        f = out / f"maros_meszaros_{lab}.json"
        if f.exists():
            payloads[lab] = json.loads(f.read_text())
            run = payloads[lab]  # the summary is recomputed: the rules may have changed since
            run["summary"] = summarize(run["records"], float(run.get("timeout", 120.0)))
    for f in merge or []:
        extra = json.loads(Path(f).read_text())
        lab = extra.get("label", "after")
        payloads[lab] = merge_payloads(payloads[lab], extra) if lab in payloads else extra
    return {k: payloads[k] for k in sorted(payloads, key=lambda k: k != "before")}


def merge_payloads(base: dict, extra: dict) -> dict:
    """One payload from two runs of the same label over different problem ranges (e.g.
    ``--max-n 2000`` and ``--min-n 2000 --max-n 10000``): the records of both (``extra``'s
    record wins for a problem in both), the summary recomputed over all of them, the commands,
    machine lines and notes of both kept."""
    records = {r["problem"]: r for r in base["records"]}
    records.update({r["problem"]: r for r in extra["records"]})
    merged = sorted(records.values(), key=lambda r: (r["n"], r["problem"]))
    timeout = max(float(base.get("timeout", 120.0)), float(extra.get("timeout", 120.0)))
    notes = (base.get("note", ""), extra.get("note", ""),
             f"Second run: {machine_line(extra['machine'])}")  # fmt: skip
    note = " ".join(t for t in notes if t)
    out = dict(base)
    out.update(
        command=f"{base['command']}` and `{extra['command']}",
        code=base.get("code", "") + "; " + extra.get("code", ""),
        load_start=f"{base['load_start']} and {extra['load_start']}",
        load_end=f"{base['load_end']} and {extra['load_end']}",
        note=note,
        timeout=timeout,
        records=merged,
        summary=summarize(merged, timeout),
    )
    return out


def render(payloads: dict[str, dict], out: Path, *, update_md: bool) -> None:
    """Write the Markdown report and the plot; update BENCHMARKS.md if asked."""
    if not payloads:
        raise SystemExit(f"no maros_meszaros_<label>.json in {out}")
    text = section(payloads)
    (out / "maros_meszaros.md").write_text(text + "\n")
    plot(payloads, out / "maros_meszaros.png")
    print(text)
    print(f"\nresults written to {out}")
    if update_md:
        update_benchmarks_md(SECTION, text)
        print(f"BENCHMARKS.md section '{SECTION}' updated")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
