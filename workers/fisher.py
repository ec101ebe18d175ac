"""The empirical Fisher diagonal that sets the per-coordinate SGHMC step cap after the warm-up."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.stack import StackedFamily

#: Rademacher probes per block for the empirical Fisher diagonal (:func:`fisher_diagonal`).
FISHER_PROBES = 4


def fisher_diagonal(
    generators: Sequence[torch.Generator],
    family: StackedFamily,
    theta: torch.Tensor,
    log_w: torch.Tensor,
    x: torch.Tensor | None,
    y: torch.Tensor,
    *,
    probes: int = FISHER_PROBES,
) -> torch.Tensor:
    """Per-observation empirical Fisher information ``f: [K, D]`` float64 on each model's block.

    ``f_kd = Σ_i W_ki · (1/B) Σ_b (∂_d log p(y_kb|θ_ki))²`` over the particles ``theta: [K, M, D]``
    with normalised weights ``W = softmax(log_w: [K, M])``, rows ``x: [K, B, d] | None``,
    ``y: [K, B, ...]``.  Per-observation gradients are never formed: for a Rademacher vector
    ``s: [B]``, ``E_s[(Σ_b s_b ∇ log p(y_b|θ))²] = Σ_b (∇ log p(y_b|θ))²`` (Hutchinson's trick),
    averaged over ``probes`` vectors, model k's drawn from ``generators[k]``; one autograd call
    per probe for the whole stack.  Quadratic families (linear-Gaussian likelihoods) have the exact
    sum in closed form (``Family.stacked_fisher``) and draw nothing.
    """
    if family.quadratic:
        W = torch.softmax(log_w, -1).to(theta.dtype)
        return family.family.stacked_fisher(theta, W, x, y, family.hp).to(torch.float64)
    B = y.shape[1]
    with torch.enable_grad():
        t = theta.detach().requires_grad_(True)
        ll = family.log_likelihood(t, x, y)  # [K, M, B]
        total = torch.zeros_like(theta, dtype=torch.float64)
        for p in range(probes):
            s = torch.stack([torch.randint(0, 2, (B,), generator=g, device=theta.device) for g in generators]).to(
                ll.dtype
            )
            (g,) = torch.autograd.grad((ll * (2 * s - 1)[:, None, :]).sum(), t, retain_graph=p + 1 < probes)
            total += g.to(torch.float64) ** 2
    W = torch.softmax(log_w, -1)[..., None]
    return (W * total).sum(1) / (probes * B)
