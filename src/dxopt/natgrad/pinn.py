"""A small zoo of physics-informed (PINN) least-squares problems.

Each problem gives per-point residual rows for a network :math:`u_\\theta` (interior PDE residual
and boundary residual), point samplers, and the relative :math:`L^2` error on a fixed test set,

.. math::

    \\mathrm{err}(\\theta) = \\|u_\\theta - u^\\star\\|_2 / \\|u^\\star\\|_2 .

Problems (Müller and Zeinhofer, arXiv:2302.13163; Dangel, Müller, Zeinhofer, arXiv:2405.15603):

- :class:`Poisson1D`: :math:`-u'' = \\pi^2 \\sin\\pi x` on :math:`[0,1]`, :math:`u(0) = u(1) = 0`;
  :math:`u^\\star = \\sin\\pi x` (the smallest problem, for tuning and tests).
- :class:`Poisson2D`: :math:`-\\Delta u = 2\\pi^2 \\sin\\pi x \\sin\\pi y` on :math:`[0,1]^2`,
  :math:`u = 0` on the boundary; :math:`u^\\star = \\sin\\pi x\\,\\sin\\pi y`.
- :class:`Heat1D`: :math:`u_t = \\tfrac14 u_{xx}` on :math:`[0,1]^2`, :math:`u(x,0)=\\sin\\pi x`,
  :math:`u(0,t)=u(1,t)=0`; :math:`u^\\star = e^{-\\pi^2 t/4}\\sin\\pi x`.
- :class:`Poisson5D`: :math:`-\\Delta u = \\pi^2\\sum_i\\cos\\pi x_i` on :math:`[0,1]^5`,
  :math:`u = u^\\star = \\sum_i \\cos\\pi x_i` on the boundary.

Input derivatives come from :func:`input_derivatives`: batched forward propagation of the
gradient and Hessian diagonal for tanh MLPs, forward-over-reverse :mod:`torch.func` otherwise.
The per-row parameter Jacobian is one ``vmap(grad)`` over points of that
(:class:`~dxopt.natgrad.RowwiseResidual`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, jacfwd, jacrev, vmap

from dxopt.natgrad._jacobian import Params, RowwiseResidual
from dxopt.natgrad._mlp_jacobian import layer_param, mlp_operator_jacobian

__all__ = [
    "Heat1D",
    "PINNProblem",
    "Poisson1D",
    "Poisson2D",
    "Poisson5D",
    "input_derivatives",
    "tanh_mlp",
]

PI = math.pi


def tanh_mlp(
    dim: int, hidden: tuple[int, ...] = (32,), *, dtype: torch.dtype = torch.float64, seed: int = 0
) -> nn.Sequential:
    """A tanh multilayer perceptron ``dim -> hidden... -> 1`` (float64 by default)."""
    gen = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    widths = (dim, *hidden)
    for w_in, w_out in itertools.pairwise(widths):
        layers += [nn.Linear(w_in, w_out, dtype=dtype), nn.Tanh()]
    layers.append(nn.Linear(widths[-1], 1, dtype=dtype))
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for p in model.parameters():
            bound = 1.0 / math.sqrt(p.shape[-1]) if p.ndim == 2 else 0.5
            p.uniform_(-bound, bound, generator=gen)
    return model


def _is_tanh_mlp(model: nn.Module) -> bool:
    return (
        isinstance(model, nn.Sequential)
        and len(model) > 0
        and all(isinstance(m, (nn.Linear, nn.Tanh)) for m in model)
        and isinstance(model[-1], nn.Linear)
    )


def _mlp_forward_derivatives(
    model: nn.Sequential, params: Params, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Forward propagation of value, input gradient and Hessian diagonal through a tanh MLP.

    For :math:`z = W h + b`: :math:`\nabla z = W \nabla h`, :math:`\partial_{jj} z = W
    \partial_{jj} h`; for :math:`a = \tanh z`: :math:`\nabla a = \sigma' \nabla z` and
    :math:`\partial_{jj} a = \sigma' \partial_{jj} z + \sigma'' (\partial_j z)^2` with
    :math:`\sigma' = 1 - a^2`, :math:`\sigma'' = -2 a \sigma'` (the forward Laplacian of
    Li et al., arXiv:2307.00212, restricted to the Hessian diagonal).
    """
    n, d = x.shape
    h = x
    # grad[k, j, :] = d h_k / d x_j and diag[k, j, :] = d^2 h_k / d x_j^2 (layout (n, d, width)).
    grad = torch.eye(d, dtype=x.dtype, device=x.device).expand(n, d, d)
    diag = torch.zeros_like(grad)
    for name, module in model.named_children():
        if isinstance(module, nn.Linear):
            weight_t = layer_param(params, module, name, "weight").T
            h = h @ weight_t
            if module.bias is not None:
                h = h + layer_param(params, module, name, "bias")
            grad = grad @ weight_t
            diag = diag @ weight_t
        else:
            h = torch.tanh(h)
            s1 = (1 - h * h).unsqueeze(1)
            s2 = -2 * h.unsqueeze(1) * s1
            diag = s1 * diag + s2 * grad * grad
            grad = s1 * grad
    return h.reshape(n), grad.reshape(n, d), diag.reshape(n, d)


