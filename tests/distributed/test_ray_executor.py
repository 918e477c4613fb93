"""RayExecutor against the local path on a real 2-CPU local Ray cluster.

Every comparison is with ``dxopt.qp.solve(..., executor=None)`` on the same data: ``x``, the
duals, the per-sample status and the gradient of every input (batched and broadcast) must
agree to 1e-12.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch

import dxopt.qp as dqp
from dxopt.distributed import RayExecutor

SRC = str(Path(__file__).resolve().parents[2] / "src")
TOL = 1e-12


@pytest.fixture(scope="module")
def cluster():
    env = {
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": env},
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def executor(cluster):
    ex = RayExecutor(
        num_workers=2, chunk_size=3, max_stored_chunks=4, num_cpus_per_worker=0.5
    ).start()
    yield ex
    ex.shutdown()


def make_batch(B: int = 11, n: int = 5, *, infeasible=(2, 7), seed: int = 0):
    """Batched P, q, A, b, h and a broadcast G (box rows): some samples ask for
    ``sum(x) = 2n`` with ``|x_i| <= 1``, which is infeasible."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    M = torch.randn(B, n, n, generator=g, dtype=dt)
    P = M @ M.transpose(-1, -2) / n + 0.5 * torch.eye(n, dtype=dt)
    q = 2.0 * torch.randn(B, n, generator=g, dtype=dt)
    A = 1.0 + 0.1 * torch.rand(B, 1, n, generator=g, dtype=dt)
    b = 0.3 * torch.randn(B, 1, generator=g, dtype=dt)
    for i in infeasible:
        b[i] = 2.0 * n
    G = torch.cat([torch.eye(n, dtype=dt), -torch.eye(n, dtype=dt)])
    h = 0.5 + torch.rand(B, 2 * n, generator=g, dtype=dt)
    return {"P": P, "q": q, "A": A, "b": b, "G": G, "h": h}


