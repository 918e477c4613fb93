"""The api layer: `solve`, `QPLayer` and the routes a call can take.

Owns `solve` and `QPLayer` (`solve`, `layer`), the plan (`route`), the runners of the general,
lean and device routes (`general`, `lean`, `device`; the lean engine itself is
`dxopt.qp.lean`), bounds as rows (`bounds`), the result record (`result`), the custom ops
under torch.compile (`compiled`) and the kernel warm-up (`warmup`, which runs `solve`).
The public names are re-exported by `dxopt.qp`, not here.

May import: every other layer of `dxopt.qp`.
"""
