"""Extra moves while the particles lag their tempered target (workers.sgais._catch_up, lagging).

The lag test is Stein's identity against the exact score; the moves it adds are chosen from each model's own
particles and draws, and a model still lagging after its rounds is flagged (workers.stacking.LAG_REASON).
"""

from __future__ import annotations

import numpy as np
import torch

from models.conjugate import autoregressive_unknown_noise_log_evidence
from service.datasets import load_series
from workers.engine import ModelEngine
from workers.sgais import lagging

D64 = torch.float64


def _gaussian(offset: float, spread: float, seed: int) -> bool:
    """Whether 50 equally weighted particles drawn from N(offset, spread²) in 3 coordinates lag N(0, I)."""
    g = torch.Generator().manual_seed(seed)
    theta = offset + spread * torch.randn(1, 50, 3, generator=g, dtype=D64)
    return bool(lagging(theta, torch.zeros(1, 50, dtype=D64), -theta)[0])  # the score of N(0, I) is -θ


def test_lagging_sees_an_offset_or_a_wide_cloud_and_rarely_draws_from_the_target() -> None:
    # under the target each coordinate's |t|·√ESS is about |N(0, 1)|: beyond 3 with probability 0.27%, so about
    # 0.8% of checks of 3 coordinates; 2 of 100 seeds is well above that and far below a broken statistic's rate
    assert sum(_gaussian(0.0, 1.0, seed) for seed in range(100)) <= 2
    assert all(_gaussian(2.0, 1.0, seed) for seed in range(20))  # 2 target sds off: |t|·√50 ≈ 2/√5·7 ≈ 6
    assert all(_gaussian(0.0, 3.0, seed) for seed in range(20))  # 9 times the target's variance (limit 4)


def _brent_ar2(
    seed: int, catch_up_moves: int, restart: bool = False, gibbs: bool = False
) -> tuple[float, float, str | None]:
    """AR(2) on the standardised Brent series' first 200 values in blocks of 50 with the default learning rate and
    the demo's burn-in (10): (error against the exact log-evidence in nats, reported SE, status reason).  Without
    ``restart`` the second block (as many rows as the history) is annealed like any other, which is where the
    moves lag (``restart_min_rows``, workers.stacking._restart_begin).  SGHMC's moves alone unless ``gibbs``
    (the default's Gibbs sweeps on the exact conditionals instead: tests/workers/test_gibbs_sweeps.py)."""
    z = np.asarray(load_series("BrentSpotPrice").standardised()[:200, 0], float)
    sampler = {"block_size": 50, "particles": 10, "burn_in": 10, "batch_size": 100, "seed": seed}
    sampler |= {"catch_up_moves": catch_up_moves, "restart_min_rows": 16 if restart else None}
    sampler |= {"gibbs_sweeps": 2 if gibbs else 0}
    e = ModelEngine("autoregressive", {"order": 2}, sampler)
    for a in range(0, 200, 50):
        e.update(None, [float(v) for v in z[a : a + 50]])
    return e.log_evidence - autoregressive_unknown_noise_log_evidence(z, 2), e.log_evidence_se, e.degraded


def test_a_lagging_population_catches_up_or_is_flagged_instead_of_reporting_a_wrong_value() -> None:
    # Brent's noise variance moves far between its first blocks, and 10 moves per annealing step lag it: without
    # the extra moves seed 1 ends about 8 nats low with SE 0.4 and status ok
    err, se, degraded = _brent_ar2(1, 0)
    assert err < -3 * se and degraded is None
    for seed in range(3):
        err, se, degraded = _brent_ar2(seed, 4)
        assert abs(err) <= 3 * se or degraded is not None, (seed, err, se, degraded)
    # the default: the second block, as large as the history, is absorbed by a fresh run over both (a restart)
    err, se, degraded = _brent_ar2(1, 0, restart=True)
    assert abs(err) <= 3 * se and degraded is None, (err, se, degraded)
    # the default's Gibbs sweeps on the exact conditionals: right without extra moves or a restart
    err, se, degraded = _brent_ar2(1, 0, gibbs=True)
    assert abs(err) <= 3 * se and degraded is None, (err, se, degraded)


def test_extra_moves_keep_a_models_bits_alone_or_in_a_stack() -> None:
    """Four AR(2) models on Brent's first 200 values, one with ``catch_up_moves: 0``, advanced alone and as one
    stack: the same bits (states, weights, generator states), and the extra moves ran in some of them."""
    from workers.stacking import advance_stack

    z = torch.tensor(np.asarray(load_series("BrentSpotPrice").standardised()[:200, 0], float), dtype=D64)
    base = {"block_size": 50, "particles": 10, "burn_in": 10, "batch_size": 100}
    samplers = [{**base, "seed": s} for s in range(3)] + [{**base, "seed": 1, "catch_up_moves": 0}]

    def engines() -> list[ModelEngine]:
        return [ModelEngine("autoregressive", {"order": 2}, s) for s in samplers]

    def bits(e: ModelEngine) -> list[torch.Tensor]:
        return [e.state.theta, e.state.log_w, e.state.velocity, e.generator.get_state()]

    alone = engines()
    for e in alone:
        for a in range(0, 200, 50):
            e.update(None, z[a : a + 50])
    stacked = engines()
    for a in range(0, 200, 50):
        for res in advance_stack(stacked, [(None, z[a : a + 50])] * len(stacked)):
            assert isinstance(res, list), res
    for e, f in zip(alone, stacked, strict=True):
        assert all(torch.equal(u, v) for u, v in zip(bits(e), bits(f), strict=True))
    # seed 1 with and without the extra moves: they ran (different bits)
    assert not torch.equal(alone[1].state.theta, alone[3].state.theta)
