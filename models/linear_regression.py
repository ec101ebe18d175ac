"""Bayesian linear regression with known Gaussian noise (thesis §5.2.1).

``y = w^T x + b + eps``, ``eps ~ N(0, noise_std^2)``, ``w_j, b ~ N(0, prior_std^2)``.
The evidence is Gaussian in closed form (:func:`models.conjugate.linear_regression_log_evidence`).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from models.base import (
    Family,
    HyperParams,
    ParameterSpec,
    as_matrix,
    as_vector,
    check_nonempty_and_aligned,
    require_x,
)
from models.densities import (
    LinearGaussianStatistics,
    bmm,
    linear_gaussian_gradient,
    normal_log_prob,
)


class LinearRegressionParams(HyperParams):
    features: int = Field(..., ge=1, le=10_000, description="d, the number of covariates")
    noise_std: float = Field(1.0, gt=0, description="known standard deviation of the Gaussian noise")
    prior_std: float = Field(1.0, gt=0, description="prior standard deviation of w and b")


class LinearRegression(LinearGaussianStatistics, Family):
    name = "linear_regression"
    Params = LinearRegressionParams
    params: LinearRegressionParams

    def parameter_specs(self) -> list[ParameterSpec]:
        return [ParameterSpec("w", (self.params.features,)), ParameterSpec("b", ())]

    def observation_schema(self) -> dict[str, Any]:
        return {"x": self.params.features, "y": [], "y_type": "real", "classes": None}

    def validate(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        require_x(x, self.name)
        yt = as_vector(y, "y")
        xt = as_matrix(x, "x", self.params.features)
        check_nonempty_and_aligned(xt, yt)
        return xt, yt

    def hyper(self) -> dict[str, float]:
        return {"noise_std": self.params.noise_std, "prior_std": self.params.prior_std}

    def stacked_log_prior(self, values, hp):
        s = hp["prior_std"]  # [K, 1]
        return normal_log_prob(values["w"], 0.0, s[..., None]).sum(-1) + normal_log_prob(values["b"], 0.0, s)

    def stacked_log_likelihood(self, values, x, y, hp):
        """``w: [K, M, d]``, ``b: [K, M]``, ``x: [K, B, d]``, ``y: [K, B]`` -> ``[K, M, B]`` (nats)."""
        mean = bmm(values["w"], x.transpose(1, 2)) + values["b"][..., None]
        return normal_log_prob(y[:, None, :], mean, hp["noise_std"][..., None])

    analytic_gradients = True

    def stacked_grad_log_likelihood(self, theta, x, y, hp):
        """Closed form: ``r = (y − w·x − b) / σ²``; ``∇_w = Σ_b r_b x_b``, ``∇_b = Σ_b r_b``. ``[K, M, D]``."""
        return linear_gaussian_gradient(theta, x, y, hp["noise_std"] ** 2)

    def stacked_grad_log_prior(self, theta, hp):
        """``−θ / prior_std²`` (w and b are unconstrained, so no Jacobian term)."""
        return -theta / hp["prior_std"][..., None] ** 2

    quadratic = True

    def sample_prior_constrained(self, generator, M, dtype, device):
        s = self.params.prior_std
        d = self.params.features
        return {
            "w": s * torch.randn(M, d, generator=generator, dtype=dtype, device=device),
            "b": s * torch.randn(M, generator=generator, dtype=dtype, device=device),
        }
