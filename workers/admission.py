"""Admission control at model creation (API.md "Models", issue 11): can a worker run this model?

A model the worker cannot run used to be accepted with 201 and then killed every worker that leased it
(``sampler.device: cuda`` on a CPU host; a gmm with dim 1000 and components 1000: hardening review F1).
:func:`check` refuses such a model up front, naming the field at fault.

Estimates (order of magnitude, deliberately simple; the limits are settings):

- **Memory** (bytes): ``bytes · (10 · M · D + 4 · M · (B + S) · w + H · v)`` with ``M`` the initial
  particles (``warmup_particles`` or ``particles``), ``D`` the unconstrained parameter dimension,
  ``B`` the mini-batch size, ``S`` the block size, ``w`` the likelihood's intermediate elements per
  observation and particle (:func:`intermediate_width`; a gmm's ``[M, B, K, d]`` squared distances
  give ``w = K·d``), ``H`` the history reservoir (``history_capacity``) and ``v`` the values per
  observation.  Ten copies of the particles cover θ, momentum, gradients, control-variate anchors and
  their gradients, the preconditioner and scratch; four of the intermediates cover autograd's saved
  tensors.
- **Time per block** (seconds): one annealing step of ``max(burn_in, change_burn_in)`` SGHMC steps,
  each a likelihood and gradient on the mini-batch (``≈ 6 · D`` element operations per observation and
  particle: forward ``2·D``, backward twice that), plus the block's log-likelihood for the weights:
  ``(steps · 6·D·M·B + 2·D·M·S) / rate`` with ``rate`` = ``admission_flops_per_second``.  A block needs
  at least one annealing step, so this is a lower bound on its time.

When the estimate is over a limit the error names ``params`` if the family is too large even with the
default sampler settings, else the sampler setting furthest above its default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from models import Family
from workers.config import Settings
from workers.settings import SamplerSettings

COPIES_OF_PARTICLES = 10
COPIES_OF_INTERMEDIATES = 4
OPS_PER_PARAMETER = 6  # forward 2·D + backward ≈ 4·D element operations per observation and particle
_SAMPLER_FIELDS = ("particles", "warmup_particles", "batch_size", "block_size", "burn_in", "change_burn_in")


@dataclass(frozen=True)
class Estimate:
    """Estimated worker cost of one model."""

    memory_bytes: float
    block_seconds: float


def intermediate_width(family: Family) -> int:
    """Elements of the likelihood's largest intermediate per observation and particle."""
    p: Any = family.params
    if family.name == "gmm":
        return p.components * p.dim
    if family.name == "logistic_regression":
        return p.classes
    if family.name == "bnn":
        return sum(p.hidden) + p.outputs
    if family.name in ("linear_regression", "autoregressive"):
        return 1
    return family.dim  # unknown family: as large as the parameter vector


def observation_width(family: Family) -> int:
    schema = family.observation_schema()
    return int(schema.get("x") or 0) + int(math.prod(schema.get("y") or [1]))


def estimate(family: Family, sampler: SamplerSettings, rate: float) -> Estimate:
    """Estimated memory (bytes) and time per block (seconds) of ``family`` run with ``sampler``."""
    D, M = family.dim, sampler.initial_particles
    B, S = sampler.batch_size, sampler.block_size
    size = 4 if sampler.dtype == "float32" else 8
    history = (sampler.history_capacity or 0) * observation_width(family)
    memory = size * (
        COPIES_OF_PARTICLES * M * D + COPIES_OF_INTERMEDIATES * M * (B + S) * intermediate_width(family) + history
    )
    steps = max(sampler.burn_in, sampler.change_burn_in or 0)
    ops = steps * OPS_PER_PARAMETER * D * M * B + 2 * D * M * S
    return Estimate(float(memory), ops / rate)


def _culprit(family: Family, sampler: SamplerSettings, over: str, settings: Settings) -> list[str]:
    """``loc`` of the field at fault for going ``over`` ("memory" or "time")."""
    default = SamplerSettings.model_validate({"device": sampler.device, "dtype": sampler.dtype})
    base = estimate(family, default, settings.admission_flops_per_second)
    if over == "memory" and sampler.history_capacity:
        history = sampler.history_capacity * observation_width(family) * (4 if sampler.dtype == "float32" else 8)
        if history > settings.admission_max_memory_bytes / 2:
            return ["body", "sampler", "history_capacity"]
    if (over == "memory" and base.memory_bytes > settings.admission_max_memory_bytes) or (
        over == "time" and base.block_seconds > settings.admission_max_block_seconds
    ):
        return ["body", "params"]
    ratios = {}
    for name in _SAMPLER_FIELDS:
        mine, theirs = getattr(sampler, name), getattr(default, name)
        if mine and theirs:
            ratios[name] = mine / theirs
    return ["body", "sampler", max(ratios, key=lambda k: ratios[k])] if ratios else ["body", "sampler"]


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def check(family: Family, sampler: SamplerSettings, settings: Settings) -> list[dict[str, Any]]:
    """Reasons the worker cannot run this model, as FastAPI-style 422 error entries (empty = admitted).

    The device is checked on the host of the API process; deployments whose workers run elsewhere
    set ``SGAIS_DEVICE`` / the sampler's device accordingly.
    """
    errors: list[dict[str, Any]] = []
    if sampler.device == "cuda" and not cuda_available():
        errors.append(
            {
                "loc": ["body", "sampler", "device"],
                "type": "device_unavailable",
                "msg": "device 'cuda' is not available on this service (no CUDA); use 'cpu' or 'auto'",
            }
        )
    est = estimate(family, sampler, settings.admission_flops_per_second)
    D, M, B = family.dim, sampler.initial_particles, sampler.batch_size
    sizes = f"(D={D} parameters, {M} particles, batch_size {B})"
    if est.memory_bytes > settings.admission_max_memory_bytes:
        errors.append(
            {
                "loc": _culprit(family, sampler, "memory", settings),
                "type": "over_memory_limit",
                "msg": f"estimated worker memory {est.memory_bytes / 2**20:.0f} MiB {sizes} exceeds the limit "
                f"{settings.admission_max_memory_bytes / 2**20:.0f} MiB (SGAIS_ADMISSION_MAX_MEMORY_BYTES)",
            }
        )
    if est.block_seconds > settings.admission_max_block_seconds:
        errors.append(
            {
                "loc": _culprit(family, sampler, "time", settings),
                "type": "over_time_limit",
                "msg": f"estimated time per block {est.block_seconds:.3g} s {sizes} exceeds the limit "
                f"{settings.admission_max_block_seconds:g} s (SGAIS_ADMISSION_MAX_BLOCK_SECONDS)",
            }
        )
    return errors
