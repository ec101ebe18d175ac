"""Prior–data conflict: a defensive Laplace start for the first block, and a score check of each warm-up block.

**Why.**  SGAIS anneals the first block's likelihood in from the prior (thesis Alg. 8).  When the data
sit far from where the prior puts its mass (observations near 300 for a ``gmm`` whose means are
``N(0, 4σ²)``, raw Nile flows near 900, a regression slope of 5 under a ``N(0, 1)`` prior with
covariates up to 20), the tempered posterior travels many prior standard deviations while the SGHMC
steps, sized for unit-scale data (``η = lr/n``, capped by the particle variance), move the particles
a fraction of that: the reweighting then runs on particles that lag the target and ``log Ẑ`` comes
out thousands of nats low with a healthy-looking ESS (measured: ``bench/conflict.py``).

**The start (Laplace importance sampling, defensive mixture).** Before the first block, unless at least
``CLEAR_ESS`` prior draws (likelihood-weighted ESS) already sit where the block's likelihood is (then
annealing from the prior reaches the posterior and no fit is needed: the common case, e.g. every fresh
change-point challenger on unit-scale data), the block's log target ``log p(θ) + Σ_{y∈C} log p(y|θ)`` is
maximised (in closed form where the family's posterior has one, :func:`closed_form_mode`; else L-BFGS from
the best prior draws, deterministic) and its Hessian ``H`` taken at the mode ``θ̂``
(Tierney & Kadane 1986, the Laplace approximation ``N(θ̂, H⁻¹)``). The data conflict with the prior when the
mode lies far outside the prior draws: ``max_d |θ̂_d − median_d| / (1.4826·MAD_d) > CONFLICT_Z`` (a robust
version of the prior-predictive location check of Evans & Moshonov 2006, §3; 1.4826·MAD is the
normal-consistent scale; for a family with symmetric modes, both the fit from the best prior draw, before the
other starts are fitted, and the best fit). The initial particles are drawn from the defensive mixture (Hesterberg 1995,
*Technometrics* 37, eq. 2) on such a conflict, and, for a family whose parameters are identifiable (no symmetric
modes, :attr:`models.base.Family.identifiable`: the regressions, AR, a one-component gmm), whenever the block is
not clear of the prior draws: annealing a block that concentrates the posterior far inside the prior's spread
asks the SGHMC moves to follow it as closely as a conflict does (measured below). The mixture is

    q(θ) = ε p(θ) + (1 − ε) N(θ; θ̂, κ² H⁻¹),       ε = DEFENSIVE_WEIGHT, κ = PROPOSAL_INFLATION,

with log-weights ``log w_i = log p(θ_i) − log q(θ_i)``: a properly weighted sample of the prior
(``E_q[w] = 1``, so ``Ẑ_0`` is still an unbiased estimate of ``∫p = 1``), and ``p/q ≤ 1/ε`` bounds
every weight.  For a family with exchangeable components (a mixture: ``C!`` symmetric posterior modes) the
Gaussian is symmetrised: each draw's labels are permuted uniformly at random and ``N(θ̂, κ²H⁻¹)`` in ``q`` is
replaced by its average over the ``C!`` permutations (:func:`_symmetrised_log_prob`); without that, ``q``
covers one mode and ``log Ẑ`` comes out about ``log C!`` low.  Beyond ``Family.MAX_LABEL_PERMUTATIONS``
(more than 6 components) no Laplace start is taken: annealing from the prior, whose draws are symmetric,
with the score check below.  The kernel then anneals the block in unchanged: ``log w += Δ ℓ`` (eq. 4.13), so
after the block ``Ẑ = mean(p(θ_i) p(C|θ_i) / q(θ_i))`` — plain importance sampling of the block's evidence
(Robert & Casella 2004, eq. 3.8), unbiased, whose variance is small when ``q`` is close to the
posterior (the Laplace approximation is exact for the linear-Gaussian families).  The decision uses
the data and the prior draws only, never the estimate, so it does not bias ``Ẑ``.

Why not only on a conflict (session 27, ad hoc runs of :class:`~workers.engine.ModelEngine` with the demo's
sampler, exact values from :mod:`models.conjugate`): a fresh AR(2) with unknown noise given the 59 values of
RunLog after its change at 317 (a level shift to a nearly constant series: no conflict, the mode sits inside the
prior draws) in blocks of 50 came out −9.3 nats low on average over 5 seeds (−14.7 to −3.9, two of them with
status ``ok``), −0.03 from the Laplace start (standard errors 0.1); an AR(1) on the demo's Brent series, first
200 values, −49.6 / −1.8 / −6.3 / −49.6 for seeds 0–3 against −1.4 / −1.8 / +0.9 / −3.0.  The change-point
challengers start fresh populations exactly where the data moved.

**The check (Stein's identity).**  Under the posterior ``π``, ``E_π[∇ log π] = 0`` and
``E_π[(θ − m) ∇ log π^T] = −I`` (Stein 1972; the score identities behind kernel Stein
discrepancies, Gorham & Mackey 2015, eq. 2).  For the weighted particles, per coordinate ``d``:

    s_d = Σ_i W_i ∂_d log π(θ_i),   c_d = −Σ_i W_i (θ_id − θ̄_d) ∂_d log π(θ_i),   δ_d = s_d·sd_d / √c_d

(``sd_d`` the weighted particle standard deviation).  For a Gaussian ``π = N(m, σ²)`` and particles
around ``m'`` with spread ``sd``: ``c = sd²/σ²`` and ``δ = (m' − m)/σ``, the population's offset in
posterior standard deviations.  A block whose particles' scores nearly all point one way
(``|s_d| > SCORE_T·rms_d``) with ``|δ_d| > SCORE_Z`` is not certified, and so is one whose particles spread
far wider than the posterior, ``λ_max(C) > SCORE_C`` with ``C = −Σ_i W_i (θ_i − θ̄)(∇ log π(θ_i))ᵀ``, the matrix of
the ``c_d`` (:func:`spread_ratio`; a sampler that does not mix at its step size: SGHMC without
preconditioning on an AR(1) posterior left clouds 6–60 posterior sds wide, ``c`` = 40–4,000, and log-evidence
errors of −30 to −3,900 nats while the weights' ESS looked healthy); the model becomes ``degraded`` with the
reason (:func:`score_check`).  Checked while the history is small (the warm-up), where prior–data conflict
bites and the exact gradient over the history costs no more than one re-anchoring pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from models.base import Family
from models.stack import StackedFamily
from workers.ess import ess

#: Likelihood-weighted ESS of the prior draws (in draws) from which the block is taken to agree with the prior
#: without fitting the Laplace approximation: that many draws already sit where the block's likelihood is, so
#: annealing from the prior reaches the posterior (the conflict the start exists for leaves ESS ≈ 1).
CLEAR_ESS = 3.0
#: Robust z of the block's posterior mode against the prior draws above which the data conflict with the prior.
CONFLICT_Z = 4.0
#: ε of the defensive mixture: every importance weight is at most 1/ε times the prior density ratio.
DEFENSIVE_WEIGHT = 0.05
#: κ: the Laplace covariance is inflated by κ² so that the proposal's tails cover the posterior's.
PROPOSAL_INFLATION = 1.2
#: L-BFGS starts of the Laplace fit (the best prior draws); the mode with the highest log target is kept.
LAPLACE_STARTS = 4
#: Largest dimension for which the Hessian is formed (larger models keep the prior start and the score check).
FULL_HESSIAN_DIM = 200
#: A block is certified when every coordinate's score offset |δ_d| is at most this many posterior sds.
SCORE_Z = 3.0
#: ... and the particles' mean score is at least this fraction of its root mean square (all scores one way).
SCORE_T = 0.95
#: ... and the particles spread at most √SCORE_C times wider than the posterior in every direction
#: (:func:`spread_ratio`, the squared ratio; measured where ESS ≥ 4D).  Under ``π`` it is 1 up to a Monte Carlo
#: error of order √(D/ESS): at most 2.6 over every warm-up block of bench/ar_real_data.py's 13 columns (Bitcoin,
#: flagged by the offset check, 4.0); 1.5·10³–4.5·10⁴ where SGHMC without preconditioning failed there.
SCORE_C = 20.0


class Laplace(NamedTuple):
    """The block posterior's Laplace approximation: mode ``[D]``, covariance Cholesky factor ``[D, D]``."""

    mode: torch.Tensor
    scale_tril: torch.Tensor


