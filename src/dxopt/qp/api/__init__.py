"""The api layer: `solve`, `QPLayer` and the routes a call can take.

Owns `solve` and `QPLayer` (`solve`), the lean compiled paths for one small problem and for
a batch (`small`, `small_batch`), the torch device route (`device`), bounds as rows
(`bounds`) and the kernel warm-up (`warmup`). The public names are re-exported by
`dxopt.qp`, not here.

May import: every other layer of `dxopt.qp`.
"""
