"""Posterior predictive of the next observations from a weighted particle posterior (API.md "Operations").

``p(y_{n+1..n+h} | y_{1..n}) ≈ Σ_i W_i p(y_{n+1..n+h} | θ_i)`` with ``W = softmax(log_w)`` (thesis ch. 4: the
particles and log-weights approximate the posterior). Each particle simulates ``S`` futures; the summary
weighs each simulated value by ``W_i / S``. Autoregressive models simulate the ``h`` steps recursively from the
stream's last ``p`` values; the other families draw each step independently (regression families at the
given covariate rows).

The simulators take the constrained parameter dicts of :meth:`models.base.ParameterSpace.constrain`
(``values[name]: [M, *shape]``) and a ``torch.Generator``; they never change the family objects.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from models.base import Family, ObservationError


class PredictiveError(ValueError):
    """The request cannot be answered for this family (``field`` names the input, ``reason`` says why)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def _linear_regression(family, values, x, context, horizon, S, g) -> torch.Tensor:
    mean = values["w"] @ x.T + values["b"][:, None]  # [M, H]
    noise = torch.randn(mean.shape[0], S, horizon, generator=g, dtype=mean.dtype)
    std = family.params.noise_std if family.known_noise else values["noise_variance"].sqrt()[:, None, None]
    return mean[:, None, :] + std * noise  # [M, S, H]


def _categorical(logits: torch.Tensor, S: int, g: torch.Generator) -> torch.Tensor:
    """Labels ``[M, S, H]`` (float) drawn from ``softmax(logits: [M, H, K])``."""
    M, H, K = logits.shape
    p = torch.softmax(logits, -1).reshape(M * H, K)
    draws = torch.multinomial(p, S, replacement=True, generator=g)  # [M*H, S]
    return draws.reshape(M, H, S).transpose(1, 2).to(logits.dtype)


def _logistic_regression(family, values, x, context, horizon, S, g) -> torch.Tensor:
    logits = torch.einsum("hd,mkd->mhk", x, values["W"]) + values["b"][:, None, :]  # [M, H, K]
    return _categorical(logits, S, g)


def _bnn(family, values, x, context, horizon, S, g) -> torch.Tensor:
    out = family.forward({k: v[None] for k, v in values.items()}, x[None])[0]  # a stack of one: [M, H, O]
    if family.params.likelihood == "categorical":
        return _categorical(out, S, g)
    noise = torch.randn(out.shape[0], S, *out.shape[1:], generator=g, dtype=out.dtype)
    y = out[:, None] + family.params.noise_std * noise  # [M, S, H, O]
    return y[..., 0] if family.params.outputs == 1 else y


def _gmm(family, values, x, context, horizon, S, g) -> torch.Tensor:
    w, mu, var = values["weights"], values["means"], values["variances"]  # [M, K], [M, K, d], [M, K, d]
    M, K, d = mu.shape
    k = torch.multinomial(w, S * horizon, replacement=True, generator=g)  # [M, S*H]
    idx = k[..., None].expand(-1, -1, d)
    m, v = mu.gather(1, idx), var.gather(1, idx)  # [M, S*H, d]
    y = m + v.sqrt() * torch.randn(M, S * horizon, d, generator=g, dtype=mu.dtype)
    y = y.reshape(M, S, horizon, d)
    return y[..., 0] if d == 1 else y


def _autoregressive(family, values, x, context, horizon, S, g) -> torch.Tensor:
    p = family.params.order
    if context is None or context.shape[0] < p:
        seen = 0 if context is None else context.shape[0]
        raise PredictiveError("horizon", f"the model conditions on its stream's last {p} values; it has seen {seen}")
    a, c = values["coefficients"], values["intercept"]  # [M, p], [M]
    M = a.shape[0]
    std = math.sqrt(family.params.noise_std**2) if family.known_noise else values["variance"].sqrt()[:, None]
    lags = context.to(a.dtype).flip(0)[None, None, :].expand(M, S, p).clone()  # column k: y_{t-1-k}
    out = []
    for _ in range(horizon):
        mean = (lags * a[:, None, :]).sum(-1) + c[:, None]  # [M, S]
        y = mean + std * torch.randn(M, S, generator=g, dtype=a.dtype)
        out.append(y)
        lags = torch.cat([y[..., None], lags[..., :-1]], dim=-1)
    return torch.stack(out, dim=-1)  # [M, S, H]


SIMULATORS = {
    "linear_regression": _linear_regression,
    "logistic_regression": _logistic_regression,
    "bnn": _bnn,
    "gmm": _gmm,
    "autoregressive": _autoregressive,
}


def needs_x(family: Family) -> bool:
    """True for the regression families (their predictive is at given covariate rows ``x``)."""
    return family.observation_schema()["x"] is not None


