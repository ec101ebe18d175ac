"""The exact log-evidence formulas in models.conjugate against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from models.conjugate import (
    LinearRegressionEvidence,
    autoregressive_log_evidence,
    gmm_one_component_log_evidence,
    linear_regression_log_evidence,
)


def _design(X):
    return np.hstack([X, np.ones((X.shape[0], 1))])


@pytest.mark.parametrize("noise_std,prior_std", [(1.0, 1.0), (0.3, 2.0), (2.5, 0.4)])
def test_linear_regression_evidence_equals_gaussian_marginal(noise_std, prior_std):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = X @ np.array([0.5, -1.0, 0.2]) + 0.3 + noise_std * rng.normal(size=40)
    A = _design(X)
    cov = noise_std**2 * np.eye(40) + prior_std**2 * A @ A.T  # y ~ N(0, σ²I + s²AAᵀ)
    ref = stats.multivariate_normal(np.zeros(40), cov).logpdf(y)
    assert linear_regression_log_evidence(X, y, noise_std, prior_std) == pytest.approx(ref, abs=1e-9)


def test_incremental_linear_regression_evidence_matches_batch_at_every_n():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(1000, 4))
    y = X.sum(1) + rng.normal(size=1000)
    acc = LinearRegressionEvidence(4, noise_std=0.8, prior_std=1.5)
    assert acc.log_evidence == 0.0
    for lo, hi in [(0, 7), (7, 100), (100, 1000)]:
        acc.update(X[lo:hi], y[lo:hi])
        assert acc.n == hi
        assert acc.log_evidence == pytest.approx(linear_regression_log_evidence(X[:hi], y[:hi], 0.8, 1.5), abs=1e-8)
    with pytest.raises(ValueError):
        acc.update(X[:, :3], y)


def _nig_evidence_by_quadrature(y, a, b, mean_scale, loc=0.0):
    """∫∫ Π N(y_i; μ, σ²) N(μ; loc, mean_scale σ²) InvGamma(σ²; a, b) dμ dσ², by scipy quadrature.

    Box: log σ² in [-12, 12], μ in loc ± 60; the posterior mass outside is < 1e-12 for these data.
    """
    y = np.asarray(y, dtype=np.float64)
    n = y.shape[0]
    log_ig_const = a * math.log(b) - math.lgamma(a)

    def integrand(mu, u):  # the joint density written out (scipy.stats objects are too slow here)
        var = math.exp(u)  # integrate over u = log σ², dσ² = σ² du: no truncation of the σ² tail
        log_lik = -0.5 * n * math.log(2 * math.pi * var) - float(((y - mu) ** 2).sum()) / (2 * var)
        log_mu = -0.5 * math.log(2 * math.pi * mean_scale * var) - (mu - loc) ** 2 / (2 * mean_scale * var)
        log_var = log_ig_const - (a + 1) * math.log(var) - b / var
        return math.exp(log_lik + log_mu + log_var + u)

    val, err = integrate.dblquad(integrand, -12.0, 12.0, loc - 60.0, loc + 60.0, epsabs=1e-13, epsrel=1e-8)
    return math.log(val)


@pytest.mark.slow
@pytest.mark.parametrize("a,b,mean_scale", [(1.0, 1.0, 4.0), (2.5, 0.7, 1.5)])
def test_gmm_one_component_evidence_equals_numerical_integration(a, b, mean_scale):
    Y = np.array([[0.3, -1.2], [1.1, -0.4], [-0.5, -2.0], [0.8, -0.9]])
    ref = sum(_nig_evidence_by_quadrature(Y[:, j], a, b, mean_scale) for j in range(2))
    assert gmm_one_component_log_evidence(Y, a, b, mean_scale) == pytest.approx(ref, abs=1e-6)
    ref1 = _nig_evidence_by_quadrature(Y[:, 0], a, b, mean_scale)
    assert gmm_one_component_log_evidence(Y[:, 0], a, b, mean_scale) == pytest.approx(ref1, abs=1e-6)


def test_autoregressive_evidence_conditions_on_the_first_p_values():
    rng = np.random.default_rng(2)
    y = rng.normal(size=30).cumsum() * 0.3
    p, sigma, s = 2, 0.6, 1.2
    A = np.array([[y[t - 1], y[t - 2], 1.0] for t in range(p, 30)])  # written out as a loop on purpose
    cov = sigma**2 * np.eye(28) + s**2 * A @ A.T
    ref = stats.multivariate_normal(np.zeros(28), cov).logpdf(y[p:])
    assert autoregressive_log_evidence(y, p, sigma, s) == pytest.approx(ref, abs=1e-9)
    # the first p values never enter as targets: changing y_1 changes only the lag features
    assert autoregressive_log_evidence(y[:p], p, sigma, s) == 0.0


@pytest.mark.parametrize("loc_w,loc_b", [(0.0, 0.0), (0.7, -3.0)])
def test_linear_regression_evidence_with_prior_locations_equals_gaussian_marginal(loc_w, loc_b):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(30, 2))
    y = X @ np.array([1.0, 0.5]) - 2.0 + 0.5 * rng.normal(size=30)
    A = _design(X)
    m0 = np.array([loc_w, loc_w, loc_b])
    cov = 0.5**2 * np.eye(30) + 1.3**2 * A @ A.T  # y ~ N(A m0, σ²I + s²AAᵀ)
    ref = stats.multivariate_normal(A @ m0, cov).logpdf(y)
    got = linear_regression_log_evidence(X, y, 0.5, 1.3, weight_location=loc_w, intercept_location=loc_b)
    assert got == pytest.approx(ref, abs=1e-9)


@pytest.mark.parametrize(
    "a0,b0,ratio,loc_w,loc_b",
    [(1.0, 1.0, 1.0, 0.0, 0.0), (2.5, 0.7, 0.2, 0.4, -1.0), (0.6, 30.0, 40.0, 0.0, 300.0)],
)
def test_linear_regression_unknown_noise_evidence_equals_student_t_marginal(a0, b0, ratio, loc_w, loc_b):
    """NIG prior: y ~ t_{2a0}(A m0, (b0/a0)(I + r A Aᵀ)), the multivariate Student-t (scipy.stats.multivariate_t),
    an independent n×n computation of the D×D formula in models.conjugate."""
    rng = np.random.default_rng(6)
    X = rng.normal(size=(35, 3))
    y = X @ np.array([0.5, -1.0, 0.2]) + loc_b + 1.7 * rng.normal(size=35)
    A = _design(X)
    m0 = np.array([loc_w] * 3 + [loc_b])
    shape = (b0 / a0) * (np.eye(35) + ratio * A @ A.T)
    ref = stats.multivariate_t(loc=A @ m0, shape=shape, df=2 * a0).logpdf(y)
    prior = {"variance_shape": a0, "variance_scale": b0, "weight_variance_ratio": ratio}
    got = linear_regression_log_evidence(X, y, None, weight_location=loc_w, intercept_location=loc_b, **prior)
    assert got == pytest.approx(ref, abs=1e-8)
    # incremental, chunk by chunk, and from the model's params with a feature subset of a wider stream
    wide = np.hstack([rng.normal(size=(35, 1)), X[:, [2]], X[:, :2]])  # stream columns: noise, x3, x1, x2
    params = {"features": ["x1", "x2", "x3"], "columns": ["noise", "x3", "x1", "x2"], "noise_std": None}
    acc = LinearRegressionEvidence.for_params(
        {**params, **prior, "weight_location": loc_w, "intercept_location": loc_b}
    )
    for lo, hi in [(0, 1), (1, 20), (20, 35)]:
        acc.update(wide[lo:hi], y[lo:hi])
    assert acc.log_evidence == pytest.approx(ref, abs=1e-8)


@pytest.mark.slow
def test_gmm_one_component_evidence_with_a_mean_location_equals_numerical_integration():
    Y = 300.0 + np.array([[0.3, -1.2], [1.1, -0.4], [-0.5, -2.0], [0.8, -0.9]])
    ref = sum(_nig_evidence_by_quadrature(Y[:, j], 2.0, 1.5, 3.0, loc=300.0) for j in range(2))
    assert gmm_one_component_log_evidence(Y, 2.0, 1.5, 3.0, mean_location=300.0) == pytest.approx(ref, abs=1e-6)


def test_autoregressive_evidence_with_prior_locations():
    rng = np.random.default_rng(8)
    y = 5.0 + rng.normal(size=40).cumsum() * 0.2
    A = np.array([[y[t - 1], 1.0] for t in range(1, 40)])
    cov = 0.4**2 * np.eye(39) + 0.9**2 * A @ A.T
    ref = stats.multivariate_normal(A @ np.array([0.8, 1.0]), cov).logpdf(y[1:])
    got = autoregressive_log_evidence(y, 1, 0.4, 0.9, coefficient_location=0.8, intercept_location=1.0)
    assert got == pytest.approx(ref, abs=1e-9)