def run(data, executor, *, loss_seed: int = 1, **options):
    """Solve, backpropagate a random linear loss of x and the duals; return the pieces."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in data.items()}
    sol = dqp.solve(**leaves, executor=executor, **options)
    g = torch.Generator().manual_seed(loss_seed)
    loss = 0.0
    for t in (sol.x, sol.eq_duals, sol.ineq_duals, sol.lb_duals, sol.ub_duals):
        if t is not None:
            w = torch.randn(t.shape, generator=g, dtype=t.dtype)
            loss = loss + (w * torch.nan_to_num(t)).sum()
    loss.backward()
    return sol, {k: v.grad for k, v in leaves.items()}


def assert_same(sol_r, grads_r, sol_l, grads_l):
    assert sol_r.status == sol_l.status
    for name in ("x", "eq_duals", "ineq_duals", "lb_duals", "ub_duals"):
        a, b = getattr(sol_r, name), getattr(sol_l, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype, name
            torch.testing.assert_close(a, b, atol=TOL, rtol=0, equal_nan=True, msg=name)
    assert sol_r.info.primal_residual == pytest.approx(sol_l.info.primal_residual, nan_ok=True)
    assert set(grads_r) == set(grads_l)
    for name, g in grads_l.items():
        assert g is not None and grads_r[name] is not None, name
        assert grads_r[name].shape == g.shape, name
        torch.testing.assert_close(grads_r[name], g, atol=TOL, rtol=0, msg=f"grad {name}")


def test_import_dxopt_does_not_import_ray():
    code = (
        "import sys, dxopt, dxopt.qp, dxopt.distributed; "
        "from dxopt.distributed import RayExecutor; RayExecutor(num_workers=1); "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_size": 0}, "chunk_size"),
        ({"num_workers": 0}, "num_workers"),
        ({"num_workers": 1.5}, "num_workers"),
        ({"max_inflight": -1}, "max_inflight"),
        ({"num_cpus_per_worker": 0}, "num_cpus_per_worker"),
        ({"start_timeout": 0}, "start_timeout"),
    ],
)
def test_bad_options_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RayExecutor(**kwargs)


def test_executor_must_be_an_executor():
    data = make_batch(B=2, infeasible=())
    with pytest.raises(TypeError, match="executor: expected None or an executor"):
        dqp.solve(**data, executor=object())


def test_no_room_for_the_actors_is_a_clear_error(cluster):
    ex = RayExecutor(num_workers=1, num_cpus_per_worker=3, start_timeout=2)
    with pytest.raises(RuntimeError, match="0 of 1 new actors came up"):
        ex.start()
    assert ex.workers == ()


def test_workers_import_this_dxopt(executor):
    import dxopt

    info = ray.get([w.describe.remote() for w in executor.workers])
    assert {i["dxopt"] for i in info} == {dxopt.__file__}
    assert len({i["pid"] for i in info}) == 2 and all(i["threads"] == 1 for i in info)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_matches_local_with_infeasible_samples(executor, backward):
    data = make_batch()
    sol_l, grads_l = run(data, None, backward=backward, on_failure="nan")
    sol_r, grads_r = run(data, executor, backward=backward, on_failure="nan")
    assert [s.ok for s in sol_l.status].count(False) == 2  # samples 2 and 7
    assert_same(sol_r, grads_r, sol_l, grads_l)
    bl, br = sol_l.info.backward, sol_r.info.backward
    assert br.method == bl.method and br.n_active == bl.n_active and br.licq == bl.licq
    # the graphs were freed by the backward
    assert sum(ray.get([w.stored.remote() for w in executor.workers])) == 0


def test_broadcast_inputs_and_bounds(executor):
    """Unbatched P, A, b, G with batched q, h and box bounds: broadcast gradients are sums."""
    data = make_batch(B=8, infeasible=())
    data = {
        "P": data["P"][0],
        "q": data["q"],
        "A": data["A"][0],
        "b": data["b"][0],
        "G": data["G"][:3],
        "h": data["h"][:, :3],
    }
    n = data["q"].shape[-1]
    data["lb"] = -0.4 * torch.ones(n, dtype=torch.float64)
    data["ub"] = 0.3 + 0.2 * torch.rand(8, n, dtype=torch.float64)
    sol_l, grads_l = run(data, None)
    sol_r, grads_r = run(data, executor)
    assert sol_l.lb_duals is not None and all(s.ok for s in sol_l.status)
    assert_same(sol_r, grads_r, sol_l, grads_l)


def test_unbatched_call(executor):
    data = {k: v[0] for k, v in make_batch(infeasible=()).items() if k != "G"}
    data["G"] = make_batch()["G"]
    sol_l, grads_l = run(data, None)
    sol_r, grads_r = run(data, executor)
    assert sol_r.x.shape == (5,)
    assert_same(sol_r, grads_r, sol_l, grads_l)


def test_float32_inputs(executor):
    """float32 in, float32 out; the broadcast G's gradient is summed per chunk and then over
    chunks, so it differs from the local sum by float32 rounding only."""
    data = {k: v.float() for k, v in make_batch(B=7, infeasible=(3,)).items()}
    sol_l, grads_l = run(data, None, on_failure="nan")
    sol_r, grads_r = run(data, executor, on_failure="nan")
    assert sol_r.x.dtype == torch.float32 and grads_r["G"].dtype == torch.float32
    torch.testing.assert_close(grads_r.pop("G"), grads_l.pop("G"), rtol=1e-5, atol=1e-6)
    assert_same(sol_r, grads_r, sol_l, grads_l)


def test_on_failure_raise_names_global_indices(executor):
    data = make_batch()
    with pytest.raises(dqp.QPSolveError) as err:
        dqp.solve(**data, executor=executor)
    assert err.value.failed_indices == (2, 7)
    assert sum(ray.get([w.stored.remote() for w in executor.workers])) == 0


def test_bad_input_raises_original_error(executor):
    data = make_batch()
    data["q"] = data["q"][:, :4]
    with pytest.raises(ValueError):
        dqp.solve(**data, executor=executor)


def wait_dead(actor, timeout: float = 60.0) -> None:
    """``ray.kill`` the actor and wait until calls to it fail (the kill is asynchronous)."""
    ray.kill(actor)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.stored.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


@contextlib.contextmanager
def configured(ex: RayExecutor, **attrs):
    """Temporarily change per-call settings of the shared executor; zero its counters."""
    saved = {k: getattr(ex, k) for k in attrs}
    for k, v in attrs.items():
        setattr(ex, k, v)
    ex.reset_stats()
    try:
        yield ex
    finally:
        for k, v in saved.items():
            setattr(ex, k, v)


def test_kill_worker_mid_run_retries_and_backward_resolves(executor):
    """Kill one worker when the first chunk comes back: its queued chunks are solved again on
    the other/restarted worker, and the chunks whose graphs died with it are re-solved for
    the backward; everything still equals the local path."""
    killed = []

    def kill_first(done, total):
        if not killed:
            killed.append(executor.workers[0])
            ray.kill(executor.workers[0])

    data = make_batch(B=16)
    sol_l, grads_l = run(data, None, on_failure="nan")
    with configured(executor, chunk_size=2, progress=kill_first) as ex:
        sol_r, grads_r = run(data, ex, on_failure="nan")
        assert killed and ex.stats.retried_chunks >= 1 and ex.stats.restarted_workers == 1
        assert ex.stats.failed_chunks == 0
    assert_same(sol_r, grads_r, sol_l, grads_l)


def test_worker_dying_twice_marks_samples_failed(executor):
    data = make_batch(infeasible=())
    sol_l, grads_l = run(data, None, on_failure="nan")
    # the worker that takes chunk 1 exits, on both attempts; one chunk in flight per worker
    with configured(executor, _crash_chunks=frozenset({1}), max_inflight=1) as ex:
        sol_r, grads_r = run(data, ex, on_failure="nan")
        assert ex.stats.failed_chunks == 1 and ex.stats.retried_chunks == 1
        assert ex.stats.restarted_workers == 2
        # an unbatched call (one chunk) whose worker dies twice: nothing came back
        ex._crash_chunks = frozenset({0})
        one = {k: v[0] if v.ndim == 3 or k in "qbh" else v for k, v in data.items()}
        with pytest.raises(dqp.QPSolveError, match="lost with their Ray workers") as err:
            dqp.solve(**one, executor=ex)
        assert err.value.failed_indices == (0,) and err.value.status == (dqp.QPStatus.FAILED,)
    lost = slice(3, 6)
    assert all(s is dqp.QPStatus.FAILED for s in sol_r.status[lost])
    assert torch.isnan(sol_r.x[lost]).all()
    keep = [i for i in range(11) if not 3 <= i < 6]
    assert [sol_r.status[i] for i in keep] == [sol_l.status[i] for i in keep]
    torch.testing.assert_close(sol_r.x[keep], sol_l.x[keep], atol=TOL, rtol=0)
    for name in ("P", "q", "A", "b", "h"):  # batched: zero for the lost samples
        assert (grads_r[name][lost] == 0).all()
        torch.testing.assert_close(grads_r[name][keep], grads_l[name][keep], atol=TOL, rtol=0)


def test_dead_owner_and_evicted_graphs_are_resolved_in_backward(executor):
    """12 one-sample chunks on 2 workers that keep at most 4 graphs each (the others are
    evicted), then one worker dies before the backward; all of these are re-solved."""
    data = make_batch(B=12)
    sol_l, grads_l = run(data, None, on_failure="nan")
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in data.items()}
    with configured(executor, chunk_size=1) as ex:
        sol = dqp.solve(**leaves, executor=ex, on_failure="nan")
        kept = ray.get([w.stored.remote() for w in ex.workers])
        assert max(kept) == 4 and sum(kept) < 12
        wait_dead(ex.workers[1])
        g = torch.Generator().manual_seed(1)
        loss = 0.0
        for t in (sol.x, sol.eq_duals, sol.ineq_duals):
            w = torch.randn(t.shape, generator=g, dtype=t.dtype)
            loss = loss + (w * t.nan_to_num()).sum()
        loss.backward()
        # the evicted graphs (12 - sum(kept)) and the dead worker's kept[1]
        assert ex.stats.resolved_in_backward == 12 - kept[0]
    assert_same(sol, {k: v.grad for k, v in leaves.items()}, sol_l, grads_l)


def test_graphs_of_calls_never_backpropagated_are_freed(executor):
    data = {k: v.requires_grad_(True) for k, v in make_batch(infeasible=()).items()}
    gc.collect()

    def stored():
        return sum(ray.get([w.stored.remote() for w in executor.workers]))

    before = stored()
    sol = dqp.solve(**data, executor=executor)
    assert stored() == before + 4  # 4 chunks kept
    del sol
    gc.collect()
    assert stored() == before
    with torch.no_grad():  # nothing is kept when no gradient can be asked for
        dqp.solve(**data, executor=executor)
    assert stored() == before


def test_qplayer_with_executor(executor):
    data = make_batch(infeasible=())
    layer = dqp.QPLayer(backward="kkt", executor=executor)
    torch.testing.assert_close(
        layer(**data).x, dqp.solve(**data, backward="kkt").x, atol=TOL, rtol=0
    )


def test_example_trains_and_matches_local_gradient(executor, capsys):
    from examples.ray_qp import run as example

    out = example.run(batch=40, n=8, k=3, steps=3, workers=2, chunk_size=10, executor=executor)
    assert out["grad_check"] <= TOL
    assert out["history"][0] == pytest.approx(out["uniform"], abs=1e-9)  # W = 0: x = 1/n
    assert min(out["history"][1:]) < out["history"][0]
    assert "max |grad difference|" in capsys.readouterr().out


def test_benchmark_quick_measurement(executor, tmp_path):
    from benchmarks.qp_ray import run as bench

    measured = bench.measure(60, 10, 20, 5, 1, executor=executor)
    assert (executor.num_workers, executor.chunk_size) == (2, 3)  # settings restored
    rows = measured["rows"]
    assert [r["workers"] for r in rows] == [0, 1, 2]
    assert all(r["solved"] == 60 and r["qps_per_s"] > 0 for r in rows)
    assert all(r["max_diff_vs_local"] <= TOL for r in rows[1:])
    assert rows[1]["scaling_efficiency"] == pytest.approx(1.0)
    payload = {
        "command": "test", "batch": 60, "n": 10, "chunk_size": 20,
        "info": bench.machine_info(), "load": {"start": 0.0, "end": 0.0}, **measured,
        "projection": bench.projection(1e-3, 5e-3, 1e-3, 0.0, 10),
    }  # fmt: skip
    proj = payload["projection"]
    assert len(proj) == 6 and all(p["total_s"] >= max(p["workers_s"], p["driver_s"]) for p in proj)
    # 1e7 QPs x 1 ms on 100 workers, chunks of 1000: 100 s of solving + 100 chunks x 5 ms
    assert proj[0]["workers_s"] == pytest.approx(1e7 / 100 * 1e-3 + 1e4 / 100 * 5e-3)
    # the driver: 1e4 chunks x (1 ms + 1000 QPs x 4 (10 + 10 + 5) 8 bytes at 1.25 GB/s)
    assert proj[0]["driver_s"] == pytest.approx(1e4 * (1e-3 + 1000 * 800 / 1.25e9))
    text = bench.report(payload)
    assert text.startswith("## QP batches on Ray") and "Target: 2 workers" in text
    bench.plot(payload, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_readme_example_output_matches(executor):
    """docs/readme/distributed.md's example prints its documented output (on this module's
    cluster: its ``ray.init`` line is skipped and the shared executor's actors are stopped to
    leave the CPUs to the example's own executor)."""
    readme = Path(__file__).resolve().parents[2] / "docs" / "readme" / "distributed.md"
    text = readme.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    output = re.search(r"Output:\n\n```text\n(.*?)```", text, re.S)
    assert code is not None and output is not None
    source = re.sub(r"^ray\.init\(.*$", "pass", code.group(1), flags=re.M)
    assert source != code.group(1)
    executor.shutdown()  # restarted on its next use
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(source, str(readme), "exec"), {"__name__": "readme_example"})
    assert buffer.getvalue() == output.group(1)


