"""``dxopt bench dfl --suite jair``: the JAIR benchmark's real tasks, dxopt against PyEPO.

Tasks (:mod:`dxopt.dfl.jair`, Mandi et al., JAIR 80 (2024)): the ICON-price knapsack (48 items,
capacity 60, 120 or 180, maximised) and energy-cost-aware scheduling (instances 1-3, a MILP,
minimised). The model is the benchmark's: one ``nn.Linear(8, 1)`` shared by the 48 slots
predicts the slot prices, mapped to the oracle's costs by :meth:`JAIRTask.costs_from_prices`.
Both libraries train the same model (same seed, same batches, same Adam settings) in the same
process: dxopt through its oracles (``KnapsackOracle``; ``MILPOracle`` on HiGHS), PyEPO through
an ``optGrbModel`` written here over the same feasible set (Gurobi at one thread; the pip
licence's size limit of 2000 variables and 2000 constraints holds for the knapsack and the
scheduling instances: 411, 888 and 1545 variables). The losses are those of
:mod:`benchmarks.dfl.methods` and, for PG, I-MLE, AI-MLE, NID, CaVE and FW-FY, of
:mod:`benchmarks.dfl.jair_methods` (NCE there too: both libraries draw which batches call the
oracle from one stream, so their oracle calls are equal). dxopt's MILP runs without HiGHS'
presolve (:func:`fresh_oracle`). The JSON's ``optimum_agreement`` compares both libraries'
optimal objectives on the test days' true costs.

Measured: normalised test regret :math:`\\sum_i |c_i^\\top \\hat w_i - z_i^*| / \\sum_i |z_i^*|`,
seconds per epoch (median after the first), oracle calls per epoch. Targets: for each method
PyEPO has, dxopt's mean regret within PyEPO's seed spread (mean +- max(std, 1e-3)), and dxopt's
epochs at least 3x faster (not for 2S, which calls no oracle in either library).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from benchmarks.dfl.jair_methods import (
    JAIR_METHODS,
    NEW_METHODS,
    PYEPO_NEW,
    dxopt_new_loss,
    nce_loss,
    pyepo_new_loss,
)
from benchmarks.dfl.methods import (
    PYEPO_METHODS,
    Hyper,
    SolveCounter,
    Trainer,
    oracle_method_loss,
    train_lockstep,
)
from benchmarks.dfl.methods import pyepo_loss as methods_pyepo_loss

TASKS = ("knapsack", "scheduling")
METHODS = JAIR_METHODS
#: the methods PyEPO 2.2.7 has (all but QPTL)
PYEPO_HAS = (*PYEPO_METHODS, *PYEPO_NEW)
SPEEDUP_TARGET = 3.0
#: methods not run on a task, and why (written into the JSON's ``skipped``)
SKIPPED = {
    "scheduling": {
        "FW-FY": "up to 50 oracle calls per sample: at about 0.1 s per scheduling MILP (either "
        "library) about 45 minutes per epoch of 550 days and library; run on the knapsack",
    }
}
COLUMNS = ("task", "method", "library", "seed", "regret", "seconds_per_epoch", "oracle_calls")


@dataclass(frozen=True)
class JairInstance:
    """A JAIR task as the shared trainer sees it (the attributes ``Trainer`` reads)."""

    name: str
    task: Any  # dxopt.dfl.JAIRTask with solutions
    x_train: Tensor  # (n, 48, 8)
    c_train: Tensor  # (n, d)
    w_train: Tensor
    z_train: Tensor  # (n, 1)
    minimize: bool

    @property
    def num_vars(self) -> int:
        return int(self.c_train.shape[1])


def load_task(
    name: str, *, seed: int, num_train: int | None, option: int, num_test: int | None = None
) -> JairInstance:
    """The task ``name`` (knapsack of capacity ``option``, scheduling instance ``option``) under
    the protocol's split of ``seed``: its first ``num_train`` training and ``num_test`` test
    days (all by default), their optima from dxopt's oracle (the validation days unused)."""
    import dataclasses

    from dxopt import dfl

    if name == "knapsack":
        task = dfl.jair_knapsack(option, seed=seed)
    elif name == "scheduling":
        task = dfl.jair_scheduling(option, seed=seed)
    else:
        raise ValueError(f"tasks: expected names from {TASKS}, got {name!r}.")
    parts = {}
    for split, n in (("train", num_train), ("test", num_test)):
        d = getattr(task, split)
        d = dataclasses.replace(d, features=d.features[:n], costs=d.costs[:n])
        parts[split] = d.with_solutions(fresh_oracle(task.oracle))
    task = dataclasses.replace(task, **parts)
    tr = task.train
    z = tr.objectives.reshape(-1, 1).float()
    return JairInstance(
        name, task, tr.features, tr.costs, tr.solutions.float(), z, task.oracle.sense == "min"
    )


