"""Properties of the SGAIS kernel: ESS solver, resampling, evidence bookkeeping, determinism, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models import make_family
from models.stack import StackedFamily
from workers import sgais, stacking
from workers.engine import ModelEngine, posterior_summary_from_bytes
from workers.ess import conditional_ess, ess, solve_increment
from workers.fisher import fisher_diagonal
from workers.resampling import systematic_resample
from workers.settings import SamplerSettings


def linear_data(n: int, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, generator=g, dtype=torch.float64)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = x @ w + 0.5 + torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


# ----- ESS solver ----------------------------------------------------------------------------


@pytest.mark.parametrize("uniform", [True, False])
def test_ess_solver_hits_its_target(uniform: bool) -> None:
    g = torch.Generator().manual_seed(1)
    log_lik = -50.0 * torch.rand(20, generator=g, dtype=torch.float64)
    log_w = torch.zeros(20, dtype=torch.float64) if uniform else torch.randn(20, generator=g, dtype=torch.float64)
    target = 10.0
    delta = solve_increment(log_w, log_lik, target=target, remaining=1.0)
    assert 0 < delta < 1
    # the contract: the target met, at most ess_tolerance (1e-3) · M particles above it
    assert target <= float(conditional_ess(log_w, log_lik, delta)) <= target + 1e-3 * 20


def test_ess_solver_returns_the_remaining_increment_when_it_already_meets_the_target() -> None:
    log_lik = torch.tensor([-1.0, -1.01, -0.99, -1.0], dtype=torch.float64)
    log_w = torch.zeros(4, dtype=torch.float64)
    assert solve_increment(log_w, log_lik, target=2.0, remaining=0.3) == 0.3


def test_ess_solver_handles_asymmetric_log_likelihoods() -> None:
    # One particle far better than the rest (a long left tail of log-likelihoods): the solver must
    # still land on the target rather than collapse to one particle or stall at Δ = 0.
    log_lik = torch.cat([torch.tensor([0.0]), torch.full((9,), -1e4)]).to(torch.float64)
    log_w = torch.zeros(10, dtype=torch.float64)
    delta = solve_increment(log_w, log_lik, target=5.0, remaining=1.0)
    assert delta > 0
    assert 5.0 <= float(conditional_ess(log_w, log_lik, delta)) <= 5.0 + 1e-3 * 10
    # and with the sign flipped (one particle far worse)
    delta = solve_increment(log_w, -log_lik - 1e4, target=5.0, remaining=1.0)
    assert float(conditional_ess(log_w, -log_lik - 1e4, delta)) >= 5.0 - 1e-3


def test_ess_solver_gives_each_row_of_a_stack_its_own_bits() -> None:
    """Rows that take their whole remainder (they never search), rows that stop early and rows that search long,
    in one stack: each row's increment is the one it gets alone, bit for bit (the search runs on the rows still
    searching only)."""
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor([1e-3, 0.5, 3.0, 40.0, 1e-3, 300.0, 8.0], dtype=torch.float64)
    log_lik = scales[:, None] * torch.randn(7, 30, generator=g, dtype=torch.float64)
    log_w = torch.randn(7, 30, generator=g, dtype=torch.float64)
    target = torch.tensor([27.0, 29.9, 20.0, 9.0, 29.0, 21.0, 3.0], dtype=torch.float64)
    remaining = torch.tensor([1.0, 0.7, 1.0, 0.2, 1.0, 1.0, 0.05], dtype=torch.float64)
    stacked = solve_increment(log_w, log_lik, target=target, remaining=remaining)
    alone = [
        solve_increment(log_w[k], log_lik[k], target=float(target[k]), remaining=float(remaining[k])) for k in range(7)
    ]
    assert stacked.tolist() == alone
    assert stacked[0] == remaining[0] and stacked[4] == remaining[4]  # these two never searched
    assert (stacked[[1, 2, 3, 5]] < remaining[[1, 2, 3, 5]]).all()


def test_ess_solver_rejects_nan() -> None:
    with pytest.raises(FloatingPointError):
        solve_increment(torch.zeros(3), torch.tensor([0.0, float("nan"), 1.0]), target=1.5, remaining=1.0)


def test_conditional_ess_equals_thesis_ess_for_uniform_weights() -> None:
    g = torch.Generator().manual_seed(3)
    log_lik = torch.randn(50, generator=g, dtype=torch.float64) * 3
    for delta in (0.1, 0.5, 1.0):
        assert float(conditional_ess(torch.zeros(50, dtype=torch.float64), log_lik, delta)) == pytest.approx(
            float(ess(delta * log_lik)), rel=1e-12
        )


# ----- resampling ----------------------------------------------------------------------------


def test_systematic_resampling_gives_floor_or_ceil_copies() -> None:
    g = torch.Generator().manual_seed(0)
    log_w = torch.log(torch.tensor([0.05, 0.4, 0.15, 0.3, 0.1], dtype=torch.float64))
    W = torch.softmax(log_w, 0)
    for _ in range(50):
        counts = torch.bincount(systematic_resample(g, log_w), minlength=5).to(torch.float64)
        assert counts.sum() == 5
        assert torch.all(counts >= torch.floor(5 * W) - 1e-9) and torch.all(counts <= torch.ceil(5 * W) + 1e-9)


# ----- evidence bookkeeping --------------------------------------------------------------------


def _frozen_settings(**kw) -> SamplerSettings:
    # burn_in = 0: particles never move, so the annealed weights telescope to exp(ℓ_block) exactly.
    return SamplerSettings(particles=8, warmup_particles=None, burn_in=0, resample_threshold=0.0, seed=0, **kw)


def _engine(settings: SamplerSettings, **params) -> ModelEngine:
    return ModelEngine("linear_regression", {"features": 3, **params}, settings)


def test_evidence_is_exact_for_frozen_particles_with_non_uniform_weights() -> None:
    e = _engine(_frozen_settings())
    g = torch.Generator().manual_seed(0)
    x, y = linear_data(40)
    # non-uniform weights before the block, as left by an earlier block without resampling
    e.state = e.state._replace(log_w=torch.randn(8, generator=g, dtype=torch.float64))
    x, y = x[:6], y[:6]
    before = e.state.log_w.clone()
    (info,) = e.update(x, y)
    ll = e.family.log_likelihood(e.state.theta, x, y).sum(-1)
    expected = float(torch.logsumexp(before + ll, 0) - math.log(8))
    assert info.annealing_steps > 1
    assert e.state.log_evidence_uncorrected == pytest.approx(expected, abs=1e-9)  # thesis eq. 4.6
    # reported: plus half the estimated variance (SGAISState.log_evidence: the lognormal bias correction)
    assert info.log_evidence == pytest.approx(expected + 0.5 * e.state.log_evidence_var, abs=1e-9)
    before_reported = float(torch.logsumexp(before, 0) - math.log(8)) + 0.5 * float(sgais.epoch_variance(before))
    assert info.log_predictive == pytest.approx(info.log_evidence - before_reported, abs=1e-9)


def test_resampling_preserves_the_evidence_estimate() -> None:
    e = _engine(
        SamplerSettings(
            particles=8, warmup_particles=None, burn_in=0, resample_threshold=1.0, seed=0, restart_min_rows=None
        )
    )
    x, y = linear_data(21)
    # one row first: the block below is then annealed (a population's first block that its prior draws do not
    # cover is taken from the Laplace start in one increment, workers.conflict; and without restarts, a block as
    # large as the history is not replayed from the prior, workers.stacking._restart_begin)
    e.update(x[:1], y[:1])
    x, y = x[1:], y[1:]
    before = e.state.log_evidence_uncorrected
    ll = e.family.log_likelihood(e.state.theta, x, y).sum(-1)
    # With a single increment (ESS target met trivially is impossible here), check the first step's identity
    # instead: after the block, Ẑ is the mean of the weights carried through resampling; with frozen particles
    # its expectation equals mean(exp(ℓ)) and every resampling keeps logsumexp(log w) unchanged at that moment.
    (info,) = e.update(x, y)
    assert info.resampled and info.annealing_steps > 1
    assert torch.allclose(e.state.log_w, e.state.log_w[0].expand(8))
    assert math.isfinite(info.log_evidence)
    # a product over the steps of means of exp(δ_s ℓ_i) over particles that exist: at most exp(max ℓ)
    assert e.state.log_evidence_uncorrected - before <= float(ll.max())


@pytest.mark.parametrize("moves", ["adaptive", "every_step"])
def test_adaptive_moves_leave_a_one_step_block_in_place_unless_it_resamples(moves: str) -> None:
    settings = SamplerSettings(
        particles=20, warmup_particles=None, burn_in=3, batch_size=50, resample_threshold=0.95, seed=0, moves=moves
    )
    e = _engine(settings)
    x, y = linear_data(400)
    e.update(x[:300], y[:300])  # several annealing steps: the particles moved in any case
    before, one_step, resampled = e.state.theta.clone(), 0, 0
    for a in range(300, 400):
        (info,) = e.update(x[a : a + 1], y[a : a + 1])
        moved = not torch.equal(e.state.theta, before)
        # adaptive: a block taken in one step moves exactly when it resampled; every_step: always
        assert moved == (info.resampled or info.annealing_steps > 1 or moves == "every_step")
        one_step += info.annealing_steps == 1
        resampled += info.resampled and info.annealing_steps == 1
        before = e.state.theta.clone()
    assert one_step >= 50 and resampled >= 1  # both branches were taken


def test_guard_on_annealing_steps_is_reported() -> None:
    e = _engine(
        SamplerSettings(particles=8, burn_in=2, max_annealing_steps=2, block_size=200, seed=0, restart_min_rows=None)
    )
    x, y = linear_data(201)
    e.update(x[:1], y[:1])  # the block below is annealed, not taken from a Laplace start (workers.conflict)
    (info,) = e.update(x[1:], y[1:])
    assert info.guard_tripped
    assert info.annealing_steps == 2


def test_nan_in_the_block_raises_and_leaves_the_state_alone() -> None:
    e = _engine(SamplerSettings(particles=8, burn_in=2, seed=0))
    state = e.state
    x, y = linear_data(10)
    y[3] = float("nan")
    with pytest.raises(sgais.NumericalError):
        e.update(x, y, validated=True)
    assert e.state is state and state.history.seen == 0 and e.observations == 0


# ----- determinism and checkpoints --------------------------------------------------------------

# the re-annealing policy's own replays only: no restart of a block as large as the history (SMALL's second block
# is; workers.stacking._restart_begin, which also reports ``reannealed``)
POLICY_ONLY = {"restart_min_rows": None}

# warm-up with 12 particles for the first 300 observations: resumes cross the reduction to 6
SMALL = {
    "particles": 6,
    "warmup_particles": 12,
    "warmup_observations": 300,
    "burn_in": 4,
    "batch_size": 50,
    "block_size": 100,
    "seed": 11,
}


def _run(engine: ModelEngine, x: torch.Tensor, y: torch.Tensor, chunks: list[tuple[int, int]]):
    return [info for a, b in chunks for info in engine.update(x[a:b], y[a:b])]


CHUNKS = [(0, 150), (150, 300), (300, 420), (420, 600), (600, 700)]


def test_same_seed_gives_the_same_bits() -> None:
    x, y = linear_data(700)
    a = ModelEngine("linear_regression", {"features": 3}, SMALL)
    b = ModelEngine("linear_regression", {"features": 3}, SMALL)
    assert _run(a, x, y, CHUNKS) == _run(b, x, y, CHUNKS)
    assert torch.equal(a.state.theta, b.state.theta) and torch.equal(a.state.log_w, b.state.log_w)
    c = ModelEngine("linear_regression", {"features": 3}, {**SMALL, "seed": 12})
    assert _run(c, x, y, CHUNKS)[-1].log_evidence != a.log_evidence


@pytest.mark.parametrize(
    "sampler,include_history",
    [
        (SMALL, True),
        (SMALL, False),
        ({**SMALL, "history_capacity": 250}, False),
        ({**SMALL, "control_variates": False, "resample_threshold": 0.0}, True),
        ({**SMALL, "warmup_observations": 100, "reanneal_steps": 1, "reanneal_growth": 1.5}, True),
        ({**SMALL, "warmup_observations": 100, "reanneal_steps": 1, "reanneal_growth": 1.5}, False),
    ],
)
def test_resume_is_bit_identical(sampler, include_history: bool) -> None:
    x, y = linear_data(700)
    straight = ModelEngine("linear_regression", {"features": 3}, sampler)
    expected = _run(straight, x, y, CHUNKS)
    first = ModelEngine("linear_regression", {"features": 3}, sampler)
    got = _run(first, x, y, CHUNKS[:3])
    blob = first.to_bytes(include_history=include_history)
    del first
    history = [(x[a:b], y[a:b]) for a, b in CHUNKS[:3]]
    restored = ModelEngine.from_bytes(blob, history_blocks=None if include_history else history)
    got += _run(restored, x, y, CHUNKS[3:])
    assert got == expected
    if sampler.get("reanneal_steps"):  # re-annealings happen on both sides of the checkpoint
        assert any(i.reannealed for i in expected[:3]) and any(i.reannealed for i in expected[3:])
    assert torch.equal(restored.state.theta, straight.state.theta)
    assert torch.equal(restored.generator.get_state(), straight.generator.get_state())


def test_restore_without_history_needs_the_stream() -> None:
    x, y = linear_data(200)
    e = ModelEngine("linear_regression", {"features": 3}, SMALL)
    e.update(x, y)
    with pytest.raises(ValueError, match="history"):
        ModelEngine.from_bytes(e.to_bytes(include_history=False))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_posterior_summary_from_a_checkpoint_equals_the_engines(dtype: str) -> None:
    x, y = linear_data(300)
    e = ModelEngine("gmm", {"dim": 1, "components": 2}, {**SMALL, "dtype": dtype})  # constrained parameters
    e.update(None, y)
    assert posterior_summary_from_bytes(e.to_bytes(include_history=False)) == e.posterior_summary()
    # the posterior view a live feed stores between its states answers the same, and cannot restore an engine
    view = e.view_bytes()
    assert posterior_summary_from_bytes(view) == e.posterior_summary()
    with pytest.raises(ValueError, match="view"):
        ModelEngine.from_bytes(view, history_blocks=[(None, y)])


@pytest.mark.parametrize(
    "name,params",
    [
        ("linear_regression", {"features": 3, "noise_std": 0.7, "prior_std": 2.0, "weight_location": 0.5}),
        (
            "linear_regression",
            {"features": 3, "noise_std": None, "weight_variance_ratio": 0.4, "intercept_location": 2.0},
        ),
        ("autoregressive", {"order": 3, "noise_std": 0.5, "prior_std": 0.8, "coefficient_location": 0.3}),
        ("autoregressive", {"order": 2, "variance_shape": 2.0, "variance_scale": 3.0}),
        ("gmm", {"dim": 2, "components": 1, "variance_shape": 2.5, "variance_scale": 0.5, "mean_scale": 3.0}),
        ("gmm", {"dim": 2, "components": 1, "mean_location": -1.5, "mean_variance_ratio": 0.5}),
        ("gmm", {"dim": 1, "components": 2}),
        ("gmm", {"dim": 2, "components": 3, "dirichlet_alpha": 0.7, "variance_shape": 2.0, "mean_location": 0.5}),
        ("gmm", {"dim": 3, "components": 4, "dirichlet_alpha": 2.5, "mean_variance_ratio": 0.3}),
    ],
)
def test_analytic_gradients_match_autograd(name: str, params: dict) -> None:
    from models.base import Family

    family = make_family(name, params)
    assert family.analytic_gradients
    hp = family.hyper_tensors(torch.float64)
    g = torch.Generator().manual_seed(5)
    theta = torch.randn(1, 4, family.dim, generator=g, dtype=torch.float64)
    x, y = linear_data(30, d=params.get("features", params.get("order", 2)))
    if name == "gmm":
        x, y = None, torch.randn(30, params["dim"], generator=g, dtype=torch.float64)
    xs = x[None] if x is not None else None
    got = family.stacked_grad_log_likelihood(theta, xs, y[None], hp)
    torch.testing.assert_close(got, Family.stacked_grad_log_likelihood(family, theta, xs, y[None], hp))
    torch.testing.assert_close(
        family.stacked_grad_log_prior(theta, hp), Family.stacked_grad_log_prior(family, theta, hp)
    )


def test_warmup_population_is_reduced_preserving_the_evidence() -> None:
    e = _engine(
        SamplerSettings(
            particles=4, warmup_particles=16, warmup_observations=10, burn_in=0, seed=0, restart_min_rows=None
        )
    )
    g = torch.Generator().manual_seed(0)
    assert e.state.theta.shape[0] == 16
    e.state = e.state._replace(log_w=torch.randn(16, generator=g, dtype=torch.float64))
    x, y = linear_data(20)
    e.state.history.append(x[:10], y[:10])
    reduced = stacking.reduce_particles(g, e.state, 4)
    assert reduced.theta.shape == (4, e.family.dim)
    assert reduced.log_evidence == pytest.approx(e.state.log_evidence, abs=1e-12)
    (info,) = e.update(x[10:], y[10:])
    assert info.ess <= 4 and e.state.theta.shape[0] == 4


# ----- re-annealing after a change point ---------------------------------------------------------


def test_reannealing_happens_at_most_once_per_doubling_after_the_warmup() -> None:
    """reanneal_steps=1 marks every block after the warm-up (300 observations) as a change, so the
    re-annealings follow the doubling rule alone: at 400 (the first eligible block), 800, 1600."""
    x, y = linear_data(1600)
    e = ModelEngine(
        "linear_regression", {"features": 3}, {**SMALL, "reanneal_steps": 1, "reanneal_growth": 2.0, **POLICY_ONLY}
    )
    infos = e.update(x, y)
    assert [100 * (i + 1) for i, info in enumerate(infos) if info.reannealed] == [400, 800, 1600]
    assert e.state.n_reanneal == 1600
    off = ModelEngine("linear_regression", {"features": 3}, {**SMALL, "reanneal_steps": None, **POLICY_ONLY})
    assert not any(i.reannealed for i in off.update(x, y))


@pytest.mark.parametrize("horizon", [1.0, 2.0, 3.0])
def test_reannealing_follows_a_change_for_reanneal_horizon(horizon: float) -> None:
    """Regression weights flip sign at observation 600: the block after it needs >= 10 annealing steps
    (fewer before it), and the next few blocks too.  Re-annealings: at the change (700), then at each
    doubling of the history while n <= horizon * (size at the last change) — replayed here from the
    engine's own annealing-step counts."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 3, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    y = torch.cat([x[:600] @ w, -x[600:] @ w]) + 0.5 + torch.randn(3000, generator=g, dtype=torch.float64)
    e = ModelEngine(
        "linear_regression",
        {"features": 3},
        {**SMALL, "reanneal_steps": 10, "reanneal_horizon": horizon, "change_burn_in": None, **POLICY_ONLY},
    )
    infos = e.update(x, y)
    assert max(i.annealing_steps for i in infos[3:6]) < 10 <= infos[6].annealing_steps
    n_change = n_reanneal = 0
    expected = []
    for i, info in enumerate(infos):
        n = 100 * (i + 1)
        if info.annealing_steps >= 10 and n - 100 >= SMALL["warmup_observations"]:
            n_change = n
        if n_change and n <= horizon * n_change and n >= 2 * n_reanneal:
            expected.append(n)
            n_reanneal = n
    assert expected[0] == 700 and [100 * (i + 1) for i, info in enumerate(infos) if info.reannealed] == expected
    # the last change: 1000-1500 while re-annealing averaged the two populations; 800 since the replay
    # replaces the running population (issue 10), whose next blocks then need fewer steps
    assert e.state.n_change == n_change and 700 <= n_change <= 1500
    if horizon == 3.0:  # 3 re-annealings when the last change was >= 1000; 700 and 1400 with the replay
        assert len(expected) >= 2


