"""Posterior predictive (models/predictive.py) against the exact predictive of conjugate models (issue 14).

Exact predictives (Bishop 2006 eq. 3.58 for Gaussian linear regression with known noise; Murphy 2007
eq. 100 for the normal-inverse-gamma model): linear regression and AR(p) with known noise
``N(x̃ᵀμ_n, σ² + x̃ᵀΣ_n x̃)`` (AR: x̃ = the last p values and 1); one-component ``gmm`` a Student-t with
``2a_n`` degrees of freedom, location ``μ_n`` and squared scale ``b_n (κ_n + 1) / (a_n κ_n)``.

Coverage: 200 observations drawn from the exact predictive; a correct 90% interval covers each with
probability 0.9, so the count is Binomial(200, 0.9) (sd 4.2): 85–95% is ±2.4 sd.

Mean tolerance (Monte Carlo error of the estimate ``Σ_i W_i ȳ_i``): with particles from the posterior and
effective sample size ``ESS``, ``Var ≈ Var_post(m(θ)) / ESS + mean_se²`` where ``m(θ)`` is the conditional
mean (its exact posterior variance is ``x̃ᵀΣ_n x̃``, or ``b_n / ((a_n − 1) κ_n)`` for the gmm) and
``mean_se`` the simulation error the summary reports; the tests allow 4 standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from models import make_family
from models.predictive import PredictiveError, predictive, weighted_summary
from service.routes.predictive import predictive_from_bytes
from workers.engine import ModelEngine

N_DRAWS = 200


def gaussian_posterior(X: np.ndarray, y: np.ndarray, noise_std: float, prior_std: float):
    """Exact posterior ``N(μ_n, Σ_n)`` of ``[w, b]`` for ``y = Xw + b + N(0, σ²)``, ``w, b ~ N(0, s²)``."""
    A = np.hstack([X, np.ones((X.shape[0], 1))])
    prec = A.T @ A / noise_std**2 + np.eye(A.shape[1]) / prior_std**2
    cov = np.linalg.inv(prec)
    return cov @ A.T @ y / noise_std**2, cov


def coverage(q05: np.ndarray, q95: np.ndarray, draws: np.ndarray) -> float:
    return float(np.mean((draws >= q05) & (draws <= q95)))


def engine_after(family: str, params: dict, x, y, seed: int = 1, particles: int = 100) -> ModelEngine:
    sampler = {"particles": particles, "warmup_particles": None, "seed": seed, "block_size": 500}
    eng = ModelEngine(family, params, sampler)
    xt, yt = eng.family.validate(x, y)
    eng.update(xt, yt, validated=True)
    return eng


def test_linear_regression_with_exact_posterior_particles():
    """Particles drawn i.i.d. from the exact posterior (equal weights): only the predictive code is tested."""
    rng = np.random.default_rng(0)
    n, d, sigma = 60, 2, 0.7
    X = rng.normal(size=(n, d))
    y = X @ np.array([1.0, -0.5]) + 0.3 + sigma * rng.normal(size=n)
    mu, cov = gaussian_posterior(X, y, sigma, 1.0)
    fam = make_family("linear_regression", {"features": d, "noise_std": sigma})
    M = 2000
    post = rng.multivariate_normal(mu, cov, size=M)
    theta = fam.space.unconstrain({"w": torch.tensor(post[:, :d]), "b": torch.tensor(post[:, d])})
    Xs = rng.normal(size=(N_DRAWS, d))
    out = predictive(
        fam, theta, torch.zeros(M), x=Xs.tolist(), total_draws=20_000, generator=torch.Generator().manual_seed(1)
    )
    steps = out["steps"]
    assert out["horizon"] == N_DRAWS and out["draws"] == 20_000
    A = np.hstack([Xs, np.ones((N_DRAWS, 1))])
    exact_mean = A @ mu
    var_m = np.einsum("ij,jk,ik->i", A, cov, A)
    exact_sd = np.sqrt(sigma**2 + var_m)
    mean = np.array([s["mean"] for s in steps])
    se = np.sqrt(var_m / M + np.array([s["mean_se"] for s in steps]) ** 2)
    assert np.all(np.abs(mean - exact_mean) < 4 * se)
    # std from 10 draws x 2000 particles: relative sd of a sample sd ≈ 1/sqrt(2N) = 0.5%; allow 4 of them
    assert np.all(np.abs(np.array([s["std"] for s in steps]) / exact_sd - 1) < 4 / math.sqrt(2 * 20_000))
    draws = exact_mean + exact_sd * rng.normal(size=N_DRAWS)
    cov90 = coverage(np.array([s["q05"] for s in steps]), np.array([s["q95"] for s in steps]), draws)
    assert 0.85 <= cov90 <= 0.95, cov90


@pytest.mark.slow
def test_linear_regression_known_noise_from_sgais():
    rng = np.random.default_rng(1)
    n, d, sigma = 200, 2, 1.0
    X = rng.normal(size=(n, d))
    y = X @ np.array([0.8, -1.2]) + 0.5 + sigma * rng.normal(size=n)
    eng = engine_after("linear_regression", {"features": d, "noise_std": sigma}, X.tolist(), y.tolist())
    mu, cov = gaussian_posterior(X, y, sigma, 1.0)
    Xs = rng.normal(size=(N_DRAWS, d))
    out = predictive_from_bytes(eng.to_bytes(), x=Xs.tolist(), horizon=1)
    A = np.hstack([Xs, np.ones((N_DRAWS, 1))])
    var_m = np.einsum("ij,jk,ik->i", A, cov, A)
    check(out["steps"], A @ mu, np.sqrt(sigma**2 + var_m), var_m, eng.ess, rng)


@pytest.mark.slow
def test_gmm_one_component_from_sgais():
    rng = np.random.default_rng(2)
    n = 200
    y = 1.5 + 0.8 * rng.normal(size=n)
    eng = engine_after("gmm", {"dim": 1, "components": 1}, None, y.tolist())
    k0, a0, b0 = 1 / 4.0, 1.0, 1.0  # mean_scale 4, variance_shape 1, variance_scale 1 (defaults)
    kn, an = k0 + n, a0 + n / 2
    mn = n * y.mean() / kn
    bn = b0 + 0.5 * ((y - y.mean()) ** 2).sum() + k0 * n * y.mean() ** 2 / (2 * kn)
    scale = math.sqrt(bn * (kn + 1) / (an * kn))
    t = stats.t(df=2 * an, loc=mn, scale=scale)
    out = predictive_from_bytes(eng.to_bytes(), x=None, horizon=N_DRAWS)  # i.i.d.: every step is the next one
    var_m = bn / ((an - 1) * kn)  # posterior variance of the component mean
    check(out["steps"], np.full(N_DRAWS, mn), np.full(N_DRAWS, t.std()), np.full(N_DRAWS, var_m), eng.ess, rng, t)


@pytest.mark.slow
def test_autoregressive_known_noise_from_sgais():
    rng = np.random.default_rng(3)
    n, sigma = 201, 0.5
    y = np.zeros(n)
    for i in range(1, n):
        y[i] = 0.2 + 0.7 * y[i - 1] + sigma * rng.normal()
    eng = engine_after("autoregressive", {"order": 1, "noise_std": sigma}, None, y.tolist())
    mu, cov = gaussian_posterior(y[:-1, None], y[1:], sigma, 1.0)
    a = np.array([y[-1], 1.0])
    sd = math.sqrt(sigma**2 + a @ cov @ a)
    out = predictive_from_bytes(eng.to_bytes(), x=None, horizon=3)
    one = [out["steps"][0]] * N_DRAWS  # the next observation; 200 draws of it
    check(one, np.full(N_DRAWS, a @ mu), np.full(N_DRAWS, sd), np.full(N_DRAWS, a @ cov @ a), eng.ess, rng)
    # two steps ahead: mean c + a·(c + a·y_n) under the posterior, close to the plug-in value
    m2 = mu[1] + mu[0] * (mu[1] + mu[0] * y[-1])
    assert out["steps"][1]["mean"] == pytest.approx(m2, abs=0.1)
    assert out["steps"][1]["std"] > out["steps"][0]["std"]  # uncertainty grows with the horizon


def check(steps, exact_mean, exact_sd, var_m, ess, rng, dist=None):
    """Coverage of 200 exact-predictive draws (one per step) and the mean within 4 Monte Carlo errors."""
    mean = np.array([s["mean"] for s in steps])
    se = np.sqrt(var_m / ess + np.array([s["mean_se"] for s in steps]) ** 2)
    assert np.all(np.abs(mean - exact_mean) < 4 * se), (mean[:3], exact_mean[:3], se[:3])
    draws = dist.rvs(size=len(steps), random_state=rng) if dist else exact_mean + exact_sd * rng.normal(size=len(steps))
    cov90 = coverage(np.array([s["q05"] for s in steps]), np.array([s["q95"] for s in steps]), draws)
    assert 0.85 <= cov90 <= 0.95, cov90


def test_weighted_summary_quantiles_and_weights():
    # two particles, all weight on the second: the summary is that particle's draws alone
    y = torch.stack([torch.full((1000, 1), -5.0), torch.linspace(0, 1, 1000)[:, None]])  # [2, 1000, 1]
    (s,) = weighted_summary(y, torch.tensor([-1e9, 0.0]))
    assert s["mean"] == pytest.approx(0.5) and s["q05"] == pytest.approx(0.05, abs=2e-3)
    assert s["q95"] == pytest.approx(0.95, abs=2e-3) and s["std"] == pytest.approx(math.sqrt(1 / 12), rel=1e-2)


def test_errors_name_the_field():
    lin = make_family("linear_regression", {"features": 2})
    theta = torch.zeros(4, lin.dim)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(PredictiveError) as err:
        predictive(lin, theta, torch.zeros(4), generator=g)
    assert err.value.field == "x"
    with pytest.raises(PredictiveError) as err:
        predictive(lin, theta, torch.zeros(4), x=[[1.0, 2.0, 3.0]], generator=g)
    assert err.value.field == "x" and "x[0]" in err.value.reason  # the row
    ar = make_family("autoregressive", {"order": 2, "noise_std": 1.0})
    with pytest.raises(PredictiveError) as err:
        predictive(ar, torch.zeros(4, ar.dim), torch.zeros(4), context=torch.tensor([1.0]), generator=g)
    assert err.value.field == "horizon" and "2" in err.value.reason
    with pytest.raises(PredictiveError) as err:
        predictive(ar, torch.zeros(4, ar.dim), torch.zeros(4), x=[[1.0]], generator=g)
    assert err.value.field == "x"


def test_same_checkpoint_same_numbers():
    y = np.random.default_rng(4).normal(size=(10, 2)).tolist()
    eng = engine_after("gmm", {"dim": 2, "components": 2}, None, y, particles=10)
    data = eng.to_bytes()
    a = predictive_from_bytes(data, x=None, horizon=2)
    assert a == predictive_from_bytes(data, x=None, horizon=2)
    assert len(a["steps"][0]["mean"]) == 2  # vector observations: one value per coordinate


def test_logistic_regression_label_mean_is_the_class_probability():
    fam = make_family("logistic_regression", {"features": 1, "classes": 2})
    a = 1.2
    theta = fam.space.unconstrain({"W": torch.tensor([[[0.0], [a]]]), "b": torch.zeros(1, 2)})  # one particle
    out = predictive(fam, theta, torch.zeros(1), x=[[1.0], [0.0]], generator=torch.Generator().manual_seed(0))
    p1 = math.exp(a) / (1 + math.exp(a))
    for step, p in zip(out["steps"], (p1, 0.5), strict=True):
        se = math.sqrt(p * (1 - p) / out["draws"])
        assert abs(step["mean"] - p) < 4 * se and step["q05"] in (0.0, 1.0) and step["q95"] == 1.0


def test_bnn_gaussian_with_zero_weights_is_noise_around_the_output_bias():
    fam = make_family("bnn", {"features": 2, "hidden": [3], "outputs": 1, "noise_std": 0.5})
    values = {s.name: torch.zeros(1, *s.shape, dtype=torch.float64) for s in fam.space.specs}
    last_bias = [s.name for s in fam.space.specs][-1]
    values[last_bias] = torch.full((1, 1), 2.0, dtype=torch.float64)
    theta = fam.space.unconstrain(values)
    out = predictive(fam, theta, torch.zeros(1), x=[[0.3, -1.0]], generator=torch.Generator().manual_seed(0))
    (s,) = out["steps"]
    n = out["draws"]
    assert abs(s["mean"] - 2.0) < 4 * 0.5 / math.sqrt(n) and abs(s["std"] / 0.5 - 1) < 4 / math.sqrt(2 * n)
    assert s["q95"] - s["q05"] == pytest.approx(2 * 1.6449 * 0.5, rel=0.03)
