"""The SGAIS kernel on a stack of models: absorb one block each (Cameron 2020, Alg. 8, §4.2).

Pure functions over stacked state (STYLE.md, BlackJAX ``smc/tempered.py`` + ``adaptive_tempered.py``):

* :func:`init` — prior draws for ``K`` models (``theta: [K, M, D]``, ``log_w = 0``).
* :func:`tempered_step` — one fixed-increment annealing step for every model of the stack:
  reweight by ``Δ_k ℓ_k``, resample the models whose ESS fell below their threshold, then
  ``burn_in`` SGHMC moves (eq. 4.14, 2.52–2.54); returns the new state and a :class:`StepInfo`.
* :func:`absorb_block` — the adaptive loop: each model anneals its block's likelihood in from
  ``λ_k = 0`` to 1 with ESS-chosen increments (eq. 4.13, 4.15, the search vectorised over models);
  models whose block is finished leave the stack (no extra moves), the others go on.

Determinism: every random draw of model ``k`` comes from ``generators[k]`` and every reduction is
row-wise, so a model's bits do not depend on which other models share its stack (tested in
``tests/workers/test_stack.py``).  Policies — the warm-up population, re-anchoring the control
variates, the Fisher step caps, change detection and re-annealing — live in :mod:`workers.engine`.

Step sizes: ``η_d = lr · min(s·Var_d, 1/(n·f_d))`` per coordinate, ``Var_d`` the weighted particle
variance, ``f_d`` the per-observation empirical Fisher information (``f_d = 1``: the thesis's
``η = lr/n``) and ``s`` the model's variance slack (1 in the warm-up, 4 after it: ``workers.stacking``).
Evidence bookkeeping (eq. 4.6): ``log Ẑ_n = logsumexp(log w) − log M``; resampling replaces every log-weight
by the log of their mean, which leaves ``Ẑ`` unchanged.

Error bars (``log_evidence_se``).  Between two resamplings (an *epoch* e) the weights start uniform and
accumulate the incremental weights, and ``Ẑ_n`` is the product of the epochs' factors
``r_e = mean_i w_{e,i}``.  Under perfect mixing (each move leaves the particles distributed as the
current target, independent of the past), the factors are independent and each ``r_e`` is an average
of ``M`` i.i.d. weights, so, by the delta method,

    Var(log Ẑ_n) ≈ Σ_e Var(w_e)/(M E[w_e]²) ≈ Σ_e M/(M − 1) · (Σ_i W_{e,i}² − 1/M) = Σ_e M/(M − 1) · (1/ESS_e − 1/M),

``W_e`` the normalised weights at the end of epoch e (just before its resampling; the open epoch uses
the current weights).  This is the variance of the lognormal limit of ``log Ẑ`` (Bérard, Del Moral &
Doucet 2014, "A lognormal central limit theorem for particle approximations of normalizing constants",
*Electron. J. Probab.* 19, no. 94) in the perfect-mixing case, ``σ²/M`` with
``σ² = Σ_p (E_{π_{p−1}}[G_p²]/E_{π_{p−1}}[G_p]² − 1)`` (``G_p`` the incremental weight of step p),
estimated from the particles with the Σ over steps of one epoch collapsed into its accumulated weight
(which also makes it valid for moves that do not mix within the epoch: the particles' paths between
resamplings are independent).  :func:`epoch_variance` is one epoch's term, ``StackState.evidence_var``
the sum of the closed ones.  Since session 20 each epoch's term is the jackknife variance of ``log r_e`` over
the particles, which agrees with the formula above to first order and, unlike it, is not biased low for
skewed weights at small ``M`` (:func:`epoch_variance`): with the moves replaced by exact draws from each
tempered target (perfect mixing; linear regression, 48 seeds, n = 2·10³ to 3·10⁴, ad hoc), the ratio of
RMS SE to the spread went from 0.76–0.94 to 0.83–0.97 (earlier measurements below used the formula above).
Measured (``bench/calibration.py``, ``bench/README.md``): RMS reported SE / std of log Ẑ over seeds 0.61–1.05
with 12 seeds and 0.77–1.13 with 36 (gmm and linear regression, n = 500 to 10⁴; the 12-seed std is itself
uncertain by ±21 %); with Bessel's factor, 0.74–0.94 with 48 seeds from n = 2,000 to 10⁵; with the jackknife,
0.79–0.96 (also unknown-noise regression). A lag-L genealogy version (each window of L
resamplings scored by the Eve-grouped estimator of Chan & Lai 2013, *Ann. Statist.* 41(6): ``Σ_k S_k² −
1/M`` with ``S_k`` the weight of the particles descending from particle k at the window's start), which
would count the correlation left between resampled duplicates by poor mixing, gave the same numbers for L
= 3, 4, 6 (n ≤ 10⁴), so the simpler estimator is kept. No particle-based estimator sees noise common to
all particles of a model (the mini-batch of a move step is shared by its M particles); a 10× larger batch
moved the gmm ratio from 0.77/0.84/0.97 to 1.17/1.23/0.80 at n = 500/2000/5000 (36 seeds), i.e. no stable
factor to model at this precision (bench/README.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from models.base import Family
from models.stack import StackedFamily
from workers.conflict import score_offsets
from workers.ess import ess, solve_increment
from workers.gradients import (
    Batch,
    HistoryEstimator,
    StepGradient,
    control_variates,
    exact_statistics,
    history_gradient,
    minibatch,
    potential_gradient,
    potential_gradient_steps,
)
from workers.history import StackBatches
from workers.resampling import Resampler
from workers.sghmc import sghmc_step, standard_normal

#: Unconstrained coordinates beyond this magnitude mean the SGHMC moves have diverged.
DIVERGED = 1e12

#: A model's ``logsumexp(log_w)`` beyond this magnitude (nats) is no estimate: float64 resolves a nat only below
#: 2^53 ≈ 9·10^15, and a block's likelihood this small means particles far outside the data's reach (a float32
#: AR(3) whose moves ran away to 5·10^11, just under :data:`DIVERGED`, reported log Ẑ = +1.4·10^41 as ``degraded``
#: before this limit: from log-weights of −3·10^20 and their jackknife variance).
LOG_WEIGHT_LIMIT = 1e15


class NumericalError(FloatingPointError):
    """NaN/inf log-weights or particles: the update is not trustworthy and was not applied."""


class StackState(NamedTuple):
    """Particles of ``K`` models with ``M`` particles each.

    theta : [K, M, D] unconstrained particles.
    log_w : [K, M] float64 log-weights (``log Ẑ_k = logsumexp(log_w_k) − log M``).
    velocity : [K, M, D] SGHMC velocities.
    anchor : [K, M, D] control-variate anchors (zeros until the first anchoring).
    anchor_grad : [K, M, D] ``Σ_{y∈H} ∇ log p(y|anchor)``.
    posterior_var : [K, D] float64 weighted particle variance at the last annealing step.
    evidence_var : [K] float64 variance of ``log Ẑ`` (nats²) of the resampling epochs closed so far
        (:func:`epoch_variance`; the open epoch's part is computed from ``log_w`` when reported).
    """

    theta: torch.Tensor
    log_w: torch.Tensor
    velocity: torch.Tensor
    anchor: torch.Tensor
    anchor_grad: torch.Tensor
    posterior_var: torch.Tensor
    evidence_var: torch.Tensor

    def select(self, idx: torch.Tensor) -> StackState:
        return StackState(*(t[idx] for t in self))

    def put(self, idx: torch.Tensor, sub: StackState, picked: StackState) -> StackState:
        """``self`` with the rows ``idx`` replaced by ``sub``'s.  ``picked``: ``self.select(idx)``, from which ``sub``
        was computed; a field that ``sub`` holds unchanged from it (the same tensor: e.g. the velocities of a step
        without SGHMC moves) keeps ``self``'s tensor, uncopied, so that :mod:`workers.stacking` sees it unchanged."""
        return StackState(
            *(t if s is p else t.index_copy(0, idx, s) for t, s, p in zip(self, sub, picked, strict=True))
        )  # fmt: skip


class KernelSettings(NamedTuple):
    """What the kernel uses of each model's ``SamplerSettings``: ``[K]`` tensors and shared flags."""

    learning_rate: torch.Tensor  # [K] float64, per observation
    momentum_decay: torch.Tensor  # [K] float64, α
    ess_target: torch.Tensor  # [K] float64, a fraction of M
    resample_threshold: torch.Tensor  # [K] float64, a fraction of M (0 = never)
    burn_in: torch.Tensor  # [K] int64, SGHMC steps per annealing step
    variance_slack: torch.Tensor  # [K] float64, η_d ≤ variance_slack · lr · Var_d (:func:`_step_sizes`)
    catch_up: torch.Tensor  # [K] int64, extra rounds of moves while the particles lag (:func:`_catch_up`; 0 = off)
    gibbs_sweeps: torch.Tensor  # [K] int64, Gibbs sweeps instead of SGHMC moves (:func:`gibbs_sweep`; 0 = off)
    max_annealing_steps: int
    move_every_step: bool  # False: a block taken in one step without resampling is not moved (see absorb_block)
    annealed_schedule: bool  # η = lr / (n_prev + λ B) rather than lr / n
    preconditioning: bool
    control_variates: bool
    resampler: Resampler

    def select(self, idx: torch.Tensor) -> KernelSettings:
        return self._replace(**{f: getattr(self, f)[idx] for f in self._fields[:8]})


class StackBlock(NamedTuple):
    """One block per model of the stack and what the kernel needs to absorb it.

    generators : each model's ``torch.Generator`` (every draw of model k comes from ``generators[k]``).
    models : positions of the models in ``batches``.
    x, y : the block's likelihood rows, ``[K, B, d] | None`` and ``[K, B, ...]`` (one ``B`` per stack).
    n_prev : [K] float64 rows absorbed before the block.
    batches : mini-batch source over the histories (None when every history is empty).
    anchored : [K] bool, the control variates are in use for model k (its anchors are set).
    fisher : [K, D] float64 per-observation Fisher diagonal of the step cap (ones = the thesis's 1/n).
    """

    generators: Sequence[torch.Generator]
    models: list[int]
    family: StackedFamily
    x: torch.Tensor | None
    y: torch.Tensor
    n_prev: torch.Tensor
    batches: StackBatches | None
    fisher: torch.Tensor
    settings: KernelSettings

    def select(self, idx: torch.Tensor) -> StackBlock:
        i = idx.tolist()
        return StackBlock(
            generators=[self.generators[k] for k in i],
            models=[self.models[k] for k in i],
            family=self.family.select(idx),
            x=self.x[idx] if self.x is not None else None,
            y=self.y[idx],
            n_prev=self.n_prev[idx],
            batches=self.batches,
            fisher=self.fisher[idx],
            settings=self.settings.select(idx),
        )


class StepInfo(NamedTuple):
    """One annealing step of the models in the stack (each ``[k]``)."""

    delta: torch.Tensor  # float64 annealing increment
    ess: torch.Tensor  # float64 ESS of the full weights after the reweighting, in particles
    resampled: torch.Tensor  # bool
    failed: torch.Tensor  # bool: NaN/inf weights or diverged particles (the model's block is void)
    behind: torch.Tensor  # bool: the particles still lagged after their extra rounds of moves (:func:`_catch_up`)


class BlockStats(NamedTuple):
    """The block's reduction of its :class:`StepInfo` rows, per model of the stack."""

    annealing_steps: list[int]
    resampled: list[bool]
    guard_tripped: list[bool]  # max_annealing_steps reached; the rest of the block was taken in one step
    error: list[str | None]  # why the model's block failed (its state must not be used), or None
    behind: list[int]  # annealing steps whose particles still lagged after their extra rounds (:func:`_catch_up`)
    # ``log p(y_b | θ_m): [K, M, B]`` at the particles before the block (the first annealing step's rows, before
    # their sum): the one-step predictive rows that :func:`workers.segmented._locate` reads
    first_rows: torch.Tensor | None = None


def init(
    generators: Sequence[torch.Generator], families: Sequence[Family], M: int, dtype: torch.dtype, device: torch.device
) -> StackState:
    """Prior draws ``θ_i ~ p(θ)``, ``log w_i = 0`` for each model (Alg. 8, lines 1–2).

    Raises NumericalError when a prior draw is not finite.
    """
    theta = prior_draws(generators, families, M, dtype, device)
    if not torch.isfinite(theta).all():
        raise NumericalError(PRIOR_NOT_FINITE)
    return from_draws(theta)


def prior_draws(
    generators: Sequence[torch.Generator], families: Sequence[Family], M: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``theta: [K, M, D]``, each model's ``M`` prior draws from its own generator (unconstrained): the models of one
    family class drawn by one :meth:`models.base.Family.sample_priors` call (the bits each draws alone)."""
    if len({type(f) for f in families}) == 1:
        return type(families[0]).sample_priors(families, generators, M, dtype, device)
    return torch.stack([f.sample_prior(g, M, dtype, device) for g, f in zip(generators, families, strict=True)])


#: The error of a model whose prior draws are not finite (:func:`init`).
PRIOR_NOT_FINITE = "prior draws are not finite; check the hyperparameters"


def from_draws(theta: torch.Tensor) -> StackState:
    """The prior populations of :func:`init` from their draws ``theta: [K, M, D]``: ``log w = 0`` (float64), zero
    velocities, anchors and anchor gradients, the draws' variances ``[K, D]`` and no closed epoch's variance."""
    zeros = torch.zeros_like(theta)
    log_w = torch.zeros(theta.shape[:2], dtype=torch.float64, device=theta.device)
    evidence_var = torch.zeros(theta.shape[0], dtype=torch.float64, device=theta.device)
    return StackState(theta, log_w, zeros, zeros.clone(), zeros.clone(), theta.to(torch.float64).var(1), evidence_var)


def epoch_variance(log_w: torch.Tensor) -> torch.Tensor:
    """Variance (nats²) of the log of one resampling epoch's evidence factor ``r = mean(exp(log_w))``: the
    jackknife (Quenouille–Tukey) over the particles.

    ``log_w: [..., M]`` the log-weights accumulated since the epoch began with uniform weights → ``[...]``
    float64, ``(M − 1)/M · Σ_i (ℓ_(i) − ℓ̄)²`` with ``ℓ_(i) = log mean_{j≠i} w_j`` the leave-one-out estimate and
    ``ℓ̄`` their mean.  To first order in the weights' spread it is the delta method's
    ``M/(M − 1) · (1/ESS − 1/M)`` (the particles' relative weight variance with Bessel's ``M − 1``, over ``M``;
    Bérard, Del Moral & Doucet 2014, module docstring "Error bars"), which is biased low for skewed weights at
    small ``M``: for ``M`` = 10 i.i.d. log-normal weights of log-variance 0.3 / 0.69 (an epoch closing at half
    its ESS) / 1.5, its mean is 0.92 / 0.81 / 0.63 of the true variance of ``log r`` and the jackknife's 1.01 /
    1.03 / 1.05 (200,000 replicates, ad hoc); the jackknife variance is biased upward for an average of i.i.d.
    terms (Efron & Stein 1981, *Ann. Statist.* 9(3)), not downward.  ``ℓ_(i)`` is formed in log space (the
    largest weight's left out by a log-sum-exp of the others), so a population whose weight sits on one
    particle gets the large variance it has, not a cancellation to ``−∞``.  Where every other particle has zero
    weight (log-weight ``−∞``) the jackknife is undefined and the delta method's value (at most 1) is returned; a NaN
    log-weight gives NaN, as before (the kernel's guards report it).
    """
    M = log_w.shape[-1]
    lw = log_w.to(torch.float64)
    top = lw.amax(-1, keepdim=True)
    w = torch.exp(lw - top)
    loo = torch.log(w.sum(-1, keepdim=True) - w)  # log Σ_{j≠i} w_j, relative to the largest: exact but for it
    arg = lw.argmax(-1, keepdim=True)
    others = torch.logsumexp(lw.scatter(-1, arg, -torch.inf), -1, keepdim=True) - top
    loo = loo.scatter(-1, arg, others)
    jack = (M - 1) / M * ((loo - loo.mean(-1, keepdim=True)) ** 2).sum(-1)
    single = torch.isinf(others[..., 0])
    if not bool(single.any()):  # one host sync instead of the delta method's six operations on every call
        return jack
    # a single particle with weight: the delta method's bounded value
    delta = (torch.exp(torch.logsumexp(2 * lw, -1) - 2 * torch.logsumexp(lw, -1)) - 1.0 / M) * (M / (M - 1))
    return torch.where(single, delta, jack)


def weighted_variance(theta: torch.Tensor, log_w: torch.Tensor, *, floor: torch.Tensor) -> torch.Tensor:
    """Per-coordinate variance of ``theta: [K, M, D]`` under normalised ``exp(log_w)``, ``[K, D]`` float64,
    bounded below by ``floor: [K, D]`` (a population collapsed by resampling keeps a usable step size)."""
    W = torch.softmax(log_w, -1)[..., None]
    t = theta.to(torch.float64)
    mean = (W * t).sum(1, keepdim=True)
    return torch.maximum((W * (t - mean) ** 2).sum(1), floor)


def absorb_block(block: StackBlock, state: StackState) -> tuple[StackState, BlockStats]:
    """Alg. 8, lines 4–15, for every model of the stack: the λ loop around :func:`tempered_step`.

    Each pass takes the models still annealing (``active``): their block log-likelihood at the particles, each
    model's increment ``Δ`` by its conditional-ESS target (:func:`increment`), one tempered step; a model leaves
    the loop at ``λ = 1`` or when its step failed (its ``error`` says why)."""
    K, M = state.log_w.shape
    tally = _Tally.zeros(K, state.log_w.device)
    errors: list[str | None] = [None] * K
    active = torch.arange(K, device=state.log_w.device)
    first_rows: torch.Tensor | None = None
    while active.numel():
        full = active.numel() == K  # the whole stack: its own tensors, no selections (the bits are the same)
        sub_block, sub = (block, state) if full else (block.select(active), state.select(active))
        picked = sub
        rows = sub_block.family.log_likelihood(sub.theta, sub_block.x, sub_block.y)
        first_rows = rows if first_rows is None else first_rows
        ll = rows.sum(-1).to(torch.float64)
        # NaN or +inf for some particle (both fail `< inf`), or no finite value (all -inf)
        bad = ~((ll < math.inf).all(-1) & (ll > -math.inf).any(-1))
        if _mark(errors, active, bad, f"log-likelihood is NaN or infinite for some of the {M} particles"):
            if bool(bad.all()):
                break
            ll = torch.where(bad[:, None], 0.0, ll)  # failed rows take a harmless dummy
        lam, steps = (tally.lam, tally.steps) if full else (tally.lam[active], tally.steps[active])
        delta, lam_new, trip = increment(sub_block, sub.log_w, ll, lam, steps)
        # a block taken whole in its first step needs moves only if it resampled (resample-move)
        still = (steps == 0) & (lam_new >= 1.0) & (not block.settings.move_every_step)
        sub, info = tempered_step(sub_block, sub, delta=delta, lam=lam_new, log_lik=ll, still=still)
        state = sub if full else state.put(active, sub, picked)
        tally.record(None if full else active, lam_new, trip, info)
        _mark(errors, active, info.failed & ~bad, STEP_FAILED)
        active = active[(lam_new < 1.0) & ~info.failed & ~bad]
    return state, tally.stats(errors, first_rows)


#: The error of a model whose annealing step failed (:func:`tempered_step`'s ``failed``).
STEP_FAILED = (
    "log-weights became NaN or all -inf or beyond 1e15 nats, SGHMC diverged (particles at NaN/inf or beyond 1e12), or "
    "an exact draw was not finite"
)


def _mark(errors: list[str | None], active: torch.Tensor, which: torch.Tensor, reason: str) -> bool:
    """Set ``errors[k] = reason`` for the active models ``active[which]``; whether there was any."""
    if not bool(which.any()):
        return False
    for k in active[which].tolist():
        errors[k] = reason
    return True


def increment(
    block: StackBlock, log_w: torch.Tensor, log_lik: torch.Tensor, lam: torch.Tensor, steps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The next annealing increment of each model: ``(Δ, λ + Δ, tripped)``, all ``[K]``.

    ``Δ`` keeps the conditional ESS at ``ess_target · M`` (thesis eq. 4.15; :func:`workers.ess.solve_increment`),
    takes the rest of the block when ``λ + Δ`` reaches 1 (within 1e-12), and the rest in one increment at the
    ``max_annealing_steps``-th step (``tripped``: the guard that flags the model).  ``log_w: [K, M]`` float64,
    ``log_lik: [K, M]`` the block's log-likelihood (nats), ``lam: [K]`` float64, ``steps: [K]`` steps taken.

    Raises NumericalError when the search meets non-finite numbers."""
    remaining = 1.0 - lam
    try:
        delta = solve_increment(log_w, log_lik, target=block.settings.ess_target * log_w.shape[1], remaining=remaining)
    except FloatingPointError as err:
        raise NumericalError(str(err)) from err
    trip = (steps + 1 >= block.settings.max_annealing_steps) & (delta < remaining)
    delta = torch.where(trip | (lam + delta >= 1.0 - 1e-12), remaining, delta)
    return delta, torch.where(delta == remaining, 1.0, lam + delta), trip


class _Tally:
    """Per-model ``[K]`` running values of :func:`absorb_block`'s λ loop: ``λ``, steps taken, whether the model
    resampled and tripped the step guard, and its steps whose particles lagged (:func:`_catch_up`); a failure is in
    the loop's ``errors``."""

    def __init__(self, *tensors: torch.Tensor):
        self.lam, self.steps, self.resampled, self.tripped, self.behind = tensors

    @classmethod
    def zeros(cls, K: int, device: torch.device) -> _Tally:
        lam = torch.zeros(K, dtype=torch.float64, device=device)
        steps, behind = (torch.zeros(K, dtype=torch.long, device=device) for _ in range(2))
        resampled, tripped = (torch.zeros(K, dtype=torch.bool, device=device) for _ in range(2))
        return cls(lam, steps, resampled, tripped, behind)

    def record(self, active: torch.Tensor | None, lam: torch.Tensor, trip: torch.Tensor, info: StepInfo) -> None:
        """One annealing step of the models ``active`` (None: the whole stack, updated without indexing)."""
        if active is None:
            self.lam, self.steps = lam, self.steps + 1
            self.resampled, self.behind = self.resampled | info.resampled, self.behind + info.behind
            self.tripped = self.tripped | trip
            return
        self.lam[active], self.steps[active] = lam, self.steps[active] + 1
        self.resampled[active] |= info.resampled
        self.behind[active] += info.behind
        self.tripped[active] |= trip

    def stats(self, errors: list[str | None], first_rows: torch.Tensor | None) -> BlockStats:
        tallies = (self.steps, self.resampled, self.tripped, self.behind)
        steps, resampled, tripped, behind = (t.tolist() for t in tallies)
        return BlockStats(steps, resampled, tripped, errors, behind, first_rows)


def tempered_step(
    block: StackBlock,
    state: StackState,
    *,
    delta: torch.Tensor,
    lam: torch.Tensor,
    log_lik: torch.Tensor,
    still: torch.Tensor | None = None,
) -> tuple[StackState, StepInfo]:
    """One annealing step at fixed increments ``delta: [K]`` to temperatures ``lam: [K]``.

    ``log w += Δ ℓ`` with ``log_lik: [K, M]`` the block's log-likelihood per particle; models whose
    ESS falls below ``resample_threshold · M`` are resampled (their log-weights set to the log of
    the mean weight); then every model makes its ``burn_in`` SGHMC moves on the potential at ``λ``,
    except the models with ``still: [K]`` bool set that did not resample: their particles stay where
    they are and the weights alone carry the step (valid for any weights: the moves only restore
    diversity, the importance weights keep the estimate unbiased; resample-move, Gilks & Berzuini 2001,
    and Chopin 2002's IBIS, which moves only when the ESS falls).
    """
    s, M = block.settings, state.log_w.shape[1]
    log_w = state.log_w + torch.nan_to_num(delta[:, None] * log_lik, neginf=-math.inf)
    total = torch.logsumexp(log_w, -1)
    failed = torch.isnan(log_w).any(-1) | ~torch.isfinite(total) | (total.abs() > LOG_WEIGHT_LIMIT)
    # a stack whose every model moves by exact draws (or stays put) needs no SGHMC step sizes: their cap's variance
    # alone is carried (its floor, and the step sizes once the warm-up ends), the eigenvalues of issue 10's factor are
    # not formed (10% of a lone one-component gmm's engine time in its warm-up: py-spy, bench/README.md, session 36)
    drawn = block.family.exact_draws and bool((s.gibbs_sweeps > 0).all())
    if drawn:
        posterior_var = (
            weighted_variance(state.theta, log_w, floor=state.posterior_var / 4)
            if s.preconditioning
            else state.posterior_var
        )
        step_size, correlated = torch.zeros((), dtype=state.theta.dtype, device=state.theta.device), None
    else:
        posterior_var, step_size, correlated = _step_sizes(block, state.theta, log_w, state.posterior_var, lam)
    ess_now = ess(log_w)
    resample = (s.resample_threshold > 0) & (ess_now < s.resample_threshold * M) & ~failed
    theta, velocity, anchor, anchor_grad = state.theta, state.velocity, state.anchor, state.anchor_grad
    evidence_var = state.evidence_var
    if resample.any():
        rows = resample.nonzero()[:, 0]
        idx = s.resampler([block.generators[k] for k in rows.tolist()], log_w[rows], M)  # [r, M]
        take = idx[..., None].expand(-1, -1, theta.shape[-1])
        theta, velocity, anchor, anchor_grad = (
            t.index_copy(0, rows, t[rows].gather(1, take)) for t in (theta, velocity, anchor, anchor_grad)
        )
        evidence_var = evidence_var.index_add(0, rows, epoch_variance(log_w[rows]))  # the epoch closes
        mean = (torch.logsumexp(log_w[rows], -1) - math.log(M))[:, None].expand(-1, M)
        log_w = log_w.index_copy(0, rows, mean.contiguous())
    burn = s.burn_in if still is None else torch.where(still & ~resample, 0, s.burn_in)
    if block.family.exact_draws:
        theta, log_w, evidence_var, burn, failed = _exact_moves(block, theta, log_w, evidence_var, lam, burn, failed)
        if drawn:  # a model whose weights or draw failed is void: no SGHMC moves (it has no step sizes)
            burn = torch.where(failed, 0, burn)
    moves = sorted(set(burn.tolist()) - {0})  # the burn-ins of the models that move
    if len(moves) == 1 and bool((burn == moves[0]).all()):  # every model, the same number of steps
        theta, velocity = _move(
            block, theta, velocity, anchor, anchor_grad, lam=lam, step_size=step_size, burn=burn, log_w=log_w,
            variance=posterior_var, correlated=correlated,
        )  # fmt: skip
        moves = []

    def move(rows: torch.Tensor, theta: torch.Tensor, velocity: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's moves for the models at ``rows`` alone; the others keep their particles and velocities."""
        th, v = _move(
            block.select(rows), theta[rows], velocity[rows], anchor[rows], anchor_grad[rows], lam=lam[rows],
            step_size=step_size[rows], burn=burn[rows], log_w=log_w[rows], variance=posterior_var[rows],
            correlated=None if correlated is None else correlated[rows],
        )  # fmt: skip
        return theta.index_copy(0, rows, th), velocity.index_copy(0, rows, v)

    # the models that stay put do no arithmetic, and the others move in sub-stacks of one burn-in each: in one stack a
    # challenger's 10 moves would ride along, masked, for the main populations' 20 (workers.segmented)
    for c in moves:
        theta, velocity = move((burn == c).nonzero()[:, 0], theta, velocity)
    catch_up = torch.where((burn > 0) & ~failed, s.catch_up, 0)
    if bool((catch_up > 0).any()):
        theta, velocity, behind = _catch_up(block, theta, velocity, lam=lam, log_w=log_w, rounds=catch_up, move=move)
    else:
        behind = torch.zeros_like(failed)
    failed |= ~torch.isfinite(theta).all(-1).all(-1) | (theta.abs().amax((1, 2)) > DIVERGED)
    new = StackState(theta, log_w, velocity, anchor, anchor_grad, posterior_var, evidence_var)
    return new, StepInfo(delta, ess_now, resample, failed, behind)


def _step_sizes(
    block: StackBlock, theta: torch.Tensor, log_w: torch.Tensor, posterior_var: torch.Tensor, lam: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(posterior_var: [K, D], η: [K, 1, D] or [K, 1, 1], correlated: [K] bool or None)`` at ``lam: [K]``;
    ``correlated``: where issue 10's factor slows the diagonal (``λ_min(R) < 1/2``), for :func:`_move`'s full
    preconditioner (None where the stack is not :func:`_full_eligible`).

    ``η_d = lr · min(s_k·Var_d, 1/(n·f_d))`` (``s_k`` the model's ``variance_slack``): the thesis's lr/n
    unless coordinate d's posterior is more than ``s_k`` times narrower than unit curvature per observation
    would make it; then η_d·curvature_d ≤ s_k·lr, inside SGHMC's stability region (η·h < 2(2 − α)) for
    s_k·lr ≤ 2.  The Fisher diagonal f_d replaces unit curvature by the measured one after the warm-up.
    """
    s = block.settings
    B = block.y.shape[1]
    n_target = block.n_prev + lam * B if s.annealed_schedule else block.n_prev + B
    n_target = torch.clamp_min(n_target, 1.0)
    if not s.preconditioning:
        return posterior_var, (s.learning_rate / n_target)[:, None, None].to(theta.dtype), None
    posterior_var = weighted_variance(theta, log_w, floor=posterior_var / 4)
    cap = 1.0 / (n_target[:, None] * block.fisher)
    eta = s.learning_rate[:, None] * torch.minimum(s.variance_slack[:, None] * posterior_var, cap)
    correlated = None
    if _full_eligible(block, theta):  # the diagonal, and where the factor slows it, _move's full preconditioner
        factor = _correlation_factor(theta, log_w)
        eta, correlated = eta * factor[:, None], factor < 1.0
    return posterior_var, eta[:, None, :].to(theta.dtype), correlated


def _full_eligible(block: StackBlock, theta: torch.Tensor) -> bool:
    """Whether the stack's moves use a full preconditioner (:func:`_full_preconditioner`): preconditioning on,
    ``1 < D`` and ``4·D ≤ M`` (the particles estimate a D × D covariance), and no exchangeable components (a
    mixture's particles spread over its ``C!`` label modes: their covariance is the modes' separation, not the
    posterior's shape; bench/reference.py's 5-component gmm stopped moving under issue 10's factor).  The
    stack key fixes all of them, so a model takes the same path alone or in any stack."""
    D, M = theta.shape[-1], theta.shape[1]
    return block.settings.preconditioning and 1 < D and 4 * D <= M and not block.family.family.exchangeable_parameters()


def _weighted_covariance(theta: torch.Tensor, log_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(W: [K, M, 1], θ − θ̄: [K, M, D], Σ̂: [K, D, D])``: the normalised weights, the centred particles and
    their weighted covariance, float64."""
    W = torch.softmax(log_w.to(torch.float64), -1)[..., None]
    t = theta.to(torch.float64)
    c = t - (W * t).sum(1, keepdim=True)
    return W, c, (W * c).transpose(1, 2) @ c


def _correlation_factor(theta: torch.Tensor, log_w: torch.Tensor) -> torch.Tensor:
    """``min(1, 2·λ_min(R)) : [K]`` with ``R`` the weighted particle correlation matrix of ``theta: [K, M, D]``.

    The variance cap treats coordinates as uncorrelated: for a Gaussian target with correlation ``R``
    the diagonally preconditioned curvature ``η_d·H`` has eigenvalues up to ``lr / λ_min(R)`` (the
    largest eigenvalue of ``R⁻¹``; with the variance slack ``s``: ``s·lr / λ_min(R)``), outside
    SGHMC's stability region ``η·h < 2(2 − α)`` for strongly correlated coordinates (a slope and an intercept
    with covariates far from 0: ρ = −0.87 for x ~ U(0, 20) gives 4·lr·7.7; issue 10).  This factor bounds it
    by ``2·s·lr`` and is 1 (the diagonal's step unchanged) whenever ``λ_min(R) ≥ 1/2``.  Formed only when the
    covariance is well estimated (``M ≥ 4D``), and not for a family with exchangeable components (a mixture):
    its particles spread over the ``C!`` label modes, so their correlation measures how far apart the modes
    lie, not the curvature of any one of them (bench/reference.py's 5-component gmm, ``D = 24``, with 100
    particles: ``λ_min → 0`` stopped the moves and the first block's log Z came out 20–140 nats low).
    """
    _, _, cov = _weighted_covariance(theta, log_w)
    sd = torch.sqrt(torch.diagonal(cov, dim1=1, dim2=2).clamp_min(1e-300))
    R = cov / (sd[:, :, None] * sd[:, None, :])
    lam_min = torch.linalg.eigvalsh(R)[:, 0]
    return torch.nan_to_num(2.0 * lam_min, nan=1.0).clamp(0.0, 1.0)


def _eigenvalues(A: torch.Tensor) -> torch.Tensor:
    """Ascending eigenvalues of the symmetric ``A: [K, D, D]``, NaN for a model whose matrix is not finite or whose
    decomposition fails (each model on its own then: a failure never depends on the rest of the stack)."""
    finite = torch.isfinite(A).all(-1).all(-1)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    try:
        vals = torch.linalg.eigvalsh(torch.where(finite[:, None, None], A, eye))
    except RuntimeError:  # torch.linalg.LinAlgError
        rows = []
        for a in A:
            try:
                rows.append(torch.linalg.eigvalsh(a if bool(torch.isfinite(a).all()) else eye))
            except RuntimeError:
                rows.append(torch.full((A.shape[-1],), math.nan, dtype=A.dtype, device=A.device))
        vals = torch.stack(rows)
    return torch.where(finite[:, None], vals, math.nan)


def _full_preconditioner(
    theta: torch.Tensor, log_w: torch.Tensor, grad_u: torch.Tensor, variance: torch.Tensor, learning_rate: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(P, L): [K, D, D]`` with ``P = L Lᵀ = κ·Σ_γ``, and ``ok: [K]`` (False where it could not be formed):
    the SGHMC preconditioner of a stack whose particles ``theta: [K, M, D]`` (weights ``log_w: [K, M]``,
    potential gradients ``grad_u: [K, M, D]`` at the step's temperature, per-coordinate variances
    ``variance: [K, D]`` with their floor) estimate a covariance.

    ``Σ_γ = diag(sd)·R_γ·diag(sd)``, with ``R_γ = (1 − γ)·R̂ + γ·I`` the weighted particle correlation shrunk
    towards the identity with Ledoit & Wolf's intensity (2004, "A well-conditioned estimator for
    large-dimensional covariance matrices", J. Multivariate Anal. 88) for the standardised particles ``u_m``,
    ``Σ w_m²`` in place of ``1/M``: ``γ = min(b̄², d²)/d²``, ``d² = ‖R̂ − I‖²_F``, ``b̄² = Σ_m w_m² ‖u_m u_mᵀ − R̂‖²_F``
    (near 1 when the particles cannot tell their correlation from sampling noise).  SGHMC with
    ``v ← (1 − α)v − P∇U + N(0, 2αP)`` is SGHMC in the coordinates ``L⁻¹θ`` (Chen et al. 2014, §3.2), where a
    correlated posterior is round: the moves go along a ridge as fast as across it.  The diagonal preconditioner
    with issue 10's factor ``min(1, 2·λ_min(R̂))`` stopped them there: AR(1) with an intercept on a persistent
    series has ``ρ(a, c) ≈ 0.995``, so its steps were × 0.01, the particles lagged the contracting posterior
    (noise variance a posterior sd too high) and the running log-evidence lost 0.3–0.6 nats per 5-observation
    block with status ``ok`` (``python bench/ar_real_data.py --seeds 4``: Apple's price −17.6 ± 13.2 nats,
    Brent −12.8 ± 5.0; with this preconditioner −1.6 ± 0.6 and −1.4 ± 1.0).

    :func:`_move` uses it only where ``λ_min(R̂) < 1/2``, where issue 10's factor would slow the diagonal;
    elsewhere the diagonal keeps its bits.  Everywhere, it did worse: in a first block annealed from the prior the
    measured curvature is dominated by particles in a prior's stiff tail (``log σ²`` under an inverse-gamma) and
    ``κ`` fell to 1% of ``lr``; a one-component gmm's log Ẑ over 20 observations then spread 1.47 nats over 128
    seeds against 0.21 with the diagonal (``tests/workers/test_error_bars.py``).

    ``κ = lr·min(1, 2/λ)``, ``λ`` the largest eigenvalue of ``Σ_γ·H`` with the curvature ``H`` measured from
    the gradients, ``H = sym(Cov_w(∇U, θ)·Σ̂⁻¹)`` (``Σ̂`` the unshrunk weighted covariance): for a quadratic
    potential ``∇U = H(θ − μ)``, so this is exact whatever the particles.  Particles matching the tempered target
    give ``λ ≈ 1`` and ``P ≈ lr·H⁻¹``, the thesis's step ``lr/n`` for unit curvature per observation; particles
    wider than the target in some direction shrink ``κ`` so that ``κ·λ ≤ 2·lr``, inside SGHMC's stability
    region ``η·h < 2(2 − α)``.  This replaces the diagonal's per-coordinate caps ``1/(n·f_d)`` and ``s·Var_d``,
    which a ridge breaks (its marginal variances are ``1/(1 − ρ²)`` times the conditional ones).  ``4·lr`` in
    place of ``lr`` was tried (without the gates above): linear regression d = 5 at n = 10⁴ then ended
    −1.83 ± 0.78 nats (16 seeds) against −1.01 with the diagonal and −1.05 ± 0.95 with ``lr`` and the gates
    (``python bench/accuracy.py --n 10000 --seeds 16``).
    """
    W, tc, sigma = _weighted_covariance(theta, log_w)
    g = grad_u.to(torch.float64)
    gc = g - (W * g).sum(1, keepdim=True)
    own = (W * tc * tc).sum(1)  # [K, D]
    u = tc / torch.sqrt(own.clamp_min(1e-300))[:, None, :]
    R = (W * u).transpose(1, 2) @ u  # the particles' own correlation: [K, D, D]
    sd = torch.sqrt(torch.maximum(own, variance))  # with the step sizes' floor (a population collapsed by resampling)
    eye = torch.eye(R.shape[-1], dtype=R.dtype, device=R.device)
    d2 = ((R - eye) ** 2).sum((1, 2))
    # ‖u uᵀ − R‖²_F = ‖u‖⁴ − 2·uᵀRu + ‖R‖²_F, without the [K, M, D, D] outer products
    per = (u * u).sum(-1) ** 2 - 2.0 * ((u @ R) * u).sum(-1) + (R * R).sum((1, 2))[:, None]
    b2 = torch.minimum((W[..., 0] ** 2 * per).sum(-1), d2)
    gamma = torch.where(d2 > 0, b2 / d2.clamp_min(1e-300), 1.0).clamp(1e-6, 1.0)
    cov = sd[:, :, None] * ((1.0 - gamma)[:, None, None] * R + gamma[:, None, None] * eye) * sd[:, None, :]
    chol, info = torch.linalg.cholesky_ex(cov)
    ok = (info == 0) & torch.isfinite(chol).all(-1).all(-1)
    chol = torch.where(ok[:, None, None], chol, eye)  # a model that fails keeps the caller's diagonal
    # the curvature H = Cov_w(∇U, θ)·Σ̂⁻¹ (exact for a quadratic potential, whatever the particles), then the
    # largest eigenvalue of Lᵀ H L = that of Σ_γ·H
    sigma = sigma + 1e-12 * torch.diag_embed(torch.diagonal(sigma, 0, 1, 2).clamp_min(1e-300))
    cross = (W * gc).transpose(1, 2) @ tc  # Cov_w(∇U, θ): [K, D, D]
    hess = torch.linalg.solve(sigma, cross.transpose(1, 2)).transpose(1, 2)
    hess = 0.5 * (hess + hess.transpose(1, 2))
    lam = _eigenvalues(chol.transpose(1, 2) @ hess @ chol)[:, -1]
    shrink = torch.where(lam > 2.0, 2.0 / lam, 1.0)
    kappa = learning_rate.to(torch.float64) * shrink
    ok &= torch.isfinite(lam) & torch.isfinite(kappa)
    kappa = torch.where(ok, kappa, 0.0)
    P, L = kappa[:, None, None] * cov, torch.sqrt(kappa)[:, None, None] * chol
    return P.to(theta.dtype), L.to(theta.dtype), ok


def _exact_moves(
    block: StackBlock,
    theta: torch.Tensor,
    log_w: torch.Tensor,
    evidence_var: torch.Tensor,
    lam: torch.Tensor,
    burn: torch.Tensor,
    failed: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The moves of the models of an ``exact_draws`` family with ``settings.gibbs_sweeps`` set that would make SGHMC
    moves (``burn: [K]`` positive, ``failed: [K]`` false; :mod:`workers.stacking` sets the sweeps in the warm-up only):
    every particle drawn exactly from ``π_λ`` (:func:`exact_draw`) -> ``(theta, log_w, evidence_var, burn, failed)``
    with those models' burn-ins 0, and ``failed`` set for a model whose draw was not finite (numerical trouble,
    reported as the block's NumericalError).

    Each such model's weighting epoch closes as a resampling would close it (its ``log_w`` set to the log of its mean
    weight, the epoch's variance added to ``evidence_var``): resampling then moving by ``K(θ, ·) = π_λ``, a kernel that
    forgets where it starts, is this draw whatever ancestors the resampling picked, so the estimate is that of an SMC
    sampler resampling at each moved step, unbiased (Del Moral, Doucet & Jasra 2006, *JRSS B* 68(3)).  Keeping
    the old weights instead would attach them to particles that no longer carry them: valid (AIS, Neal 2001), but with
    the ESS of the old weights for iid draws (measured: 150 seeds of ``bench/many_models.py``'s gmm on 100 values,
    error sd 0.276 nats and mean +0.06 against 0.244 and +0.01 for SGHMC; bench/README.md, session 35).
    Why instead of the SGHMC steps: steps of ``lr/n`` lag a posterior that contracts block after block in the warm-up
    or whose variance jumps; a draw never lags, at the cost of two random draws per model instead of ``burn_in``
    gradient steps (``tests/workers/test_exact_draws.py``)."""
    draw = (burn > 0) & (block.settings.gibbs_sweeps > 0) & ~failed
    drawing = int(draw.sum())
    if not drawing:
        return theta, log_w, evidence_var, burn, failed
    M = log_w.shape[1]
    if drawing == len(draw):  # every model (the warm-up's usual case): the stack itself, no selections (same bits)
        theta, ok = exact_draw(block, theta, _tempered_statistics(block, lam))
        evidence_var = torch.where(ok, evidence_var + epoch_variance(log_w), evidence_var)
        mean = (torch.logsumexp(log_w, -1) - math.log(M))[:, None].expand(-1, M)
        return theta, torch.where(ok[:, None], mean, log_w), evidence_var, torch.where(ok, 0, burn), failed | ~ok
    rows = draw.nonzero()[:, 0]
    sub = block.select(rows)
    drawn, ok = exact_draw(sub, theta[rows], _tempered_statistics(sub, lam[rows]))
    theta = theta.index_copy(0, rows, drawn)
    failed = failed.index_fill(0, rows[~ok], True)
    rows = rows[ok]
    evidence_var = evidence_var.index_add(0, rows, epoch_variance(log_w[rows]))
    mean = (torch.logsumexp(log_w[rows], -1) - math.log(M))[:, None].expand(-1, M)
    log_w = log_w.index_copy(0, rows, mean.contiguous())
    return theta, log_w, evidence_var, burn.index_fill(0, rows, 0), failed


def _move(
    block: StackBlock,
    theta: torch.Tensor,
    velocity: torch.Tensor,
    anchor: torch.Tensor,
    anchor_grad: torch.Tensor,
    *,
    lam: torch.Tensor,
    step_size: torch.Tensor,
    burn: torch.Tensor,
    log_w: torch.Tensor,
    variance: torch.Tensor,
    correlated: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """An annealing step's moves at ``lam``: ``burn: [K]`` SGHMC steps per model (:func:`_sghmc_moves`), or, for the
    models of a ``gibbs_conditionals`` family with ``settings.gibbs_sweeps`` set (and ``burn`` positive), that many
    Gibbs sweeps on the exact conditionals (:func:`gibbs_sweep`) instead."""
    # the other families have no sweeps (workers.stacking sets them for gibbs_conditionals families only): no host
    # synchronisation added to their moves
    sweeps = torch.where(burn > 0, block.settings.gibbs_sweeps, 0) if block.family.gibbs_conditionals else None
    theta, velocity = _sghmc_moves(
        block, theta, velocity, anchor, anchor_grad, lam=lam, step_size=step_size,
        burn=burn if sweeps is None else torch.where(sweeps > 0, 0, burn), log_w=log_w, variance=variance,
        correlated=correlated,
    )  # fmt: skip
    if sweeps is None or not bool((sweeps > 0).any()):
        return theta, velocity
    rows = (sweeps > 0).nonzero()[:, 0]
    sub, counts = block.select(rows), sweeps[rows].tolist()
    T, moved = _tempered_statistics(sub, lam[rows]), theta[rows]
    for r in range(max(counts)):
        now = [k for k, c in enumerate(counts) if c > r]
        if len(now) == len(counts):
            moved = gibbs_sweep(sub, moved, T)
        else:
            idx = torch.tensor(now, device=theta.device)
            moved = moved.index_copy(0, idx, gibbs_sweep(sub.select(idx), moved[idx], T[idx]))
    return theta.index_copy(0, rows, moved), velocity


def gibbs_sweep(block: StackBlock, theta: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """One Gibbs sweep on the tempered target ``π_λ`` whose statistics are ``T: [K, P]`` (:func:`_tempered_statistics`:
    the prior, every held history row and the block at ``λ``) of a
    ``gibbs_conditionals`` family (an unknown-noise AR(p) or linear regression), ``theta: [K, M, D]`` with its last
    coordinate ``u = log σ²``: the coefficients drawn from their Gaussian conditional given ``σ²``
    (:meth:`models.base.Family.stacked_coefficient_conditional`), then ``σ²`` from ``InvGamma(shape, scale(θ))``
    given the new coefficients (:meth:`~models.base.Family.stacked_noise_conditional`).  Each step leaves ``π_λ``
    invariant, so the annealed importance weights stay valid (Neal 2001, *Stat. Comput.* 11: AIS takes any transition
    that leaves the intermediate distribution invariant).  Each model draws ``M·(D−1)`` normals, then ``M`` gammas,
    from its own generator.  A particle whose draw is not finite (a precision that is not positive definite, a
    ``scale`` not positive) keeps that block of coordinates.

    Why (:func:`_move` takes ``gibbs_sweeps`` of these instead of the SGHMC steps): SGHMC moves by steps of
    ``η = lr/n``; where the posterior contracts or the noise variance moves by orders of magnitude within a few blocks
    (a stream's first values; Bitcoin's 2017 bubble under AR(1)) its particles lag, and the next increments are
    weighted where the target no longer is; the sweeps draw from the target's own conditionals whatever it did, at
    less cost than 20 SGHMC steps (bench/README.md, session 34: ``python bench/demo_exact.py``,
    ``python bench/gibbs_sweeps.py``, ``tests/workers/test_gibbs_sweeps.py``)."""
    fam = block.family
    th = theta.to(T.dtype)
    _, M, D = th.shape
    normals = torch.stack(
        [torch.randn(M, D - 1, generator=g, dtype=T.dtype, device=T.device) for g in block.generators]
    )
    mean, L, ok = fam.coefficient_conditional_of(th, T)
    coef = mean + torch.linalg.solve_triangular(L.transpose(-1, -2), normals[..., None], upper=True)[..., 0]
    keep = ~(ok[..., None] & torch.isfinite(coef))
    th = torch.cat([torch.where(keep, th[..., :-1], coef), th[..., -1:]], -1)
    shape, scale = fam.noise_conditional_of(th, T)  # [K, 1], [K, M]
    gammas = torch.stack(
        [torch._standard_gamma(shape[k].expand(M), generator=g) for k, g in enumerate(block.generators)]
    )
    u = torch.log(scale) - torch.log(gammas)
    u = torch.where((scale > 0) & torch.isfinite(u), u, th[..., -1])
    return torch.cat([th[..., :-1], u[..., None]], -1).to(theta.dtype)


def exact_draw(block: StackBlock, theta: torch.Tensor, T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact draws from the tempered target ``π_λ`` whose statistics are ``T: [K, P]`` (:func:`_tempered_statistics`)
    of an ``exact_draws`` family (a one-component gmm: normal–inverse-gamma,
    :meth:`models.gmm.GaussianMixture.stacked_exact_draw`) in place of the particles ``theta: [K, M, D]`` ->
    ``(theta, ok: [K] bool)``.  Each model draws ``M·G`` standard Gamma variates, then ``M·(N + G)`` normals, from its
    own generator (the same bits alone and in any stack).  The Gamma variates of shape ``α`` are formed in log space
    as ``log γ' + log Φ(z)/α`` with ``γ' ~ Gamma(α + 1)`` and ``z`` one of the normals (``γ'·U^{1/α} ~ Gamma(α)`` for
    ``U`` uniform: Marsaglia & Tsang 2000, *ACM TOMS* 26(3), §6): drawn directly, a variate of shape 0.01 (a vague
    InvGamma prior early in a first block's annealing) falls below float64's smallest normal number once in about
    1,200 draws (``tests/workers/test_exact_draws.py``).  ``ok`` is false for a model with a draw that is not finite
    (a scale not positive through cancellation, a shape so small that ``σ²`` is beyond float64's range): its
    particles are kept."""
    fam = block.family
    M = theta.shape[1]
    shapes = fam.exact_draw_shapes(T)  # [K, G]
    G, N = shapes.shape[1], fam.exact_draw_normals
    # one call per model and generator (the draws cannot be batched across generators): nothing else in the loops
    alphas = (shapes + 1.0)[:, None, :].expand(-1, M, -1).unbind(0)
    boosted = torch.stack(
        [torch._standard_gamma(a, generator=g) for a, g in zip(alphas, block.generators, strict=True)]
    )
    normals = torch.empty(len(block.generators), M, N + G, dtype=T.dtype, device=T.device)
    for out, g in zip(normals.unbind(0), block.generators, strict=True):
        out.normal_(generator=g)  # torch.randn's draws (randn is empty().normal_()), without its argument parsing
    log_gammas = torch.log(boosted) + torch.special.log_ndtr(normals[..., N:]) / shapes[:, None]
    drawn = fam.exact_draw(T, log_gammas, normals[..., :N])
    ok = torch.isfinite(drawn).all(-1).all(-1)
    return torch.where(ok[:, None, None], drawn.to(theta.dtype), theta), ok


def _sghmc_moves(
    block: StackBlock,
    theta: torch.Tensor,
    velocity: torch.Tensor,
    anchor: torch.Tensor,
    anchor_grad: torch.Tensor,
    *,
    lam: torch.Tensor,
    step_size: torch.Tensor,
    burn: torch.Tensor,
    log_w: torch.Tensor,
    variance: torch.Tensor,
    correlated: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``burn: [K]`` SGHMC steps per model on ``Û`` at ``lam`` (eq. 4.14; 2.52–2.54).

    Each model draws its step's randomness up front from its own generator: the mini-batch indices
    of all its steps (one call), then their noise (one call).  Quadratic and ``sufficient_statistics`` families turn
    the batches into their statistics in one batched call when they fit in :data:`BULK_ELEMENTS`.
    """
    s, fam, K = block.settings, block.family, theta.shape[0]
    counts: list[int] = burn.tolist()
    S = max(counts, default=0)
    if S == 0:
        return theta, velocity
    gens = block.generators
    B = block.batches.batch_size if block.batches is not None else 0
    bulk = K * S * B * theta.shape[-1] <= BULK_ELEMENTS
    whole = _whole_history(block) if fam.sufficient_statistics or fam.weighted_gradients else [False] * K
    draws = [0 if w else c for w, c in zip(whole, counts, strict=True)]
    plan = block.batches.plan(list(gens), block.models, draws) if block.batches is not None and any(draws) else None
    noise = _noise(gens, counts, tuple(theta.shape[1:]), theta)  # [K, S, M, D]
    grad_at = _step_gradient(block, theta, anchor, anchor_grad, lam=lam, plan=plan, whole=whole, S=S, bulk=bulk)
    alpha = s.momentum_decay[:, None, None].to(theta.dtype)
    keep_v = 1.0 - alpha
    first = grad_at(theta, 0)
    if first.dtype != theta.dtype:  # float32 particles, a gradient formed in float64 (a mixture's exact history one)
        first, grad_at = first.to(theta.dtype), _in_dtype(grad_at, theta.dtype)

    def run(step_size: torch.Tensor, xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _sghmc_steps(theta, velocity, first, grad_at, xi, step_size, keep_v, counts)

    # not on a prior population: D observations identify D parameters
    gate = None if correlated is None else correlated & (block.n_prev >= theta.shape[-1])
    if gate is None or not bool(gate.any()):
        return run(step_size, _diagonal_xi(noise, alpha, step_size))
    # P = L Lᵀ: ξ = √(2α)·L·N(0, I) from the same draws, the drift P∇U; per model, the full preconditioner or
    # the diagonal (where P could not be formed)
    P, L, use = _full_preconditioner(theta, log_w, first, variance, s.learning_rate)
    use &= gate
    if not bool(use.any()):
        return run(step_size, _diagonal_xi(noise, alpha, step_size))
    diagonal = torch.diag_embed(step_size[:, 0, :])
    xi = _mixed_xi(noise, alpha, step_size, L, use)
    th, v = run(torch.where(use[:, None, None], P, diagonal), xi)
    # a model whose full-preconditioned moves took a particle further than RUNAWAY_SD of the population's own sd
    # (in any coordinate) redoes them with the diagonal, from the same draws: the average curvature that sized
    # its step missed a stiffer region (Bitcoin's 2017 bubble under AR(1): the noise variance moves by orders of
    # magnitude within a few blocks)
    far = ((th - theta).abs() / variance.sqrt().to(theta.dtype)[:, None, :]).amax((1, 2))
    redo = use & ~(far <= RUNAWAY_SD)
    if bool(redo.any()):
        idx = redo.nonzero()[:, 0]
        xi[idx] = _diagonal_xi(noise[idx], alpha[idx], step_size[idx])
        th2, v2 = run(torch.where((use & ~redo)[:, None, None], P, diagonal), xi)
        th, v = torch.where(redo[:, None, None], th2, th), torch.where(redo[:, None, None], v2, v)
    return th, v


def _in_dtype(grad_at: StepGradient, dtype: torch.dtype) -> StepGradient:
    """``grad_at`` with its gradients cast to ``dtype``: SGHMC's update in the particles' dtype."""
    return lambda theta, step: grad_at(theta, step).to(dtype)


def _catch_up(
    block: StackBlock,
    theta: torch.Tensor,
    velocity: torch.Tensor,
    *,
    lam: torch.Tensor,
    log_w: torch.Tensor,
    rounds: torch.Tensor,
    move: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Extra rounds of the step's moves (``move(rows, theta, velocity)``: :func:`_move` for those models, with the
    step's sizes and burn-ins, into the full stack's tensors) for the models whose moved particles
    still lag the tempered target at ``lam`` (:func:`lagging`), at most ``rounds: [K]`` each, re-checked after
    each round → ``(theta, velocity, behind: [K] bool)``, ``behind`` where the particles
    still lag after all their rounds (the block is then not certified: :data:`workers.stacking.LAG_REASON`).

    Why: the moves leave the particles distributed as the current tempered target only if they mix; when the
    target moves faster than ``burn_in`` steps of size ``η`` carry them (the warm-up's contracting posterior,
    a heteroscedastic series whose noise variance jumps between blocks), the next increments are weighted at
    particles that lag it, and ``log Ẑ`` comes out low by more than its error bar, which assumes perfect mixing.
    Measured (``python bench/demo_exact.py``, the demo's AR(1) on BrentSpotPrice, learning rate 0.02, burn-in 10):
    its noise variance lagged by 2.3-2.9 posterior sds through the second block's annealing steps (``|t|`` 0.97)
    and the log-evidence ended 15 nats low with SE 0.7 and status ``ok``.  The moves are chosen from the
    particles, as SMC samplers adapt their kernels (Fearnhead & Taylor 2013, *Bayesian Anal.* 8(2)); the
    weights are untouched, and moves that leave the target invariant cannot bias the estimate.  Each model's
    draws come from its own generator and its decisions from its own rows: the same bits alone or in any stack."""
    made, behind = torch.zeros_like(rounds), torch.zeros_like(rounds, dtype=torch.bool)
    check = rounds > 0
    while True:
        rows = check.nonzero()[:, 0]
        if not rows.numel():
            return theta, velocity, behind
        lag = lagging(theta[rows], log_w[rows], tempered_score(block.select(rows), theta[rows], lam[rows]))
        more = lag & (made[rows] < rounds[rows])
        behind[rows] = lag & ~more
        check[rows] = more
        rows = rows[more]
        if not rows.numel():
            return theta, velocity, behind
        theta, velocity = move(rows, theta, velocity)
        made[rows] += 1


#: :func:`lagging`'s limits: the particles' scores point one way beyond ``LAG_T`` standard errors (``|t_d|·√ESS``,
#: about ``|N(0, 1)|`` under the target), or they spread ``LAG_C`` times the target's variance (``c_d``, 1 under the
#: target).  A false alarm costs moves, and a lag left after the extra moves flags the block.  SGHMC's own
#: stationary bias (no Metropolis correction, mini-batch noise) can keep a population a few tenths of a sd off at
#: any number of moves (50 particles see 0.42 sd at 3 standard errors): such a block is flagged although its
#: error may be small (a gmm at data around 300, seed 1: −0.45 nats, SE 0.25).  Flagging only a lag beyond 1 sd
#: (``|δ_d| > 1``) left two of the demo's AR(2) models 4.7 and 5.7 SE low with status ok (``python
#: bench/demo_exact.py``): a false flag is the lesser error.
LAG_T, LAG_C = 3.0, 4.0


def lagging(theta: torch.Tensor, log_w: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """``[K]`` bool: the weighted particles ``theta: [K, M, D]``, ``log_w: [K, M]`` lag the target whose score
    ``∇ log π(θ_i)`` is ``score: [K, M, D]``, by Stein's identity (:func:`workers.conflict.score_offsets`: ``c_d`` their
    variance over the target's, ``t_d = s_d/rms_d`` how one-sided the scores are): in some coordinate
    ``|t_d|·√ESS > LAG_T`` or ``c_d > LAG_C``.  Not finite: False (the kernel's guards report it)."""
    _, c, t = score_offsets(theta, log_w, score)
    return ((t.abs() * torch.sqrt(ess(log_w))[:, None] > LAG_T) | (c > LAG_C)).any(-1)


def tempered_score(block: StackBlock, theta: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``∇ log π_λ(θ) = ∇ log p(θ) + Σ_{y∈H} ∇ log p(y|θ) + λ_k Σ_{y∈C} ∇ log p(y|θ): [K, M, D]`` exactly, every held
    history row included (``theta: [K, M, D]``, ``lam: [K]``): the negative of eq. 4.14's ``∇U`` without its
    mini-batch.  ``sufficient_statistics`` families from the history's summed statistics (cached on the block's
    batches), the others by :func:`workers.gradients.history_gradient`, the models of one history size at once.
    Costs a pass over the histories: the caller keeps it to the warm-up."""
    fam, b = block.family, block.batches
    if fam.sufficient_statistics:
        return fam.grad_from_statistics(theta, _tempered_statistics(block, lam))
    g = fam.grad_log_target(theta, block.x, block.y, lam)
    if b is None:
        return g
    x, y, offsets = b.source()
    sizes = [b.sizes[m] for m in block.models]
    for size in sorted(set(sizes) - {0}):
        ks = [k for k, n in enumerate(sizes) if n == size]
        idx = torch.stack([torch.arange(offsets[block.models[k]], offsets[block.models[k]] + size) for k in ks])
        rows = torch.tensor(ks, device=theta.device)
        hx = x[idx.to(x.device)] if x is not None else None
        part = history_gradient(fam.select(rows), theta[rows], hx, y[idx.to(y.device)])
        g = g.index_add(0, rows, part.to(g.dtype))  # float32 particles: g is float64 (λ's dtype), part float32
    return g


def _step_gradient(
    block: StackBlock,
    theta: torch.Tensor,
    anchor: torch.Tensor,
    anchor_grad: torch.Tensor,
    *,
    lam: torch.Tensor,
    plan: torch.Tensor | None,
    whole: list[bool],
    S: int,
    bulk: bool,
) -> StepGradient:
    """``(θ, s) -> ∇Û_s(θ)`` for the ``S`` SGHMC steps of :func:`_move` (eq. 4.14): the history term from step ``s``'s
    mini-batch of ``plan: [K, S, |B|]`` (or the whole history, ``whole``), with control variates around ``anchor``
    where the settings ask for them.  Quadratic families form their steps' batch statistics at once when ``bulk``;
    ``sufficient_statistics`` families fold every step's statistics once
    (:func:`~workers.gradients.potential_gradient_steps`)."""
    s, fam, K = block.settings, block.family, theta.shape[0]
    history: HistoryEstimator | None = None
    stats: Any = None  # a quadratic family's (A, c) per step, or a sufficient-statistics family's T: [K, S, P]
    at_anchor = None
    if block.batches is not None and fam.sufficient_statistics:
        stats, scale, at_anchor = _statistics_per_step(block, plan, whole, S, anchor, anchor_grad, s.control_variates)
        history = minibatch(fam, scale)
        if at_anchor is not None:
            history = control_variates(history, anchor, anchor_grad)
    elif block.batches is not None and (plan is not None or any(whole)):
        rows = None
        if any(whole):  # a weighted_gradients family: those models' batches are their whole histories
            plan, rows = _whole_rows(block, plan, whole, S)
        history = minibatch(fam, block.n_prev / block.batches.batch_size, rows)
        if s.control_variates:
            history = control_variates(history, anchor, anchor_grad)
        if fam.quadratic and bulk and plan is not None:
            x, y = block.batches.rows(plan.reshape(K * S, -1))
            A, c = fam.select(torch.arange(K, device=theta.device).repeat_interleave(S)).gradient_statistics(
                x, None if s.control_variates else y
            )
            stats = (A.reshape(K, S, *A.shape[1:]), c.reshape(K, S, -1) if c is not None else None)
    if fam.sufficient_statistics and not callable(at_anchor):  # every step's statistics at hand: folded once
        return potential_gradient_steps(fam, Batch(block.x, block.y), lam, history, stats, at_anchor)
    grad_u = potential_gradient(fam, Batch(block.x, block.y), lam, history)

    def batch_at(step: int) -> Batch | None:
        if isinstance(stats, torch.Tensor):
            return Batch(None, None, stats[:, step], at_anchor(step) if callable(at_anchor) else None)
        if stats is not None:
            return Batch(None, None, (stats[0][:, step], stats[1][:, step] if stats[1] is not None else None))
        if block.batches is not None and plan is not None:
            return Batch(*block.batches.rows(plan[:, step]))
        return None

    return lambda theta, step: grad_u(theta, batch_at(step))


def _diagonal_xi(noise: torch.Tensor, alpha: torch.Tensor, step_size: torch.Tensor) -> torch.Tensor:
    """``ξ = √(2αη)·N(0, I): [K, S, M, D]`` for every step at once, from ``noise: [K, S, M, D]``, the momentum decay
    ``alpha: [K, 1, 1]`` and the diagonal step sizes ``step_size: [K, 1, D]`` (eq. 2.53)."""
    return torch.sqrt(2.0 * alpha * step_size)[:, None] * noise


def _mixed_xi(
    noise: torch.Tensor, alpha: torch.Tensor, step_size: torch.Tensor, L: torch.Tensor, use: torch.Tensor
) -> torch.Tensor:
    """``ξ: [K, S, M, D]``: ``√(2α)·N(0, I)·Lᵀ ~ N(0, 2α·LLᵀ)`` for the models with ``use: [K]`` (their full
    preconditioner's factor ``L: [K, D, D]``), :func:`_diagonal_xi` for the others.  Each kind is computed on its
    own models only (row by row the same values as computing both for the whole stack and picking)."""
    xi = torch.empty_like(noise)
    full, diag = use.nonzero()[:, 0], (~use).nonzero()[:, 0]
    if diag.numel():
        xi[diag] = _diagonal_xi(noise[diag], alpha[diag], step_size[diag])
    xi[full] = torch.sqrt(2.0 * alpha[full])[:, None] * (noise[full] @ L[full].transpose(1, 2)[:, None])
    return xi


def _sghmc_steps(
    theta: torch.Tensor,
    velocity: torch.Tensor,
    first: torch.Tensor,
    grad_at: StepGradient,
    xi: torch.Tensor,
    step_size: torch.Tensor,
    keep_v: torch.Tensor,
    counts: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``max(counts)`` SGHMC steps (``first``: the gradient at ``theta``, ``grad_at(θ, s)`` step ``s``'s ``∇Û``,
    ``xi: [K, S, M, D]`` the noise); model ``k`` stops after ``counts[k]`` of them."""
    ends, first_end = torch.tensor(counts, device=theta.device)[:, None, None], min(counts, default=0)
    noise = xi.unbind(1)
    for step in range(max(counts, default=0)):
        new_theta, new_velocity = sghmc_step(
            theta, velocity, first if step == 0 else grad_at(theta, step), noise[step],
            step_size=step_size, momentum_keep=keep_v,
        )  # fmt: skip
        if step >= first_end:  # some models have finished their moves: they stay where they are
            keep = ends <= step
            new_theta, new_velocity = torch.where(keep, theta, new_theta), torch.where(keep, velocity, new_velocity)
        theta, velocity = new_theta, new_velocity
    return theta, velocity


#: Full-preconditioned moves that carry a particle further than this many of the population's sd are redone with
#: the diagonal (:func:`_move`); a valid move of burn_in SGHMC steps at κ·λ ≤ 2·lr stays within a few.  On
#: ``bench/ar_real_data.py`` (one seed) 65 of 870 full-preconditioned moves were redone.
RUNAWAY_SD = 20.0


#: Largest ``K · steps · |batch| · D`` for which the quadratic families' batch statistics are formed at once.
BULK_ELEMENTS = 4_000_000


def _whole_history(block: StackBlock) -> list[bool]:
    """Per model: its history fits in one mini-batch (``0 < n_prev ≤ |B|``, every row held), so its history term
    is the exact ``Σ_{y∈H} ∇ log p(y|θ)`` rather than a mini-batch estimate of it."""
    b = block.batches
    if b is None:
        return [False] * len(block.models)
    return [
        0 < b.sizes[m] <= b.batch_size and b.sizes[m] == int(n)
        for m, n in zip(block.models, block.n_prev.tolist(), strict=True)
    ]


def _whole_rows(
    block: StackBlock, plan: torch.Tensor | None, whole: list[bool], S: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``plan: [K, S, |B|]`` with the models of ``whole`` (:func:`_whole_history`, which drew no indices) given their
    held rows in every step, padded to ``|B|`` by repeating the last (weight 0): ``(plan, (whole [K] bool, row weights
    [K, |B|]))``, the weights 1 on a whole model's held rows and 0 on its padding, ``n_prev/|B|`` for the others.

    A ``weighted_gradients`` family (a mixture, whose gradient has no sufficient statistics to fold) thus takes the
    exact history gradient while the history fits in one mini-batch, as the ``sufficient_statistics`` families do:
    no mini-batch noise and no control variates.  The demo's two-component gmm spends 84% of its SGHMC steps with
    ``n_prev ≤ |B|`` (challengers and early blocks; session 30).  The padding keeps every model's batch at ``|B|`` rows,
    so a model's arithmetic is the same alone and in any stack."""
    batches = block.batches
    assert batches is not None
    _, y, offsets = batches.source()
    K, B = len(whole), batches.batch_size
    dev = y.device
    mask = torch.tensor(whole, device=dev)
    # every model's held rows at once (one tensor op each, not a loop over the stack's models on every move)
    held = torch.tensor([batches.sizes[k] for k in block.models], device=dev)[:, None]  # [K, 1]
    first = torch.tensor([offsets[k] for k in block.models], device=dev)[:, None]
    cols = torch.arange(B, device=dev)
    rows = first + torch.minimum(cols, (held - 1).clamp_min(0))  # [K, |B|], the last held row repeated
    padded = rows[:, None, :].expand(K, S, B)
    drawn = plan if plan is not None else torch.zeros((K, S, B), dtype=torch.long, device=dev)
    out = torch.where(mask[:, None, None], padded, drawn)
    weights = torch.where(mask[:, None], (cols < held).to(block.n_prev.dtype), (block.n_prev / B)[:, None])
    return out, (mask, weights)


def _statistics_per_step(
    block: StackBlock,
    plan: torch.Tensor | None,
    whole: list[bool],
    S: int,
    anchor: torch.Tensor,
    anchor_grad: torch.Tensor,
    control_variates: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | Callable[[int], torch.Tensor] | None]:
    """A ``sufficient_statistics`` family's history term for ``S`` SGHMC steps: ``(T: [K, S, P], scale: [K],
    at_anchor)``, the step's gradient being ``g(θ, T0 + λT_C + scale·T_s)`` plus, with control variates,
    ``G − at_anchor[:, s]`` (:class:`~workers.gradients.ControlVariates`; ``at_anchor: [K, S, M, D]``, formed for
    every step at once, or where that exceeds :data:`BULK_ELEMENTS` a function of the step returning its
    ``[K, M, D]``; None without control variates).

    A model whose history fits in one mini-batch (``whole``) takes its exact history statistics ``T_H`` at
    every step with ``scale`` 1: the exact gradient of the annealed target, at no more cost than a batch of
    ``|B|`` rows drawn with replacement (``n_prev ≤ |B|``: the first ``|B|`` observations of every model and
    every change-point challenger), and no random draws; its control-variate correction is exactly zero
    (``at_anchor = G``).  The others draw their batches from ``plan: [K, S', |B|]`` (thesis eq. 4.14) and
    scale them by ``n_prev/|B|``.
    """
    fam, batches = block.family, block.batches
    assert batches is not None
    K, dev = len(whole), anchor.device
    scale = block.n_prev / batches.batch_size
    T: torch.Tensor | None = None
    if plan is not None:
        S1 = plan.shape[1]
        per = max(1, BULK_ELEMENTS // max(1, K * plan.shape[2] * anchor.shape[-1]))  # steps gathered at once
        parts = []
        for s0 in range(0, S1, per):
            x, y = batches.rows(plan[:, s0 : s0 + per].reshape(-1, plan.shape[2]))
            parts.append(fam.statistics(x, y).reshape(K, min(per, S1 - s0), -1))
        T = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        if S1 < S:  # models that draw have at most S1 steps; the rest are padding
            T = torch.cat([T, T.new_zeros((K, S - S1, T.shape[-1]))], 1)
    if any(whole):
        exact = _history_statistics(fam, batches, [m for m, w in zip(block.models, whole, strict=True) if w])
        rows = torch.tensor([i for i, w in enumerate(whole) if w], device=dev)
        T_H = exact.new_zeros((K, exact.shape[-1])).index_copy(0, rows, exact)[:, None].expand(-1, S, -1)
        mask = torch.tensor(whole, device=dev)
        T = T_H if T is None else torch.where(mask[:, None, None], T_H, T)
        scale = torch.where(mask, 1.0, scale)
    assert T is not None
    if not control_variates or all(whole):
        return T, scale, None
    mask = torch.tensor(whole, device=dev)[:, None, None]
    scaled = scale.to(T.dtype)[:, None, None] * T  # [K, S, P]
    if K * S * anchor[0].numel() > BULK_ELEMENTS:  # one step at a time (memory)

        def at_step(step: int) -> torch.Tensor:
            return torch.where(mask, anchor_grad, fam.grad_from_statistics(anchor, scaled[:, step]))

        return T, scale, at_step
    # the mini-batch estimate at the anchors, every step at once
    flat = fam.select(torch.arange(K, device=dev).repeat_interleave(S))
    at = flat.grad_from_statistics(anchor.repeat_interleave(S, 0), scaled.reshape(K * S, -1))
    return T, scale, torch.where(mask[:, None], anchor_grad[:, None], at.reshape(K, S, *anchor.shape[1:]))


def _tempered_statistics(block: StackBlock, lam: torch.Tensor) -> torch.Tensor:
    """``T = T0 + Σ_{y∈H} t(y) + λ Σ_{y∈C} t(y): [K, P]``, the statistics of the tempered target ``π_λ`` with every held
    history row (``sufficient_statistics`` families; ``lam: [K]``)."""
    T = exact_statistics(block.family, Batch(block.x, block.y), lam)
    if block.batches is not None:
        T = T + _history_statistics(block.family, block.batches, block.models)
    return T


def _history_statistics(fam: StackedFamily, batches: StackBatches, models: list[int]) -> torch.Tensor:
    """``T_H: [len(models), P]``, each model's summed sufficient statistics over its whole history (rows in
    order, summed one by one: the same bits alone and in any stack); cached on ``batches`` (one block).

    Each history keeps its running total (:meth:`workers.history.History.statistics_of`), so a block sums only the rows
    appended since the last one: ``((T + t_r) + t_{r+1}) + …`` in order, the bits of the whole sum from zero, at
    ``O(B)`` per block instead of ``O(n)``."""
    cache = batches.__dict__.setdefault("_whole_statistics", {})
    missing = [m for m in models if m not in cache]
    if missing:
        kind = type(fam.family)
        hists = [batches.histories[m] for m in missing]
        runs = [h.statistics_of(kind) for h in hists]
        starts = [r[0] if r is not None else 0 for r in runs]
        ys = [h.y[a : h.size] for h, a in zip(hists, starts, strict=True) if h.y is not None]
        xs = [h.x[a : h.size] for h, a in zip(hists, starts, strict=True) if h.x is not None]
        if not ys:  # every one of them empty: no rows, from the stack's (held rows of the others)
            sx, sy, _ = batches.source()
            xs, ys = ([sx[:0]] if sx is not None else []), [sy[:0]]
        y = torch.cat(ys)
        x = torch.cat(xs) if xs else None
        counts = torch.tensor([h.size - a for h, a in zip(hists, starts, strict=True)], device=y.device)
        seg = torch.repeat_interleave(torch.arange(len(missing), device=y.device), counts)
        per_row = fam.statistics(x[:, None] if x is not None else None, y[:, None])  # [N, P], one row each
        base = [r[1] if r is not None else per_row.new_zeros(per_row.shape[-1]) for r in runs]
        total = torch.stack(base).index_add_(0, seg, per_row)
        for h, t in zip(hists, total, strict=True):
            h.keep_statistics(kind, h.size, t)
        cache.update(zip(missing, total, strict=True))
    return torch.stack([cache[m] for m in models])


def _noise(generators: Sequence[torch.Generator], counts: list[int], shape: tuple[int, ...], like: torch.Tensor):
    """``[K, max(counts), *shape]`` standard normals in ``like``'s dtype, model k's ``counts[k]`` rows from
    ``generators[k]``, drawn in float32 (:data:`NOISE_DTYPE`)."""
    S = max(counts, default=0)
    if len(counts) == 1:
        return standard_normal(generators, (S, *shape), like.new_empty(0, dtype=NOISE_DTYPE)).to(like.dtype)
    out = torch.zeros((len(counts), S, *shape), dtype=NOISE_DTYPE, device=like.device)
    for k, (g, c) in enumerate(zip(generators, counts, strict=True)):
        if c:  # drawn in place (normal_, as torch.randn draws): the same draws as a fresh tensor of that shape
            out[k, :c].normal_(generator=g)
    return out.to(like.dtype)


#: dtype of the SGHMC noise draws.  On CPU torch draws float32 normals about 4x faster than float64 ones
#: (5 against 22 ns each, measured here); the noise's rounding (relative 6e-8) is far below the discretisation
#: error of the SGHMC steps it drives, and its tails are cut at about 5.8 sd (probability 7e-9).
NOISE_DTYPE = torch.float32
