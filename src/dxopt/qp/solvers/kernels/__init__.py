"""The compiled (numba) kernels of the lean path (:mod:`dxopt.qp.lean.small`,
:mod:`dxopt.qp.lean.small_batch`), by concern: `certify` (the certificate of a solved point and
the accuracy of its active set), `adjoint` (the lean backward, the reused-factor adjoint rows,
the gradients) and `batch` (the checks before the solve and the loops over a batch). Each
kernel is one numba call, compiled with ``cache=True`` (:func:`dxopt.qp.warmup` compiles them
all up front).

numba keys a kernel's disk cache on its own file only: a kernel that calls a kernel of another
file (`batch` calls `certify` and `adjoint`; all call :mod:`dxopt.linalg.small` or the solver)
keeps the callee's old code until its own file changes. After editing a kernel, delete the
``__pycache__`` folders of :mod:`dxopt.qp.solvers` and :mod:`dxopt.linalg` (or
``$NUMBA_CACHE_DIR``); an installed package's files change together, so users are not affected.
"""
