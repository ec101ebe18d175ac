"""A block of at least ``sampler.restart_min_rows`` rows and at least as many as the history is absorbed by a fresh
run from the prior over both (:func:`workers.stacking._restart_begin`).

The measured case: the demo's AR(2) on Occupancy's first 50 values, which a change-point model absorbs in the ramp's
sub-blocks of 1, 2, 4, … values (:func:`workers.segmented.ramp_bounds`), each as large as the history before it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.conjugate import autoregressive_unknown_noise_log_evidence
from service.datasets import load_series
from workers.changepoint import ChangepointSettings
from workers.engine import ModelEngine
from workers.segmented import SegmentedEngine

DEMO = {"block_size": 50, "particles": 10, "burn_in": 10, "batch_size": 100}  # service.demo.SAMPLER
SEEDS = range(8)


def _errors(restart: bool, gibbs: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(error against the exact log-evidence, reported SE) per seed, nats: AR(2) on Occupancy's first 50 values."""
    z = np.asarray(load_series("Occupancy").standardised()[:50, 0], float)
    exact = autoregressive_unknown_noise_log_evidence(z, 2)
    errs, ses = [], []
    for seed in SEEDS:
        sampler = {**DEMO, "seed": seed, "restart_min_rows": 16 if restart else None, "gibbs_sweeps": 2 if gibbs else 0}
        eng = SegmentedEngine.create("autoregressive", {"order": 2}, sampler, ChangepointSettings())
        eng.update(None, [float(v) for v in z])
        errs.append(eng.log_evidence - exact)
        ses.append(eng.log_evidence_se)
    return np.array(errs), np.array(ses)


@pytest.mark.slow
def test_the_ramps_sub_blocks_are_replayed_from_the_prior_and_the_evidence_is_right() -> None:
    """Eight seeds: with restarts each error is within 3 reported SEs and their mean within 3 SEs of a mean of 8
    independent estimates (SE/√8); annealed sub-block by sub-block the SGHMC moves lag the posterior as it
    contracts, and the mean error is more than 6 of those (session 31: −1.39 nats against SEs of 0.44), with SGHMC's
    moves alone.  The Gibbs sweeps on the exact conditionals that replace those moves in the warm-up (``gibbs_sweeps``,
    the default since session 34) follow the contraction without restarts: each error within 3 SEs and the mean
    within 3 SEs of a mean (−0.06 nats against SEs of 0.32 when written)."""
    errs, ses = _errors(restart=True)
    assert np.all(np.abs(errs) <= 3 * ses), (errs, ses)
    assert abs(errs.mean()) <= 3 * ses.mean() / math.sqrt(len(errs)), (errs.mean(), ses.mean())
    errs, ses = _errors(restart=False, gibbs=False)
    assert errs.mean() < -6 * ses.mean() / math.sqrt(len(errs)), (errs.mean(), ses.mean())
    errs, ses = _errors(restart=False)
    assert np.all(np.abs(errs) <= 3 * ses), (errs, ses)
    assert abs(errs.mean()) <= 3 * ses.mean() / math.sqrt(len(errs)), (errs.mean(), ses.mean())


def test_a_restarted_block_is_a_replay_on_the_trace_and_its_row_adds_up() -> None:
    """The row of a restarted block says ``reannealed``; its log-predictive is the running population's importance
    estimate of the block and the correction the rest, so ``log_evidence`` = previous + log-predictive + correction;
    the history holds every row once; a block smaller than the history is annealed as usual."""
    z = np.asarray(load_series("Occupancy").standardised()[:110, 0], float)
    eng = ModelEngine("autoregressive", {"order": 2}, {**DEMO, "seed": 3})
    previous = 0.0
    for a, b in ((0, 10), (10, 30), (30, 80), (80, 110)):  # 8 rows; 20 ≥ 16, 8 and 50 ≥ 28: restarts; 30 < 78: not
        (info,) = eng.update(None, [float(v) for v in z[a:b]])
        assert info.reannealed == (a in (10, 30))
        assert info.log_evidence == pytest.approx(previous + info.log_predictive + info.log_evidence_correction)
        assert info.log_evidence_correction != 0.0 or not info.reannealed
        previous = info.log_evidence
    assert eng.state.history.seen == eng.state.history.size == 108  # the first 2 values are the AR context
    hx, hy = eng.state.history.all_rows()
    assert np.allclose(hy.numpy(), z[2:110])
