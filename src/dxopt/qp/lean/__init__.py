"""The lean layer: the compiled small-problem engine behind the lean routes of `dxopt.qp.solve`.

Owns what the lean routes take (`lean_check`: the inputs, sizes and backward methods; the
backends are those whose entry in `dxopt.qp.solvers.backends` says `lean`), the
records the lean forwards hand to their backward (`records`: `SmallPoint`, `SmallBatch`), the
lean forward for one small dense problem (`small`, with its fused compiled calls in `fused`)
and its adjoint (`small_backward`), the
lean batch forward and backward (`small_batch`) and the autograd Function both routes share
(`small_function`: `SmallQPFunction`). Where the lean backward declines it builds the
general route's state itself (`dxopt.qp.autograd.state`). The runners that pick these routes
and hand a declined forward to the general route live in `dxopt.qp.api`.

May import: `dxopt.qp.autograd`, `dxopt.qp.backward`, `dxopt.qp.solvers`, `dxopt.qp.certify`,
`dxopt.qp.problem`.
"""
