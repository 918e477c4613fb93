r"""The surrogate loss whose gradient is the policy-gradient estimate.

.. math:: \mathcal L(\theta) = -\frac{1}{GN}\sum_{g,i}\sum_{k\le L_{g,i}} w_{g,i,k}
          \log\pi_\theta(y_{g,i,k}\mid h_{g,i,k-1}),

so :math:`-\nabla\mathcal L` is the mean over the ``G`` groups of the estimate
:math:`\hat g` of :mod:`dxopt.rl._weights` (weights are constants). An attempt's
log-probability is the *sum* of its token log-probabilities: averaging over tokens
(per-sequence :math:`1/|y_k|`) would reweight attempts and bias the estimate.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dxopt._core import check_tensor
from dxopt.rl._errors import RLTypeError, RLValueError, rl_input_errors
from dxopt.rl._weights import AttemptWeights


def surrogate_loss(
    log_probs: Tensor, weights: AttemptWeights, *, token_mask: Tensor | None = None
) -> Tensor:
    """Scalar loss whose negative gradient is the policy-gradient estimate (see module doc).

    Args:
        log_probs: ``(G, N, K)`` attempt log-probabilities, or ``(G, N, K, T)`` token
            log-probabilities (summed over the last dimension, under ``token_mask``), with
            autograd history to the policy's parameters. Entries of attempts not made are
            ignored (they may be anything, even ``-inf``).
        weights: the :class:`~dxopt.rl.AttemptWeights` of :func:`~dxopt.rl.compute_weights`.
        token_mask: ``(G, N, K, T)`` bool, ``True`` for real tokens (``None``: all count);
            only with token log-probabilities.

    Returns:
        The scalar loss; call ``.backward()`` and step any :mod:`torch.optim` optimiser.
    """
    if not isinstance(weights, AttemptWeights):
        raise RLTypeError(
            f"weights: expected dxopt.rl.AttemptWeights (from compute_weights), got "
            f"{type(weights).__name__}."
        )
    with rl_input_errors():
        check_tensor("log_probs", log_probs, floating=True)
    shape = tuple(weights.weights.shape)
    if log_probs.ndim == 4:
        if tuple(log_probs.shape[:3]) != shape:
            raise RLValueError(
                f"log_probs: token log-probabilities of shape (G, N, K, T) must start with the "
                f"weights' shape {shape}, got {tuple(log_probs.shape)}."
            )
        if token_mask is not None:
            if not isinstance(token_mask, Tensor) or token_mask.dtype != torch.bool:
                raise RLTypeError("token_mask: expected a bool torch.Tensor (True = real token).")
            if token_mask.shape != log_probs.shape:
                raise RLValueError(
                    f"token_mask: expected the shape of log_probs {tuple(log_probs.shape)}, got "
                    f"{tuple(token_mask.shape)}."
                )
            log_probs = torch.where(token_mask, log_probs, 0.0)
        log_probs = log_probs.sum(dim=-1)
    elif log_probs.ndim == 3:
        if token_mask is not None:
            raise RLValueError(
                "token_mask: only meaningful with (G, N, K, T) token log-probabilities; got "
                "(G, N, K) attempt log-probabilities, drop token_mask."
            )
        if tuple(log_probs.shape) != shape:
            raise RLValueError(
                f"log_probs: expected the weights' shape (G, N, K) = {shape}, got "
                f"{tuple(log_probs.shape)}."
            )
    else:
        raise RLValueError(
            "log_probs: expected (G, N, K) attempt or (G, N, K, T) token log-probabilities, got "
            f"shape {tuple(log_probs.shape)}."
        )
    w = weights.weights.to(device=log_probs.device, dtype=log_probs.dtype)
    made = weights.attempted.to(log_probs.device)
    lp = torch.where(made, log_probs, 0.0)
    g, n, _ = shape
    return -(w * lp).sum() / (g * n)
