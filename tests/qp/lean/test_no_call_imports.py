"""The lean single path runs no ``import`` statement per call (issue 38: a function-level
import costs the tiny n = 10 solve about a microsecond each, and the route ran two: the LP rule's
and the multiplier selection's)."""

from __future__ import annotations

import builtins
from typing import Any

import torch

import dxopt.qp as dqp


def _problem() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    n, m = 10, 5
    M = torch.randn(n, n, generator=g, dtype=torch.float64)
    G = torch.randn(m, n, generator=g, dtype=torch.float64)
    x0 = torch.randn(n, generator=g, dtype=torch.float64)
    return {
        "P": M @ M.T + torch.eye(n, dtype=torch.float64),
        "q": torch.randn(n, generator=g, dtype=torch.float64).requires_grad_(),
        "A": torch.zeros(0, n, dtype=torch.float64),
        "b": torch.zeros(0, dtype=torch.float64).requires_grad_(),
        "G": G,
        "h": (G @ x0 - 0.5).requires_grad_(),  # some rows active at the solution
    }


def test_lean_single_solve_and_backward_import_nothing(monkeypatch: Any) -> None:
    data = _problem()
    w = torch.linspace(-1.0, 1.0, 10, dtype=torch.float64)
    for solver in ("auto", "daqp"):  # warm: every one-time import done
        sol = dqp.solve(**data, solver=solver)
        (w * sol.x).sum().backward()
    assert sol.info.route == "lean_single"
    calls: list[str] = []
    real_import = builtins.__import__

    def counting_import(name: str, *args: Any, **kwargs: Any) -> Any:
        importer = args[0].get("__name__", "") if args and isinstance(args[0], dict) else ""
        if importer.startswith("dxopt"):  # ours (torch's backward imports on its own)
            calls.append(f"{importer}: {name}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", counting_import)
    for solver in ("auto", "daqp"):
        sol = dqp.solve(**data, solver=solver)
        (w * sol.x).sum().backward()
    monkeypatch.undo()
    assert sol.info.route == "lean_single"
    assert calls == [], f"imports per lean call: {calls}"
