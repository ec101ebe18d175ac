"""Effective sample size and the adaptive annealing increment (thesis §3.3, eq. 3.41–3.43, 4.15).

The increment ``Δ`` of the annealing parameter is chosen so that the effective
sample size of the reweighted particles equals a target.  We use the
*conditional* ESS of Zhou, Johansen & Aston (2016, eq. 3.16),

    CESS(Δ) = M (Σ_i W_i ω_i)^2 / Σ_i W_i ω_i^2,   ω_i = exp(Δ ℓ_i),

with ``W_i`` the normalised weights before the increment.  With uniform
weights it is exactly the thesis's ``ESS(Δ)`` of the incremental weights
(eq. 4.15); with non-uniform weights (no resampling since the last block) it
measures the degeneracy the increment itself adds, which is what the
search has to control.

Everything works on a leading model axis: ``log_w: [K, M]`` gives ``[K]`` answers, one per model,
each computed with exactly the arithmetic it would get alone (row-wise reductions only).
"""

from __future__ import annotations

from typing import Any

import torch


def ess(log_w: torch.Tensor) -> torch.Tensor:
    """ESS of (unnormalised) log-weights ``log_w: [..., M]``: ``(Σ w)^2 / Σ w^2`` (eq. 3.41), in particles."""
    return torch.exp(2 * torch.logsumexp(log_w, -1) - torch.logsumexp(2 * log_w, -1))


def conditional_ess(log_w: torch.Tensor, log_lik: torch.Tensor, delta: float | torch.Tensor) -> torch.Tensor:
    """Conditional ESS (in particles) of the increment ``exp(delta * log_lik)`` given ``log_w``.

    ``log_w, log_lik: [..., M]``, ``delta``: a number or ``[...]`` -> ``[...]`` in ``[1, M]`` (up to rounding).
    """
    log_W = log_w - torch.logsumexp(log_w, -1, keepdim=True)
    return _cess(log_W, log_lik, torch.as_tensor(delta, dtype=log_W.dtype, device=log_W.device))


