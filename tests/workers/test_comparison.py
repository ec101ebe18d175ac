"""Model comparison on the same observations, failures in the stream posterior, and the model_switch rule
(workers/comparison.py, workers/store/records.py; issue 10 items 1, 2 (switch rule) and 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from models.conjugate import (
    _as_design,
    autoregressive_lags,
    autoregressive_log_evidence,
    gmm_one_component_log_evidence,
)
from workers import alerts, comparison
from workers.engine import SINGLE_OBSERVATION_BLOCKS, block_bounds
from workers.store import records

AR1 = {"family": "autoregressive", "params": {"order": 1, "noise_std": 1.0}, "prior_probability": 1.0}
AR2 = {"family": "autoregressive", "params": {"order": 2, "noise_std": 1.0}, "prior_probability": 1.0}
GMM1 = {"family": "gmm", "params": {"dim": 1, "components": 1}, "prior_probability": 1.0}


def rows_from(lz_at: dict[int, float], se: float = 0.0) -> dict[int, dict]:
    """Trace rows ending at each count of ``lz_at`` (count -> running log-evidence)."""
    return {n: {"observations": n, "log_evidence": lz, "log_evidence_se": se} for n, lz in lz_at.items()}


def posterior(cfgs: dict[str, dict], rows: dict[str, dict[int, dict]], count: int, statuses=None) -> dict:
    """The stream posterior as the API/worker compute it, from in-memory traces (the search for c included)."""
    statuses = statuses or {}
    states = {m: records.model_state(cfg, count, statuses.get(m, "ok"), None) for m, cfg in sorted(cfgs.items())}
    scored = [m for m in states if states[m]["status"] != "error"]
    c = comparison.stream_context([s["context"] for s in states.values()])
    rows_c: dict = {}
    while 0 < c < count:
        rows_c = {m: next((rows[m][k] for k in sorted(rows[m]) if k >= c), None) for m in scored}
        nxt = comparison.next_common_count(c, {m: (r or {}).get("observations") for m, r in rows_c.items()})
        if nxt == c:
            break
        c = count if nxt is None else nxt
    rows_n = {m: rows[m].get(count) for m in scored}
    return records.stream_posterior("s", count, c, records.posterior_entries(states, rows_n, rows_c))


def test_block_bounds_split_the_first_values():
    k = SINGLE_OBSERVATION_BLOCKS
    assert k >= 2  # AR(1) and AR(2) (the demo's models) get exact alignment
    assert block_bounds(0, 25, 500) == [(i, i + 1) for i in range(k)] + [(k, 25)]
    assert block_bounds(1, 12, 5) == [(i, i + 1) for i in range(k - 1)] + [
        (a, min(a + 5, 12)) for a in range(k - 1, 12, 5)
    ]
    assert block_bounds(k, 12, 5) == [(0, 5), (5, 10), (10, 12)]
    assert block_bounds(0, 1, 500) == [(0, 1)]


def test_alignment_arithmetic_with_exact_numbers():
    # AR(2) conditions on 2 values (its log Z is 0 until count 2), the gmm on none: c = 2
    rows = {
        "ar2": rows_from({1: 0.0, 2: 0.0, 3: -1.5, 4: -3.0}),
        "gmm": rows_from({1: -2.0, 2: -4.0, 3: -5.0, 4: -6.5}, se=0.1),
    }
    post = posterior({"ar2": AR2, "gmm": GMM1}, rows, 4)
    assert post["conditioned_on"] == 2 and post["observations"] == 4
    by = {m["model"]: m for m in post["models"]}
    assert by["ar2"]["log_evidence"] == -3.0  # -3.0 - 0.0
    assert by["gmm"]["log_evidence"] == -2.5  # -6.5 - (-4.0), not -6.5
    p_gmm = 1.0 / (1.0 + math.exp(-3.0 + 2.5))
    assert by["gmm"]["probability"] == pytest.approx(p_gmm, rel=1e-12)
    assert by["ar2"]["probability"] == pytest.approx(1.0 - p_gmm, rel=1e-12)
    assert by["ar2"]["log_bayes_factor"] == -0.5 and by["gmm"]["log_bayes_factor"] == 0.0
    # se of the aligned gmm value: se_n + se_c (no assumption on their correlation); BF se: sqrt of squares
    assert by["gmm"]["log_evidence_se"] == pytest.approx(0.2)
    assert by["ar2"]["log_bayes_factor_se"] == pytest.approx(math.hypot(0.0, 0.2))
    assert by["gmm"]["log_bayes_factor_se"] == 0.0


def test_no_row_at_c_conditions_on_the_next_common_row():
    # an AR(12) joined a stream whose gmm has rows only at 10 (the split) and chunk ends 50, 100
    rows = {
        "ar12": rows_from({k: (0.0 if k <= 12 else -0.1 * k) for k in range(1, 101)}),
        "gmm": rows_from({**{k: -1.0 * k for k in range(1, 11)}, 50: -60.0, 100: -130.0}),
    }
    post = posterior({"ar12": {**AR2, "params": {"order": 12, "noise_std": 1.0}}, "gmm": GMM1}, rows, 100)
    assert post["conditioned_on"] == 50
    by = {m["model"]: m for m in post["models"]}
    assert by["gmm"]["log_evidence"] == pytest.approx(-70.0)
    assert by["ar12"]["log_evidence"] == pytest.approx(-10.0 + 5.0)
    assert comparison.next_common_count(13, {"a": 13, "b": 50}) == 50
    assert comparison.next_common_count(50, {"a": 50, "b": 50}) == 50
    assert comparison.next_common_count(13, {"a": 13, "b": None}) is None


def _ar1_conditional_exact(y: np.ndarray, c: int) -> float:
    """log p(y_{c+1..n} | y_{1..c}) of AR(1) (noise 1, prior std 1) by Gaussian conditioning of the joint
    y_{2..n} | y_1 ~ N(0, I + A Aᵀ), A = [y_{t-1}, 1]: an independent check of log Z_n − log Z_c."""
    lags, targets = autoregressive_lags(y, 1)
    A = _as_design(lags)
    cov = np.eye(len(targets)) + A @ A.T
    k = c - 1  # targets y_2..y_c are conditioned on
    s11, s12, s22 = cov[:k, :k], cov[:k, k:], cov[k:, k:]
    mean = s12.T @ np.linalg.solve(s11, targets[:k])
    cond = s22 - s12.T @ np.linalg.solve(s11, s12)
    return float(multivariate_normal(mean, cond).logpdf(targets[k:]))


def test_exact_evidences_aligned_on_a_series_with_extreme_first_values():
    """With exact running evidences, the aligned values are the exact log p(y_{3..n} | y_{1..2}); scored as
    they stand (main), the gmm's Bayes factor against the AR models is off by many nats."""
    rng = np.random.default_rng(5)
    n = 60
    y = np.zeros(n)
    y[0], y[1] = 8.0, -7.0
    for t in range(2, n):
        y[t] = 0.5 * y[t - 1] + rng.normal()
    exact_n = {
        "ar1": lambda k: autoregressive_log_evidence(y[:k], 1, 1.0),
        "ar2": lambda k: autoregressive_log_evidence(y[:k], 2, 1.0),
        "gmm": lambda k: gmm_one_component_log_evidence(y[:k]),
    }
    rows = {m: rows_from({k: f(k) for k in range(1, n + 1)}) for m, f in exact_n.items()}
    post = posterior({"ar1": AR1, "ar2": AR2, "gmm": GMM1}, rows, n)
    by = {m["model"]: m["log_evidence"] for m in post["models"]}
    assert post["conditioned_on"] == 2
    assert by["ar1"] == pytest.approx(_ar1_conditional_exact(y, 2), abs=1e-8)
    assert by["ar2"] == pytest.approx(autoregressive_log_evidence(y, 2, 1.0), abs=1e-12)
    assert by["gmm"] == pytest.approx(gmm_one_component_log_evidence(y) - gmm_one_component_log_evidence(y[:2]))
    naive_gmm_vs_ar2 = exact_n["gmm"](n) - exact_n["ar2"](n)
    assert abs((by["gmm"] - by["ar2"]) - naive_gmm_vs_ar2) > 5.0  # what the alignment corrects


