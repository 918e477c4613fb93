"""Bias and variance of each weighting on tabular policies: enumerated or sampled."""

from __future__ import annotations

import math
from typing import Any

import torch

from dxopt.rl import TabularMultiAttempt, compute_weights

# (label, method, options): the three estimators and the variants the docs discuss
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("grpo (LOO)", "grpo", {}),
    ("grpo (mean, /std)", "grpo", {"baseline": "mean", "normalize_std": True}),
    ("naive (LOO)", "naive", {}),
    ("cal (LOO, fallback)", "cal", {}),
    ("cal (LOO, keep)", "cal", {"singleton": "keep"}),
    ("cal (LOO, zero)", "cal", {"singleton": "zero"}),
    ("cal (LOO, keep, mix 0.5)", "cal", {"singleton": "keep", "mix": 0.5}),
]


def instances(quick: bool) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed
    return [
        {"name": "counterexample", "policy": TabularMultiAttempt.counterexample(), "N": 4},
        {
            "name": "random A=2 K=3",
            "policy": TabularMultiAttempt.random(2, 3, generator=gen(0)),
            "N": 3,
        },
        {
            "name": "random A=3 K=3",
            "policy": TabularMultiAttempt.random(3, 3, generator=gen(5)),
            "N": 8,
            "mc": 2_000 if quick else 40_000,
        },
    ]


def _row(inst, label, method, options, mean, var, se) -> dict[str, Any]:
    policy = inst["policy"]
    grad = policy.exact_gradient()
    bias = mean - grad
    flag = compute_weights(policy.sample(1, inst["N"]).rollout, method, **options).unbiased
    row = {
        "instance": inst["name"],
        "N": inst["N"],
        "J": policy.verification_at_k().item(),
        "|grad|": float(grad.norm()),
        "estimator": label,
        "claimed unbiased": "yes" if flag else "no",
        "|bias|": float(bias.norm()),
        "|bias| / |grad|": float(bias.norm() / grad.norm()),
        "cos(mean, grad)": float((mean * grad).sum() / (mean.norm() * grad.norm())),
        "total variance": var,
        "how": "exact" if se is None else f"MC, {inst['mc']} groups",
    }
    if se is not None:
        row["max z"] = float((bias.abs() / se.clamp_min(1e-15)).max())
    return row


def bias_variance_table(quick: bool) -> list[dict[str, Any]]:
    rows = []
    for inst in instances(quick):
        policy, n = inst["policy"], inst["N"]
        if "mc" in inst:
            sample = policy.sample(inst["mc"], n, generator=torch.Generator().manual_seed(7))
        else:
            groups = policy.enumerate_groups(n)
            p = groups.probabilities.reshape(-1, 1, 1)
        for label, method, options in VARIANTS:
            if "mc" in inst:
                est = policy.group_gradients(
                    sample, compute_weights(sample.rollout, method, **options)
                )
                mean, m = est.mean(0), est.shape[0]
                var = float((est - mean).square().sum(dim=(1, 2)).mean()) * m / (m - 1)
                se = est.std(0) / math.sqrt(m)
            else:
                w = compute_weights(groups.rollout, method, **options)
                est = policy.group_gradients(groups, w)
                mean = (p * est).sum(0)
                var, se = float((p * (est - mean) ** 2).sum()), None
            rows.append(_row(inst, label, method, options, mean, var, se))
    return rows
