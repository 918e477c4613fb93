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
  (:func:`benchmarks.qp.mm_evidence.reference_gradient`); a flagged gradient judged ``wrong``
  there gets the piece check (:func:`judge_piece`: B-subdifferential membership at a nearby
  point of its piece);
- the exact judge of :mod:`benchmarks.qp.mm_kkt_judge` (``kkt_verdict``, ``kkt_why``): the
  KKT derivative on an active set verified with strict-complementarity margins; a ``wrong``
  there also counts as silently wrong when dxopt did not flag the sample;
- for a refused gradient, the judge of :mod:`benchmarks.qp.mm_face` (``face_verdict``): two
  LPs over the optimal set say whether the loss takes several values there (no derivative
  exists: the refusal is right).

The finite-difference evidence does not depend on dxopt and is cached per problem (``--cache``)
so that the same problems can be judged against two versions of the code (``--label before``
with ``PYTHONPATH`` pointing at the old sources, ``--label after`` at the new). Summaries follow
qpbenchmark (success rate; shifted geometric mean, shift 10, of the time ratio to the fastest
solve of the problem, a failure counting as the time limit). ``--render-only --merge
RUN.json`` combines runs over different size ranges into one table (before/after per problem).

This module is the runner (isolated tasks, caching, the command line); the verdict of one
problem is :mod:`benchmarks.qp.mm_verdict`, the summary, tables and BENCHMARKS.md section
:mod:`benchmarks.qp.mm_report`, the data :mod:`benchmarks.qp.mm_problems`, the
finite-difference evidence :mod:`benchmarks.qp.mm_evidence`, dxopt's side
:mod:`benchmarks.qp.mm_dxopt`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing as mp
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from benchmarks.common import machine_info, results_dir, set_threads, write_json
from benchmarks.qp import judge as J
from benchmarks.qp import mm_evidence as mme
from benchmarks.qp import mm_problems as mmp
from benchmarks.qp.mm_report import (  # noqa: F401  (re-exported: the runner's public names)
    SECTION,
    load_payloads,
    merge_payloads,
    render,
    section,
    summarize,
)
from benchmarks.qp.mm_verdict import (  # noqa: F401
    PASSING,
    REF_RTOL,
    VERDICTS,
    evaluation_noise,
    flagged,
    judge_piece,
    judge_problem,
)

COMMAND = "dxopt bench qp --suite maros-meszaros"
QUICK = ("HS21", "HS35", "HS76", "QAFIRO", "DUALC1", "HS21" + mmp.ZERO_ROW)
EVIDENCE_VERSION = 3  # 3: the line re-solves start with the solver of f(0)


# ------------------------------------------------------------------------- isolated tasks


def _task(kind: str, name: str, seed: int, accept_tol: float, extra: Any = None) -> Any:
    prob = mmp.load(name)
    if kind == "fd":
        return mme.fd_evidence(prob, seed)
    if kind == "piece":
        return mme.piece_evidence(prob, seed, *extra)
    if kind == "kkt":  # the exact judge (extra: dxopt's gradient and solution)
        from dataclasses import asdict

        from benchmarks.qp.mm_kkt_judge import judge

        return asdict(judge(prob, seed, *extra))
    if kind == "face":  # the judge of refusals: is the loss a function of the data here?
        from dataclasses import asdict

        from benchmarks.qp.mm_face import judge_face

        return asdict(judge_face(prob, seed))
    if kind == "dxopt":
        from benchmarks.qp.mm_dxopt import run_dxopt

        def checkpoint(state: dict) -> None:  # the forward's record, kept if the backward hangs
            if _STAGE_PATH:
                with open(_STAGE_PATH, "wb") as fh:
                    pickle.dump(state, fh)

        return run_dxopt(prob, seed, accept_tol=accept_tol, on_forward=checkpoint)
    if kind.startswith("raw_"):
        return mmp.raw_solve(prob, kind[4:], accept_tol=accept_tol)
    raise ValueError(f"unknown task {kind!r}")


