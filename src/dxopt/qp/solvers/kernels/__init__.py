"""The compiled (numba) kernels of the lean path (:mod:`dxopt.qp.api.small`,
:mod:`dxopt.qp.api.small_batch`), by concern: `certify` (the certificate of a solved point and
the accuracy of its active set), `adjoint` (the lean backward, the reused-factor adjoint rows,
the gradients) and `batch` (the checks before the solve and the loops over a batch). Each
kernel is one numba call, compiled with ``cache=True`` (:func:`dxopt.qp.warmup` compiles them
all up front).
"""