def test_failed_model_is_listed_without_probability():
    rows = {"a": rows_from({5: -7.0}), "b": rows_from({5: -9.0}), "c": rows_from({3: -4.0})}
    post = posterior({"a": GMM1, "b": GMM1, "c": GMM1}, rows, 5, statuses={"c": "error"})
    by = {m["model"]: m for m in post["models"]}
    assert by["c"]["status"] == "error" and by["c"]["probability"] is None and by["c"]["log_evidence"] is None
    assert by["a"]["probability"] + by["b"]["probability"] == pytest.approx(1.0)
    assert by["a"]["probability"] == pytest.approx(1.0 / (1.0 + math.exp(-2.0)))
    # a failure is not a switch: the failed leader hands over silently
    assert comparison.switch_leader("c", post["models"]) == ("a", None)


def _two_model_posterior(log_bf: float, se: float = 0.0) -> list[dict]:
    """Stream posterior models of a and b with log Z_b − log Z_a = log_bf (equal priors)."""
    return comparison.model_probabilities(
        [
            {"model": "a", "prior_probability": 1.0, "log_evidence": 0.0, "log_evidence_se": se},
            {"model": "b", "prior_probability": 1.0, "log_evidence": log_bf, "log_evidence_se": se},
        ]
    )


def test_switch_rule_does_not_flap_near_one_half():
    # a synthetic trace of two models near p = 0.5: the log Bayes factor wanders in ±0.6 nats
    rng = np.random.default_rng(0)
    path = np.clip(np.cumsum(rng.normal(0.0, 0.3, 200)), -0.6, 0.6)
    old_leader, old_switches = "a", 0
    leader, switches = "a", 0
    for lbf in path:
        models = _two_model_posterior(float(lbf))
        if alerts.model_switch(old_leader, models) is not None:  # the rule on main: any change of the top model
            old_switches += 1
        old_leader = comparison.leader(models)
        leader, alert = comparison.switch_leader(leader, models)
        switches += alert is not None
    assert old_switches >= 5  # today's rule flaps on this trace
    assert switches == 0 and leader == "a"


