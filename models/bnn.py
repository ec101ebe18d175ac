"""Bayesian neural network: an MLP with tanh hidden layers (papers/004, §3; papers/002).

Layers ``l = 0..L``: ``h_{l+1} = tanh(W_l h_l + b_l)`` for hidden layers, linear output
``f(x) = W_L h_L + b_L``; every weight and bias ``~ N(0, prior_std²)``.  Likelihood:
``gaussian`` — ``y ~ N(f(x), noise_std² I)`` (noise std known); ``categorical`` —
``y ~ softmax(f(x))`` with labels ``0..outputs-1``.  No closed-form evidence.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator

from models.base import (
    CovariateParams,
    CovariateSubset,
    Family,
    ParameterSpec,
    as_labels,
    as_matrix,
    check_nonempty_and_aligned,
)
from models.densities import bmm, normal_log_prob


class BNNParams(CovariateParams):
    hidden: list[int] = Field([16], max_length=16, description="widths of the tanh hidden layers")
    outputs: int = Field(
        ..., ge=1, le=10_000, description="output units: 1+ for gaussian, the number of classes for categorical"
    )
    likelihood: Literal["gaussian", "categorical"] = Field(
        "gaussian", description="gaussian: y ~ N(f(x), noise_std² I); categorical: y ~ softmax(f(x))"
    )
    noise_std: float = Field(1.0, gt=0, description="known noise std of the gaussian likelihood")
    prior_std: float = Field(1.0, gt=0, description="prior standard deviation of every weight and bias")

    @field_validator("hidden")
    @classmethod
    def _widths(cls, v: list[int]) -> list[int]:
        if any(h < 1 or h > 100_000 for h in v):
            raise ValueError("hidden layer widths must be in 1..100000")
        return v

    @model_validator(mode="after")
    def _classes(self) -> BNNParams:
        if self.likelihood == "categorical" and self.outputs < 2:
            raise ValueError("a categorical likelihood needs outputs >= 2 classes")
        return self


class BayesianNeuralNetwork(CovariateSubset, Family):
    name = "bnn"
    covariate_axes = {"W0": 1}  # the first layer's weights: [hidden, d]
    prior = "tanh MLP; every weight and bias ~ N(0, prior_std²); gaussian: y ~ N(f(x), noise_std² I)"
    Params = BNNParams
    params: BNNParams

    @property
    def widths(self) -> list[int]:
        p = self.params
        return [p.n_features, *p.hidden, p.outputs]

    def parameter_specs(self) -> list[ParameterSpec]:
        w = self.widths
        specs = []
        for i in range(len(w) - 1):
            specs += [ParameterSpec(f"W{i}", (w[i + 1], w[i])), ParameterSpec(f"b{i}", (w[i + 1],))]
        return specs

    def observation_schema(self) -> dict[str, Any]:
        p = self.params
        if p.likelihood == "categorical":
            return {**self.x_schema(), "y": [], "y_type": "label", "classes": p.outputs}
        return {**self.x_schema(), "y": [] if p.outputs == 1 else [p.outputs], "y_type": "real", "classes": None}

    def validate_stream(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(x: [B, columns], y)`` with ``y: [B]`` (labels, or one real output) or ``[B, outputs]``;
        :meth:`validate` then keeps the model's ``features``, ``x: [B, d]``."""
        p = self.params
        xt = self.stream_covariates(x, self.name)
        if p.likelihood == "categorical":
            yt = as_labels(y, "y", p.outputs)
        elif p.outputs == 1:
            yt = as_matrix(y, "y", 1)[:, 0]
        else:
            yt = as_matrix(y, "y", p.outputs)
        check_nonempty_and_aligned(xt, yt)
        return xt, yt

    def hyper(self) -> dict[str, float]:
        return {"noise_std": self.params.noise_std, "prior_std": self.params.prior_std}

    def forward(self, values: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Network outputs ``[K, M, B, outputs]`` for ``x: [K, B, d]``, batched over models and particles."""
        L = len(self.widths) - 1
        W0 = values["W0"]  # [K, M, h, d]
        K, M, H, d = W0.shape
        B = x.shape[1]
        # first layer: x is shared by a model's particles
        h = bmm(W0.reshape(K, M * H, d), x.transpose(1, 2)).reshape(K, M, H, B).transpose(2, 3)
        h = (h + values["b0"][:, :, None, :]).reshape(K * M, B, H)
        for i in range(1, L):
            W, b = values[f"W{i}"], values[f"b{i}"]
            h = b.reshape(K * M, 1, -1) + bmm(torch.tanh(h), W.reshape(K * M, *W.shape[2:]).transpose(1, 2))
        return h.reshape(K, M, B, -1)

    def stacked_log_prior(self, values, hp):
        s = hp["prior_std"]
        total = 0.0
        for spec in self.space.specs:
            v = values[spec.name]
            K, M = v.shape[:2]
            total = total + normal_log_prob(v.reshape(K, M, -1), 0.0, s[..., None]).sum(-1)
        return total

    def stacked_log_likelihood(self, values, x, y, hp):
        """``[K, M, B]`` (nats) for ``x: [K, B, d]`` and ``y: [K, B] | [K, B, outputs]``."""
        out = self.forward(values, x)  # [K, M, B, O]
        K, M = out.shape[:2]
        if self.params.likelihood == "categorical":
            logp = torch.log_softmax(out, dim=-1)
            idx = y.long()[:, None, :, None].expand(K, M, -1, 1)
            return logp.gather(-1, idx)[..., 0]
        yy = y[..., None] if y.ndim == 2 else y
        return normal_log_prob(yy[:, None], out, hp["noise_std"][..., None, None]).sum(-1)

    def sample_prior_constrained(self, generator, M, dtype, device):
        s = self.params.prior_std
        return {
            spec.name: s * torch.randn(M, *spec.shape, generator=generator, dtype=dtype, device=device)
            for spec in self.space.specs
        }
