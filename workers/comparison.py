"""Model comparison on a stream (API.md "Model comparison", DESIGN.md §9). Pure functions, no I/O.

Same observations.  A model that conditions on the first ``p`` values (AR(p)) has running evidence
``log Ẑ_n = log p(y_{p+1..n} | y_{1..p})``; an i.i.d. model's is ``log p(y_{1..n})``.  Scoring them
against each other as they stand gives the AR model its first ``p`` values for free (+1.7 nats for
AR(2) over AR(1) on standardised data, issue 10).  Every model of a stream is therefore compared on
the observations after the stream's largest context ``c`` (:func:`stream_context`):

    log p(y_{c+1..n} | y_{1..c}) = log Ẑ_n − log Ẑ_c,

which holds for any model whose own context is ≤ c (the chain rule; for an AR(p) model both terms
condition on ``y_{1..p}``, which cancels).  ``log Ẑ_c`` is read from the model's trace row ending at
``c``; the engine absorbs the stream's first values one by one so those rows exist
(``workers.engine.SINGLE_OBSERVATION_BLOCKS``).  When some model has no row at ``c`` (a larger
context, or a model from before that rule) the comparison conditions on the first count ≥ c where
every model has one (:func:`next_common_count`), reported as ``conditioned_on``.

Error bars.  The trace rows carry ``log_evidence_se`` (``workers/sgais.py``, "Error bars"; 0 in rows
written before the engine reported it).  The aligned
value's error is bounded by ``se_n + se_c`` (the triangle inequality for standard deviations: no
assumption on the correlation of ``log Ẑ_n`` and ``log Ẑ_c``); models run on independent random
streams, so ``log_bayes_factor_se = sqrt(se_a² + se_b²)``.

Leader switches.  ``model_switch`` fires only when the challenger's log Bayes factor against the
current leader is at least :data:`SWITCH_MIN_NATS` and at least :data:`SWITCH_Z` standard errors
(:func:`switch_leader`); until then the old leader stays the leader (hysteresis: a switch back needs
the same margin the other way, so two models near p = 0.5 do not flap).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

# The switch margin.  1 nat: Kass & Raftery (1995, JASA 90, §3.2) call 2·ln B < 2 "not worth more than
# a bare mention"; positive evidence starts at ln B = 1.  2 standard errors: if the true log Bayes factor
# were 0, Monte Carlo error alone would cross the margin with probability ≈ 2.3 % (one-sided normal).
SWITCH_MIN_NATS = 1.0
SWITCH_Z = 2.0


@lru_cache(maxsize=4096)
def family_context(family: str, params_json: str) -> int:
    """:func:`model_context` of a family and its params as a JSON string (cached by that string).

    Raises what :func:`models.make_family` raises for an unknown family or invalid params."""
    import json

    from models import make_family

    return int(make_family(family, json.loads(params_json)).context_size)


def model_context(cfg: dict[str, Any]) -> int:
    """Number of first stream values a model conditions on (its AR order; 0 for i.i.d. families).

    ``cfg``: the model resource (``family``, ``params``).  Unknown families or invalid params count 0.
    """
    import json

    try:
        return family_context(cfg["family"], json.dumps(cfg.get("params") or {}, sort_keys=True))
    except Exception:  # a config the API accepted always builds; never fail a comparison on it
        return 0


def stream_context(contexts: list[int]) -> int:
    """The stream's largest context ``c`` (0 without models)."""
    return max(contexts, default=0)


def next_common_count(candidate: int, row_ends: dict[str, int | None]) -> int | None:
    """One step of the search for ``conditioned_on``.

    ``row_ends``: model -> the end count (``observations``) of its first trace row ending at or after
    ``candidate`` (None if it has none).  Returns ``candidate`` when every model has a row ending
    exactly there (the fixed point), the larger count to try next otherwise, or None when some model
    has no such row.  Repeating from ``c`` until the fixed point gives the first count ≥ c at which
    every model has a row; it terminates because counts only grow and the common count has rows.
    """
    if any(v is None for v in row_ends.values()):
        return None
    return max([candidate, *(v for v in row_ends.values() if v is not None)])


def aligned_entry(row_n: dict[str, Any] | None, row_c: dict[str, Any] | None, conditioned_on: int) -> dict[str, float]:
    """``log p(y_{c+1..n} | y_{1..c}) = log Ẑ_n − log Ẑ_c`` (nats) and its standard error from two trace rows.

    ``row_n`` ends at the compared count n (None when n = 0), ``row_c`` at ``conditioned_on`` = c
    (None when c = 0: ``log Ẑ_0 = 0``).  Rows without ``log_evidence_se`` count an error of 0.
    The error is ``se_n + se_c`` (module docstring), 0 when n ≤ c.
    """
    if row_n is None or row_n["observations"] <= conditioned_on:
        return {"log_evidence": 0.0, "log_evidence_se": 0.0}
    lz_c = row_c["log_evidence"] if row_c is not None else 0.0
    se_c = float(row_c.get("log_evidence_se") or 0.0) if row_c is not None else 0.0
    return {
        "log_evidence": float(row_n["log_evidence"]) - float(lz_c),
        "log_evidence_se": float(row_n.get("log_evidence_se") or 0.0) + se_c,
    }


