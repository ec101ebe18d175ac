"""Bayesian autoregressive model AR(p) of one real series (papers/004, sliding-window embedding).

``y_t = Σ_{k<p} a_k y_{t−1−k} + c + ε_t``, ``a_k ~ N(coefficient_location, prior_std²)``,
``c ~ N(intercept_location, prior_std²)``, ``ε_t ~ N(0, σ²)`` with
``σ = noise_std`` known, or ``σ² ~ InvGamma(variance_shape, variance_scale)`` when ``noise_std`` is null.
The stream's first ``p`` values are conditioned on; with known noise the evidence
``log p(y_{p+1..n} | y_{1..p})`` is closed form (:func:`models.conjugate.autoregressive_log_evidence`).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch.distributions import constraints

from models.base import (
    Family,
    HyperParams,
    ParameterSpec,
    as_vector,
    check_nonempty_and_aligned,
    require_no_x,
)
from models.densities import (
    LinearGaussianStatistics,
    bmm,
    linear_gaussian_gradient,
    normal_log_prob,
    unknown_noise_gaussian_gradient,
    unknown_noise_prior_statistics,
)


class AutoregressiveParams(HyperParams):
    order: int = Field(..., ge=1, le=1_000, description="p, the number of lags")
    noise_std: float | None = Field(
        None, gt=0, description="known noise std; null = unknown variance with an inverse-gamma prior"
    )
    prior_std: float = Field(1.0, gt=0, description="prior standard deviation of the coefficients and the intercept")
    coefficient_location: float = Field(0.0, allow_inf_nan=False, description="prior mean of every coefficient a_k")
    intercept_location: float = Field(0.0, allow_inf_nan=False, description="prior mean of the intercept c")
    variance_shape: float = Field(1.0, gt=0, description="shape of the inverse-gamma prior on the noise variance")
    variance_scale: float = Field(1.0, gt=0, description="scale of the inverse-gamma prior on the noise variance")


class Autoregressive(LinearGaussianStatistics, Family):
    name = "autoregressive"
    prior = (
        "y_t = Σ a_k y_{t−k} + c + ε_t: a_k ~ N(coefficient_location, prior_std²), c ~ N(intercept_location, "
        "prior_std²); σ = noise_std, or σ² ~ InvGamma(variance_shape, variance_scale) when noise_std is null"
    )
    Params = AutoregressiveParams
    params: AutoregressiveParams

    def __init__(self, params=None):
        super().__init__(params)
        self.context_size = self.params.order

    @property
    def known_noise(self) -> bool:
        return self.params.noise_std is not None

    @property
    def unimodal(self) -> bool:
        """Known noise: a Gaussian target.  Unknown noise: the coefficients' prior does not scale with σ²
        (semi-conjugate), and a prior–data conflict can give the target two modes, so not claimed."""
        return self.known_noise

    @property
    def identifiable(self) -> bool:
        """Coefficients, intercept and noise variance are each determined by the likelihood (the two modes a
        conflict can make are not symmetric copies: the Laplace fit keeps the higher of its starts)."""
        return True

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

    def hyper(self) -> dict[str, float]:
        p = self.params
        hp = {
            "prior_std": p.prior_std,
            "variance_shape": p.variance_shape,
            "variance_scale": p.variance_scale,
            "coefficient_location": p.coefficient_location,
            "intercept_location": p.intercept_location,
        }
        if p.noise_std is not None:
            hp["noise_std"] = p.noise_std
        return hp

    def stack_key(self) -> tuple:
        """Order and whether the noise is known change shapes; every value is per model."""
        return (self.name, self.params.order, self.known_noise)

    def stacked_log_prior(self, values, hp):
        s, cl = hp["prior_std"], hp["coefficient_location"]
        lp = normal_log_prob(values["coefficients"], cl[..., None], s[..., None]).sum(-1)
        lp = lp + normal_log_prob(values["intercept"], hp["intercept_location"], s)
        if not self.known_noise:
            a, b, v = hp["variance_shape"], hp["variance_scale"], values["variance"]
            lp = lp + a * torch.log(b) - torch.lgamma(a) - (a + 1.0) * torch.log(v) - b / v  # InvGamma(a, b)
        return lp

    def stacked_log_likelihood(self, values, x, y, hp):
        """``coefficients: [K, M, p]``, ``intercept: [K, M]``, lags ``x: [K, B, p]``, ``y: [K, B]`` -> ``[K, M, B]``."""
        mean = bmm(values["coefficients"], x.transpose(1, 2)) + values["intercept"][..., None]
        std = hp["noise_std"][..., None] if self.known_noise else torch.sqrt(values["variance"])[..., None]
        return normal_log_prob(y[:, None, :], mean, std)

    analytic_gradients = True

    def stacked_grad_log_likelihood(self, theta, x, y, hp):
        """Closed form.  Known noise: as linear regression on the lags.  Unknown: with ``u = log σ²``,
        ``z = [x, 1]`` and ``r = y − θ·z``, ``∇_θ = Σ r z / σ²`` and ``∂_u = Σ (r²/σ² − 1) / 2``, both from
        the sums ``ZᵀZ``, ``Zᵀy``, ``yᵀy`` (``Σ r² = yᵀy − 2θ·Zᵀy + θᵀZᵀZθ``)."""
        if self.known_noise:
            return linear_gaussian_gradient(theta, x, y, hp["noise_std"] ** 2)
        return unknown_noise_gaussian_gradient(theta, x, y)

    @property
    def quadratic(self) -> bool:  # type: ignore[override]
        return self.known_noise

    @property
    def sufficient_statistics(self) -> bool:  # type: ignore[override]
        return not self.known_noise  # LinearGaussianStatistics: one gradient evaluation per SGHMC step

    @property
    def gibbs_conditionals(self) -> bool:  # type: ignore[override]
        return not self.known_noise  # θ | σ² Gaussian, σ² | θ InvGamma (LinearGaussianStatistics)

    def stacked_prior_pseudo_statistics(self, hp):
        """Unknown noise: the prior as statistics ``T0`` (:func:`models.densities.unknown_noise_prior_statistics`)."""
        m0 = self.prior_location(hp)  # [K, D]
        eye = torch.eye(m0.shape[-1], dtype=m0.dtype, device=m0.device)
        s2 = hp["prior_std"][..., None] ** 2  # [K, 1, 1]: coefficients and intercept ~ N(m₀, s²), whatever σ²
        return unknown_noise_prior_statistics(m0, hp["variance_shape"], hp["variance_scale"], precision=eye / s2)

    def prior_location(self, hp: dict[str, torch.Tensor]) -> torch.Tensor:
        """``m₀: [K, p+1]``, the prior mean of (coefficients, intercept) of each model of a stack."""
        cl = hp["coefficient_location"].expand(-1, self.params.order)
        return torch.cat([cl, hp["intercept_location"]], dim=-1)

    def stacked_grad_log_prior(self, theta, hp):
        """``−(θ − m₀)/s²`` on the coefficients and intercept; on ``u = log σ²`` (InvGamma(a, b) with its
        log-Jacobian ``u``): ``∂_u = −a + b e^{−u}``."""
        s2 = hp["prior_std"][..., None] ** 2
        m0 = self.prior_location(hp)[:, None, :]
        if self.known_noise:
            return -(theta - m0) / s2
        u = theta[..., -1:]
        du = -hp["variance_shape"][..., None] + hp["variance_scale"][..., None] * torch.exp(-u)
        return torch.cat([-(theta[..., :-1] - m0) / s2, du], dim=-1)

    def stacked_prior_statistics(self, hp):
        """``(A0 = I/s², c0 = m₀/s²)`` of ``∇ log p(θ) = c0 − θ A0`` (known noise)."""
        A0, _ = super().stacked_prior_statistics(hp)
        return A0, self.prior_location(hp) / hp["prior_std"] ** 2

    def sample_prior_constrained(self, generator, M, dtype, device):
        p = self.params
        out = {
            "coefficients": p.coefficient_location
            + p.prior_std * torch.randn(M, p.order, generator=generator, dtype=dtype, device=device),
            "intercept": p.intercept_location
            + p.prior_std * torch.randn(M, generator=generator, dtype=dtype, device=device),
        }
        if not self.known_noise:
            g = torch._standard_gamma(
                torch.full((M,), p.variance_shape, dtype=dtype, device=device), generator=generator
            )
            out["variance"] = p.variance_scale / g.clamp_min(torch.finfo(dtype).tiny)
        return out
