"""Records shared by the API (reader) and the workers (writer): evidence bodies, chunk
encoding in the stream log, and the stream posterior from per-model state. No I/O here."""

from __future__ import annotations

import json
from typing import Any

import torch

from workers.comparison import model_probabilities

# ----- chunks in the stream log ----------------------------------------------------------------


def encode_chunk(x: torch.Tensor | None, y: torch.Tensor) -> dict[str, bytes | str]:
    """Validated ``x: [B, d] | None``, ``y: [B] | [B, d]`` (float64) -> stream-entry fields (raw bytes)."""
    return {
        "x_shape": json.dumps(list(x.shape)) if x is not None else "",
        "y_shape": json.dumps(list(y.shape)),
        "x": x.contiguous().numpy().tobytes() if x is not None else b"",
        "y": y.contiguous().numpy().tobytes(),
    }


def decode_chunk(fields: dict[bytes, bytes]) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Inverse of :func:`encode_chunk` on the raw fields of an XRANGE entry -> float64 tensors."""

    def tensor(data: bytes, shape: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(data), dtype=torch.float64).reshape(json.loads(shape))

    x = tensor(fields[b"x"], fields[b"x_shape"]) if fields[b"x_shape"] else None
    return x, tensor(fields[b"y"], fields[b"y_shape"])


# ----- evidence --------------------------------------------------------------------------------


def evidence_body(model: str, stream: str, ckpt: dict[str, str] | None, stream_chunks: int) -> dict[str, Any]:
    """The evidence resource (API.md) from a checkpoint hash (decoded, ``state`` left out)."""
    if not ckpt or "chunks" not in ckpt:
        return {
            "model": model,
            "stream": stream,
            "status": "pending",
            "error": None,
            "observations": 0,
            "chunks_processed": 0,
            "chunks_pending": stream_chunks,
            "log_evidence": 0.0,
            "log_evidence_per_observation": None,
            "last_block": None,
        }
    obs = int(ckpt["observations"])
    chunks = int(ckpt["chunks"])
    lz = float(ckpt["log_evidence"])
    return {
        "model": model,
        "stream": stream,
        "status": ckpt.get("status") or "ok",
        "error": ckpt.get("error") or None,
        "observations": obs,
        "chunks_processed": chunks,
        "chunks_pending": max(stream_chunks - chunks, 0),
        "log_evidence": lz,
        "log_evidence_per_observation": lz / obs if obs else None,
        "last_block": json.loads(ckpt["last_block"]) if ckpt.get("last_block") else None,
    }


def evidence_event_head(model: str, stream: str, ckpt: dict[str, Any]) -> str:
    """The ``evidence`` event (``{"type": "evidence", ...evidence body}``) as JSON, cut before its last
    field: the writer appends ``<chunks pending>}`` once it knows the stream's chunk count (the worker's
    commit script reads it in the same atomic step).  ``ckpt`` as for :func:`evidence_body`."""
    body = evidence_body(model, stream, ckpt, 0)
    del body["chunks_pending"]
    return json.dumps({"type": "evidence", **body})[:-1] + ', "chunks_pending": '


def block_of(row: dict[str, Any]) -> dict[str, Any]:
    """A trace row -> the ``last_block`` body (``observations`` = stream values in the block)."""
    out = {
        k: row[k]
        for k in (
            "seq",
            "first_index",
            "log_predictive",
            "annealing_steps",
            "ess",
            "resampled",
            "seconds",
            "guard_tripped",
        )
    }
    out["reannealed"] = row.get("reannealed", False)
    if "change_probability" in row:  # issue 12: rows written with challengers (workers/segmented.py)
        out["change_probability"] = row["change_probability"]
        out["change_point"] = row.get("change_point", False)
    out["observations"] = row["block_observations"]
    return out


# ----- stream posterior -----------------------------------------------------------------------


def common_count(states: dict[str, dict[str, Any]]) -> int:
    """Largest observation count every active model of a stream has processed.

    ``states``: model -> ``{"observations": int | None, "status": str | None, ...}``; models in
    error are left out (they no longer advance); a model without a checkpoint counts as 0.
    """
    counts = [s.get("observations") or 0 for s in states.values() if s.get("status") != "error"]
    return min(counts) if counts else 0


def stream_posterior(stream: str, count: int, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The stream posterior body; ``entries``: ``model, prior_probability, log_evidence`` at ``count``."""
    return {"stream": stream, "observations": count, "models": model_probabilities(entries)}


def trace_row_at(rows: list[Any], count: int) -> dict[str, Any] | None:
    """The trace row (from ``ZREVRANGEBYSCORE trace count-1 -inf LIMIT 0 1``) ending at ``count``."""
    if not rows:
        return None
    row = json.loads(rows[0])
    return row if row["observations"] == count else None
