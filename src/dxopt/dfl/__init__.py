"""Decision-focused learning (DFL) for linear and combinatorial problems.

A model predicts the cost vector :math:`\\hat c` of a problem
:math:`\\min_{x \\in S} c^\\top x` (or ``max``, ``sense="max"``) whose feasible set :math:`S` is
known only through an *oracle* :math:`x(c) \\in \\arg\\min_{x \\in S} c^\\top x`, and is trained
on the quality of the decisions :math:`x(\\hat c)` rather than on the accuracy of
:math:`\\hat c`. The regret :math:`c^\\top x(\\hat c) - c^\\top x(c)` is piecewise constant in
:math:`\\hat c`, so training uses a surrogate loss or a smoothed layer:

- losses and layers (:mod:`dxopt.dfl.losses`, :mod:`dxopt.dfl.smooth`; your own: subclass
  :class:`OracleLoss`, PyEPO's ``optModule``): :class:`SPOPlus`
  (Elmachtoub & Grigas, Management Science 2022), :class:`DBB` (Vlastelica et al., ICLR 2020),
  :class:`PerturbedOptimizer` and :class:`PerturbedFenchelYoung` (Berthet et al., NeurIPS
  2020), :class:`NCE` and :class:`CMAP` (Mulamba et al., IJCAI 2021), :class:`ListwiseLTR`,
  :class:`PairwiseLTR`, :class:`PointwiseLTR` (Mandi et al., ICML 2022), :class:`QPTL`
  (Wilder, Dilkina & Tambe, AAAI 2019), the quadratically smoothed LP differentiated exactly by
  :func:`dxopt.qp.solve`, and :class:`LogBarrierLP` (Mandi & Guns, NeurIPS 2020), the
  log-barrier smoothed LP (:mod:`dxopt.dfl.barrier`), differentiated exactly too;
- oracles (:mod:`dxopt.dfl.oracles`; the contract in :mod:`dxopt.dfl.oracle_base`), all
  batched with a :class:`dxopt.Cost` record (``cost``, ``calls``, ``reset_cost()``, as every
  loss and layer here) and a per-sample :class:`dxopt.Status` (``last_status``):
  :class:`LPOracle` (:mod:`dxopt.dfl.lp`: HiGHS or any qpsolvers backend, every answer certified
  as :mod:`dxopt.qp`'s; the LP's data parsed once into an :class:`LPData`),
  :class:`MILPOracle` (the user's own mixed-integer program on HiGHS, PyEPO's
  ``optGrbModel`` without Gurobi; :mod:`dxopt.dfl.milp`), :class:`ShortestPathOracle` (exact
  DP on a DAG), :class:`KnapsackOracle` (exact branch and bound, optional node / time limits),
  :class:`TSPOracle` (Held-Karp, exact, by default up to 12 nodes; 2-opt heuristic beyond),
  :class:`CallableOracle`, :class:`PortfolioOracle` (the risk-constrained portfolio, a
  second-order cone program certified by :mod:`dxopt.conic`; :mod:`dxopt.dfl.markowitz`,
  with its smooth layer :class:`PortfolioLayer`); a :class:`SolutionPool` cache with
  ``solve_ratio``;
- graph helpers (:mod:`dxopt.dfl.graphs`), data generators (:mod:`dxopt.dfl.data`: shortest
  path, knapsack, TSP, portfolio as in PyEPO, Tang & Khalil, arXiv 2206.14234) and metrics
  (:mod:`dxopt.dfl.metrics`: regret, normalised regret, PyEPO's report);
- the JAIR benchmark's real tasks (:mod:`dxopt.dfl.jair`, data shipped with the package):
  :func:`jair_knapsack` and :func:`jair_scheduling` (Mandi et al., JAIR 2024).

Call conventions follow PyEPO's (``spo(c_hat, c, x_true, z_true)``, ``pfy(c_hat, x_true)``,
``nce(c_hat, x_true)``, ``ltr(c_hat, c)``), so code can switch by changing the constructor.

Conventions: ``PerturbedFenchelYoung``'s gradient is
:math:`s(x^* - \\mathbb E[x(\\hat c + \\sigma Z)])` with :math:`s = \\pm 1` the sense
(Berthet et al.'s :math:`\\mathbb E[x] - x^*` is the maximisation case); the oracles'
:class:`dxopt.Cost` counts solved cost vectors in ``forwards`` (``Cost`` has no separate
oracle-solve field); the shortest path generator scales as PyEPO's,
:math:`[(\\cdot + 3)^{\\deg} + 1] / 3.5^{\\deg}`;
:class:`TSPOracle` takes ``num_nodes`` and the edge costs at each call (what a model predicts),
and :meth:`TSPOracle.edge_costs` turns coordinates or a distance matrix into them; knapsack
weights need not be integers (branch and bound, not a DP); :class:`LogBarrierLP` is in
:mod:`dxopt.dfl.barrier`.
"""

