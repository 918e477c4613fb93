r"""Ji's hard bilevel instance with analytic banded oracles (arXiv 2511.19656, v2, eqs. 6-7).

Variables :math:`x \in \mathbb R^T` and :math:`\tilde y = [y^{(0)}, \dots, y^{(T)}]`,
:math:`y^{(i)} \in \mathbb R^n`; :math:`A` is the :math:`n\times n` path Laplacian and
:math:`\kappa = 4n^2 + 1`.

.. math::

    g(x; \tilde y) = \sum_{i=0}^{T}\Big[\frac{L_g n^2}{2(4n^2+1)}
        y^{(i)\top}\big(\tfrac{I}{n^2} + A\big) y^{(i)} - L_g x_i y^{(i)}_n\Big],
    \qquad x_0 = \frac{\lambda}{C_l M_{n,n}} \text{ fixed},

    f(x; \tilde y) = \sum_{i=1}^{T} \frac{\lambda^2 L_f}{L}\Big[
        \Psi\big(-\tfrac{C_l y^{(i-1)}_n}{\lambda}\big)\Phi\big(-\tfrac{C_r y^{(i)}_1}{\lambda}
        \big) - \Psi\big(\tfrac{C_l y^{(i-1)}_n}{\lambda}\big)\Phi\big(\tfrac{C_r y^{(i)}_1}
        {\lambda}\big)\Big],

with :math:`M = \frac{4n^2+1}{n^2}(I/n^2 + A)^{-1}`, :math:`C_l M_{n,n} = C_r M_{1,n} =
C_e n`, so :math:`y^{*(i)} = M e_n x_i` and :math:`H(x) = \frac{\lambda^2 L_f}{L}\bar f_T(u)`
with :math:`u_i = C_e n x_i/\lambda` (Carmon's chain). With :math:`\lambda = \epsilon L /
(L_f C_e n)` and :math:`T = \lfloor \Delta L/(12\lambda^2 L_f)\rfloor`, reaching
:math:`\|\nabla H\| \le \epsilon` takes at least :math:`Tn \propto \kappa^{3/2}\epsilon^{-2}`
calls of a zero-respecting method (the activation order is :math:`y^{(i-1)}_n \to
y^{(i)}_1 \to \dots \to y^{(i)}_n \to x_i`).

Every oracle is :math:`O(Tn)` (banded), float64, and exact.
:class:`JiBernoulliOracle` is the stochastic oracle of eq. 14: every gradient coordinate
that would extend the support of the query is multiplied by :math:`\xi/p`,
:math:`\xi\sim\mathrm{Bernoulli}(p)` (one draw per call); ``f`` stays noiseless.
"""

from __future__ import annotations

import math

import torch

from dxopt.bilevel.chains import phi, phi_prime, psi

__all__ = ["JiBernoulliOracle", "JiInstance"]


def _path_laplacian_rows(Y: torch.Tensor) -> torch.Tensor:
    D = Y[:, 1:] - Y[:, :-1]
    out = torch.zeros_like(Y)
    out[:, :-1] -= D
    out[:, 1:] += D
    return out


