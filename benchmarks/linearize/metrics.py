"""Task-arithmetic metrics (Ilharco et al. 2212.04089; Ortiz-Jimenez et al. 2305.12827).

- single-task accuracy of :math:`\\theta_0+\\tau_t` on task t;
- addition: :math:`\\theta_0+\\alpha\\sum_t\\tau_t` with one :math:`\\alpha` from a grid on
  [0, 1], chosen by the mean normalised validation accuracy
  :math:`\\mathrm{acc}_t(\\text{merged})/\\mathrm{acc}_t(\\theta_0+\\tau_t)`; reported on test
  as absolute and normalised accuracy;
- negation: per task :math:`\\theta_0-\\alpha\\tau_t`, :math:`\\alpha` minimising the target
  validation accuracy subject to control validation accuracy
  :math:`\\ge 0.95\\times` the pretrained one; reported on test;
- weight disentanglement error :math:`\\xi(\\alpha_1,\\alpha_2)=\\sum_{t=1,2}
  \\mathbb{E}_{x\\sim\\mu_t}[\\hat y(x;\\theta_0+\\alpha_t\\tau_t)\\ne\\hat y(x;\\theta_0+
  \\alpha_1\\tau_1+\\alpha_2\\tau_2)]` (prediction disagreement), averaged over a grid of
  :math:`(\\alpha_1,\\alpha_2)` and over all task pairs.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

import torch

from benchmarks.linearize.methods import Editor
from benchmarks.linearize.tasks import CONTROL, TASKS
from dxopt.linearize import TaskVector


@dataclass(frozen=True)
class Grids:
    addition: tuple[float, ...] = tuple(i / 20 for i in range(21))
    negation: tuple[float, ...] = tuple(i / 10 for i in range(11))
    disentangle: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    disentangle_examples: int = 200


QUICK_GRIDS = Grids(
    addition=(0.0, 0.5, 1.0), negation=(0.0, 1.0), disentangle=(0.5, 1.0), disentangle_examples=40
)


def evaluate(editor: Editor, taus: dict[str, TaskVector], grids: Grids) -> dict:
    suite = editor.suite
    single_val = {t: editor.accuracy(taus[t], 1.0, t, "val") for t in TASKS}
    single_test = {t: editor.accuracy(taus[t], 1.0, t, "test") for t in TASKS}
    zero_shot = {t: editor.accuracy(None, 0.0, t, "test") for t in TASKS}

    # Addition.
    total = sum(taus[t] for t in TASKS)
    assert isinstance(total, TaskVector)
    curve = []
    for a in grids.addition:
        accs = [editor.accuracy(total, a, t, "val") for t in TASKS]
        curve.append(statistics.fmean(x / max(single_val[t], 1e-12) for x, t in zip(accs, TASKS)))
    best = max(range(len(curve)), key=lambda i: curve[i])
    a_add = grids.addition[best]
    add_test = {t: editor.accuracy(total, a_add, t, "test") for t in TASKS}

    # Negation.
    ctrl0 = editor.accuracy(None, 0.0, CONTROL, "val")
    negation = {}
    for t in TASKS:
        feasible = []
        for a in grids.negation:
            ctrl = editor.accuracy(taus[t], -a, CONTROL, "val")
            if ctrl >= 0.95 * ctrl0:
                feasible.append((editor.accuracy(taus[t], -a, t, "val"), a))
        a_neg = min(feasible)[1] if feasible else 0.0
        negation[t] = {
            "alpha": a_neg,
            "target": editor.accuracy(taus[t], -a_neg, t, "test"),
            "control": editor.accuracy(taus[t], -a_neg, CONTROL, "test"),
        }

    # Weight disentanglement.
    n = grids.disentangle_examples
    xs = {t: suite.data[t]["test"].x[:n] for t in TASKS}
    single_pred = {
        (t, a): editor.predictions(taus[t], a, t, xs[t]) for t in TASKS for a in grids.disentangle
    }
    xi_pairs = {}
    for t1, t2 in itertools.combinations(TASKS, 2):
        grid = torch.zeros(len(grids.disentangle), len(grids.disentangle))
        for (i, a1), (j, a2) in itertools.product(enumerate(grids.disentangle), repeat=2):
            merged = a1 * taus[t1] + a2 * taus[t2]
            err = 0.0
            for t, a in ((t1, a1), (t2, a2)):
                pred = editor.predictions(merged, 1.0, t, xs[t])
                err += float((pred != single_pred[(t, a)]).float().mean())
            grid[i, j] = err
        xi_pairs[f"{t1}+{t2}"] = grid.tolist()
    xi = statistics.fmean(float(torch.tensor(g).mean()) for g in xi_pairs.values())

    return {
        "zero_shot": zero_shot,
        "single": single_test,
        "single_mean": statistics.fmean(single_test.values()),
        "addition": {
            "alpha": a_add,
            "val_curve": curve,
            "test": add_test,
            "absolute": statistics.fmean(add_test.values()),
            "normalized": statistics.fmean(add_test[t] / max(single_test[t], 1e-12) for t in TASKS),
        },
        "negation": negation,
        "negation_target": statistics.fmean(v["target"] for v in negation.values()),
        "negation_control": statistics.fmean(v["control"] for v in negation.values()),
        "control_pretrained": editor.accuracy(None, 0.0, CONTROL, "test"),
        "xi": xi,
        "xi_pairs": xi_pairs,
    }
