"""SGAIS sampler settings: the ``sampler`` object of the API (DESIGN.md §3)."""

from __future__ import annotations

import functools
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator


class SamplerSettings(BaseModel):
    """Settings of one model's SGAIS run. Thesis defaults (§5.1.1) unless a measured better one.

    ``learning_rate`` is per observation: the SGHMC step is ``η = learning_rate / n``
    with ``n`` the number of observations including the current block.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    particles: int = Field(10, ge=2, le=100_000, description="M, the number of particles")
    warmup_particles: int | None = Field(
        50,
        ge=2,
        le=1_000_000,
        description="particles while the posterior is still wide (before warmup_observations); "
        "reduced to `particles` by resampling afterwards; re-annealing replays run at this size too. "
        "null = always `particles`",
    )
    warmup_observations: int = Field(
        2000, ge=0, description="observations absorbed before the warm-up particles are reduced"
    )
    batch_size: int = Field(500, ge=1, le=1_000_000, description="|B|, mini-batch size drawn from the history")
    block_size: int = Field(500, ge=1, le=1_000_000, description="larger chunks are split into blocks of this size")
    learning_rate: float = Field(0.1, gt=0, le=10, description="η·n, the SGHMC learning rate per observation")
    learning_rate_schedule: Literal["annealed", "block"] = Field(
        "annealed",
        description="annealed: η = learning_rate / (n_prev + λ|C|), the data in the current target; "
        "block: η = learning_rate / n for the whole block (thesis §5.1.1)",
    )
    preconditioning: bool = Field(
        True,
        description="cap each coordinate's SGHMC step at learning_rate × its weighted particle variance, "
        "so high-curvature posteriors (small noise, large covariates) stay stable",
    )
    fisher_step_growth: float = Field(
        4.0,
        ge=1,
        le=100,
        description="after the warm-up, replace the 1/n in the step cap by 1/(n·f_d), f_d the per-observation "
        "empirical Fisher information of coordinate d measured on each block, letting weakly identified "
        "coordinates take up to this many times larger steps (1 = off; needs preconditioning)",
    )
    momentum_decay: float = Field(0.2, gt=0, le=1, description="α, the SGHMC friction (eq. 2.53)")
    burn_in: int = Field(20, ge=0, le=10_000, description="SGHMC steps per annealing step")
    catch_up_moves: int = Field(
        4,
        ge=0,
        le=100,
        description="in the warm-up, up to this many extra rounds of burn_in SGHMC moves after an annealing step "
        "whose particles lag its tempered target (Stein's identity against the exact score over the whole history: "
        "workers.sgais.lagging); 0 = off",
    )
    gibbs_sweeps: int = Field(
        2,
        ge=0,
        le=100,
        description="in the warm-up, an unknown-noise linear-Gaussian model (AR(p), linear regression without "
        "noise_std) moves by this many Gibbs sweeps per annealing step on its exact conditionals under the tempered "
        "target (the coefficients given the noise variance, Gaussian, then the noise variance given them, InvGamma; "
        "from the whole history's statistics: workers.sgais.gibbs_sweep) instead of its burn_in SGHMC steps; a "
        "one-component gmm, whose tempered target is normal-inverse-gamma, by one exact draw from it instead "
        "(workers.sgais.exact_draw; any positive value); 0 = SGHMC moves",
    )
    moves: Literal["adaptive", "every_step"] = Field(
        "adaptive",
        description="every_step: burn_in SGHMC moves after every annealing step (thesis Alg. 8); adaptive: a "
        "block absorbed in one annealing step that did not resample keeps its particles in place and its "
        "weights carry it (resample-move, Chopin 2002); blocks that need several steps, and every step that "
        "resamples, move as with every_step. A live feed then costs a likelihood evaluation per block most "
        "of the time (bench/README.md)",
    )
    ess_target: float = Field(
        0.9,
        gt=0,
        lt=1,
        description=(
            "target conditional ESS per annealing step, a fraction of particles "
            "(thesis: 0.5; 0.9 measured better on logistic regression, bench/README.md)"
        ),
    )
    resample_threshold: float = Field(
        0.5, ge=0, le=1, description="resample when ESS < this fraction of particles (0 = never)"
    )
    resampling: Literal["systematic", "multinomial"] = Field(
        "systematic", description="resampling scheme (thesis §3.4)"
    )
    max_annealing_steps: int = Field(1000, ge=1, le=1_000_000, description="guard per block; hitting it is reported")
    control_variates: bool = Field(
        True, description="mini-batch gradients with control variates around per-particle anchors"
    )
    anchor_growth: float = Field(2.0, gt=1, le=1000, description="re-anchor when the history has grown by this factor")
    restart_min_rows: int | None = Field(
        16,
        ge=1,
        description="a block of at least this many rows and at least as many as the history is absorbed by a fresh "
        "run from the prior over both (its evidence replaces the running one, as a re-annealing's does): SGHMC moves "
        "lag a posterior that contracts that fast, e.g. a stream's first values, which change-point models absorb in "
        "sub-blocks of 1, 2, 4, ... values; each restart at least doubles the history, so the replayed rows stay "
        "below twice the stream's. null = never",
    )
    history_capacity: int | None = Field(
        None,
        ge=1,
        description="reservoir size for the mini-batch history; null keeps everything. Biases the evidence once "
        "it is full (measured at n = 20,000 with 500: -4 nats on a gmm, -37 on a 5-feature regression, "
        "bench/conflict.py reservoir), so the model is then degraded, and it disables re-annealing",
    )
    reanneal_steps: int | None = Field(
        12,
        ge=1,
        le=1_000_000,
        description="a block after the warm-up that needs at least this many annealing steps (times "
        "max(1, sqrt(D/4)) for D parameters) marks a change: the particles are then re-annealed from the prior "
        "over the whole history in a random order, and the replay replaces the running particles and "
        "log-evidence; the jump is the trace row's log_evidence_correction (null = never; 1 = at every growth "
        "step of the history)",
    )
    reanneal_growth: float = Field(
        2.0, gt=1, le=1000, description="re-anneal at most once per this factor of history growth"
    )
    reanneal_horizon: float = Field(
        10.0,
        ge=1,
        le=1e6,
        description="after a change, keep re-annealing at each growth step until the history is this many times "
        "its size at the change (the posterior moves until the new data dominate the history)",
    )
    change_burn_in: int | None = Field(
        60,
        ge=0,
        le=10_000,
        description="SGHMC steps per annealing step for blocks within reanneal_horizon of a change, where the "
        "posterior keeps moving and burn_in steps lag it (bench/README.md), and the cap of the warm-up's "
        "burn_in · sqrt(D/4) for D parameters (workers.stacking.warmup_burn_in); null = burn_in throughout",
    )
    seed: int = Field(
        0, ge=0, lt=2**63, description="seed of the model's torch.Generator (checkpointed with the state)"
    )
    dtype: Literal["float32", "float64"] = Field(
        "float64", description="particle dtype; log-weights are always float64"
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu", description="torch device; auto = cuda when available (the service default comes from SGAIS_DEVICE)"
    )

    @model_validator(mode="after")
    def _check(self) -> SamplerSettings:
        if self.warmup_particles is not None and self.warmup_particles < self.particles:
            raise ValueError("warmup_particles must be at least particles")
        if self.ess_target * self.particles < 1:
            raise ValueError("ess_target * particles must be at least 1 particle")
        return self

    @property
    def initial_particles(self) -> int:
        return self.warmup_particles if self.warmup_particles is not None else self.particles

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32

    @property
    def torch_device(self) -> torch.device:
        """The ``device`` setting as a ``torch.device`` (``auto``: CUDA when available); read for every population
        in every round, so resolved once per setting (:func:`_torch_device`)."""
        return _torch_device(self.device)


@functools.cache
def _torch_device(device: str) -> torch.device:
    """``torch.device(device)``, ``auto`` resolved to ``cuda`` when a GPU is available (once per process: a
    ``torch.device`` and ``torch.cuda.is_available()`` per call cost microseconds a population and round)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
