"""The digits suite: a small CNN pretrained on upright digits, four tasks on transformed ones.

Data: scikit-learn's bundled ``load_digits`` (1,797 8x8 handwritten digits; nothing is
downloaded), split once into train/val/test (60/20/20, stratified, fixed seed). The pretext
task, which also serves as the *control* task for negation, is 10-way digit recognition on
the upright images. The four fine-tuning tasks are 10-way digit recognition on disjoint input
domains made by fixed transformations: rotated 90 degrees, rotated 180 degrees, mirrored
left-right, and intensity-inverted. Each task has a linear head fitted on the pretrained
features and then frozen (the "zero-shot" heads of tangent task arithmetic); fine-tuning
moves only the backbone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import Tensor, nn

TRANSFORMS: dict[str, Callable[[Tensor], Tensor]] = {
    "rot90": lambda x: torch.rot90(x, 1, dims=(-2, -1)),
    "rot180": lambda x: torch.rot90(x, 2, dims=(-2, -1)),
    "mirror": lambda x: torch.flip(x, dims=(-1,)),
    "invert": lambda x: 1.0 - x,
}
TASKS = tuple(TRANSFORMS)
CONTROL = "upright"


class Backbone(nn.Module):
    """conv(1->8) - conv(8->16) - maxpool - linear(256->48): 48 ReLU features (~14k weights)."""

    def __init__(self, width: int = 8, features: int = 48) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc = nn.Linear(2 * width * 16, features)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.conv1(x))
        h = nn.functional.max_pool2d(torch.relu(self.conv2(h)), 2)
        return torch.relu(self.fc(h.flatten(1)))


@dataclass(frozen=True)
class Split:
    x: Tensor  # (n, 1, 8, 8) in [0, 1]
    y: Tensor  # (n,) int64


@dataclass(frozen=True)
class Suite:
    """Per task (and the control) train/val/test splits, the backbone at theta_0, the heads."""

    data: dict[str, dict[str, Split]]  # task -> {"train", "val", "test"}
    backbone: Backbone
    heads: dict[str, PrototypeHead]
    pretrain_seconds: float


def load_splits() -> dict[str, dict[str, Split]]:
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    idx = np.arange(len(y))
    train, rest = train_test_split(idx, test_size=0.4, stratify=digits.target, random_state=0)
    val, test = train_test_split(rest, test_size=0.5, stratify=digits.target[rest], random_state=0)
    parts = {"train": train, "val": val, "test": test}
    out = {CONTROL: {k: Split(x[v], y[v]) for k, v in parts.items()}}
    for name, fn in TRANSFORMS.items():
        out[name] = {k: Split(fn(x[v]), y[v]) for k, v in parts.items()}
    return out


class PrototypeHead(nn.Module):
    """Cosine similarity of centred features to centred class means at theta_0, times 20.

    The analogue of CLIP's zero-shot heads in tangent task arithmetic: built from the
    pretrained features alone (class means of the task's training split, centred by their
    overall mean, since ReLU features are all non-negative), never trained, frozen during
    fine-tuning.
    """

    def __init__(self, features: Tensor, y: Tensor, *, temperature: float = 20.0) -> None:
        super().__init__()
        center = features.mean(0)
        means = torch.stack([features[y == c].mean(0) for c in range(int(y.max()) + 1)])
        self.register_buffer("center", center)
        self.register_buffer("prototypes", nn.functional.normalize(means - center, dim=1))
        self.temperature = temperature

    def forward(self, features: Tensor) -> Tensor:
        f = nn.functional.normalize(features - self.center, dim=1)
        return self.temperature * f @ self.prototypes.T


def build_suite(seed: int, *, epochs: int = 15, quick: bool = False) -> Suite:
    """Pretrain the backbone (with a pretext head) on upright train digits, fit the heads."""
    import time

    data = load_splits()
    torch.manual_seed(seed)
    backbone = Backbone()
    pretext = nn.Linear(48, 10)
    params = [*backbone.parameters(), *pretext.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)
    train = data[CONTROL]["train"]
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for _ in range(2 if quick else epochs):
        perm = torch.randperm(len(train.y), generator=g)
        for i in range(0, len(perm), 64):
            b = perm[i : i + 64]
            loss = nn.functional.cross_entropy(pretext(backbone(train.x[b])), train.y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    seconds = time.perf_counter() - t0
    backbone.requires_grad_(True)
    with torch.no_grad():
        heads = {
            t: PrototypeHead(backbone(data[t]["train"].x), data[t]["train"].y)
            for t in (CONTROL, *TASKS)
        }
    return Suite(data=data, backbone=backbone, heads=heads, pretrain_seconds=seconds)
