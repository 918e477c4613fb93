"""Decision-focused losses and layers for linear objectives over a feasible set given by an
oracle, with PyEPO-like call conventions (Tang & Khalil, arXiv 2206.14234) so users can switch.

With :math:`s = +1` for ``sense="min"`` and :math:`-1` for ``"max"``, :math:`x(c)` the oracle's
answer and :math:`x^*`, :math:`z^* = c^\\top x^*` the true optimum:

- :class:`SPOPlus` (Elmachtoub & Grigas, Management Science 2022):
  :math:`\\ell = s\\,(-(2\\hat c - c)^\\top \\tilde x + 2\\hat c^\\top x^* - z^*)`,
  :math:`\\tilde x = x(2\\hat c - c)`, subgradient :math:`2s\\,(x^* - \\tilde x)`.
- :class:`DBB` (Vlastelica et al., ICLR 2020): forward :math:`x(\\hat c)`, backward
  :math:`s\\,(x(\\hat c + s\\lambda \\bar x) - x(\\hat c))/\\lambda` for the incoming gradient
  :math:`\\bar x`.
- :class:`PerturbedOptimizer` (Berthet et al., NeurIPS 2020):
  :math:`\\mathbb E[x(\\hat c + \\sigma Z)]`, :math:`Z \\sim N(0, I)`, with the Stein / score
  function Jacobian :math:`\\mathbb E[x(\\hat c + \\sigma Z) Z^\\top]/\\sigma`.
- :class:`PerturbedFenchelYoung`: :math:`\\ell = s\\,(\\hat c^\\top x^* - \\mathbb E[(\\hat c +
  \\sigma Z)^\\top x(\\hat c + \\sigma Z)])` (:math:`\\ge 0`), gradient
  :math:`s\\,(x^* - \\mathbb E[x(\\hat c + \\sigma Z)])` (in Berthet's maximisation convention:
  :math:`\\mathbb E[y] - y^*`).
- :class:`NCE`, :class:`CMAP`, :class:`ListwiseLTR`, :class:`PairwiseLTR`,
  :class:`PointwiseLTR` over a :class:`~dxopt.dfl.pool.SolutionPool` :math:`\\Gamma` (Mulamba
  et al., IJCAI 2021; Mandi et al., ICML 2022).

Every oracle call is batched (the ``n_samples`` perturbations of a batch are one call) and each
loss keeps a :attr:`cost` (:class:`dxopt.Cost`: ``forwards`` = cost vectors sent to the oracle,
``seconds`` = time in the oracle).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dxopt._core import check_int, check_positive, check_tensor
from dxopt.dfl._checks import check_not_negative, uncertified
from dxopt.dfl.base import OracleLoss as _OracleLoss
from dxopt.dfl.base import reduce_loss
from dxopt.dfl.oracles import OracleBase
from dxopt.dfl.pool import PoolSolver, SolutionPool

__all__ = [
    "CMAP",
    "DBB",
    "NCE",
    "ListwiseLTR",
    "PairwiseLTR",
    "PerturbedFenchelYoung",
    "PerturbedOptimizer",
    "PointwiseLTR",
    "SPOPlus",
]


_reduce = reduce_loss


def check_optima(name: str, z: Any, c_hat: Tensor) -> Tensor:
    """The true optima ``(B,)`` or ``(B, 1)`` (one per cost vector) as ``c_hat.shape[:-1]``."""
    check_tensor(name, z)
    batch = c_hat.shape[:-1]
    if z.numel() != c_hat[..., 0].numel() or (z.ndim > 0 and z.shape[0] != c_hat.shape[0]):
        raise ValueError(
            f"{name}: expected one optimum per cost vector, shape {tuple(batch)} or "
            f"{(*batch, 1)} for c_hat of shape {tuple(c_hat.shape)}, got {tuple(z.shape)}."
        )
    return z.reshape(batch)


def _check_pair(
    oracle: Any, c_hat: Tensor, other: Tensor, other_name: str, *, checked: bool = False
) -> None:
    """Check ``c_hat`` (unless ``checked``: the caller has just checked it) and that ``other``
    is a tensor of its shape."""
    if not checked:
        c_hat = oracle.check_costs(c_hat, "c_hat") if isinstance(oracle, OracleBase) else c_hat
        check_tensor("c_hat", c_hat, floating=True)
    check_tensor(other_name, other)
    if other.shape != c_hat.shape:
        raise ValueError(
            f"{other_name}: expected the shape of c_hat {tuple(c_hat.shape)}, got "
            f"{tuple(other.shape)}."
        )


class _SPOPlusFunction(torch.autograd.Function):
    """The per-sample SPO+ loss :math:`s(-t^\\top\\tilde x + 2\\hat c^\\top x^* - z^*)`,
    :math:`t = 2\\hat c - c`, with :math:`\\tilde x = x(t)` held fixed, and the magnitude
    :math:`|t^\\top\\tilde x| + |2\\hat c^\\top x^*| + |z^*|` of its terms (no gradient).

    Backward, for the incoming :math:`g` and :math:`\\gamma = s g`: :math:`2\\gamma x^* -
    2\\gamma\\tilde x` in :math:`\\hat c`, :math:`\\gamma\\tilde x` in :math:`c`,
    :math:`2\\gamma\\hat c` in :math:`x^*`, :math:`-\\gamma` in :math:`z^*`: the products
    autograd forms from the expression, in the same order, so the gradients are the same to
    the last bit; one node instead of a dozen."""

    @staticmethod
    def forward(
        ctx: Any, c_hat: Tensor, c: Tensor, x_true: Tensor, z: Tensor, target: Tensor,
        x_tilde: Tensor, sign: float,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        # forward(ctx, ...) rather than setup_context: torch binds the arguments of the
        # latter with inspect.signature on every call, which costs more than this forward
        first, second = (target * x_tilde).sum(-1), 2 * (c_hat * x_true).sum(-1)
        loss = sign * (-first + second - z)
        scale = first.abs() + second.abs() + z.abs()
        ctx.save_for_backward(c_hat, x_true, x_tilde)
        ctx.sign = sign
        ctx.mark_non_differentiable(scale)
        return loss, scale

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _: Tensor) -> tuple[Tensor | None, ...]:
        c_hat, x_true, x_tilde = ctx.saved_tensors
        need = ctx.needs_input_grad
        gamma = (grad * ctx.sign).unsqueeze(-1)
        two = gamma * 2
        g_hat = two * x_true - two * x_tilde if need[0] else None
        g_c = gamma * x_tilde if need[1] else None
        g_x = two * c_hat if need[2] else None
        g_z = -gamma.squeeze(-1) if need[3] else None
        return g_hat, g_c, g_x, g_z, None, None, None


class SPOPlus(_OracleLoss):
    """The SPO+ loss (Elmachtoub & Grigas 2022), a convex surrogate of the regret:

    .. math:: \\ell_{SPO+}(\\hat c, c) = s\\,\\big(-(2\\hat c - c)^\\top \\tilde x
        + 2\\hat c^\\top x^* - z^*\\big), \\quad \\tilde x = x(2\\hat c - c),

    with the subgradient :math:`2s(x^* - \\tilde x)` in :math:`\\hat c` (exact autograd of the
    expression with :math:`\\tilde x` held fixed). ``solve_ratio < 1`` answers
    :math:`\\tilde x` from the ``pool`` on the other batches (Mulamba et al. 2021).

    Call: ``loss(c_hat, c, x_true, z_true)`` with ``(B, d)``, ``(B, d)``, ``(B, d)``,
    ``(B,)`` or ``(B, 1)``.
    """

    def forward(self, c_hat: Tensor, c: Tensor, x_true: Tensor, z_true: Tensor) -> Tensor:
        _check_pair(self.oracle, c_hat, c, "c")
        _check_pair(self.oracle, c_hat, x_true, "x_true", checked=True)
        z = check_optima("z_true", z_true, c_hat).to(c_hat.dtype)
        target = 2 * c_hat.detach() - c.detach()
        x_tilde = self.solver(target)
        loss, scale = _SPOPlusFunction.apply(c_hat, c, x_true, z, target, x_tilde, self.sign)
        if self.solver.last_from_oracle and not uncertified(self.oracle):
            check_not_negative("SPOPlus", loss, scale, self.oracle, _SPO_HINT)
        return _reduce(loss, self.reduction)


_SPO_HINT = "check that x_true, z_true are this oracle's optima of c, in its sense"


class _DBBFunction(torch.autograd.Function):
    @staticmethod
    def forward(c_hat: Tensor, solver: PoolSolver, lambd: float, sign: float) -> Tensor:
        return solver(c_hat.detach())

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        c_hat, solver, lambd, sign = inputs
        ctx.save_for_backward(c_hat, output)
        ctx.solver, ctx.lambd, ctx.sign = solver, lambd, sign

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        c_hat, x = ctx.saved_tensors
        shifted = c_hat.detach() + ctx.sign * ctx.lambd * grad
        x_shift = ctx.solver(shifted)
        return ctx.sign * (x_shift - x) / ctx.lambd, None, None, None


class DBB(_OracleLoss):
    """Differentiable black-box solver (Vlastelica et al. 2020): returns :math:`x(\\hat c)`;
    its backward for an incoming gradient :math:`\\bar x` is the gradient of the piecewise
    linear interpolation,
    :math:`s\\,(x(\\hat c + s\\lambda\\bar x) - x(\\hat c))/\\lambda` (one more batched oracle
    call). Call: ``x = dbb(c_hat)``, then any loss of ``x`` (``reduction`` unused).
    """

    def __init__(self, oracle: Any, *, lambd: float = 10.0, **kwargs: Any) -> None:
        super().__init__(oracle, **kwargs)
        self.lambd = check_positive("lambd", lambd)

    def forward(self, c_hat: Tensor) -> Tensor:
        self.oracle.check_costs(c_hat, "c_hat")
        out: Tensor = _DBBFunction.apply(c_hat, self.solver, self.lambd, self.sign)
        return out


class _Perturbed(_OracleLoss):
    def __init__(
        self,
        oracle: Any,
        *,
        n_samples: int = 10,
        sigma: float = 1.0,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(oracle, seed=seed, **kwargs)
        self.n_samples = check_int("n_samples", n_samples)
        self.sigma = check_positive("sigma", sigma, hint="the noise scale must be > 0")
        self.generator = torch.Generator().manual_seed(int(seed))

    def _sample(self, c_hat: Tensor) -> tuple[Tensor, Tensor]:
        """Noise ``Z`` ``(B, n, d)`` and the solutions ``x(c_hat + sigma Z)``, one oracle call."""
        flat = c_hat.detach().reshape(-1, c_hat.shape[-1])
        noise = torch.randn(
            (flat.shape[0], self.n_samples, flat.shape[1]),
            generator=self.generator,
            dtype=torch.float64,
        ).to(c_hat.device, c_hat.dtype)
        perturbed = flat.unsqueeze(1) + self.sigma * noise
        x = self.solver(perturbed.reshape(-1, flat.shape[1])).reshape(perturbed.shape)
        return noise, x


class _PerturbedFunction(torch.autograd.Function):
    @staticmethod
    def forward(c_hat: Tensor, noise: Tensor, x: Tensor, sigma: float, baseline: bool) -> Tensor:
        return x.mean(-2).reshape(c_hat.shape)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        c_hat, noise, x, sigma, baseline = inputs
        ctx.save_for_backward(noise, x)
        ctx.sigma, ctx.baseline, ctx.shape = sigma, baseline, c_hat.shape

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        noise, x = ctx.saved_tensors
        n = x.shape[-2]
        reward = torch.einsum("bnd,bd->bn", x, grad.reshape(-1, x.shape[-1]))
        if ctx.baseline and n > 1:
            # leave-one-out baseline: unbiased, E[(r_i - mean_{j != i} r_j) Z_i] = E[r_i Z_i]
            reward = (reward - reward.mean(-1, keepdim=True)) * (n / (n - 1))
        g = torch.einsum("bn,bnd->bd", reward, noise) / (n * ctx.sigma)
        return g.reshape(ctx.shape), None, None, None, None


class PerturbedOptimizer(_Perturbed):
    """The perturbed optimizer (Berthet et al. 2020) :math:`y_\\sigma(\\hat c) =
    \\mathbb E[x(\\hat c + \\sigma Z)]`, :math:`Z \\sim N(0, I)`, estimated with ``n_samples``
    draws (one batched oracle call), differentiable by the Stein identity
    :math:`J y_\\sigma(\\hat c) = \\mathbb E[x(\\hat c + \\sigma Z) Z^\\top] / \\sigma`, here
    with a leave-one-out baseline (``baseline=True``; unbiased, lower variance).
    Call: ``y = ptb(c_hat)``, then any loss of ``y``.
    """

    def __init__(self, oracle: Any, *, baseline: bool = True, **kwargs: Any) -> None:
        super().__init__(oracle, **kwargs)
        self.baseline = bool(baseline)

    def forward(self, c_hat: Tensor) -> Tensor:
        self.oracle.check_costs(c_hat, "c_hat")
        noise, x = self._sample(c_hat)
        out: Tensor = _PerturbedFunction.apply(c_hat, noise, x, self.sigma, self.baseline)
        return out


class PerturbedFenchelYoung(_Perturbed):
    """The perturbed Fenchel-Young loss (Berthet et al. 2020), for costs:

    .. math:: \\ell(\\hat c, x^*) = s\\big(\\hat c^\\top x^* - \\mathbb E[(\\hat c +
        \\sigma Z)^\\top x(\\hat c + \\sigma Z)]\\big) \\ge 0,\\qquad
        \\nabla_{\\hat c}\\,\\ell = s\\,(x^* - \\mathbb E[x(\\hat c + \\sigma Z)]),

    both by the same ``n_samples`` draws (the gradient is the exact autograd of the sample
    average with the solutions held fixed, which is piecewise constant in :math:`\\hat c`).
    Call: ``loss(c_hat, x_true)``.
    """

    def forward(self, c_hat: Tensor, x_true: Tensor) -> Tensor:
        _check_pair(self.oracle, c_hat, x_true, "x_true")
        noise, x = self._sample(c_hat)
        flat = c_hat.reshape(-1, c_hat.shape[-1])
        value = ((flat.unsqueeze(1) + self.sigma * noise) * x).sum(-1).mean(-1)
        loss = self.sign * ((flat * x_true.reshape(flat.shape)).sum(-1) - value)
        return _reduce(loss.reshape(c_hat.shape[:-1]), self.reduction)


class _PoolLoss(_OracleLoss):
    def __init__(
        self, oracle: Any, pool: SolutionPool, *, solve_ratio: float = 1.0, **kwargs: Any
    ) -> None:
        if not isinstance(pool, SolutionPool):
            raise TypeError(
                f"pool: expected a SolutionPool (seed it with the training solutions), got "
                f"{type(pool).__name__}."
            )
        super().__init__(oracle, pool=pool, solve_ratio=solve_ratio, **kwargs)

    def _refresh(self, c_hat: Tensor) -> SolutionPool:
        """With probability ``solve_ratio`` add :math:`x(\\hat c)` to the pool; the pool."""
        ratio = self.solver.solve_ratio
        if ratio >= 1.0 or self.solver.rng.uniform() < ratio:
            self.solver(c_hat.detach(), force=True)
        assert self.pool is not None
        return self.pool

    def _refreshed_pool(self, c_hat: Tensor) -> Tensor:
        """:meth:`_refresh`, then the pool's solutions in ``c_hat``'s dtype and device."""
        return self._refresh(c_hat).as_tensor(c_hat)


class NCE(_PoolLoss):
    """Noise-contrastive estimation over the pool (Mulamba et al. 2021):
    :math:`\\ell = \\frac{1}{|\\Gamma|}\\sum_{w \\in \\Gamma} s\\,(\\hat c^\\top x^* -
    \\hat c^\\top w) = s\\,\\hat c^\\top (x^* - \\bar w)`, :math:`\\bar w` the pool's mean
    (:meth:`SolutionPool.mean`): the loss is linear in the pool, so one ``(B, d)`` product
    replaces the ``(B, |\\Gamma|)`` one. Call: ``loss(c_hat, x_true)``."""

    def forward(self, c_hat: Tensor, x_true: Tensor) -> Tensor:
        _check_pair(self.oracle, c_hat, x_true, "x_true")
        terms = c_hat * (x_true - self._refresh(c_hat).mean(c_hat))
        if self.reduction == "none":
            return self.sign * terms.sum(-1)
        rows = 1 if c_hat.ndim == 1 or self.reduction == "sum" else c_hat.shape[0]
        return terms.sum() * (self.sign / rows)  # fewer autograd nodes than sum(-1).mean()


class CMAP(_PoolLoss):
    """Contrastive MAP (Mulamba et al. 2021), the hardest negative of :class:`NCE`:
    :math:`\\ell = \\max_{w \\in \\Gamma} s\\,(\\hat c^\\top x^* - \\hat c^\\top w)` (:math:`\\ge 0`
    when :math:`x^* \\in \\Gamma`). Call: ``loss(c_hat, x_true)``."""

    def forward(self, c_hat: Tensor, x_true: Tensor) -> Tensor:
        _check_pair(self.oracle, c_hat, x_true, "x_true")
        pool = self._refreshed_pool(c_hat)
        gap = (c_hat * x_true).sum(-1, keepdim=True) - c_hat @ pool.T
        return _reduce((self.sign * gap).amax(-1), self.reduction)


class ListwiseLTR(_PoolLoss):
    """Listwise learning to rank (Mandi et al. 2022): the cross-entropy between the softmax
    of the true and of the predicted pool objectives,
    :math:`\\ell = -\\sum_{w} \\mathrm{softmax}(-s\\,c^\\top\\Gamma/\\tau)_w
    \\log \\mathrm{softmax}(-s\\,\\hat c^\\top\\Gamma/\\tau)_w`. Call: ``loss(c_hat, c)``."""

    def __init__(self, oracle: Any, pool: SolutionPool, *, tau: float = 1.0, **kw: Any) -> None:
        super().__init__(oracle, pool, **kw)
        self.tau = check_positive("tau", tau)

    def forward(self, c_hat: Tensor, c: Tensor) -> Tensor:
        _check_pair(self.oracle, c_hat, c, "c")
        pool = self._refreshed_pool(c_hat)
        target = F.softmax(-self.sign * (c @ pool.T) / self.tau, dim=-1)
        logp = F.log_softmax(-self.sign * (c_hat @ pool.T) / self.tau, dim=-1)
        return _reduce(-(target * logp).sum(-1), self.reduction)


class PairwiseLTR(_PoolLoss):
    """Pairwise learning to rank (Mandi et al. 2022): with :math:`w^+` the pool's best solution
    under the true cost, :math:`\\ell = \\frac{1}{|\\Gamma| - 1}\\sum_{w \\ne w^+}
    \\max(0, \\text{margin} + s\\,(\\hat c^\\top w^+ - \\hat c^\\top w))`.
    Call: ``loss(c_hat, c)``."""

    def __init__(self, oracle: Any, pool: SolutionPool, *, margin: float = 0.0, **kw: Any) -> None:
        super().__init__(oracle, pool, **kw)
        self.margin = check_positive("margin", margin, allow_zero=True)

    def forward(self, c_hat: Tensor, c: Tensor) -> Tensor:
        _check_pair(self.oracle, c_hat, c, "c")
        pool = self._refreshed_pool(c_hat)
        true_obj = c @ pool.T
        best = true_obj.argmin(-1) if self.sign > 0 else true_obj.argmax(-1)
        pred = c_hat @ pool.T
        diff = self.margin + self.sign * (pred.gather(-1, best.unsqueeze(-1)) - pred)
        others = torch.ones_like(pred, dtype=torch.bool).scatter(-1, best.unsqueeze(-1), False)
        loss = (F.relu(diff) * others).sum(-1) / max(pool.shape[0] - 1, 1)
        return _reduce(loss, self.reduction)


class PointwiseLTR(_PoolLoss):
    """Pointwise learning to rank (Mandi et al. 2022): the mean squared error of the pool
    objectives, :math:`\\ell = \\frac{1}{|\\Gamma|}\\sum_w ((c - \\hat c)^\\top w)^2`.
    Call: ``loss(c_hat, c)``."""

    def forward(self, c_hat: Tensor, c: Tensor) -> Tensor:
        _check_pair(self.oracle, c_hat, c, "c")
        pool = self._refreshed_pool(c_hat)
        return _reduce(((c - c_hat) @ pool.T).square().mean(-1), self.reduction)
