"""Issue 10, trustworthy model comparison: a running log-evidence that drifts while the posterior moves is
``degraded`` until a re-annealing replaces it; stationary well-specified models stay ``ok``.

Setting: a one-component ``gmm`` (exact evidence: Murphy 2007 eq. 95, :func:`gmm_one_component_log_evidence`)
fed in blocks of 100 with a 400-observation warm-up, so that the bench's case (``python bench/conflict.py
drift``: blocks of 500, a jump of the data mean by 3 sd at n = 2,500) runs in seconds.  The jump at n = 500
makes the block to 600 mark a change and re-anneal at once; the blocks up to the next replay (n = 1,200, the
next doubling) need 6–20 annealing steps.  Measured on seeds 0–2 (``workers.stacking``, "Moving posteriors"):
seed 1's running estimate drifts to −3.2 nats at n = 900 with a reported SE of 0.63 (5 SE), which had status
``ok`` before the rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from models.conjugate import gmm_one_component_log_evidence
from workers.engine import ModelEngine
from workers.stacking import MOVING_STEPS, change_threshold

SAMPLER = {"block_size": 100, "warmup_observations": 400}
GMM1 = ("gmm", {"dim": 1, "components": 1})


def _rows(seed: int, n: int, jump: float):
    rng = np.random.default_rng(seed)
    y = np.concatenate([rng.normal(0.0, 1.0, min(n, 500)), rng.normal(jump, 1.0, max(n - 500, 0))])
    e = ModelEngine(*GMM1, {**SAMPLER, "seed": seed})
    infos = e.update(None, y.tolist())
    exact = [gmm_one_component_log_evidence(y[: (k + 1) * 100]) for k in range(len(infos))]
    return e, infos, exact


def test_running_evidence_after_a_change_is_degraded_until_a_replay() -> None:
    e, infos, _ = _rows(seed=1, n=1200, jump=3.0)
    by_n = {(k + 1) * 100: i for k, i in enumerate(infos)}
    assert by_n[600].reannealed and by_n[600].degraded is None  # the replay's estimate is certified
    limit = change_threshold(MOVING_STEPS, 2)
    for n in range(700, 1200, 100):  # the running population absorbs the moving posterior: not certified
        assert by_n[n].degraded is not None and "annealing steps" in by_n[n].degraded, (n, by_n[n])
    assert by_n[700].annealing_steps >= limit
    assert "next at n >= 1200" in by_n[700].degraded
    assert by_n[1200].reannealed and by_n[1200].degraded is None and e.degraded is None  # cleared by the replay


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stationary_well_specified_model_stays_ok(seed: int) -> None:
    """No block after the warm-up comes near the limit on stationary data (measured: ≤ 4 steps here, ≤ 6 in
    16 runs of four families at n = 10⁴ with the default blocks, ``bench/conflict.py stationary``)."""
    e, infos, _ = _rows(seed, n=1500, jump=0.0)
    assert all(i.degraded is None for i in infos) and e.degraded is None
    assert max(i.annealing_steps for i in infos[4:]) < change_threshold(MOVING_STEPS, 2) / 2


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_after_a_change_every_ok_row_is_within_four_error_bars(seed: int) -> None:
    """The standard: a number is right within its error bar or flagged.  Four reported SEs: the reported SE is
    calibrated to within a factor 2 of the spread over seeds (``bench/calibration.py``, ratios 0.6–1.1), so a
    correct row lies within 4 SE with probability ≥ 95 % (2 true sd) and usually far more."""
    _, infos, exact = _rows(seed, n=1500, jump=3.0)
    for k, (info, z) in enumerate(zip(infos, exact, strict=True)):
        if info.degraded is None:
            assert abs(info.log_evidence - z) <= 4 * info.log_evidence_se, ((k + 1) * 100, info, z)
