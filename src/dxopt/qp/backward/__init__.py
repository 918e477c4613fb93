"""The backward layer: adjoint systems and the gradients of P, q, A, b, G, h.

Owns the backward methods (`base`: `BackwardBase`; `penalty`: `PenaltyBackward`; `kkt`:
`KKTBackward`; `smoothed`: `Smoothed`), the regular-adjoint ladder they share (`regular`),
their sparse and large dense variants (`penalty_sparse`, `dense_large`), the fallbacks for
equalities and the pseudo-inverse (`fallbacks`), the degenerate-gradient rule (`vertex`,
`vertex_batch`, its compiled simplex `vertex_simplex`, `degenerate_rule`, the weak-row Gram
blocks `gram_blocks`), one warnings collector (`notices`), the row accessors (`rows`:
`compress_rows`, `gather_rows`, the dense and sparse active rows), the KKT operator
(`adjoint`) and the parameter gradients from an adjoint solution (`grads`).

May import: `dxopt.qp.solvers`, `dxopt.qp.certify`, `dxopt.qp.problem`.
"""
