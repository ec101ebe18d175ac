"""Bayesian multinomial logistic regression (thesis §5.2.2).

``p(y = k | x, W, b) = softmax(W x + b)_k`` with ``W: [K, d]``, ``b: [K]``, every entry
``~ N(0, prior_std²)``.  Labels are ``0..K-1``.  No closed-form evidence.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from models.base import (
    CovariateParams,
    CovariateSubset,
    Family,
    ParameterSpec,
    as_labels,
    check_nonempty_and_aligned,
)
from models.densities import bmm, normal_log_prob


class LogisticRegressionParams(CovariateParams):
    classes: int = Field(..., ge=2, le=10_000, description="K, the number of classes (labels 0..K-1)")
    prior_std: float = Field(1.0, gt=0, description="prior standard deviation of W and b")


class LogisticRegression(CovariateSubset, Family):
    name = "logistic_regression"
    covariate_axes = {"W": 1}
    prior = "p(y = k | x) = softmax(W x + b)_k; every entry of W and b ~ N(0, prior_std²)"
    Params = LogisticRegressionParams
    params: LogisticRegressionParams

    def parameter_specs(self) -> list[ParameterSpec]:
        p = self.params
        return [ParameterSpec("W", (p.classes, p.n_features)), ParameterSpec("b", (p.classes,))]

    @property
    def unimodal(self) -> bool:
        """The softmax log-likelihood is concave in ``(W, b)`` and the Gaussian prior strictly so: one mode."""
        return True

    @property
    def identifiable(self) -> bool:
        """No symmetric modes: the strictly concave target has one (a shift common to every class's weights is
        pinned down by the prior)."""
        return True

    def observation_schema(self) -> dict[str, Any]:
        return {**self.x_schema(), "y": [], "y_type": "label", "classes": self.params.classes}

    def validate_stream(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: rows of the stream's ``columns`` numbers; ``y``: integer labels in ``0..classes-1``.

        Returns ``(x: [B, columns], y: [B])`` float64 (labels as whole numbers); :meth:`validate` then keeps
        the model's ``features``, ``x: [B, d]``.
        """
        xt = self.stream_covariates(x, self.name)
        yt = as_labels(y, "y", self.params.classes)
        check_nonempty_and_aligned(xt, yt)
        return xt, yt

    def hyper(self) -> dict[str, float]:
        return {"prior_std": self.params.prior_std}

    def stacked_log_prior(self, values, hp):
        s = hp["prior_std"]
        lp = normal_log_prob(values["W"], 0.0, s[..., None, None]).sum((-2, -1))
        return lp + normal_log_prob(values["b"], 0.0, s[..., None]).sum(-1)

    def stacked_log_likelihood(self, values, x, y, hp):
        """``W: [K, M, C, d]``, ``b: [K, M, C]``, ``x: [K, B, d]``, ``y: [K, B]`` -> ``[K, M, B]`` (nats)."""
        K, M, C, d = values["W"].shape
        logits = bmm(values["W"].reshape(K, M * C, d), x.transpose(1, 2))  # [K, M·C, B]
        logits = logits.reshape(K, M, C, -1).transpose(2, 3) + values["b"][:, :, None, :]  # [K, M, B, C]
        logp = torch.log_softmax(logits, dim=-1)
        idx = y.long()[:, None, :, None].expand(K, M, -1, 1)
        return logp.gather(-1, idx)[..., 0]

    def sample_prior_constrained(self, generator, M, dtype, device):
        p = self.params
        s = p.prior_std
        return {
            "W": s * torch.randn(M, p.classes, p.n_features, generator=generator, dtype=dtype, device=device),
            "b": s * torch.randn(M, p.classes, generator=generator, dtype=dtype, device=device),
        }
