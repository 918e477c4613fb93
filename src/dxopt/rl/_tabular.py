r"""A tabular K-attempt policy whose Verification@K and gradients are known exactly.

Histories of :math:`k` failed attempts over :math:`A` answers are the states
:math:`h = (y_1,\dots,y_k)`, :math:`k < K`: :math:`S = \sum_{k<K} A^k` of them, numbered level by
level (state ``offset[k] + code``, ``code`` the base-:math:`A` number of the answers).
The policy is a softmax over per-state logits, :math:`\pi(a\mid h) = \mathrm{softmax}(\theta_h)_a`,
and answer :math:`a` after history :math:`h` passes with probability :math:`p(h, a)` (a fixed
table: the verifier may be noisy, but does not depend on :math:`\theta`).

Exact quantities, by backward recursion over the levels:

.. math:: V(h) = \sum_a \pi(a\mid h)\,[p(h,a) + (1 - p(h,a))\,V(h a)],\qquad V(h) = 0
          \text{ for } |h| = K,

Verification@K :math:`J = V(\varnothing)`, its gradient by autograd, and the mean of the naive
estimator :math:`E[\sum_k 1\{L\ge k\} r_k s_k] = \sum_h P(\text{reach } h)\sum_a p(h,a)
\nabla\pi(a\mid h)`. :meth:`TabularMultiAttempt.enumerate_groups` lists every group of
:math:`N` complete rollouts with its probability, so any estimator's exact mean and covariance
follow by summation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dxopt._core import check_int, check_tensor
from dxopt.rl._errors import RLValueError, rl_input_errors
from dxopt.rl._rollout import MultiAttemptRollout
from dxopt.rl._weights import AttemptWeights


def exact_verification_at_k(probs: Tensor, success: Tensor, num_attempts: int) -> Tensor:
    r"""Verification@K of history-indexed policies by backward recursion (differentiable).

    Args:
        probs: ``(..., S, A)`` policy :math:`\pi(a\mid h)` per history state (numbered as in
            this module: level by level, base-``A`` codes), any leading batch dimensions.
        success: ``(..., S, A)`` pass probabilities :math:`p(h, a)`, broadcastable to ``probs``.
        num_attempts: ``K``, with :math:`S = \sum_{k<K} A^k`.

    Returns:
        ``(...)`` Verification@K :math:`V(\varnothing)`.
    """
    with rl_input_errors():
        check_tensor("probs", probs, floating=True)
        check_tensor("success", success, floating=True)
        check_int("num_attempts", num_attempts)
    if probs.ndim < 2:
        raise RLValueError(
            f"probs: expected shape (..., S, A) (history states x answers), got "
            f"{tuple(probs.shape)}."
        )
    a = probs.shape[-1]
    if probs.shape[-2] != sum(a**k for k in range(num_attempts)):
        raise RLValueError(
            f"probs: expected {sum(a**k for k in range(num_attempts))} history states for "
            f"{num_attempts} attempts over {a} answers, got shape {tuple(probs.shape)}."
        )
    batch = probs.shape[:-2]
    value = torch.zeros((*batch, a**num_attempts), dtype=probs.dtype, device=probs.device)
    for k in reversed(range(num_attempts)):
        lo, hi = sum(a**j for j in range(k)), sum(a**j for j in range(k + 1))
        pi, p = probs[..., lo:hi, :], success[..., lo:hi, :]
        value = (pi * (p + (1 - p) * value.reshape(*batch, -1, a))).sum(-1)
    return value.reshape(batch)


@dataclass(frozen=True)
class TabularSample:
    """Groups of rollouts of a :class:`TabularMultiAttempt` policy.

    Attributes:
        rollout: the rewards record, ``(G, N, K)``.
        states: ``(G, N, K)`` long state of each attempt (meaningless for attempts not made).
        actions: ``(G, N, K)`` long answer of each attempt (idem).
        probabilities: ``(G,)`` probability of each group, for enumerated groups (else ``None``).
    """

    rollout: MultiAttemptRollout
    states: Tensor
    actions: Tensor
    probabilities: Tensor | None = None


class TabularMultiAttempt(nn.Module):
    """Softmax policy over ``num_answers`` answers per attempt, one logit row per history.

    Args:
        success: ``(S, A)`` pass probabilities :math:`p(h, a)` in ``[0, 1]``, with
            :math:`S = \\sum_{k<K} A^k`.
        num_attempts: ``K``.
        logits: initial ``(S, A)`` logits (default zeros: uniform policy).
    """

    success: Tensor

    def __init__(self, success: Tensor, num_attempts: int, *, logits: Tensor | None = None):
        super().__init__()
        with rl_input_errors():
            check_tensor(
                "success", success, floating=True, finite=True, hint="pass an (S, A) table"
            )
            check_int("num_attempts", num_attempts)
        if success.ndim != 2 or success.shape[1] < 2:
            raise RLValueError(
                f"success: expected shape (S, A) with A >= 2 answers, got {tuple(success.shape)}."
            )
        a = success.shape[1]
        expected = sum(a**k for k in range(num_attempts))
        if success.shape[0] != expected:
            raise RLValueError(
                f"success: expected {expected} rows (one per history of fewer than "
                f"{num_attempts} attempts over {a} answers), got {success.shape[0]}."
            )
        if bool(((success < 0) | (success > 1)).any()):
            raise RLValueError("success: pass probabilities must lie in [0, 1].")
        if logits is None:
            logits = torch.zeros_like(success)
        else:
            with rl_input_errors():
                check_tensor(
                    "logits", logits, shape=tuple(success.shape), floating=True, finite=True
                )
        self.num_attempts = num_attempts
        self.num_answers = a
        self.offsets = [sum(a**j for j in range(k)) for k in range(num_attempts + 1)]
        self.register_buffer("success", success.detach().clone())
        self.logits = nn.Parameter(logits.detach().clone().to(success.dtype))

    @classmethod
    def random(
        cls,
        num_answers: int,
        num_attempts: int,
        *,
        generator: torch.Generator | None = None,
        logit_scale: float = 1.0,
        dtype: torch.dtype = torch.float64,
    ) -> TabularMultiAttempt:
        """Uniform random pass table, Gaussian logits times ``logit_scale``."""
        s = sum(num_answers**k for k in range(num_attempts))
        success = torch.rand(s, num_answers, generator=generator, dtype=dtype)
        logits = logit_scale * torch.randn(s, num_answers, generator=generator, dtype=dtype)
        return cls(success, num_attempts, logits=logits)

    @classmethod
    def counterexample(cls, dtype: torch.dtype = torch.float64) -> TabularMultiAttempt:
        """Two attempts, answers A/B then C/D, where naive weighting points the wrong way.

        Attempt 1: A passes w.p. 0.5, B w.p. 0.4. After A fails every retry fails; after B
        fails, C passes surely and D w.p. 0.2. Uniform policy: J = 0.63, and B (then C,
        J = 1) is optimal although A has the better first attempt.
        """
        success = torch.tensor([[0.5, 0.4], [0.0, 0.0], [1.0, 0.2]], dtype=dtype)
        return cls(success, 2)

    @property
    def num_states(self) -> int:
        return int(self.success.shape[0])

    def probs(self) -> Tensor:
        """``(S, A)`` policy :math:`\\pi(a\\mid h)`."""
        return torch.softmax(self.logits, dim=-1)

    def _level(self, k: int) -> slice:
        return slice(self.offsets[k], self.offsets[k + 1])

    def verification_at_k(self) -> Tensor:
        """Exact Verification@K (differentiable in :attr:`logits`)."""
        return exact_verification_at_k(self.probs(), self.success, self.num_attempts)

    def pass_at_1(self) -> Tensor:
        """Exact Pass@1 (differentiable)."""
        return (self.probs()[0] * self.success[0]).sum()

    def reach_probabilities(self) -> Tensor:
        """``(S,)`` probability that a rollout reaches each history (all attempts failed)."""
        pi, p = self.probs(), self.success
        reach = [torch.ones(1, dtype=pi.dtype, device=pi.device)]
        for k in range(self.num_attempts - 1):
            lv = self._level(k)
            reach.append((reach[-1].unsqueeze(-1) * pi[lv] * (1 - p[lv])).reshape(-1))
        return torch.cat(reach)

    def exact_gradient(self) -> Tensor:
        """``(S, A)`` gradient of Verification@K with respect to the logits."""
        (grad,) = torch.autograd.grad(self.verification_at_k(), self.logits)
        return grad

    def naive_mean(self) -> Tensor:
        """``(S, A)`` exact mean of the naive estimator :math:`\\sum_k 1\\{L\\ge k\\} r_k s_k`."""
        reach = self.reach_probabilities().detach()
        surrogate = (reach.unsqueeze(-1) * self.probs() * self.success).sum()
        (grad,) = torch.autograd.grad(surrogate, self.logits)
        return grad

    @torch.no_grad()
    def sample(
        self, num_groups: int, group_size: int, *, generator: torch.Generator | None = None
    ) -> TabularSample:
        """Sample ``num_groups`` groups of ``group_size`` independent rollouts."""
        with rl_input_errors():
            check_int("num_groups", num_groups)
            check_int("group_size", group_size)
        g, n, a, kk = num_groups, group_size, self.num_answers, self.num_attempts
        pi, p = self.probs(), self.success
        code = torch.zeros(g * n, dtype=torch.long)
        alive = torch.ones(g * n, dtype=torch.bool)
        states = torch.zeros(g * n, kk, dtype=torch.long)
        actions = torch.zeros(g * n, kk, dtype=torch.long)
        rewards = torch.zeros(g * n, kk, dtype=p.dtype)
        for k in range(kk):
            state = self.offsets[k] + code
            act = torch.multinomial(pi[state], 1, generator=generator).squeeze(-1)
            u = torch.rand(g * n, generator=generator, dtype=p.dtype)
            hit = (u < p[state, act]) & alive
            states[:, k], actions[:, k], rewards[:, k] = state, act, hit.to(p.dtype)
            alive &= ~hit
            code = code * a + act
        shape = (g, n, kk)
        return TabularSample(
            MultiAttemptRollout(rewards.reshape(shape)),
            states.reshape(shape),
            actions.reshape(shape),
        )

    @torch.no_grad()
    def enumerate_groups(self, group_size: int) -> TabularSample:
        """Every group of ``group_size`` complete rollouts, with its probability.

        There are :math:`T^N` groups for :math:`T = \\sum_{k\\le K} A^k + A^K` single-rollout
        outcomes: keep :math:`T^N` to about :math:`10^6`.
        """
        pi, p, a, kk = self.probs(), self.success, self.num_answers, self.num_attempts
        outcomes: list[tuple[list[int], list[int], list[float], float]] = []

        def walk(k: int, code: int, st: list[int], ac: list[int], prob: float) -> None:
            state = self.offsets[k] + code
            for act in range(a):
                q = float(pi[state, act])
                ps = float(p[state, act])
                s2, a2 = [*st, state], [*ac, act]
                pad = [0] * (kk - k - 1)
                hit = [0.0] * k + [1.0] + [0.0] * (kk - k - 1)
                outcomes.append((s2 + pad, a2 + pad, hit, prob * q * ps))
                if k + 1 == kk:
                    outcomes.append((s2, a2, [0.0] * kk, prob * q * (1 - ps)))
                else:
                    walk(k + 1, code * a + act, s2, a2, prob * q * (1 - ps))

        walk(0, 0, [], [], 1.0)
        st = torch.tensor([o[0] for o in outcomes], dtype=torch.long)
        ac = torch.tensor([o[1] for o in outcomes], dtype=torch.long)
        rw = torch.tensor([o[2] for o in outcomes], dtype=p.dtype)
        pr = torch.tensor([o[3] for o in outcomes], dtype=p.dtype)
        t = len(outcomes)
        place = t ** torch.arange(group_size - 1, -1, -1)
        idx = torch.arange(t**group_size).unsqueeze(-1).div(place, rounding_mode="floor") % t
        return TabularSample(
            MultiAttemptRollout(rw[idx]), st[idx], ac[idx], probabilities=pr[idx].prod(dim=-1)
        )

    def log_probs(self, states: Tensor, actions: Tensor) -> Tensor:
        """Attempt log-probabilities :math:`\\log\\pi(a\\mid h)`, shaped like ``states``."""
        logp = torch.log_softmax(self.logits, dim=-1)
        return logp[states, actions]

    @torch.no_grad()
    def group_gradients(self, sample: TabularSample, weights: AttemptWeights) -> Tensor:
        """``(G, S, A)`` estimate :math:`\\hat g` of each group, in closed form.

        Equals :math:`-\\nabla` :func:`~dxopt.rl.surrogate_loss` of that group alone
        (:math:`\\nabla_{\\theta_h}\\log\\pi(a\\mid h) = e_a - \\pi(\\cdot\\mid h)`).
        """
        g, n, _ = sample.rollout.shape
        s, a = self.num_states, self.num_answers
        pi = self.probs()
        w = weights.weights.to(pi.dtype)
        score = torch.nn.functional.one_hot(sample.actions, a).to(pi.dtype) - pi[sample.states]
        contrib = (w.unsqueeze(-1) * score).reshape(-1, a)
        rows = (torch.arange(g).reshape(g, 1, 1) * s + sample.states).reshape(-1)
        out = torch.zeros(g * s, a, dtype=pi.dtype)
        out.index_add_(0, rows, contrib)
        return out.reshape(g, s, a) / n
