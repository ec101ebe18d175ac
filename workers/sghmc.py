"""Stochastic gradient Hamiltonian Monte Carlo moves (Chen, Fox & Guestrin 2014; thesis eq. 2.52–2.54).

In the SGD-with-momentum parameterisation of Chen et al. (2014, eq. 15) with
``β̂ = 0``:

    ξ ~ N(0, 2αη),   v ← (1 − α) v − η ∇Û(θ) + ξ,   θ ← θ + v.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

GradientFn = Callable[[torch.Tensor], torch.Tensor]


def sghmc_step(
    generator: torch.Generator,
    theta: torch.Tensor,
    velocity: torch.Tensor,
    grad_fn: GradientFn,
    *,
    step_size: float | torch.Tensor,
    momentum_decay: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGHMC step. ``theta, velocity: [M, D]`` -> new ``(theta, velocity)``.

    ``step_size`` is η (thesis eq. 2.53): a number, or ``[D]`` for a constant diagonal
    preconditioner ``η_d = η·P_d`` (SGHMC with mass matrix ``P⁻¹``, Chen et al. 2014 §3.2:
    ``v ← (1−α)v − η P ∇U + N(0, 2αη P)``; no correction term since ``P`` does not depend
    on ``θ`` during the chain).  ``momentum_decay`` is α.
    """
    noise = torch.randn(theta.shape, generator=generator, dtype=theta.dtype, device=theta.device)
    if isinstance(step_size, torch.Tensor):
        noise_scale = torch.sqrt(2.0 * momentum_decay * step_size)
    else:
        noise_scale = math.sqrt(2.0 * momentum_decay * step_size)
    velocity = (1.0 - momentum_decay) * velocity - step_size * grad_fn(theta) + noise_scale * noise
    return theta + velocity, velocity
