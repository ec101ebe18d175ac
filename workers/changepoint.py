"""Bayesian online change-point posterior from challenger evidences (DESIGN.md §5, §9).

Pure logic, no engine: the settings, the candidate rules (where a challenger starts), the change
posterior and the pruning.  :mod:`workers.segmented` holds the challenger engines and calls these.

The model.  Since the start ``s`` of the current segment (0, or the last confirmed change) the
stream either has no change (H₀) or exactly one change at ``t`` (H_t): the segments ``s..t−1``
and ``t..n`` then have independent parameters drawn from the same prior.  This is the run-length
posterior of Bayesian online change-point detection (Adams & MacKay 2007, arXiv:0710.3742, eq. 3)
restricted to at most one change since ``s``, evaluated on a particle set of candidate locations
(the challengers) as in Fearnhead & Liu (2007, JRSS B 69(4), §2-3).  For a challenger started at
``t`` the Bayes factor of H_t against H₀ is (issue 12)

    log B_t = log Ẑ(y_{s..t−1}) + log Ẑ'(y_{t..n}) − log Ẑ(y_{s..n})

with Ẑ the main population's running evidence (its value before ``t`` is recorded when the
challenger starts) and Ẑ' the challenger's own.  With a constant hazard ``h`` per observation
(Adams & MacKay eq. 5) the prior odds of H_t against H₀ are ``h / (1 − h)``, so

    p(H_t | y) = ρ B_t / (1 + Σ_u ρ B_u),   ρ = h / (1 − h).

Summing over the candidates only (not every ``t``) gives a lower bound on the full posterior
probability of a change when the evidences are exact: missing locations only add mass.

The challengers' sampler.  A challenger is the model's sampler with its own seed, ``burn_in`` if set (else
``burn_in_fraction`` of the model's, rounded up), and
a lower conditional-ESS target per annealing step (:func:`challenger_ess_target`): its log Ẑ' only enters
log B_t, where a Monte Carlo error of a few tenths of a nat is small against the confirmation level
log B_t > log((1 − h)/h) + log(c/(1 − c)) ≈ 6.9 nats at the defaults.  Measured against the exact
normal–inverse-gamma evidence of a one-component gmm with the default sampler (50 warm-up particles), 20
seeds, 10–80 observations (``python bench/challenger_accuracy.py``): rms error 0.14–0.35 nats with the
model's 0.9, 0.29–0.60 with 0.5, for 37 → 10 SGHMC move rounds per 5-observation block.  The per-step
error grows as the absolute ESS target shrinks (the χ² divergence of a step's incremental weights is
≈ 1/ESS − 1/M): with 10 particles 0.5 doubles the rms error (0.8–1.5 → 1.6–4.1 nats,
``--base cheap``), so the target is never below ``ess_min_particles`` particles.

Stale challengers. On a stationary stream the Bayes factor of a change early in the segment does not decay: with
``t − s`` small the first segment's evidence costs little to learn twice, and ``log B_t`` settles near a constant
around or below 0 (−2.30 to +0.44 nats once 100 observations old, one-component gmm, 1,000 observations, three
seeds: ``python bench/challenger_lifetime.py``), at or above the weight cut ``log(prune_weight) − log ρ`` ≈ −2.3
nats at the defaults, so such a challenger was hardly ever dropped: 2.1 alive per model on average there (0.6 with
``stale_age``), each as costly as the model itself. A change whose evidence is still below even odds
(``log B_t < 0``) after ``stale_age`` observations of its new segment would take several times that to reach
the confirmation level ≈ 6.9 nats (``log B_t`` grows at the Kullback–Leibler rate per observation, less the
second segment's learning cost), and the later grid starts still cover it: such a challenger is dropped.

False alarms.  Under H₀ each ``B_t`` (exact evidences) is a non-negative martingale with mean 1
from its start, so by Ville's inequality P(sup_n ρ B_t ≥ c/(1 − c)) ≤ ρ (1 − c)/c: the expected
number of false alarms is at most (number of challengers started) · ρ (1 − c)/c.  The defaults
(``hazard`` 1e-3, ``threshold`` 0.5) bound it by 1e-3 per challenger.  With a Gaussian error of sd σ in
log B̂_t (unbiased in log) the bound grows by E[e^ε] = e^{σ²/2}: 1.2 for σ = 0.6 nats.

Monte Carlo error.  ``log B̂_t`` has the standard error ``√(Var log Ẑ' + Var log Ẑ(y_{s..n}) − Var log Ẑ(y_{s..t−1}))``
(the challenger's and the main population's increment since ``t``: independent runs; each variance the engine's
``log_evidence_se²``).  A change is confirmed when the posterior probability computed from ``log B̂_t − z·SE_t``
(``confirm_z``, 2) exceeds ``threshold``; ``change_probability`` and the alert's probability and log Bayes factor
stay the point estimates.  Without it, fresh populations of 10 particles without a warm-up population confirmed
stationary stretches at log B̂ = 6.6–8.0 nats (SE 0.75–1.02; true changes: 40–69 nats) once the warm-up step size
stopped biasing every challenger's first blocks low (session 18, ``tests/workers/test_changepoint.py``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_MAD_TO_SD = 1.4826  # MAD of a normal sample × this = its standard deviation


class ChangepointSettings(BaseModel):
    """Change-point settings of a model (the ``change_point`` object of its ``alerts``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="run challengers and raise change_point alerts")
    hazard: float = Field(
        1e-3, gt=0, lt=0.5, description="prior probability of a change at each observation (1 / mean segment length)"
    )
    threshold: float = Field(
        0.5, gt=0, lt=1, description="change_point alert when the posterior probability of a change exceeds this"
    )
    window: int | None = Field(
        None, ge=1, description="change_probability counts changes in the last `window` observations (null = segment)"
    )
    confirm_z: float = Field(
        2.0,
        ge=0,
        description="confirm a change only when its posterior probability exceeds threshold with every challenger's "
        "log Bayes factor lowered by this many Monte Carlo standard errors (module docstring, 'Monte Carlo error')",
    )
    max_challengers: int = Field(10, ge=1, le=100, description="challenger populations kept per model")
    min_age: int = Field(10, ge=1, description="observations a challenger absorbs before it can be pruned or confirmed")
    prune_weight: float = Field(
        1e-4, ge=0, lt=1, description="after min_age, drop a challenger whose weight ρB_t falls below this"
    )
    spawn_z: float = Field(
        2.0,
        gt=0,
        description="start a challenger at a block whose per-observation log-predictive is this many "
        "spreads below the segment's recent median (a block's tail from its most probable change: the "
        "Bonferroni level over its candidate tails, 2.43 for 5 rows at 2)",
    )
    baseline_blocks: int = Field(50, ge=3, description="recent blocks in the robust baseline (median, MAD)")
    noise_floor: float = Field(
        0.7, gt=0, description="floor on the per-observation spread of the log-predictive (nats), as in evidence_drop"
    )
    grid_first: int = Field(10, ge=1, description="first geometric-grid start: this many observations into a segment")
    grid_ratio: float = Field(2.0, gt=1, description="grid starts at grid_first · ratio^k observations into a segment")
    burn_in: int | None = Field(
        None,
        ge=0,
        le=10_000,
        description="SGHMC burn-in of the challengers (null = burn_in_fraction of the model's burn_in)",
    )
    burn_in_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="with burn_in null, a challenger's SGHMC burn-in is this fraction of the model's (rounded up): "
        "its log-evidence only enters the Bayes factor (bench/README.md, session 8: rms error <= 0.8 nats "
        "against a confirmation level of ~6.9; 1 = the model's)",
    )
    ess_target: float | None = Field(
        0.5,
        gt=0,
        lt=1,
        description="target conditional ESS per annealing step of a challenger, a fraction of its particles, raised "
        "to ess_min_particles particles and never above the model's ess_target (null = the model's); 0.5 takes ~2.5x "
        "fewer SGHMC move rounds than 0.9 with the default 50 warm-up particles (bench/README.md, session 8)",
    )
    ess_min_particles: int = Field(
        25,
        ge=1,
        description="a challenger's conditional ESS target is at least this many particles (capped by the model's "
        "ess_target): with 10 particles a target of 0.5 doubles its log-evidence error (bench/challenger_accuracy.py)",
    )
    stale_age: int | None = Field(
        100,
        ge=1,
        description="drop a challenger that has absorbed this many observations while its log Bayes factor is still "
        "below 0 (the evidence favours no change at its start; module docstring, 'Stale challengers'); null = never",
    )


