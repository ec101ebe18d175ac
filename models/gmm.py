"""Gaussian mixture with diagonal covariances, latent assignments marginalised (thesis §5.2.3).

``p(y | θ) = Σ_k β_k Π_j N(y_j; μ_kj, σ²_kj)`` with ``β ~ Dirichlet(α 1_K)``,
``σ²_kj ~ InvGamma(variance_shape, variance_scale)`` and
``μ_kj | σ²_kj ~ N(mean_location, mean_variance_ratio·σ²_kj)`` (``mean_variance_ratio`` was called
``mean_scale`` before; the old name is still accepted).
With one component the evidence is closed form
(:func:`models.conjugate.gmm_one_component_log_evidence`).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field, model_validator
from torch.distributions import constraints

from models.base import (
    Family,
    HyperParams,
    ParameterSpec,
    as_matrix,
    check_nonempty_and_aligned,
    require_no_x,
)
from models.densities import LOG_2PI


class GaussianMixtureParams(HyperParams):
    dim: int = Field(..., ge=1, le=1_000, description="d, the dimension of one observation")
    components: int = Field(..., ge=1, le=1_000, description="K, the number of mixture components")
    dirichlet_alpha: float = Field(1.0, gt=0, description="α of the symmetric Dirichlet prior on the weights")
    variance_shape: float = Field(1.0, gt=0, description="shape of the inverse-gamma prior on each variance")
    variance_scale: float = Field(1.0, gt=0, description="scale of the inverse-gamma prior on each variance")
    mean_location: float = Field(0.0, allow_inf_nan=False, description="prior mean of each component mean μ_kj")
    mean_variance_ratio: float = Field(
        4.0,
        gt=0,
        description=(
            "prior variance of each component mean, in units of its component variance: "
            "μ_kj | σ²_kj ~ N(mean_location, mean_variance_ratio·σ²_kj) (κ₀ = 1/ratio). "
            "Formerly `mean_scale` (a variance ratio despite its name; still accepted, same meaning)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data: Any) -> Any:
        """Accept the old name ``mean_scale`` for ``mean_variance_ratio`` (same value, same meaning)."""
        if isinstance(data, dict) and "mean_scale" in data:
            data = dict(data)
            if "mean_variance_ratio" in data:
                raise ValueError("mean_scale is the old name of mean_variance_ratio: give one of them")
            data["mean_variance_ratio"] = data.pop("mean_scale")
        return data


class GaussianMixture(Family):
    name = "gmm"
    prior = (
        "β ~ Dirichlet(dirichlet_alpha), σ²_kj ~ InvGamma(variance_shape, variance_scale), "
        "μ_kj | σ²_kj ~ N(mean_location, mean_variance_ratio·σ²_kj)"
    )
    Params = GaussianMixtureParams
    params: GaussianMixtureParams

    def parameter_specs(self) -> list[ParameterSpec]:
        K, d = self.params.components, self.params.dim
        return [
            ParameterSpec("weights", (K,), constraints.simplex),
            ParameterSpec("means", (K, d)),
            ParameterSpec("variances", (K, d), constraints.positive),
        ]

    def observation_schema(self) -> dict[str, Any]:
        d = self.params.dim
        return {"x": None, "y": [] if d == 1 else [d], "y_type": "real", "classes": None}

    def validate(self, x: Any, y: Any) -> tuple[None, torch.Tensor]:
        """``y``: numbers (dim = 1) or rows of ``dim`` numbers; no ``x``. Returns ``(None, y: [B, dim])``."""
        require_no_x(x, self.name)
        yt = as_matrix(y, "y", self.params.dim)
        check_nonempty_and_aligned(None, yt)
        return None, yt

    def hyper(self) -> dict[str, float]:
        p = self.params
        return {
            "dirichlet_alpha": p.dirichlet_alpha,
            "variance_shape": p.variance_shape,
            "variance_scale": p.variance_scale,
            "mean_variance_ratio": p.mean_variance_ratio,
            "mean_location": p.mean_location,
        }

    def stacked_log_prior(self, values, hp):
        """Dirichlet(α) + InvGamma(shape, scale) + N(mean_location, mean_variance_ratio·σ²) log densities,
        ``[K, M]`` (nats).

        Written out (same as ``torch.distributions.Dirichlet`` / ``InverseGamma`` log_prob, checked
        in tests) with per-model hyperparameters ``hp: {name: [K, 1]}``.
        """
        C = self.params.components
        w, mu, var = values["weights"], values["means"], values["variances"]
        alpha, a, b, ms = (
            hp[k] for k in ("dirichlet_alpha", "variance_shape", "variance_scale", "mean_variance_ratio")
        )
        lp = torch.lgamma(C * alpha) - C * torch.lgamma(alpha) + (alpha - 1.0) * torch.log(w).sum(-1)
        a3, b3, ms3 = a[..., None, None], b[..., None, None], ms[..., None, None]
        log_var = torch.log(var)
        lp = lp + (a3 * torch.log(b3) - torch.lgamma(a3) - (a3 + 1.0) * log_var - b3 / var).sum((-2, -1))
        mu = mu - hp["mean_location"][..., None, None]
        z2 = mu * mu / (ms3 * var)
        return lp + (-0.5 * z2 - 0.5 * (torch.log(ms3) + log_var) - 0.5 * LOG_2PI).sum((-2, -1))

    def stacked_log_likelihood(self, values, x, y, hp):
        """``weights: [K, M, C]``, ``means, variances: [K, M, C, d]``, ``y: [K, B, d]`` -> ``[K, M, B]`` (nats)."""
        mu, var = values["means"], values["variances"]
        if y.ndim == 2:
            y = y[..., None]
        z2 = (y[:, None, :, None, :] - mu[:, :, None]) ** 2 / var[:, :, None]  # [K, M, B, C, d]
        comp = -0.5 * (z2.sum(-1) + torch.log(var).sum(-1)[:, :, None, :] + y.shape[-1] * LOG_2PI)
        return torch.logsumexp(torch.log(values["weights"])[:, :, None, :] + comp, dim=-1)

    @property
    def analytic_gradients(self) -> bool:  # type: ignore[override]
        """One component: closed-form gradients from the block's sums (no per-observation work)."""
        return self.params.components == 1

    def stacked_grad_log_likelihood(self, theta, x, y, hp):
        """One component, ``θ = [μ, u = log σ²]`` (the simplex of one weight has no coordinate), with the
        block's sums ``S0 = B``, ``S1 = Σ y``, ``S2 = Σ y²``: ``∂_μ = (S1 − μ S0)/σ²`` and
        ``∂_u = ((S2 − 2μ S1 + μ² S0)/σ² − S0) / 2``.  ``[K, M, 2d]``."""
        if self.params.components != 1:
            return super().stacked_grad_log_likelihood(theta, x, y, hp)
        if y.ndim == 2:
            y = y[..., None]
        d = self.params.dim
        mu, iv = theta[..., :d], torch.exp(-theta[..., d:])
        S0, S1, S2 = float(y.shape[1]), y.sum(1)[:, None, :], (y * y).sum(1)[:, None, :]
        g_u = 0.5 * ((S2 - 2.0 * mu * S1 + mu * mu * S0) * iv - S0)
        return torch.cat([(S1 - mu * S0) * iv, g_u], dim=-1)

    def stacked_grad_log_prior(self, theta, hp):
        """One component: ``μ | σ² ~ N(m, ms·σ²)``, ``σ² ~ InvGamma(a, b)`` with the log-Jacobian ``u``
        (``m = mean_location``, ``ms = mean_variance_ratio``): ``∂_μ = −(μ − m)/(ms σ²)``,
        ``∂_u = −a + b/σ² + (μ − m)²/(2 ms σ²) − 1/2``.  ``[K, M, 2d]``."""
        if self.params.components != 1:
            return super().stacked_grad_log_prior(theta, hp)
        d = self.params.dim
        a, b, ms, m = (
            hp[k][..., None] for k in ("variance_shape", "variance_scale", "mean_variance_ratio", "mean_location")
        )
        mu, iv = theta[..., :d] - m, torch.exp(-theta[..., d:])
        g_mu = -mu * iv / ms
        return torch.cat([g_mu, -a + b * iv - 0.5 * mu * g_mu - 0.5], dim=-1)

    def sample_prior_constrained(self, generator, M, dtype, device):
        p = self.params
        K, d = p.components, p.dim
        g = torch._standard_gamma(
            torch.full((M, K), p.dirichlet_alpha, dtype=dtype, device=device), generator=generator
        )
        tiny = torch.finfo(dtype).tiny  # a Gamma draw can underflow to 0 for small shapes
        g = g.clamp_min(tiny)
        weights = g / g.sum(-1, keepdim=True)
        gv = torch._standard_gamma(
            torch.full((M, K, d), p.variance_shape, dtype=dtype, device=device), generator=generator
        )
        var = p.variance_scale / gv.clamp_min(tiny)  # InvGamma(shape, scale) = scale / Gamma(shape, 1)
        z = torch.randn(M, K, d, generator=generator, dtype=dtype, device=device)
        means = p.mean_location + torch.sqrt(p.mean_variance_ratio * var) * z
        return {"weights": weights, "means": means, "variances": var}
