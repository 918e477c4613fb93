"""Differentiable cone programs (zero, nonnegative, second-order, exponential, power, PSD)."""
