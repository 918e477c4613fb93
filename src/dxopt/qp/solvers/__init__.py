"""The solvers layer: everything that produces a candidate point.

Owns the backend adapters and the fallback chain (`forward`), daqp through its own API
(`daqp`), the compiled dual active-set solver and the lean-path kernels (`dual_active_set`,
`kernels`, numba) and the batched torch interior point (`torch_ipm`).

May import: `dxopt.qp.certify`, `dxopt.qp.problem`.
"""
