"""The Maros-Meszaros report: summary counts (qpbenchmark style), the tables, the plot, the
BENCHMARKS.md section, and the merging of saved runs (``--render-only --merge``)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import machine_line, markdown_table, update_benchmarks_md
from benchmarks.qp import judge as J
from benchmarks.qp import mm_problems as mmp
from benchmarks.qp.mm_verdict import PASSING, REF_RTOL, ROUNDOFF, VERDICTS

SECTION = "qp-maros-meszaros"


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
    no_derivative = [  # refusals where benchmarks.qp.mm_face shows the loss is not unique
        r["problem"] for r in solved
        if r["verdict"] == "refused" and r.get("face_verdict") == "not unique (verified)"
    ]  # fmt: skip
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
        "no_derivative_names": no_derivative,
        "gradient_coverage_where_one_may_exist": 100.0
        * len(with_grad)
        / max(len(solved) - len(no_derivative), 1),
        "verdictable": len(verdictable),
        "verdictable_matching": sum(r["verdict"] in PASSING for r in verdictable),
        "nonunique_names": [r["problem"] for r in records if r.get("source") == "non-unique"],
        "backward_timeout_names": [
            r["problem"]
            for r in records
            if str(r["dxopt"].get("status", "")).startswith("backward timeout")
        ],
        "raw_solved": sum(any(v.get("success") for v in r["raw"].values()) for r in records),
        "raw_solved_dxopt_failed": [
            r["problem"]
            for r in records
            if any(v.get("success") for v in r["raw"].values())
            and not r["forward_success"]
            and r["dxopt"].get("status") != "not convex"
        ],
        "nonconvex_names": [
            r["problem"] for r in records if r["dxopt"].get("status") == "not convex"
        ],
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
    row("  of which x* not unique (evidence about another optimal point)",
        lambda s: len(s.get("nonunique_names", [])))  # fmt: skip
    row("  error: backward out of time (forward solved)",
        lambda s: len(s.get("backward_timeout_names", [])))  # fmt: skip
    row("silently wrong (wrong, not flagged)", lambda s: s["silently_wrong"])
    row("flagged degenerate", lambda s: s["flagged"])
    row("SOLVED but residuals above tolerance", lambda s: s["silent_forward_errors"])
    row("forward solved: dxopt / any raw backend",
        lambda s: f"{s['forward_solved']} / {s.get('raw_solved', '-')}")  # fmt: skip
    row("forward solved by a raw backend, not by dxopt",
        lambda s: len(s.get("raw_solved_dxopt_failed", [])))  # fmt: skip
    row("refused as non-convex (NotPSDError; raw backends return a KKT point)",
        lambda s: len(s.get("nonconvex_names", [])))  # fmt: skip
    row("forward success, dxopt (%)", lambda s: f"{s['success_rate']['dxopt']:.1f}")
    row("forward success, best raw backend (%)",
        lambda s: f"{s['success_rate'][s['best_raw']]:.1f} ({s['best_raw']})")  # fmt: skip
    row("gradient given / forward solved (%)", lambda s: f"{s['gradient_coverage']:.1f}")
    row("  refused where no derivative exists (loss not unique on the optimal set, verified)",
        lambda s: len(s.get("no_derivative_names", [])))  # fmt: skip
    row("gradient given / forward solved less those (%)",
        lambda s: _fmt(s.get("gradient_coverage_where_one_may_exist")))  # fmt: skip
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
        ("every problem a raw backend solves, dxopt solves (or refuses as non-convex)",
         (", ".join(summary["raw_solved_dxopt_failed"]) or "all")
         + (f"; refused as non-convex (NotPSDError): {', '.join(summary['nonconvex_names'])}"
            if summary.get("nonconvex_names") else ""),
         not summary["raw_solved_dxopt_failed"]),
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
            "verdict": r["verdict"]
            + (f" ({r['source']})" if r.get("source") in ("ref", "non-unique") else "")
            + (" (no derivative: loss not unique)"
               if r.get("face_verdict") == "not unique (verified)" else ""),
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
        "A problem whose solution is not unique gets `no verdict (non-unique)` whatever the "
        "lines read (`benchmarks/qp/mm_verdict.py::not_unique`: dxopt's accepted point and "
        "the finite-difference solver's are far apart, P is flat between them and their "
        "objectives are equal): `w . x*` is then not a function of the data, and differences "
        "taken at one optimal point say nothing about the gradient at another. At a kink "
        "(a weakly active row: zero slack, zero multiplier) dxopt returns the derivative of "
        "the piece where the row is inactive, one of the two one-sided derivatives; a central "
        "difference averages the two pieces there and is no judge. Three cases an independent "
        "judge read differently are worked through in `benchmarks/qp/FINDINGS.md` section 8: "
        "HS268/S268 (such a kink; dxopt's gradient is the closed form -P^{-1} w of its piece "
        "to 3e-12, cond(P) = 1.2e6 makes re-solves at 1e-9 err by 4e-5 in a slope), QBEACONF "
        "(x* not unique: two optimal points 3374 apart) and QSHELL (its finite-difference "
        "evidence, not dxopt, took over 240 s; now about 1 minute).",
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
            f"No verdict as x* is not unique: {', '.join(s['nonunique_names']) or 'none'}. "
            f"Backward out of time (forward solved): "
            f"{', '.join(s.get('backward_timeout_names', [])) or 'none'}. "
            f"Refused: {', '.join(s['refused_names']) or 'none'} (of which no derivative exists, "
            f"benchmarks.qp.mm_face: {', '.join(s.get('no_derivative_names', [])) or 'none'}). "
            f"Forward failed: {', '.join(s['failed_names']) or 'none'}.",
        ]  # fmt: skip
    last_label, last = list(payloads.items())[-1]
    before = payloads.get("before") if last_label != "before" else None
    parts += ["", f"### {last_label}: per problem", "", problem_table(last["records"], before)]
    parts += ["", "Plot: `benchmarks/qp/results/maros_meszaros.png`; raw results: "
              "`benchmarks/qp/results/maros_meszaros_<label>.json`."]  # fmt: skip
    return "\n".join(parts)


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