class PriceModel(nn.Module):
    """``nn.Linear(8, 1)`` on every slot, mapped to the oracle's costs."""

    def __init__(self, task: Any, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(task.train.features.shape[-1], 1)
        self.task = task

    def forward(self, x: Tensor) -> Tensor:
        return self.task.costs_from_prices(self.linear(x).squeeze(-1))


# --------------------------------------------------------------------------------------------
# PyEPO's model of the same feasible set
# --------------------------------------------------------------------------------------------


def pyepo_model(inst: JairInstance) -> Any:
    """An ``optGrbModel`` over the task's feasible set (Gurobi, binary variables)."""
    import gurobipy as gp
    from gurobipy import GRB
    from pyepo.model.grb import optGrbModel

    task = inst.task
    o = task.oracle

    class JairGrbModel(optGrbModel):  # type: ignore[misc]
        def _getModel(self) -> tuple[Any, Any]:
            m = gp.Model("jair_" + inst.name)
            m.Params.Threads = 1  # the suite's protocol: one thread for both libraries
            d = inst.num_vars
            x = {j: m.addVar(vtype=GRB.BINARY, name=f"x{j}") for j in range(d)}
            if inst.name == "knapsack":
                w = np.asarray(o.weights, dtype=float).reshape(-1)
                m.addConstr(gp.quicksum(w[j] * x[j] for j in range(d)) <= float(o.capacity[0]))
                m.modelSense = GRB.MAXIMIZE
            else:
                import scipy.sparse as sp

                A = sp.csr_matrix(o.matrix)
                lo, hi = np.asarray(o.row_lower, float), np.asarray(o.row_upper, float)
                eq, up, down = lo == hi, (lo != hi) & np.isfinite(hi), (lo != hi) & np.isfinite(lo)
                xs = gp.MVar.fromlist(list(x.values()))
                for rows, sense, rhs in ((eq, "=", hi), (up, "<", hi), (down, ">", lo)):
                    if rows.any():
                        m.addMConstr(A[rows], xs, sense, rhs[rows])
                m.modelSense = GRB.MINIMIZE
            return m, x

    return _quiet(JairGrbModel)


def _quiet(fn: Any, *args: Any) -> Any:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args)


def pyepo_optimum(optmodel: Any, c: Tensor) -> tuple[np.ndarray, float]:
    """PyEPO's (Gurobi's) optimal solution and objective of one cost vector."""
    optmodel.setObj(c.double().numpy())
    sol, obj = optmodel.solve()
    return np.asarray(sol), float(obj)


def optimum_agreement(name: str, option: int, *, seed: int, num_test: int | None) -> dict[str, Any]:
    """dxopt's oracle against PyEPO's Gurobi model on the test days' true costs: the largest
    relative difference of their optimal objectives, :math:`\\max_i |z^{dx}_i - z^{pe}_i| /
    \\max(1, |z^{pe}_i|)` (both exact, so it is solver tolerance only)."""
    inst = load_task(name, seed=seed, num_train=1, option=option, num_test=num_test)
    te, optmodel = inst.task.test, pyepo_model(inst)
    z_dx = (te.solutions.double() * te.costs.double()).sum(1)  # float64: no float32 rounding
    z_pe = torch.tensor([pyepo_optimum(optmodel, c)[1] for c in te.costs], dtype=torch.float64)
    rel = (z_dx - z_pe).abs() / z_pe.abs().clamp_min(1.0)
    return {"days": int(z_pe.numel()), "max_rel_diff": float(rel.max())}