#: Relative step of the central differences of the gradient that give the Hessian (float64: error ~1e-8).
HESSIAN_STEP = 1e-4


class OneBlock(NamedTuple):
    """A model and its block as a stack of one in float64 (``models.stack``: the sampler's lean evaluations,
    closed-form gradients where the family has them, no distribution objects): ``x: [1, B, d] | None``,
    ``y: [1, B, ...]``."""

    family: StackedFamily
    x: torch.Tensor | None
    y: torch.Tensor


def one_block(family: Family, x: torch.Tensor | None, y: torch.Tensor, device: torch.device) -> OneBlock:
    """:class:`OneBlock` of ``family`` and the block ``x: [B, d] | None``, ``y: [B, ...]``."""
    return OneBlock(
        StackedFamily.of(family, torch.float64, device),
        x.to(torch.float64)[None] if x is not None else None,
        y.to(torch.float64)[None],
    )


def laplace(block: OneBlock, theta0: torch.Tensor, *, iterations: int = 500) -> Laplace | None:
    """Mode of the block's log target by L-BFGS (strong Wolfe line search) from ``theta0: [D]``, and the Cholesky
    factor of ``H⁻¹`` (``H`` the negative Hessian there, :func:`_laplace_at`).

    The target and its gradient are the sampler's own lean stacked evaluations (``models.stack``, closed-form
    gradients where the family has them).  Deterministic (no random draws).  Returns None when the optimisation or
    the Hessian is not finite or ``H`` is not positive definite, or ``D`` > :data:`FULL_HESSIAN_DIM` (the caller
    then keeps the prior start).
    """
    if theta0.shape[0] > FULL_HESSIAN_DIM:
        return None
    gradient = _gradient(block)
    mode = _lbfgs_mode(block, gradient, theta0, iterations)
    if mode is None or not torch.isfinite(mode).all():
        return None
    with torch.no_grad():
        return _laplace_at(gradient, mode)


