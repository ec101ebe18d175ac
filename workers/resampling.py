"""Resampling schemes (Carpenter, Clifford & Fearnhead 1999; thesis §3.4), one signature per scheme.

Every resampler is ``(generators, log_w: [K, M], count) -> idx: [K, count]``: model ``k`` draws its
randomness from ``generators[k]`` alone, so its ancestors do not depend on the other rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

Resampler = Callable[[Sequence[torch.Generator], torch.Tensor, int], torch.Tensor]


def systematic(generators: Sequence[torch.Generator], log_w: torch.Tensor, count: int) -> torch.Tensor:
    """Ancestor indices ``[K, count]`` (int64) drawn systematically ∝ ``exp(log_w)``, ``log_w: [K, M]``.

    One uniform ``u_k ~ U[0, 1)`` per model; particle ``i`` is picked for every point
    ``(u_k + j) / count`` that falls in its cumulative-weight interval.  Expected copies equal
    ``count · W_i``; the variance is lower than multinomial resampling.
    """
    opts: dict[str, Any] = {"dtype": torch.float64, "device": log_w.device}
    u = torch.stack([torch.rand((), generator=g, **opts) for g in generators])
    W = torch.softmax(log_w.to(torch.float64), -1)
    cdf = torch.cumsum(W, -1)
    cdf[:, -1] = 1.0
    points = (u[:, None] + torch.arange(count, **opts)) / count
    return torch.searchsorted(cdf, points, right=True).clamp_(max=log_w.shape[-1] - 1)


def multinomial(generators: Sequence[torch.Generator], log_w: torch.Tensor, count: int) -> torch.Tensor:
    """Ancestor indices ``[K, count]`` drawn i.i.d. from each row's categorical distribution of ``exp(log_w)``."""
    W = torch.softmax(log_w.to(torch.float64), -1)
    return torch.stack(
        [torch.multinomial(W[k], count, replacement=True, generator=g) for k, g in enumerate(generators)]
    )


RESAMPLERS: dict[str, Resampler] = {"systematic": systematic, "multinomial": multinomial}


def systematic_resample(generator: torch.Generator, log_w: torch.Tensor, count: int | None = None) -> torch.Tensor:
    """One model: ancestor indices ``[count]`` (default ``M``) for ``log_w: [M]`` (:func:`systematic`)."""
    return systematic([generator], log_w[None], log_w.shape[0] if count is None else count)[0]
