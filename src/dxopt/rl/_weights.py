r"""Attempt weights for a multi-attempt policy gradient: vanilla GRPO, naive, calibrated (CAL).

Notation (see :mod:`dxopt.rl._rollout`): group of :math:`N` rollouts of one prompt, attempt
score :math:`s_{i,k} = \nabla_\theta \log\pi_\theta(y_{i,k}\mid h_{i,k-1})` (the sum of the
attempt's token scores), :math:`\mathcal G_k = \{j : L_j \ge k\}` the rollouts that reached
attempt :math:`k`. Every method returns weights :math:`w_{i,k}` (zero for attempts not made) and
the estimate is

.. math:: \hat g = \frac1N \sum_{i=1}^N \sum_{k=1}^{L_i} w_{i,k}\, s_{i,k},

the gradient of :func:`~dxopt.rl.surrogate_loss` (with a minus sign: the loss is minimised).

**Objective.** :math:`J(\theta) = P_\theta(R=1)` (Verification@K). Feedback and verifier do not
depend on :math:`\theta` given the answers, so the likelihood ratio gives
:math:`\nabla J = E[\sum_{k\le L} s_k R]`.

**Methods.**

- ``"grpo"`` (vanilla GRPO on the trajectory reward): :math:`w_{i,k} = R_i - b_i` on every
  attempt, :math:`b_i` a baseline over the whole group.
- ``"naive"`` (each attempt weighted by its own pass/fail): :math:`w_{i,k} = r_{i,k} - b_{i,k}`,
  :math:`b_{i,k}` a baseline of :math:`r_{j,k}` over :math:`j\in\mathcal G_k`.
- ``"cal"`` (calibrated attempt level): :math:`w_{i,k} = R_i - b_{i,k}`, :math:`b_{i,k}` a
  baseline of :math:`R_j` over :math:`j\in\mathcal G_k`, and the sum divided by :math:`N`, not by
  :math:`n_k = |\mathcal G_k|`. A failed attempt :math:`k < L_i` gets the credit of the later
  success (:math:`r_{i,k} = 0` but :math:`R_i` may be 1), compared with the rollouts that were in
  the same position (reached attempt :math:`k`).

Baselines (``baseline=``): ``"loo"`` the leave-one-out mean over the other members,
``"mean"`` the mean including :math:`i` (GRPO's), ``"none"`` zero. An attempt that no other
rollout of its group reached (a *singleton*, :math:`n_k = 1`) has no attempt-level baseline;
``singleton=`` picks what it gets: ``"trajectory"`` (default) the same statistic over the
whole group (for ``"cal"``: the trajectory-level leave-one-out mean of :math:`R_j`),
``"keep"`` baseline 0, ``"zero"`` weight 0. For ``"cal"``, ``mix=β`` blends the two
baselines, :math:`b_{i,k} = \beta b^{\text{attempt}}_{i,k} + (1-\beta) b^{\text{traj}}_i`
(``β = 1``: CAL, ``β = 0``: GRPO), still a function of the other rollouts only.
``normalize_std=True`` divides by the members' standard deviation plus ``eps`` (GRPO's
scaling).

**Theorem (unbiasedness).** For ``"grpo"`` and ``"cal"`` with ``baseline="loo"`` or
``"none"``, ``normalize_std=False``, ``singleton="trajectory"`` or ``"keep"`` and any
``mix`` fixed before the batch is drawn,
:math:`E[\hat g] = \nabla J` for every :math:`N \ge 1`.

*Proof.* Every attempt before :math:`L_i` failed, so the reward-to-go of attempt :math:`k` is
:math:`R_i`, and :math:`E[\sum_i\sum_{k\le L_i} s_{i,k}R_i] = N\nabla J`. It remains to show
that each baseline term vanishes in expectation. :math:`b_{i,k}` is a function of the
rollouts :math:`j\ne i` only (which ones reached :math:`k` and their :math:`R_j`, with the
fallback when none did), hence independent of rollout :math:`i`; the event
:math:`\{L_i\ge k\}` is decided by the history :math:`h_{i,k-1}`; and
:math:`E[s_{i,k}\mid h_{i,k-1}] = \sum_y \nabla\pi(y\mid h) = 0`.
So :math:`E[1\{L_i\ge k\}\, b_{i,k}\, s_{i,k}] = E[b_{i,k}]\,
E[1\{L_i\ge k\}\,E[s_{i,k}\mid h_{i,k-1}]] = 0`. Dividing by :math:`N` gives
:math:`\nabla J`. :math:`\square`

What is *not* unbiased, and why (each is checked by exact enumeration in the tests):

- ``"naive"`` with a leave-one-out or no baseline has mean
  :math:`E[\sum_k 1\{L\ge k\} r_k s_k]`, which misses
  :math:`E[\sum_k 1\{L\ge k\}(1-r_k) V_{k+1}(h_k) s_k]`, the credit a failed attempt earns
  by making a later success likelier (:math:`V_{k+1}(h_k)` = success probability of the
  remaining attempts). It can point the wrong way. (With ``"mean"`` it is biased further.)
- ``baseline="mean"`` includes :math:`i`: for ``"grpo"`` this multiplies the mean by exactly
  :math:`(N-1)/N`; for attempt-level methods the factor :math:`(n_k-1)/n_k` is random and
  correlated with the history, a bias.
- ``singleton="zero"`` (drop attempts reached by one rollout only, which the paper reportedly
  does, assuming :math:`n_k\ge 2`): the singleton event depends on the other rollouts only,
  so it removes :math:`\sum_k P(\text{no } j\ne i \text{ reaches } k)\,
  E[1\{L\ge k\} R\, s_k] \ne 0` in general.
- ``normalize_std=True``: the divisor depends on :math:`i`'s reward; with population
  statistics the trajectory version ascends :math:`2\arcsin\sqrt{J}` per prompt, not
  :math:`J`.

Reference: Ildiz, Gozeten, Taga, Oymak, "Learning to Correct: Calibrated Reinforcement
Learning for Multi-Attempt Chain-of-Thought", arXiv 2604.17912. Only its abstract could be
read: ``"cal"`` is a reconstruction from the abstract and secondary descriptions (attempt-level
leave-one-out credit among the rollouts that reached the attempt, divided by the group size),
derived and proved here, not copied from the paper. GRPO: Shao et al., arXiv 2402.03300.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from dxopt._core import check_choice, check_positive
from dxopt.rl._errors import RLTypeError, RLValueError, rl_input_errors
from dxopt.rl._rollout import MultiAttemptRollout

Method = Literal["grpo", "naive", "cal"]
Baseline = Literal["loo", "mean", "none"]
Singleton = Literal["trajectory", "keep", "zero"]

METHODS: tuple[str, ...] = ("grpo", "naive", "cal")
_BASELINES = ("loo", "mean", "none")
_SINGLETONS = ("trajectory", "keep", "zero")


@dataclass(frozen=True)
class AttemptWeights:
    """Weights :math:`w_{i,k}` of each attempt's log-probability, and how they were made.

    Attributes:
        weights: ``(G, N, K)`` detached weights, 0 for attempts not made.
        attempted: ``(G, N, K)`` bool, the attempts that were made.
        method: ``"grpo"``, ``"naive"`` or ``"cal"``.
        baseline: ``"loo"``, ``"mean"`` or ``"none"``.
        normalize_std: whether advantages were divided by the group's standard deviation.
        singleton: ``"trajectory"``, ``"keep"`` or ``"zero"``, the rule for attempts reached by
            no other rollout of their group.
        unbiased: whether :math:`E[\\hat g] = \\nabla` Verification@K exactly (see the module
            docstring's theorem).
        singletons: number of made attempts whose baseline group had no other member.
        mix: the blend β of ``"cal"`` (a number or ``(K,)``), ``None`` for the plain method.
    """

    weights: Tensor
    attempted: Tensor
    method: str
    baseline: str
    normalize_std: bool
    singleton: str
    unbiased: bool
    singletons: int
    mix: Tensor | None = None


def _group_stats(
    values: Tensor, members: Tensor, baseline: str, normalize_std: bool, eps: float
) -> tuple[Tensor, Tensor]:
    """Advantage ``values - b`` over the members of each (group, column), and singleton mask.

    ``values``/``members``: ``(G, N, C)``; statistics run over dim 1 among ``members``.
    """
    m = members.to(values.dtype)
    count = m.sum(dim=1, keepdim=True)
    total = (values * m).sum(dim=1, keepdim=True)
    others = count - m
    singleton = members & (others == 0)
    if baseline == "loo":
        b = torch.where(others > 0, (total - values * m) / others.clamp_min(1), 0.0)
    elif baseline == "mean":
        b = total / count.clamp_min(1)
    else:
        b = torch.zeros_like(values)
    adv = (values - b) * m
    if normalize_std:
        mean = total / count.clamp_min(1)
        var = (((values - mean) * m) ** 2).sum(dim=1, keepdim=True) / count.clamp_min(1)
        adv = adv / (var.sqrt() + eps)
    return adv, singleton


def _check_mix(mix: float | Sequence[float] | Tensor, method: str, k: int, like: Tensor):
    """``mix`` as a ``(K,)`` tensor, or ``None`` when it is the plain method (β = 1)."""
    if isinstance(mix, bool):
        raise RLTypeError(f"mix: expected a number or {k} numbers, got a bool.")
    if isinstance(mix, (int, float)) and mix == 1:
        return None
    if method != "cal":
        raise RLValueError(
            f"mix: only the 'cal' method blends baselines, got mix={mix!r} with method "
            f"{method!r}; drop mix or use method='cal'."
        )
    try:
        beta = torch.as_tensor(mix, dtype=like.dtype, device=like.device).detach()
    except (TypeError, ValueError, RuntimeError) as err:
        raise RLTypeError(f"mix: expected a number or {k} numbers, got {mix!r}.") from err
    if beta.ndim > 1 or (beta.ndim == 1 and beta.numel() != k):
        raise RLValueError(
            f"mix: expected a number or one per attempt ({k} values), got shape "
            f"{tuple(beta.shape)}."
        )
    if not bool(torch.isfinite(beta).all()):
        raise RLValueError(f"mix: expected finite values, got {mix!r}.")
    return beta


def compute_weights(
    rollout: MultiAttemptRollout,
    method: Method,
    *,
    baseline: Baseline = "loo",
    normalize_std: bool = False,
    singleton: Singleton = "trajectory",
    mix: float | Sequence[float] | Tensor = 1.0,
    eps: float = 1e-6,
) -> AttemptWeights:
    """Attempt weights of ``method`` for a batch of groups (see the module docstring).

    Args:
        rollout: the :class:`~dxopt.rl.MultiAttemptRollout` (``G`` groups of ``N``).
        method: ``"grpo"`` (trajectory reward), ``"naive"`` (own pass/fail) or ``"cal"``.
        baseline: ``"loo"`` (default, unbiased), ``"mean"`` (GRPO's, includes the rollout
            itself) or ``"none"``.
        normalize_std: divide by the members' standard deviation plus ``eps`` (GRPO's
            scaling; a different objective, off by default).
        singleton: what an attempt gets whose baseline group has no other member:
            ``"trajectory"`` (default) the baseline over the whole group, ``"keep"`` baseline
            0 (both unbiased), ``"zero"`` weight 0 (biased). For ``"grpo"`` only ``N = 1``
            has singletons, and ``"trajectory"`` then means ``"keep"``.
        mix: ``"cal"`` only: weight β of the attempt-level baseline against the trajectory
            one, a number or one per attempt (``K`` values). Any β fixed independently of the
            batch (e.g. fitted on earlier batches) keeps the estimate unbiased; β fitted on the
            same batch does not.
        eps: added to the standard deviation when ``normalize_std``.

    Returns:
        :class:`AttemptWeights`.
    """
    if not isinstance(rollout, MultiAttemptRollout):
        raise RLTypeError(
            f"rollout: expected a dxopt.rl.MultiAttemptRollout, got {type(rollout).__name__}; "
            "wrap the (groups, group_size, attempts) rewards with MultiAttemptRollout(rewards)."
        )
    with rl_input_errors():
        check_choice("method", method, METHODS)
        check_choice("baseline", baseline, _BASELINES)
        check_choice("singleton", singleton, _SINGLETONS)
        check_positive("eps", eps)
    if not isinstance(normalize_std, bool):
        raise RLTypeError(f"normalize_std: expected a bool, got {type(normalize_std).__name__}.")

    r = rollout.rewards
    attempted = rollout.attempted
    beta = _check_mix(mix, method, rollout.shape[-1], r)
    solved = rollout.solved
    if method == "grpo":
        adv, single = _group_stats(
            solved.unsqueeze(-1), torch.ones_like(attempted[..., :1]), baseline, normalize_std, eps
        )
        single = single & attempted
        adv = adv.expand_as(r)
    else:
        values = r if method == "naive" else solved.unsqueeze(-1).expand_as(r)
        adv, single = _group_stats(values, attempted, baseline, normalize_std, eps)
    if singleton == "zero":
        adv = torch.where(single, 0.0, adv)
    elif singleton == "trajectory" and method != "grpo":
        whole, _ = _group_stats(values, torch.ones_like(attempted), baseline, normalize_std, eps)
        adv = torch.where(single, whole, adv)
    if beta is not None:
        traj = compute_weights(
            rollout, "grpo", baseline=baseline, normalize_std=normalize_std, eps=eps
        ).weights
        adv = beta * adv + (1 - beta) * traj
    weights = torch.where(attempted, adv, 0.0).detach()
    _, n, k = rollout.shape
    never_singleton = n >= 2 and (method == "grpo" or k == 1)
    unbiased = (
        method != "naive"
        and baseline != "mean"
        and not normalize_std
        and (singleton != "zero" or never_singleton)
    )
    return AttemptWeights(
        weights=weights,
        attempted=attempted,
        method=method,
        baseline=baseline,
        normalize_std=normalize_std,
        singleton=singleton,
        unbiased=unbiased,
        singletons=int((single & attempted).sum()),
        mix=beta,
    )