class JiInstance:
    r"""Ji's deterministic instance as an analytic oracle.

    Args:
        block: :math:`n \ge 2`, so :math:`\kappa = 4n^2 + 1`.
        links: :math:`T`, the length of the outer chain (``dim_x``).
        chain_scale: :math:`\lambda` (the gradient threshold is :math:`\epsilon =
            \lambda L_f C_e n / L`).
        upper_smoothness, lower_smoothness, reference_smoothness, link_constant:
            :math:`L_f, L_g, L, C_e` (default 1).

    Raises:
        ValueError: for ``block < 2``, ``links < 1`` or non-positive constants.
    """

    def __init__(
        self,
        *,
        block: int,
        links: int,
        chain_scale: float,
        upper_smoothness: float = 1.0,
        lower_smoothness: float = 1.0,
        reference_smoothness: float = 1.0,
        link_constant: float = 1.0,
    ) -> None:
        if not isinstance(block, int) or block < 2:
            raise ValueError(f"block: expected an integer n >= 2 (kappa = 4n^2+1), got {block!r}.")
        if not isinstance(links, int) or links < 1:
            raise ValueError(f"links: expected an integer T >= 1, got {links!r}.")
        for name, val in (
            ("chain_scale", chain_scale),
            ("upper_smoothness", upper_smoothness),
            ("lower_smoothness", lower_smoothness),
            ("reference_smoothness", reference_smoothness),
            ("link_constant", link_constant),
        ):
            if not (math.isfinite(val) and val > 0):
                raise ValueError(f"{name}: expected a positive finite number, got {val!r}.")
        n = block
        self.n, self.T, self.lam = n, links, float(chain_scale)
        self.L_f, self.L_g, self.L, self.C_e = (
            upper_smoothness,
            lower_smoothness,
            reference_smoothness,
            link_constant,
        )
        self.dim_x, self.dim_y, self.dtype = links, (links + 1) * n, torch.float64
        self.kappa = 4.0 * n * n + 1.0
        self.mu = self.L_g / self.kappa
        self.c = self.L_g * n * n / (4.0 * n * n + 1.0)
        A = 2.0 * torch.eye(n, dtype=torch.float64)
        A -= torch.diag(torch.ones(n - 1, dtype=torch.float64), 1)
        A -= torch.diag(torch.ones(n - 1, dtype=torch.float64), -1)
        A[0, 0] = A[-1, -1] = 1.0
        M = (4.0 * n * n + 1.0) / (n * n) * torch.linalg.inv(torch.eye(n) / (n * n) + A)
        self.M_col_n = M[:, -1].clone()  # y*(i) = M e_n x_i
        self.C_l = self.C_e * n / float(M[-1, -1])
        self.C_r = self.C_e * n / float(M[0, -1])
        self.x0 = self.lam / (self.C_l * float(M[-1, -1]))
        self.scale = self.lam**2 * self.L_f / self.L
        # the block Hessian B = c (I/n^2 + A) as a small dense matrix: one matmul per oracle
        self.block_hessian = self.c * (torch.eye(n, dtype=torch.float64) / (n * n) + A)
        self._x0_term = torch.zeros(links + 1, n, dtype=torch.float64)
        self._x0_term[0, -1] = -self.L_g * self.x0

    @classmethod
    def for_accuracy(
        cls, *, block: int, epsilon: float, gap: float = 1.0, links: int | None = None
    ) -> JiInstance:
        r"""The theorem's scaling with unit constants: :math:`\lambda = \epsilon/n`,
        :math:`T = \lfloor \Delta/(12\lambda^2) \rfloor` (or ``links`` if given)."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon: expected a positive accuracy, got {epsilon!r}.")
        lam = epsilon / block
        T = links if links is not None else max(1, math.floor(gap / (12.0 * lam * lam)))
        return cls(block=block, links=T, chain_scale=lam)

    @property
    def epsilon(self) -> float:
        """The accuracy below which the chain must be fully activated."""
        return self.lam * self.L_f * self.C_e * self.n / self.L

    def _blocks(self, y: torch.Tensor) -> torch.Tensor:
        return y.reshape(self.T + 1, self.n)

    def _x_full(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.full((1,), self.x0, dtype=x.dtype), x])

    # values (also used to build the autograd reference oracle)
    def upper(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        Y = self._blocks(y)
        a = self.C_l * Y[:-1, -1] / self.lam
        b = self.C_r * Y[1:, 0] / self.lam
        return self.scale * torch.sum(psi(-a) * phi(-b) - psi(a) * phi(b)) + 0.0 * x.sum()

    def lower(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        Y = self._blocks(y)
        quad = torch.sum(Y * (Y / self.n**2 + _path_laplacian_rows(Y)))
        return 0.5 * self.c * quad - self.L_g * torch.sum(self._x_full(x) * Y[:, -1])

    # the four oracles
    def grad_f(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        Y = self._blocks(y)
        a = Y[:-1, -1] * (self.C_l / self.lam)
        b = Y[1:, 0] * (self.C_r / self.lam)
        # at most one of Psi(a), Psi(-a) is nonzero: with sigma = sign(a) and e = Psi(|a|),
        # the link is -sigma e Phi(sigma b), so d/da = -Psi'(|a|) Phi(sigma b) and
        # d/db = -e Phi'(b) (Phi' is even); this halves the work of the four-term form
        t = a.abs()
        active = t > 0.5
        s = torch.where(active, 2.0 * t - 1.0, torch.ones_like(t))
        e = torch.where(active, torch.exp(1.0 - s.pow(-2)), torch.zeros_like(t))
        phi_sb = phi(torch.sign(a) * b)
        d_a = -(4.0 * e / s.pow(3)) * phi_sb
        d_b = -e * phi_prime(b)
        G = torch.zeros_like(Y)
        G[:-1, -1] += (self.scale * self.C_l / self.lam) * d_a
        G[1:, 0] += (self.scale * self.C_r / self.lam) * d_b
        return torch.zeros_like(x), G.reshape(-1)

    def grad_g(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        Y = self._blocks(y)
        G = torch.addmm(self._x0_term, Y, self.block_hessian)
        G[1:, -1] -= self.L_g * x
        return Y[1:, -1] * -self.L_g, G.reshape(-1)

    def hvp_yy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (self._blocks(v) @ self.block_hessian).reshape(-1)

    def jvp_xy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._blocks(v)[1:, -1] * -self.L_g

    # evaluation only
    def lower_solution(self, x: torch.Tensor) -> torch.Tensor:
        return (self._x_full(x)[:, None] * self.M_col_n[None, :]).reshape(-1)

    def upper_value(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return float(self.upper(x, y))

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        r""":math:`\nabla H_i = (M e_n)^\top \nabla_{y^{(i)}} f(y^*(x))`, :math:`i = 1..T`."""
        _, gy = self.grad_f(x, self.lower_solution(x))
        return self._blocks(gy)[1:] @ self.M_col_n

    # frontier bookkeeping
    def chain_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Position of each coordinate in the activation order (x, y); -1: off the chain.

        :math:`y^{(0)}_n \mapsto 0`, :math:`y^{(i)}_j \mapsto (i-1)n + j`,
        :math:`x_i \mapsto in + 1`; the rest of block 0 is off the chain.
        """
        n, T = self.n, self.T
        py = torch.full((T + 1, n), -1, dtype=torch.long)
        py[0, -1] = 0
        py[1:] = (torch.arange(T)[:, None] * n + torch.arange(1, n + 1)[None, :]).long()
        px = torch.arange(1, T + 1, dtype=torch.long) * n + 1
        return px, py.reshape(-1)

    def frontier(
        self, first_nonzero_x: torch.Tensor, first_nonzero_y: torch.Tensor
    ) -> torch.Tensor:
        """Furthest chain position reached by each call: entry c-1 is for call c."""
        px, py = self.chain_positions()
        first = torch.cat([first_nonzero_x, first_nonzero_y])
        pos = torch.cat([px, py])
        keep = (first > 0) & (pos >= 0)
        calls = int(first[keep].max()) if bool(keep.any()) else 0
        reach = torch.full((calls + 1,), -1, dtype=torch.long)
        reach.scatter_reduce_(0, first[keep], pos[keep], reduce="amax")
        return torch.cummax(reach, 0).values[1:]


