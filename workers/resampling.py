"""Systematic resampling (Carpenter, Clifford & Fearnhead 1999; thesis §3.4)."""

from __future__ import annotations

import torch


def systematic_resample(generator: torch.Generator, log_w: torch.Tensor, count: int | None = None) -> torch.Tensor:
    """Ancestor indices ``[count]`` (int64, default ``count = M``) drawn systematically ∝ ``exp(log_w)``.

    One uniform ``u ~ U[0, 1)`` from ``generator``; particle ``i`` is picked for every
    point ``(u + k) / count`` that falls in its cumulative-weight interval.  Expected
    copies equal ``count · W_i``; the variance is lower than multinomial resampling.
    """
    M = log_w.shape[0] if count is None else count
    W = torch.softmax(log_w.to(torch.float64), 0)
    cdf = torch.cumsum(W, 0)
    cdf[-1] = 1.0
    u = torch.rand((), generator=generator, dtype=torch.float64, device=log_w.device)
    points = (u + torch.arange(M, dtype=torch.float64, device=log_w.device)) / M
    return torch.searchsorted(cdf, points, right=True).clamp_(max=log_w.shape[0] - 1)


def multinomial_resample(generator: torch.Generator, log_w: torch.Tensor) -> torch.Tensor:
    """Ancestor indices ``[M]`` drawn i.i.d. from the categorical distribution of ``exp(log_w)``."""
    W = torch.softmax(log_w.to(torch.float64), 0)
    return torch.multinomial(W, W.shape[0], replacement=True, generator=generator)


RESAMPLERS = {"systematic": systematic_resample, "multinomial": multinomial_resample}
