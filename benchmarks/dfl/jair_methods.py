"""The JAIR suite's further methods, in dxopt and (where PyEPO 2.2.7 has it) in PyEPO, and the
shared Bernoulli stream that makes the solution-pool methods like for like.

Each method is a loss ``loss(c_hat, c, w, z) -> scalar`` as in :mod:`benchmarks.dfl.methods`:

- ``PG`` (Huang & Gupta, arXiv 2402.03256): the backward perturbation-gradient loss, step
  ``sigma``; PyEPO ``perturbationGradient`` (``two_sides=False``).
- ``I-MLE`` (Niepert, Minervini & Franceschi, NeurIPS 2021) and ``AI-MLE`` (Minervini et al.,
  AAAI 2023): the perturb-and-MAP layer with sum-of-gamma noise (kappa 5, 10 terms), trained on
  the regret of its decision as DBB; PyEPO ``implicitMLE`` / ``adaptiveImplicitMLE`` (their
  noise seeded with the run's seed).
- ``NID`` (Sahoo et al., ICLR 2023): the negative identity, trained on the regret of its
  decision. dxopt's default projects the cost onto the unit sphere; PyEPO's
  ``negativeIdentity`` has no projection, so the suite runs dxopt with ``projection="none"``
  (the same method) and reports it as such.
- ``CaVE`` (Tang & Khalil, CPAIOR 2024): the cone-aligned cosine, no oracle call; the binding
  normals of the true optima are dxopt's :func:`dxopt.dfl.binding_normals` for both libraries
  (the same ``tight_ctrs``). dxopt projects exactly (NNLS); PyEPO's default ``max_iter=3`` is
  its truncated CaVE+, so PyEPO runs with ``max_iter=CAVE_ITERATIONS`` (a converged Clarabel
  projection, the same method).
- ``FW-FY`` (Dalle et al., arXiv 2207.13513; Blondel et al., JMLR 2020): the Fenchel-Young loss
  of the quadratically regularised layer by Frank-Wolfe (one oracle call per iteration); PyEPO
  ``regularizedFrankWolfeFenchelYoung``. Both stop at ``FW_ITERATIONS`` iterations (dxopt:
  Wolfe's minimum-norm point with its relative gap ``tol``; PyEPO: away-step Frank-Wolfe with
  its absolute gap ``tol``), so the oracle calls per sample are not the same.

:class:`BernoulliStream` replaces both libraries' draw "solve this batch or answer from the
pool": PyEPO's ``optModule`` calls ``_branch_rng.uniform() <= solve_ratio`` once per batch,
dxopt's :class:`~dxopt.dfl.pool.PoolSolver` ``rng.uniform() < solve_ratio`` once per batch, so
with the same stream both solve the same batches (equal oracle calls) - without it PyEPO draws
from an unseeded ``RandomState`` and dxopt from ``default_rng(seed)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from benchmarks.dfl.methods import Hyper, regret_loss

NEW_METHODS = ("PG", "I-MLE", "AI-MLE", "NID", "CaVE", "FW-FY")
#: every method of the JAIR suite
JAIR_METHODS = ("2S", "SPO+", "DBB", "PFYL", "NCE", "QPTL", *NEW_METHODS)
#: the methods PyEPO 2.2.7 has among the new ones (all of them)
PYEPO_NEW = NEW_METHODS
CAVE_ITERATIONS = 50
FW_ITERATIONS = 50
FW_LAMBDA = 1.0
PG_STEP = 0.1  # both libraries' default step h

Loss = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class BernoulliStream:
    """``uniform()`` returns the next draw of ``numpy.random.default_rng(seed).uniform()``: a
    stand-in for the generator of both libraries' per-batch solve-or-cache decision."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def uniform(self) -> float:
        return float(self._rng.uniform())


def feasible_set(inst: Any) -> dict[str, Any]:
    """The task's feasible set as :func:`dxopt.dfl.binding_normals` reads it (``G x <= h``,
    ``A x = b``, ``0 <= x <= 1``)."""
    o, d = inst.task.oracle, inst.num_vars
    if inst.name == "knapsack":
        G = np.asarray(o.weights, dtype=float).reshape(1, -1)
        h = np.asarray([float(np.asarray(o.capacity).reshape(-1)[0])])
        return {"G": G, "h": h, "lb": np.zeros(d), "ub": np.ones(d)}
    M = o.matrix.toarray() if hasattr(o.matrix, "toarray") else np.asarray(o.matrix, float)
    lo, hi = np.asarray(o.row_lower, dtype=float), np.asarray(o.row_upper, dtype=float)
    eq = lo == hi
    up, down = ~eq & np.isfinite(hi), ~eq & np.isfinite(lo)
    G = np.vstack([M[up], -M[down]])
    h = np.concatenate([hi[up], -lo[down]])
    return {"A": M[eq], "b": hi[eq], "G": G, "h": h, "lb": np.zeros(d), "ub": np.ones(d)}


