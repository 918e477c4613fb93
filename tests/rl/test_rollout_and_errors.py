"""The rollout record, the weights' bookkeeping and the error messages."""

import pytest
import torch

from dxopt.rl import (
    MultiAttemptRollout,
    RLTypeError,
    RLValueError,
    TabularMultiAttempt,
    compute_weights,
    surrogate_loss,
)

# group of 3 rollouts, K = 3: solved at attempt 2, at attempt 1, never
REWARDS = torch.tensor([[[0, 1, 0], [1, 0, 0], [0, 0, 0]]], dtype=torch.float64)


def test_rollout_record():
    ro = MultiAttemptRollout(REWARDS)
    assert ro.shape == (1, 3, 3)
    assert ro.attempted.tolist() == [[[True, True, False], [True, False, False], [True] * 3]]
    assert ro.num_attempts.tolist() == [[2, 1, 3]]
    assert ro.solved.tolist() == [[1.0, 1.0, 0.0]]
    assert ro.verification_at_k() == pytest.approx(2 / 3)
    assert ro.pass_at_1() == pytest.approx(1 / 3)
    c = ro.counts()
    assert (c.groups, c.rollouts, c.attempts, c.solved, c.first_attempt_solved) == (1, 3, 6, 2, 1)
    # bool rewards are accepted and stored in the default float dtype
    assert MultiAttemptRollout(REWARDS.bool()).rewards.dtype == torch.get_default_dtype()


def test_weights_by_hand():
    ro = MultiAttemptRollout(REWARDS)
    # GRPO, leave-one-out over R = (1, 1, 0): R_i - mean of the others
    w = compute_weights(ro, "grpo").weights[0]
    assert w.tolist() == [[0.5, 0.5, 0.0], [0.5, 0.0, 0.0], [-1.0, -1.0, -1.0]]
    # naive: attempt 1 members all three, r = (0, 1, 0); attempt 2 members {0, 2}, r = (1, 0);
    # attempt 3 member {2} only: a singleton, fallback over the whole group, r_3 = (0, 0, 0)
    w = compute_weights(ro, "naive").weights[0]
    assert w.tolist() == [[-0.5, 1.0, 0.0], [1.0, 0.0, 0.0], [-0.5, -1.0, 0.0]]
    # CAL: attempt 1 as GRPO; attempt 2 among {0, 2} with R = (1, 0); attempt 3 singleton,
    # fallback to the trajectory leave-one-out mean of R over {0, 1} = 1
    cal = compute_weights(ro, "cal")
    assert cal.weights[0].tolist() == [[0.5, 1.0, 0.0], [0.5, 0.0, 0.0], [-1.0, -1.0, -1.0]]
    assert cal.singletons == 1 and cal.unbiased
    keep = compute_weights(ro, "cal", singleton="keep").weights[0]
    assert keep[2].tolist() == [-1.0, -1.0, 0.0]
    assert compute_weights(ro, "cal", singleton="zero").weights[0, 2, 2] == 0
    flags = {
        (m, b, s, std): compute_weights(ro, m, baseline=b, singleton=s, normalize_std=std).unbiased
        for m in ("grpo", "naive", "cal")
        for b in ("loo", "mean", "none")
        for s in ("trajectory", "keep", "zero")
        for std in (False, True)
    }
    unbiased = {k for k, v in flags.items() if v}
    expected = {
        (m, b, s, False)
        for m in ("grpo", "cal")
        for b in ("loo", "none")
        for s in ("trajectory", "keep", "zero")
        if not (m == "cal" and s == "zero")
    }
    assert unbiased == expected


def test_std_normalisation_matches_grpo_formula():
    ro = MultiAttemptRollout(REWARDS)
    w = compute_weights(ro, "grpo", baseline="mean", normalize_std=True, eps=1e-12).weights
    r = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    adv = (r - r.mean()) / r.std(unbiased=False)
    torch.testing.assert_close(w[0, :, 0], adv)


@pytest.mark.parametrize(
    ("rewards", "match"),
    [
        (torch.zeros(3, 2), "groups, group_size, attempts"),
        (torch.zeros(0, 2, 2), "non-empty"),
        (torch.full((1, 2, 2), 0.5), "hard verifier rewards"),
        (torch.tensor([[[1.0, 1.0]]]), "after its first success"),
    ],
)
def test_rollout_value_errors(rewards, match):
    with pytest.raises(RLValueError, match=match):
        MultiAttemptRollout(rewards)


def test_type_and_option_errors():
    with pytest.raises(RLTypeError, match=r"rewards: expected a torch\.Tensor"):
        MultiAttemptRollout([[[0, 1]]])  # type: ignore[arg-type]
    ro = MultiAttemptRollout(REWARDS)
    with pytest.raises(RLTypeError, match="rollout: expected"):
        compute_weights(REWARDS, "cal")  # type: ignore[arg-type]
    with pytest.raises(RLValueError, match="method: expected one of"):
        compute_weights(ro, "reinforce")  # type: ignore[arg-type]
    with pytest.raises(RLValueError, match="baseline: expected one of"):
        compute_weights(ro, "cal", baseline="median")  # type: ignore[arg-type]
    with pytest.raises(RLValueError, match="eps"):
        compute_weights(ro, "cal", eps=0.0)
    assert issubclass(RLValueError, ValueError) and issubclass(RLTypeError, TypeError)


