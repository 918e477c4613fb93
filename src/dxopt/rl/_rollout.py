r"""The multi-attempt rollout record.

A group of :math:`N` rollouts answers one prompt. Rollout :math:`i` makes attempts
:math:`k = 1, \dots, K`; attempt :math:`k` is conditioned on the earlier attempts and on the
verifier's "wrong" after each of them, gets the hard reward :math:`r_{i,k}\in\{0,1\}` and the
rollout stops at its first success. So rollout :math:`i` makes
:math:`L_i = \min\{k: r_{i,k}=1\}\wedge K` attempts and solves the prompt
(:math:`R_i = \max_k r_{i,k} = r_{i,L_i}`) when one of them passes; Verification@K is
:math:`P(R = 1)`, Pass@1 is :math:`P(r_1 = 1)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt._core import check_tensor
from dxopt.rl._errors import RLTypeError, RLValueError, rl_input_errors


@dataclass(frozen=True)
class RolloutCounts:
    """What a batch of multi-attempt rollouts cost and achieved.

    Attributes:
        groups: prompts (groups) in the batch.
        rollouts: rollouts in the batch (groups x group size).
        attempts: attempts generated, which is also the number of verifier calls.
        solved: rollouts that succeeded within their K attempts.
        first_attempt_solved: rollouts whose first attempt succeeded.
    """

    groups: int
    rollouts: int
    attempts: int
    solved: int
    first_attempt_solved: int


@dataclass(frozen=True)
class MultiAttemptRollout:
    """Per-attempt pass/fail rewards of ``G`` groups of ``N`` rollouts with up to ``K`` attempts.

    Attributes:
        rewards: ``(G, N, K)`` tensor of 0/1 rewards ``r[g, i, k]`` of attempt ``k`` of rollout
            ``i`` of group ``g`` (any real or bool dtype). Attempts after a rollout's first
            success are not made and must hold 0.

    Raises:
        RLTypeError: ``rewards`` is not a tensor.
        RLValueError: wrong shape, a value other than 0/1, or a reward after a success.
    """

    rewards: Tensor

    def __post_init__(self) -> None:
        r = self.rewards
        with rl_input_errors():
            check_tensor("rewards", r, hint="pass the (groups, group_size, attempts) 0/1 rewards")
        if r.ndim != 3 or 0 in r.shape:
            raise RLValueError(
                "rewards: expected a non-empty (groups, group_size, attempts) tensor, got shape "
                f"{tuple(r.shape)}; for a single prompt use rewards.unsqueeze(0)."
            )
        if r.is_complex():
            raise RLTypeError(f"rewards: expected real 0/1 values, got dtype {r.dtype}.")
        rf = r.detach().to(torch.float64)
        if not bool(((rf == 0) | (rf == 1)).all()):
            bad = rf[(rf != 0) & (rf != 1)][:3].tolist()
            raise RLValueError(
                f"rewards: expected hard verifier rewards in {{0, 1}}, got values such as {bad}; "
                "threshold or round a soft score first."
            )
        before = torch.cumsum(rf, dim=-1) - rf  # successes strictly before attempt k
        if bool(((before > 0) & (rf > 0)).any()):
            raise RLValueError(
                "rewards: a rollout has a reward after its first success; a rollout stops at "
                "its first passing attempt, so later attempts must be 0 (not generated)."
            )
        object.__setattr__(self, "rewards", rf.to(self._float_dtype(r)))

    @staticmethod
    def _float_dtype(r: Tensor) -> torch.dtype:
        return r.dtype if r.is_floating_point() else torch.get_default_dtype()

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(groups, group_size, attempts)``."""
        g, n, k = self.rewards.shape
        return g, n, k

    @property
    def attempted(self) -> Tensor:
        """``(G, N, K)`` bool: attempt ``k`` was made (no success before it)."""
        r = self.rewards
        return (torch.cumsum(r, dim=-1) - r) == 0

    @property
    def solved(self) -> Tensor:
        """``(G, N)`` trajectory reward :math:`R_i = \\max_k r_{i,k}` (same dtype as rewards)."""
        return self.rewards.amax(dim=-1)

    @property
    def num_attempts(self) -> Tensor:
        """``(G, N)`` long: attempts :math:`L_i` each rollout made."""
        return self.attempted.sum(dim=-1)

    def verification_at_k(self) -> float:
        """Fraction of rollouts solved within their K attempts (estimates Verification@K)."""
        return float(self.solved.mean())

    def pass_at_1(self) -> float:
        """Fraction of rollouts whose first attempt passed (estimates Pass@1)."""
        return float(self.rewards[..., 0].mean())

    def counts(self) -> RolloutCounts:
        """The :class:`RolloutCounts` of this batch."""
        g, n, _ = self.shape
        return RolloutCounts(
            groups=g,
            rollouts=g * n,
            attempts=int(self.attempted.sum()),
            solved=int(self.solved.sum()),
            first_attempt_solved=int(self.rewards[..., 0].sum()),
        )
