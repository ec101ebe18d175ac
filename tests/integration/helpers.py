"""Data and reference runs shared by the integration tests."""

from __future__ import annotations

import torch

from workers.engine import ModelEngine
from workers.store import records
from workers.worker.blocks import absorb_chunk


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


#: Every trace-row field but ``seconds`` (wall-clock time).
COMPARED = ("seq", "first_index", "block_observations", "observations", *records.BLOCK_FIELDS)


def reference_trace(model: dict, chunks: list[dict]) -> list[dict]:
    """The trace an uninterrupted bare engine produces on ``chunks`` (the worker's path from a chunk to its
    trace rows, :func:`workers.worker.blocks.absorb_chunk`, without Redis)."""
    eng = ModelEngine(model["family"], model["params"], model["sampler"])
    rows: list[dict] = []
    for chunk in chunks:
        first = rows[-1]["observations"] if rows else 0
        rows += [b.row for b in absorb_chunk(eng, chunk.get("x"), chunk["y"], seq=chunk["seq"], first_index=first)]
    return rows


def strip(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in COMPARED} for r in rows]
