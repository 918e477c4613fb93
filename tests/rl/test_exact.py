"""Exact checks by enumeration: objective, gradient, and each estimator's mean and variance.

Every group of N complete rollouts is listed with its probability, so the estimators' means
and covariance traces below are exact sums, not samples: unbiasedness is an identity to
rounding, bias is a number.
"""

import itertools

import pytest
import torch

from dxopt.rl import TabularMultiAttempt, compute_weights

from ._helpers import exact_moments


def _random(num_answers=3, num_attempts=3, seed=0):
    return TabularMultiAttempt.random(
        num_answers, num_attempts, generator=torch.Generator().manual_seed(seed)
    )


def test_counterexample_closed_forms():
    policy = TabularMultiAttempt.counterexample()
    assert policy.verification_at_k().item() == pytest.approx(0.63, abs=1e-15)
    assert policy.pass_at_1().item() == pytest.approx(0.45, abs=1e-15)
    grad, naive = policy.exact_gradient(), policy.naive_mean()
    # dJ/dθ_A = π_A π_B (0.5 - (0.4 + 0.6 (π_C + 0.2 π_D))) = 0.25 (0.5 - 0.76)
    assert float(grad[0, 0]) == pytest.approx(-0.065, abs=1e-15)
    # the naive mean only sees first-attempt pass rates: 0.25 (0.5 - 0.4), the wrong sign
    assert float(naive[0, 0]) == pytest.approx(0.025, abs=1e-15)
    # on the last attempt there is no later credit to miss: both agree (0.25 * 0.6 * 0.8 / 2)
    torch.testing.assert_close(naive[2], grad[2])
    assert float(grad[2, 0]) == pytest.approx(0.5 * 0.6 * 0.25 * 0.8, abs=1e-15)


def test_objective_matches_enumeration_and_finite_differences():
    policy = _random(seed=1)
    single = policy.enumerate_groups(1)
    assert float(single.probabilities.sum()) == pytest.approx(1.0, abs=1e-12)
    solved = single.rollout.solved.reshape(-1)
    assert float((single.probabilities * solved).sum()) == pytest.approx(
        policy.verification_at_k().item(), abs=1e-12
    )
    grad = policy.exact_gradient()
    eps = 1e-6
    for s, a in itertools.product(range(policy.num_states), range(policy.num_answers)):
        with torch.no_grad():
            policy.logits[s, a] += eps
            up = policy.verification_at_k().item()
            policy.logits[s, a] -= 2 * eps
            down = policy.verification_at_k().item()
            policy.logits[s, a] += eps
        assert (up - down) / (2 * eps) == pytest.approx(float(grad[s, a]), abs=1e-9)


CASES = [
    pytest.param(TabularMultiAttempt.counterexample, 4, id="counterexample-N4"),
    pytest.param(lambda: _random(3, 3, seed=0), 2, id="random-A3K3-N2"),
    pytest.param(lambda: _random(2, 3, seed=2), 3, id="random-A2K3-N3"),
]


@pytest.mark.parametrize(("make", "n"), CASES)
def test_exact_means(make, n):
    policy = make()
    grad = policy.exact_gradient()
    groups = policy.enumerate_groups(n)
    unbiased = [
        ("grpo", {}),
        ("grpo", {"baseline": "none"}),
        ("cal", {}),
        ("cal", {"singleton": "keep"}),
        ("cal", {"baseline": "none"}),
    ]
    for method, options in unbiased:
        mean, _ = exact_moments(policy, groups, method, **options)
        torch.testing.assert_close(mean, grad, atol=1e-13, rtol=0, msg=f"{method} {options}")
    # GRPO's mean baseline (including the rollout itself) scales the gradient by (N-1)/N
    mean, _ = exact_moments(policy, groups, "grpo", baseline="mean")
    torch.testing.assert_close(mean, (n - 1) / n * grad, atol=1e-13, rtol=0)
    # naive: the same mean with a baseline from the other rollouts or none, not the gradient
    for baseline in ("loo", "none"):
        mean, _ = exact_moments(policy, groups, "naive", baseline=baseline)
        torch.testing.assert_close(mean, policy.naive_mean(), atol=1e-13, rtol=0)
    assert float((policy.naive_mean() - grad).abs().max()) > 0.02


