"""Random directions regenerated from integer seeds, so they never need to be stored.

A direction :math:`z` over all parameters is drawn parameter by parameter, in the mapping's
order, from one :class:`torch.Generator` seeded with the direction's seed (MeZO's seed
replay, Malladi et al., arXiv 2305.17333). Optional masks restrict :math:`z` to chosen
entries (sparse perturbations of the top-magnitude weights).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

import torch
from torch import Tensor

from dxopt._core import check_choice

Distribution = Literal["gaussian", "rademacher"]
_DISTRIBUTIONS = ("gaussian", "rademacher")


def check_distribution(distribution: str) -> None:
    check_choice("distribution", distribution, _DISTRIBUTIONS)


def draw_seeds(generator: torch.Generator, n: int) -> list[int]:
    """``n`` direction seeds from ``generator``."""
    return [int(s) for s in torch.randint(0, 2**62, (n,), generator=generator)]


def _sample(p: Tensor, gen: torch.Generator, distribution: Distribution) -> Tensor:
    if distribution == "gaussian":
        return torch.randn(p.shape, generator=gen, dtype=p.dtype, device=p.device)
    signs = torch.randint(0, 2, p.shape, generator=gen, device=p.device)
    return (2 * signs - 1).to(p.dtype)


def iter_direction(
    params: Mapping[str, Tensor],
    seed: int,
    distribution: Distribution,
    masks: Mapping[str, Tensor] | None = None,
) -> Iterator[tuple[str, Tensor]]:
    """Yield ``(name, z_name)`` of the direction with this seed, one parameter at a time."""
    device = next(iter(params.values())).device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    for name, p in params.items():
        z = _sample(p, gen, distribution)
        if masks is not None and name in masks:
            z = z * masks[name]
        yield name, z


def direction(
    params: Mapping[str, Tensor],
    seed: int,
    distribution: Distribution,
    masks: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """The whole direction with this seed as a dict (materialised)."""
    return dict(iter_direction(params, seed, distribution, masks))


def top_magnitude_masks(params: Mapping[str, Tensor], keep_fraction: float) -> dict[str, Tensor]:
    """Per parameter, a 0/1 mask of its ``ceil(keep_fraction * numel)`` largest-|.| entries.

    Sparse perturbation as in the sparse ZO/FmAD variants of Panchal et al.
    (arXiv 2506.21833): only the largest entries are perturbed.
    """
    masks = {}
    for name, p in params.items():
        flat = p.detach().abs().reshape(-1)
        keep = max(1, int(-(-keep_fraction * flat.numel() // 1)))
        mask = torch.zeros_like(flat)
        mask[torch.topk(flat, keep, sorted=False).indices] = 1.0
        masks[name] = mask.reshape(p.shape)
    return masks
