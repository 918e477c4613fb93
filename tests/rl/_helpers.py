"""Exact mean and covariance trace of an estimator over enumerated groups, and MC samples."""

import torch

from dxopt.rl import TabularMultiAttempt, compute_weights


def exact_moments(policy: TabularMultiAttempt, groups, method: str, **options):
    """(mean, total variance) of the estimate over enumerated ``groups`` (or a group size)."""
    if isinstance(groups, int):
        groups = policy.enumerate_groups(groups)
    grads = policy.group_gradients(groups, compute_weights(groups.rollout, method, **options))
    p = groups.probabilities.reshape(-1, 1, 1)
    mean = (p * grads).sum(0)
    return mean, float((p * (grads - mean) ** 2).sum())


def mc_samples(policy, group_size, num_groups, method, *, seed, **options):
    """``(num_groups, S, A)`` independent estimates, one per sampled group."""
    gen = torch.Generator().manual_seed(seed)
    sample = policy.sample(num_groups, group_size, generator=gen)
    return policy.group_gradients(sample, compute_weights(sample.rollout, method, **options))