_STAGE_PATH = ""  # in a child: where a task saves its state between stages


def _child(args: tuple, path: str, mem_gb: float) -> None:
    global _STAGE_PATH
    _STAGE_PATH = path + ".stage"
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
    stage = path + ".stage"
    if proc.is_alive():
        proc.kill()
        proc.join()
        if os.path.exists(stage):  # the forward finished, the backward ran out of time
            with open(stage, "rb") as fh:
                result = pickle.load(fh)
            os.unlink(stage)
            if result.get("status") == "ok":
                result["status"] = f"backward timeout (> {timeout_s:g} s)"
                return result, wall
        return {"status": f"timeout (> {timeout_s:g} s)"}, wall
    with contextlib.suppress(OSError):
        os.unlink(stage)
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
    backward_timeout = status.startswith("backward timeout")
    solved = (status in ("ok", "refused") or backward_timeout) and bool(dx.get("accepted"))
    rec["forward_success"] = solved
    rec["silent_forward_error"] = (
        status in ("ok", "refused") and not dx.get("accepted")
        and all(s == "solved" for s in dx.get("qp_status", []))
    )  # fmt: skip
    rec["flagged"] = flagged(dx)
    if status == "forward failed" or (status in ("ok", "refused") and not solved):
        rec["verdict"] = "forward failed"
    elif status == "refused":
        rec["verdict"] = "refused"
        face, _ = isolated("face", name, args.seed, 0.0, args.fd_timeout)
        rec["face_verdict"] = face.get("verdict", "no verdict")
        rec["face_why"] = str(face.get("why", face.get("status", "")))[:300]
        rec["face_ranges"] = face.get("ranges")
    elif backward_timeout:  # the forward is recorded; the gradient is missing, not refused
        rec.update(verdict="error", note=status)
    elif status == "not convex":  # refused input (NotPSDError): no forward, no gradient
        rec.update(verdict="refused", note=str(dx.get("error", ""))[:200])
    elif status != "ok":
        rec["verdict"] = "error"
    else:
        ev, ev_wall = _evidence(name, args.seed, args.cache, args.fd_timeout)
        rec["fd_wall_s"] = ev_wall
        if "directions" not in ev:
            rec.update(verdict=J.NO_VERDICT, note=f"finite differences: {ev.get('status')}")
        else:
            assert grads is not None
            rec.update(judge_problem(prob, args.seed, ev, dx | {"grads": grads, "x": x}))
            if rec["verdict"] == J.WRONG and rec["source"] == "fd" and flagged(dx):
                rec.update(_piece(prob, name, ev, grads, args))
            ref = ev.get("reference") or {}
            rec["ref_verified"] = bool(ref.get("verified"))
            rec["ref_why"] = ref.get("why", "")
            if x is not None and ev.get("x0") is not None:
                rec["x_diff"] = float(np.abs(x - ev["x0"]).max() / (1 + np.abs(ev["x0"]).max()))
    if status == "ok" and grads is not None:  # the exact judge (benchmarks.qp.mm_kkt_judge)
        kkt, _ = isolated("kkt", name, args.seed, 0.0, args.fd_timeout, extra=(grads, x))
        rec["kkt_verdict"] = kkt.get("verdict", J.NO_VERDICT)
        rec["kkt_why"] = str(kkt.get("why", kkt.get("status", "")))[:300]
        rec["kkt_rel_error"] = kkt.get("rel_error")
    wrong = J.WRONG in (rec["verdict"], rec.get("kkt_verdict"))
    rec["silently_wrong"] = wrong and not rec["flagged"]
    return rec


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
    # one BLAS thread in every task (forked children inherit it): OMP_NUM_THREADS set above
    # comes after numpy loaded OpenBLAS, which then runs 2 threads; on a loaded machine those
    # spin, and a dense degenerate backward took 12x its CPU time (QETAMACR: 91 s against 7.5 s)
    blas_limit = threadpool_limits(limits=1)  # noqa: F841  (kept for the run's lifetime)
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


if __name__ == "__main__":
    main()