# --------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------


def fresh_oracle(oracle: Any) -> Any:
    """A new oracle on the same problem (its own call count and solver state); the MILP
    without HiGHS' presolve (the scheduling MILPs are solved at the root node, where presolving
    every new cost costs more than it saves: about half the time per solve on instance 1)."""
    from dxopt import dfl

    if isinstance(oracle, dfl.MILPOracle):
        return oracle.copy(presolve=False)
    if hasattr(oracle, "copy"):
        return oracle.copy()
    return dfl.KnapsackOracle(oracle.weights, oracle.capacity)


def dxopt_loss(method: str, inst: JairInstance, hp: Hyper, seed: int) -> tuple[Any, Any]:
    """dxopt's ``method`` on the task's oracle (a fresh one: its own call count)."""
    if method == "QPTL":
        layer = qptl_layer(inst, hp)
        return (lambda c_hat, c, w, z: layer.regret_loss(c_hat, c, z)), lambda: layer.cost.forwards
    if method not in METHODS:
        raise ValueError(f"methods: expected names from {METHODS}, got {method!r}.")
    oracle = fresh_oracle(inst.task.oracle)
    if method == "NCE":
        loss = nce_loss("dxopt", oracle, inst, hp, seed, None)
    elif method in NEW_METHODS:
        loss = dxopt_new_loss(method, oracle, inst, hp, seed)
    else:
        loss = oracle_method_loss(method, oracle, inst, hp, seed)
    return loss, lambda: int(oracle.cost.forwards)


def qptl_layer(inst: JairInstance, hp: Hyper) -> Any:
    """QPTL over the LP relaxation of the task's feasible set."""
    from dxopt import dfl

    o, d = inst.task.oracle, inst.num_vars
    box = {"lb": torch.zeros(d), "ub": torch.ones(d), "eps": hp.eps}
    if inst.name == "knapsack":
        G = torch.as_tensor(np.asarray(o.weights, dtype=float).reshape(1, -1))
        h = torch.as_tensor([float(o.capacity[0])], dtype=torch.float64)
        return dfl.QPTL(G=G, h=h, sense="max", **box)
    A = np.asarray(o.matrix.todense() if hasattr(o.matrix, "todense") else o.matrix, dtype=float)
    lo, hi = np.asarray(o.row_lower, dtype=float), np.asarray(o.row_upper, dtype=float)
    eq = lo == hi
    ub_rows = ~eq & np.isfinite(hi)
    return dfl.QPTL(
        A=torch.as_tensor(A[eq]),
        b=torch.as_tensor(hi[eq]),
        G=torch.as_tensor(A[ub_rows]),
        h=torch.as_tensor(hi[ub_rows]),
        **box,
    )


def pyepo_loss(method: str, optmodel: Any, inst: JairInstance, hp: Hyper, seed: int) -> Any:
    """PyEPO's ``method`` (``pyepo.func``) on the ``optGrbModel``; NCE's pool is PyEPO's own
    ``optDataset`` of the training days."""
    if method == "NCE":
        return nce_loss("pyepo", optmodel, inst, hp, seed, _pool_dataset(optmodel, inst))
    if method in NEW_METHODS:
        return pyepo_new_loss(method, optmodel, inst, hp, seed)
    return methods_pyepo_loss(method, optmodel, inst, None, hp, seed)


def _pool_dataset(optmodel: Any, inst: JairInstance) -> Any:
    """PyEPO's ``optDataset`` of the training days (its NCE takes the pool from it; it solves
    the training costs with its own model)."""
    from pyepo.data.dataset import optDataset

    n = inst.x_train.shape[0]
    feats, costs = inst.x_train.reshape(n, -1).numpy(), inst.c_train.double().numpy()
    return _quiet(optDataset, optmodel, feats, costs)


# --------------------------------------------------------------------------------------------
# evaluation and the suite
# --------------------------------------------------------------------------------------------


