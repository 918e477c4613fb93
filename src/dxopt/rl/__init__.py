r"""Multi-attempt policy gradients: vanilla GRPO, naive attempt weighting and calibrated (CAL).

A model makes up to ``K`` attempts at a prompt, each after the verifier's "wrong" on the
previous ones; the objective is Verification@K, :math:`J = P(\text{success by attempt } K)`.
The pieces plug into any RL loop:

- :class:`MultiAttemptRollout`: the ``(groups, group_size, attempts)`` 0/1 rewards, with the
  attempts made, Verification@K / Pass@1 and a :class:`RolloutCounts` record;
- :func:`compute_weights`: attempt weights for ``"grpo"`` (trajectory reward),
  ``"naive"`` (each attempt's own pass/fail, biased) and ``"cal"`` (trajectory reward against
  a leave-one-out baseline of the rollouts that reached the same attempt, divided by the
  group size: unbiased), each group-relative, as an :class:`AttemptWeights` record that says
  whether the variant is unbiased;
- :func:`surrogate_loss`: attempt or token log-probabilities times the weights, whose
  negative gradient is the estimate;
- :class:`TabularMultiAttempt`: a tabular K-attempt policy with exact Verification@K, its
  gradient, the naive estimator's mean and every group of rollouts enumerated;
  :func:`exact_verification_at_k` is its recursion for any history-indexed policy.

The unbiasedness theorem and its proof are in :mod:`dxopt.rl._weights`.

Reference: Ildiz, Gozeten, Taga, Oymak, "Learning to Correct: Calibrated Reinforcement Learning
for Multi-Attempt Chain-of-Thought", arXiv 2604.17912.
"""

from dxopt.rl._errors import RLTypeError as RLTypeError
from dxopt.rl._errors import RLValueError as RLValueError
from dxopt.rl._loss import surrogate_loss as surrogate_loss
from dxopt.rl._rollout import MultiAttemptRollout as MultiAttemptRollout
from dxopt.rl._rollout import RolloutCounts as RolloutCounts
from dxopt.rl._tabular import TabularMultiAttempt as TabularMultiAttempt
from dxopt.rl._tabular import TabularSample as TabularSample
from dxopt.rl._tabular import exact_verification_at_k as exact_verification_at_k
from dxopt.rl._weights import METHODS as METHODS
from dxopt.rl._weights import AttemptWeights as AttemptWeights
from dxopt.rl._weights import compute_weights as compute_weights

__all__ = [
    "METHODS",
    "AttemptWeights",
    "MultiAttemptRollout",
    "RLTypeError",
    "RLValueError",
    "RolloutCounts",
    "TabularMultiAttempt",
    "TabularSample",
    "compute_weights",
    "exact_verification_at_k",
    "surrogate_loss",
]