def simulate(
    family: Family,
    values: dict[str, torch.Tensor],
    *,
    x: torch.Tensor | None,
    context: torch.Tensor | None,
    horizon: int,
    draws: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """``draws`` simulated futures per particle: ``[M, S, H]`` (scalar observations) or ``[M, S, H, d]``.

    ``values``: constrained parameters ``[M, *shape]``; ``x: [H, features]`` for the regression families
    (then ``H`` is its number of rows), else None; ``context: [≤ p]`` the stream's last values
    (autoregressive).

    Raises
    ------
    PredictiveError
        Unknown family, ``x`` missing or given when the family takes none, or too little context.
    """
    if family.name not in SIMULATORS:
        raise PredictiveError("model", f"no predictive simulator for family {family.name!r}")
    if needs_x(family):
        if x is None:
            raise PredictiveError("x", f"family {family.name!r} predicts at covariate rows: POST them as x")
        horizon = x.shape[0]
    elif x is not None:
        raise PredictiveError("x", f"family {family.name!r} takes no covariates")
    if horizon < 1:
        raise PredictiveError("horizon", "must be at least 1")
    return SIMULATORS[family.name](family, values, x, context, horizon, draws, generator)


def weighted_summary(y: torch.Tensor, log_w: torch.Tensor) -> list[dict[str, Any]]:
    """Per step ``mean``, ``std``, ``q05``, ``q95`` (and ``mean_se``) of simulated futures.

    ``y: [M, S, H]`` or ``[M, S, H, d]``, ``log_w: [M]``. Each value weighs ``W_i / S``; the quantiles are the
    smallest values whose cumulative weight reaches 5% / 95% (as in the parameter posterior summary).
    ``mean_se`` is the simulation part of the Monte Carlo error of ``mean``,
    ``sqrt(Σ_i W_i² s_i² / S)`` with ``s_i²`` particle i's sample variance (the particle approximation of the
    posterior adds its own error, not included). Vector observations give lists of length ``d``.
    """
    M, S, H = y.shape[:3]
    vec = y.ndim == 4
    Y = (y if vec else y[..., None]).to(torch.float64)  # [M, S, H, d]
    W = torch.softmax(log_w.to(torch.float64), 0)  # [M]
    w = (W[:, None] / S).expand(M, S).reshape(-1)  # [M*S]
    flat = Y.reshape(M * S, H, -1)
    mean = torch.einsum("n,nhd->hd", w, flat)
    var = torch.einsum("n,nhd->hd", w, (flat - mean) ** 2)
    within = Y.var(1, correction=1) if S > 1 else torch.zeros_like(Y[:, 0])  # [M, H, d]
    se = (torch.einsum("m,mhd->hd", W**2, within) / S).sqrt()
    order = torch.argsort(flat, dim=0)  # [N, H, d]
    cw = torch.cumsum(w[order], 0)

    def quantile(q: float) -> torch.Tensor:
        pos = (cw < q).sum(0).clamp(max=flat.shape[0] - 1)  # first index whose cumulative weight reaches q
        return flat.gather(0, order.gather(0, pos[None]))[0]

    q05, q95 = quantile(0.05), quantile(0.95)

    def out(t: torch.Tensor, h: int):
        return t[h].tolist() if vec else float(t[h, 0])

    return [
        {
            "step": h + 1,
            "mean": out(mean, h),
            "std": out(var.sqrt(), h),
            "q05": out(q05, h),
            "q95": out(q95, h),
            "mean_se": out(se, h),
        }
        for h in range(H)
    ]


def predictive(
    family: Family,
    theta: torch.Tensor,
    log_w: torch.Tensor,
    *,
    x: Any = None,
    context: torch.Tensor | None = None,
    horizon: int = 1,
    total_draws: int = 20_000,
    generator: torch.Generator,
) -> dict[str, Any]:
    """The posterior predictive summary of the next ``horizon`` observations (or of one per row of ``x``).

    ``theta: [M, D]`` unconstrained particles, ``log_w: [M]`` log-weights; ``x``: covariate rows (validated
    by the family); each particle simulates ``ceil(total_draws / M)`` futures. Returns ``{"horizon",
    "draws", "steps": [...]}`` (:func:`weighted_summary`).

    Raises
    ------
    PredictiveError
        As :func:`simulate`, or ``x`` rows that the family rejects (``field`` "x", the reason and row).
    """
    xt = None
    if x is not None and needs_x(family):
        try:
            xt = family.validate(x, _dummy_labels(family, len(x)))[0]
        except ObservationError as err:
            raise PredictiveError("x", str(err)) from None
    elif x is not None:
        raise PredictiveError("x", f"family {family.name!r} takes no covariates")
    # in float64 whatever the particles' dtype (a float32 model's particles are exact in float64; the x rows and the
    # simulated noise are float64): float32 models' covariate rows met float64 rows here and raised (session 33)
    theta = theta.to(torch.float64)
    context = context.to(torch.float64) if context is not None else None
    values, _ = family.space.constrain(theta)
    M = theta.shape[0]
    S = max(1, math.ceil(total_draws / M))
    y = simulate(family, values, x=xt, context=context, horizon=horizon, draws=S, generator=generator)
    return {"horizon": y.shape[2], "draws": M * S, "steps": weighted_summary(y, log_w)}


def _dummy_labels(family: Family, n: int) -> list:
    """Valid placeholder observations so that :meth:`Family.validate` checks the ``x`` rows alone."""
    schema = family.observation_schema()
    shape = schema["y"]
    return [[0.0] * shape[0] if shape else 0.0 for _ in range(n)]