from dxopt.dfl.barrier import LogBarrierLP as LogBarrierLP
from dxopt.dfl.base import OracleLoss as OracleLoss
from dxopt.dfl.cave import CaVE as CaVE
from dxopt.dfl.cave import binding_normals as binding_normals
from dxopt.dfl.cave import cone_projection as cone_projection
from dxopt.dfl.data import DFLData as DFLData
from dxopt.dfl.data import knapsack as knapsack
from dxopt.dfl.data import portfolio as portfolio
from dxopt.dfl.data import shortest_path as shortest_path
from dxopt.dfl.data import tsp as tsp
from dxopt.dfl.frank_wolfe import FrankWolfeFenchelYoung as FrankWolfeFenchelYoung
from dxopt.dfl.frank_wolfe import FrankWolfeInfo as FrankWolfeInfo
from dxopt.dfl.frank_wolfe import RegularizedFrankWolfe as RegularizedFrankWolfe
from dxopt.dfl.graphs import flow_conservation as flow_conservation
from dxopt.dfl.graphs import grid_graph as grid_graph
from dxopt.dfl.graphs import incidence_matrix as incidence_matrix
from dxopt.dfl.identity import NID as NID
from dxopt.dfl.imle import AIMLE as AIMLE
from dxopt.dfl.imle import IMLE as IMLE
from dxopt.dfl.imle import sum_of_gamma as sum_of_gamma
from dxopt.dfl.jair import JAIRTask as JAIRTask
from dxopt.dfl.jair import jair_knapsack as jair_knapsack
from dxopt.dfl.jair import jair_scheduling as jair_scheduling
from dxopt.dfl.losses import CMAP as CMAP
from dxopt.dfl.losses import DBB as DBB
from dxopt.dfl.losses import NCE as NCE
from dxopt.dfl.losses import ListwiseLTR as ListwiseLTR
from dxopt.dfl.losses import PairwiseLTR as PairwiseLTR
from dxopt.dfl.losses import PerturbedFenchelYoung as PerturbedFenchelYoung
from dxopt.dfl.losses import PerturbedOptimizer as PerturbedOptimizer
from dxopt.dfl.losses import PointwiseLTR as PointwiseLTR
from dxopt.dfl.losses import SPOPlus as SPOPlus
from dxopt.dfl.lp import LPData as LPData
from dxopt.dfl.markowitz import PortfolioLayer as PortfolioLayer
from dxopt.dfl.markowitz import PortfolioOracle as PortfolioOracle
from dxopt.dfl.metrics import RegretReport as RegretReport
from dxopt.dfl.metrics import normalized_regret as normalized_regret
from dxopt.dfl.metrics import regret as regret
from dxopt.dfl.metrics import regret_report as regret_report
from dxopt.dfl.milp import MILPOracle as MILPOracle
from dxopt.dfl.milp import MILPSolution as MILPSolution
from dxopt.dfl.oracles import CallableOracle as CallableOracle
from dxopt.dfl.oracles import KnapsackOracle as KnapsackOracle
from dxopt.dfl.oracles import LPOracle as LPOracle
from dxopt.dfl.oracles import Oracle as Oracle
from dxopt.dfl.oracles import OracleBase as OracleBase
from dxopt.dfl.oracles import OracleError as OracleError
from dxopt.dfl.oracles import ShortestPathOracle as ShortestPathOracle
from dxopt.dfl.oracles import TSPOracle as TSPOracle
from dxopt.dfl.perturbation import PG as PG
from dxopt.dfl.pool import SolutionPool as SolutionPool
from dxopt.dfl.robust import KNNTargets as KNNTargets
from dxopt.dfl.robust import knn_targets as knn_targets
from dxopt.dfl.smooth import QPTL as QPTL

__all__ = [
    "AIMLE",
    "CMAP",
    "DBB",
    "IMLE",
    "NCE",
    "NID",
    "PG",
    "QPTL",
    "CaVE",
    "CallableOracle",
    "DFLData",
    "FrankWolfeFenchelYoung",
    "FrankWolfeInfo",
    "JAIRTask",
    "KNNTargets",
    "KnapsackOracle",
    "LPData",
    "LPOracle",
    "ListwiseLTR",
    "LogBarrierLP",
    "MILPOracle",
    "MILPSolution",
    "Oracle",
    "OracleBase",
    "OracleError",
    "OracleLoss",
    "PairwiseLTR",
    "PerturbedFenchelYoung",
    "PerturbedOptimizer",
    "PointwiseLTR",
    "PortfolioLayer",
    "PortfolioOracle",
    "RegretReport",
    "RegularizedFrankWolfe",
    "SPOPlus",
    "ShortestPathOracle",
    "SolutionPool",
    "TSPOracle",
    "binding_normals",
    "cone_projection",
    "flow_conservation",
    "grid_graph",
    "incidence_matrix",
    "jair_knapsack",
    "jair_scheduling",
    "knapsack",
    "knn_targets",
    "normalized_regret",
    "portfolio",
    "regret",
    "regret_report",
    "shortest_path",
    "sum_of_gamma",
    "tsp",
]
