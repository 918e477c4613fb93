"""The solvers layer: everything that produces a candidate point.

Owns the forward entry and its batch fast path (`forward`), the fallback chain (`chain`: the
`FallbackChain` that runs, polishes and certifies the attempts; `attempts`: the attempts as
values; `backends`: the backend table, one record per backend, and the one qpsolvers attempt;
`routing`: which backend `"auto"` picks and on which arrays; `duals`: missing multipliers),
daqp through its own API (`daqp`), the compiled dual active-set solver and the lean-path kernels
(`dual_active_set`, `kernels`, numba) and the batched torch solver (`torch_driver`: the
detached solve and its polish; `torch_ipm`: the interior point; `torch_kkt`: its factorizations;
`torch_types`: its options record and results).

May import: `dxopt.qp.certify`, `dxopt.qp.problem`.
"""
