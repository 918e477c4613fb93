r"""Bilevel optimization: hypergradient methods, hard instances and exact oracle accounting.

Solve :math:`\min_x H(x) = f(x, y^*(x))` with :math:`y^*(x) = \arg\min_y g(x, y)`,
:math:`g` strongly convex in :math:`y`, using only first-order oracles (gradients of
:math:`f` and :math:`g`, Hessian-vector and mixed products of :math:`g`), each counted:

.. math::

    \nabla H(x) = \nabla_x f - \nabla^2_{xy} g\,[\nabla^2_{yy} g]^{-1} \nabla_y f.

- Oracles: :class:`AutogradOracle` (``torch.autograd``), analytic :class:`QuadraticBilevel`,
  :class:`JiInstance` (the hard instance of Ji, arXiv 2511.19656) and its stochastic
  :class:`JiBernoulliOracle`; :class:`CountingOracle` counts calls against a budget.
- Methods: :class:`AID` (CG or Neumann, GD or AGD inner loop, warm starts), :class:`ITD`,
  :class:`StocBiO`, :class:`SOBA`, :class:`F2BA`, all run by :func:`minimize_bilevel`
  from :math:`x_0` (default 0) and :math:`y_0` (default 0); :func:`hypergradient` gives one
  estimate at a given ``x``, certified by the residuals of its inner and adjoint solves.
  Results carry a :class:`dxopt.Status` and a :class:`dxopt.Cost`.
- Neural networks: :func:`implicit_argmin` / :class:`ImplicitArgmin`, an autograd layer that
  differentiates the minimizer of an ``nn.Module``'s inner loss with respect to
  hyperparameters by the implicit function theorem (CG on Hessian-vector products).
- Single-level chains: :class:`NesterovChain`, :class:`CarmonChain`,
  :func:`run_single_level`.
- A real task: :func:`breast_cancer_regularization`.
"""

from dxopt.bilevel.autograd_oracle import AutogradOracle as AutogradOracle
from dxopt.bilevel.chains import CarmonChain as CarmonChain
from dxopt.bilevel.chains import NesterovChain as NesterovChain
from dxopt.bilevel.chains import SingleLevelRun as SingleLevelRun
from dxopt.bilevel.chains import run_single_level as run_single_level
from dxopt.bilevel.driver import BilevelResult as BilevelResult
from dxopt.bilevel.driver import HypergradientMethod as HypergradientMethod
from dxopt.bilevel.driver import Status as Status
from dxopt.bilevel.driver import Trajectory as Trajectory
from dxopt.bilevel.driver import minimize_bilevel as minimize_bilevel
from dxopt.bilevel.estimate import HypergradientError as HypergradientError
from dxopt.bilevel.estimate import HypergradientResult as HypergradientResult
from dxopt.bilevel.estimate import hypergradient as hypergradient
from dxopt.bilevel.hyperparameters import LogisticRegularization as LogisticRegularization
from dxopt.bilevel.hyperparameters import (
    MinibatchLogisticRegularization as MinibatchLogisticRegularization,
)
from dxopt.bilevel.hyperparameters import RegularizationTask as RegularizationTask
from dxopt.bilevel.hyperparameters import (
    breast_cancer_regularization as breast_cancer_regularization,
)
from dxopt.bilevel.implicit import ImplicitArgmin as ImplicitArgmin
from dxopt.bilevel.implicit import ImplicitSolveError as ImplicitSolveError
from dxopt.bilevel.implicit import implicit_argmin as implicit_argmin
from dxopt.bilevel.inner import CG as CG
from dxopt.bilevel.inner import InnerLoop as InnerLoop
from dxopt.bilevel.inner import Neumann as Neumann
from dxopt.bilevel.ji import JiBernoulliOracle as JiBernoulliOracle
from dxopt.bilevel.ji import JiInstance as JiInstance
from dxopt.bilevel.methods import AID as AID
from dxopt.bilevel.methods import ITD as ITD
from dxopt.bilevel.oracles import BilevelOracle as BilevelOracle
from dxopt.bilevel.oracles import BudgetExhaustedError as BudgetExhaustedError
from dxopt.bilevel.oracles import CountingOracle as CountingOracle
from dxopt.bilevel.oracles import OracleCounts as OracleCounts
from dxopt.bilevel.penalty import F2BA as F2BA
from dxopt.bilevel.quadratic import QuadraticBilevel as QuadraticBilevel
from dxopt.bilevel.quadratic import random_quadratic_bilevel as random_quadratic_bilevel
from dxopt.bilevel.stochastic import SOBA as SOBA
from dxopt.bilevel.stochastic import StocBiO as StocBiO

__all__ = [
    "AID",
    "CG",
    "F2BA",
    "ITD",
    "SOBA",
    "AutogradOracle",
    "BilevelOracle",
    "BilevelResult",
    "BudgetExhaustedError",
    "CarmonChain",
    "CountingOracle",
    "HypergradientError",
    "HypergradientMethod",
    "HypergradientResult",
    "ImplicitArgmin",
    "ImplicitSolveError",
    "InnerLoop",
    "JiBernoulliOracle",
    "JiInstance",
    "LogisticRegularization",
    "MinibatchLogisticRegularization",
    "NesterovChain",
    "Neumann",
    "OracleCounts",
    "QuadraticBilevel",
    "RegularizationTask",
    "SingleLevelRun",
    "Status",
    "StocBiO",
    "Trajectory",
    "breast_cancer_regularization",
    "hypergradient",
    "implicit_argmin",
    "minimize_bilevel",
    "random_quadratic_bilevel",
    "run_single_level",
]
