"""Stochastic gradient estimators of the SGAIS potential (thesis eq. 4.14), on stacks of models.

The potential of the annealed target for a block ``C`` at inverse temperature ``λ`` is

    U(θ) = -λ Σ_{y∈C} log p(y|θ) - Σ_{y∈H} log p(y|θ) - log p(θ),

and SGHMC needs ``∇U`` at every particle.  The prior and block terms are exact
(:func:`potential_gradient`); the history term is estimated from a mini-batch ``B`` drawn with
replacement from ``H``.  Estimators wrap estimators (BlackJAX ``sgmcmc/gradients.py``): a history
estimator is ``(theta: [K, M, D], batch) -> [K, M, D]``, an estimate of ``∇ Σ_{y∈H} log p(y|θ)``.

* :func:`minibatch` — the thesis's ``(n_prev/|B|) Σ_{y∈B} ∇ log p(y|θ)`` (eq. 4.14).  Its
  variance grows like ``n_prev²/|B|``.
* :func:`control_variates` — wraps any estimator around per-particle anchors ``a_i`` with the
  exact history gradient ``G_i = Σ_{y∈H} ∇ log p(y|a_i)``, kept in the estimator's own state:
  ``G_i + est(θ_i, B) − est(a_i, B)`` (Baker, Fearnhead, Fox & Nemeth 2019, "Control variates for
  stochastic gradient MCMC", eq. 8; Dubey et al. 2016).  Its variance scales with ``|θ_i − a_i|²``,
  which shrinks as the posterior concentrates, so it removes the ``η²n²/|B|`` bias that makes
  plain SGAIS drift at large ``n``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from models.stack import StackedFamily


class Batch(NamedTuple):
    """Likelihood rows of a stack: ``x: [K, B, d] | None``, ``y: [K, B, ...]``."""

    x: torch.Tensor | None
    y: torch.Tensor


HistoryEstimator = Callable[[torch.Tensor, Batch], torch.Tensor]
PotentialGradient = Callable[[torch.Tensor, Batch | None], torch.Tensor]


def minibatch(model: StackedFamily, scale: torch.Tensor) -> HistoryEstimator:
    """``(n_prev/|B|) Σ_{y∈B} ∇ log p(y|θ)`` (thesis eq. 4.14); ``scale: [K]`` is ``n_prev/|B|`` per model."""
    s = scale[:, None, None].to(model.hp_dtype)

    def estimate(theta: torch.Tensor, batch: Batch) -> torch.Tensor:
        return s * model.grad_log_likelihood(theta, batch.x, batch.y)

    return estimate


def control_variates(base: HistoryEstimator, anchor: torch.Tensor, anchor_grad: torch.Tensor) -> HistoryEstimator:
    """``G + base(θ, B) − base(a, B)`` (Baker et al. 2019, eq. 8) with ``anchor, anchor_grad: [K, M, D]``.

    ``base`` runs once on the particles and their anchors side by side (``[K, 2M, D]``).
    """

    def estimate(theta: torch.Tensor, batch: Batch) -> torch.Tensor:
        M = theta.shape[1]
        g = base(torch.cat([theta, anchor], 1), batch)
        return g[:, :M] - g[:, M:] + anchor_grad

    return estimate


def potential_gradient(
    model: StackedFamily, block: Batch, lam: torch.Tensor, history: HistoryEstimator | None
) -> PotentialGradient:
    """``∇Û(θ) = −∇ log p(θ) − λ_k ∇ Σ_{y∈C} log p(y|θ) − history(θ, B)`` with ``lam: [K]`` (eq. 4.14)."""

    def grad_u(theta: torch.Tensor, batch: Batch | None) -> torch.Tensor:
        g = model.grad_log_target(theta, block.x, block.y, lam)
        if history is not None and batch is not None:
            g = g + history(theta, batch)
        return -g

    return grad_u


def history_gradient(
    model: StackedFamily, anchor: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor, *, chunk: int = 16384
) -> torch.Tensor:
    """``Σ_{rows} ∇_θ log p(y|θ)`` at ``anchor: [K, M, D]`` over rows ``x: [K, n, d]``, ``y: [K, n, ...]``."""
    total = torch.zeros_like(anchor)
    for start in range(0, y.shape[1], chunk):
        xs = x[:, start : start + chunk] if x is not None else None
        total += model.grad_log_likelihood(anchor, xs, y[:, start : start + chunk])
    return total