def closed_form_laplace(block: OneBlock) -> Laplace | None:
    """:func:`laplace` at the block posterior's mode in closed form (:func:`closed_form_mode`), where the family has
    one and the gradient there is within :data:`CLOSED_FORM_OFFSET` posterior sds of zero; else None (also where
    computing it raised: the caller's L-BFGS fit then stands in, as before closed forms)."""
    with torch.no_grad():
        try:
            mode = closed_form_mode(block)
        except RuntimeError:  # e.g. torch.linalg.LinAlgError: no closed form here, the optimiser fits
            return None
        if mode is None or mode.shape[0] > FULL_HESSIAN_DIM or not torch.isfinite(mode).all():
            return None
        return _laplace_at(_gradient(block), mode, check=True)


def _gradient(block: OneBlock) -> Callable[[torch.Tensor], torch.Tensor]:
    """``∇ log target``: ``[P, D] -> [P, D]`` of the block (prior plus every row, λ = 1)."""
    one, x, y = block
    lam = torch.ones(1, dtype=torch.float64, device=y.device)

    def gradient(t: torch.Tensor) -> torch.Tensor:
        return one.grad_log_target(t[None], x, y, lam)[0]

    return gradient


def _laplace_at(
    gradient: Callable[[torch.Tensor], torch.Tensor], mode: torch.Tensor, *, check: bool = False
) -> Laplace | None:
    """:class:`Laplace` at ``mode: [D]``: ``H`` the central difference of the gradient with step
    ``HESSIAN_STEP·max(1, |θ̂_d|)`` in each coordinate (one call at ``2D + 1`` points, the mode's own gradient last;
    relative error ~1e-8 in float64, immaterial for a proposal whose errors the importance weights correct),
    symmetrised.  None when ``H`` is not finite or not positive definite, or with ``check`` when the gradient at
    ``mode`` is more than :data:`CLOSED_FORM_OFFSET` posterior sds (``|∂_d f| / √H_dd``) from zero somewhere."""
    D = mode.shape[0]
    h = HESSIAN_STEP * mode.abs().clamp_min(1.0)
    eye = torch.diag(h)
    g = gradient(torch.cat([mode + eye, mode - eye, mode[None]]))  # [2D + 1, D]
    H = -(g[:D] - g[D : 2 * D]) / (2 * h[:, None])  # row d: −∂_d ∇ log target
    H = 0.5 * (H + H.T)
    if not (torch.isfinite(H).all() and torch.isfinite(g[-1]).all()):
        return None
    if check and not bool((g[-1].abs() <= CLOSED_FORM_OFFSET * H.diagonal().clamp_min(0.0).sqrt()).all()):
        return None
    try:
        L = torch.linalg.cholesky(H)
    except RuntimeError:
        return None
    # Σ = H⁻¹ = L⁻ᵀ L⁻¹: its Cholesky factor is the lower-triangular factor of (L⁻ᵀ)(L⁻ᵀ)ᵀ
    Linv = torch.linalg.solve_triangular(L, torch.eye(D, dtype=torch.float64, device=mode.device), upper=False)
    scale = torch.linalg.cholesky(Linv.T @ Linv)
    if not torch.isfinite(scale).all():
        return None
    return Laplace(mode, scale)


