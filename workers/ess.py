"""Effective sample size and the adaptive annealing increment (thesis §3.3, eq. 3.41–3.43, 4.15).

The increment ``Δ`` of the annealing parameter is chosen so that the effective
sample size of the reweighted particles equals a target.  We use the
*conditional* ESS of Zhou, Johansen & Aston (2016, eq. 3.16),

    CESS(Δ) = M (Σ_i W_i ω_i)^2 / Σ_i W_i ω_i^2,   ω_i = exp(Δ ℓ_i),

with ``W_i`` the normalised weights before the increment.  With uniform
weights it is exactly the thesis's ``ESS(Δ)`` of the incremental weights
(eq. 4.15); with non-uniform weights (no resampling since the last block) it
measures the degeneracy the increment itself adds, which is what the
bisection has to control.
"""

from __future__ import annotations

import torch


def ess(log_w: torch.Tensor) -> torch.Tensor:
    """ESS of (unnormalised) log-weights ``log_w: [M]``: ``(Σ w)^2 / Σ w^2`` (eq. 3.41), in particles."""
    return torch.exp(2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0))


def conditional_ess(log_w: torch.Tensor, log_lik: torch.Tensor, delta: float | torch.Tensor) -> torch.Tensor:
    """Conditional ESS (in particles) of the increment ``exp(delta * log_lik)`` given ``log_w``.

    ``log_w: [M]``, ``log_lik: [M]`` -> scalar tensor in ``[1, M]`` (up to rounding).
    """
    M = log_w.shape[0]
    log_W = log_w - torch.logsumexp(log_w, 0)
    a = delta * log_lik
    num = 2 * torch.logsumexp(log_W + a, 0)
    den = torch.logsumexp(log_W + 2 * a, 0)
    return M * torch.exp(num - den)


def solve_increment(
    log_w: torch.Tensor,
    log_lik: torch.Tensor,
    *,
    target: float,
    remaining: float,
    tolerance: float = 1e-9,
    max_iterations: int = 60,
) -> float:
    """Annealing increment ``Δ ∈ (0, remaining]`` with ``CESS(Δ) = target``, by bisection.

    Returns ``remaining`` when ``CESS(remaining) ≥ target`` already (Algorithm 8,
    line 6, with the step clipped at λ = 1).  CESS is non-increasing in ``Δ``,
    so halving from ``remaining`` until the target is met brackets the root
    (this reaches increments of 1e-12 and below in a few dozen evaluations), and
    bisection then narrows the bracket to ``tolerance`` relative width or until CESS
    is within ``1e-6 · M`` of the target.  The returned ``Δ`` always meets the target.

    Parameters
    ----------
    log_w : [M] current log-weights (float64 recommended).
    log_lik : [M] log-likelihood of the whole block for each particle (nats).
    target : target ESS in particles (``ess_target · M``), ``0 < target ≤ M``.
    remaining : ``1 - λ`` (> 0).

    Raises
    ------
    FloatingPointError
        If ``log_lik`` contains NaN or +inf (``-inf`` is allowed: a particle
        with zero likelihood simply loses its weight).
    """
    if torch.isnan(log_lik).any() or torch.isposinf(log_lik).any():
        raise FloatingPointError("log-likelihood of the block is NaN or +inf for some particle")
    log_w = log_w.to(torch.float64)
    log_lik = log_lik.to(torch.float64)
    # -inf likelihoods: give them a finite floor far below the rest so the
    # arithmetic stays finite; their weight is exp(Δ·floor) ≈ 0 for any Δ that matters.
    finite = torch.isfinite(log_lik)
    if not finite.all():
        if not finite.any():
            raise FloatingPointError("log-likelihood of the block is -inf for every particle")
        floor = log_lik[finite].min() - 1e4
        log_lik = torch.where(finite, log_lik, floor)
    if float(conditional_ess(log_w, log_lik, remaining)) >= target:
        return remaining
    M = log_w.shape[0]
    # Phase 1: halve until CESS meets the target, giving a bracket [lo, hi] = [Δ/2·2, ...] with lo > 0.
    hi = remaining
    lo = 0.5 * hi
    for _ in range(max_iterations * 20):
        if float(conditional_ess(log_w, log_lik, lo)) >= target:
            break
        hi, lo = lo, 0.5 * lo
        if lo == 0.0:
            raise FloatingPointError("no positive annealing increment meets the ESS target")
    # Phase 2: bisection to relative precision `tolerance` (CESS(lo) ≥ target > CESS(hi)).
    for _ in range(max_iterations):
        mid = 0.5 * (lo + hi)
        value = float(conditional_ess(log_w, log_lik, mid))
        if abs(value - target) <= 1e-6 * M:
            return mid
        if value > target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= tolerance * hi:
            break
    return lo