class TightConstraints:
    """The binding normals of every training optimum, computed once (outside the timed epochs)
    and looked up by the solution's bytes inside the loss (equal solutions, equal normals)."""

    def __init__(self, inst: Any) -> None:
        from dxopt import dfl

        kw = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in feasible_set(inst).items()}
        w = inst.w_train.double()
        self.normals = dfl.binding_normals(w, **kw)
        self._index = {w[i].numpy().tobytes(): i for i in range(w.shape[0])}

    def __call__(self, w: Tensor, like: Tensor) -> Tensor:
        rows = w.detach().to(torch.float64).numpy()  # one conversion, then the rows' bytes
        idx = [self._index[row.tobytes()] for row in rows]
        return self.normals[idx].to(like.dtype)


def dxopt_new_loss(method: str, oracle: Any, inst: Any, hp: Hyper, seed: int) -> Loss:
    """dxopt's ``method`` (one of :data:`NEW_METHODS`) on ``oracle``."""
    from dxopt import dfl

    minimize = inst.minimize
    if method == "PG":
        pg = dfl.PG(oracle, sigma=PG_STEP)
        return lambda c_hat, c, w, z: pg(c_hat, c)
    if method in ("I-MLE", "AI-MLE"):
        cls = dfl.IMLE if method == "I-MLE" else dfl.AIMLE
        kw = {"lambd": hp.lambd} if method == "I-MLE" else {}
        layer = cls(oracle, n_samples=hp.n_samples, sigma=hp.sigma, seed=seed, **kw)
        return lambda c_hat, c, w, z: regret_loss(layer(c_hat), c, z, minimize)
    if method == "NID":
        nid = dfl.NID(oracle, projection="none")
        return lambda c_hat, c, w, z: regret_loss(nid(c_hat), c, z, minimize)
    if method == "CaVE":
        cave, tight = dfl.CaVE(oracle), TightConstraints(inst)
        return lambda c_hat, c, w, z: cave(c_hat, tight(w, c_hat))
    if method == "FW-FY":
        fy = dfl.FrankWolfeFenchelYoung(
            oracle, lambd=FW_LAMBDA, max_iter=FW_ITERATIONS, tol=1e-6, on_failure="ignore"
        )
        return lambda c_hat, c, w, z: fy(c_hat, w)
    raise ValueError(f"method: expected one of {NEW_METHODS}, got {method!r}.")


def pyepo_new_loss(method: str, optmodel: Any, inst: Any, hp: Hyper, seed: int) -> Loss:
    """PyEPO's counterpart of ``method`` (``pyepo.func``) on the ``optGrbModel``."""
    import pyepo
    from pyepo.func.utils import sumGammaDistribution

    minimize = inst.minimize
    if method == "PG":
        pg = pyepo.func.perturbationGradient(optmodel, sigma=PG_STEP, two_sides=False)
        return lambda c_hat, c, w, z: pg(c_hat, c)
    if method in ("I-MLE", "AI-MLE"):
        noise = sumGammaDistribution(kappa=5, n_iterations=10, seed=seed)
        if method == "I-MLE":
            layer = pyepo.func.implicitMLE(
                optmodel, n_samples=hp.n_samples, sigma=hp.sigma, lambd=hp.lambd,
                distribution=noise,
            )  # fmt: skip
        else:
            layer = pyepo.func.adaptiveImplicitMLE(
                optmodel, n_samples=hp.n_samples, sigma=hp.sigma, distribution=noise
            )
        return lambda c_hat, c, w, z: regret_loss(layer(c_hat), c, z, minimize)
    if method == "NID":
        nid = pyepo.func.negativeIdentity(optmodel)
        return lambda c_hat, c, w, z: regret_loss(nid(c_hat), c, z, minimize)
    if method == "CaVE":
        cave = pyepo.func.coneAlignedCosine(optmodel, max_iter=CAVE_ITERATIONS)
        tight = TightConstraints(inst)
        return lambda c_hat, c, w, z: cave(c_hat, tight(w, c_hat))
    if method == "FW-FY":
        fy = pyepo.func.regularizedFrankWolfeFenchelYoung(
            optmodel, lambd=FW_LAMBDA, max_iter=FW_ITERATIONS, tol=1e-6
        )
        return lambda c_hat, c, w, z: fy(c_hat, w)
    raise ValueError(f"method: PyEPO's new methods are {PYEPO_NEW}, got {method!r}.")


def nce_loss(library: str, solver: Any, inst: Any, hp: Hyper, seed: int, train_ds: Any) -> Loss:
    """NCE (Mulamba et al., IJCAI 2021) of ``library`` on ``solver`` (PyEPO: the
    ``optGrbModel``, its pool from ``train_ds``; dxopt: the oracle, its pool the training
    optima), both drawing "solve this batch" from :class:`BernoulliStream` ``(seed)``: the same
    batches are solved, so the oracle calls are equal."""
    if library == "pyepo":
        import pyepo

        nce = pyepo.func.NCE(solver, processes=1, solve_ratio=hp.solve_ratio, dataset=train_ds)
        nce._branch_rng = BernoulliStream(seed)
    else:
        from dxopt import dfl

        pool = dfl.SolutionPool(inst.w_train, sense=solver.sense)
        nce = dfl.NCE(solver, pool, solve_ratio=hp.solve_ratio, seed=seed)
        nce.solver.rng = BernoulliStream(seed)
    return lambda c_hat, c, w, z: nce(c_hat, w)
