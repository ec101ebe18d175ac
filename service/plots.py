"""PNG plots of the demo (matplotlib, Agg backend): one three-panel figure per series."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

KIND_STYLE = {
    "change_point": ("crimson", "-"),
    "evidence_drop": ("red", "--"),
    "annealing_spike": ("darkorange", ":"),
    "model_switch": ("purple", "-."),
}


def aligned_log_evidence(
    traces: dict[str, list[dict]], conditioned_on: int = 0
) -> tuple[list[int], dict[str, list[float]]]:
    """Every model's log p(y_{c+1..n} | y_{1..c}) at the observation counts n > c all traces share.

    ``traces``: model -> trace rows (``observations`` cumulative, ``log_evidence`` running);
    ``conditioned_on``: c from the stream posterior (API.md "Model comparison").  Each model's running
    value minus its value at c' (the first shared count ≥ c, which is c itself when the traces have rows
    there): the same observations for every model, as the stream posterior compares them.
    Returns (counts, model -> values), both empty without shared counts.
    """
    by_model = {m: {r["observations"]: r["log_evidence"] for r in rows} for m, rows in traces.items() if rows}
    if not by_model:
        return [], {}
    common = sorted(set.intersection(*(set(d) for d in by_model.values())))
    start = next((n for n in common if n >= conditioned_on), None) if conditioned_on > 0 else 0
    if start is None:
        return [], {}
    counts = [n for n in common if n > start]
    base = {m: (d[start] if start else 0.0) for m, d in by_model.items()}
    return counts, {m: [d[n] - base[m] for n in counts] for m, d in by_model.items()}


def probabilities_over_time(
    traces: dict[str, list[dict]], priors: dict[str, float], conditioned_on: int = 0
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Model probabilities at every observation count that all models' traces share, every model scored on
    the observations after ``conditioned_on`` (:func:`aligned_log_evidence`).

    Returns (counts [K], model -> probabilities [K]); ``p ∝ prior · exp(log Z)``.
    """
    return probabilities(*aligned_log_evidence(traces, conditioned_on), priors)


def probabilities(
    counts: list[int], aligned: dict[str, list[float]], priors: dict[str, float]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Model probabilities from aligned log-evidences (:func:`aligned_log_evidence`'s output): (counts [K],
    model -> probabilities [K]), ``p ∝ prior · exp(log Z)``."""
    if not counts:
        return np.array([]), {}
    models = list(aligned)
    logz = np.array([[v + math.log(priors.get(m, 1.0)) for v in aligned[m]] for m in models])  # [M, K]
    logz -= logz.max(0, keepdims=True)
    p = np.exp(logz)
    p /= p.sum(0, keepdims=True)
    return np.array(counts), {m: p[i] for i, m in enumerate(models)}


def series_figure(
    path: Path,
    *,
    title: str,
    values: np.ndarray,
    annotations: dict[str, list[int]],
    traces: dict[str, list[dict]],
    alerts: list[dict[str, Any]],
    priors: dict[str, float],
    conditioned_on: int = 0,
) -> Path:
    """Write ``path``: (1) the series with annotated change points (grey) and alerts (coloured by kind),
    (2) each model's log-evidence relative to the models' mean, (3) model probabilities over time; (2) and
    (3) on the observations after ``conditioned_on`` (the stream posterior's), as the service compares them."""
    fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True, constrained_layout=True)
    ax = axes[0]
    ax.plot(np.arange(len(values)), values, color="black", lw=1)
    for i, cp in enumerate(sorted({c for a in annotations.values() for c in a})):
        ax.axvline(cp, color="grey", ls="--", lw=1, alpha=0.7, label="annotated change" if i == 0 else None)
    seen = set()
    for a in alerts:
        color, ls = KIND_STYLE.get(a["kind"], ("blue", "-"))
        label = None if a["kind"] in seen else a["kind"].replace("_", " ")
        seen.add(a["kind"])
        if a.get("observation_index") is not None:
            ax.axvline(a["observation_index"], color=color, ls=ls, lw=1.5, alpha=0.8, label=label)
    ax.set_ylabel("value (standardised)")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)

    ax = axes[1]
    rows = {m: r for m, r in traces.items() if r}
    if rows:
        shared, aligned = aligned_log_evidence(rows, conditioned_on)
        counts, probs = probabilities(shared, aligned, priors)
        if len(counts):
            mean = np.mean([aligned[m] for m in aligned], 0)
            for m in aligned:
                ax.plot(counts, np.array(aligned[m]) - mean, label=m)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylabel(f"log p(y_{{c+1..n}} | y_{{1..c}}) − mean (nats), c = {conditioned_on}")
        ax.legend(loc="best", fontsize=8)
        ax = axes[2]
        for m, p in probs.items():
            ax.plot(counts, p, label=m)
        ax.set_ylim(-0.02, 1.02)
    axes[2].set_ylabel("model probability")
    axes[2].set_xlabel("observation index")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
