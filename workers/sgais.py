"""The SGAIS update: absorb one block of observations (Cameron 2020, Alg. 8, §4.2).

``init`` draws the particles from the prior; ``absorb_block`` anneals the new
block's likelihood in from λ = 0 to 1 with ESS-adaptive increments (eq. 4.13,
4.15), optional resampling, and SGHMC moves on mini-batches of the history
(eq. 4.14).  Both are pure in the sense of STYLE.md: they take the state and an
explicit ``torch.Generator`` and return a new state; only the append-only
history buffer is shared between the old and the new state.

Step sizes: ``η_d = lr · min(4·Var_d, 1/(n·f_d))`` per coordinate, ``Var_d`` the weighted particle
variance and ``f_d`` the per-observation empirical Fisher information measured on each block after
the warm-up (``fisher_diagonal``; ``f_d = 1`` before it, the thesis's ``η = lr/n``), floored so
that no step grows more than ``fisher_step_growth``-fold.

Evidence bookkeeping (eq. 4.6): ``log Ẑ_n = logsumexp(log w) − log M``; a
resampling step replaces every log-weight by the log of their mean, which
leaves ``Ẑ`` unchanged, so weights that are non-uniform before a block need no
special treatment.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from models.base import Family
from workers.ess import ess, solve_increment
from workers.gradients import Batch, control_variate_gradient, history_gradient, minibatch_gradient
from workers.history import History
from workers.resampling import RESAMPLERS, systematic_resample
from workers.settings import SamplerSettings
from workers.sghmc import sghmc_step


class NumericalError(FloatingPointError):
    """NaN/inf log-weights or particles: the update is not trustworthy and was not applied."""


class SGAISState(NamedTuple):
    """Particle state of one model after ``n`` observations.

    theta : [M, D] unconstrained particles.
    log_w : [M] float64 log-weights (unnormalised; ``log Ẑ_n = logsumexp(log_w) − log M``).
    velocity : [M, D] SGHMC velocities.
    anchor : [M, D] control-variate anchors (zeros until the first anchoring).
    anchor_grad : [M, D] ``Σ_{y∈H} ∇ log p(y|anchor_i)``.
    n_anchor : history size when the anchors were last set (0 = never).
    posterior_var : [D] float64 weighted particle variance per coordinate at the last annealing
        step (the diagonal preconditioner's scale).
    history : the observations absorbed so far (shared, append-only).
    context : [p] last stream values for families with ``context_size`` > 0, else None.
    blocks : number of blocks absorbed.
    n_reanneal : history size at the last re-annealing (0 = never; :func:`reanneal`).
    n_change : history size after the last block that marked a change (``reanneal_steps``; 0 = none).
    """

    theta: torch.Tensor
    log_w: torch.Tensor
    velocity: torch.Tensor
    anchor: torch.Tensor
    anchor_grad: torch.Tensor
    n_anchor: int
    posterior_var: torch.Tensor
    history: History
    context: torch.Tensor | None
    blocks: int
    n_reanneal: int = 0
    n_change: int = 0

    @property
    def n(self) -> int:
        """Likelihood rows absorbed (observations, less any conditioned-on context values)."""
        return self.history.seen

    @property
    def log_evidence(self) -> float:
        """``log Ẑ_n`` (nats), thesis eq. 4.6."""
        return float(torch.logsumexp(self.log_w, 0) - math.log(self.log_w.shape[0]))


class BlockInfo(NamedTuple):
    """Diagnostics of one absorbed block: the trace row, event and metrics, one to one."""

    observations: int  # rows in the block that entered the likelihood
    log_predictive: float  # log Ẑ_n − log Ẑ_{n_prev} (nats)
    log_evidence: float  # log Ẑ_n (nats)
    annealing_steps: int
    ess: float  # ESS of the full weights after the block, in particles
    resampled: bool  # resampled at least once in this block
    guard_tripped: bool  # max_annealing_steps reached; the rest of the block was taken in one increment
    reannealed: bool = False  # the population was merged with a re-annealing over the history (reanneal)


#: Unconstrained coordinates beyond this magnitude mean the SGHMC moves have diverged.
DIVERGED = 1e12
PRECONDITIONER_SLACK = 4.0
#: Rademacher probes per block for the empirical Fisher diagonal (``fisher_diagonal``).
FISHER_PROBES = 4


def fisher_diagonal(
    generator: torch.Generator,
    family: Family,
    theta: torch.Tensor,
    log_w: torch.Tensor,
    x: torch.Tensor | None,
    y: torch.Tensor,
    *,
    probes: int,
) -> torch.Tensor:
    """Per-observation empirical Fisher information ``f: [D]`` float64 on the block ``(x, y)``.

    ``f_d = Σ_i W_i · (1/B) Σ_b (∂_d log p(y_b|θ_i))²`` over the particles ``theta: [M, D]`` with
    normalised weights ``W = softmax(log_w)``. Per-observation gradients are never formed: for a
    Rademacher vector ``s: [B]``, ``E_s[(Σ_b s_b ∇ log p(y_b|θ))²] = Σ_b (∇ log p(y_b|θ))²``
    (Hutchinson's trick), averaged over ``probes`` vectors drawn from ``generator``.
    """
    B = y.shape[0]
    with torch.enable_grad():
        t = theta.detach().requires_grad_(True)
        ll = family.log_likelihood(t, x, y)  # [M, B]
        total = torch.zeros_like(theta, dtype=torch.float64)
        for k in range(probes):
            s = torch.randint(0, 2, (B,), generator=generator, device=theta.device).to(ll.dtype) * 2 - 1
            (g,) = torch.autograd.grad((ll * s).sum(), t, retain_graph=k + 1 < probes)
            total += g.to(torch.float64) ** 2
    W = torch.softmax(log_w, 0)[:, None]
    return (W * total).sum(0) / (probes * B)


def weighted_variance(theta: torch.Tensor, log_w: torch.Tensor, *, floor: torch.Tensor) -> torch.Tensor:
    """Per-coordinate variance of ``theta: [M, D]`` under normalised ``exp(log_w)``, ``[D]`` float64.

    Bounded below by ``floor: [D]`` so that a population collapsed by resampling cannot
    shrink the step size to nothing in one annealing step.
    """
    W = torch.softmax(log_w, 0)[:, None]
    t = theta.to(torch.float64)
    mean = (W * t).sum(0)
    return torch.maximum((W * (t - mean) ** 2).sum(0), floor)


def init(generator: torch.Generator, family: Family, settings: SamplerSettings) -> SGAISState:
    """Prior draws ``θ_i ~ p(θ)``, ``log w_i = 0`` (Alg. 8, lines 1–2)."""
    dtype, device = settings.torch_dtype, settings.torch_device
    M = settings.initial_particles
    theta = family.sample_prior(generator, M, dtype, device)
    if not torch.isfinite(theta).all():
        raise NumericalError("prior draws are not finite; check the hyperparameters")
    zeros = torch.zeros_like(theta)
    history = History(capacity=settings.history_capacity, seed=settings.seed, dtype=dtype, device=device)
    return SGAISState(
        theta=theta,
        log_w=torch.zeros(M, dtype=torch.float64, device=device),
        velocity=zeros,
        anchor=zeros.clone(),
        anchor_grad=zeros.clone(),
        n_anchor=0,
        posterior_var=theta.to(torch.float64).var(0),
        history=history,
        context=None,
        blocks=0,
    )


def reduce_particles(generator: torch.Generator, state: SGAISState, settings: SamplerSettings) -> SGAISState:
    """Resample the warm-up population down to ``settings.particles`` (end of warm-up).

    ``M'`` ancestors are drawn systematically from the ``M`` weighted particles and every
    new log-weight is the log of the old mean weight, so ``Ẑ = mean(w)`` is unchanged and
    stays unbiased (the same argument as resampling, thesis §3.4).
    """
    M = settings.particles
    log_w = state.log_w
    idx = systematic_resample(generator, log_w, M)
    log_mean = torch.logsumexp(log_w, 0) - math.log(log_w.shape[0])
    return state._replace(
        theta=state.theta[idx],
        velocity=state.velocity[idx],
        anchor=state.anchor[idx],
        anchor_grad=state.anchor_grad[idx],
        log_w=log_mean.expand(M).clone(),
    )


def absorb_block(
    generator: torch.Generator,
    state: SGAISState,
    *,
    family: Family,
    settings: SamplerSettings,
    x: torch.Tensor | None,
    y: torch.Tensor,
    heartbeat: Callable[[], None] | None = None,
) -> tuple[SGAISState, BlockInfo]:
    """Absorb one validated block ``(x: [B, d] | None, y: [B, ...])``.

    Returns the new state and the block's :class:`BlockInfo`.  ``heartbeat`` is called between
    the blocks of a re-annealing (:func:`reanneal`), which can take as long as the history took
    (a worker renews its lease there); if it raises, the exception propagates and the block is
    not absorbed.

    Raises
    ------
    NumericalError
        When the log-likelihood, the log-weights or the particles become NaN/inf.
        The input state is untouched (the history is only appended after success).
    """
    dtype, device = settings.torch_dtype, settings.torch_device
    x = x.to(dtype=dtype, device=device) if x is not None else None
    y = y.to(dtype=dtype, device=device)
    x, y, context = family.prepare(x, y, state.context)
    B = y.shape[0]
    log_z_prev = state.log_evidence
    if B == 0:  # every value went into the conditioning context
        return state._replace(context=context, blocks=state.blocks + 1), BlockInfo(
            0, 0.0, log_z_prev, 0, float(ess(state.log_w)), False, False
        )
    n_prev = state.history.seen  # before _anneal_block appends to the shared history
    new_state, steps, resampled, guard_tripped = _anneal_block(
        generator, state, family=family, settings=settings, x=x, y=y
    )
    history = new_state.history
    n = history.seen
    # A change: a block after the warm-up (early blocks need many steps as the posterior contracts
    # from the prior) whose posterior moved far.  Re-anneal then and at each growth step while the
    # history is within reanneal_horizon of its size at the last change.
    n_change = state.n_change
    if (
        settings.reanneal_steps is not None
        and steps >= settings.reanneal_steps
        and n_prev >= max(settings.warmup_observations, 1)
    ):
        n_change = n
    new_state = new_state._replace(context=context, n_change=n_change)
    reannealed = (
        n_change > 0
        and n <= settings.reanneal_horizon * n_change
        and n >= settings.reanneal_growth * new_state.n_reanneal
        and history.size == history.seen  # the whole history is held (no reservoir)
    )
    if reannealed:
        try:
            new_state = reanneal(generator, new_state, family=family, settings=settings, heartbeat=heartbeat)
        except BaseException:
            history.truncate(n_prev)  # leave the input state as it was (the block is not absorbed)
            raise
    log_z = new_state.log_evidence
    return new_state, BlockInfo(
        observations=B,
        log_predictive=log_z - log_z_prev,
        log_evidence=log_z,
        annealing_steps=steps,
        ess=float(ess(new_state.log_w)),
        resampled=resampled,
        guard_tripped=guard_tripped,
        reannealed=reannealed,
    )


def _anneal_block(
    generator: torch.Generator,
    state: SGAISState,
    *,
    family: Family,
    settings: SamplerSettings,
    x: torch.Tensor | None,
    y: torch.Tensor,
) -> tuple[SGAISState, int, bool, bool]:
    """Alg. 8, lines 4–15, on prepared rows ``(x, y)`` (``B >= 1``): the new state (context
    unchanged), the number of annealing steps, whether it resampled, whether the guard tripped."""
    B = y.shape[0]
    history = state.history
    n_prev = history.seen
    if state.theta.shape[0] > settings.particles and n_prev >= settings.warmup_observations:
        state = reduce_particles(generator, state, settings)
    n = n_prev + B
    M = state.theta.shape[0]
    block = Batch(x, y)
    theta, log_w, velocity = state.theta, state.log_w, state.velocity
    anchor, anchor_grad, n_anchor = state.anchor, state.anchor_grad, state.n_anchor
    posterior_var = state.posterior_var

    use_cv = settings.control_variates and history.size > 0
    if use_cv and (n_anchor == 0 or n_prev >= settings.anchor_growth * n_anchor):
        # Re-anchor every particle at its current position: one pass over H, amortised O(1)
        # per observation because it happens each time the history grows by anchor_growth.
        hx, hy = history.all_rows()
        anchor = theta.clone()
        anchor_grad = history_gradient(family, anchor, hx, hy) * (n_prev / history.size)
        n_anchor = n_prev

    def gradient(t: torch.Tensor, lam: float) -> torch.Tensor:
        batch = None
        if history.size > 0:
            batch = Batch(*history.rows(history.sample_index(generator, settings.batch_size)))
        if use_cv:
            # anchor_grad is in log-likelihood convention (+∇ log p): U's gradient takes −G.
            return control_variate_gradient(
                family, t, block=block, lam=lam, batch=batch, n_prev=n_prev, anchor=anchor, anchor_grad=anchor_grad
            )
        return minibatch_gradient(family, t, block=block, lam=lam, batch=batch, n_prev=n_prev)

    fisher = None
    if settings.preconditioning and settings.fisher_step_growth > 1 and n_prev >= settings.warmup_observations:
        # Per-observation curvature of each coordinate, measured on the new block at the current
        # particles; floored at 1/growth so that no step grows more than `fisher_step_growth`-fold.
        fisher = fisher_diagonal(generator, family, theta, log_w, x, y, probes=FISHER_PROBES)
        fisher = torch.clamp(fisher, min=1.0 / settings.fisher_step_growth)
    burn_in = settings.burn_in
    if settings.change_burn_in is not None and state.n_change and n <= settings.reanneal_horizon * state.n_change:
        burn_in = max(burn_in, settings.change_burn_in)  # the posterior is still moving after a change
    resample = RESAMPLERS[settings.resampling]
    lam = 0.0
    steps = 0
    resampled = False
    guard_tripped = False
    target = settings.ess_target * M
    while lam < 1.0:
        ll = family.log_likelihood(theta, x, y).sum(-1).to(torch.float64)  # [M]
        if torch.isnan(ll).any():
            raise NumericalError(f"log-likelihood is NaN for {int(torch.isnan(ll).sum())} of {M} particles")
        remaining = 1.0 - lam
        try:
            delta = solve_increment(log_w, ll, target=target, remaining=remaining)
        except FloatingPointError as err:
            raise NumericalError(str(err)) from err
        if steps + 1 >= settings.max_annealing_steps and delta < remaining:
            # The guard: take the rest of the block in this step and say so (BlockInfo.guard_tripped).
            delta = remaining
            guard_tripped = True
        # Snap to 1 when the rest is within rounding (avoids a final sliver step).
        if lam + delta >= 1.0 - 1e-12:
            delta = remaining
        lam = 1.0 if delta == remaining else lam + delta
        log_w = log_w + torch.nan_to_num(delta * ll, neginf=-math.inf)
        if torch.isnan(log_w).any() or not torch.isfinite(torch.logsumexp(log_w, 0)):
            raise NumericalError("log-weights became NaN or all -inf")
        steps += 1
        n_target = n_prev + lam * B if settings.learning_rate_schedule == "annealed" else n
        step_size: float | torch.Tensor = settings.learning_rate / max(n_target, 1.0)
        if settings.preconditioning:
            posterior_var = weighted_variance(theta, log_w, floor=posterior_var / 4)
            # η_d = lr · min(4·Var_d, 1/n): the thesis's lr/n unless coordinate d's posterior is more than
            # 4× narrower than unit curvature per observation would make it; then η_d·curvature_d ≤ 4·lr,
            # inside SGHMC's stability region (η·h < 2(2 − α)) for lr ≤ 0.5.
            # With the Fisher diagonal f_d (after the warm-up), 1/n becomes 1/(n·f_d): unit curvature per
            # observation is replaced by the measured one, so weakly identified coordinates (f_d < 1) move
            # faster — up to fisher_step_growth times — while ηh stays ≈ lr.
            cap = 1.0 / max(n_target, 1.0) if fisher is None else 1.0 / (max(n_target, 1.0) * fisher)
            step_size = settings.learning_rate * torch.minimum(
                PRECONDITIONER_SLACK * posterior_var, torch.as_tensor(cap, dtype=torch.float64)
            ).to(theta.dtype)
        if settings.resample_threshold > 0 and float(ess(log_w)) < settings.resample_threshold * M:
            idx = resample(generator, log_w)
            theta, velocity = theta[idx], velocity[idx]
            anchor, anchor_grad = anchor[idx], anchor_grad[idx]
            log_w = torch.full_like(log_w, float(torch.logsumexp(log_w, 0) - math.log(M)))
            resampled = True
        for _ in range(burn_in):
            theta, velocity = sghmc_step(
                generator,
                theta,
                velocity,
                lambda t: gradient(t, lam),
                step_size=step_size,
                momentum_decay=settings.momentum_decay,
            )
        if not torch.isfinite(theta).all() or float(theta.abs().max()) > DIVERGED:
            raise NumericalError(
                "SGHMC diverged (particles at NaN/inf or beyond 1e12); lower sampler.learning_rate "
                "or standardise the data"
            )

    if use_cv:
        # Keep G_i = Σ_{y∈H} ∇ log p(y|a_i) exact as the block joins the history.
        anchor_grad = anchor_grad + history_gradient(family, anchor, x, y)
    history.append(x, y)
    new_state = state._replace(
        theta=theta,
        log_w=log_w,
        velocity=velocity,
        anchor=anchor,
        anchor_grad=anchor_grad,
        n_anchor=n_anchor,
        posterior_var=posterior_var,
        history=history,
        blocks=state.blocks + 1,
    )
    return new_state, steps, resampled, guard_tripped


def reanneal(
    generator: torch.Generator,
    state: SGAISState,
    *,
    family: Family,
    settings: SamplerSettings,
    heartbeat: Callable[[], None] | None = None,
) -> SGAISState:
    """Run SGAIS afresh from the prior over the whole history in a random order and merge it
    with the current population: the remedy for particles left in stale modes after a change point.

    After a change the posterior moves far within one block (many annealing steps) and local SGHMC
    moves rarely carry particles into modes that only the new data support (thesis §5.1.5: the
    in-order estimate then drifts below the shuffled one).  A second run over the same ``n`` rows in
    a random order sees the data as stationary and finds those modes.  Both runs are properly
    weighted samples of ``p(θ) p(y_{1:n}|θ)``; their union, each population's weights rescaled so
    that the union's mean weight is ``(Ẑ_A + Ẑ_B) / 2``, is properly weighted too (the average of
    two unbiased evidence estimates is unbiased; thesis eq. 4.6 for each), and systematic
    resampling back to ``M`` particles keeps that mean (as in :func:`reduce_particles`).  A
    population stuck in a poor mode has a much smaller ``Ẑ`` and contributes no survivors.  The
    same holds for particles that merely lag a posterior still moving after the change (the
    accumulated data's make-up keeps changing), which is why :func:`absorb_block` repeats it at
    each doubling within ``reanneal_horizon``.

    ``state`` must hold its whole history (no reservoir).  Cost: one SGAIS pass over ``n`` rows;
    :class:`SamplerSettings` ``reanneal_growth`` limits how often it runs.  The anchors are reset
    at the merged particles with exact history gradients (one more pass).

    Raises NumericalError as :func:`absorb_block` does.
    """
    history = state.history
    n = history.seen
    hx, hy = history.all_rows()
    order = torch.randperm(n, generator=generator, device=generator.device).to(hy.device)
    hx = hx[order] if hx is not None else None
    hy = hy[order]
    replay_settings = settings.model_copy(update={"reanneal_steps": None})
    fresh = init(generator, family, replay_settings)
    size = settings.block_size
    for start in range(0, n, size):
        if heartbeat is not None:
            heartbeat()
        fresh, *_ = _anneal_block(
            generator,
            fresh,
            family=family,
            settings=replay_settings,
            x=hx[start : start + size] if hx is not None else None,
            y=hy[start : start + size],
        )

    theta, velocity, log_w = merge_populations(
        generator, (state.theta, state.velocity, state.log_w), (fresh.theta, fresh.velocity, fresh.log_w)
    )
    return state._replace(
        theta=theta,
        velocity=velocity,
        log_w=log_w,
        anchor=theta.clone(),
        anchor_grad=history_gradient(family, theta, hx, hy),  # a sum over the rows: their order is moot
        n_anchor=n,
        posterior_var=weighted_variance(
            theta, log_w, floor=torch.minimum(state.posterior_var, fresh.posterior_var) / 4
        ),
        n_reanneal=n,
    )


def merge_populations(
    generator: torch.Generator,
    a: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge two weighted populations of the same target into ``M_a`` particles.

    ``a = (theta: [M_a, D], velocity: [M_a, D], log_w: [M_a])``, ``b`` likewise with ``M_b``; each
    ``log_w`` on the evidence scale (``Ẑ = mean(exp(log_w))``, thesis eq. 4.6).  Every weight of
    ``a`` is multiplied by ``(M_a + M_b) / (2 M_a)`` and every weight of ``b`` by
    ``(M_a + M_b) / (2 M_b)``, so the union's mean weight is ``(Ẑ_a + Ẑ_b) / 2``; ``M_a`` ancestors
    are then drawn systematically and every log-weight set to the log of that mean.  Returns
    ``(theta, velocity, log_w)`` of ``M_a`` particles with uniform log-weights.
    """
    (theta_a, vel_a, lw_a), (theta_b, vel_b, lw_b) = a, b
    M_a, M_b = theta_a.shape[0], theta_b.shape[0]
    log_w = torch.cat([lw_a + math.log((M_a + M_b) / (2 * M_a)), lw_b + math.log((M_a + M_b) / (2 * M_b))])
    idx = systematic_resample(generator, log_w, M_a)
    log_mean = torch.logsumexp(log_w, 0) - math.log(M_a + M_b)
    return (torch.cat([theta_a, theta_b])[idx], torch.cat([vel_a, vel_b])[idx], log_mean.expand(M_a).clone())
