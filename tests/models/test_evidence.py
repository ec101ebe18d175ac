"""SGAIS log-evidence through ``workers.engine.ModelEngine`` against the exact conjugate values.

Setting: n = 2000 observations posted as one chunk (split into 500-blocks by the engine),
default sampler settings (``particles`` 10, with the default warm-up population while n <= 2000),
three sampler seeds per family on one fixed data set.

Tolerances.  SGAIS's ``Ẑ`` is (up to SGHMC bias) an unbiased importance-sampling estimate of Z,
so ``e = log Ẑ − log Z`` has a Monte Carlo spread σ and, for a roughly log-normal ``Ẑ``, a mean of
about ``−σ²/2`` (Jensen).  σ was measured first over 8 seeds with exactly this setting
(``python`` loop over seeds 0..7, 2026-11-22; per-family numbers in ``SIGMA`` below, rounded up
from the sample sd, which with 8 seeds is itself uncertain by ~25%).  Each test asserts

* every seed: ``−σ²/2 − 4σ < e < 4σ`` — a 4-sd band around the expected value (a Gaussian
  4-sd excursion has probability 6e-5; the upper side additionally obeys Markov,
  P(e > t) ≤ e^{−t}, for an unbiased Ẑ);
* the seed mean: ``|mean(e) + σ²/2| < 3σ/√S`` — catches a systematic bias of ≳ σ that a single
  seed could hide.

A failure means SGAIS (or the family's density) is off by more than its own Monte Carlo error.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.conjugate import (
    LinearRegressionEvidence,
    autoregressive_log_evidence,
    autoregressive_unknown_noise_log_evidence,
    gmm_one_component_log_evidence,
    linear_regression_log_evidence,
)
from workers.engine import ModelEngine
from workers.stacking import advance_stack

N = 2000
SEEDS = (0, 1, 2)
D64 = torch.float64

# Measured sd of e over seeds 0..7 (see module docstring), rounded up.
SIGMA = {"linear_regression": 0.6, "linear_regression-nig": 0.45, "autoregressive": 0.6, "autoregressive-unknown": 0.3,
         "gmm-1": 0.35, "gmm-2": 0.75}  # fmt: skip
# Sampler overrides per case.  linear_regression-nig (unknown noise, normal–inverse-gamma): with the default
# learning rate 0.1 the error has mean −0.90, sd 0.29 over seeds 0..7 (this data set): an SGHMC step-size
# bias, growing from −0.51 at n = 500 to −0.81 at n = 2000 (6 seeds), not Monte Carlo error.  learning_rate
# 0.03 alone leaves −0.40; with burn_in 60 too: mean −0.09, sd 0.40 over seeds 0..7 (SIGMA below).  So the
# test checks the family and SGAIS at a step size fine enough for this posterior (reported in docs/priors.md).
# autoregressive-unknown (AR(2), the family's default unknown noise; exact evidence by quadrature over σ²): the same
# step-size bias at the default learning rate (mean −0.75, sd 0.16 over seeds 0..7; −0.67, sd 0.29 before its
# sufficient statistics), mean −0.05, sd 0.23 at learning_rate 0.03 and burn_in 60.
SAMPLER = {
    "linear_regression-nig": {"learning_rate": 0.03, "burn_in": 60},
    "autoregressive-unknown": {"learning_rate": 0.03, "burn_in": 60},
}


def _linear_regression(g):
    x = torch.randn(N, 3, generator=g, dtype=D64)
    y = x @ torch.tensor([1.0, -0.5, 0.3], dtype=D64) + 0.2 + torch.randn(N, generator=g, dtype=D64)
    exact = linear_regression_log_evidence(x.numpy(), y.numpy(), 1.0, 1.0)
    return ("linear_regression", {"features": 3}), x, y, exact


def _linear_regression_unknown_noise(g):
    x = torch.randn(N, 3, generator=g, dtype=D64)
    y = x @ torch.tensor([1.0, -0.5, 0.3], dtype=D64) + 0.2 + 0.7 * torch.randn(N, generator=g, dtype=D64)
    params = {"features": 3, "noise_std": None}
    exact = LinearRegressionEvidence.for_params(params).update(x.numpy(), y.numpy()).log_evidence
    return ("linear_regression", params), x, y, exact


def _autoregressive(g):
    eps = 0.5 * torch.randn(N, generator=g, dtype=D64)
    y = torch.zeros(N, dtype=D64)
    for t in range(2, N):  # AR(2), stationary: roots of 1 − 0.6z + 0.3z² lie outside the unit circle
        y[t] = 0.6 * y[t - 1] - 0.3 * y[t - 2] + 0.1 + eps[t]
    exact = autoregressive_log_evidence(y.numpy(), 2, noise_std=0.5, prior_std=1.0)
    return ("autoregressive", {"order": 2, "noise_std": 0.5}), None, y, exact


def _autoregressive_unknown_noise(g):
    eps = 0.5 * torch.randn(N, generator=g, dtype=D64)
    y = torch.zeros(N, dtype=D64)
    for t in range(2, N):  # as _autoregressive; the model's noise variance is unknown (InvGamma(1, 1) prior)
        y[t] = 0.6 * y[t - 1] - 0.3 * y[t - 2] + 0.1 + eps[t]
    exact = autoregressive_unknown_noise_log_evidence(y.numpy(), 2)
    return ("autoregressive", {"order": 2}), None, y, exact


def _gmm(dim):
    def make(g):
        scale = torch.tensor([1.5, 0.7][:dim], dtype=D64)
        loc = torch.tensor([1.0, -2.0][:dim], dtype=D64)
        y = torch.randn(N, dim, generator=g, dtype=D64) * scale + loc
        exact = gmm_one_component_log_evidence(y.numpy(), 1.0, 1.0, 4.0)
        return ("gmm", {"dim": dim, "components": 1}), None, (y[:, 0] if dim == 1 else y), exact

    return make


CASES = {
    "linear_regression": _linear_regression,
    "linear_regression-nig": _linear_regression_unknown_noise,
    "autoregressive": _autoregressive,
    "autoregressive-unknown": _autoregressive_unknown_noise,
    "gmm-1": _gmm(1),
    "gmm-2": _gmm(2),
}


def sgais_errors(case: str, stacked: bool = False) -> tuple[list[float], float]:
    """``log Ẑ − log Z`` per seed (nats) and the exact log Z; ``stacked``: the seeds run as one stack."""
    (family, params), x, y, exact = CASES[case](torch.Generator().manual_seed(100))
    engines = [ModelEngine(family, params, {**SAMPLER.get(case, {}), "seed": seed}) for seed in SEEDS]
    if stacked:
        results = advance_stack(engines, [(x, y)] * len(engines))
    else:
        results = [eng.update(x, y) for eng in engines]
    errors = []
    for eng, infos in zip(engines, results, strict=True):
        assert isinstance(infos, list), infos
        assert eng.observations == N and not any(i.guard_tripped for i in infos)
        errors.append(eng.log_evidence - exact)
    return errors, exact


def check(case: str, stacked: bool = False) -> None:
    errors, exact = sgais_errors(case, stacked)
    sigma = SIGMA[case]
    centre = -0.5 * sigma**2
    msg = f"{case}: log Z = {exact:.3f}, SGAIS errors {np.round(errors, 3).tolist()} (σ = {sigma})"
    print(msg)
    for e in errors:
        assert centre - 4 * sigma < e < 4 * sigma, msg
    assert abs(np.mean(errors) - centre) < 3 * sigma / math.sqrt(len(errors)), msg


@pytest.mark.slow
@pytest.mark.parametrize("stacked", [False, True], ids=["alone", "stacked"])
def test_linear_regression_known_noise_matches_exact_evidence(stacked):
    check("linear_regression", stacked)


@pytest.mark.slow
@pytest.mark.parametrize("stacked", [False, True], ids=["alone", "stacked"])
def test_linear_regression_unknown_noise_matches_student_t_evidence(stacked):
    check("linear_regression-nig", stacked)


@pytest.mark.slow
@pytest.mark.parametrize("stacked", [False, True], ids=["alone", "stacked"])
def test_autoregressive_known_noise_matches_exact_evidence(stacked):
    check("autoregressive", stacked)


@pytest.mark.slow
@pytest.mark.parametrize("stacked", [False, True], ids=["alone", "stacked"])
def test_autoregressive_unknown_noise_matches_the_evidence_by_quadrature(stacked):
    check("autoregressive-unknown", stacked)


def test_the_unknown_noise_quadrature_tends_to_the_known_noise_evidence():
    """An inverse-gamma prior concentrated at σ² = 0.25 (shape 10⁶) gives the known-noise evidence at σ = 0.5."""
    (_, _), _, y, _ = _autoregressive(torch.Generator().manual_seed(3))
    y = y[:300].numpy()
    shape = 1e6
    near = autoregressive_unknown_noise_log_evidence(y, 2, variance_shape=shape + 1, variance_scale=0.25 * (shape + 1))
    assert abs(near - autoregressive_log_evidence(y, 2, noise_std=0.5)) < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("stacked", [False, True], ids=["alone", "stacked"])
@pytest.mark.parametrize("case", ["gmm-1", "gmm-2"])
def test_gmm_one_component_matches_normal_inverse_gamma_evidence(case, stacked):
    check(case, stacked)
