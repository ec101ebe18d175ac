"""Stochastic gradient estimators of the SGAIS potential (thesis eq. 4.14).

The potential of the annealed target for a block ``C`` at inverse temperature ``λ`` is

    U(θ) = -λ Σ_{y∈C} log p(y|θ) - Σ_{y∈H} log p(y|θ) - log p(θ),

and SGHMC needs ``∇U`` at every particle.  Two unbiased estimators of the history
term are offered; both draw ``B`` with replacement from ``H``:

* :func:`minibatch_gradient` — the thesis's ``(n_prev/|B|) Σ_{y∈B} ∇ log p(y|θ)``
  (eq. 4.14).  Its variance grows like ``n_prev²/|B|``.
* :func:`control_variate_gradient` — around a per-particle anchor ``a_i`` with the
  exact history gradient ``G_i = Σ_{y∈H} ∇ log p(y|a_i)`` kept up to date:
  ``G_i + (n_prev/|B|) Σ_{y∈B} [∇ log p(y|θ_i) − ∇ log p(y|a_i)]``
  (Baker, Fearnhead, Fox & Nemeth 2019, "Control variates for stochastic gradient
  MCMC", eq. 8; Dubey et al. 2016).  Its variance scales with ``|θ_i − a_i|²``,
  which shrinks as the posterior concentrates, so it removes the ``η²n²/|B|``
  bias that makes plain SGAIS drift at large ``n``.

Both return ``grad: [M, D]`` (of ``U``, i.e. of the *negative* log-target).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from models.base import Family


class Batch(NamedTuple):
    x: torch.Tensor | None
    y: torch.Tensor


def _grad(fn, theta: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        t = theta.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(t).sum(), t)
    return g


def minibatch_gradient(
    family: Family, theta: torch.Tensor, *, block: Batch, lam: float, batch: Batch | None, n_prev: int
) -> torch.Tensor:
    """``∇Û(θ)`` with the plain mini-batch estimator (thesis eq. 4.14); ``theta: [M, D]`` -> ``[M, D]``."""

    if family.analytic_gradients:
        g = -family.grad_log_prior(theta) - lam * family.grad_log_likelihood(theta, block.x, block.y)
        if batch is not None and n_prev > 0:
            g = g - (n_prev / batch.y.shape[0]) * family.grad_log_likelihood(theta, batch.x, batch.y)
        return g

    def neg_log_target(t: torch.Tensor) -> torch.Tensor:
        out = -family.log_prior(t) - lam * family.log_likelihood(t, block.x, block.y).sum(-1)
        if batch is not None and n_prev > 0:
            scale = n_prev / batch.y.shape[0]
            out = out - scale * family.log_likelihood(t, batch.x, batch.y).sum(-1)
        return out

    return _grad(neg_log_target, theta)


def control_variate_gradient(
    family: Family,
    theta: torch.Tensor,
    *,
    block: Batch,
    lam: float,
    batch: Batch | None,
    n_prev: int,
    anchor: torch.Tensor,
    anchor_grad: torch.Tensor,
) -> torch.Tensor:
    """``∇Û(θ)`` with control variates (Baker et al. 2019, eq. 8).

    Parameters
    ----------
    theta, anchor : [M, D] particles and their anchors.
    anchor_grad : [M, D] ``Σ_{y∈H} ∇_θ log p(y|a_i)`` (the exact history gradient at the anchor).
    """
    M = theta.shape[0]
    if batch is None or n_prev == 0:
        return minibatch_gradient(family, theta, block=block, lam=lam, batch=None, n_prev=0)
    scale = n_prev / batch.y.shape[0]
    if family.analytic_gradients:
        gb = family.grad_log_likelihood(torch.cat([theta, anchor], 0), batch.x, batch.y)
        return (
            -family.grad_log_prior(theta)
            - lam * family.grad_log_likelihood(theta, block.x, block.y)
            - scale * (gb[:M] - gb[M:])
            - anchor_grad
        )

    def objective(z: torch.Tensor) -> torch.Tensor:
        t, a = z[:M], z[M:]
        ll_batch = family.log_likelihood(z, batch.x, batch.y).sum(-1)  # [2M]
        out = -family.log_prior(t) - lam * family.log_likelihood(t, block.x, block.y).sum(-1)
        return out - scale * (ll_batch[:M] - ll_batch[M:])

    g = _grad(objective, torch.cat([theta, anchor], 0))
    # d/dθ_i of the anchored difference: ∇ℓ_B(θ_i) − ∇ℓ_B(a_i); the second part sits in g[M:].
    return g[:M] + g[M:] - anchor_grad


def history_gradient(
    family: Family, anchor: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor, *, chunk: int = 16384
) -> torch.Tensor:
    """``Σ_{rows} ∇_θ log p(y|θ)`` at ``anchor: [M, D]`` over all rows, in chunks. -> ``[M, D]``."""
    total = torch.zeros_like(anchor)
    for start in range(0, y.shape[0], chunk):
        xs = x[start : start + chunk] if x is not None else None
        total += family.grad_log_likelihood(anchor, xs, y[start : start + chunk])
    return total
