"""Densities and gradients written as plain tensor arithmetic on stacked parameters ``[K, M, ...]``.

No ``torch.distributions`` objects or argument validation: these run inside the sampler's loop.
"""

from __future__ import annotations

import math
from typing import Any

import torch

LOG_2PI = math.log(2.0 * math.pi)


def normal_log_prob(value: torch.Tensor, mean: torch.Tensor | float, std: torch.Tensor | float) -> torch.Tensor:
    """Elementwise ``log N(value; mean, std^2)`` (nats)."""
    if not isinstance(std, torch.Tensor):
        std = torch.as_tensor(std, dtype=value.dtype, device=value.device)
    z = (value - mean) / std
    return -0.5 * z * z - torch.log(std) - 0.5 * LOG_2PI


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a: [K, m, k], b: [K, k, n]) -> [K, m, n]`` whose slice ``k`` has the same bits for any ``K``.

    MKL takes another path (gemv) for a single product with one output column, so ``K = 1`` and
    ``K ≥ 2`` would differ in the last bits; with any of ``m, k, n`` equal to 1 the product is
    computed elementwise instead (measured: ``tests/workers/test_stack.py``).  Every other product goes
    to ``torch.bmm``, whose dependence on a slice's position in the batch MKL's strict reproducibility
    mode removes (``MKL_CBWR``, set in :mod:`models`; ``tests/models/test_reproducible.py``, small
    ``[3, 500] @ [500, 3]`` slices included). Small products such as the ``ZᵀZ`` statistics of a
    quadratic family were computed elementwise before that mode was set: a ``[K, D, |B|, D]`` temporary
    per SGHMC step, 144 MB at K = 1,000, D = 6, |B| = 500 (``torch.bmm``: 3.3 ms against 76 ms there, one thread).
    """
    if min(a.shape[-2], a.shape[-1], b.shape[-1]) == 1:
        return (a[..., :, :, None] * b[..., None, :, :]).sum(-2)
    return torch.bmm(a, b)


def linear_gaussian_gradient(
    theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, variance: torch.Tensor
) -> torch.Tensor:
    """``∇_θ Σ_b log N(y_b; θ[:-1]·x_b + θ[-1], σ²)`` for ``theta: [K, M, d+1]``, ``x: [K, B, d]``,
    ``y: [K, B]``, ``variance: [K, 1]`` -> ``[K, M, d+1]`` (residual ``r = (y − w·x − b)/σ²``)."""
    r = (y[:, None, :] - bmm(theta[..., :-1], x.transpose(1, 2)) - theta[..., -1:]) / variance[..., None]
    return torch.cat([bmm(r, x), r.sum(-1, keepdim=True)], dim=-1)


def unknown_noise_gaussian_gradient(theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``∇ Σ_b log N(y_b; θ·z_b, σ²)`` over ``[θ, u = log σ²]`` for ``theta: [K, M, D+1]`` (the last coordinate
    ``u``), ``z_b = [x_b, 1]``, ``x: [K, B, D−1]``, ``y: [K, B]`` -> ``[K, M, D+1]``: with ``r = y − θ·z``,
    ``∇_θ = Σ r z / σ²`` and ``∂_u = Σ (r²/σ² − 1) / 2``, both from the block sums ``A = ZᵀZ``, ``c = Zᵀy``,
    ``yᵀy`` (``Σ r² = yᵀy − 2θ·c + θᵀAθ``): O(B·D²) per call, not O(M·B·D)."""
    A, c = linear_gaussian_statistics(x, y, torch.ones_like(y[:, :1]))
    lin, u = theta[..., :-1], theta[..., -1:]  # [K, M, D], [K, M, 1]
    lin_a = bmm(lin, A)
    iv = torch.exp(-u)
    c3 = c[:, None, :]
    rss = (y * y).sum(-1)[:, None, None] - 2.0 * (lin * c3).sum(-1, keepdim=True) + (lin * lin_a).sum(-1, keepdim=True)
    return torch.cat([(c3 - lin_a) * iv, 0.5 * (rss * iv - y.shape[1])], dim=-1)


