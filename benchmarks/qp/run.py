"""QP benchmark: dxopt (penalty and KKT backward) against qpth, cvxpylayers, raw qpsolvers
solves and one dense Cholesky, on the dQP problem families (issue 6).

Every (problem, size, method) cell runs in its own forked process with a timeout and an
address-space limit, so timeouts, out-of-memory and errors are recorded instead of stopping
the run. Forward and backward are timed separately (median of 3 when a call takes < 60 s);
the loss is ``L = w . x*`` with a fixed ``w ~ N(0, I)``, and the gradient error
``||g - g_ref|| / ||g_ref||`` is taken over ``(q, h, b)`` (plus ``G, A`` on the dense families)
against the exact reduced-KKT reference (:mod:`benchmarks.qp.reference`) or the simplex
closed form. Run ``dxopt bench qp`` (full, about 25 minutes) or ``dxopt bench qp --quick``.
``dxopt bench qp --suite maros-meszaros [--max-n N]`` runs the Maros-Meszaros benchmark instead
(:mod:`benchmarks.qp.maros_meszaros`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.common import (
    SMOKE_NOTE,
    machine_info,
    machine_line,
    results_dir,
    set_threads,
    smoke_verdicts,
    update_benchmarks_md,
    write_json,
)
from benchmarks.qp import report
from benchmarks.qp.worker import Case, preimport, run_case

FAMILIES = ("dense", "batched", "sparse", "simplex", "chains")
DX = ["dxopt_penalty", "dxopt_kkt"]
COMMAND = "dxopt bench qp"
SUITES = ("families", "maros-meszaros")


def plan(quick: bool) -> list[Case]:
    """The cells of the run: (family, n, method) with per-method size caps and limits."""
    cases: list[Case] = []

    def add(family: str, sizes: list[int], methods: list[str], **kw: Any) -> None:
        for n in sizes:
            for method in methods:
                cases.append(Case(family, n, method, **kw))

    if quick:
        add("dense", [30], ["reference", *DX, "qpth", "cvxpylayers", "raw_daqp", "raw_piqp",
                            "cholesky"], timeout_s=120)  # fmt: skip
        add("batched", [8], ["reference", *DX, "qpth", "raw_daqp", "cholesky"],
            batch=4, m=8, p=4, timeout_s=120)  # fmt: skip
        add("simplex", [100], ["reference", *DX, "raw_piqp"], timeout_s=120)
        add("chains", [200], ["reference", *DX, "raw_piqp"], timeout_s=120)
        add("sparse", [100], ["reference", *DX, "raw_piqp"], timeout_s=120)
        return cases
    dense = [100, 500, 1000, 2000]
    add("dense", dense, ["reference", *DX, "qpth", "raw_daqp", "raw_proxqp", "cholesky"],
        timeout_s=300)  # fmt: skip
    add("dense", [100, 500, 1000], ["raw_piqp"], timeout_s=60)
    add("dense", [100, 500], ["raw_clarabel"], timeout_s=60)
    # cvxpylayers: ~24 GB to compile at n = 1000 (anchors.md); run there under a limit to record it
    add("dense", [100, 500], ["cvxpylayers"], timeout_s=240, mem_gb=8)
    add("dense", [1000], ["cvxpylayers"], timeout_s=120, mem_gb=8)
    add("batched", [50], ["reference", *DX, "qpth", "raw_daqp", "raw_piqp", "cholesky"],
        batch=128, m=50, p=25, timeout_s=300)  # fmt: skip
    add("simplex", [10**3, 10**4, 10**5, 10**6], ["reference", *DX, "raw_piqp", "raw_clarabel"],
        timeout_s=300)  # fmt: skip
    add("simplex", [10**3], ["qpth"], timeout_s=120)
    add("simplex", [10**3, 10**4, 10**5], ["cvxpylayers"], timeout_s=180, mem_gb=8)
    add("chains", [200, 1000, 10**4, 10**5], ["reference", *DX, "raw_piqp", "raw_clarabel"],
        timeout_s=240)  # fmt: skip
    add("chains", [200, 1000], ["qpth", "cvxpylayers"], timeout_s=120, mem_gb=8)
    add("sparse", [100, 1000], ["reference", *DX, "raw_piqp", "raw_clarabel", "raw_osqp"],
        timeout_s=150)  # fmt: skip
    add("sparse", [100, 1000], ["qpth", "cvxpylayers"], timeout_s=120, mem_gb=8)
    # n = 1e4: raw clarabel took > 400 s and piqp > 60 s already at n = 3000 on this machine
    # (random sparse rows fill the KKT factor), so only a 60 s attempt is recorded
    add("sparse", [10**4], ["dxopt_penalty", "raw_piqp"], timeout_s=60)
    return cases


def evaluate(rec: dict, folder: Path, refs: dict) -> None:
    """Attach ``rec``'s gradient error against its size's reference (kept in ``refs``)."""
    if rec.get("status") != "ok":
        return
    with np.load(folder / "grads.npz") as z:
        grads = dict(z)
    cell = (rec["family"], rec["n"])
    if rec["method"] == "reference":
        refs[cell] = (rec, grads)
        return
    ref_rec, ref = refs.get(cell, ({}, {}))
    if not ref:
        return
    if "x" in grads and "x" in ref:
        diff = np.linalg.norm(grads["x"] - ref["x"]) / max(np.linalg.norm(ref["x"]), 1e-300)
        rec["x_rel_err"] = float(diff)
    blocks = ["q"] if ref_rec.get("degenerate") else [k for k in "qhbGA" if k in ref]
    rec["grad_blocks"] = "".join(blocks)
    rec["grad_err"] = report.grad_error(grads, ref, blocks)


def section(records: list[dict], target_rows: list[dict], info: dict, args_line: str) -> str:
    parts = [
        "## QP layers",
        "",
        f"Command: `{args_line}`",
        "",
        machine_line(info),
        f"Load average (1 min) at start / end of the run: {info.get('load_start', '-')} / "
        f"{info.get('load_end', '-')} on {info['cores']} cores (the machine is shared).",
        "",
        "Every cell ran in its own forked process (timeout, address-space limit), float64, "
        "2 threads; times are medians of 3 after an untimed warm-up (a single run when a call "
        "took over 60 s); `first call s`: that warm-up's forward+backward (one-time costs: "
        "imports, compiled kernels, fresh memory). Loss `L = w . x*`; grad rel. err over "
        "(q, h, b[, G, A]) against the exact reduced-KKT reference on the polished active "
        "set (closed form for the simplex; only q where the active rows are degenerate). "
        "The dXPP reference code is not run; "
        "its figures are in `shared/research/anchors.md` (dense n=1000: 537 ms forward, "
        "26 ms backward, grad err 6.6e-4; simplex n=1e6: grad err 1.0).",
        "",
        "### Targets",
        "",
        report.targets_table(target_rows),
    ]
    for family in FAMILIES:
        if any(r["family"] == family for r in records):
            parts += ["", f"### {family}", "", report.results_table(records, family)]
    parts += ["", "Plots: `benchmarks/qp/results/qp_<family>.png`."]
    return "\n".join(parts)


def _run_cells(cases: list[Case], out: Path) -> tuple[list[dict], float]:
    """Run every cell (progress bar); checkpoints ``qp_partial.json`` after each one."""
    work = Path(tempfile.mkdtemp(prefix="dxopt-qp-cells-"))
    load_start = round(os.getloadavg()[0], 1)
    records: list[dict] = []
    refs: dict = {}
    preimport()
    try:
        bar = tqdm(cases, desc="qp bench", unit="cell", file=sys.stderr)
        for case in bar:
            bar.set_postfix_str(case.key)
            rec = run_case(case, work / case.key)
            evaluate(rec, work / case.key, refs)
            if case.method != "reference":
                shutil.rmtree(work / case.key, ignore_errors=True)
            records.append(rec)
            partial = {"records": records, "load_start": load_start}
            write_json(out / "qp_partial.json", partial)  # survives an abort
            if rec.get("status") != "ok":
                tqdm.write(f"{case.key}: {rec.get('status')}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "qp_partial.json").unlink(missing_ok=True)
    return records, load_start


def _complete(records: list[dict], cases: list[Case]) -> list[dict]:
    """Add a "not run" record for every planned cell a stopped run did not reach."""
    done = {r["key"] for r in records}
    missing = [
        {**c.__dict__, "key": c.key, "status": "not run (run stopped at its time budget)"}
        for c in cases
        if c.key not in done
    ]
    return [*records, *missing]


def main(argv: list[str] | None = None) -> None:
    given = list(argv if argv is not None else sys.argv[1:])
    if "--suite" in given or any(a.startswith("--suite=") for a in given):
        suite = argparse.ArgumentParser(add_help=False)
        suite.add_argument("--suite", choices=SUITES, default="families")
        ns, rest = suite.parse_known_args(given)
        if ns.suite == "maros-meszaros":  # its own options: see benchmarks/qp/maros_meszaros.py
            from benchmarks.qp import maros_meszaros

            maros_meszaros.main(rest)
            return
        argv = rest
    parser = argparse.ArgumentParser(
        prog="dxopt bench qp",
        description="QP benchmark: dxopt (penalty and KKT backward) against qpth, cvxpylayers, "
        "raw qpsolvers solves and one dense Cholesky, on the dQP problem families.",
    )
    parser.add_argument(
        "--suite",
        choices=SUITES,
        default="families",
        help="'families' (this benchmark) or 'maros-meszaros' (benchmarks/qp/maros_meszaros.py; "
        "its options: --max-n N, --quick, --label ...)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run into a temporary folder")
    parser.add_argument(
        "--only",
        choices=FAMILIES,
        nargs="+",
        action="extend",
        help="problem families to run, space separated (default: all)",
    )
    parser.add_argument("--seed", type=int, default=0, help="problem seed")
    parser.add_argument("--out", type=Path, default=None, help="output folder override")
    parser.add_argument(
        "--report-from",
        type=Path,
        default=None,
        help="build the report from a stopped run's qp_partial.json; cells it lacks are "
        "reported as not run",
    )
    parser.add_argument("--note", default="", help="a sentence added to the report")
    args = parser.parse_args(argv)
    set_threads(2)
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="dxopt-bench-qp-")) if args.quick else results_dir("qp")
    )
    out.mkdir(parents=True, exist_ok=True)
    cases = [
        Case(**{**c.__dict__, "seed": args.seed})
        for c in plan(args.quick)
        if not args.only or c.family in args.only
    ]
    if args.report_from is not None:
        saved = json.loads(args.report_from.read_text())
        records, load_start = _complete(saved["records"], cases), saved.get("load_start")
    else:
        records, load_start = _run_cells(cases, out)
    batch_n = 8 if args.quick else 50
    simplex_n = 100 if args.quick else 10**6
    target_rows = report.targets(records, batch_n=batch_n, simplex_n=simplex_n)
    if args.quick:  # a smoke budget measures no target
        target_rows = smoke_verdicts(target_rows)
    info = {**machine_info(), "load_start": load_start, "load_end": round(os.getloadavg()[0], 1)}
    given = list(argv if argv is not None else sys.argv[1:])
    for flag in ("--report-from", "--note"):  # the measurements came from the stopped run
        if flag in given:
            i = given.index(flag)
            given = given[:i] + given[i + 2 :]
    args_line = " ".join([COMMAND, *given]).strip()
    payload = {"machine": info, "command": args_line, "records": records, "targets": target_rows}
    write_json(out / "qp.json", payload)
    text = section(records, target_rows, info, args_line)
    if args.quick:
        text = text.replace("\n\n### Targets", f"\n\n### Targets\n\n{SMOKE_NOTE}", 1)
    if args.report_from is not None or args.note:
        note = args.note or "The run was stopped at its time budget; cells it did not reach say so."
        text = text.replace("\n\n### Targets", f"\n\n{note}\n\n### Targets", 1)
    (out / "qp.md").write_text(text + "\n")
    for family in FAMILIES:
        if any(r["family"] == family for r in records):
            report.plot_family(records, family, out / f"qp_{family}.png")
    print(text)
    print(f"\nresults written to {out}")
    if not args.quick and args.out is None and not args.only:
        update_benchmarks_md("qp", text)
        print("BENCHMARKS.md section 'qp' updated")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