def test_reannealing_calls_the_heartbeat_between_replay_blocks() -> None:
    """The runner renews its lease through ``heartbeat``: a re-annealing over n rows takes as long
    as absorbing them did, longer than a lease's TTL for large n."""
    x, y = linear_data(800)
    calls = []
    e = ModelEngine("linear_regression", {"features": 3}, {**SMALL, "reanneal_steps": 1, **POLICY_ONLY})
    infos = e.update(x, y, heartbeat=lambda: calls.append(e.state.history.seen))
    replayed = [100 * (i + 1) for i, info in enumerate(infos) if info.reannealed]
    assert replayed and len(calls) == sum(-(-n // SMALL["block_size"]) for n in replayed)


def test_a_replay_keeps_the_warmup_population_to_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay over n rows runs at the warm-up size (12 here) for all its blocks, not only its first
    ``warmup_observations``, and the running population comes back at ``particles`` (6): with the running
    size, the replay's log-evidence over a long history has a large downward bias (Jensen) and misses modes
    (thesis stream, gmm-7 at 10 particles: a replay at n = 83,500 moved log Z by -345 nats; bench/README)."""
    sizes: list[tuple[int, int, int]] = []
    reduce = stacking.reduce_particles

    def spy(generator, state, M):
        sizes.append((state.theta.shape[0], M, state.history.seen))
        return reduce(generator, state, M)

    monkeypatch.setattr(stacking, "reduce_particles", spy)
    x, y = linear_data(1000)
    e = ModelEngine("linear_regression", {"features": 3}, {**SMALL, "reanneal_steps": 1, **POLICY_ONLY})
    infos = e.update(x, y)
    replayed = [100 * (i + 1) for i, info in enumerate(infos) if info.reannealed]
    # the running warm-up ends at 300 observations; each replay's population is reduced after its last row
    assert len(replayed) >= 2 and sizes == [(12, 6, 300)] + [(12, 6, n) for n in replayed]
    assert e.state.theta.shape[0] == 6


def test_an_aborted_reannealing_leaves_the_block_unabsorbed() -> None:
    """A heartbeat that raises (the worker lost its lease) aborts the block: history and state stay
    as they were, and the engine can go on absorbing."""
    x, y = linear_data(800)
    e = ModelEngine("linear_regression", {"features": 3}, {**SMALL, "reanneal_steps": 1, **POLICY_ONLY})
    e.update(x[:300], y[:300])
    before = e.state

    def lost() -> None:
        raise RuntimeError("lease lost")

    with pytest.raises(RuntimeError, match="lease lost"):
        e.update(x[300:400], y[300:400], heartbeat=lost)  # the first block after the warm-up re-anneals
    assert e.state is before and e.state.history.seen == 300
    assert e.update(x[300:400], y[300:400])[0].reannealed and e.state.history.seen == 400


def test_no_reannealing_over_a_reservoir() -> None:
    """A reservoir holds a subsample: re-annealing over it would target the wrong posterior."""
    x, y = linear_data(600)
    e = ModelEngine("linear_regression", {"features": 3}, {**SMALL, "history_capacity": 250, "reanneal_steps": 1})
    assert not any(i.reannealed for i in e.update(x, y)[3:])


def test_fisher_diagonal_matches_per_observation_gradients() -> None:
    # Hutchinson: each probe's (Σ_b s_b g_b)² has mean Σ_b g_b² and sd at most √2 times that, so the
    # average over M·P = 8·400 particle-probes has a relative sd below √(2/3200) ≈ 2.5%; 15% is 6 sd.
    family = make_family("logistic_regression", {"features": 3, "classes": 3})
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(8, family.dim, generator=g, dtype=torch.float64)
    log_w = torch.randn(8, generator=g, dtype=torch.float64)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=g).to(torch.float64)
    exact = torch.stack([family.grad_log_likelihood(theta, x[b : b + 1], y[b : b + 1]) ** 2 for b in range(40)]).mean(0)
    exact = (torch.softmax(log_w, 0)[:, None] * exact).sum(0)
    stack = StackedFamily([family], torch.float64, "cpu")
    got = fisher_diagonal([g], stack, theta[None], log_w[None], x[None], y[None], probes=400)[0]
    assert got.shape == (family.dim,)
    assert torch.allclose(got, exact, rtol=0.15)


def _high_curvature_data(noise: float, n: int = 1500):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = (
        x @ torch.tensor([0.5, -1.0, 0.2], dtype=torch.float64)
        + 0.3
        + noise * torch.randn(n, generator=g, dtype=torch.float64)
    )
    return x, y


def test_preconditioning_keeps_high_curvature_posteriors_stable() -> None:
    # noise_std 0.05: each observation adds ~400 to the curvature, so the thesis's η = 0.1/n gives
    # η·h ≈ 40, far outside SGHMC's stability region. With the variance cap the run must stay finite
    # and land near the exact evidence. Measured over seeds 0-5: -1.3, -2.6, -2.7, -1.4, -3.6, -3.4
    # nats (mean -2.5, sd 1.0: a small negative bias of the finite-step sampler); 10 nats is the
    # mean bias plus 7 sd, while a diverged or stuck run is off by thousands.
    from models.conjugate import linear_regression_log_evidence

    x, y = _high_curvature_data(0.05)
    engine = ModelEngine("linear_regression", {"features": 3, "noise_std": 0.05}, {"seed": 1})
    for a in range(0, 1500, 500):
        engine.update(x[a : a + 500], y[a : a + 500])
    exact = linear_regression_log_evidence(x.numpy(), y.numpy(), noise_std=0.05)
    assert abs(engine.log_evidence - exact) < 10.0


def test_divergence_is_detected_not_absorbed() -> None:
    x, y = _high_curvature_data(0.05)
    engine = ModelEngine("linear_regression", {"features": 3, "noise_std": 0.05}, {"seed": 1, "preconditioning": False})
    with pytest.raises(sgais.NumericalError, match="diverged"):
        for a in range(0, 1500, 500):
            engine.update(x[a : a + 500], y[a : a + 500])


def test_a_log_evidence_beyond_float64s_resolution_is_an_error_not_a_value() -> None:
    """A one-component gmm settled near 0, then one value at 10⁹: the block's log-likelihood at the particles is
    about −10¹⁸ nats, beyond what float64 resolves to a nat, and the particles stay under DIVERGED.  Before
    sgais.LOG_WEIGHT_LIMIT the engine reported log Ẑ = +4.2·10³¹ (SE 9·10¹⁵) as ``degraded``; it is a
    NumericalError, and the state is left as it was.  A value at 10⁷ is within reach: with the warm-up's exact draws
    (``gibbs_sweeps``, workers.sgais.exact_draw) the evidence is right (−367.18 against the exact −367.42, SE 0.78, when
    written); with SGHMC moves alone it is a value flagged by the checks (−369.9: the particles lag)."""
    from models.conjugate import gmm_one_component_log_evidence

    y = torch.randn(20, generator=torch.Generator().manual_seed(1), dtype=torch.float64).tolist()
    for sweeps in (2, 0):
        engine = ModelEngine("gmm", {"dim": 1, "components": 1}, {"seed": 0, "gibbs_sweeps": sweeps})
        engine.update(None, y)
        before = engine.state
        with pytest.raises(sgais.NumericalError, match="beyond 1e15 nats"):
            engine.update(None, [1e9])
        assert engine.state is before
        engine.update(None, [1e7])
        if sweeps:
            exact = gmm_one_component_log_evidence([*y, 1e7])
            assert abs(engine.log_evidence - exact) < 3 * engine.log_evidence_se and engine.degraded is None
        else:
            assert -1e4 < engine.log_evidence < 0 and engine.degraded


@pytest.mark.parametrize(
    "name,params",
    [
        ("linear_regression", {"features": 3, "noise_std": 0.7}),
        ("linear_regression", {"features": 3, "noise_std": 0.7, "weight_location": -0.4, "intercept_location": 3.0}),
        ("autoregressive", {"order": 2, "noise_std": 0.5}),
        ("autoregressive", {"order": 2, "noise_std": 0.5, "coefficient_location": 0.6, "intercept_location": -1.0}),
    ],
)
def test_quadratic_families_have_the_exact_fisher_diagonal_and_gradient_statistics(name, params) -> None:
    """Linear-Gaussian families: the Fisher diagonal is the exact per-observation sum (no probes), and
    ``c − θA`` from the block statistics equals the closed-form gradient of the log-likelihood."""
    family = make_family(name, params)
    stack = StackedFamily([family], torch.float64, "cpu")
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(1, 8, family.dim, generator=g, dtype=torch.float64)
    log_w = torch.randn(1, 8, generator=g, dtype=torch.float64)
    x = torch.randn(1, 40, family.dim - 1, generator=g, dtype=torch.float64)
    y = torch.randn(1, 40, generator=g, dtype=torch.float64)
    per_obs = torch.stack(
        [family.grad_log_likelihood(theta[0], x[0, b : b + 1], y[0, b : b + 1]) ** 2 for b in range(40)]
    )
    expected = (torch.softmax(log_w[0], 0)[:, None] * per_obs.mean(0)).sum(0)
    torch.testing.assert_close(fisher_diagonal([g], stack, theta, log_w, x, y)[0], expected, rtol=1e-10, atol=0)
    A, c = stack.gradient_statistics(x, y)
    torch.testing.assert_close(
        c[:, None, :] - theta @ A, stack.grad_log_likelihood(theta, x, y), rtol=1e-10, atol=1e-10
    )
    A0, c0 = stack.prior_statistics()
    torch.testing.assert_close(c0[:, None, :] - theta @ A0, stack.grad_log_prior(theta), rtol=1e-12, atol=1e-12)


def test_sufficient_statistics_give_the_autograd_gradients_of_prior_and_likelihood() -> None:
    """One-component gmm (a Gaussian with a normal–inverse-gamma prior): ``g(θ, T)`` from the rows' summed
    statistics equals autograd's likelihood gradient, from the prior's pseudo-observations autograd's prior
    gradient (log-Jacobian included), and the sampler's folded form ``g(θ, T0 + λT_C + s·T_B)`` their sum:
    per model of a stack of different hyperparameters, in 1 and 3 dimensions."""
    from models.base import Family

    assert not make_family("gmm", {"dim": 1, "components": 2}).sufficient_statistics
    for d in (1, 3):
        one = {"dim": d, "components": 1}
        fams = [
            make_family("gmm", {**one, "variance_shape": 2.5, "variance_scale": 0.5, "mean_scale": 3.0}),
            make_family("gmm", {**one, "mean_location": -1.5, "mean_variance_ratio": 0.5}),
        ]
        stack = StackedFamily(fams, torch.float64, "cpu")
        assert stack.sufficient_statistics
        g = torch.Generator().manual_seed(d)
        theta = torch.randn(2, 6, 2 * d, generator=g, dtype=torch.float64)
        yc, yb = (2.0 + torch.randn(2, n, d, generator=g, dtype=torch.float64) for n in (5, 40))
        lik = [Family.stacked_grad_log_likelihood(fams[0], theta, None, y, stack.hp) for y in (yc, yb)]
        prior = torch.cat([Family.stacked_grad_log_prior(f, theta[k : k + 1], stack.select(torch.tensor([k])).hp)
                           for k, f in enumerate(fams)])  # fmt: skip
        torch.testing.assert_close(stack.grad_from_statistics(theta, stack.statistics(None, yb)), lik[1])
        torch.testing.assert_close(stack.grad_from_statistics(theta, stack.prior_pseudo_statistics()), prior)
        lam, scale = torch.tensor([0.3, 0.8], dtype=torch.float64), torch.tensor([7.0, 2.5], dtype=torch.float64)
        T = stack.prior_pseudo_statistics() + lam[:, None] * stack.statistics(None, yc)
        folded = stack.grad_from_statistics(theta, T + scale[:, None] * stack.statistics(None, yb))
        expected = prior + lam[:, None, None] * lik[0] + scale[:, None, None] * lik[1]
        torch.testing.assert_close(folded, expected)


def _autograd_terms(fams: list, stack: StackedFamily, theta: torch.Tensor) -> tuple:
    """``(lik(points, y), prior)``: the likelihood gradient of ``stack``'s family and each model's prior gradient at
    ``theta``, by autograd (``models.base.Family``'s generic methods), for the closed forms to be checked against."""
    from models.base import Family

    def lik(points: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return Family.stacked_grad_log_likelihood(fams[0], points, None, y, stack.hp)

    prior = torch.cat([Family.stacked_grad_log_prior(f, theta[k : k + 1], stack.select(torch.tensor([k])).hp)
                       for k, f in enumerate(fams)])  # fmt: skip
    return lik, prior


@pytest.mark.parametrize("control_variates", [False, True])
def test_a_mixture_evaluates_block_and_mini_batch_in_one_weighted_gradient(control_variates: bool) -> None:
    """Mixtures (``weighted_gradients``) take an SGHMC step's block and mini-batch rows, at the particles and the
    control variates' anchors, in one weighted evaluation (``workers.gradients._one_evaluation``): the same
    ``∇Û = −[∇log p(θ) + λ∇ℓ(θ, C) + s∇ℓ(θ, B) (− s∇ℓ(a, B) + G)]`` as the terms evaluated apart by autograd, per
    model of a stack of different hyperparameters, λ and s; without a mini-batch the block's exact term alone."""
    from workers import gradients

    fams = [make_family("gmm", {"dim": 2, "components": 3, "variance_scale": v}) for v in (1.0, 2.5)]
    stack = StackedFamily(fams, torch.float64, "cpu")
    assert stack.weighted_gradients
    g = torch.Generator().manual_seed(3)
    theta, anchor, G = (torch.randn(2, 5, fams[0].dim, generator=g, dtype=torch.float64) for _ in range(3))
    yc, yb = (torch.randn(2, n, 2, generator=g, dtype=torch.float64) for n in (7, 11))
    lam, scale = torch.tensor([0.3, 0.8], dtype=torch.float64), torch.tensor([4.0, 9.0], dtype=torch.float64)
    history = gradients.minibatch(stack, scale)
    if control_variates:
        history = gradients.control_variates(history, anchor, G)
    grad_u = gradients.potential_gradient(stack, gradients.Batch(None, yc), lam, history)

    lik, prior = _autograd_terms(fams, stack, theta)
    exact = prior + lam[:, None, None] * lik(theta, yc)
    expected = exact + scale[:, None, None] * lik(theta, yb)
    if control_variates:
        expected = expected - scale[:, None, None] * lik(anchor, yb) + G
    torch.testing.assert_close(grad_u(theta, gradients.Batch(None, yb)), -expected)
    torch.testing.assert_close(grad_u(theta, None), -exact)


@pytest.mark.parametrize("whole", [[True, False], [True, True]])
def test_a_mixture_whose_history_fits_a_batch_takes_its_exact_gradient(whole: list[bool]) -> None:
    """A mixture model whose history fits one mini-batch gets its batch as its whole history, padded to ``|B|`` rows
    of weight 0 (``workers.sgais._whole_rows``): its history term is the exact ``Σ_{y∈H} ∇ log p(y|θ)`` (no scale, no
    control variates), bit for bit what it gets in a stack without anchors; the other model of a mixed stack keeps
    its control-variate estimate."""
    from workers import gradients

    fams = [make_family("gmm", {"dim": 1, "components": 2, "variance_scale": v}) for v in (1.0, 2.5)]
    stack = StackedFamily(fams, torch.float64, "cpu")
    g = torch.Generator().manual_seed(5)
    theta, anchor, G = (torch.randn(2, 5, fams[0].dim, generator=g, dtype=torch.float64) for _ in range(3))
    yc, yb = (torch.randn(2, n, 1, generator=g, dtype=torch.float64) for n in (7, 11))
    held = torch.tensor([6, 11])  # model 0 holds 6 rows: 5 rows of padding (a repeated row, weight 0)
    yb[0, 6:] = yb[0, 5]
    lam, scale = torch.tensor([0.3, 0.8], dtype=torch.float64), torch.tensor([0.55, 9.0], dtype=torch.float64)
    is_whole = torch.tensor(whole)
    rows = torch.where(is_whole[:, None], (torch.arange(11) < held[:, None]).double(), scale[:, None])
    history = gradients.control_variates(gradients.minibatch(stack, scale, (is_whole, rows)), anchor, G)
    grad_u = gradients.potential_gradient(stack, gradients.Batch(None, yc), lam, history)

    lik, prior = _autograd_terms(fams, stack, theta)
    exact = prior + lam[:, None, None] * lik(theta, yc)
    expected = exact + scale[:, None, None] * (lik(theta, yb) - lik(anchor, yb)) + G  # control variates
    expected[0] = exact[0] + lik(theta[:1], yb[:1, :6])[0]  # the whole history, exact
    if all(whole):
        expected[1] = exact[1] + lik(theta[1:], yb[1:])[0]
    got = grad_u(theta, gradients.Batch(None, yb))
    torch.testing.assert_close(got, -expected)
    # model 0 alone, without anchors: the same bits
    one = StackedFamily(fams[:1], torch.float64, "cpu")
    alone = gradients.potential_gradient(
        one, gradients.Batch(None, yc[:1]), lam[:1],
        gradients.control_variates(
            gradients.minibatch(one, scale[:1], (is_whole[:1], rows[:1])), anchor[:1], G[:1]
        ),
    )(theta[:1], gradients.Batch(None, yb[:1]))  # fmt: skip
    assert torch.equal(alone, got[:1])


@pytest.mark.parametrize(
    ("name", "params", "hyper"),
    [
        ("autoregressive", {"order": 2}, [{"prior_std": 0.7, "coefficient_location": 0.3, "variance_shape": 2.5},
                                          {"intercept_location": -1.0, "variance_scale": 0.4}]),
        ("linear_regression", {"features": 3, "noise_std": None},
         [{"weight_variance_ratio": 0.5, "weight_location": 0.2}, {"variance_shape": 3.0, "intercept_location": 1.5}]),
    ],
)  # fmt: skip
def test_unknown_noise_linear_gaussian_families_have_sufficient_statistics(name, params, hyper) -> None:
    """AR(p) and linear regression with unknown noise: ``g(θ, T)`` from the rows' statistics equals autograd's
    likelihood gradient and from the prior's ``T0`` autograd's prior gradient (log-Jacobian included), per model
    of a stack of different hyperparameters; known noise stays quadratic."""
    from models.base import Family

    assert not make_family(name, {**params, "noise_std": 1.0}).sufficient_statistics
    fams = [make_family(name, {**params, **h}) for h in hyper]
    stack = StackedFamily(fams, torch.float64, "cpu")
    assert stack.sufficient_statistics and not stack.quadratic
    g = torch.Generator().manual_seed(0)
    D = fams[0].dim
    theta = torch.randn(2, 6, D, generator=g, dtype=torch.float64)
    x = torch.randn(2, 30, D - 2, generator=g, dtype=torch.float64)
    y = 1.0 + torch.randn(2, 30, generator=g, dtype=torch.float64)
    lik = Family.stacked_grad_log_likelihood(fams[0], theta, x, y, stack.hp)
    prior = torch.cat([Family.stacked_grad_log_prior(f, theta[k : k + 1], stack.select(torch.tensor([k])).hp)
                       for k, f in enumerate(fams)])  # fmt: skip
    torch.testing.assert_close(stack.grad_from_statistics(theta, stack.statistics(x, y)), lik)
    torch.testing.assert_close(stack.grad_from_statistics(theta, stack.prior_pseudo_statistics()), prior)
    torch.testing.assert_close(stack.grad_log_prior(theta), prior)  # the closed form agrees too


def test_a_history_within_one_batch_gives_the_exact_gradient_and_draws_nothing() -> None:
    """A model whose history fits in one mini-batch (``n_prev ≤ |B|``) takes the exact history statistics at
    every SGHMC step with scale 1 and no control-variate correction, and draws no batch indices; a model of the
    same stack with a longer history keeps its mini-batches (``n_prev/|B|``, indices from its own generator)."""
    from workers.history import History, StackBatches

    fams = [make_family("gmm", {"dim": 1, "components": 1, "mean_scale": s}) for s in (1.0, 2.0)]
    stack = StackedFamily(fams, torch.float64, "cpu")
    g = torch.Generator().manual_seed(0)
    histories = []
    for n in (37, 120):
        h = History(seed=n)
        h.append(None, 0.5 + torch.randn(n, 1, generator=g, dtype=torch.float64))
        histories.append(h)
    batches = StackBatches(histories, batch_size=50)
    block = sgais.StackBlock(
        generators=[torch.Generator().manual_seed(k) for k in range(2)], models=[0, 1], family=stack, x=None,
        y=torch.zeros(2, 5, 1, dtype=torch.float64), n_prev=torch.tensor([37.0, 120.0], dtype=torch.float64),
        batches=batches, fisher=torch.ones(2, 2, dtype=torch.float64), settings=None,  # type: ignore[arg-type]
    )  # fmt: skip
    assert sgais._whole_history(block) == [True, False]
    before = [gen.get_state() for gen in block.generators]
    plan = batches.plan(list(block.generators), block.models, [0, 3])
    assert torch.equal(block.generators[0].get_state(), before[0])  # the whole-history model drew nothing
    assert not torch.equal(block.generators[1].get_state(), before[1])
    anchor, anchor_grad = torch.randn(2, 4, 2, generator=g, dtype=torch.float64), torch.zeros(2, 4, 2)
    T, scale, at_anchor = sgais._statistics_per_step(block, plan, [True, False], 4, anchor, anchor_grad, True)
    exact = stack.statistics(None, histories[0].y[None, :37])[0]
    for step in range(4):
        torch.testing.assert_close(T[0, step], exact, rtol=1e-13, atol=0.0)
    torch.testing.assert_close(T[1, :3], stack.statistics(None, batches.rows(plan[1].reshape(3, -1))[1]))
    assert scale.tolist() == [1.0, 120 / 50]
    assert isinstance(at_anchor, torch.Tensor) and all(
        torch.equal(at_anchor[0, step], anchor_grad[0]) for step in range(4)
    )
    # every model within one batch: no control variates at all
    whole = sgais._statistics_per_step(block, None, [True, True], 2, anchor, anchor_grad, True)
    assert whole[2] is None and whole[1].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("family", ["gmm", "autoregressive"])
@pytest.mark.parametrize("with_control_variates", [False, True])
def test_folded_steps_give_the_per_step_gradients_bit_for_bit(family: str, with_control_variates: bool) -> None:
    """:func:`workers.gradients.potential_gradient_steps` (every step's statistics folded once, the family's split
    taken once) gives each step exactly the values of :func:`workers.gradients.potential_gradient` on that step's
    batch, with and without control variates: the lean path changes the number of tensor calls, not a bit."""
    from workers.gradients import Batch, control_variates, minibatch, potential_gradient, potential_gradient_steps

    params = {"dim": 1, "components": 1} if family == "gmm" else {"order": 1}
    fams = [make_family(family, {**params, "variance_scale": v}) for v in (0.5, 2.0, 1.0)]
    stack = StackedFamily(fams, torch.float64, "cpu")
    K, S, M, B = 3, 5, 4, 7
    g = torch.Generator().manual_seed(1)
    D = 2 if family == "gmm" else 3
    x = torch.randn(K, B, 1, generator=g, dtype=torch.float64) if family != "gmm" else None
    y = torch.randn(K, B, generator=g, dtype=torch.float64)
    rows = [torch.randn(K, 6, generator=g, dtype=torch.float64) for _ in range(S)]
    xs = [torch.randn(K, 6, 1, generator=g, dtype=torch.float64) if family != "gmm" else None for _ in range(S)]
    stats = torch.stack([stack.statistics(xb, yb) for xb, yb in zip(xs, rows, strict=True)], 1)  # [K, S, P]
    theta = 0.3 * torch.randn(K, M, D, generator=g, dtype=torch.float64)
    lam = torch.tensor([0.2, 0.7, 1.0], dtype=torch.float64)
    history = minibatch(stack, torch.tensor([3.0, 1.0, 10.0], dtype=torch.float64))
    at_anchor = None
    if with_control_variates:
        anchor = theta + 0.01
        history = control_variates(history, anchor, torch.randn(K, M, D, generator=g, dtype=torch.float64))
        at_anchor = torch.stack([history.base(anchor, Batch(None, None, stats[:, s])) for s in range(S)], 1)
    block = Batch(x, y)
    per_step = potential_gradient(stack, block, lam, history)
    folded = potential_gradient_steps(stack, block, lam, history, stats, at_anchor)
    for s in range(S):
        batch = Batch(None, None, stats[:, s], at_anchor[:, s] if at_anchor is not None else None)
        assert torch.equal(folded(theta, s), per_step(theta, batch))
    without = potential_gradient_steps(stack, block, lam, None, None, None)  # no history term: the prior and block
    assert torch.equal(without(theta, 0), potential_gradient(stack, block, lam, None)(theta, None))


def test_gmm_gradient_with_halved_statistics_is_the_textbook_formula_bit_for_bit() -> None:
    """The one-component gmm's ``∂_u`` is computed as ``(S2/2 − μS1 + μ²·N/2)/σ² − H``; halving is exact in binary
    floating point, so it gives the bits of ``(S2 − 2μS1 + μ²N)/(2σ²) − H`` (PRML eq. 9.13's form), here checked
    over twelve orders of magnitude of the data and the particles."""
    family = make_family("gmm", {"dim": 1, "components": 1})
    g = torch.Generator().manual_seed(5)
    for scale in (1e-6, 1e-2, 1.0, 1e3, 1e6):
        n = torch.rand(4, 1, generator=g, dtype=torch.float64) * 1e4 + 1.0
        s1 = torch.randn(4, 1, generator=g, dtype=torch.float64) * scale * n
        s2 = (torch.rand(4, 1, generator=g, dtype=torch.float64) + 1.0) * scale**2 * n
        h = 0.5 * n + torch.rand(4, 1, generator=g, dtype=torch.float64)
        theta = torch.cat([torch.randn(4, 30, 1, generator=g, dtype=torch.float64) * scale,
                           torch.randn(4, 30, 1, generator=g, dtype=torch.float64) * 3], -1)  # fmt: skip
        got = family.stacked_grad_from_statistics(theta, torch.cat([n, s1, s2, h], -1))
        mu, iv = theta[..., :1], torch.exp(-theta[..., 1:])
        n_, s1_, s2_, h_ = (t[:, None] for t in (n, s1, s2, h))
        want_u = 0.5 * (s2_ - 2.0 * mu * s1_ + mu * mu * n_) * iv - h_
        assert torch.equal(got[..., 1:], want_u)
        assert torch.equal(got[..., :1], (s1_ - mu * n_) * iv)


def test_checkpoint_header_follows_a_replaced_sampler() -> None:
    """The header's encoded prefix (version, family, params, sampler) is cached per family and settings
    object; a challenger's retargeted or restored sampler (a new frozen object) shows in the next checkpoint."""
    import json

    from workers.engine import _metadata

    eng = ModelEngine("gmm", {"dim": 1, "components": 1}, {"seed": 3})
    eng.update(None, [0.1, -0.2, 0.4])
    header = json.loads(_metadata(eng.to_bytes())["sgais"])
    assert header["sampler"] == eng.settings.model_dump() and header["observations"] == 3
    eng.settings = eng.settings.model_copy(update={"ess_target": 0.5})
    header = json.loads(_metadata(eng.to_bytes())["sgais"])
    assert header["sampler"]["ess_target"] == 0.5
    assert ModelEngine.from_bytes(eng.to_bytes()).settings == eng.settings


def test_checkpoint_tensors_are_written_as_safetensors_writes_them() -> None:
    """:func:`workers.engine.safetensors_bytes` gives the bytes of safetensors' numpy and torch writers, for
    every dtype a checkpoint holds, strided and 0-d tensors, and dtypes it leaves to the torch writer."""
    from safetensors.numpy import save as save_numpy
    from safetensors.torch import save as save_torch

    from workers.engine import safetensors_bytes

    g = torch.Generator().manual_seed(0)
    tensors = {
        "theta": torch.randn(6, 3, generator=g, dtype=torch.float64).t(),  # not contiguous
        "log_w": torch.randn(6, generator=g, dtype=torch.float64),
        "f32": torch.randn(2, 2, generator=g),
        "scalar": torch.tensor(1.5, dtype=torch.float64),
        "generator": g.get_state(),
        "index": torch.arange(4),
        "i32": torch.arange(3, dtype=torch.int32),
        "mask": torch.tensor([True, False]),
        "empty": torch.zeros(0, 2, dtype=torch.float64),
    }
    meta = {"sgais": '{"observations": 3}'}
    want = save_numpy({k: v.contiguous().numpy() for k, v in tensors.items()}, metadata=meta)
    assert (
        safetensors_bytes(tensors, meta)
        == want
        == save_torch({k: v.contiguous() for k, v in tensors.items()}, metadata=meta)
    )
    half = {"h": torch.ones(2, dtype=torch.float16), **tensors}  # not in the table: the torch writer
    assert safetensors_bytes(half, meta) == save_torch({k: v.contiguous() for k, v in half.items()}, metadata=meta)


@pytest.mark.parametrize(("features", "change_burn_in"), [(1, 30), (15, 30), (15, 8), (15, None)])
def test_warmup_burn_in_grows_with_the_dimension_up_to_change_burn_in(
    monkeypatch: pytest.MonkeyPatch, features: int, change_burn_in: int | None
) -> None:
    """In the warm-up a model with D parameters takes ceil(burn_in·sqrt(D/4)) SGHMC steps per annealing step, at
    most ``change_burn_in`` and at least ``burn_in`` (D <= 4 keeps ``burn_in``); after the warm-up, and with
    ``change_burn_in`` null, ``burn_in`` (the logistic 10^3 bias of bench/README.md, "Warm-up burn-in")."""
    seen: list[tuple[int, int]] = []  # (observations before the block, its burn-in)
    run_stack = stacking._run_stack

    def spy(group, heartbeat):
        seen.extend((p.state.history.seen, p.burn_in) for p in group)
        return run_stack(group, heartbeat)

    monkeypatch.setattr(stacking, "_run_stack", spy)
    x, y = linear_data(500, d=features)
    # no restart: the second block (as many rows as the history) would be replayed from the prior in one block
    sampler = {**SMALL, "change_burn_in": change_burn_in, "reanneal_steps": None, "restart_min_rows": None}
    e = ModelEngine("linear_regression", {"features": features}, sampler)
    e.update(x, y)
    dim = e.state.theta.shape[-1]
    warm = 4 if change_burn_in is None else max(4, min(change_burn_in, math.ceil(4 * math.sqrt(dim / 4))))
    assert [n for n, _ in seen] == [0, 100, 200, 300, 400]
    assert seen == [(n, warm if n < 300 else 4) for n, _ in seen]
    if features > 1 and change_burn_in == 30:
        assert warm == math.ceil(4 * math.sqrt(dim / 4)) > 4  # the rule itself, not its cap, decided


def ar1_around_level_3(n: int = 300) -> np.ndarray:
    """AR(1) around a level of 3, phi = 0.98, innovation sd 0.1, from y[0] = 3 (numpy seed 0): its coefficient and
    intercept lie on a ridge (rho near 1)."""
    rng = np.random.default_rng(0)
    y = np.empty(n)
    y[0] = 3.0
    for t in range(1, n):
        y[t] = 3.0 * 0.02 + 0.98 * y[t - 1] + 0.1 * rng.standard_normal()
    return y


def test_ar1_with_a_level_far_from_zero_is_within_8_nats_or_degraded_in_blocks_of_5() -> None:
    """AR(1) around a level of 3 (phi = 0.98, sd 0.1): the coefficient and the intercept lie on a ridge (rho near 1).
    With the diagonal preconditioner and issue 10's factor the moves stalled there: seeds 0-11 ended -2.8 to -21.9
    nats from exact with status ok (8 of 12; -15.5, -27.6 degraded, -7.9 for seeds 0-2).  With the full
    preconditioner (workers.sgais._full_preconditioner) the ok runs (10 of 12) end -2.1 +- 1.2 nats (worst -4.55;
    seeds 0-2: -0.68, -1.94, -4.55); 8 nats is 5 sd beyond their mean and fails on seed 0 of the stalled moves."""
    from models.conjugate import autoregressive_unknown_noise_log_evidence

    y = ar1_around_level_3()
    exact = autoregressive_unknown_noise_log_evidence(y, 1)
    for seed in range(3):
        e = ModelEngine("autoregressive", {"order": 1}, {"block_size": 5, "seed": seed})
        for a in range(0, 300, 5):
            e.update(None, y[a : a + 5].tolist())
        assert e.degraded is not None or abs(e.log_evidence - exact) < 8.0, (seed, e.log_evidence - exact)


def test_full_preconditioner_is_stable_and_moves_along_a_ridge() -> None:
    """Particles from N(0, Σ) with correlation 0.99 and the quadratic potential of N(0, Σ/s), s = 1 (the target
    matches the particles) and s = 10 (ten times narrower): the preconditioned curvature P·H stays within
    κ·λ ≤ 2·lr (the measured H = Cov(∇U, θ)·Σ̂⁻¹ is exact for a quadratic potential), and along the ridge
    (Σ's wide eigenvector) the step is a sizeable fraction of lr·Σ, where the diagonal with issue 10's factor
    min(1, 2·λ_min(R)) ≈ 0.02 moved 50 times less; an uncorrelated population keeps the diagonal (factor 1)."""
    g = torch.Generator().manual_seed(0)
    sd = torch.tensor([2.0, 0.5], dtype=torch.float64)
    cov = torch.tensor([[1.0, 0.99], [0.99, 1.0]], dtype=torch.float64) * sd.outer(sd)
    theta = torch.randn(1, 400, 2, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T
    log_w = torch.zeros(1, 400, dtype=torch.float64)
    var, lr = theta.var(1, unbiased=False), torch.tensor([0.1], dtype=torch.float64)
    wide = torch.linalg.eigh(cov).eigenvectors[:, -1]
    for s in (1.0, 10.0):
        H = s * torch.linalg.inv(cov)
        P, L, ok = sgais._full_preconditioner(theta, log_w, theta @ H, var, lr)
        assert bool(ok[0]) and torch.allclose(L[0] @ L[0].T, P[0])
        assert torch.linalg.eigvals(P[0] @ H).real.max().item() <= 2 * 0.1 * (1 + 1e-9)
        along = (wide @ P[0] @ wide / (0.1 * wide @ cov @ wide)).item()
        assert along > (0.3 if s == 1.0 else 0.3 / s), along
    uncorrelated = torch.randn(1, 400, 2, generator=g, dtype=torch.float64)
    assert sgais._correlation_factor(uncorrelated, log_w).item() == 1.0  # _move's gate: the diagonal there


def test_runaway_full_preconditioned_moves_are_redone_with_the_diagonal(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``RUNAWAY_SD`` 0 every full-preconditioned move counts as a runaway and is redone with the diagonal from
    the same draws: the run is then bit for bit the run without the full preconditioner (AR(1) around a level of
    3, where it is used; SGHMC in the warm-up, ``gibbs_sweeps`` 0), and differs from the run that keeps it."""
    rng = np.random.default_rng(1)
    y = np.empty(120)
    y[0] = 3.0
    for t in range(1, 120):
        y[t] = 0.06 + 0.98 * y[t - 1] + 0.1 * rng.standard_normal()

    def run() -> float:
        e = ModelEngine("autoregressive", {"order": 1}, {"block_size": 5, "seed": 0, "gibbs_sweeps": 0})
        for a in range(0, 120, 5):
            e.update(None, y[a : a + 5].tolist())
        return e.log_evidence

    kept = run()
    monkeypatch.setattr(sgais, "RUNAWAY_SD", 0.0)
    redone = run()
    full = sgais._full_preconditioner
    monkeypatch.setattr(sgais, "_full_preconditioner", lambda *a: (*full(*a)[:2], torch.zeros(1, dtype=torch.bool)))
    assert redone == run() != kept


# ----- the kernel's shape (issue 9, acceptance 5) ----------------------------------------------


def test_the_lambda_loop_fits_in_forty_lines():
    """``absorb_block``'s λ loop, from its ``while`` to the function's return, is at most 40 lines (issue 9,
    acceptance 5: the kernel reads as pure functions; policies live outside it)."""
    import inspect

    lines = inspect.getsource(sgais.absorb_block).splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("while "))
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("return "))
    assert 0 < end - start + 1 <= 40, f"the λ loop is {end - start + 1} lines"