#: A closed-form mode is taken when the gradient there is within this many posterior sds of zero per coordinate,
#: ``|∂_d f| / √H_dd`` (exact arithmetic gives 0; float64 rounding ~1e-12 at unit scale): otherwise L-BFGS fits.
CLOSED_FORM_OFFSET = 1e-6


def closed_form_mode(block: OneBlock) -> torch.Tensor | None:
    """``θ̂: [D]``, the block posterior's mode where the family gives it in closed form, else None: for a quadratic
    family (``∇ log p(θ) + Σ ∇ log p(y|θ) = (c0 + c) − θ(A0 + A)``) ``θ̂ = (A0 + A)⁻¹(c0 + c)``; for a
    sufficient-statistics family the zero of ``g(θ, T0 + T_C)``
    (:meth:`models.base.Family.stacked_mode_from_statistics`, e.g. a one-component gmm's normal–inverse-gamma mode).
    Replaces L-BFGS's 7-40 target and gradient evaluations (3.5-30 ms, measured ad hoc on gmm and regression blocks)
    by one evaluation of the statistics (0.4 ms with the Hessian) for the families that have one."""
    one, x, y = block
    if one.quadratic:
        A0, c0 = one.prior_statistics()
        A, c = one.gradient_statistics(x, y)
        return torch.linalg.solve(A0[0] + A[0], c0[0] + c[0])  # raises where singular (closed_form_laplace)
    if one.sufficient_statistics:
        mode = one.mode_from_statistics(one.prior_pseudo_statistics() + one.statistics(x, y))
        return mode[0] if mode is not None else None
    return None


