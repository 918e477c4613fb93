"""Why PFYL's regret differs between dxopt and PyEPO on the JAIR knapsack: the noise stream.

Both libraries draw the perturbations :math:`Z \\sim N(0, I)` of the perturbed Fenchel-Young loss
from ``torch.Generator().manual_seed(seed)``; PyEPO draws them in the costs' dtype (float32
here), dxopt in float64, so the draws differ and, with ``n_samples=1``, so do the training runs.
This script trains PFYL on ``knapsack-60`` in both libraries twice: with dxopt's own stream,
and with dxopt's draws replaced by PyEPO's (float32 from the same generator). With PyEPO's
stream the regrets are equal; the remaining difference is the seed-to-seed variance of the
noise, not the method.

Run: ``python -m benchmarks.dfl.jair_pfyl_stream [--seeds 0 1] [--epochs 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


@contextlib.contextmanager
def pyepo_noise_stream() -> Iterator[None]:
    """dxopt's perturbed losses draw their noise as PyEPO does: ``randn`` in the costs' dtype."""
    from dxopt.dfl import losses

    original = losses._Perturbed._sample

    def _sample(self: Any, c_hat: Tensor) -> tuple[Tensor, Tensor]:
        flat = c_hat.detach().reshape(-1, c_hat.shape[-1])
        shape = (flat.shape[0], self.n_samples, flat.shape[1])
        noise = torch.randn(shape, generator=self.generator, dtype=c_hat.dtype)
        perturbed = flat.unsqueeze(1) + self.sigma * noise
        x = self.solver(perturbed.reshape(-1, flat.shape[1])).reshape(perturbed.shape)
        return noise, x

    losses._Perturbed._sample = _sample  # type: ignore[method-assign]
    try:
        yield
    finally:
        losses._Perturbed._sample = original  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from benchmarks.dfl.jair_suite import run_one

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = []
    for stream in ("own", "pyepo"):
        for seed in args.seeds:
            ctx = pyepo_noise_stream() if stream == "pyepo" else contextlib.nullcontext()
            with ctx:
                rows = run_one(
                    "knapsack", "PFYL", seed, epochs=args.epochs, num_train=None, option=60
                )
            regret = {r["library"]: r["regret"] for r in rows}
            out.append({"dxopt_stream": stream, "seed": seed, **regret})
            print(
                f"dxopt noise {stream:5s} seed {seed}: regret dxopt {regret['dxopt']:.4f}, "
                f"PyEPO {regret['pyepo']:.4f}",
                flush=True,
            )
    return out


if __name__ == "__main__":
    main()