def unknown_noise_statistics(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sufficient statistics of rows of a linear-Gaussian model with unknown noise variance, for
    :func:`unknown_noise_gradient_from_statistics`: ``x: [K, B, D−1]``, ``y: [K, B]`` -> ``T: [K, 2D² + 2D + 2]``
    = ``(ZᵀZ, Zᵀy, yᵀy, B, 0, 0)`` with ``z_b = [x_b, 1]`` (the last two slots, a Gaussian prior's precision
    and precision-weighted mean, are zero for data rows)."""
    z = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)  # [K, B, D]
    zt = z.transpose(1, 2)
    A = bmm(zt, z)
    c = (zt * y[:, None, :]).sum(-1)
    yy = (y * y).sum(-1, keepdim=True)
    n = torch.full_like(yy, float(y.shape[1]))
    K = A.shape[0]
    return torch.cat([A.reshape(K, -1), c, yy, n, torch.zeros_like(A).reshape(K, -1), torch.zeros_like(c)], dim=-1)


def unknown_noise_prior_statistics(
    location: torch.Tensor,
    shape: torch.Tensor,
    scale: torch.Tensor,
    *,
    precision: torch.Tensor | None = None,
    nig_precision: torch.Tensor | None = None,
) -> torch.Tensor:
    """``T0`` of a Gaussian prior on ``θ`` with mean ``location: [K, D]`` and ``σ² ~ InvGamma(shape, scale)``
    (``[K, 1]`` each, log-Jacobian of ``u = log σ²`` included), for :func:`unknown_noise_gradient_from_statistics`.

    ``precision: [K, D, D]``: ``θ ~ N(m₀, precision⁻¹)`` independent of σ² (the last two slots, ``P`` and
    ``q = P m₀``; ``n = 2·shape``, ``yy = 2·scale``).  ``nig_precision``: the normal–inverse-gamma prior
    ``θ | σ² ~ N(m₀, σ² nig_precision⁻¹)``, pseudo-observations ``ZᵀZ = nig_precision``, ``Zᵀy = nig_precision m₀``,
    ``yy = m₀ᵀ nig_precision m₀ + 2·scale``, ``n = 2·shape + D`` (Bishop 2006, *PRML* §3.3 with unknown noise).
    Exactly one of the two is given.
    """
    K, D = location.shape
    zeros = location.new_zeros((K, D, D))
    P, Q = (precision, zeros) if precision is not None else (zeros, nig_precision)
    assert P is not None and Q is not None
    c = bmm(Q, location[..., None])[..., 0]
    yy = (location * c).sum(-1, keepdim=True) + 2.0 * scale
    n = 2.0 * shape + (0.0 if nig_precision is None else float(D))
    q = bmm(P, location[..., None])[..., 0]
    return torch.cat([Q.reshape(K, -1), c, yy, n, P.reshape(K, -1), q], dim=-1)


def unknown_noise_gradient_from_statistics(theta: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """``g(θ, T)`` for ``theta = [θ: D, u = log σ²]: [K, M, D+1]`` and ``T = (A, c, yy, n, P, q): [K, 2D² + 2D + 2]``
    (:func:`unknown_noise_statistics`, :func:`unknown_noise_prior_statistics`): with ``rss = yy − 2θ·c + θᵀAθ``,
    ``∇_θ = (c − Aθ)/σ² + q − Pθ`` and ``∂_u = (rss/σ² − n)/2`` -> ``[K, M, D+1]``, linear in ``T``; for data rows
    the gradient of :func:`unknown_noise_gaussian_gradient`."""
    K, D = T.shape[0], theta.shape[-1] - 1
    DD = D * D
    A, c = T[:, :DD].reshape(K, D, D), T[:, None, DD : DD + D]
    yy, n = T[:, None, DD + D : DD + D + 1], T[:, None, DD + D + 1 : DD + D + 2]
    P, q = T[:, DD + D + 2 : 2 * DD + D + 2].reshape(K, D, D), T[:, None, 2 * DD + D + 2 :]
    lin, u = theta[..., :-1], theta[..., -1:]
    lin_a = bmm(lin, A)
    iv = torch.exp(-u)
    rss = yy - 2.0 * (lin * c).sum(-1, keepdim=True) + (lin * lin_a).sum(-1, keepdim=True)
    return torch.cat([(c - lin_a) * iv + q - bmm(lin, P), 0.5 * (rss * iv - n)], dim=-1)


#: The profile grid of :func:`unknown_noise_mode_from_statistics`: ``u = log σ²`` from ``log(yy/n) − PROFILE_BELOW`` to
#: ``log(yy/n) + PROFILE_ABOVE`` in steps of ``PROFILE_STEP`` (``yy`` holds the prior's ``2·scale``, so the mode's
#: ``σ̂² = rss/n`` is at least ``2·scale/n``: 50 nats below covers data up to ``e^{25}`` times the prior scale).
PROFILE_BELOW, PROFILE_ABOVE, PROFILE_STEP = 50.0, 5.0, 0.25
#: Regula falsi steps of :func:`unknown_noise_mode_from_statistics` at most (it converges superlinearly: ~10).
PROFILE_ITERATIONS = 60


def _split_unknown_noise(T: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(A: [K, D, D], c: [K, D], yy: [K, 1], n: [K, 1], P: [K, D, D], q: [K, D])`` of ``T: [K, 2D² + 2D + 2]``."""
    K = T.shape[0]
    D = int(round((math.sqrt(2 * T.shape[1] - 3) - 1) / 2))
    DD = D * D
    A, c = T[:, :DD].reshape(K, D, D), T[:, DD : DD + D]
    yy, n = T[:, DD + D : DD + D + 1], T[:, DD + D + 1 : DD + D + 2]
    return A, c, yy, n, T[:, DD + D + 2 : 2 * DD + D + 2].reshape(K, D, D), T[:, 2 * DD + D + 2 :]


def unknown_noise_conditional(theta: torch.Tensor, T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``σ² | θ ~ InvGamma(n/2, rss(θ)/2)`` under the target of statistics ``T`` (data and the prior's
    pseudo-statistics, :func:`unknown_noise_gradient_from_statistics`): ``theta = [θ: D, u]: [K, M, D+1]`` ->
    ``(shape = n/2: [K, 1], scale = rss/2: [K, M])`` with ``rss = yy − 2θ·c + θᵀAθ``.

    In ``u = log σ²`` the log target is ``−½nu − ½e^{−u}·rss(θ)`` plus terms free of ``u``, the log-density of
    ``σ² ~ InvGamma(n/2, rss/2)`` with its log-|J| ``u`` (the prior's ``InvGamma(a, b)`` enters ``T`` as ``n = 2a``,
    ``yy = 2b``): the variance step of the semi-conjugate regression's Gibbs sampler (Gelman et al. 2013, *BDA3*,
    ch. 14)."""
    A, c, yy, n, _, _ = _split_unknown_noise(T)
    lin = theta[..., :-1]
    rss = yy - 2.0 * (lin * c[:, None, :]).sum(-1) + (lin * bmm(lin, A)).sum(-1)
    return 0.5 * n, 0.5 * rss


def unknown_noise_coefficient_conditional(
    theta: torch.Tensor, T: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``θ | σ² ~ N(Λ⁻¹b, Λ⁻¹)`` under the target of statistics ``T`` (as :func:`unknown_noise_conditional`), with
    ``Λ = e^{−u}A + P`` and ``b = e^{−u}c + q`` at each particle's ``u = log σ²``: ``theta: [K, M, D+1]`` ->
    ``(mean: [K, M, D], L: [K, M, D, D] with Λ = L Lᵀ, ok: [K, M] bool)``, ``ok`` false where Λ is not positive
    definite (its ``L`` is then not to be used).

    In ``θ`` the log target ``−½e^{−u}(yy − 2θ·c + θᵀAθ) − ½θᵀPθ + θ·q`` is the Gaussian log-density
    ``−½θᵀΛθ + θ·b`` up to terms free of ``θ``: the coefficient step of the semi-conjugate regression's Gibbs sampler
    (Gelman et al. 2013, *BDA3*, ch. 14)."""
    A, c, _, _, P, q = _split_unknown_noise(T)
    iv = torch.exp(-theta[..., -1])  # [K, M]
    precision = A[:, None] * iv[..., None, None] + P[:, None]
    b = c[:, None] * iv[..., None] + q[:, None]
    L, info = torch.linalg.cholesky_ex(precision)
    return torch.cholesky_solve(b[..., None], L)[..., 0], L, info == 0


def unknown_noise_mode_from_statistics(T: torch.Tensor) -> torch.Tensor | None:
    """``[θ̂, û]: [K, D + 1]``, the maximum of ``f(θ, u) = −½nu − ½e^{−u}(yy − 2θ·c + θᵀAθ) − ½θᵀPθ + θ·q``, the log
    target (up to a constant) whose gradient is :func:`unknown_noise_gradient_from_statistics`, for ``T`` holding the
    data's statistics and the prior's pseudo-statistics; None where it is not found.

    For a fixed ``u`` the coefficients' maximum is ``θ*(u) = (e^{−u}A + P)⁻¹(e^{−u}c + q)`` (a Gaussian in ``θ``), so
    ``(θ̂, û)`` maximises the profile ``F(u) = f(θ*(u), u)``, one-dimensional, with ``F′(u) = ½(e^{−u}rss(θ*(u)) − n)``
    (the envelope theorem).  A semi-conjugate prior (coefficients independent of σ²) can give ``F`` two local
    maxima: the higher is taken on a grid of ``u`` (:data:`PROFILE_STEP`), then regula falsi on ``F′`` within the
    neighbouring grid points.  Grid points where ``e^{−u}A + P`` is singular (``σ² → 0`` with fewer
    distinct rows than coefficients) are left out.  None when the grid's best point is at its edge or ``F′`` does
    not change sign around it."""
    A, c, yy, n, P, q = _split_unknown_noise(T)
    centre = torch.log(yy / n)  # [K, 1]
    grid = centre + torch.arange(
        -PROFILE_BELOW, PROFILE_ABOVE + PROFILE_STEP / 2, PROFILE_STEP, dtype=T.dtype, device=T.device
    )

    def coefficients(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # u: [K, G] -> θ*: [K, G, D], rss [K, G]
        iv = torch.exp(-u)[..., None]
        theta, info = torch.linalg.solve_ex(iv[..., None] * A[:, None] + P[:, None], iv * c[:, None] + q[:, None])
        rss = yy - 2.0 * (theta * c[:, None]).sum(-1) + (theta * bmm(theta, A)).sum(-1)
        return theta, torch.where(info == 0, rss, math.nan)  # singular where σ² → 0 leaves a rank-deficient ZᵀZ

    theta, rss = coefficients(grid)
    profile = -0.5 * n * grid - 0.5 * torch.exp(-grid) * rss - 0.5 * (theta * bmm(theta, P)).sum(-1)
    profile = profile + (theta * q[:, None]).sum(-1)
    best = torch.nan_to_num(profile, nan=-math.inf).argmax(-1)  # [K]
    if bool(((best == 0) | (best == grid.shape[1] - 1)).any()):
        return None
    lo, hi = grid.gather(1, best[:, None] - 1), grid.gather(1, best[:, None] + 1)

    def slope(u: torch.Tensor) -> torch.Tensor:
        return 0.5 * (torch.exp(-u) * coefficients(u)[1] - n)

    s_lo, s_hi = slope(lo), slope(hi)
    if not bool(((s_lo > 0) & (s_hi < 0)).all()):  # False where NaN (a singular system)
        return None
    u, last = lo, torch.zeros_like(lo)
    for _ in range(PROFILE_ITERATIONS):  # regula falsi on F′ inside the bracket, the Illinois variant
        u = (lo * s_hi - hi * s_lo) / (s_hi - s_lo)
        s_u = slope(u)
        if bool(((s_u.abs() <= 1e-12 * n) | (hi - lo <= 1e-13 * u.abs().clamp_min(1.0))).all()):
            break
        up = s_u > 0  # u replaces lo; an end kept twice in a row has its slope halved
        s_hi = torch.where(up & (last > 0), 0.5 * s_hi, s_hi)
        s_lo = torch.where(~up & (last < 0), 0.5 * s_lo, s_lo)
        lo, s_lo = torch.where(up, u, lo), torch.where(up, s_u, s_lo)
        hi, s_hi = torch.where(up, hi, u), torch.where(up, s_hi, s_u)
        last = torch.where(up, 1.0, -1.0)
    return torch.cat([coefficients(u)[0][:, 0], u], dim=-1)


def linear_gaussian_statistics(
    x: torch.Tensor, y: torch.Tensor | None, variance: torch.Tensor
) -> tuple[torch.Tensor, Any]:
    """``(A, c)`` of ``Σ_b ∇_θ log N(y_b; θ·z_b, σ²) = c − θ A`` with ``z_b = [x_b, 1]``:
    ``A = ZᵀZ/σ²: [K, d+1, d+1]``, ``c = Zᵀy/σ²: [K, d+1]`` for ``x: [K, B, d]``, ``y: [K, B]``,
    ``variance: [K, 1]``.  With ``y = None`` only ``A`` (``c`` is None)."""
    z = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)  # [K, B, D]
    zt = z.transpose(1, 2)
    if y is None:  # the curvature alone
        return bmm(zt, z) / variance[..., None], None
    return bmm(zt, z) / variance[..., None], (zt * y[:, None, :]).sum(-1) / variance


def linear_gaussian_fisher(
    theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, variance: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Exact per-observation empirical Fisher diagonal ``[K, D]`` of ``N(y; θ·z, σ²)``, ``z = [x, 1]``:
    ``f_d = Σ_i W_i (1/B) Σ_b (r_ib z_bd)²`` with ``r = (y − θ·z)/σ²`` and normalised ``weights: [K, M]``."""
    z = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)  # [K, B, D]
    r = (y[:, None, :] - bmm(theta, z.transpose(1, 2))) / variance[..., None]  # [K, M, B]
    per_particle = bmm(r * r, z * z)  # [K, M, D]
    return (weights[..., None] * per_particle).sum(1) / y.shape[1]


def gaussian_prior_statistics(std: torch.Tensor, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A0, c0)`` of ``∇_θ log N(θ; 0, s² I) = c0 − θ A0``: ``A0 = I/s²: [K, D, D]``, ``c0 = 0: [K, D]``."""
    eye = torch.eye(D, dtype=std.dtype, device=std.device)
    return eye / (std[..., None] ** 2), std.new_zeros(std.shape[0], D)


class LinearGaussianStatistics:
    """Mixin of the linear-Gaussian families (linear regression, AR(p)). With known noise (``known_noise``)
    the log-likelihood is quadratic in the parameters (noise variance ``hp["noise_std"]²``, Gaussian prior of
    std ``hp["prior_std"]``): the block statistics, prior statistics and exact Fisher diagonal the stacked
    kernel's closed-form gradients use. With unknown noise the gradients are one function linear in the
    sufficient statistics ``T = (ZᵀZ, Zᵀy, yᵀy, B, P, q)`` (:func:`unknown_noise_gradient_from_statistics`);
    each family gives its prior as pseudo-statistics (``stacked_prior_pseudo_statistics``)."""

    dim: int

    def stacked_sufficient_statistics(self, x, y):
        """Unknown noise: ``x: [K, B, d]``, ``y: [K, B]`` -> ``T: [K, 2D² + 2D + 2]``, ``D = d + 1``."""
        return unknown_noise_statistics(x, y)

    def stacked_grad_from_statistics(self, theta, T):
        return unknown_noise_gradient_from_statistics(theta, T)

    def stacked_mode_from_statistics(self, T):
        """Unknown noise: :func:`unknown_noise_mode_from_statistics` (the profile over ``log σ²``)."""
        return unknown_noise_mode_from_statistics(T)

    def stacked_noise_conditional(self, theta, T):
        """Unknown noise: :func:`unknown_noise_conditional`, ``InvGamma(n/2, rss(θ)/2)``."""
        return unknown_noise_conditional(theta, T)

    def stacked_coefficient_conditional(self, theta, T):
        """Unknown noise: :func:`unknown_noise_coefficient_conditional`, ``N(Λ⁻¹b, Λ⁻¹)``."""
        return unknown_noise_coefficient_conditional(theta, T)

    def stacked_gradient_statistics(self, x, y, hp):
        return linear_gaussian_statistics(x, y, hp["noise_std"] ** 2)

    def stacked_prior_statistics(self, hp):
        return gaussian_prior_statistics(hp["prior_std"], self.dim)

    def stacked_fisher(self, theta, weights, x, y, hp):
        return linear_gaussian_fisher(theta, x, y, hp["noise_std"] ** 2, weights)
