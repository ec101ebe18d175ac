"""Posterior model probabilities on a stream (API.md "Model comparison"). Pure functions."""

from __future__ import annotations

import math
from typing import Any


def model_probabilities(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``p(M_k | y) ∝ prior_k · exp(log Z_k)``; ``log_bayes_factor`` relative to the most probable model.

    ``entries``: dicts with ``model``, ``prior_probability`` (> 0) and ``log_evidence`` (nats),
    all at the same observation count.  Returns ``[{"model", "log_evidence", "probability",
    "log_bayes_factor"}]`` in the input order.
    """
    if not entries:
        return []
    scores = [math.log(e["prior_probability"]) + e["log_evidence"] for e in entries]
    top = max(scores)
    norm = top + math.log(sum(math.exp(s - top) for s in scores))
    best = max(range(len(entries)), key=lambda i: scores[i])
    best_lz = entries[best]["log_evidence"]
    return [
        {
            "model": e["model"],
            "log_evidence": e["log_evidence"],
            "probability": math.exp(s - norm),
            "log_bayes_factor": e["log_evidence"] - best_lz,
        }
        for e, s in zip(entries, scores)
    ]


def leader(models: list[dict[str, Any]]) -> str | None:
    """Name of the most probable model (ties: first in order), None without models."""
    if not models:
        return None
    return max(models, key=lambda m: m["probability"])["model"]
