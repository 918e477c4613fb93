"""Monte Carlo checks against the exact references, bounded in standard errors.

Per coordinate, |mean - exact| <= Z standard errors for the unbiased estimators (GRPO and CAL
with leave-one-out baselines) and for naive against its own exact mean; naive against the
gradient must miss by far more than Z standard errors; sampled variances agree with the
enumerated ones.
"""

import math

import pytest
import torch

from dxopt.rl import TabularMultiAttempt, compute_weights, surrogate_loss

from ._helpers import exact_moments, mc_samples

Z = 4.5  # two-sided bound per coordinate: a false alarm is < 1e-5 per coordinate
M = 20_000  # groups per estimator


def _within(samples, expected, z=Z):
    mean = samples.mean(0)
    stderr = samples.std(0) / math.sqrt(samples.shape[0])
    return (mean - expected).abs() <= z * stderr + 1e-12, mean, stderr


POLICIES = [
    pytest.param(TabularMultiAttempt.counterexample, id="counterexample"),
    pytest.param(
        lambda: TabularMultiAttempt.random(3, 3, generator=torch.Generator().manual_seed(5)),
        id="random-A3K3",
    ),
]


@pytest.mark.parametrize("make", POLICIES)
def test_grpo_and_cal_unbiased_naive_biased(make):
    policy = make()
    grad, naive = policy.exact_gradient(), policy.naive_mean()
    for i, (method, options) in enumerate(
        [("grpo", {}), ("cal", {}), ("cal", {"singleton": "keep"})]
    ):
        samples = mc_samples(policy, 4, M, method, seed=10 + i, **options)
        ok, mean, se = _within(samples, grad)
        assert bool(ok.all()), (method, options, mean, grad, se)
    samples = mc_samples(policy, 4, M, "naive", seed=20)
    ok, mean, se = _within(samples, naive)
    assert bool(ok.all()), (mean, naive, se)
    # the bias is detected with a margin: the worst coordinate misses by > 10 standard errors
    miss = ((mean - grad).abs() / (se + 1e-12)).max()
    assert float(miss) > 10 * Z, float(miss)


def test_naive_points_the_wrong_way_on_the_counterexample():
    policy = TabularMultiAttempt.counterexample()
    samples = mc_samples(policy, 4, M, "naive", seed=3)
    mean, se = samples.mean(0), samples.std(0) / math.sqrt(M)
    # exact: naive +0.025 on θ_A, the gradient -0.065
    assert float(mean[0, 0]) > Z * float(se[0, 0])
    assert float(policy.exact_gradient()[0, 0]) < 0


def test_sampled_variance_matches_enumeration():
    policy = TabularMultiAttempt.counterexample()
    groups = policy.enumerate_groups(4)
    for i, method in enumerate(("grpo", "naive", "cal")):
        mean, var = exact_moments(policy, groups, method)
        samples = mc_samples(policy, 4, M // 2, method, seed=30 + i)
        sq = (samples - mean).square().sum(dim=(1, 2))
        se = float(sq.std()) / math.sqrt(M // 2)
        assert abs(float(sq.mean()) - var) <= Z * se, (method, float(sq.mean()), var, se)


def test_surrogate_loss_gradient_is_the_mean_estimate():
    policy = TabularMultiAttempt.random(3, 3, generator=torch.Generator().manual_seed(1))
    sample = policy.sample(6, 5, generator=torch.Generator().manual_seed(2))
    for method in ("grpo", "naive", "cal"):
        weights = compute_weights(sample.rollout, method)
        expected = policy.group_gradients(sample, weights).mean(0)
        # attempt log-probabilities
        logp = policy.log_probs(sample.states, sample.actions)
        loss = surrogate_loss(logp, weights)
        (grad,) = torch.autograd.grad(-loss, policy.logits, retain_graph=True)
        torch.testing.assert_close(grad, expected, atol=1e-14, rtol=0)
        # the same attempt split into two tokens plus -inf padding masked out
        tokens = torch.stack([0.3 * logp, 0.7 * logp, torch.full_like(logp, -math.inf)], -1)
        mask = torch.tensor([True, True, False]).expand_as(tokens)
        loss = surrogate_loss(tokens, weights, token_mask=mask)
        (grad,) = torch.autograd.grad(-loss, policy.logits)
        torch.testing.assert_close(grad, expected, atol=1e-14, rtol=0)


def test_attempts_not_made_are_ignored_even_if_non_finite():
    policy = TabularMultiAttempt.counterexample()
    sample = policy.sample(50, 4, generator=torch.Generator().manual_seed(0))
    weights = compute_weights(sample.rollout, "cal")
    assert not bool(weights.attempted.all())
    logp = policy.log_probs(sample.states, sample.actions)
    poisoned = torch.where(weights.attempted, logp, math.nan)
    (a,) = torch.autograd.grad(surrogate_loss(logp, weights), policy.logits, retain_graph=True)
    (b,) = torch.autograd.grad(surrogate_loss(poisoned, weights), policy.logits)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
