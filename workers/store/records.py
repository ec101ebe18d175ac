"""Records shared by the API (reader) and the workers (writer): evidence bodies, chunk
encoding in the stream log, and the stream posterior from per-model state. No I/O here."""

from __future__ import annotations

import json
from typing import Any

import torch

from workers.comparison import aligned_entry, model_context, model_probabilities

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
            "log_evidence_se": 0.0,
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
        # Monte Carlo standard error (nats); 0.0 in checkpoints written before the engine reported it
        "log_evidence_se": float(ckpt.get("log_evidence_se") or 0.0),
        "log_evidence_per_observation": lz / obs if obs else None,
        "last_block": json.loads(ckpt["last_block"]) if ckpt.get("last_block") else None,
    }


def evidence_event_head(model: str, stream: str, row: dict[str, Any], chunks: int, last_block: str) -> str:
    """The ``evidence`` event after the block of trace ``row`` (``{"type": "evidence", ...evidence body}``,
    :func:`evidence_body` of the checkpoint as of that block, ``chunks`` chunks processed) as JSON text without
    its last member, ``chunks_pending``, and the closing brace: the commit script (``lua/commit.lua``) adds them,
    from the stream's chunk count read in the same atomic step.  ``last_block``: the block's ``last_block`` body
    as JSON, ``json.dumps(block_of(row))`` (the text the checkpoint stores too, encoded once)."""
    ckpt = {
        "chunks": chunks,
        "observations": row["observations"],
        "log_evidence": row["log_evidence"],
        "log_evidence_se": row.get("log_evidence_se", 0.0),
        "status": "ok",
    }
    body = evidence_body(model, stream, ckpt, 0)
    del body["chunks_pending"], body["last_block"]  # last_block is the body's last member: appended as text
    return json.dumps({"type": "evidence", **body})[:-1] + ', "last_block": ' + last_block


# ----- processed blocks ------------------------------------------------------------------------

#: Fields of a block's diagnostics (``workers.sgais.BlockInfo``) copied into its trace row.
BLOCK_FIELDS = (
    "log_predictive",
    "log_evidence",
    "annealing_steps",
    "ess",
    "resampled",
    "guard_tripped",
    "reannealed",
    "log_evidence_correction",
)


def trace_row(info: Any, *, seq: int, first_index: int, block_observations: int, seconds: float) -> dict[str, Any]:
    """A processed block -> its trace row (API.md "Trace"), the one definition the worker, the API and the
    tests use.

    ``info`` is the block's ``workers.sgais.BlockInfo``; the row adds where the block lies in the stream:
    chunk ``seq``, ``first_index`` (its first stream value), ``block_observations`` (stream values in it),
    ``observations`` (stream values up to its end), and ``seconds`` (wall-clock time of the update).
    """
    row: dict[str, Any] = {
        "seq": seq,
        "first_index": first_index,
        "block_observations": block_observations,
        "observations": first_index + block_observations,
    }
    row.update({k: getattr(info, k) for k in BLOCK_FIELDS})
    # Monte Carlo standard error of log_evidence (nats), workers.state.SGAISState.log_evidence_se
    row["log_evidence_se"] = float(info.log_evidence_se)
    row["seconds"] = seconds
    return row


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


def model_state(
    cfg: dict[str, Any], observations: Any, status: Any, error: Any, *, context: int | None = None
) -> dict[str, Any]:
    """One model's part of the stream posterior from its config and checkpoint fields (bytes, str or None):
    ``{"prior_probability", "context", "observations", "status", "error"}``; no checkpoint = ``pending``.
    ``context``: ``model_context(cfg)`` when the caller keeps it (a worker, per config), else computed here."""

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else (v or "")

    return {
        "prior_probability": cfg["prior_probability"],
        "context": model_context(cfg) if context is None else context,
        "observations": int(observations) if observations is not None else 0,
        "status": (text(status) or "ok") if observations is not None else "pending",
        "error": text(error) or None,
    }


def posterior_entries(
    states: dict[str, dict[str, Any]],
    rows_n: dict[str, dict[str, Any] | None],
    rows_c: dict[str, dict[str, Any] | None],
) -> list[dict[str, Any]]:
    """The ``entries`` of :func:`stream_posterior` from :func:`model_state` values and the rows read."""
    return [
        {
            "model": m,
            **{k: st[k] for k in ("prior_probability", "status", "error")},
            "row_n": rows_n.get(m),
            "row_c": rows_c.get(m),
        }
        for m, st in states.items()
    ]


def stream_posterior(stream: str, count: int, conditioned_on: int, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The stream posterior body (API.md "Model comparison"), computed the same way by the API and the worker.

    ``count``: the common observation count n; ``conditioned_on``: the count c the comparison conditions
    on (:func:`workers.comparison.next_common_count`).  ``entries``, one per model of the stream in name
    order: ``model``, ``prior_probability``, ``status``, ``error``, ``row_n`` (its trace row ending at n,
    None when n = 0 or the model has no result) and ``row_c`` (its row ending at c, None when c = 0).
    A model in ``error`` is listed without a result (``probability`` null) whatever rows it has.
    """
    scored = []
    for e in entries:
        item = {k: e.get(k) for k in ("model", "prior_probability", "status", "error")}
        row_n, row_c = e.get("row_n"), e.get("row_c")
        at_n = count == 0 or (row_n is not None and row_n["observations"] == count)
        at_c = (
            conditioned_on == 0
            or count <= conditioned_on
            or (row_c is not None and row_c["observations"] == conditioned_on)
        )
        if e.get("status") != "error" and at_n and at_c:
            item.update(aligned_entry(row_n, row_c, conditioned_on))
        scored.append(item)
    return {
        "stream": stream,
        "observations": count,
        "conditioned_on": conditioned_on,
        "models": model_probabilities(scored),
    }


def row_covering(rows: list[Any], count: int) -> dict[str, Any] | None:
    """The trace row (from ``ZREVRANGEBYSCORE trace count-1 -inf LIMIT 0 1``) holding observation
    ``count`` (1-based), i.e. the first row ending at or after ``count``; None if there is none."""
    if not rows:
        return None
    row = json.loads(rows[0])
    return row if row["observations"] >= count else None


def trace_row_at(rows: list[Any], count: int) -> dict[str, Any] | None:
    """The trace row (from ``ZREVRANGEBYSCORE trace count-1 -inf LIMIT 0 1``) ending at ``count``."""
    if not rows:
        return None
    row = json.loads(rows[0])
    return row if row["observations"] == count else None


# ----- lease shares ---------------------------------------------------------------------------


def parse_share(raw: bytes | str | None) -> tuple[float, int] | None:
    """A ``P:loads`` value, ``{"load": engine s/s, "models": held}`` -> ``(load, models)``; None if unreadable."""
    try:
        d = json.loads(raw) if raw is not None else None
        return (float(d["load"]), int(d["models"])) if isinstance(d, dict) else None
    except (ValueError, KeyError, TypeError):
        return None
