"""The interleaving of benchmarks/qp_speed/run.py: every method timed once per round, in a
seeded order that changes from round to round, each fast method's block after a lead-in call
that is timed apart (a fake clock: each call advances it by the method's cost)."""

from __future__ import annotations

import pytest
from benchmarks.qp_speed import run


def _setup(monkeypatch, costs: dict[str, float]):
    clock = [0.0]
    log: list[str] = []
    monkeypatch.setattr(run.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(run, "_MIN_BLOCK_S", 5e-3)

    def method(name: str):
        def call() -> str:
            log.append(name)
            clock[0] += costs[name]
            return name

        return call

    return {name: method(name) for name in costs}, log


def test_rounds_shuffle_the_order_and_time_every_method_each_round(monkeypatch) -> None:
    names = ["a", "b", "c", "d"]
    fns, log = _setup(monkeypatch, dict.fromkeys(names, 1e-3))
    secs, outs, cold = run._rounds(fns, 12)
    assert secs == pytest.approx(dict.fromkeys(names, 1e-3))
    assert cold == pytest.approx(dict.fromkeys(names, 1e-3))
    assert outs == {n: n for n in names}
    warmup, timed = log[: 6 * len(names)], log[6 * len(names) :]
    assert warmup == [n for n in names for _ in range(6)]  # first call, then 5 ms of calls
    # each round: every method once, as a lead-in call and a block of 5 calls
    per_round = 6 * len(names)
    rounds = [timed[i : i + per_round] for i in range(0, len(timed), per_round)]
    assert len(rounds) == 12 and all(len(r) == per_round for r in rounds)
    orders = [r[::6] for r in rounds]
    assert all(r == [n for n in o for _ in range(6)] for r, o in zip(rounds, orders))
    assert all(sorted(o) == names for o in orders)
    assert len({tuple(o) for o in orders}) > 3  # the order changes from round to round
    assert len({o[0] for o in orders}) >= 3  # no method is always first
    log.clear()
    run._rounds(fns, 12)
    assert log[6 * len(names) :] == timed  # seeded: the same orders in every run


def test_slower_methods_single_calls_and_no_lead_in_past_50_ms(monkeypatch) -> None:
    costs = {"fast": 1e-3, "medium": 8e-3, "slow": 0.08}
    fns, log = _setup(monkeypatch, costs)
    secs, _, cold = run._rounds(fns, 5)
    assert secs == pytest.approx(costs)
    assert cold == pytest.approx({"fast": 1e-3, "medium": 8e-3})  # no lead-in past 50 ms
    timed = log[6 + 2 + 2 :]  # after the warm-ups (fast: 1 + 5 calls, the others: 1 + 1)
    assert timed.count("fast") == 5 * 6  # a lead-in call and a block of 5 a round
    assert timed.count("medium") == 5 * 2  # a lead-in call and one timed call a round
    assert timed.count("slow") == 5  # one timed call a round


def test_a_ratio_below_the_timer_noise_is_no_figure_not_a_pass():
    from benchmarks.qp_speed.run import _target

    assert _target("t", 0.5, 2.0)["verdict"] == "MET"
    assert _target("t", 3.0, 2.0)["verdict"] == "MISSED"
    for bad in (-0.04, 0.0, float("nan")):  # (fwd+bwd - fwd) / fwd from two noisy medians
        assert _target("t", bad, 2.0)["verdict"].startswith("NO FIGURE")
