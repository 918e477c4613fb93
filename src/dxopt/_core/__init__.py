"""The shared spine of dxopt: one status, one failure policy, one error base, one cost record,
the argument validators and the option vocabulary every subpackage uses.

Vocabulary (every public option in dxopt uses these names)
----------------------------------------------------------
- ``max_iter``: the number of iterations of an iterative solver or loop (CG, an inner loop,
  an outer loop, refinement rounds). A solver with a tolerance may stop earlier; a loop
  without one runs exactly ``max_iter`` iterations.
- ``tol``: the stopping tolerance of a loop; solvers that test a residual take ``rtol`` /
  ``atol`` (relative / absolute), as in :func:`dxopt.linalg.conjugate_gradient`.
- ``lr``: a step size. A *step* is one update of the optimized variables (``opt.step()``,
  one outer step of a bilevel method); an *iteration* is one pass of a solver's loop.
- ``on_failure``: what to do when a solve fails or falls back (:data:`FailurePolicy`):
  ``"raise"`` raises the subpackage's :class:`DxoptError` subclass, ``"warn"`` emits a
  :class:`DxoptWarning` and returns the result with its :class:`Status`, ``"ignore"`` only
  reports the status in the result, ``"nan"`` fills the failed parts of the output with NaN
  (where a batch can be partially valid). Each function lists the subset it accepts.
- ``seed`` / ``generator``: randomness; ``dtype`` / ``device``: torch conventions.
- Results are frozen dataclasses carrying a :class:`Status` and a :class:`Cost`.

Renamed options keep their old name for one release through :func:`renamed_kwargs`, which
warns with a :class:`DeprecationWarning` (see ``CHANGELOG.md``).
"""

from dxopt._core.cost import Cost as Cost
from dxopt._core.errors import DxoptError as DxoptError
from dxopt._core.errors import DxoptWarning as DxoptWarning
from dxopt._core.errors import NotConvergedError as NotConvergedError
from dxopt._core.memory import release_host_buffers as release_host_buffers
from dxopt._core.status import FailurePolicy as FailurePolicy
from dxopt._core.status import Status as Status
from dxopt._core.status import check_on_failure as check_on_failure
from dxopt._core.status import handle_failure as handle_failure
from dxopt._core.validate import check_callable as check_callable
from dxopt._core.validate import check_choice as check_choice
from dxopt._core.validate import check_int as check_int
from dxopt._core.validate import check_positive as check_positive
from dxopt._core.validate import check_range as check_range
from dxopt._core.validate import check_tensor as check_tensor
from dxopt._core.validate import input_errors as input_errors
from dxopt._core.validate import positional_deprecated as positional_deprecated
from dxopt._core.validate import positional_refused as positional_refused
from dxopt._core.validate import renamed_kwargs as renamed_kwargs

__all__ = [
    "Cost",
    "DxoptError",
    "DxoptWarning",
    "FailurePolicy",
    "NotConvergedError",
    "Status",
    "check_callable",
    "check_choice",
    "check_int",
    "check_on_failure",
    "check_positive",
    "check_range",
    "check_tensor",
    "handle_failure",
    "input_errors",
    "positional_deprecated",
    "positional_refused",
    "release_host_buffers",
    "renamed_kwargs",
]