def test_loss_errors():
    ro = MultiAttemptRollout(REWARDS)
    w = compute_weights(ro, "cal")
    with pytest.raises(RLTypeError, match="weights: expected"):
        surrogate_loss(torch.zeros(1, 3, 3), w.weights)  # type: ignore[arg-type]
    with pytest.raises(RLValueError, match="log_probs: expected the weights' shape"):
        surrogate_loss(torch.zeros(1, 3, 2), w)
    with pytest.raises(RLValueError, match="must start with"):
        surrogate_loss(torch.zeros(1, 2, 3, 4), w)
    with pytest.raises(RLValueError, match="token_mask: only meaningful"):
        surrogate_loss(torch.zeros(1, 3, 3), w, token_mask=torch.ones(1, 3, 3, dtype=torch.bool))
    with pytest.raises(RLValueError, match="token_mask: expected the shape"):
        surrogate_loss(torch.zeros(1, 3, 3, 2), w, token_mask=torch.ones(1, 3, 3, dtype=torch.bool))
    with pytest.raises(RLTypeError, match="log_probs: expected a floating"):
        surrogate_loss(torch.zeros(1, 3, 3, dtype=torch.long), w)


def test_tabular_errors():
    with pytest.raises(RLValueError, match="expected 7 rows"):
        TabularMultiAttempt(torch.rand(5, 2, dtype=torch.float64), 3)
    with pytest.raises(RLValueError, match="num_attempts"):
        TabularMultiAttempt(torch.rand(1, 2), 0)
    with pytest.raises(RLValueError, match=r"\[0, 1\]"):
        TabularMultiAttempt(torch.full((3, 2), 2.0), 2)
    with pytest.raises(RLValueError, match="group_size"):
        TabularMultiAttempt.counterexample().sample(2, 0)


def test_mix_option():
    ro = MultiAttemptRollout(REWARDS)
    cal, grpo = compute_weights(ro, "cal").weights, compute_weights(ro, "grpo").weights
    half = compute_weights(ro, "cal", mix=0.5)
    torch.testing.assert_close(half.weights, 0.5 * cal + 0.5 * grpo)
    assert half.unbiased and float(half.mix) == 0.5
    per = compute_weights(ro, "cal", mix=[1.0, 0.0, 1.0]).weights
    torch.testing.assert_close(per[..., 1], grpo[..., 1])
    torch.testing.assert_close(per[..., 2], cal[..., 2])
    with pytest.raises(RLValueError, match="only the 'cal' method"):
        compute_weights(ro, "grpo", mix=0.5)
    with pytest.raises(RLValueError, match="one per attempt"):
        compute_weights(ro, "cal", mix=[0.5, 0.5])
    with pytest.raises(RLValueError, match="finite"):
        compute_weights(ro, "cal", mix=float("nan"))
    with pytest.raises(RLTypeError, match="mix"):
        compute_weights(ro, "cal", mix=True)


def test_batched_exact_verification_matches_the_class():
    from dxopt.rl import exact_verification_at_k

    policies = [
        TabularMultiAttempt.random(3, 2, generator=torch.Generator().manual_seed(s))
        for s in range(3)
    ]
    probs = torch.stack([p.probs() for p in policies])
    success = torch.stack([p.success for p in policies])
    batched = exact_verification_at_k(probs, success, 2)
    expected = torch.stack([p.verification_at_k() for p in policies])
    torch.testing.assert_close(batched, expected)
    with pytest.raises(RLValueError, match="history states"):
        exact_verification_at_k(probs, success, 3)


def test_errors_are_dxopt_input_errors_raised_by_the_shared_validators():
    from dxopt import DxoptError

    assert issubclass(RLValueError, DxoptError) and issubclass(RLTypeError, DxoptError)
    # the shared validators' messages, re-raised as the rl classes
    with pytest.raises(RLValueError, match=r"num_groups: expected an integer >= 1, got True"):
        TabularMultiAttempt.counterexample().sample(True, 2)  # type: ignore[arg-type]
    with pytest.raises(RLValueError, match=r"singleton: expected one of 'trajectory'"):
        compute_weights(MultiAttemptRollout(REWARDS), "cal", singleton="drop")  # type: ignore[arg-type]
    with pytest.raises(RLValueError, match=r"eps: expected a positive finite number, got inf"):
        compute_weights(MultiAttemptRollout(REWARDS), "cal", eps=float("inf"))


def test_tabular_refuses_nan_tables_and_bad_logits():
    # a NaN pass probability slipped through the [0, 1] test before (NaN compares false)
    success = torch.tensor([[0.5, float("nan")], [0.1, 0.2], [0.3, 0.4]], dtype=torch.float64)
    with pytest.raises(RLValueError, match="success: expected finite values"):
        TabularMultiAttempt(success, 2)
    ok = torch.full((3, 2), 0.5, dtype=torch.float64)
    with pytest.raises(RLValueError, match=r"logits: expected shape \(3, 2\), got \(2, 2\)"):
        TabularMultiAttempt(ok, 2, logits=torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(RLTypeError, match=r"logits: expected a torch\.Tensor, got list"):
        TabularMultiAttempt(ok, 2, logits=[[0.0, 0.0]] * 3)  # type: ignore[arg-type]
    from dxopt.rl import exact_verification_at_k

    with pytest.raises(RLTypeError, match="probs: expected a floating-point tensor"):
        exact_verification_at_k(torch.ones(3, 2, dtype=torch.long), ok, 2)
    with pytest.raises(RLValueError, match=r"num_attempts: expected an integer >= 1"):
        exact_verification_at_k(ok, ok, 0)
