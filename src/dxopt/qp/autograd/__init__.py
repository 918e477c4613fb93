"""The autograd layer: where torch meets the solver and the backward.

Owns the module-level `torch.autograd.Function`s (`function`: `QPFunction`; `torch_function`:
`TorchQPFunction`), the general route's state from plain tensors (`state`: `forward_state`,
`rebuilt_state`, `residuals`; the lean backward calls them where it declines), the pieces of
the vjp (`vjp`: `adjoint_input`, `run_adjoint`, `gradients_from_adjoint`), forward mode and
the torch.func glue (`tangent`) and the entry points of the torch device path
(`torch_entry`).

May import: `dxopt.qp.backward`, `dxopt.qp.solvers`, `dxopt.qp.certify`, `dxopt.qp.problem`.
"""
