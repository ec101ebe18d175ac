"""Prior–data conflict (issue 10 §3, acceptance 3): raw-scale data get evidence within 5 nats of exact or the
model is ``degraded``; and the change trigger scales with the dimension (§4).

Exact values: the conjugate formulas of :mod:`models.conjugate` (Murphy 2007 eq. 95; Bishop 2006 eq. 3.86).
The 5-nat tolerance is the acceptance's; measured errors (``python bench/conflict.py``) are below 1 nat.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from models.conjugate import LinearRegressionEvidence, gmm_one_component_log_evidence
from models.stack import StackedFamily
from workers import conflict
from workers.engine import ModelEngine

NILE = Path(__file__).resolve().parents[1] / "data" / "nile.csv"


@pytest.mark.parametrize("seed", [0, 1])
def test_gmm_on_data_around_300_is_within_5_nats_at_500_and_2000(seed: int) -> None:
    """Not degraded by the conflict checks.  The lag check (workers.sgais.lagging) may flag the 1,500-value block:
    for seed 1 SGHMC's stationary offset is beyond its 3 standard errors after the extra moves (error −0.45 nats,
    SE 0.25); its flag is then the only reason allowed."""
    from workers.stacking import LAG_REASON

    rng = np.random.default_rng(seed)
    y = rng.normal(300.0, 20.0, 2000)
    e = ModelEngine("gmm", {"dim": 1, "components": 1}, {"seed": seed})
    for stop in (500, 2000):
        e.update(None, y[e.observations : stop].tolist())
        exact = gmm_one_component_log_evidence(y[:stop])
        assert e.degraded is None or (stop == 2000 and e.degraded.startswith(LAG_REASON.split("(")[0]))
        assert abs(e.log_evidence - exact) < 5.0, (stop, e.log_evidence, exact)


def test_raw_nile_flows_within_5_nats_or_degraded() -> None:
    y = np.loadtxt(NILE, delimiter=",", skiprows=1)[:, 1]
    assert y.shape == (100,)
    e = ModelEngine("gmm", {"dim": 1, "components": 1}, {"seed": 0})
    e.update(None, y.tolist())
    exact = gmm_one_component_log_evidence(y)
    assert e.degraded is not None or abs(e.log_evidence - exact) < 5.0, (e.log_evidence, exact)
    assert e.degraded is None  # measured: 0.09 nats off


def test_raw_scale_regression_in_blocks_of_10_within_5_nats_or_degraded() -> None:
    """y = 5·x0 + N(0, 1), x0 ~ U(0, 20), blocks of 10: diverged (NumericalError) before issue 10."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0.0, 20.0, (500, 1))
    y = 5.0 * X[:, 0] + rng.normal(0.0, 1.0, 500)
    e = ModelEngine("linear_regression", {"features": 1}, {"block_size": 10, "seed": 0})
    e.update(X.tolist(), y.tolist())
    exact = LinearRegressionEvidence(1).update(X, y).log_evidence
    assert e.degraded is not None or abs(e.log_evidence - exact) < 5.0, (e.log_evidence, exact)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [10, None])
def test_unknown_noise_regression_on_raw_scale_within_5_nats_or_degraded(block_size: int | None) -> None:
    """Issue 10 acceptance 3, second half: the normal–inverse-gamma regression, default priors, covariates
    ~ U(0, 20) and a response around 300 with noise sd 20 (n = 1,000, chunks of 100).  Measured (seeds 0, 1):
    blocks of 10 end about −250 nats from exact and are ``degraded`` by the score check; the default blocks end
    −1.4 and −3.6 nats from exact, ``ok`` (the second is 8 reported standard errors off: the error bar does not
    cover the sampler's bias here, noted in the issue)."""
    from models.conjugate import linear_regression_log_evidence

    rng = np.random.default_rng(0)
    X = rng.uniform(0.0, 20.0, (1000, 2))
    y = 5.0 * X[:, 0] - 2.0 * X[:, 1] + 300.0 + rng.normal(0.0, 20.0, 1000)
    exact = linear_regression_log_evidence(X, y, noise_std=None)
    sampler = {"seed": 0} | ({"block_size": block_size} if block_size else {})
    e = ModelEngine("linear_regression", {"features": 2, "noise_std": None}, sampler)
    for a in range(0, 1000, 100):
        e.update(X[a : a + 100].tolist(), y[a : a + 100].tolist())
    assert e.degraded is not None or abs(e.log_evidence - exact) < 5.0, (e.log_evidence, exact)


