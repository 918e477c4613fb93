"""DFL benchmark: dxopt.dfl against PyEPO on the PyEPO paper's shortest path and knapsack table.

Run with ``dxopt bench dfl`` (or ``python -m benchmarks.dfl.run``); it needs the ``bench``
extra (``pyepo`` and its solver, ``gurobipy``, whose pip licence covers these sizes). Methods,
libraries and seeds run one after another in one process with one torch thread. ``--quick`` is
a smoke run (under a minute) that writes to a temporary folder and leaves ``results/`` and
``BENCHMARKS.md`` alone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.common import (
    SMOKE_NOTE,
    machine_info,
    machine_line,
    positive_int,
    results_dir,
    set_threads,
    smoke_verdicts,
    update_benchmarks_md,
    write_json,
)
from benchmarks.dfl.data import PROBLEMS, Instance, make_instance, pyepo_backend
from benchmarks.dfl.jair_methods import JAIR_METHODS
from benchmarks.dfl.methods import (
    HYPER,
    LIBRARIES,
    METHODS,
    PYEPO_METHODS,
    SolveCounter,
    Trainer,
    dxopt_loss,
    linear_model,
    pyepo_loss,
    train_lockstep,
)
from benchmarks.dfl.report import (
    regret_rows,
    section_markdown,
    speed_rows,
    targets,
    write_plots,
)

COMMAND = "dxopt bench dfl"


def judge_regret(model: torch.nn.Module, optmodel: Any, test_ds: Any) -> float:
    """PyEPO's normalised regret of ``model`` on the test set (the one judge of both sides)."""
    import pyepo
    from torch.utils.data import DataLoader

    loader = DataLoader(test_ds, batch_size=len(test_ds))
    with contextlib.redirect_stderr(io.StringIO()):
        return float(pyepo.metric.regret(model, optmodel, loader))


def run_method(
    inst: Instance,
    optmodel: Any,
    train_ds: Any,
    test_ds: Any,
    *,
    method: str,
    libraries: list[str],
    epochs: int,
) -> list[dict[str, Any]]:
    """Train one model per library with its ``method``, epochs interleaved, and measure them."""
    hp = HYPER[inst.problem][method]
    seed = inst.seed
    trainers: dict[str, Trainer] = {}
    counter: SolveCounter | None = None
    for library in libraries:
        model = linear_model(inst, seed)
        if library == "pyepo":
            if method not in PYEPO_METHODS:
                continue  # PyEPO has no QPTL
            pe_counter = counter = SolveCounter(optmodel)
            loss = pyepo_loss(method, optmodel, inst, train_ds, hp, seed)
            trainers[library] = Trainer(
                model, loss, inst, hp, seed=seed, count_calls=lambda c=pe_counter: c.calls
            )
        else:
            loss, count = dxopt_loss(method, inst, hp, seed)
            trainers[library] = Trainer(model, loss, inst, hp, seed=seed, count_calls=count)
    from dxopt.qp import QPDegenerateWarning

    # Degenerate QPs are the rule in DFL (QPTL): count dxopt.qp's warnings instead of printing.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", QPDegenerateWarning)
        train_lockstep(list(trainers.values()), epochs)
    degenerate = sum(issubclass(w.category, QPDegenerateWarning) for w in caught)
    if counter is not None:
        del optmodel.solve  # back to the class's method
    rows = []
    for library, trainer in trainers.items():
        record = trainer.record
        rows.append(
            {
                "problem": inst.problem,
                "deg": inst.deg,
                "seed": seed,
                "method": method,
                "library": library,
                "regret": judge_regret(trainer.model, optmodel, test_ds),
                "s_per_epoch": record.seconds_per_epoch,
                "first_epoch_s": record.epoch_seconds[0],
                "calls_per_epoch": record.oracle_calls_per_epoch,
                "epoch_seconds": record.epoch_seconds,
                "train_loss": record.losses,
                "degenerate_warnings": degenerate if library == "dxopt" else 0,
            }
        )
    return rows


