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

import numpy as np
import torch


def ess(log_w: torch.Tensor) -> torch.Tensor:
    """ESS of (unnormalised) log-weights ``log_w: [..., M]``: ``(Σ w)^2 / Σ w^2`` (eq. 3.41), in particles."""
    return torch.exp(2 * torch.logsumexp(log_w, -1) - torch.logsumexp(2 * log_w, -1))


def conditional_ess(log_w: torch.Tensor, log_lik: torch.Tensor, delta: float | torch.Tensor) -> torch.Tensor:
    """Conditional ESS (in particles) of the increment ``exp(delta * log_lik)`` given ``log_w``.

    ``log_w, log_lik: [..., M]``, ``delta``: a number or ``[...]`` -> ``[...]`` in ``[1, M]`` (up to rounding),
    float64 on ``log_w``'s device (computed as :func:`solve_increment` computes it).
    """
    lw, ll = _host(log_w), _host(log_lik)
    log_W = lw - _logsumexp(lw)[..., None]
    d = np.broadcast_to(_host(torch.as_tensor(delta, dtype=torch.float64)), lw.shape[:-1])
    return torch.from_numpy(np.asarray(_cess(log_W, ll, d))).to(log_w.device)


def _host(t: torch.Tensor) -> np.ndarray:
    """``t`` as a float64 NumPy array on the host (a view where it is float64 on the CPU already)."""
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def _logsumexp(x: np.ndarray) -> np.ndarray:
    """``log Σ exp(x)`` over the last axis (``-inf`` for a row of ``-inf``), row by row."""
    top = x.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(x - top).sum(-1)) + top[..., 0]


def _cess(log_W: np.ndarray, log_lik: np.ndarray, delta: np.ndarray) -> np.ndarray:
    a = delta[..., None] * log_lik
    return log_W.shape[-1] * np.exp(2 * _logsumexp(log_W + a) - _logsumexp(log_W + 2 * a))


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
    changes nothing of substance.  Work per call (``python bench/engine_stack.py --models 1`` and ``--models 8``:
    ``bench/many_models.py``'s gmm stream, 100 values in 5-value chunks, change-point challengers on; the first
    evaluation at ``remaining`` and calls that take the whole remainder included): 3.0 CESS evaluations for one
    model and 4.2 for a stack of eight, against 4.9 and 7.2 with the bisection of sessions 8-35 (bench/README.md,
    session 36).
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
    single, device = log_w.ndim == 1, log_w.device
    # on the host, in NumPy: a few dozen operations on [K, M] numbers, each a microsecond there against 4-26 µs as a
    # torch call (torch.logsumexp: 26 µs on 50 numbers, ad hoc; bench/README.md, session 36); every operation is row
    # by row, so a model's answer is the same bits alone or in any stack
    lw = _host(log_w).reshape(-1, log_w.shape[-1])
    ll = _host(log_lik).reshape(lw.shape)
    if np.isnan(ll).any() or np.isposinf(ll).any():
        raise FloatingPointError("log-likelihood of the block is NaN or +inf for some particle")
    # -inf likelihoods: give them a finite floor far below the rest so the
    # arithmetic stays finite; their weight is exp(Δ·floor) ≈ 0 for any Δ that matters.
    finite = np.isfinite(ll)
    if not finite.all():
        if not finite.any(-1).all():
            raise FloatingPointError("log-likelihood of the block is -inf for every particle")
        floor = np.where(finite, ll, np.inf).min(-1, keepdims=True) - 1e4
        ll = np.where(finite, ll, floor)
    K, M = lw.shape
    targets = np.broadcast_to(_host(torch.as_tensor(target, dtype=torch.float64)), (K,))
    rem = np.broadcast_to(_host(torch.as_tensor(remaining, dtype=torch.float64)), (K,)).copy()
    log_W = lw - _logsumexp(lw)[:, None]
    result, todo = rem, _cess(log_W, ll, rem) < targets
    if todo.any():
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            result = _search(log_W, ll, targets, rem, todo, tolerance, ess_tolerance, max_iterations)
    return float(result[0]) if single else torch.from_numpy(result).to(device)


