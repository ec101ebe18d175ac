"""Stochastic gradient Hamiltonian Monte Carlo moves (Chen, Fox & Guestrin 2014; thesis eq. 2.52–2.54).

In the SGD-with-momentum parameterisation of Chen et al. (2014, eq. 15) with
``β̂ = 0``:

    ξ ~ N(0, 2αη),   v ← (1 − α) v − η ∇Û(θ) + ξ,   θ ← θ + v.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

GradientFn = Callable[[torch.Tensor], torch.Tensor]


def sghmc_step(
    generator: torch.Generator,
    theta: torch.Tensor,
    velocity: torch.Tensor,
    grad_fn: GradientFn,
    *,
    step_size: float,
    momentum_decay: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGHMC step. ``theta, velocity: [M, D]`` -> new ``(theta, velocity)``.

    ``step_size`` is η (thesis eq. 2.53), ``momentum_decay`` is α.
    """
    noise = torch.randn(theta.shape, generator=generator, dtype=theta.dtype, device=theta.device)
    velocity = (1.0 - momentum_decay) * velocity - step_size * grad_fn(theta) + math.sqrt(
        2.0 * momentum_decay * step_size
    ) * noise
    return theta + velocity, velocity


def sghmc_chain(
    generator: torch.Generator,
    theta: torch.Tensor,
    velocity: torch.Tensor,
    grad_fn_factory: Callable[[], GradientFn],
    *,
    steps: int,
    step_size: float,
    momentum_decay: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` SGHMC steps; ``grad_fn_factory()`` gives each step its gradient (a fresh mini-batch)."""
    for _ in range(steps):
        theta, velocity = sghmc_step(
            generator, theta, velocity, grad_fn_factory(), step_size=step_size, momentum_decay=momentum_decay
        )
    return theta, velocity
