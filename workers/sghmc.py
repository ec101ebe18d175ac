"""Stochastic gradient Hamiltonian Monte Carlo moves (Chen, Fox & Guestrin 2014; thesis eq. 2.52–2.54).

In the SGD-with-momentum parameterisation of Chen et al. (2014, eq. 15) with
``β̂ = 0``:

    ξ ~ N(0, 2αη),   v ← (1 − α) v − η ∇Û(θ) + ξ,   θ ← θ + v.

On a stack of ``K`` models every tensor has a leading model axis; each model's noise comes from
its own generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def standard_normal(generators: Sequence[torch.Generator], shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """``[K, *shape]`` standard normal draws, row ``k`` from ``generators[k]`` (K calls; measured in
    ``bench/stack_kernel.py``)."""
    opts: dict[str, Any] = {"dtype": like.dtype, "device": like.device}
    if len(generators) == 1:
        return torch.randn(shape, generator=generators[0], **opts)[None]
    return torch.stack([torch.randn(shape, generator=g, **opts) for g in generators])


def sghmc_step(
    theta: torch.Tensor,
    velocity: torch.Tensor,
    grad_u: torch.Tensor,
    xi: torch.Tensor,
    *,
    step_size: torch.Tensor,
    momentum_keep: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGHMC step. ``theta, velocity, grad_u, xi: [K, M, D]`` -> new ``(theta, velocity)``.

    ``step_size`` is η (thesis eq. 2.53), ``[K, 1, D]`` for a constant diagonal preconditioner
    ``η_d = η·P_d`` (SGHMC with mass matrix ``P⁻¹``, Chen et al. 2014 §3.2:
    ``v ← (1−α)v − η P ∇U + N(0, 2αη P)``; no correction term since ``P`` does not depend on
    ``θ`` during the chain) or ``[K, 1, 1]``, or a full preconditioner ``η·P`` as ``[K, D, D]`` (``D > 1``;
    :func:`workers.sgais._full_preconditioner`, with ``xi`` drawn from ``N(0, 2αηP)``).
    ``momentum_keep`` is ``1 − α`` (α the momentum decay), ``[K, 1, 1]``.
    ``xi`` is the injected noise, already scaled: ``√(2αη) · N(0, 1)``.
    """
    drift = grad_u @ step_size if step_size.shape[1] > 1 else step_size * grad_u  # a full P: [K, D, D]
    velocity = momentum_keep * velocity - drift + xi
    return theta + velocity, velocity
