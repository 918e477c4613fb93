"""The interleaving of benchmarks/qp_speed/run.py: every method timed once per round, in a
seeded order that changes from round to round."""

from __future__ import annotations

from benchmarks.qp_speed import run


def test_rounds_shuffle_the_order_and_time_every_method_each_round(monkeypatch) -> None:
    monkeypatch.setattr(run, "_MIN_BLOCK_S", 0.0)  # one call per block: the calls are the log
    log: list[str] = []

    def method(name: str):
        def call() -> str:
            log.append(name)
            return name

        return call

    names = ["a", "b", "c", "d"]
    secs, outs = run._rounds({n: method(n) for n in names}, 12)
    assert set(secs) == set(names) and all(s >= 0.0 for s in secs.values())
    assert outs == {n: n for n in names}
    warmup, timed = log[: 2 * len(names)], log[2 * len(names) :]
    assert warmup == [n for n in names for _ in range(2)]  # first call, then the block
    rounds = [timed[i : i + len(names)] for i in range(0, len(timed), len(names))]
    assert len(rounds) == 12 and all(sorted(r) == names for r in rounds)
    assert len({tuple(r) for r in rounds}) > 3  # the order changes from round to round
    firsts = {r[0] for r in rounds}
    assert len(firsts) >= 3  # no method is always first (right after the previous round)
    log.clear()
    run._rounds({n: method(n) for n in names}, 12)
    assert log[2 * len(names) :] == timed  # seeded: the same orders in every run