def run_config(
    problem: str,
    deg: int,
    seed: int,
    *,
    methods: list[str],
    libraries: list[str],
    epochs: int,
    num_train: int,
    num_test: int,
    bar: Any,
) -> list[dict[str, Any]]:
    """Every method on the data set ``(problem, deg, seed)``."""
    import pyepo

    inst, optmodel, train_ds = make_instance(
        problem, deg, seed, num_train=num_train, num_test=num_test
    )
    with contextlib.redirect_stderr(io.StringIO()):
        test_ds = pyepo.data.dataset.optDataset(optmodel, inst.x_test, inst.c_test)
    runs: list[dict[str, Any]] = []
    for method in methods:
        runs += run_method(
            inst, optmodel, train_ds, test_ds, method=method, libraries=libraries, epochs=epochs
        )
        bar.update()
    return runs


def merge_runs(saved: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of several records, each tagged with the commit its process started from; a
    later record's run replaces an earlier one of the same (problem, deg, seed, method,
    library), so a method rerun on new code is one code version. ``record`` is the index of
    the run's record (its process), so that a method is compared with the two-stage control
    of its own process only."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for record, part in enumerate(saved):
        for run in part["runs"]:
            commit = run.get("commit") or part["machine"].get("commit", "")
            run = {**run, "commit": commit, "record": record}
            key = tuple(run[k] for k in ("problem", "deg", "seed", "method", "library"))
            merged.pop(key, None)  # the replacement goes to the end, in its record's order
            merged[key] = run
    return list(merged.values())


def provenance_note(runs: list[dict[str, Any]]) -> str:
    """Which commit each (method, seeds) group of the runs ran on."""
    groups: dict[str, dict[str, set[int]]] = {}
    for r in runs:
        commit = r.get("commit") or "unknown"
        groups.setdefault(commit, {}).setdefault(r["method"], set()).add(r["seed"])
    parts = []
    for commit, by_method in groups.items():
        by_seeds: dict[tuple[int, ...], list[str]] = {}
        for method, seeds in by_method.items():
            by_seeds.setdefault(tuple(sorted(seeds)), []).append(method)
        cells = "; ".join(
            f"{', '.join(methods)} seeds {' '.join(map(str, seeds))}"
            for seeds, methods in by_seeds.items()
        )
        parts.append(f"commit {commit}: {cells}")
    return "Code versions (the commit each process started from): " + " | ".join(parts) + "."


def coverage_note(runs: list[dict[str, Any]]) -> str | None:
    """Which seeds each (problem, deg, method) has, when that is not every seed (a record cut
    short at a data set); ``None`` when every combination has every seed."""
    seeds = sorted({r["seed"] for r in runs})
    have: dict[tuple[str, int, str], set[int]] = {}
    for r in runs:
        have.setdefault((r["problem"], r["deg"], r["method"]), set()).add(r["seed"])
    short: dict[tuple[int, ...], list[str]] = {}
    for (problem, deg, method), got in have.items():
        if len(got) < len(seeds):
            short.setdefault(tuple(sorted(got)), []).append(f"{problem} {method} deg {deg}")
    if not short:
        return None
    cells = "; ".join(
        f"{', '.join(names)}: seeds {' '.join(map(str, got))}" for got, names in short.items()
    )
    return f"Not every row has all of seeds {' '.join(map(str, seeds))}: {cells}."


