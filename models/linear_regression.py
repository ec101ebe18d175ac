"""Bayesian linear regression, with known noise (thesis §5.2.1) or unknown noise (normal–inverse-gamma).

``y = w^T x + b + eps``, ``eps ~ N(0, σ²)`` i.i.d.; ``x`` is the model's covariates (``params.features``:
all the stream's columns or a subset).

* Known noise (``noise_std`` = σ): ``w_j ~ N(weight_location, prior_std²)``, ``b ~ N(intercept_location,
  prior_std²)``, independent.  The evidence is Gaussian in closed form
  (:func:`models.conjugate.linear_regression_log_evidence`).
* Unknown noise (``noise_std`` null): the conjugate normal–inverse-gamma prior
  ``σ² ~ InvGamma(variance_shape, variance_scale)`` and ``(w, b) | σ² ~ N(m₀, weight_variance_ratio · σ² I)``
  with ``m₀ = (weight_location, …, intercept_location)``; the evidence is a multivariate Student-t
  (Murphy 2012, *MLPP* §7.6.3; :func:`models.conjugate.linear_regression_log_evidence`).  The sampler moves
  ``u = log σ²`` (``torch.distributions`` ``biject_to(positive)``, log-Jacobian ``u``).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch.distributions import constraints

from models.base import (
    CovariateParams,
    CovariateSubset,
    Family,
    ParameterSpec,
    as_vector,
    check_nonempty_and_aligned,
)
from models.densities import (
    LinearGaussianStatistics,
    bmm,
    linear_gaussian_gradient,
    normal_log_prob,
    unknown_noise_gaussian_gradient,
    unknown_noise_prior_statistics,
)


class LinearRegressionParams(CovariateParams):
    noise_std: float | None = Field(
        1.0,
        gt=0,
        description=(
            "σ, the known standard deviation of the Gaussian noise; null = unknown noise variance with the "
            "normal–inverse-gamma prior (variance_shape, variance_scale, weight_variance_ratio)"
        ),
    )
    prior_std: float = Field(
        1.0, gt=0, description="known noise: prior standard deviation of every weight and of the intercept"
    )
    weight_location: float = Field(0.0, allow_inf_nan=False, description="prior mean of every weight w_j")
    intercept_location: float = Field(0.0, allow_inf_nan=False, description="prior mean of the intercept b")
    variance_shape: float = Field(
        1.0, gt=0, description="unknown noise: shape a₀ of the inverse-gamma prior on the noise variance σ²"
    )
    variance_scale: float = Field(
        1.0, gt=0, description="unknown noise: scale b₀ of the inverse-gamma prior on the noise variance σ²"
    )
    weight_variance_ratio: float = Field(
        1.0,
        gt=0,
        description=(
            "unknown noise: prior variance of every weight and of the intercept given σ², in units of σ² "
            "((w, b) | σ² ~ N(m₀, weight_variance_ratio · σ² I))"
        ),
    )


class LinearRegression(CovariateSubset, LinearGaussianStatistics, Family):
    name = "linear_regression"
    covariate_axes = {"w": 0}
    prior = (
        "y = wᵀx + b + ε, ε ~ N(0, σ²). Known noise (noise_std = σ): w_j ~ N(weight_location, prior_std²), "
        "b ~ N(intercept_location, prior_std²). Unknown noise (noise_std null): σ² ~ InvGamma(variance_shape, "
        "variance_scale), (w, b) | σ² ~ N((weight_location, intercept_location), weight_variance_ratio·σ² I)"
    )
    Params = LinearRegressionParams
    params: LinearRegressionParams

    @property
    def known_noise(self) -> bool:
        return self.params.noise_std is not None

    def parameter_specs(self) -> list[ParameterSpec]:
        specs = [ParameterSpec("w", (self.params.n_features,)), ParameterSpec("b", ())]
        if not self.known_noise:
            specs.append(ParameterSpec("noise_variance", (), constraints.positive))
        return specs

    def observation_schema(self) -> dict[str, Any]:
        return {**self.x_schema(), "y": [], "y_type": "real", "classes": None}

    def validate_stream(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: rows of the stream's ``columns`` numbers; ``y``: numbers.  Returns ``(x: [B, columns], y: [B])``;
        :meth:`validate` then keeps the model's ``features``, ``x: [B, d]``."""
        xt = self.stream_covariates(x, self.name)
        yt = as_vector(y, "y")
        check_nonempty_and_aligned(xt, yt)
        return xt, yt

    def hyper(self) -> dict[str, float]:
        p = self.params
        hp = {
            "prior_std": p.prior_std,
            "weight_location": p.weight_location,
            "intercept_location": p.intercept_location,
        }
        if p.noise_std is not None:
            hp["noise_std"] = p.noise_std
        else:
            hp.update(
                variance_shape=p.variance_shape,
                variance_scale=p.variance_scale,
                weight_variance_ratio=p.weight_variance_ratio,
            )
        return hp

    def prior_location(self, hp: dict[str, torch.Tensor]) -> torch.Tensor:
        """``m₀: [K, d+1]``, the prior mean of ``θ = (w, b)`` of each model of a stack."""
        d = self.params.n_features
        return torch.cat([hp["weight_location"].expand(-1, d), hp["intercept_location"]], dim=-1)

    def stacked_log_prior(self, values, hp):
        """``[K, M]`` (nats): independent normals (known noise), or NIG: ``InvGamma(σ²; a₀, b₀) ·
        N((w, b); m₀, r σ² I)`` with ``r = weight_variance_ratio``."""
        wl, bl = hp["weight_location"], hp["intercept_location"]
        if self.known_noise:
            s = hp["prior_std"]  # [K, 1]
            return normal_log_prob(values["w"], wl[..., None], s[..., None]).sum(-1) + normal_log_prob(
                values["b"], bl, s
            )
        a, b0, v = hp["variance_shape"], hp["variance_scale"], values["noise_variance"]
        s = torch.sqrt(hp["weight_variance_ratio"] * v)  # [K, M]
        lp = normal_log_prob(values["w"], wl[..., None], s[..., None]).sum(-1) + normal_log_prob(values["b"], bl, s)
        return lp + a * torch.log(b0) - torch.lgamma(a) - (a + 1.0) * torch.log(v) - b0 / v

    def stacked_log_likelihood(self, values, x, y, hp):
        """``w: [K, M, d]``, ``b: [K, M]``, ``x: [K, B, d]``, ``y: [K, B]`` -> ``[K, M, B]`` (nats)."""
        mean = bmm(values["w"], x.transpose(1, 2)) + values["b"][..., None]
        std = hp["noise_std"][..., None] if self.known_noise else torch.sqrt(values["noise_variance"])[..., None]
        return normal_log_prob(y[:, None, :], mean, std)

    analytic_gradients = True

    def stacked_grad_log_likelihood(self, theta, x, y, hp):
        """Closed form, ``[K, M, D]``.  Known noise: ``r = (y − w·x − b) / σ²``; ``∇_w = Σ_b r_b x_b``,
        ``∇_b = Σ_b r_b``.  Unknown: with ``u = log σ²``, ``z = [x, 1]``, ``e = y − θ·z``: ``∇_θ = Σ e z / σ²``,
        ``∂_u = (Σ e²/σ² − B) / 2``, from the block sums ``ZᵀZ``, ``Zᵀy``, ``yᵀy`` (O(B·D²), not O(M·B·D))."""
        if self.known_noise:
            return linear_gaussian_gradient(theta, x, y, hp["noise_std"] ** 2)
        return unknown_noise_gaussian_gradient(theta, x, y)

    def stacked_grad_log_prior(self, theta, hp):
        """Known noise: ``−(θ − m₀)/s²``.  Unknown (NIG, ``u = log σ²`` with its log-Jacobian ``u``, ``D = d+1``,
        ``Q = |θ − m₀|²``): ``∇_θ = −(θ − m₀)/(r σ²)``, ``∂_u = −a₀ + b₀/σ² + Q/(2 r σ²) − D/2``."""
        m0 = self.prior_location(hp)[:, None, :]  # [K, 1, d+1]
        if self.known_noise:
            return -(theta - m0) / hp["prior_std"][..., None] ** 2
        lin, u = theta[..., :-1] - m0, theta[..., -1:]
        iv = torch.exp(-u) / hp["weight_variance_ratio"][..., None]  # 1/(r σ²)
        g_lin = -lin * iv
        a, b0 = hp["variance_shape"][..., None], hp["variance_scale"][..., None]
        du = -a + b0 * torch.exp(-u) - 0.5 * (lin * g_lin).sum(-1, keepdim=True) - 0.5 * lin.shape[-1]
        return torch.cat([g_lin, du], dim=-1)

    @property
    def unimodal(self) -> bool:
        """Known noise: a Gaussian target.  Unknown noise: the posterior is normal–inverse-gamma, whose only
        stationary point in ``(w, b, log σ²)`` is the posterior mean of ``(w, b)`` with one ``log σ²``."""
        return True

    @property
    def identifiable(self) -> bool:
        """Weights, intercept and noise variance are each determined by the likelihood."""
        return True

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
        r = hp["weight_variance_ratio"][..., None]  # [K, 1, 1]: θ | σ² ~ N(m₀, r σ²) (normal–inverse-gamma)
        return unknown_noise_prior_statistics(m0, hp["variance_shape"], hp["variance_scale"], nig_precision=eye / r)

    def stacked_prior_statistics(self, hp):
        """``(A0 = I/s², c0 = m₀/s²)`` of ``∇ log p(θ) = c0 − θ A0`` (known noise)."""
        A0, _ = super().stacked_prior_statistics(hp)
        return A0, self.prior_location(hp) / hp["prior_std"] ** 2

    def sample_prior_constrained(self, generator, M, dtype, device):
        p = self.params
        d = p.n_features
        zw = torch.randn(M, d, generator=generator, dtype=dtype, device=device)
        zb = torch.randn(M, generator=generator, dtype=dtype, device=device)
        extra: dict[str, torch.Tensor] = {}
        if self.known_noise:
            sw: Any = p.prior_std
            sb: Any = p.prior_std
        else:
            g = torch._standard_gamma(
                torch.full((M,), p.variance_shape, dtype=dtype, device=device), generator=generator
            )
            var = p.variance_scale / g.clamp_min(torch.finfo(dtype).tiny)  # InvGamma(a, b) = b / Gamma(a, 1)
            sb = torch.sqrt(p.weight_variance_ratio * var)  # [M]
            sw = sb[:, None]
            extra["noise_variance"] = var
        return {"w": p.weight_location + sw * zw, "b": p.intercept_location + sb * zb, **extra}