def test_score_check_flags_a_population_far_from_the_posterior() -> None:
    """Stein's identity check (workers.conflict): particles from N(m', s²) against π = N(0, 1)."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(50, 2, generator=g, dtype=torch.float64) * 0.5
    log_w = torch.zeros(50, dtype=torch.float64)
    assert conflict.score_check(theta, log_w, -theta) is None  # around the mode: certified
    far = theta + 10.0
    reason = conflict.score_check(far, log_w, -far)
    assert reason is not None and "posterior standard deviations" in reason


def test_a_population_drifting_off_the_posterior_after_the_warm_up_is_flagged() -> None:
    """Linear regression (3 features, known noise) in blocks of 500 to n = 64,000 with ``control_variates`` off:
    the mini-batch gradient noise, scaled by n/|B|, carries the particles several posterior sds from the posterior
    after the warm-up, and the log-evidence ends 12–56 nats low (seeds 0–3), which was returned with status ok
    while the score check ran only in the warm-up.  Checked again at each doubling of the history, every run must
    be within 8 nats or degraded; the same data with the default sampler are not flagged."""
    g = torch.Generator().manual_seed(100)
    n = 64_000
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64) + 0.2 + torch.randn(n, generator=g, dtype=torch.float64)
    exact = LinearRegressionEvidence(3).update(x.numpy(), y.numpy()).log_evidence
    flagged = 0
    for seed, sampler in [(s, {"control_variates": False}) for s in range(4)] + [(0, {})]:
        e = ModelEngine("linear_regression", {"features": 3}, {**sampler, "seed": seed})
        for a in range(0, n, 500):
            e.update(x[a : a + 500], y[a : a + 500])
        err = e.log_evidence - exact
        assert e.degraded is not None or abs(err) < 8.0, (seed, sampler, err)
        if not sampler:
            assert e.degraded is None, e.degraded  # a population on the posterior passes every check
        flagged += e.degraded is not None
    assert flagged >= 1  # the drifting runs exist (otherwise this test shows nothing)


def test_the_start_is_taken_where_the_prior_draws_miss_the_block() -> None:
    """An identifiable family (a one-component gmm) starts from the Laplace approximation whenever its prior
    draws do not cover the block: 500 standardised values (no conflict: the mode sits inside the draws) as well
    as the same values moved 300 away; 3 values, which the draws cover, keep the prior start.  A mixture
    (``components!`` label modes) takes the start only on the conflict."""
    g = torch.Generator().manual_seed(0)
    y = torch.randn(500, 1, generator=g, dtype=torch.float64)
    one = ModelEngine("gmm", {"dim": 1, "components": 1}).family
    prior = one.sample_prior(g, 50)
    assert not conflict.clear_of_conflict(StackedFamily.of(one, torch.float64, "cpu"), prior[None], None, y[None])[0]
    assert conflict.defensive_start(g, one, prior, None, y) is not None
    assert conflict.defensive_start(g, one, prior, None, y + 300.0) is not None
    assert conflict.defensive_start(g, one, prior, None, y[:3]) is None
    two = ModelEngine("gmm", {"dim": 1, "components": 2}).family
    prior = two.sample_prior(g, 50)
    assert conflict.defensive_start(g, two, prior, None, y) is None
    assert conflict.defensive_start(g, two, prior, None, y + 300.0) is not None


@pytest.mark.parametrize("order", [1, 2])
def test_a_fresh_population_on_a_nearly_constant_block_is_accurate(order: int) -> None:
    """A level shift to a nearly constant series (RunLog after its change at 317, the demo's AR(2) 15 nats low
    with status ``ok``): 62 values near 1.45 with an AR(1) wiggle of sd 0.03, given to a fresh AR(order) with
    unknown noise and the demo's sampler in a first block of 50.  The block concentrates the posterior far inside
    the prior's spread without conflicting with it; annealed from the prior (before session 27) the moves lagged
    it and the errors over seeds 0-4 were −0.02 to −19.5 nats (AR(1)) and −11.2 to −26.1 (AR(2)), standard
    errors about 0.4; from the Laplace start −0.2 to +0.13 with standard errors 0.13-0.17.  Tolerance 1 nat:
    about 6 of those standard errors, below every error of the old path but one."""
    from models.conjugate import autoregressive_unknown_noise_log_evidence

    rng = np.random.default_rng(0)
    e = rng.normal(0.0, 0.03, 62)
    y = np.empty(62)
    y[0] = 1.45
    for t in range(1, 62):
        y[t] = 1.45 + 0.5 * (y[t - 1] - 1.45) + e[t]
    exact = autoregressive_unknown_noise_log_evidence(y, order)
    sampler = {"block_size": 50, "particles": 10, "burn_in": 10, "batch_size": 100, "learning_rate": 0.02}
    for seed in range(3):
        eng = ModelEngine("autoregressive", {"order": order}, {**sampler, "seed": seed})
        for a, b in ((0, order), (order, order + 50), (order + 50, 62)):
            eng.update(None, torch.tensor(y[a:b]))
        assert abs(eng.log_evidence - exact) < 1.0, (seed, eng.log_evidence - exact, eng.log_evidence_se)


def test_the_stacked_clearance_test_answers_as_each_model_alone() -> None:
    """``clear_of_conflict`` over a stack of gmm models with different priors, on blocks at unit scale, at 30
    and at 300, gives each model the answer of its own stack of one, and that answer is what
    ``defensive_start`` does: None (keep the prior draws) exactly when clear."""
    fams = [
        ModelEngine("gmm", {"dim": 1, "components": 1, "mean_scale": 1.0 + k, "variance_shape": 1.0 + k / 4}).family
        for k in range(6)
    ]
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([f.sample_prior(g, 20) for f in fams])
    ys = torch.stack([torch.randn(5, 1, generator=g, dtype=torch.float64) + shift for shift in (0, 0, 30, 30, 300, 0)])
    stacked = conflict.clear_of_conflict(StackedFamily(fams, torch.float64, "cpu"), draws, None, ys)
    alone = [
        conflict.clear_of_conflict(StackedFamily.of(f, torch.float64, "cpu"), draws[k][None], None, ys[k][None])[0]
        for k, f in enumerate(fams)
    ]
    assert stacked == alone
    assert stacked[0] and not stacked[4]  # both answers occur
    for k, f in enumerate(fams):
        if stacked[k]:
            assert conflict.defensive_start(g, f, draws[k], None, ys[k]) is None


def test_a_full_reservoir_degrades_the_model() -> None:
    """history_capacity biases the evidence once rows are dropped (bench/conflict.py reservoir: −37 nats for a
    5-feature regression at n = 20,000 with 500): the model is ``degraded`` from then on, not before."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 1))
    y = 0.5 * X[:, 0] + rng.normal(size=200)
    e = ModelEngine("linear_regression", {"features": 1}, {"seed": 0, "block_size": 50, "history_capacity": 100})
    infos = e.update(X[:100].tolist(), y[:100].tolist())
    assert e.degraded is None and all(i.degraded is None for i in infos)
    (info,) = e.update(X[100:150].tolist(), y[100:150].tolist())
    assert info.degraded == e.degraded and e.degraded is not None
    assert "history_capacity = 100" in e.degraded and "150 observations" in e.degraded


