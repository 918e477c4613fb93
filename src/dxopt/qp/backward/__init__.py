"""The backward layer: adjoint systems and the gradients of P, q, A, b, G, h.

Owns the backward methods (`base`: `BackwardBase`; `penalty`: `PenaltyBackward`; `kkt`:
`KKTBackward`), their sparse and large dense variants (`penalty_sparse`, `dense_large`), the
degenerate-gradient rule (`vertex`, `degenerate_rule`), the row accessors (`rows`), the KKT
operator (`adjoint`) and the parameter gradients from an adjoint solution (`grads`).

May import: `dxopt.qp.solvers`, `dxopt.qp.certify`, `dxopt.qp.problem`.
"""
