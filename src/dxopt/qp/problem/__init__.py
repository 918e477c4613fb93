"""The problem layer: what a solve starts from and what it ends with.

Owns the canonical problem (`canonical`: validation, layout, convexity checks), the typed
public results and errors (`types`), the keyword options (`options`: `QPOptions`), the
contracts between the layers (`contracts`: `ForwardResult`, `QPState`, `QPCall`, `ActiveSet`,
`AdjointInput`, `AdjointSolution`, `BackwardMethod`, `ForwardFactors`), the torch.func glue
(`functorch`) and the `QPExecutor` protocol (`executor`).

May import: `dxopt._core`, `dxopt.linalg` and third-party code; nothing else of `dxopt.qp`.
"""