def test_switch_needs_the_margin_and_its_error_bar():
    assert comparison.switch_leader("a", _two_model_posterior(0.9)) == ("a", None)  # < 1 nat
    leader, alert = comparison.switch_leader("a", _two_model_posterior(1.2))
    assert leader == "b" and alert["model"] == "b" and alert["score"] == pytest.approx(1.2)
    # 3 nats with a log Bayes factor se of sqrt(2)·1.2 = 1.7 (z = 1.77 < 2): not yet
    assert comparison.switch_leader("a", _two_model_posterior(3.0, se=1.2)) == ("a", None)
    assert comparison.switch_leader("a", _two_model_posterior(3.5, se=1.2))[0] == "b"  # z = 2.06
    # hysteresis: once b leads, a needs the same margin back
    assert comparison.switch_leader("b", _two_model_posterior(-0.9)) == ("b", None)
    assert comparison.switch_leader("b", _two_model_posterior(-1.1))[0] == "a"
    # an old leader ~1000 nats behind (its probability underflows to 0): a finite score
    assert comparison.switch_leader("a", _two_model_posterior(1000.0))[1]["score"] == pytest.approx(1000.0)
    # the first leader and a deleted leader take over without an alert
    assert comparison.switch_leader(None, _two_model_posterior(0.1)) == ("b", None)
    assert comparison.switch_leader("gone", _two_model_posterior(0.1)) == ("b", None)


def test_model_context_of_each_family():
    assert comparison.model_context(AR2) == 2 and comparison.model_context(GMM1) == 0
    assert comparison.model_context({"family": "linear_regression", "params": {"features": 3}}) == 0
