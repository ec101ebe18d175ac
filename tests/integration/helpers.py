"""Data and reference runs shared by the integration tests."""

from __future__ import annotations

import torch

from workers.engine import ModelEngine, block_bounds


def linear_chunks(n_chunks: int, size: int, seed: int = 0, features: int = 2) -> list[dict]:
    """``n_chunks`` chunks of ``size`` rows from ``y = x·w + 0.5 + N(0, 1)``, as JSON bodies."""
    g = torch.Generator().manual_seed(seed)
    w = torch.arange(1, features + 1, dtype=torch.float64)
    out = []
    for i in range(n_chunks):
        x = torch.randn(size, features, generator=g, dtype=torch.float64)
        y = x @ w + 0.5 + torch.randn(size, generator=g, dtype=torch.float64)
        out.append({"seq": i + 1, "x": x.tolist(), "y": y.tolist()})
    return out


COMPARED = (
    "seq",
    "first_index",
    "observations",
    "block_observations",
    "log_predictive",
    "log_evidence",
    "annealing_steps",
    "ess",
    "resampled",
    "guard_tripped",
    "reannealed",
)


def reference_trace(model: dict, chunks: list[dict]) -> list[dict]:
    """The trace an uninterrupted bare engine produces on ``chunks`` (every field but ``seconds``)."""
    eng = ModelEngine(model["family"], model["params"], model["sampler"])
    rows, first = [], 0
    for chunk in chunks:
        x, y = eng.family.validate(chunk["x"], chunk["y"])
        for start, stop in block_bounds(eng.observations, y.shape[0], eng.settings.block_size):
            xb = x[start:stop] if x is not None else None
            (info,) = eng.update(xb, y[start:stop], validated=True)
            b = stop - start
            rows.append(
                {
                    "seq": chunk["seq"],
                    "first_index": first + start,
                    "observations": first + start + b,
                    "block_observations": b,
                    "log_predictive": info.log_predictive,
                    "log_evidence": info.log_evidence,
                    "annealing_steps": info.annealing_steps,
                    "ess": info.ess,
                    "resampled": info.resampled,
                    "guard_tripped": info.guard_tripped,
                    "reannealed": info.reannealed,
                }
            )
        first += y.shape[0]
    return rows


def strip(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in COMPARED} for r in rows]