def challenger_seed(seed: int, start: int) -> int:
    """Deterministic seed of the challenger started at stream index ``start`` of a model seeded ``seed``."""
    digest = hashlib.sha256(f"sgais-challenger:{seed}:{start}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # < 2**63


def challenger_ess_target(settings: ChangepointSettings, model_target: float, particles: int) -> float:
    """A challenger's conditional-ESS target per annealing step (a fraction of its ``particles``; module docstring):
    ``min(model_target, max(ess_target, ess_min_particles / particles))``, or ``model_target`` when
    ``ess_target`` is null."""
    if settings.ess_target is None:
        return model_target
    return min(model_target, max(settings.ess_target, settings.ess_min_particles / particles))


def log_prior_odds(hazard: float) -> float:
    """log ρ = log(h / (1 − h)): prior odds of one change at a given observation against none."""
    return math.log(hazard) - math.log1p(-hazard)


def posterior(log_bayes_factors: list[float], hazard: float) -> tuple[float, list[float]]:
    """(p(H₀ | y), [p(H_t | y) per candidate]) from the candidates' log Bayes factors (module docstring).

    Computed in log space (log-sum-exp), so Bayes factors of thousands of nats are fine.
    """
    lo = log_prior_odds(hazard)
    terms = [0.0] + [b + lo for b in log_bayes_factors]
    top = max(terms)
    norm = top + math.log(sum(math.exp(v - top) for v in terms))
    probs = [math.exp(v - norm) for v in terms]
    return probs[0], probs[1:]


def baseline(values: list[float], rows: list[int], floor: float) -> tuple[float, float]:
    """(median per-observation log-predictive, per-observation spread σ) of recent blocks.

    A block mean of ``n`` rows spreads as σ/√n; σ = 1.4826 × the MAD of the √n-scaled deviations,
    floored at ``floor`` (the ``evidence_drop`` detector's baseline too, :mod:`workers.alerts`).  ``values`` must
    not be empty.
    """
    med = median(values)
    if rows.count(rows[0]) == len(rows):  # a steady feed's blocks: one √n for all (the same products)
        root = math.sqrt(rows[0])
        mad = median([abs(v - med) * root for v in values])
    else:
        mad = median([abs(v - med) * math.sqrt(n) for v, n in zip(values, rows, strict=True)])
    return med, max(_MAD_TO_SD * mad, floor)


def median(values: Sequence[float]) -> float:
    """``statistics.median`` of a non-empty list of numbers (its arithmetic: the middle one, or the mean of the middle
    two of an even count), without its generic conversions: :func:`baseline` runs for every model after every block,
    and the worker's alert detector too (:mod:`workers.alerts`)."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def drop_score(
    state: dict[str, Any],
    settings: ChangepointSettings,
    value: float,
    rows: int,
    base: tuple[float, float] | None = None,
) -> float:
    """Standardised drop ``z`` of a block's per-observation log-predictive ``value`` below the segment's
    baseline (positive = worse than usual); 0 before two baseline blocks exist.  ``base``: the state's
    :func:`baseline` where the caller has it already."""
    if len(state["values"]) < 2 or rows <= 0 or not math.isfinite(value):
        return 0.0
    med, sigma = base if base is not None else baseline(state["values"], state["rows"], settings.noise_floor)
    return (med - value) * math.sqrt(rows) / sigma


def push_baseline(state: dict[str, Any], settings: ChangepointSettings, value: float, rows: int) -> None:
    """Add a block to the segment's baseline (the first block of a segment, the prior-to-posterior
    transient, is left out)."""
    state["segment_blocks"] += 1
    if state["segment_blocks"] > 1 and rows > 0 and math.isfinite(value):
        state["values"] = (state["values"] + [value])[-settings.baseline_blocks :]
        state["rows"] = (state["rows"] + [rows])[-settings.baseline_blocks :]


def grid_due(state: dict[str, Any], settings: ChangepointSettings, first: int) -> bool:
    """True (and the next grid point advanced) when the block starting at ``first`` reaches the segment's
    next geometric-grid age ``grid_first · ratio^k``."""
    age = first - state["segment_start"]
    if age < state["next_grid"]:
        return False
    while state["next_grid"] <= age:
        state["next_grid"] = max(state["next_grid"] + 1, math.ceil(state["next_grid"] * settings.grid_ratio))
    return True


def initial_state(segment_start: int = 0, settings: ChangepointSettings | None = None) -> dict[str, Any]:
    """The JSON-able candidate-rule state of a segment starting at ``segment_start``."""
    first = (settings or ChangepointSettings.model_validate({})).grid_first
    return {"segment_start": segment_start, "segment_blocks": 0, "values": [], "rows": [], "next_grid": first}


def prune(
    starts: list[int], ages: list[int], log_bfs: list[float], settings: ChangepointSettings, keep: int | None = None
) -> list[int]:
    """Indices of the challengers to keep: those younger than ``min_age``, or with weight ρB_t ≥
    ``prune_weight`` and not stale (``ages ≥ stale_age`` with ``log B_t < 0``), then the ``max_challengers`` of
    largest weight (ties: the later start).  ``keep`` (an index) is never dropped."""
    lo = log_prior_odds(settings.hazard)
    cut = math.log(settings.prune_weight) if settings.prune_weight > 0 else -math.inf
    stale = settings.stale_age if settings.stale_age is not None else math.inf

    def kept(i: int) -> bool:
        if i == keep or ages[i] < settings.min_age:
            return True
        return log_bfs[i] + lo >= cut and not (ages[i] >= stale and log_bfs[i] < 0.0)

    alive = [i for i in range(len(starts)) if kept(i)]
    if len(alive) <= settings.max_challengers:  # none over the cap: the kept ones in index order, as below
        return alive
    alive.sort(key=lambda i: (i == keep, log_bfs[i], starts[i]), reverse=True)
    return sorted(alive[: settings.max_challengers])