class JiBernoulliOracle:
    """The stochastic oracle of Ji's eq. 14 on top of a :class:`JiInstance`.

    Args:
        instance: the deterministic instance.
        probability: :math:`p \\in (0, 1]`; the variance grows like :math:`1/p`.
        generator: torch random generator (seeded by the caller).
    """

    def __init__(
        self, instance: JiInstance, *, probability: float, generator: torch.Generator
    ) -> None:
        if not 0 < probability <= 1:
            raise ValueError(f"probability: expected p in (0, 1], got {probability!r}.")
        self.instance, self.p, self.gen = instance, float(probability), generator
        self.dim_x, self.dim_y, self.dtype = instance.dim_x, instance.dim_y, instance.dtype

    def _noisy(self, out: torch.Tensor, query: torch.Tensor, xi: float) -> torch.Tensor:
        new = (out != 0) & (query == 0)
        return torch.where(new, out * (xi / self.p), out)

    def _xi(self) -> float:
        return float(torch.rand((), generator=self.gen, dtype=torch.float64) < self.p)

    def grad_f(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.instance.grad_f(x, y)

    def grad_g(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gx, gy = self.instance.grad_g(x, y)
        xi = self._xi()
        return self._noisy(gx, x, xi), self._noisy(gy, y, xi)

    def hvp_yy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._noisy(self.instance.hvp_yy(x, y, v), v, self._xi())

    def jvp_xy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._noisy(self.instance.jvp_xy(x, y, v), x, self._xi())

    def upper_value(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return self.instance.upper_value(x, y)

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        return self.instance.exact_hypergradient(x)
