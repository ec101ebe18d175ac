"""Bayesian autoregressive model AR(p) of one real series (papers/004, sliding-window embedding).

``y_t = Σ_{k<p} a_k y_{t−1−k} + c + ε_t``, ``a_k, c ~ N(0, prior_std²)``, ``ε_t ~ N(0, σ²)`` with
``σ = noise_std`` known, or ``σ² ~ InvGamma(variance_shape, variance_scale)`` when ``noise_std`` is null.
The stream's first ``p`` values are conditioned on; with known noise the evidence
``log p(y_{p+1..n} | y_{1..p})`` is closed form (:func:`models.conjugate.autoregressive_log_evidence`).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch.distributions import InverseGamma, constraints

from models.base import (
    Family,
    HyperParams,
    ParameterSpec,
    as_vector,
    check_nonempty_and_aligned,
    normal_log_prob,
    require_no_x,
)


class AutoregressiveParams(HyperParams):
    order: int = Field(..., ge=1, le=1_000, description="p, the number of lags")
    noise_std: float | None = Field(
        None, gt=0, description="known noise std; null = unknown variance with an inverse-gamma prior"
    )
    prior_std: float = Field(1.0, gt=0, description="prior standard deviation of the coefficients and the intercept")
    variance_shape: float = Field(1.0, gt=0, description="shape of the inverse-gamma prior on the noise variance")
    variance_scale: float = Field(1.0, gt=0, description="scale of the inverse-gamma prior on the noise variance")


class Autoregressive(Family):
    name = "autoregressive"
    Params = AutoregressiveParams

    def __init__(self, params=None):
        super().__init__(params)
        self.context_size = self.params.order

    @property
    def known_noise(self) -> bool:
        return self.params.noise_std is not None

    def parameter_specs(self) -> list[ParameterSpec]:
        specs = [ParameterSpec("coefficients", (self.params.order,)), ParameterSpec("intercept", ())]
        if not self.known_noise:
            specs.append(ParameterSpec("variance", (), constraints.positive))
        return specs

    def observation_schema(self) -> dict[str, Any]:
        return {"x": None, "y": [], "y_type": "real", "classes": None}

    def validate(self, x: Any, y: Any) -> tuple[None, torch.Tensor]:
        """``y``: the next values of the series; ``x`` must be absent. Returns ``(None, y: [B])``."""
        require_no_x(x, self.name)
        yt = as_vector(y, "y")
        check_nonempty_and_aligned(None, yt)
        return None, yt

    def prepare(self, x, y, context):
        """Lag rows for the block ``y: [B]`` given the previous values ``context: [≤ p]``.

        Returns ``(lags: [B', p], targets: [B'], new_context: [≤ p])``; column k of ``lags``
        holds ``y_{t−1−k}``.  Values among the stream's first ``p`` yield no row, so
        ``B' = B`` once ``p`` values have been seen.
        """
        p = self.params.order
        full = y if context is None else torch.cat([context.to(y), y])
        if full.shape[0] <= p:
            return y.new_zeros(0, p), y.new_zeros(0), full.clone()
        lags = full.unfold(0, p, 1)[:-1].flip(-1)  # row i: full[i+p-1], ..., full[i]
        return lags.contiguous(), full[p:].clone(), full[-p:].clone()

    def _variance(self, values: dict[str, torch.Tensor]) -> torch.Tensor | float:
        return self.params.noise_std**2 if self.known_noise else values["variance"]

    def log_prior_constrained(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        s = self.params.prior_std
        lp = normal_log_prob(values["coefficients"], 0.0, s).sum(-1) + normal_log_prob(values["intercept"], 0.0, s)
        if not self.known_noise:
            v = values["variance"]
            shape = torch.tensor(self.params.variance_shape, dtype=v.dtype, device=v.device)
            scale = torch.tensor(self.params.variance_scale, dtype=v.dtype, device=v.device)
            lp = lp + InverseGamma(shape, scale, validate_args=False).log_prob(v)
        return lp

    def log_likelihood_constrained(self, values, x, y):
        """``coefficients: [M, p]``, ``intercept: [M]``, lag rows ``x: [B, p]``, ``y: [B]`` -> ``[M, B]``."""
        mean = values["coefficients"] @ x.T + values["intercept"][:, None]  # [M, B]
        var = self._variance(values)
        std = var**0.5 if isinstance(var, float) else torch.sqrt(var)[:, None]
        return normal_log_prob(y[None, :], mean, std)

    def sample_prior_constrained(self, generator, M, dtype, device):
        p = self.params
        out = {
            "coefficients": p.prior_std * torch.randn(M, p.order, generator=generator, dtype=dtype, device=device),
            "intercept": p.prior_std * torch.randn(M, generator=generator, dtype=dtype, device=device),
        }
        if not self.known_noise:
            g = torch._standard_gamma(
                torch.full((M,), p.variance_shape, dtype=dtype, device=device), generator=generator
            )
            out["variance"] = p.variance_scale / g.clamp_min(torch.finfo(dtype).tiny)
        return out