def _loadavg() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run into a temporary folder")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds, space separated"
    )
    parser.add_argument(
        "--degs",
        type=int,
        nargs="+",
        default=[1, 2, 4, 6],
        help="polynomial degrees, space separated",
    )
    parser.add_argument("--epochs", type=int, default=10, help="training epochs per run")
    parser.add_argument(
        "--problems",
        nargs="+",
        default=list(PROBLEMS),
        choices=PROBLEMS,
        help="problems: sp (shortest path 5x5), ks (2-D knapsack)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        choices=sorted(set(METHODS) | set(JAIR_METHODS)),
        help=f"methods, space separated (main: {' '.join(METHODS)}; --suite jair also "
        f"{' '.join(m for m in JAIR_METHODS if m not in METHODS)})",
    )
    parser.add_argument(
        "--libraries",
        nargs="+",
        default=list(LIBRARIES),
        choices=LIBRARIES,
        help="libraries, space separated",
    )
    parser.add_argument("--num-train", type=int, default=1000, help="training samples")
    parser.add_argument("--num-test", type=int, default=1000, help="test samples")
    parser.add_argument("--out", type=Path, default=None, help="output folder override")
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch intra-op threads (>= 1)"
    )
    parser.add_argument(
        "--from-runs",
        type=Path,
        nargs="+",
        default=None,
        help="rebuild the report from runs' dfl_runs.json (written after every data set); "
        "several files are merged (seeds run in separate processes)",
    )
    parser.add_argument(
        "--notes", nargs="+", default=[], help="extra lines for the report's notes, space separated"
    )
    parser.add_argument(
        "--suite", choices=("main", "jair"), default="main",
        help="main: PyEPO's generated data; jair: the JAIR benchmark's knapsack and scheduling",
    )  # fmt: skip
    parser.add_argument(
        "--tasks", nargs="+", default=["knapsack-60", "scheduling-1"],
        help="--suite jair tasks: knapsack-<capacity>, scheduling-<instance>, space separated",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.suite == "main":
        unknown = [m for m in args.methods or () if m not in METHODS]
        if unknown:
            parser.error(f"--methods: {unknown} run in --suite jair only; main has {METHODS}")
        args.methods = args.methods or list(METHODS)
    if args.suite == "jair":
        from benchmarks.dfl.jair_suite import main_jair

        return main_jair(args)
    try:
        import pyepo
    except ImportError as err:
        raise SystemExit(
            f"{COMMAND}: needs PyEPO ({err}); install the bench extra: pip install -e '.[bench]'"
        ) from None
    set_threads(args.threads)
    torch.set_num_threads(args.threads)
    if args.quick:
        out = args.out or Path(tempfile.mkdtemp(prefix="dfl_quick_"))
        seeds, degs, epochs = args.seeds[:1], [max(args.degs)], 3
        num_train, num_test = 100, 100
    else:
        out = args.out or results_dir("dfl")
        seeds, degs, epochs = args.seeds, args.degs, args.epochs
        num_train, num_test = args.num_train, args.num_test
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "dfl_runs.json"
    if args.from_runs:
        # rebuild the report from the records of one or more (possibly cut short) runs
        saved = [json.loads(path.read_text()) for path in args.from_runs]
        info, runs = saved[-1]["machine"], merge_runs(saved)
        load_start, load_end = saved[0]["load_start"], saved[-1]["load_now"]
        walls = [part["wall_s"] for part in saved]
        wall = max(walls)  # records of processes that ran side by side: the longest
        epochs, num_train, num_test = (saved[0][k] for k in ("epochs", "num_train", "num_test"))
        for part in saved[1:]:
            if (part["epochs"], part["num_train"], part["num_test"]) != (
                epochs,
                num_train,
                num_test,
            ):
                raise SystemExit("--from-runs: the records have different settings.")
    else:
        walls = []
        info = machine_info()  # the commit the run started from
        load_start, t_start = _loadavg(), time.perf_counter()
        runs = []
        # seeds outermost: a run cut short still holds whole seeds of every (problem, deg)
        configs = [(p, d, s) for s in seeds for p in args.problems for d in degs]
        bar = tqdm(total=len(configs) * len(args.methods), desc="dfl", unit="method")
        for problem, deg, seed in configs:
            runs += run_config(
                problem,
                deg,
                seed,
                methods=args.methods,
                libraries=args.libraries,
                epochs=epochs,
                num_train=num_train,
                num_test=num_test,
                bar=bar,
            )
            for r in runs:
                r.setdefault("commit", info["commit"])
            write_json(
                partial,
                {
                    "machine": info,
                    "epochs": epochs,
                    "num_train": num_train,
                    "num_test": num_test,
                    "load_start": load_start,
                    "load_now": _loadavg(),
                    "wall_s": time.perf_counter() - t_start,
                    "runs": runs,
                },
            )
        bar.close()
        wall = time.perf_counter() - t_start
        load_end = _loadavg()
    seeds = sorted({r["seed"] for r in runs})
    degs = sorted({r["deg"] for r in runs})
    problems = list(dict.fromkeys(r["problem"] for r in runs))
    methods = list(dict.fromkeys(r["method"] for r in runs))
    regrets, speeds = regret_rows(runs), speed_rows(runs)
    checks = targets(regrets, speeds)
    if args.quick:  # a smoke budget measures no target: no verdicts
        regrets = smoke_verdicts(regrets, "within spread")
        speeds = smoke_verdicts(speeds, "target >= 3x")
        checks = {}
    settings = {
        "seeds": " ".join(map(str, seeds)),
        "degs": " ".join(map(str, degs)),
        "epochs": epochs,
        "train/test": f"{num_train}/{num_test}",
        "PyEPO backend": f"{pyepo_backend()} (PyEPO {pyepo.__version__})",
        "hyper-parameters": "; ".join(
            f"{p} {m}: lr {h.lr}, batch {h.batch}"
            + {
                "DBB": f", lambda {h.lambd}",
                "PFYL": f", {h.n_samples} sample(s), sigma {h.sigma}",
                "NCE": f", solve ratio {h.solve_ratio}",
                "QPTL": f", eps {h.eps}",
            }.get(m, "")
            for p in problems
            for m, h in HYPER[p].items()
            if m in methods
        ),
    }
    notes = [
        *([SMOKE_NOTE] if args.quick else []),
        f"Load average (1, 5, 15 min) at start {load_start}, at end {load_end}; wall time "
        f"{wall / 60:.1f} min"
        + (
            f" (the longest of the merged records: {', '.join(f'{w / 60:.1f}' for w in walls)})"
            if len(walls) > 1
            else ""
        )
        + f"; torch threads {torch.get_num_threads()}.",
        "s/epoch is the median over the epochs after the first (the first pays JIT compiles); "
        "speed-up is the median of the paired (same deg, seed) ratios PyEPO / dxopt; the two "
        "libraries' epochs run interleaved, so load changes reach both.",
        "PyEPO has no QPTL: its row compares dxopt's QPTL with the other methods only. "
        "Two-stage (2S) is the same PyTorch loop in both columns (no oracle), a timing control.",
        provenance_note(runs),
        *[note for note in (coverage_note(runs),) if note],
        *args.notes,
    ]
    payload = {
        "machine": info,
        "command": COMMAND,
        "settings": settings,
        "load_average": {"start": load_start, "end": load_end},
        "wall_s": wall,
        "regret": [{k: v for k, v in r.items() if not k.startswith("_")} for r in regrets],
        "speed": [{k: v for k, v in r.items() if not k.startswith("_")} for r in speeds],
        "targets": checks,
        "runs": runs,
    }
    write_json(out / "dfl.json", payload)
    plots = write_plots(runs, out)
    section = section_markdown(
        command=COMMAND,
        machine=machine_line(info),
        settings=settings,
        regrets=regrets,
        speeds=speeds,
        checks=checks,
        plots=[p.name for p in plots],
        notes=notes,
    )
    (out / "dfl.md").write_text(section)
    if not args.quick and args.out is None:
        update_benchmarks_md("dfl", section)
    print(section)
    payload["out"] = str(out)
    return payload


if __name__ == "__main__":
    main()
