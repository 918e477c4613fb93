"""Gradient estimators behind one interface, with honest costs.

Every estimator has ``estimate(loss_fn, params, batch, *, count_flops=False) -> Estimate``
for a loss pure in named parameters (``loss_fn(params, batch)``, as with
:func:`torch.func.functional_call`); the estimate is added to each parameter's ``.grad`` (as
``loss.backward()`` does; zero it between steps), so any :mod:`torch.optim` optimiser can
step, and :class:`Cost` (the shared :class:`dxopt._core.Cost`) counts forwards, backwards,
JVPs, recomputed forwards and FLOPs. A loss that does not read ``params`` is refused; the
forwards of one estimate share one RNG state and update module buffers once. Parameters with
``requires_grad=False`` are frozen (no estimate, no ``.grad``); a non-finite estimate follows
``on_failure`` (default ``"raise"``: :class:`EstimateError`), and every :class:`Estimate`
carries a :class:`dxopt.Status`.

- :class:`Backprop`, with an optional :class:`CheckpointPlan` (per block, segments,
  selective) followed by models that chain blocks through :func:`run_blocks`;
- :class:`ForwardGradient`: k tangents, mean or orthogonal projection, Gaussian or Rademacher,
  optionally sparse (top-magnitude entries);
- :class:`SPSA`: two-sided SPSA / MeZO with in-place seed replay and a fused :meth:`SPSA.step_`;
  sparse via ``keep_fraction``; :class:`LOZO`: low-rank ZO;
- :class:`ZOSVRG`, :class:`FmADSVRG`: SVRG control variates;
- :class:`MemoryTracker`: peak live-tensor bytes and bytes saved for backward, on the CPU.

Reference: Panchal et al., "The Cost of Avoiding Backpropagation", arXiv 2506.21833.
"""

from dxopt.estimators._api import Cost as Cost
from dxopt.estimators._api import Estimate as Estimate
from dxopt.estimators._api import EstimateError as EstimateError
from dxopt.estimators._api import GradientEstimator as GradientEstimator
from dxopt.estimators._api import LossFn as LossFn
from dxopt.estimators._backprop import Backprop as Backprop
from dxopt.estimators._checkpointing import CheckpointPlan as CheckpointPlan
from dxopt.estimators._checkpointing import checkpointing as checkpointing
from dxopt.estimators._checkpointing import run_blocks as run_blocks
from dxopt.estimators._forward_gradient import ForwardGradient as ForwardGradient
from dxopt.estimators._memory import MemoryReport as MemoryReport
from dxopt.estimators._memory import MemoryTracker as MemoryTracker
from dxopt.estimators._svrg import ZOSVRG as ZOSVRG
from dxopt.estimators._svrg import FmADSVRG as FmADSVRG
from dxopt.estimators._zeroth_order import LOZO as LOZO
from dxopt.estimators._zeroth_order import SPSA as SPSA

__all__ = [
    "LOZO",
    "SPSA",
    "ZOSVRG",
    "Backprop",
    "CheckpointPlan",
    "Cost",
    "Estimate",
    "EstimateError",
    "FmADSVRG",
    "ForwardGradient",
    "GradientEstimator",
    "LossFn",
    "MemoryReport",
    "MemoryTracker",
    "checkpointing",
    "run_blocks",
]
