r"""The "probe and fix" multi-attempt task and its training loop.

Each of ``P`` prompts has ``A`` candidate answers, permuted per prompt. Two *guesses*
``g1, g2`` pass with probabilities ``q1, q2 ~ U[0.3, 0.6]``; a *probe* ``b`` passes with
``qb ~ U[0.1, 0.3]``, and once it has failed its *fix* ``c`` passes with ``f ~ U[0.5, 1]``
(the failed probe localises the error); every other answer, and ``c`` before ``b`` has failed,
passes with ``0.02``; an answer that already failed fails again. With ``K = 3`` attempts the
best plans use ``g1``, ``b`` and then ``c`` (Verification@3 = 1 - (1-q1)(1-qb)(1-f)), while
weighting each attempt by its own pass/fail favours the second guess over the probe after
``g1`` fails (it passes more often on its own), the mechanism of the paper's counterexample.

The policy is an MLP over (prompt one-hot, multi-hot of the failed answers, attempt one-hot).
All ``P x S`` history states (``S = 1 + A + A^2``) go through it in one forward per step, so
exact Verification@K and Pass@1 of the current policy come from
:func:`dxopt.rl.exact_verification_at_k`, without sampling noise.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dxopt.rl import MultiAttemptRollout, compute_weights, exact_verification_at_k, surrogate_loss


@dataclass(frozen=True)
class TaskConfig:
    prompts: int = 32
    answers: int = 8
    attempts: int = 3
    eps: float = 0.02


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 600
    prompts_per_step: int = 16
    group_size: int = 8
    lr: float = 3e-3
    hidden: int = 64
    eval_every: int = 20


class ProbeFixTask:
    """Pass tables and policy features of every (prompt, history) state."""

    def __init__(self, cfg: TaskConfig, seed: int = 0):
        gen = torch.Generator().manual_seed(1000 + seed)
        p, a, k = cfg.prompts, cfg.answers, cfg.attempts
        self.cfg = cfg
        histories = [h for level in range(k) for h in itertools.product(range(a), repeat=level)]
        self.num_states = len(histories)
        self.offsets = [sum(a**j for j in range(level)) for level in range(k + 1)]
        success = torch.full((p, self.num_states, a), cfg.eps)
        feats = torch.zeros(p, self.num_states, p + a + k)
        self.optimum = torch.zeros(p)
        for prompt in range(p):
            g1, g2, b, c = torch.randperm(a, generator=gen)[:4].tolist()
            u = torch.rand(4, generator=gen).tolist()
            q1, q2, qb, f = 0.3 + 0.3 * u[0], 0.3 + 0.3 * u[1], 0.1 + 0.2 * u[2], 0.5 + 0.5 * u[3]
            for s, h in enumerate(histories):
                row = success[prompt, s]
                row[g1], row[g2], row[b] = q1, q2, qb
                if b in h:
                    row[c] = f
                for tried in h:
                    row[tried] = 0.0
                feats[prompt, s, prompt] = 1.0
                feats[prompt, s, [p + t for t in set(h)]] = 1.0
                feats[prompt, s, p + a + len(h)] = 1.0
        self.success = success
        self.features = feats

    def policy(self, hidden: int) -> nn.Module:
        d = self.features.shape[-1]
        return nn.Sequential(
            nn.Linear(d, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, self.cfg.answers),
        )  # fmt: skip

    def optimum_verification(self) -> float:
        """Best Verification@K, by dynamic programming over the tables (max instead of mean)."""
        a, k = self.cfg.answers, self.cfg.attempts
        value = torch.zeros(self.cfg.prompts, a**k)
        for level in reversed(range(k)):
            lo, hi = self.offsets[level], self.offsets[level + 1]
            p = self.success[:, lo:hi]
            value = (p + (1 - p) * value.reshape(self.cfg.prompts, -1, a)).amax(-1)
        return float(value.mean())

    @torch.no_grad()
    def evaluate(self, logits: Tensor) -> tuple[float, float]:
        probs = torch.softmax(logits, -1)
        ver = exact_verification_at_k(probs, self.success, self.cfg.attempts)
        pass1 = (probs[:, 0] * self.success[:, 0]).sum(-1)
        return float(ver.mean()), float(pass1.mean())

    def rollouts(self, logits: Tensor, prompts: Tensor, n: int, gen: torch.Generator):
        """Sample ``n`` rollouts per prompt; returns the record and (G, N, K) log-probs."""
        a, k = self.cfg.answers, self.cfg.attempts
        g = prompts.numel()
        logp_all = torch.log_softmax(logits, -1)
        pr = prompts.repeat_interleave(n)
        code = torch.zeros(g * n, dtype=torch.long)
        alive = torch.ones(g * n, dtype=torch.bool)
        rewards, logps = [], []
        for level in range(k):
            state = self.offsets[level] + code
            lp = logp_all[pr, state]
            act = torch.multinomial(lp.detach().exp(), 1, generator=gen).squeeze(-1)
            hit = (torch.rand(g * n, generator=gen) < self.success[pr, state, act]) & alive
            rewards.append(hit.float())
            logps.append(lp.gather(-1, act.unsqueeze(-1)).squeeze(-1))
            alive &= ~hit
            code = code * a + act
        shape = (g, n, k)
        rollout = MultiAttemptRollout(torch.stack(rewards, -1).reshape(shape))
        return rollout, torch.stack(logps, -1).reshape(shape)


# arm name -> (method, options) of dxopt.rl.compute_weights
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "naive": ("naive", {}),
    "cal": ("cal", {}),
    "cal-mix": ("cal", {"singleton": "keep", "mix": 0.5}),
}


def train(task: ProbeFixTask, arm: str, seed: int, cfg: TrainConfig) -> dict[str, Any]:
    """Train one policy with ``arm``'s weights; exact curves every ``eval_every`` steps."""
    method, options = ARMS[arm]
    torch.manual_seed(seed)
    policy = task.policy(cfg.hidden)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(seed)
    curve: list[dict[str, float]] = []
    attempts = 0
    t0 = time.perf_counter()
    for step in range(cfg.steps + 1):
        logits = policy(task.features)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            ver, pass1 = task.evaluate(logits)
            curve.append({"step": step, "verification": ver, "pass1": pass1})
        if step == cfg.steps:
            break
        prompts = torch.randperm(task.cfg.prompts, generator=gen)[: cfg.prompts_per_step]
        rollout, logp = task.rollouts(logits, prompts, cfg.group_size, gen)
        weights = compute_weights(rollout, method, **options)  # type: ignore[arg-type]
        attempts += rollout.counts().attempts
        opt.zero_grad()
        surrogate_loss(logp, weights).backward()
        opt.step()
    return {
        "method": arm,
        "seed": seed,
        "curve": curve,
        "final_verification": curve[-1]["verification"],
        "final_pass1": curve[-1]["pass1"],
        "attempts": attempts,
        "seconds": time.perf_counter() - t0,
    }