@pytest.mark.slow
def test_stationary_60_feature_regression_does_not_trigger_reannealing() -> None:
    """The reanneal_steps trigger scales with √D (stacking.change_threshold): 12 steps fired at D = 61."""
    rng = np.random.default_rng(0)
    n, d = 4000, 60
    X = rng.normal(size=(n, d))
    y = X @ (0.5 * rng.normal(size=d)) + rng.normal(size=n)
    # without restarts: the second block of 500 rows, as large as the history, would be replayed from the prior
    e = ModelEngine("linear_regression", {"features": d}, {"seed": 0, "restart_min_rows": None})
    infos = e.update(X.tolist(), y.tolist())
    assert not any(i.reannealed for i in infos)
    assert e.state is not None and e.state.n_change == 0


@pytest.mark.slow
def test_reannealing_keeps_the_evidence_unbiased_without_moves() -> None:
    """Acceptance 4: E[Ẑ/Z] = 1 within Monte Carlo error over 100 seeds after re-annealings.

    No SGHMC moves (``burn_in`` = ``change_burn_in`` = 0), no resampling, no warm-up reduction: every estimate
    is plain importance sampling from the prior, ``Ẑ = mean_i p(y|θ_i)`` with ``θ_i ~ p(θ)`` (thesis eq. 4.6
    with the incremental weights of eq. 4.13 telescoping), unbiased whatever the adaptive schedule.  The slope
    changes at n = 20; a block needing ``reanneal_steps`` = 6 annealing steps triggers a re-annealing — an
    event that depends on the running population.  The replay that replaces the running estimate uses fresh
    prior draws after the trigger, so ``E[Ẑ | trigger] = Z`` and the mean over seeds is 1 up to Monte Carlo
    error.  Tails: with M = 50 draws, D = 2 and n = 30, ``p(y|θ)/Z`` has all moments finite (Gaussian) and
    the ratio over seeds is a mean of 50 of them; measured (``python bench/conflict.py merges``) ESS of the
    100 ratios 72, so the sample SE is a fair yardstick for the 3-SE bound (asserted below: ESS ≥ 25).
    """
    rng = np.random.default_rng(12345)
    n = 30
    X = rng.normal(size=(n, 1))
    y = np.where(np.arange(n) < 20, 0.5, -1.5) * X[:, 0] + 0.3 + rng.normal(size=n)
    exact = LinearRegressionEvidence(1).update(X, y).log_evidence
    sampler = {"particles": 50, "warmup_particles": None, "warmup_observations": 0, "burn_in": 0, "change_burn_in": 0}
    sampler |= {"resample_threshold": 0.0, "block_size": 10, "reanneal_steps": 6}
    ratios, replaced = [], 0
    for seed in range(100):
        e = ModelEngine("linear_regression", {"features": 1}, {**sampler, "seed": seed})
        infos = e.update(X.tolist(), y.tolist())
        replaced += any(i.reannealed for i in infos)
        # Ẑ itself (eq. 4.6) is the unbiased estimate; the reported log_evidence adds σ̂²/2 to centre log Ẑ, and with
        # an ESS near 1 here σ̂² (the jackknife's, workers.sgais.epoch_variance) reaches several nats²
        ratios.append(math.exp(e.state.log_evidence_uncorrected - exact))
    r = np.asarray(ratios)
    se = r.std(ddof=1) / math.sqrt(r.size)
    ess = r.sum() ** 2 / (r**2).sum()
    assert replaced >= 50, replaced  # the runs did re-anneal (measured: 94 of 100 on the last block)
    assert ess >= 25, ess
    assert abs(r.mean() - 1.0) <= 3 * se, (r.mean(), se, ess)


