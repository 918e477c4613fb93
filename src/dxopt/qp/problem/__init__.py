"""The problem layer: what a solve starts from and what it ends with.

Owns the canonical problem (`canonical`: validation, layout, convexity checks), the typed
public results and errors (`types`), the contracts between the forward and the backward
(`contracts`: `ForwardResult`, `QPState`, `AdjointInput`, `AdjointSolution`,
`BackwardMethod`) and the `QPExecutor` protocol (`executor`).

May import: `dxopt._core`, `dxopt.linalg` and third-party code; nothing else of `dxopt.qp`.
"""