def model_probabilities(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``p(M_k | y) ∝ prior_k · exp(log Z_k)`` over the entries with a ``log_evidence``.

    ``entries``: dicts with ``model``, ``prior_probability`` (> 0), ``status``, ``error`` and
    ``log_evidence`` (nats, None for a model without results, e.g. in ``error``) and optionally
    ``log_evidence_se``, all at the same observations.  Returns, in the input order, ``{"model",
    "status", "error", "log_evidence", "log_evidence_se", "probability", "log_bayes_factor",
    "log_bayes_factor_se"}``; ``log_bayes_factor`` is relative to the most probable model, its error
    ``sqrt(se_k² + se_best²)`` (independent random streams; 0 for the best model itself).  Models
    without results get None in the numeric fields.
    """
    scored = [i for i, e in enumerate(entries) if e.get("log_evidence") is not None]
    scores = {i: math.log(entries[i]["prior_probability"]) + entries[i]["log_evidence"] for i in scored}
    out = []
    if scored:
        top = max(scores.values())
        norm = top + math.log(sum(math.exp(s - top) for s in scores.values()))
        best = max(scored, key=lambda i: scores[i])
        best_lz = entries[best]["log_evidence"]
        best_se = float(entries[best].get("log_evidence_se") or 0.0)
    for i, e in enumerate(entries):
        body: dict[str, Any] = {"model": e["model"], "status": e.get("status") or "ok", "error": e.get("error")}
        if i in scores:
            se = float(e.get("log_evidence_se") or 0.0)
            body.update(
                log_evidence=e["log_evidence"],
                log_evidence_se=se,
                probability=math.exp(scores[i] - norm),
                log_bayes_factor=e["log_evidence"] - best_lz,
                log_bayes_factor_se=0.0 if i == best else math.hypot(se, best_se),
            )
        else:
            body.update(
                log_evidence=None,
                log_evidence_se=None,
                probability=None,
                log_bayes_factor=None,
                log_bayes_factor_se=None,
            )
        out.append(body)
    return out


def leader(models: list[dict[str, Any]]) -> str | None:
    """Name of the most probable model with results (ties: first in order), None without any."""
    scored = [m for m in models if m.get("probability") is not None]
    if not scored:
        return None
    return max(scored, key=lambda m: m["probability"])["model"]


def switch_leader(previous: str | None, models: list[dict[str, Any]]) -> tuple[str | None, dict[str, Any] | None]:
    """The stream's leader after this posterior, and a ``model_switch`` alert body or None.

    ``previous``: the leader so far (None at the start); ``models``: :func:`model_probabilities`.
    The most probable model takes over from ``previous`` only when its log Bayes factor against it
    (prior odds included, i.e. the log posterior odds) is ≥ :data:`SWITCH_MIN_NATS` and
    ≥ :data:`SWITCH_Z` × its standard error; otherwise ``previous`` stays the leader and nothing fires.
    When ``previous`` has no result (in ``error``, deleted, pending) the top model becomes the leader
    without an alert: a failure is not a switch.  The alert body has ``kind``, ``model`` (the new
    leader), ``score`` (its log posterior odds against the old leader, nats) and ``message``.
    """
    top = leader(models)
    by_name = {m["model"]: m for m in models}
    old = by_name.get(previous) if previous is not None else None
    if top is None or old is None or old.get("probability") is None:
        return top, None
    if top == previous:
        return previous, None
    new = by_name[top]
    if old["probability"] > 0 and new["probability"] > 0:
        log_odds = math.log(new["probability"]) - math.log(old["probability"])
    else:  # exp underflowed (> ~745 nats apart): the evidence difference, finite for the alert's JSON
        log_odds = float(new["log_evidence"]) - float(old["log_evidence"])
    se = math.hypot(float(new.get("log_evidence_se") or 0.0), float(old.get("log_evidence_se") or 0.0))
    if log_odds < SWITCH_MIN_NATS or log_odds < SWITCH_Z * se:
        return previous, None
    return top, {
        "kind": "model_switch",
        "model": top,
        "score": log_odds,
        "message": (
            f"most probable model is now {top} (p={new['probability']:.3g}), was {previous}: "
            f"log posterior odds {log_odds:.2f} ± {se:.2f} nats"
        ),
    }
