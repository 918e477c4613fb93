"""The solvers layer: everything that produces a candidate point.

Owns the backend adapters and the fallback chain (`forward`), daqp through its own API
(`daqp`), the compiled dual active-set solver and the lean-path kernels (`dual_active_set`,
`kernels`, numba) and the batched torch solver (`torch_driver`: the
detached solve and its polish; `torch_ipm`: the interior point; `torch_kkt`: its factorizations;
`torch_types`: its results).

May import: `dxopt.qp.certify`, `dxopt.qp.problem`.
"""
