"""Every private torch name dxopt uses, in one place, each with the reason it is needed.

torch gives no stability promise for names that start with ``_``; when an upgrade moves one,
this module (and ``tests/core/test_torch_compat.py``) says which name and which torch version,
instead of a failure deep inside a solve. Library code imports these names from here and from
nowhere else (the test checks that too). :data:`PRIVATE_NAMES` lists each one with its why;
the ones marked optional have a fallback at their use site, so dxopt keeps working (slower, or
with a feature refused) when torch drops them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "PRIVATE_NAMES",
    "BatchNormBase",
    "SingleLevelFunction",
    "TorchDispatchMode",
    "functorch_get_unwrapped",
    "functorch_is_batched",
    "functorch_is_wrapped",
    "functorch_transforms_active",
    "functorch_unwrap_dead_wrappers",
    "functorch_unwrap_if_dead",
    "is_legacy_batched_tensor",
    "register_pytree_node",
    "resolve",
    "standard_gamma",
    "tree_flatten",
    "tree_map",
]

PRIVATE_NAMES: dict[str, tuple[str, bool]] = {
    # name: (why dxopt needs it, optional)
    "torch._C._are_functorch_transforms_active": (
        "no public API says whether a torch.func transform is running; qp routes such calls "
        "to its functorch-aware path and skips a Python apply overhead otherwise",
        False,
    ),
    "torch._C._functorch.is_functorch_wrapped_tensor": (
        "walking a tensor's torch.func wrappers to find a vmap level (qp vmapped())",
        False,
    ),
    "torch._C._functorch.is_batchedtensor": (
        "whether a wrapper level is a vmap batch (values then differ per sample)",
        False,
    ),
    "torch._C._functorch.get_unwrapped": ("the next wrapper level down", False),
    "torch._C._functorch.unwrap_if_dead": (
        "what Function.apply does to each input; the lean small-QP apply does it inline",
        True,
    ),
    "torch._C._functorch.is_legacy_batchedtensor": (
        "refusing the legacy vmap's batched cotangents (is_grads_batched=True) in backward",
        True,
    ),
    "torch._functorch.utils.unwrap_dead_wrappers": (
        "the first step of Function.apply, repeated by QPFunction.apply's fast path",
        True,
    ),
    "torch.autograd.function._SingleLevelFunction": (
        "the base whose C++ apply the lean small-QP path calls without the Python wrapper",
        True,
    ),
    "torch.utils._pytree.register_pytree_node": (
        "QPSolution as a pytree, so torch.func transforms can return it (no public API)",
        False,
    ),
    "torch.utils._pytree.tree_map": ("mapping over a model's nested outputs", False),
    "torch.utils._pytree.tree_flatten": ("the tensors among an op's nested arguments", False),
    "torch.utils._python_dispatch.TorchDispatchMode": (
        "counting storage reads and live memory per aten op (estimators' accounting)",
        False,
    ),
    "torch._standard_gamma": (
        "Gamma draws from an explicit torch.Generator (dfl's sum-of-Gamma noise); "
        "torch.distributions.Gamma takes no generator",
        False,
    ),
    "torch.nn.modules.batchnorm._BatchNorm": (
        "the common base of BatchNorm1d/2d/3d and their lazy forms (linearize refuses "
        "running-statistics updates)",
        False,
    ),
}


def resolve(name: str, *, optional: bool = False) -> Any:
    """The object at the dotted ``name`` (a module path, then attributes). A missing name
    raises ``ImportError`` naming it and the torch version, or gives ``None`` with
    ``optional``."""
    parts = name.split(".")
    obj: Any = None
    for i in range(len(parts), 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    if optional:
        return None
    why = f" ({PRIVATE_NAMES[name][0]})" if name in PRIVATE_NAMES else ""
    raise ImportError(
        f"dxopt needs the private torch name {name}{why}, "
        f"which torch {torch.__version__} does not have. Install the torch version dxopt pins "
        "(pyproject.toml) or report it: dxopt._core.torch_compat is the one place to adapt."
    )


try:  # the required names: a torch without one fails here, naming it and the version
    from torch.nn.modules.batchnorm import _BatchNorm as BatchNormBase
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import register_pytree_node, tree_flatten, tree_map

    functorch_transforms_active = torch._C._are_functorch_transforms_active
    functorch_is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    functorch_is_batched = torch._C._functorch.is_batchedtensor
    functorch_get_unwrapped = torch._C._functorch.get_unwrapped
    standard_gamma = torch._standard_gamma
except (ImportError, AttributeError) as err:  # pragma: no cover - another torch
    raise ImportError(
        f"dxopt needs a private torch name that torch {torch.__version__} does not have ({err}); "
        "see dxopt._core.torch_compat.PRIVATE_NAMES."
    ) from err

# the optional names (None when missing; their users fall back)
functorch_unwrap_if_dead: Callable[[Any], Any] | None = resolve(
    "torch._C._functorch.unwrap_if_dead", optional=True
)
is_legacy_batched_tensor: Callable[[torch.Tensor], bool] | None = resolve(
    "torch._C._functorch.is_legacy_batchedtensor", optional=True
)
functorch_unwrap_dead_wrappers: Callable[[Any], Any] | None = resolve(
    "torch._functorch.utils.unwrap_dead_wrappers", optional=True
)
SingleLevelFunction: Any = resolve(  # a class, or None
    "torch.autograd.function._SingleLevelFunction", optional=True
)