def _cess(log_W: torch.Tensor, log_lik: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    a = delta[..., None] * log_lik
    return log_W.shape[-1] * torch.exp(2 * torch.logsumexp(log_W + a, -1) - torch.logsumexp(log_W + 2 * a, -1))


def solve_increment(
    log_w: torch.Tensor,
    log_lik: torch.Tensor,
    *,
    target: float | torch.Tensor,
    remaining: float | torch.Tensor,
    tolerance: float = 1e-9,
    ess_tolerance: float = 1e-3,
    max_iterations: int = 60,
) -> torch.Tensor | float:
    """Annealing increments ``Δ_k ∈ (0, remaining_k]`` with ``target_k ≤ CESS_k(Δ_k) ≤ target_k + ess_tolerance·M``.

    Returns ``remaining`` when ``CESS(remaining) ≥ target`` already (Algorithm 8,
    line 6, with the step clipped at λ = 1).  Otherwise the search starts from the increment of the
    second-order expansion ``CESS(Δ) ≈ M / (1 + Δ² Var_W(ℓ))`` (``Var_W`` the weighted variance of
    the log-likelihoods; exact to second order in Δ since ``CESS = M·E_W[ω]²/E_W[ω²]``) and takes secant
    steps on that expansion's linear form, ``log(M/CESS − 1)`` against ``log Δ`` (slope 2 for the expansion
    itself, the line through the last two evaluations after the first), inside the bracket ``[lo, hi]`` with
    ``CESS(lo) ≥ target > CESS(hi)`` (from ``[0, remaining]``); a step outside the bracket, and every third step,
    is the bracket's midpoint, so the bracket at least halves every three evaluations whatever the
    log-likelihoods (an increment of 1e-12 is reached from the expansion's guess, not by halving).  It stops
    when ``CESS`` lies within ``ess_tolerance · M`` above the target (or the bracket's relative width is
    ``tolerance``).  CESS is non-increasing in ``Δ``, and the returned ``Δ`` always meets the target.  The
    target itself is a heuristic (the thesis's 0.5 M, our 0.9 M), so a tenth of a percent of ``M`` above it
    changes nothing of substance.  Work per call, counted over ``bench/many_models.py``'s gmm stream (100 values in
    5-value chunks, change-point challengers on; the first evaluation at ``remaining`` and calls that take the
    whole remainder included): 3.0 CESS evaluations for one model and 4.3 for a stack of eight, against 4.9 and
    7.2 with the bisection of sessions 8-35 (bench/README.md, session 36).
    All models search together; a model whose answer is found is frozen, so its answer
    is the one it gets alone.

    Parameters
    ----------
    log_w : [K, M] (or [M]) current log-weights (float64 recommended).
    log_lik : [K, M] (or [M]) log-likelihood of the whole block for each particle (nats).
    target : target ESS in particles (``ess_target · M``), a number or ``[K]``, ``0 < target ≤ M``.
    remaining : ``1 - λ`` (> 0), a number or ``[K]``.

    Returns
    -------
    ``[K]`` float64 tensor; a float when ``log_w`` is ``[M]``.

    Raises
    ------
    FloatingPointError
        If ``log_lik`` contains NaN or +inf (``-inf`` is allowed: a particle
        with zero likelihood simply loses its weight), or no positive increment meets the target.
    """
    single = log_w.ndim == 1
    log_w = log_w.to(torch.float64).reshape(-1, log_w.shape[-1])
    log_lik = log_lik.to(torch.float64).reshape(log_w.shape)
    if torch.isnan(log_lik).any() or torch.isposinf(log_lik).any():
        raise FloatingPointError("log-likelihood of the block is NaN or +inf for some particle")
    # -inf likelihoods: give them a finite floor far below the rest so the
    # arithmetic stays finite; their weight is exp(Δ·floor) ≈ 0 for any Δ that matters.
    finite = torch.isfinite(log_lik)
    if not finite.all():
        if not finite.any(-1).all():
            raise FloatingPointError("log-likelihood of the block is -inf for every particle")
        floor = torch.where(finite, log_lik, torch.inf).min(-1, keepdim=True).values - 1e4
        log_lik = torch.where(finite, log_lik, floor)
    opts: dict[str, Any] = {"dtype": torch.float64, "device": log_w.device}
    K, M = log_w.shape
    target = torch.as_tensor(target, **opts).expand(K)
    rem = torch.as_tensor(remaining, **opts).expand(K).clone()
    log_W = log_w - torch.logsumexp(log_w, -1, keepdim=True)
    result = rem.clone()
    todo = _cess(log_W, log_lik, rem) < target
    if not todo.any():
        return float(result[0]) if single else result
    # First guess from the second-order expansion (docstring); rem/2 where it is useless.
    W = torch.exp(log_W)
    centred = log_lik - (W * log_lik).sum(-1, keepdim=True)
    var = (W * centred * centred).sum(-1)
    guess = torch.sqrt((M / target - 1.0).clamp_min(0.0) / var)
    cand = torch.where(torch.isfinite(guess) & (guess > 0), torch.minimum(guess, rem), 0.5 * rem)
    # Safeguarded secant on the expansion's linear form: u(Δ) = M/CESS(Δ) − 1 ≈ Δ²·Var_W(ℓ), so log u is about
    # linear in log Δ (slope 2); the next candidate solves log u = log(M/target − 1) on the line through the last two
    # evaluations (slope 2 after the first).  The bracket [lo, hi] (CESS(lo) ≥ target > CESS(hi); lo = 0 holds, CESS(0)
    # = M) takes every evaluation; a candidate outside it, and every third one, is the bracket's midpoint instead, so
    # the bracket at least halves every three evaluations whatever the log-likelihoods.
    lo, hi = torch.zeros_like(rem), rem.clone()
    goal = torch.log(M / target - 1.0)
    prev_log_d = prev_log_u = torch.full_like(rem, torch.nan)
    for it in range(3 * max_iterations):
        value = _cess(log_W, log_lik, cand)
        up = value >= target
        hit = todo & up & (value - target <= ess_tolerance * M)
        result = torch.where(hit, cand, result)
        todo &= ~hit
        lo, hi = torch.where(todo & up, cand, lo), torch.where(todo & ~up, cand, hi)
        result = torch.where(todo, lo, result)
        todo &= hi - lo > tolerance * hi
        if not todo.any():
            break
        log_d, log_u = torch.log(cand), torch.log(M / value - 1.0)
        slope = (log_u - prev_log_u) / (log_d - prev_log_d)
        slope = torch.where(torch.isfinite(slope) & (slope > 0.5), slope, 2.0)
        secant = torch.exp(log_d + (goal - log_u) / slope)
        mid = 0.5 * (lo + hi)
        inside = torch.isfinite(secant) & (secant > lo) & (secant < hi) & (it % 3 != 2)
        cand = torch.where(todo, torch.where(inside, secant, mid), cand)
        prev_log_d, prev_log_u = log_d, log_u
    if (result <= 0.0).any():
        raise FloatingPointError("no positive annealing increment meets the ESS target")
    return float(result[0]) if single else result