@pytest.mark.parametrize(
    "options",
    [{"singleton": "zero"}, {"baseline": "mean"}, {"normalize_std": True}],
    ids=["singleton-zero", "mean-baseline", "std-normalised"],
)
def test_attempt_level_variants_that_are_biased(options):
    policy = TabularMultiAttempt.counterexample()
    weights_flag = compute_weights(policy.sample(1, 4).rollout, "cal", **options).unbiased
    assert not weights_flag
    mean, _ = exact_moments(policy, 4, "cal", **options)
    grad = policy.exact_gradient()
    scale = float((mean * grad).sum() / grad.square().sum())  # not even a rescaled gradient
    assert float((mean - scale * grad).norm()) > 1e-3


def test_singleton_zero_bias_matches_the_research_note():
    # counterexample, N = 4: the note reports 0.0545 against 0.060 on the C-logit (sigmoid
    # parametrisation: twice our softmax coordinate)
    policy = TabularMultiAttempt.counterexample()
    mean, _ = exact_moments(policy, 4, "cal", singleton="zero")
    assert 2 * float(mean[2, 0]) == pytest.approx(0.1093, abs=5e-4)
    assert 2 * float(policy.exact_gradient()[2, 0]) == pytest.approx(0.12, abs=1e-12)


def test_exact_variance_ordering():
    """Total variances E||ĝ - ∇J||² (exact): neither GRPO nor CAL dominates the other.

    Counterexample, N = 4: CAL with baseline 0 for singletons 0.0624 < GRPO 0.0630 < CAL
    0.0645 < naive 0.0660. Random 2-answer, 3-attempt tables, N = 3: GRPO < CAL (the
    attempt-level baseline is estimated from fewer rollouts), and naive may be above (seed 0)
    or below (seed 1) both - it estimates another vector.
    """
    policy = TabularMultiAttempt.counterexample()
    groups = policy.enumerate_groups(4)
    var = {m: exact_moments(policy, groups, m)[1] for m in ("grpo", "naive", "cal")}
    keep = exact_moments(policy, groups, "cal", singleton="keep")[1]
    assert keep < var["grpo"] < var["cal"] < var["naive"], (keep, var)

    for seed, naive_largest in [(0, True), (1, False)]:
        policy = _random(2, 3, seed=seed)
        groups = policy.enumerate_groups(3)
        var = {m: exact_moments(policy, groups, m)[1] for m in ("grpo", "naive", "cal")}
        assert var["grpo"] < var["cal"], var
        assert (var["naive"] > var["cal"]) is naive_largest, var

    # with N = 2 the attempt-level leave-one-out baseline is the other rollout's R when it
    # reached attempt k, else the trajectory fallback: CAL is GRPO exactly.
    policy = _random(3, 3, seed=0)
    groups = policy.enumerate_groups(2)
    a, b = exact_moments(policy, groups, "grpo"), exact_moments(policy, groups, "cal")
    torch.testing.assert_close(a[0], b[0], atol=1e-15, rtol=0)
    assert b[1] == pytest.approx(a[1], rel=1e-12)


def test_blended_baseline_is_unbiased_and_interpolates():
    policy = TabularMultiAttempt.counterexample()
    groups = policy.enumerate_groups(4)
    grad = policy.exact_gradient()
    moments = {}
    for beta in (0.0, 0.5, 1.0, torch.tensor([1.0, 0.3])):
        mean, var = exact_moments(policy, groups, "cal", singleton="keep", mix=beta)
        torch.testing.assert_close(mean, grad, atol=1e-13, rtol=0)
        moments[float(beta) if not isinstance(beta, torch.Tensor) else "vec"] = var
    assert moments[0.0] == pytest.approx(exact_moments(policy, groups, "grpo")[1], rel=1e-12)
    # the variance is a convex quadratic in β: the blend beats both ends here
    # (GRPO 0.0630, CAL-keep 0.0624, β = 0.5: 0.0589)
    assert moments[0.5] < min(moments[0.0], moments[1.0]) - 3e-3, moments
