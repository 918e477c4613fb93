"""The certify layer: is a point a solution, which rows are active, which depend on others.

Owns every numeric tolerance of `dxopt.qp` (`tolerances`), the active set (`active`), the
polish step and the KKT certificate of a candidate point (`polish`), the multiplier selection
at degenerate points (`multipliers`), the checked infeasibility/unboundedness certificates and
failure messages (`certificates`), the detection of dependent active rows (`dependence`) and
the certificate and infeasibility test of the torch device path (`torch_certify`, with the
small batched tensor helpers it shares with the torch solver, `torch_ops`).

May import: `dxopt.qp.problem` (and `dxopt._core`, `dxopt.linalg`, third-party code).
"""
