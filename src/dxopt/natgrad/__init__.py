"""Natural-gradient optimizers for least-squares losses :math:`\\tfrac12\\|r(\\theta)\\|^2`.

All three are :class:`torch.optim.Optimizer` subclasses: ``opt.step(batch)`` for a residual
function given at construction, or ``opt.step(closure)`` with ``closure()`` returning the
residual vector; hyperparameters in ``param_groups``, LR schedulers, ``state_dict``.

- :class:`SNG`: subsampled natural gradient, :math:`d = J_S^\\top(J_SJ_S^\\top+\\lambda I)^{-1}r_S`.
- :class:`SPRING`: SNG with Kaczmarz momentum and a norm cap (arXiv:2401.10190).
- :class:`ENGD`: full-batch Gauss-Newton with a grid line search (arXiv:2302.13163).
- Directions as functions: :func:`kernel_direction`, :func:`spring_direction`,
  :func:`gauss_newton_direction`.
- Residuals and Jacobians: :class:`RowwiseResidual`, :func:`residual_and_jacobian`.
- PINN problem zoo: :class:`Poisson1D`, :class:`Poisson2D`, :class:`Heat1D`,
  :class:`Poisson5D`, :func:`tanh_mlp`, :func:`input_derivatives`.

Theory: Goldshlager, Hu, Lin, *A Sketch-and-Project Analysis of Subsampled Natural Gradient
Algorithms*, arXiv:2508.21022.
"""

from dxopt.natgrad._base import CholeskyFallbackError as CholeskyFallbackError
from dxopt.natgrad._base import NaturalGradientOptimizer as NaturalGradientOptimizer
from dxopt.natgrad._base import StepReport as StepReport
from dxopt.natgrad._directions import DirectionSolve as DirectionSolve
from dxopt.natgrad._directions import gauss_newton_direction as gauss_newton_direction
from dxopt.natgrad._directions import kernel_direction as kernel_direction
from dxopt.natgrad._directions import spring_direction as spring_direction
from dxopt.natgrad._jacobian import ResidualFunction as ResidualFunction
from dxopt.natgrad._jacobian import RowwiseResidual as RowwiseResidual
from dxopt.natgrad._jacobian import residual_and_jacobian as residual_and_jacobian
from dxopt.natgrad.optimizers import ENGD as ENGD
from dxopt.natgrad.optimizers import SNG as SNG
from dxopt.natgrad.optimizers import SPRING as SPRING
from dxopt.natgrad.pinn import Heat1D as Heat1D
from dxopt.natgrad.pinn import PINNProblem as PINNProblem
from dxopt.natgrad.pinn import Poisson1D as Poisson1D
from dxopt.natgrad.pinn import Poisson2D as Poisson2D
from dxopt.natgrad.pinn import Poisson5D as Poisson5D
from dxopt.natgrad.pinn import input_derivatives as input_derivatives
from dxopt.natgrad.pinn import tanh_mlp as tanh_mlp

__all__ = [
    "ENGD",
    "SNG",
    "SPRING",
    "CholeskyFallbackError",
    "DirectionSolve",
    "Heat1D",
    "NaturalGradientOptimizer",
    "PINNProblem",
    "Poisson1D",
    "Poisson2D",
    "Poisson5D",
    "ResidualFunction",
    "RowwiseResidual",
    "StepReport",
    "gauss_newton_direction",
    "input_derivatives",
    "kernel_direction",
    "residual_and_jacobian",
    "spring_direction",
    "tanh_mlp",
]