def _separated_mixture_log_evidence(groups: list[np.ndarray], alpha: float = 1.0, **prior: float) -> float:
    """Exact log-evidence of a ``gmm`` on clusters so far apart that each observation's component is certain
    and every component takes one cluster: ``C!`` label modes, each the Dirichlet–multinomial of the cluster
    sizes times every cluster's normal–inverse-gamma evidence (Murphy 2007 eq. 95).  The omitted cross
    terms are below exp(−70) per observation; the modes that merge clusters lie hundreds of nats lower."""
    from scipy.special import gammaln

    C, n = len(groups), sum(len(g) for g in groups)
    sizes = sum(gammaln(alpha + len(g)) - gammaln(alpha) for g in groups)
    dirichlet = gammaln(C * alpha) - gammaln(C * alpha + n) + sizes
    return math.lgamma(C + 1) + float(dirichlet) + sum(gmm_one_component_log_evidence(g, **prior) for g in groups)


def test_a_mixture_laplace_start_covers_every_label_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three clusters (means 20, 26, 32, sd 0.5; a prior wide enough not to merge them) through the defensive
    start (forced: ``CONFLICT_Z`` 0).  Its importance-sampling estimate of the block's evidence,
    ``log mean exp(log w + Σ log p(y|θ))``, matches the exact value within 4 of its own standard errors; a
    proposal around one of the 3! = 6 label modes comes out log 6 = 1.79 nats low (measured with the
    symmetrisation removed: −1.787; with it: +0.005, the estimator's standard error being 0.012)."""
    monkeypatch.setattr(conflict, "CONFLICT_Z", 0.0)
    rng = np.random.default_rng(0)
    groups = [rng.normal(mu, 0.5, 40) for mu in (20.0, 26.0, 32.0)]
    prior = {"mean_location": 26.0, "mean_variance_ratio": 400.0}
    y = torch.as_tensor(np.concatenate(groups), dtype=torch.float64)[:, None]
    e = ModelEngine("gmm", {"dim": 1, "components": 3, **prior}, {"seed": 0})
    g = torch.Generator().manual_seed(1)
    M = 4000
    start = conflict.defensive_start(g, e.family, e.family.sample_prior(g, M), None, y)
    assert start is not None
    theta, log_w, _ = start
    assert torch.isfinite(log_w).all()
    terms = log_w + e.family.log_likelihood(theta, None, y).sum(-1)
    log_z = float(torch.logsumexp(terms, 0)) - math.log(M)
    w = torch.exp(terms - terms.max())
    se = float(w.std() / w.mean()) / math.sqrt(M)  # delta method: sd of log mean(w)
    exact = _separated_mixture_log_evidence(groups, **prior)
    assert se < 0.2 and abs(log_z - exact) < 4 * se, (log_z, exact, se)


def test_the_symmetrised_proposal_is_normalised(monkeypatch: pytest.MonkeyPatch) -> None:
    """``E_q[p/q] = 1``: the defensive start's weights (no likelihood) average to 1 within 4 standard errors,
    so the orbit average is the density the permuted draws come from."""
    monkeypatch.setattr(conflict, "CONFLICT_Z", 0.0)
    rng = np.random.default_rng(1)
    y = torch.as_tensor(np.concatenate([rng.normal(mu, 0.5, 30) for mu in (-3.0, 3.0)]))[:, None]
    e = ModelEngine("gmm", {"dim": 1, "components": 2}, {"seed": 0})
    g = torch.Generator().manual_seed(2)
    M = 20000
    start = conflict.defensive_start(g, e.family, e.family.sample_prior(g, M), None, y)
    assert start is not None
    w = torch.exp(start[1])
    assert abs(float(w.mean()) - 1.0) < 4 * float(w.std()) / math.sqrt(M), float(w.mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_mixture_with_many_particles_keeps_moving_between_label_modes(seed: int) -> None:
    """A 3-component mixture (D = 8) with 40 particles (M ≥ 4D, where the step sizes' correlation factor
    applies to other families): three clusters 12 sds apart, 180 observations in blocks of 60, annealed from
    the prior.  The particles spread over the 3! label modes, whose separation made the particle correlation
    matrix singular and the factor stopped the moves (errors −2.9, −26.3, −18.8 nats for seeds 0–2); with
    the factor off for exchangeable components the errors are 0.01, −0.53, −0.42.  Tolerance 2 nats: about
    4× the largest error measured with the fix, below the smallest without it."""
    rng = np.random.default_rng(0)
    groups = [rng.normal(mu, 0.5, 60) for mu in (-6.0, 0.0, 6.0)]
    y = np.concatenate(groups)
    rng.shuffle(y)
    e = ModelEngine("gmm", {"dim": 1, "components": 3}, {"seed": seed, "particles": 40, "warmup_particles": 40})
    for start in range(0, 180, 60):
        e.update(None, y[start : start + 60].tolist())
    assert abs(e.log_evidence - _separated_mixture_log_evidence(groups)) < 2.0
    assert e.degraded is None


def test_spread_ratio_is_one_under_the_posterior_along_a_ridge_and_large_for_a_wide_cloud() -> None:
    """workers.conflict.spread_ratio: 200 exact draws of π = N(0, Σ) with correlation 0.995 between two of three
    coordinates (score −Σ⁻¹θ).  Under π the matrix C = −Cov(θ, ∇ log π) is I up to entries with standard error
    √(2/200) = 0.1 in whitened coordinates (its eigenvalues do not depend on the coordinates), so λ_max ≤ 1 + ‖E‖ ≈
    1.35; 2 leaves room.  The diagonal c_d alone on this ridge has errors ~ 1/(1 − ρ²) ≈ 100 times larger.  A cloud
    10 times wider than π along one direction gives λ_max ≈ 100, far beyond SCORE_C; below ESS 4D: not measured."""
    g = torch.Generator().manual_seed(1)
    cov = torch.tensor([[1.0, 0.995, 0.0], [0.995, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    prec = torch.linalg.inv(cov)
    draws = torch.randn(200, 3, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T
    log_w = torch.zeros(200, dtype=torch.float64)
    ratio = float(conflict.spread_ratio(draws, log_w, -draws @ prec))
    assert 0.5 < ratio < 2.0
    assert conflict.score_check(draws, log_w, -draws @ prec) is None
    wide = draws.clone()
    wide[:, 2] *= 10.0
    assert float(conflict.spread_ratio(wide, log_w, -wide @ prec)) > 2 * conflict.SCORE_C  # ≈ 100 ± 10%
    reason = conflict.score_check(wide, log_w, -wide @ prec)
    assert reason is not None and "wider than the posterior" in reason
    few = torch.full((200,), -math.inf, dtype=torch.float64)
    few[:11] = 0.0  # ESS 11 < 4D = 12
    assert math.isnan(float(conflict.spread_ratio(wide, few, -wide @ prec)))


def test_sghmc_without_preconditioning_on_an_ar1_ridge_is_flagged() -> None:
    """AR(1) around a level of 3 (the series of tests/workers/test_kernel.py's ridge test) with
    ``preconditioning: false``: the fixed-step moves leave clouds 5–10 times wider than the posterior and the
    log-evidence ends about −1,990 nats from exact for seeds 0–3, which seeds 1 and 3 returned with status ok before
    the spread check (bench/README.md, "Stein spread check").  Every run must be within 8 nats or degraded."""
    from models.conjugate import autoregressive_unknown_noise_log_evidence
    from tests.workers.test_kernel import ar1_around_level_3

    y = ar1_around_level_3()
    exact = autoregressive_unknown_noise_log_evidence(y, 1)
    for seed in (1, 3):
        sampler = {"block_size": 5, "seed": seed, "preconditioning": False, "gibbs_sweeps": 0}  # SGHMC in the warm-up
        e = ModelEngine("autoregressive", {"order": 1}, sampler)
        for a in range(0, 300, 5):
            e.update(None, y[a : a + 5].tolist())
        assert e.degraded is not None or abs(e.log_evidence - exact) < 8.0, (seed, e.log_evidence - exact)


def test_the_laplace_start_of_a_mixture_takes_its_best_local_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 5-component gmm of bench/reference.py (data: ``reference_methods.mixture_data(1000, 2, 5, 2020)``, the
    thesis prior), first 500 values.  With torch's L-BFGS, seed 5 from the best prior draw alone reached a poor
    local mode and the defensive start's log Ẑ was −2723.19, 208 nats below seeds 0–7 with four starts (−2514.7 to
    −2518.1); every later block stayed there (n = 10³: 406 nats low, status ok).  With scipy's L-BFGS-B (session
    27) seeds 0–6 with four starts give −2513.9 to −2515.5, and one start lands apart only for seed 1: −2535.7
    against −2515.0.  Four starts (workers.conflict.best_laplace) must land within 10 nats of the worst of those
    seeds; one start must land at least 10 nats below them (the test sees the difference)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "reference_methods.py"
    spec = importlib.util.spec_from_file_location("reference_methods", path)
    assert spec is not None and spec.loader is not None
    methods = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "reference_methods", methods)  # its dataclasses look their module up
    spec.loader.exec_module(methods)
    y, _ = methods.mixture_data(1000, 2, 5, 2020)
    block = torch.as_tensor(y[:500], dtype=torch.float64)

    def first_block() -> float:
        e = ModelEngine("gmm", {"dim": 2, "components": 5}, {"seed": 1})
        e.update(None, block)
        return e.log_evidence

    four = first_block()
    assert four > -2515.5 - 10.0
    monkeypatch.setattr(conflict, "LAPLACE_STARTS", 1)
    assert first_block() < four - 10.0


UNIMODAL_CASES = {  # family, params, a block that conflicts with the prior: (x | None, y)
    "gmm one component": (
        "gmm",
        {"dim": 1, "components": 1},
        lambda g: (None, 300 + 5 * torch.randn(40, generator=g)),
    ),
    "linear regression, unknown noise": (
        "linear_regression",
        {"features": 2, "noise_std": None},
        lambda g: (
            x := torch.randn(40, 2, generator=g),
            50 + x @ torch.tensor([20.0, -30.0]) + torch.randn(40, generator=g),
        ),
    ),
    "logistic regression": (
        "logistic_regression",
        {"features": 2, "classes": 3, "prior_std": 10.0},
        lambda g: (x := 3 * torch.randn(60, 2, generator=g), (x[:, 0] > 0).long() + (x[:, 1] > 1).long()),
    ),
    "AR(1), known noise": (
        "autoregressive",
        {"order": 1, "noise_std": 0.5},
        lambda g: (None, 40 + torch.randn(40, generator=g)),
    ),
}


@pytest.mark.parametrize("case", list(UNIMODAL_CASES))
def test_families_claiming_one_mode_reach_it_from_every_start(case: str) -> None:
    """A family with ``unimodal`` stops at its first Laplace fit (workers.conflict.best_laplace).  The claim is
    checked where a second mode would show: a block far from the prior, fitted by L-BFGS (:func:`laplace`) from each
    of the 16 best prior draws; every fit that succeeds must reach the first one's mode (to 1e-4 of a posterior sd).
    The AR(1) with unknown noise is not claimed (semi-conjugate prior) and keeps four starts."""
    from models import make_family
    from models.base import Family

    name, params, block = UNIMODAL_CASES[case]
    family: Family = make_family(name, params)
    assert family.unimodal
    g = torch.Generator().manual_seed(0)
    x, y = block(g)
    x, y = family.validate(x.tolist() if x is not None else None, y.tolist())
    x, y, _ = family.prepare(x, y, None)
    draws = family.sample_prior(g, 200, torch.float64, torch.device("cpu"))
    one = conflict.one_block(family, x, y, torch.device("cpu"))
    with torch.no_grad():
        lt = one.family.log_prior(draws[None])[0] + one.family.log_likelihood(draws[None], one.x, one.y).sum(-1)[0]
    assert not conflict.clear_of_conflict(one.family, draws[None], one.x, one.y)[0]  # the conflict the fit is for
    fits = [conflict.laplace(one, draws[i]) for i in torch.argsort(lt, descending=True)[:16].tolist()]
    fits = [f for f in fits if f is not None]  # a start can fail (then best_laplace tries the next)
    assert len(fits) >= 12
    sd = fits[0].scale_tril.pow(2).sum(1).sqrt()
    for f in fits[1:]:
        assert ((f.mode - fits[0].mode).abs() / sd).max() < 1e-4


CLOSED_FORM_CASES = {  # family, params, raw (x | None, y) of a block
    "gmm, d = 1, data near 300": ("gmm", {"dim": 1, "components": 1, "variance_shape": 3.0}, None, [310.0, 290.0]),
    "gmm, d = 2, one row": ("gmm", {"dim": 2, "components": 1, "mean_scale": 4.0}, None, [[0.7, -1.2]]),
    "linear regression, known noise": (
        "linear_regression",
        {"features": 2, "noise_std": 0.5},
        [[1.0, 2.0], [-0.5, 0.3], [2.0, -1.0], [0.1, 0.1]],
        [30.0, 9.0, 12.0, 10.0],
    ),
    "linear regression, unknown noise": (
        "linear_regression",
        {"features": 2, "noise_std": None},
        [[1.0, 2.0], [-0.5, 0.3], [2.0, -1.0], [0.1, 0.1], [1.5, 0.2]],
        [30.0, 9.0, 12.0, 10.0, 21.0],
    ),
    "AR(1), unknown noise, raw Nile flows": (
        "autoregressive",
        {"order": 1},
        None,
        [1120.0, 1160, 963, 1210, 1160, 1160],
    ),
    "AR(2), unknown noise, a random walk": ("autoregressive", {"order": 2}, None, [0.3, 1.1, 0.4, 1.9, 2.2, 1.4, 2.9]),
}


@pytest.mark.parametrize("case", list(CLOSED_FORM_CASES))
def test_a_closed_form_mode_is_the_maximum_found_by_a_reference_optimiser(case: str) -> None:
    """:func:`workers.conflict.closed_form_mode` (a one-component gmm's normal–inverse-gamma mode; a quadratic
    family's ``(A0 + A)⁻¹(c0 + c)``; a linear-Gaussian family with unknown noise by its profile over ``log σ²``) is
    the maximum of the block's log target that scipy's BFGS finds from the prior mean on the same log density (to
    1e-5 of a posterior sd), and :func:`workers.conflict.best_laplace` returns it, whatever the starts it is given."""
    from scipy.optimize import minimize

    from models import make_family

    name, params, x, y = CLOSED_FORM_CASES[case]
    family = make_family(name, params)
    xv, yv = family.validate(x, y)
    xv, yv, _ = family.prepare(xv, yv, None)
    one = conflict.one_block(family, xv, yv, torch.device("cpu"))
    mode = conflict.closed_form_mode(one)
    assert mode is not None

    def negative(t: np.ndarray) -> float:
        v = torch.as_tensor(t, dtype=torch.float64)[None, None]
        return -float((one.family.log_prior(v) + one.family.log_likelihood(v, one.x, one.y).sum(-1))[0, 0])

    draws = family.sample_prior(torch.Generator().manual_seed(1), 1000, torch.float64, torch.device("cpu"))
    ref = minimize(negative, draws.mean(0).numpy(), method="BFGS", options={"gtol": 1e-10, "maxiter": 10_000})
    lap = conflict.best_laplace(one, draws[:4], torch.zeros(4, dtype=torch.float64))
    assert lap is not None and torch.equal(lap.mode, mode)
    sd = lap.scale_tril.pow(2).sum(1).sqrt()
    assert ((mode - torch.as_tensor(ref.x)).abs() / sd).max() < 1e-5, (mode, ref.x)
    assert -negative(mode.numpy()) >= -ref.fun - 1e-9 * abs(ref.fun)


def test_a_family_without_a_closed_form_mode_is_fitted_by_lbfgs() -> None:
    """A two-component gmm has no closed-form mode: :func:`workers.conflict.best_laplace` fits it from its starts."""
    from models import make_family

    family = make_family("gmm", {"dim": 1, "components": 2})
    one = conflict.one_block(family, None, torch.tensor([300.0, 310.0, 5.0], dtype=torch.float64), torch.device("cpu"))
    assert conflict.closed_form_mode(one) is None and conflict.closed_form_laplace(one) is None


def test_the_profile_mode_survives_a_rank_deficient_block() -> None:
    """A block whose lagged values are nearly constant (an AR(1) on a flat stretch of a river series, standardised)
    makes ``e^{−u}ZᵀZ + P`` singular in float64 where ``σ² → 0``: those grid points are left out, the mode is still
    found, and the gradient vanishes there (it raised ``torch.linalg.LinAlgError`` in ``bench/changepoints.py``)."""
    from models.densities import unknown_noise_gradient_from_statistics, unknown_noise_mode_from_statistics

    # the statistics (ZᵀZ, Zᵀy, yᵀy, n, P, q) of the block that raised, AR(1) on BrentSpotPrice
    T = torch.tensor(
        [1.9152921485299115, -3.0945857142192, -3.0945857142192, 5.0, 1.8706347164735868, -3.022431577639415]
        + [3.831183503842836, 7.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0],
        dtype=torch.float64,
    )
    mode = unknown_noise_mode_from_statistics(T[None])
    assert mode is not None
    grad = unknown_noise_gradient_from_statistics(mode[:, None], T[None])
    assert grad.abs().max() < 1e-8