def normalized_regret(model: nn.Module, task: Any) -> float:
    """:math:`\\sum_i |c_i^\\top \\hat w_i - z_i^*| / \\sum_i |z_i^*|` on the test days, the
    decisions of dxopt's exact oracle under the predicted costs."""
    te = task.test
    with torch.no_grad():
        c_hat = model(te.features).double()
    w_hat = fresh_oracle(task.oracle)(c_hat)
    c = te.costs.double()
    z = te.objectives.double().reshape(-1)
    return float((((w_hat * c).sum(1) - z).abs().sum() / z.abs().sum()).item())


def run_one(
    name: str,
    method: str,
    seed: int,
    *,
    epochs: int,
    num_train: int | None,
    option: int,
    num_test: int | None = None,
    libraries: tuple[str, ...] = ("pyepo", "dxopt"),
) -> list[dict[str, Any]]:
    """Train ``method`` on task ``name`` under ``seed`` for both libraries in lockstep."""
    inst = load_task(name, seed=seed, num_train=num_train, option=option, num_test=num_test)
    hp = Hyper(lambd=10.0) if name == "knapsack" else Hyper(lambd=10.0, batch=32)
    trainers, labels = [], []
    for lib in libraries:
        if lib == "pyepo" and method not in PYEPO_HAS:
            continue
        model = PriceModel(inst.task, seed)
        if lib == "pyepo":
            optmodel = pyepo_model(inst)
            counter = SolveCounter(optmodel)
            loss = pyepo_loss(method, optmodel, inst, hp, seed)
            count = lambda counter=counter: counter.calls  # noqa: E731
        else:
            loss, count = dxopt_loss(method, inst, hp, seed)
        trainers.append(Trainer(model, loss, inst, hp, seed=seed, count_calls=count))  # type: ignore[arg-type]
        labels.append(lib)
    train_lockstep(trainers, epochs)
    rows = []
    for lib, tr in zip(labels, trainers, strict=True):
        rows.append(
            {
                "task": f"{name}-{option}",
                "method": method,
                "library": lib,
                "seed": seed,
                "regret": normalized_regret(tr.model, inst.task),
                "seconds_per_epoch": tr.record.seconds_per_epoch,
                "oracle_calls": tr.record.oracle_calls_per_epoch,
            }
        )
    return rows


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """MET/MISSED per (task, method) that PyEPO has: regret in PyEPO's seed spread, 3x epochs."""
    out = []
    keys = sorted({(r["task"], r["method"]) for r in rows if r["library"] == "pyepo"})
    for task, method in keys:

        def pick(lib: str, col: str, key: tuple[str, str] = (task, method)) -> list[float]:
            return [r[col] for r in rows if (r["task"], r["method"], r["library"]) == (*key, lib)]

        pe, dx = pick("pyepo", "regret"), pick("dxopt", "regret")
        if not dx:
            continue
        spread = max(statistics.pstdev(pe) if len(pe) > 1 else 0.0, 1e-3)
        mp, md = statistics.fmean(pe), statistics.fmean(dx)
        ok = abs(md - mp) <= spread or md < mp
        out.append(
            f"{'MET' if ok else 'MISSED'} regret {task} {method}: dxopt {md:.4f} vs "
            f"PyEPO {mp:.4f} +- {spread:.4f}"
        )
        if method == "2S":  # no oracle: both epochs are the same torch code, no speed target
            continue
        tp = statistics.median(pick("pyepo", "seconds_per_epoch"))
        td = statistics.median(pick("dxopt", "seconds_per_epoch"))
        speed = tp / td if td > 0 else float("inf")
        out.append(
            f"{'MET' if speed >= SPEEDUP_TARGET else 'MISSED'} speed {task} {method}: "
            f"{speed:.2f}x (dxopt {td:.3f} s, PyEPO {tp:.3f} s per epoch)"
        )
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per (task, method, library): mean +- std over the seeds."""
    lines = [
        "| task | method | library | seeds | regret | s/epoch | oracle calls/epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["task"], r["method"], r["library"]) for r in rows})
    for k in keys:
        sel = [r for r in rows if (r["task"], r["method"], r["library"]) == k]
        reg = [r["regret"] for r in sel]
        sd = statistics.pstdev(reg) if len(reg) > 1 else 0.0
        t = statistics.median(r["seconds_per_epoch"] for r in sel)
        calls = statistics.fmean(r["oracle_calls"] for r in sel)
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {len(sel)} | {statistics.fmean(reg):.4f} "
            f"+- {sd:.4f} | {t:.3f} | {calls:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Regret per method and library, one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(len(tasks), 1, figsize=(12, 4 * len(tasks)), squeeze=False)
    for ax, task in zip(axes[:, 0], tasks, strict=True):
        for k, lib in enumerate(("pyepo", "dxopt")):
            ms = [m for m in METHODS if any(r["method"] == m and r["task"] == task for r in rows)]
            vals = [
                [
                    r["regret"]
                    for r in rows
                    if (r["task"], r["method"], r["library"]) == (task, m, lib)
                ]
                for m in ms
            ]
            xs = [i + 0.2 * (2 * k - 1) for i, v in enumerate(vals) if v]
            ax.bar(xs, [statistics.fmean(v) for v in vals if v], width=0.4, label=lib)
            ax.set_xticks(range(len(ms)), ms)
        ax.set_title(task)
        ax.set_ylabel("normalised regret")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_suite(
    *,
    out: Path,
    tasks: tuple[str, ...] = ("knapsack-60", "scheduling-1"),
    methods: tuple[str, ...] = METHODS,
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
    epochs: int = 10,
    num_train: int | None = None,
    num_test: int | None = None,
    quick: bool = False,
) -> dict[str, Any]:
    """Run the suite; write ``jair.json``, ``jair.md`` and ``jair.png`` into ``out``."""
    import os

    load0 = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    agreement: dict[str, Any] = {}
    for spec in tasks:
        name, _, opt = spec.partition("-")
        option = int(opt) if opt else (60 if name == "knapsack" else 1)
        agreement[spec] = optimum_agreement(name, option, seed=seeds[0], num_test=num_test)
        for seed in seeds:
            for method in methods:
                if method in SKIPPED.get(name, {}):
                    continue
                rows += run_one(
                    name,
                    method,
                    seed,
                    epochs=epochs,
                    num_train=num_train,
                    option=option,
                    num_test=num_test,
                )
                # the rows so far, after every run: a long run cut short keeps what it measured
                out.mkdir(parents=True, exist_ok=True)
                (out / "jair_runs.json").write_text(json.dumps({"rows": rows}, indent=1))
    lines = [] if quick else verdicts(rows)
    result = {
        "suite": "jair",
        "columns": list(COLUMNS),
        "rows": rows,
        "verdicts": lines,
        "epochs": epochs,
        "num_train": num_train,
        "num_test": num_test,
        "seeds": list(seeds),
        "quick": quick,
        "optimum_agreement": agreement,
        "skipped": {
            t: {m: why for m, why in SKIPPED.get(t.partition("-")[0], {}).items() if m in methods}
            for t in tasks
        },
        "loadavg": {"start": load0, "end": list(os.getloadavg())},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "jair.json").write_text(json.dumps(result, indent=1))
    (out / "jair.md").write_text(markdown(rows) + "".join(f"\n- {v}" for v in lines) + "\n")
    plot(rows, out / "jair.png")
    for v in lines:
        print(v)
    return result


def main_jair(args: Any) -> dict[str, Any]:
    """``--suite jair`` of ``benchmarks/dfl/run.py``: ``--quick`` runs 1 seed, 2 epochs, 16
    training and test days of each task into a temporary folder, without verdicts."""
    import tempfile

    from benchmarks.common import results_dir, set_threads

    set_threads(args.threads)
    torch.set_num_threads(args.threads)
    methods = tuple(m for m in args.methods or () if m in METHODS) or METHODS
    if args.quick:
        out = args.out or Path(tempfile.mkdtemp(prefix="dfl_jair_quick_"))
        kw = {"seeds": tuple(args.seeds[:1]), "epochs": 2, "num_train": 16, "num_test": 16}
    else:
        out = args.out or results_dir("dfl_jair")
        kw = {
            "seeds": tuple(args.seeds),
            "epochs": args.epochs,
            "num_train": args.num_train,
            "num_test": args.num_test,
        }
    result = run_suite(out=out, tasks=tuple(args.tasks), methods=methods, quick=args.quick, **kw)
    print(f"wrote {out / 'jair.json'}, jair.md, jair.png")
    return result
