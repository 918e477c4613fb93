r"""Linearized fine-tuning, task arithmetic, and distilling a linearized teacher.

- :class:`LinearizedModel`: the first-order Taylor model :math:`f(x;\theta_0)+J\delta` of
  any ``nn.Module`` (one ``torch.func.jvp`` per call, same call signature, trainable
  displacements; LoRA-style adapters: only the trainable parameters are linearized);
- :class:`TaskVector`: :math:`\theta_t-\theta_0` as a typed mapping with ``+``, ``-``,
  scalar ``*`` and :meth:`TaskVector.apply_to` (ordinary or linearized models);
- :class:`CurvaturePenalty`: the Gauss-Newton feature-drift penalty
  :math:`\mathbb{E}_\rho\|J\tau\|^2=\tau^\top G\tau` on task-agnostic data (the teacher's and
  student's curvature regulariser);
- :func:`distillation_loss`, :func:`call_along_ray`, :func:`alpha_range`,
  :func:`sample_alpha`: the pieces of DELTA's student objective.

References: Ortiz-Jimenez et al., "Task Arithmetic in the Tangent Space", arXiv 2305.12827;
Ilharco et al., "Editing Models with Task Arithmetic", arXiv 2212.04089; Sommariva et al.,
"Distilling Linearized Behavior into Non-Linear Fine-Tuning for Effective Task Arithmetic"
(DELTA), arXiv 2605.18993.
"""

from dxopt.linearize._curvature import CurvaturePenalty as CurvaturePenalty
from dxopt.linearize._distill import alpha_range as alpha_range
from dxopt.linearize._distill import call_along_ray as call_along_ray
from dxopt.linearize._distill import distillation_loss as distillation_loss
from dxopt.linearize._distill import sample_alpha as sample_alpha
from dxopt.linearize._linear import LinearizedModel as LinearizedModel
from dxopt.linearize._task_vector import TaskVector as TaskVector

__all__ = [
    "CurvaturePenalty",
    "LinearizedModel",
    "TaskVector",
    "alpha_range",
    "call_along_ray",
    "distillation_loss",
    "sample_alpha",
]