def _search(
    log_W: np.ndarray,
    log_lik: np.ndarray,
    target: np.ndarray,
    rem: np.ndarray,
    todo: np.ndarray,
    tolerance: float,
    ess_tolerance: float,
    max_iterations: int,
) -> np.ndarray:
    """:func:`solve_increment`'s search for the rows ``todo: [K]`` (``CESS(rem) < target``) -> the increments ``[K]``.

    Raises FloatingPointError when no positive increment meets a row's target."""
    searching = np.flatnonzero(todo)
    if len(searching) < len(todo):  # the search on those rows alone (a row's arithmetic is its own: the same bits)
        out = rem.copy()
        out[searching] = _search(log_W[searching], log_lik[searching], target[searching], rem[searching],
                                 todo[searching], tolerance, ess_tolerance, max_iterations)  # fmt: skip
        return out
    M = log_W.shape[-1]
    # First guess from the second-order expansion (solve_increment's docstring); rem/2 where it is useless.
    W = np.exp(log_W)
    centred = log_lik - (W * log_lik).sum(-1, keepdims=True)
    var = (W * centred * centred).sum(-1)
    guess = np.sqrt(np.maximum(M / target - 1.0, 0.0) / var)
    cand = np.where(np.isfinite(guess) & (guess > 0), np.minimum(guess, rem), 0.5 * rem)
    # Safeguarded secant on the expansion's linear form: u(Δ) = M/CESS(Δ) − 1 ≈ Δ²·Var_W(ℓ), so log u is about
    # linear in log Δ (slope 2); the next candidate solves log u = log(M/target − 1) on the line through the last two
    # evaluations (slope 2 after the first).  The bracket [lo, hi] (CESS(lo) ≥ target > CESS(hi); lo = 0 holds, CESS(0)
    # = M) takes every evaluation; a candidate outside it, and every third one, is the bracket's midpoint instead, so
    # the bracket at least halves every three evaluations whatever the log-likelihoods.
    result, lo, hi = rem.copy(), np.zeros_like(rem), rem.copy()
    goal = np.log(M / target - 1.0)
    prev_log_d = prev_log_u = np.full_like(rem, np.nan)
    for it in range(3 * max_iterations):
        # the rows still searching only: each row's arithmetic is its own, so its value is the same bits computed
        # alone, with the stack or with these rows
        rows = np.flatnonzero(todo)
        if len(rows) == len(todo):
            value = _cess(log_W, log_lik, cand)
        else:
            value = np.full_like(cand, np.nan)  # the rows done: never read
            value[rows] = _cess(log_W[rows], log_lik[rows], cand[rows])
        up = value >= target
        hit = todo & up & (value - target <= ess_tolerance * M)
        result = np.where(hit, cand, result)
        todo = todo & ~hit
        lo, hi = np.where(todo & up, cand, lo), np.where(todo & ~up, cand, hi)
        result = np.where(todo, lo, result)
        todo = todo & (hi - lo > tolerance * hi)
        if not todo.any():
            break
        log_d, log_u = np.log(cand), np.log(M / value - 1.0)
        slope = (log_u - prev_log_u) / (log_d - prev_log_d)
        slope = np.where(np.isfinite(slope) & (slope > 0.5), slope, 2.0)
        secant = np.exp(log_d + (goal - log_u) / slope)
        mid = 0.5 * (lo + hi)
        inside = np.isfinite(secant) & (secant > lo) & (secant < hi) & (it % 3 != 2)
        cand = np.where(todo, np.where(inside, secant, mid), cand)
        prev_log_d, prev_log_u = log_d, log_u
    if (result <= 0.0).any():
        raise FloatingPointError("no positive annealing increment meets the ESS target")
    return result