def _lbfgs_mode(
    block: OneBlock, gradient: Callable[[torch.Tensor], torch.Tensor], theta0: torch.Tensor, iterations: int
) -> torch.Tensor | None:
    """The log target's maximum by L-BFGS-B (scipy's, without bounds: its line search satisfies the strong Wolfe
    conditions; Byrd, Lu, Nocedal & Zhu 1995) from ``theta0: [D]``, stopping at ``max|∇| ≤ 1e-9`` or a relative
    change of the target below 1e-12, at most ``iterations`` iterations; None when the optimiser raised.
    Deterministic.  ``torch.optim.LBFGS`` did the same until session 27: its first step imports ``torch._dynamo``
    (1.7 s and 38 MB in every worker process, :func:`workers.worker.loop.warm_lazy_imports`)."""
    from scipy.optimize import minimize

    one, fam_x, fam_y = block
    device = theta0.device

    def negative(v: np.ndarray) -> tuple[float, np.ndarray]:
        t = torch.from_numpy(v).to(device)[None]  # [1, D] float64
        with torch.no_grad():
            f = one.log_prior(t[None]) + one.log_likelihood(t[None], fam_x, fam_y).sum(-1)
            g = gradient(t)[0]
        return -float(f[0, 0]), (-g).cpu().numpy()

    start = theta0.detach().to(torch.float64).cpu().numpy()
    options = {"maxiter": iterations, "maxfun": iterations + iterations // 4, "gtol": 1e-9, "ftol": 1e-12}
    try:
        res = minimize(negative, start, jac=True, method="L-BFGS-B", options=options)
    except (RuntimeError, ValueError, FloatingPointError):
        return None
    return torch.from_numpy(res.x).to(device)


def best_laplace(
    block: OneBlock,
    prior_draws: torch.Tensor,
    log_target: torch.Tensor,
    *,
    unimodal: bool = False,
    wanted: Callable[[Laplace], bool] | None = None,
) -> Laplace | None:
    """:func:`closed_form_laplace` where the family has a closed-form mode; else :func:`laplace` from each of the
    ``LAPLACE_STARTS`` prior draws ``prior_draws: [M, D]`` with the highest
    ``log_target: [M]`` (distinct draws, best first); the fit whose mode has the highest log target, or None when
    none could be formed.  One start found a poor local mode of bench/reference.py's 5-component gmm (seed 5, the
    first block 208 nats low with status ``ok``, every later block trapped there).  ``unimodal``: the target has
    one mode (:attr:`models.base.Family.unimodal`), so the first fit that succeeds is it.  ``wanted``: asked of the
    first fit that succeeds; when it answers False no fit is wanted (None, the other starts not fitted)."""
    closed = closed_form_laplace(block)
    if closed is not None:  # the block posterior's (highest) maximum, closed_form_mode
        return closed
    order = torch.argsort(log_target, descending=True)[:LAPLACE_STARTS].tolist()
    one = block.family
    best, best_lt = None, -math.inf
    for i in order:
        if not math.isfinite(float(log_target[i])):
            break
        lap = laplace(block, prior_draws[i])
        if lap is None:
            continue
        if best is None and wanted is not None and not wanted(lap):
            return None
        if unimodal:
            return lap
        with torch.no_grad():
            m = lap.mode[None, None]
            lt = float((one.log_prior(m) + one.log_likelihood(m, block.x, block.y).sum(-1))[0, 0])
        if lt > best_lt:
            best, best_lt = lap, lt
    return best


def robust_z(prior_draws: torch.Tensor, point: torch.Tensor) -> float:
    """``max_d |point_d − median_d| / (1.4826·MAD_d)`` over prior draws ``[M, D]`` (inf when a MAD is 0)."""
    t = prior_draws.to(torch.float64)
    med = t.median(0).values
    mad = (t - med).abs().median(0).values * 1.4826
    z = (point.to(torch.float64) - med).abs() / mad
    return float(torch.nan_to_num(z, nan=math.inf).max())


def clear_of_conflict(
    family: StackedFamily, prior_draws: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor
) -> list[bool]:
    """The first test of :func:`defensive_start` for ``K`` models at once: True where at least ``CLEAR_ESS``
    prior draws (likelihood-weighted ESS) sit where the block's likelihood is, so no start is needed.

    ``family``: the models' stack in float64; ``prior_draws: [K, M, D]``; ``x: [K, B, d] | None``;
    ``y: [K, B, ...]``.  One stacked evaluation instead of ``K``; each row is the arithmetic the model's own
    test does, so the answers are its own (tests/test_conflict.py checks them against one model at a time).
    """
    with torch.no_grad():
        ll = family.log_likelihood(prior_draws.to(torch.float64), x, y).sum(-1)
    ll = torch.nan_to_num(ll, nan=-math.inf)
    return (torch.isfinite(ll).any(-1) & (ess(ll) >= CLEAR_ESS)).tolist()


def defensive_start(
    generator: torch.Generator,
    family: Family,
    prior_draws: torch.Tensor,
    x: torch.Tensor | None,
    y: torch.Tensor,
    *,
    tested: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(theta: [M, D], log_w: [M] float64, variance: [D] float64)``: ``M`` draws from the defensive
    mixture ``q`` (module docstring), ``log w = log p − log q`` and the Laplace variances ``diag(H⁻¹)``,
    when the block is not clear of the prior draws and the family is identifiable or the block conflicts with
    the prior; None otherwise (keep ``prior_draws``), also where no Laplace approximation could be formed.

    ``prior_draws: [M, D]`` are the model's initial particles (they give the optimiser's start and the
    conflict test); the ``M`` mixture draws come from ``generator`` (one ``rand`` call for the component
    labels, one prior draw, one ``randn``, and for a family with exchangeable components one ``randint``
    for the label permutation of each draw).  ``tested``: the caller found the block not clear of conflict
    already (:func:`clear_of_conflict`, batched over a round's models), so the test is not repeated.
    """
    M, D = prior_draws.shape
    dtype = prior_draws.dtype
    symmetric = family.exchangeable_parameters() != ()
    if symmetric and family.label_orbit(prior_draws[:1]) is None:
        return None  # too many label permutations to symmetrise the proposal (module docstring)
    block = one_block(family, x, y, prior_draws.device)
    if not tested and clear_of_conflict(block.family, prior_draws[None], block.x, block.y)[0]:
        return None  # enough prior draws where the block's likelihood is: annealing from the prior works
    with torch.no_grad():
        theta64 = prior_draws.to(torch.float64)[None]
        ll = torch.nan_to_num(block.family.log_likelihood(theta64, block.x, block.y).sum(-1)[0], nan=-math.inf)
        lt = block.family.log_prior(theta64)[0] + ll
    lt = torch.nan_to_num(lt, nan=-math.inf)

    # a family with symmetric modes takes the start only on a conflict: decided from the fit of the best prior
    # draw before the other starts are fitted (four L-BFGS-B fits, of which a conflict test then discarded all, were
    # a fifth of the demo's two-component gmm), and confirmed on the best of them
    def conflicts(lap: Laplace) -> bool:
        return robust_z(prior_draws, lap.mode) > CONFLICT_Z

    wanted = None if family.identifiable else conflicts
    lap = best_laplace(block, prior_draws, lt, unimodal=family.unimodal, wanted=wanted)
    if lap is None or (not family.identifiable and not conflicts(lap)):
        return None
    gauss = torch.distributions.MultivariateNormal(lap.mode, scale_tril=PROPOSAL_INFLATION * lap.scale_tril)
    u = torch.rand(M, generator=generator, dtype=torch.float64, device=prior_draws.device)
    from_prior = family.sample_prior(generator, M, torch.float64, prior_draws.device)
    z = torch.randn(M, D, generator=generator, dtype=torch.float64, device=prior_draws.device)
    from_gauss = lap.mode + z @ (PROPOSAL_INFLATION * lap.scale_tril).T
    if symmetric:
        orbit = family.label_orbit(from_gauss)
        assert orbit is not None
        pick = torch.randint(orbit.shape[0], (M,), generator=generator, device=prior_draws.device)
        from_gauss = orbit[pick, torch.arange(M, device=pick.device)]
    theta = torch.where((u < DEFENSIVE_WEIGHT)[:, None], from_prior, from_gauss)
    with torch.no_grad():
        log_p = family.log_prior(theta)
        log_g = _symmetrised_log_prob(family, gauss, theta) if symmetric else gauss.log_prob(theta)
        log_q = torch.logaddexp(math.log(DEFENSIVE_WEIGHT) + log_p, math.log1p(-DEFENSIVE_WEIGHT) + log_g)
    log_w = torch.nan_to_num(log_p - log_q, nan=-math.inf)
    if not torch.isfinite(theta).all() or not torch.isfinite(log_w).any():
        return None
    variance = (lap.scale_tril**2).sum(1)
    return theta.to(dtype), log_w.to(torch.float64), variance


def _symmetrised_log_prob(
    family: Family, gauss: torch.distributions.MultivariateNormal, theta: torch.Tensor
) -> torch.Tensor:
    """``log q_sym(θ): [M]`` of the Laplace Gaussian ``g`` with its labels permuted uniformly at random.

    Drawing ``θ₀ ~ g`` and permuting the components of its constrained parameters by a uniform ``σ`` gives
    ``q_sym(θ) = (1/P) Σ_σ g(θ_σ)`` over the ``P = C!`` points ``θ_σ`` of θ's orbit
    (:meth:`models.base.Family.label_orbit`): the permutation preserves volume in the constrained space, and
    the transform's log-|J| is the same at every point of an orbit, so in the unconstrained space too.
    One Gaussian covers one of a mixture's ``C!`` symmetric posterior modes, so without the symmetrisation
    the importance-sampling estimate misses the other ``C! − 1``: ``log Ẑ`` about ``log C!`` low (4.8 nats
    for 5 components, measured on bench/reference.py's mixture: first block −2,519.7 against −2,514.8
    annealed from the prior).
    """
    orbit = family.label_orbit(theta)
    assert orbit is not None
    return torch.logsumexp(gauss.log_prob(orbit), 0) - math.log(orbit.shape[0])  # [P, M] -> [M]


def score_offsets(
    theta: torch.Tensor, log_w: torch.Tensor, score: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(δ: [..., D], c: [..., D], t: [..., D])`` of the module docstring for particles ``theta: [..., M, D]``,
    ``log_w: [..., M]`` and the posterior score ``score = ∇ log π(θ_i): [..., M, D]`` (float64);
    ``t_d = s_d / √(Σ_i W_i g_id²)``.  Leading dimensions are models (row-wise arithmetic)."""
    W = torch.softmax(log_w.to(torch.float64), -1)[..., None]
    t, g = theta.to(torch.float64), score.to(torch.float64)
    mean = (W * t).sum(-2, keepdim=True)
    sd = torch.sqrt((W * (t - mean) ** 2).sum(-2))
    s = (W * g).sum(-2)
    c = -(W * (t - mean) * g).sum(-2)
    delta = s * sd / torch.sqrt(c.clamp_min(1e-300))
    rms = torch.sqrt((W * g * g).sum(-2))
    return delta, c, s / rms.clamp_min(1e-300)


def spread_ratio(theta: torch.Tensor, log_w: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """``[...]``: the largest eigenvalue (real part) of ``C = −Σ_i W_i (θ_i − θ̄)(∇ log π(θ_i))ᵀ``, the matrix form of
    the ``c_d`` of :func:`score_offsets`, for particles ``theta: [..., M, D]``, ``log_w: [..., M]`` and scores
    ``score: [..., M, D]``; NaN where the weights' ESS is below ``4D`` (too few particles to estimate a D×D matrix)
    or ``C`` is not finite.

    Under ``π``, ``C = I`` (Stein's identity, module docstring).  For a Gaussian ``π`` with precision ``H`` and
    particles with covariance ``Σ``, ``C = ΣH``: its largest eigenvalue is the squared ratio of the cloud's spread to
    the posterior's in the direction where the cloud is widest.  Unlike the diagonal ``c_d``, its Monte Carlo error
    does not grow along a ridge: ``C`` is similar to the same matrix in whitened coordinates (``θ = m + Az``,
    ``∇_θ = A⁻ᵀ∇_z``, so ``C_θ = A C_z A⁻¹``), whose entries have errors ``O(1/√ESS)``."""
    W = torch.softmax(log_w.to(torch.float64), -1)
    t, g = theta.to(torch.float64), score.to(torch.float64)
    dt = t - (W[..., None] * t).sum(-2, keepdim=True)
    C = -(W[..., None] * dt).transpose(-1, -2) @ g  # [..., D, D]
    D = C.shape[-1]
    usable = torch.isfinite(C).all(-1).all(-1) & (ess(log_w.to(torch.float64)) >= 4 * D)
    if not bool(usable.any()):  # e.g. every model after the warm-up with 10 particles: no decomposition to pay for
        return torch.full(usable.shape, math.nan, dtype=C.dtype, device=C.device)
    eye = torch.eye(D, dtype=C.dtype, device=C.device)
    C = torch.where(usable[..., None, None], C, eye)
    try:
        vals = torch.linalg.eigvals(C).real.amax(-1)
    except RuntimeError:  # torch.linalg.LinAlgError: no answer for the stack, none claimed
        return torch.full(usable.shape, math.nan, dtype=C.dtype, device=C.device)
    return torch.where(usable, vals, math.nan)


def score_check(theta: torch.Tensor, log_w: torch.Tensor, score: torch.Tensor) -> str | None:
    """None when the weighted particles pass the score check (module docstring), else the reason.

    Coordinate ``d`` fails when the particles' scores nearly all point the same way, ``|t_d| > SCORE_T``
    (``|t_d| ≤ 1`` always; under ``π`` it is ``O(1/√ESS)``), and the offset is large, ``|δ_d| > SCORE_Z``,
    or not measurable (``c_d ≤ 0``: with correlated coordinates the diagonal of ``Cov·H`` need not be
    positive for a cloud that does not match ``π``); or when the particles spread far wider than the
    posterior in some direction, ``spread_ratio > SCORE_C``.  ``theta: [M, D]``, ``log_w: [M]``, ``score: [M, D]``.
    """
    return score_checks(theta[None], log_w[None], score[None])[0]


def score_checks(theta: torch.Tensor, log_w: torch.Tensor, score: torch.Tensor) -> list[str | None]:
    """:func:`score_check` of ``K`` models at once: ``theta: [K, M, D]``, ``log_w: [K, M]``,
    ``score: [K, M, D]``; one reason (or None) per model, from one batched evaluation."""
    delta, c, t = score_offsets(theta, log_w, score)
    broken = ~((torch.isfinite(delta) | (c <= 0)).all(-1) & torch.isfinite(t).all(-1))
    offset = (t.abs() > SCORE_T) & ((c <= 0) | (delta.abs() > SCORE_Z))
    ratio = spread_ratio(theta, log_w, score)
    wide = ratio > SCORE_C  # NaN (not measurable) passes
    out: list[str | None] = [None] * theta.shape[0]
    for k in torch.nonzero(broken | offset.any(-1) | wide).flatten().tolist():
        if broken[k]:
            out[k] = "the posterior score is not finite at the particles; the evidence is not certified"
            continue
        if not offset[k].any():
            out[k] = (
                f"the particles spread {math.sqrt(float(ratio[k])):.3g} times wider than the posterior (score "
                f"check, Stein's identity: limit {math.sqrt(SCORE_C):.3g}): the moves do not mix at their step "
                "size; the evidence is not certified"
            )
            continue
        bad = offset[k]
        worst = float(torch.where(c[k] > 0, delta[k].abs(), torch.inf)[bad].max())
        out[k] = (
            f"the particles sit {worst:.3g} posterior standard deviations from where the posterior score vanishes "
            f"(score check, limits |t| {SCORE_T:g}, |δ| {SCORE_Z:g}): likely prior-data conflict; the evidence is "
            "not certified"
        )
    return out
