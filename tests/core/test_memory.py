"""The host buffer pool: a set is handed out again only when nothing references it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dxopt._core import memory
from dxopt._core.memory import MAX_BYTES, MAX_SET_BYTES, held_bytes, host_buffers


@pytest.fixture(autouse=True)
def _empty_pool():
    memory.release_host_buffers()
    yield
    memory.release_host_buffers()


SPECS = [((64, 32), np.float64), ((7,), np.int64)]


def _ptrs(arrays):
    return tuple(a.__array_interface__["data"][0] for a in arrays)


def test_a_set_nobody_references_is_handed_out_again():
    first = _ptrs(host_buffers(SPECS))  # the tuple and its arrays are gone after this line
    again = host_buffers(SPECS)
    assert _ptrs(again) == first
    assert [a.shape for a in again] == [(64, 32), (7,)]
    assert again[0].dtype == np.float64 and again[1].dtype == np.int64


@pytest.mark.parametrize("hold", ["array", "view", "tensor", "tensor view", "tuple", "numpy()"])
def test_a_set_in_use_is_never_handed_out_twice(hold):
    buffers = host_buffers(SPECS)
    a = buffers[0]
    a[:] = 1.0
    base = _ptrs([a])[0]
    keep: object
    if hold == "array":
        keep = a
    elif hold == "view":
        keep = a[3:5]
    elif hold == "tensor":
        keep = torch.from_numpy(a)
    elif hold == "tensor view":
        keep = torch.from_numpy(a)[1].unsqueeze(0)
    elif hold == "tuple":
        keep = buffers
    else:
        keep = torch.from_numpy(a).numpy()
    del a, buffers
    for _ in range(3):  # pooled or fresh, never the held one
        other = host_buffers(SPECS)
        assert _ptrs(other)[0] != base
        other[0][:] = -1.0
        del other
    kept = np.asarray(keep[0] if hold == "tuple" else keep)
    assert (kept == 1.0).all()  # nobody wrote into memory that is still in use
    del keep, kept
    assert _ptrs(host_buffers(SPECS))[0] == base  # released: handed out again


def test_the_pool_keeps_bounded_sets():
    big = [((MAX_SET_BYTES // 8 + 1,), np.float64)]
    host_buffers(big)
    assert held_bytes() == 0  # larger than a set may be: handed out, not kept
    for k in range(12):  # 12 shapes of 32 MiB: at most MAX_BYTES kept, the newest ones
        host_buffers([((4 << 20,), np.float64), ((k + 1,), np.float64)])
    assert 0 < held_bytes() <= MAX_BYTES
    import dxopt

    dxopt.release_host_buffers()  # the public name
    assert held_bytes() == 0


def test_a_kept_gradient_is_never_overwritten_by_a_later_backward():
    """A pooled gradient (the general path's dense P gradient, n = 400: 1.28 MB) that the
    user keeps stays intact; once dropped, its memory serves the next backward."""
    import dxopt.qp as dqp

    n = 400
    rng = np.random.default_rng(0)
    M = rng.standard_normal((n, n))
    P = torch.from_numpy(M @ M.T / n + np.eye(n)).requires_grad_()
    G = torch.from_numpy(rng.standard_normal((n // 2, n)))
    h = torch.ones(n // 2, dtype=torch.float64)
    w = torch.from_numpy(rng.standard_normal(n))

    def grad_of(q):
        P.grad = None
        sol = dqp.solve(P, q, G=G, h=h, check_psd=False)  # the general path
        (w * sol.x).sum().backward()
        return P.grad

    q1, q2 = (torch.from_numpy(rng.standard_normal(n)) for _ in range(2))
    kept = grad_of(q1)
    copy = kept.clone()
    second = grad_of(q2)
    assert second.data_ptr() != kept.data_ptr()
    assert torch.equal(kept, copy)
    assert not torch.equal(second, copy)
    ptrs = {kept.data_ptr(), second.data_ptr()}
    del kept, second
    third = grad_of(q1)
    assert third.data_ptr() in ptrs  # reused memory, same values as the first call
    assert torch.equal(third, copy)


def test_concurrent_backwards_never_share_a_buffer():
    """Threads differentiating at once (the general path's pooled gradients, n = 400) each
    get their own memory: every gradient equals the one computed alone."""
    import threading

    import dxopt.qp as dqp

    n = 400  # P's gradient: 1.28 MB, pooled
    rng = np.random.default_rng(1)
    M = rng.standard_normal((n, n))
    P0 = torch.from_numpy(M @ M.T / n + np.eye(n))
    G = torch.from_numpy(rng.standard_normal((n // 2, n)))
    h = torch.ones(n // 2, dtype=torch.float64)
    qs = [torch.from_numpy(rng.standard_normal(n)) for _ in range(4)]

    def grad_P(q):
        P = P0.clone().requires_grad_()
        sol = dqp.solve(P, q, G=G, h=h, check_psd=False)  # the general path
        (g,) = torch.autograd.grad(sol.x.sum(), P)
        return g

    alone = [grad_P(q).clone() for q in qs]
    kept: list[list[torch.Tensor]] = [[] for _ in qs]

    def work(i):
        for _ in range(3):
            kept[i].append(grad_P(qs[i]))  # kept to the end: their memory stays in use

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [float((g - alone[i]).abs().max() / alone[i].abs().max())
              for i in range(4) for g in kept[i]]  # fmt: skip
    assert len(errors) == 12 and max(errors) < 1e-10
    assert len({g.data_ptr() for gs in kept for g in gs}) == 12
