r"""Task vectors: fine-tuned weights minus pretrained weights, with their algebra.

A task vector :math:`\tau_t = \theta_t - \theta_0` (Ilharco et al., "Editing Models with Task
Arithmetic", arXiv 2212.04089) edits a model by addition: :math:`\theta_0 + \sum_t
\alpha_t\tau_t` merges skills, :math:`\theta_0 - \alpha\tau_t` unlearns one. For a
:class:`~dxopt.linearize.LinearizedModel` the same vector is its displacement
:math:`\delta`, and adding task vectors adds their first-order effects exactly,
:math:`f_{\mathrm{lin}}(x;\theta_0+\sum_t\alpha_t\tau_t) = f(x;\theta_0) + \sum_t \alpha_t
J\tau_t`.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

import torch
from torch import Tensor, nn

from dxopt.linearize._linear import LinearizedModel

M = TypeVar("M", bound=nn.Module)


def _as_scalar(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real | Tensor):
        raise TypeError(f"{what}: expected a real number, got {type(value).__name__}.")
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_complex():
            raise TypeError(f"{what}: expected a real scalar, got a tensor of shape {value.shape}.")
        value = value.item()
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{what}: expected a finite number, got {out}.")
    return out


class TaskVector(Mapping[str, Tensor]):
    r"""An immutable mapping parameter name -> tensor with vector-space operations.

    ``a + b``, ``a - b``, ``-a``, ``c * a``, ``a / c`` and ``sum([...])`` return new task
    vectors (operands must have the same names and shapes); :meth:`apply_to` writes
    :math:`\theta + \alpha\tau` into a model. The tensors are detached copies.
    """

    __slots__ = ("_tensors",)

    def __init__(self, tensors: Mapping[str, Tensor]) -> None:
        if not isinstance(tensors, Mapping):
            raise TypeError(
                f"tensors: expected a mapping name -> tensor, got {type(tensors).__name__}."
            )
        if not tensors:
            raise ValueError("tensors: a task vector needs at least one entry, got none.")
        out: dict[str, Tensor] = {}
        for name, t in tensors.items():
            if not isinstance(name, str) or not isinstance(t, Tensor):
                raise TypeError(
                    f"tensors: expected str -> Tensor entries, got {type(name).__name__} -> "
                    f"{type(t).__name__}."
                )
            if not t.is_floating_point():
                raise TypeError(
                    f"tensors[{name!r}]: expected a floating-point tensor, got {t.dtype}."
                )
            out[name] = t.detach().clone()
        self._tensors = out

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_models(
        cls,
        pretrained: nn.Module,
        finetuned: nn.Module,
        *,
        names: Iterable[str] | None = None,
    ) -> TaskVector:
        r""":math:`\theta_{\mathrm{ft}} - \theta_0` over ``names`` (default: all parameters).

        A :class:`LinearizedModel` as ``finetuned`` gives its displacement :math:`\delta`
        (``pretrained`` must then be the network it was built from, at :math:`\theta_0`).
        """
        if isinstance(finetuned, LinearizedModel):
            return cls.from_linearized(finetuned)
        for arg, m in (("pretrained", pretrained), ("finetuned", finetuned)):
            if not isinstance(m, nn.Module):
                raise TypeError(f"{arg}: expected an nn.Module, got {type(m).__name__}.")
        p0 = dict(pretrained.named_parameters())
        p1 = dict(finetuned.named_parameters())
        chosen = list(p0) if names is None else list(names)
        missing = [n for n in chosen if n not in p0 or n not in p1]
        if missing:
            raise ValueError(
                f"names: {missing} are not parameters of both models; the two models must "
                "share an architecture."
            )
        diffs = {}
        for n in chosen:
            if p0[n].shape != p1[n].shape:
                raise ValueError(
                    f"finetuned: parameter {n!r} has shape {tuple(p1[n].shape)}, the "
                    f"pretrained one {tuple(p0[n].shape)}."
                )
            diffs[n] = p1[n].detach() - p0[n].detach()
        return cls(diffs)

    @classmethod
    def from_linearized(cls, model: LinearizedModel) -> TaskVector:
        r"""The displacement :math:`\delta` of a linearized model (its task vector)."""
        if not isinstance(model, LinearizedModel):
            raise TypeError(f"model: expected a LinearizedModel, got {type(model).__name__}.")
        return cls(model.delta_params())

    @classmethod
    def zeros_like(cls, other: TaskVector) -> TaskVector:
        return cls({n: torch.zeros_like(t) for n, t in other.items()})

    # -- mapping -----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"TaskVector({len(self)} tensors, {self.numel()} entries, norm {self.norm():.4g})"

    # -- algebra -----------------------------------------------------------------------------
    def _check_same(self, other: object, op: str) -> TaskVector:
        if not isinstance(other, TaskVector):
            raise TypeError(
                f"TaskVector {op}: expected another TaskVector, got {type(other).__name__}."
            )
        if set(self) != set(other):
            raise ValueError(
                f"TaskVector {op}: the operands have different names; only in the left: "
                f"{sorted(set(self) - set(other))}, only in the right: "
                f"{sorted(set(other) - set(self))}."
            )
        for n in self:
            if self[n].shape != other[n].shape:
                raise ValueError(
                    f"TaskVector {op}: {n!r} has shapes {tuple(self[n].shape)} and "
                    f"{tuple(other[n].shape)}."
                )
        return other

    def __add__(self, other: object) -> TaskVector:
        o = self._check_same(other, "+")
        return TaskVector({n: t + o[n] for n, t in self.items()})

    def __radd__(self, other: object) -> TaskVector:
        if isinstance(other, int) and other == 0:  # sum([...]) starts from 0
            return self
        return self._check_same(other, "+") + self

    def __sub__(self, other: object) -> TaskVector:
        o = self._check_same(other, "-")
        return TaskVector({n: t - o[n] for n, t in self.items()})

    def __neg__(self) -> TaskVector:
        return TaskVector({n: -t for n, t in self.items()})

    def __mul__(self, scale: object) -> TaskVector:
        c = _as_scalar(scale, "TaskVector * scale")
        return TaskVector({n: c * t for n, t in self.items()})

    __rmul__ = __mul__

    def __truediv__(self, scale: object) -> TaskVector:
        c = _as_scalar(scale, "TaskVector / scale")
        if c == 0.0:
            raise ValueError("TaskVector / scale: division by zero.")
        return TaskVector({n: t / c for n, t in self.items()})

    def dot(self, other: TaskVector) -> float:
        o = self._check_same(other, "dot")
        return float(sum((t.double() * o[n].double()).sum() for n, t in self.items()))

    def norm(self) -> float:
        """The Euclidean norm of all entries together."""
        return math.sqrt(sum(float(t.double().pow(2).sum()) for t in self.values()))

    def cosine(self, other: TaskVector) -> float:
        denom = self.norm() * other.norm()
        if denom == 0.0:
            raise ValueError("TaskVector.cosine: one of the vectors is zero.")
        return self.dot(other) / denom

    def numel(self) -> int:
        return sum(t.numel() for t in self.values())

    def allclose(self, other: TaskVector, *, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
        o = self._check_same(other, "allclose")
        return all(torch.allclose(t, o[n], rtol=rtol, atol=atol) for n, t in self.items())

    def to(self, *args: object, **kwargs: object) -> TaskVector:
        """Like :meth:`torch.Tensor.to` on every entry."""
        return TaskVector({n: t.to(*args, **kwargs) for n, t in self.items()})  # type: ignore[call-overload]

    # -- editing -----------------------------------------------------------------------------
    def apply_to(self, model: M, alpha: float = 1.0, *, inplace: bool = False) -> M:
        r"""Return ``model`` with :math:`\alpha\tau` added to its weights.

        For an ordinary module the named parameters become :math:`\theta + \alpha\tau`; for a
        :class:`LinearizedModel` the displacement becomes :math:`\delta + \alpha\tau` (so a
        fresh linearized model evaluates :math:`f_{\mathrm{lin}}(x;\theta_0+\alpha\tau)`).
        A deep copy is edited unless ``inplace=True``.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}.")
        a = _as_scalar(alpha, "alpha")
        target = model if inplace else copy.deepcopy(model)
        if isinstance(target, LinearizedModel):
            params: dict[str, Tensor] = dict(target.delta_params())
        else:
            params = dict(target.named_parameters())
        missing = [n for n in self if n not in params]
        if missing:
            kind = "linearized parameters" if isinstance(target, LinearizedModel) else "parameters"
            raise ValueError(
                f"model: the task vector's {missing} are not {kind} of the model; "
                f"it has {sorted(params)}."
            )
        with torch.no_grad():
            for n, t in self.items():
                if params[n].shape != t.shape:
                    raise ValueError(
                        f"model: parameter {n!r} has shape {tuple(params[n].shape)}, the task "
                        f"vector {tuple(t.shape)}."
                    )
                params[n].add_(t.to(params[n]), alpha=a)
        return target