def input_derivatives(
    model: nn.Module, params: Params, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Value, input gradient and Hessian diagonal of a scalar network at each point.

    Args:
        model: a network mapping ``(n, d)`` inputs to ``(n, 1)`` or ``(n,)`` outputs.
        params: its parameters (as for :func:`torch.func.functional_call`).
        x: ``(n, d)`` points.

    Returns:
        ``(u, grad, hess_diag)`` shaped ``(n,)``, ``(n, d)``, ``(n, d)``.

    An ``nn.Sequential`` of ``Linear``/``Tanh`` layers takes a batched forward-propagation
    path; any other model uses ``vmap`` over points of :func:`torch.func.jacfwd` of
    :func:`torch.func.jacrev` (forward-over-reverse), which gives the same numbers.
    """
    if _is_tanh_mlp(model):
        assert isinstance(model, nn.Sequential)
        return _mlp_forward_derivatives(model, params, x)

    def u(xx: torch.Tensor) -> torch.Tensor:
        return functional_call(model, dict(params), (xx.unsqueeze(0),)).reshape(())

    def grad_with_aux(xx: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        g, value = jacrev(u, has_aux=False)(xx), u(xx)
        return g, (g, value)

    def one(xx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hess, (g, value) = jacfwd(grad_with_aux, has_aux=True)(xx)
        return value, g, hess.diagonal()

    return vmap(one)(x)


class PINNProblem:
    """Base class: a PDE on :math:`[0,1]^d` with interior and boundary residual rows.

    Subclasses define :meth:`exact`, :meth:`interior_row` and the boundary sampler. A batch is
    the tuple ``(interior_points, boundary_points)``.
    """

    name = "pinn"
    dim = 2

    def __init__(self, *, dtype: torch.dtype = torch.float64, test_points: int = 100):
        self.dtype = dtype
        self.test_points = test_points

    # -- the PDE -----------------------------------------------------------------------------
    def exact(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def operator(self) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        """Coefficients :math:`(a, b, c)` of the interior operator
        :math:`a u + b\\cdot\\nabla u + c\\cdot\\operatorname{diag}\\nabla^2 u`."""
        raise NotImplementedError

    def source(self, x: torch.Tensor) -> torch.Tensor:
        """Right-hand side :math:`f(x)` of the interior equation."""
        raise NotImplementedError

    def interior_row(self, model: nn.Module) -> Callable[[Params, torch.Tensor], torch.Tensor]:
        """Interior rows :math:`a u + b\\cdot\\nabla u + c\\cdot\\mathrm{diag}\\nabla^2 u - f`."""
        a, b, c = self.operator()
        b_t = torch.tensor(b, dtype=self.dtype)
        c_t = torch.tensor(c, dtype=self.dtype)

        def row(params: Params, x: torch.Tensor) -> torch.Tensor:
            u, grad, hess_diag = input_derivatives(model, params, x)
            return a * u + grad @ b_t + hess_diag @ c_t - self.source(x)

        return row

    def boundary_row(self, model: nn.Module) -> Callable[[Params, torch.Tensor], torch.Tensor]:
        def row(params: Params, x: torch.Tensor) -> torch.Tensor:
            return functional_call(model, dict(params), (x,)).reshape(-1) - self.exact(x)

        return row

    def residual(self, model: nn.Module) -> RowwiseResidual:
        """The residual rows (interior, boundary), each block scaled by :math:`1/\\sqrt{N_b}`.

        For a tanh MLP the Jacobian comes from the closed-form reverse sweep of
        :func:`~dxopt.natgrad._mlp_jacobian.mlp_operator_jacobian` (same numbers as
        ``vmap(grad)``, far fewer operations); otherwise from ``vmap(grad)``.
        """
        return _PINNResidual(self, model)

    # -- points ------------------------------------------------------------------------------
    def sample_interior(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.rand(n, self.dim, generator=generator, dtype=self.dtype)

    def sample_boundary(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Uniform on the faces of the unit cube: one coordinate set to 0 or 1."""
        x = torch.rand(n, self.dim, generator=generator, dtype=self.dtype)
        face = torch.randint(0, self.dim, (n,), generator=generator)
        side = torch.randint(0, 2, (n,), generator=generator).to(self.dtype)
        x[torch.arange(n), face] = side
        return x

    def sample(
        self, n_interior: int, n_boundary: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch ``(interior, boundary)``."""
        return self.sample_interior(n_interior, generator), self.sample_boundary(
            n_boundary, generator
        )

    def grid_batch(
        self, n_side: int = 30, n_boundary: int = 120
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed batch: midpoints of an ``n_side^d`` grid and equispaced boundary points."""
        mids = (torch.arange(n_side, dtype=self.dtype) + 0.5) / n_side
        interior = torch.cartesian_prod(*([mids] * self.dim)).reshape(-1, self.dim)
        return interior, self._boundary_grid(n_boundary)

    def _boundary_grid(self, n: int) -> torch.Tensor:
        faces = 2 * self.dim
        per_face = max(n // faces, 1)
        t = (torch.arange(per_face, dtype=self.dtype) + 0.5) / per_face
        gen = torch.Generator().manual_seed(1234)
        pts = []
        for k in range(faces):
            x = torch.rand(per_face, self.dim, generator=gen, dtype=self.dtype)
            x[:, (k // 2 + 1) % self.dim] = t
            x[:, k // 2] = float(k % 2)
            pts.append(x)
        return torch.cat(pts)

    def test_set(self) -> torch.Tensor:
        """Fixed test points: a 100 x 100 midpoint grid in 2D, 10^4 seeded points otherwise."""
        if self.dim == 2:
            g = (torch.arange(self.test_points, dtype=self.dtype) + 0.5) / self.test_points
            return torch.cartesian_prod(g, g)
        gen = torch.Generator().manual_seed(4321)
        return torch.rand(self.test_points**2, self.dim, generator=gen, dtype=self.dtype)

    @torch.no_grad()
    def relative_l2(self, model: nn.Module, points: torch.Tensor | None = None) -> float:
        """Relative error :math:`\\|u_\\theta - u^\\star\\| / \\|u^\\star\\|` on the test set."""
        x = self.test_set() if points is None else points
        pred = model(x).reshape(-1)
        ref = self.exact(x)
        return float(torch.linalg.vector_norm(pred - ref) / torch.linalg.vector_norm(ref))


class _PINNResidual(RowwiseResidual):
    """PINN residual whose Jacobian uses the closed-form sweep for tanh MLPs."""

    def __init__(self, problem: PINNProblem, model: nn.Module) -> None:
        dtypes = {p.dtype for p in model.parameters()}
        if dtypes and dtypes != {problem.dtype}:
            raise TypeError(
                f"model: its parameters are {sorted(map(str, dtypes))} but the "
                f"{type(problem).__name__} problem is {problem.dtype}; make them match, e.g. "
                f"model.to({problem.dtype}) (float64 is recommended for PINNs) or "
                f"{type(problem).__name__}(dtype={next(iter(dtypes))})."
            )
        super().__init__(
            [problem.interior_row(model), problem.boundary_row(model)],
            names=("interior", "boundary"),
        )
        self.problem, self.model = problem, model

    def residual_and_jacobian(
        self, params: Params, batch: Any, *, chunk_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not _is_tanh_mlp(self.model):
            return super().residual_and_jacobian(params, batch, chunk_size=chunk_size)
        assert isinstance(self.model, nn.Sequential)
        interior, boundary = self._check_batch(batch)
        a, b, c = self.problem.operator()
        dt = interior.dtype
        d = interior.shape[1]
        blocks = [
            (
                interior,
                a,
                torch.tensor(b, dtype=dt),
                torch.tensor(c, dtype=dt),
                self.problem.source,
            ),
            (boundary, 1.0, torch.zeros(d, dtype=dt), torch.zeros(d, dtype=dt), self.problem.exact),
        ]
        values, jacobians = [], []
        for points, a_k, b_k, c_k, rhs in blocks:
            scale = 1.0 / math.sqrt(points.shape[0])
            val, jac = mlp_operator_jacobian(
                self.model,
                params,
                points,
                value_coef=a_k,
                grad_coef=b_k,
                diag_coef=c_k,
                names=list(params),
            )
            values.append((val - rhs(points)) * scale)
            jacobians.append(jac * scale)
        return torch.cat(values), torch.cat(jacobians)


class Poisson1D(PINNProblem):
    """:math:`-u'' = \\pi^2\\sin\\pi x` on :math:`[0,1]`, :math:`u(0) = u(1) = 0`.

    The boundary rows are the two end points (alternating, so any ``n >= 2`` has both); the
    test set is 10^4 seeded points.
    """

    name = "poisson1d"
    dim = 1

    def sample_boundary(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return (torch.arange(n) % 2).to(self.dtype).reshape(n, 1)

    def _boundary_grid(self, n: int) -> torch.Tensor:
        return self.sample_boundary(n, torch.Generator())

    def exact(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(PI * x[..., 0])

    def operator(self) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        return 0.0, (0.0,), (-1.0,)

    def source(self, x: torch.Tensor) -> torch.Tensor:
        return PI**2 * self.exact(x)


class Poisson2D(PINNProblem):
    """:math:`-\\Delta u = 2\\pi^2\\sin\\pi x\\sin\\pi y` in the unit square, zero on its edge."""

    name = "poisson2d"
    dim = 2

    def exact(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(PI * x[..., 0]) * torch.sin(PI * x[..., 1])

    def operator(self) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        return 0.0, (0.0, 0.0), (-1.0, -1.0)

    def source(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * PI**2 * self.exact(x)


class Poisson5D(PINNProblem):
    """:math:`-\\Delta u = \\pi^2\\sum_i\\cos\\pi x_i` on :math:`[0,1]^5`.

    Dirichlet data :math:`u = u^\\star = \\sum_i\\cos\\pi x_i` on the boundary.
    """

    name = "poisson5d"
    dim = 5

    def exact(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(PI * x).sum(-1)

    def operator(self) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        return 0.0, (0.0,) * 5, (-1.0,) * 5

    def source(self, x: torch.Tensor) -> torch.Tensor:
        return PI**2 * self.exact(x)


class Heat1D(PINNProblem):
    """Heat equation :math:`u_t = \\tfrac14 u_{xx}` on :math:`(x, t) \\in [0,1]^2`.

    The solution is :math:`u^\\star = e^{-\\pi^2 t/4}\\sin\\pi x`.

    The boundary rows cover the initial line :math:`t = 0` and the walls :math:`x \\in \\{0, 1\\}`.
    """

    name = "heat1d"
    dim = 2

    def exact(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(-(PI**2) * x[..., 1] / 4) * torch.sin(PI * x[..., 0])

    def operator(self) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        return 0.0, (0.0, 1.0), (-0.25, 0.0)

    def source(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x[..., 0])

    def sample_boundary(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Points on :math:`t = 0`, :math:`x = 0` and :math:`x = 1` (no final-time face)."""
        x = torch.rand(n, 2, generator=generator, dtype=self.dtype)
        face = torch.randint(0, 3, (n,), generator=generator)
        x[face == 0, 1] = 0.0
        x[face == 1, 0] = 0.0
        x[face == 2, 0] = 1.0
        return x

    def _boundary_grid(self, n: int) -> torch.Tensor:
        per = max(n // 3, 1)
        t = (torch.arange(per, dtype=self.dtype) + 0.5) / per
        zeros, ones = torch.zeros_like(t), torch.ones_like(t)
        return torch.cat(
            [torch.stack([t, zeros], -1), torch.stack([zeros, t], -1), torch.stack([ones, t], -1)]
        )