def wait_cpus_free(total: float = 2.0, timeout: float = 60.0) -> float:
    """Seconds until the cluster reports all ``total`` CPUs free (``ray.kill`` is asynchronous,
    so the resources of a killed actor come back a moment later)."""
    t0 = time.monotonic()
    while ray.available_resources().get("CPU", 0.0) < total:
        if time.monotonic() - t0 > timeout:
            raise AssertionError(
                f"CPUs still held after {timeout:g} s: {ray.available_resources()} (leaked actors)"
            )
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.mark.slow  # ten actor starts: about 40 s on an idle 2-core machine
def test_ten_executors_in_a_row_free_their_actors(executor):
    """Issue 28 item 7. Ten executors opened and closed in a row in one process, on one
    ``ray.init``; each asks for the whole 2-CPU cluster (one actor of 2 CPUs: the test pays
    ten actor starts, each a fresh process importing torch and dxopt), so an actor left
    behind by the previous executor keeps the next from starting (``start_timeout``). Every
    other executor is backpropagated only after its ``with`` block has exited, the case that
    leaked before (the backward restarted the actors and nobody stopped them): that backward
    must start nothing, re-solve on the driver, and give the local path's gradients."""
    executor.shutdown()  # leave the cluster's 2 CPUs to the executors below (last test here)
    wait_cpus_free()
    data = make_batch(B=6, infeasible=(2,))  # sample 2 is infeasible: NaN there, zero gradient
    local = {k: v.detach().clone().requires_grad_(True) for k, v in data.items()}
    sol_l = dqp.solve(**local, on_failure="nan")
    g = torch.Generator().manual_seed(1)
    weights = {n: torch.randn(getattr(sol_l, n).shape, generator=g, dtype=torch.float64)
               for n in ("x", "eq_duals", "ineq_duals")}  # fmt: skip

    def loss_of(sol):
        return sum((w * getattr(sol, n).nan_to_num()).sum() for n, w in weights.items())

    loss_of(sol_l).backward()
    for i in range(10):
        after_exit = i % 2 == 0  # the first one already: the old code failed there
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in data.items()}
        with RayExecutor(
            num_workers=1, chunk_size=3, num_cpus_per_worker=2.0, start_timeout=60
        ) as ex:
            sol = dqp.solve(**leaves, executor=ex, on_failure="nan")
            if not after_exit:
                loss_of(sol).backward()
        assert ex.workers == ()
        if after_exit:
            loss_of(sol).backward()  # after the block: nothing restarts
            assert ex.workers == ()
            assert ex.stats.resolved_on_driver == 2 and ex.stats.resolved_in_backward == 0
        else:
            assert ex.stats.resolved_on_driver == 0
        assert sol.status == sol_l.status
        for name, leaf in local.items():
            assert leaf.grad is not None and leaves[name].grad is not None
            torch.testing.assert_close(
                leaves[name].grad, leaf.grad, atol=TOL, rtol=0, msg=f"{i}: {name}"
            )
    wait_cpus_free()  # and nothing is left behind by the last one
