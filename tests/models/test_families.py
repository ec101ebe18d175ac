"""Properties every family must have: vectorised densities equal per-particle references,
transforms round-trip with the right log-|Jacobian|, priors are normalised densities on R^D,
prior draws follow the prior, and invalid observations are rejected with field and row."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from torch.distributions import Categorical, Dirichlet, InverseGamma, Normal, constraints

from models import ObservationError, make_family

D64 = torch.float64

# (family, hyperparameters) covering every parameter kind and likelihood branch.
CASES = [
    ("linear_regression", {"features": 3, "noise_std": 0.7, "prior_std": 1.3}),
    ("linear_regression", {"features": 3, "weight_location": 0.4, "intercept_location": -2.0}),
    (
        "linear_regression",
        {
            "features": 3,
            "noise_std": None,
            "variance_shape": 2.0,
            "variance_scale": 3.0,
            "weight_variance_ratio": 0.5,
            "weight_location": -0.3,
            "intercept_location": 1.5,
        },
    ),
    ("linear_regression", {"features": [4, "c"], "columns": ["a", "b", "c", "d", "e"], "noise_std": None}),
    ("logistic_regression", {"features": [0, 2], "columns": 4, "classes": 3}),
    ("logistic_regression", {"features": 3, "classes": 4, "prior_std": 1.5}),
    ("gmm", {"dim": 1, "components": 1}),
    (
        "gmm",
        {
            "dim": 2,
            "components": 3,
            "dirichlet_alpha": 2.0,
            "variance_shape": 2.5,
            "variance_scale": 0.5,
            "mean_scale": 3.0,  # the old name of mean_variance_ratio
        },
    ),
    ("gmm", {"dim": 2, "components": 1, "mean_location": 300.0, "mean_variance_ratio": 0.5}),
    ("autoregressive", {"order": 3, "noise_std": 0.5, "prior_std": 0.8}),
    ("autoregressive", {"order": 2, "coefficient_location": 0.5, "intercept_location": -1.0}),
    ("autoregressive", {"order": 2, "variance_shape": 2.0, "variance_scale": 3.0}),
    ("bnn", {"features": 3, "hidden": [5], "outputs": 1, "noise_std": 0.4}),
    ("bnn", {"features": 2, "hidden": [4, 3], "outputs": 2, "prior_std": 0.7}),
    ("bnn", {"features": 3, "hidden": [6], "outputs": 3, "likelihood": "categorical"}),
    ("bnn", {"features": [1], "columns": 3, "hidden": [4], "outputs": 1}),
]
IDS = [f"{f}-{i}" for i, (f, _) in enumerate(CASES)]


def make_data(family, B: int, g: torch.Generator):
    """Valid likelihood rows (after ``prepare``) for ``family``: ``(x, y)``."""
    p = family.params
    name = family.name
    if name == "gmm":
        y = torch.randn(B, p.dim, generator=g, dtype=D64) * 2
        return family.validate(None, y.tolist() if p.dim > 1 else y[:, 0].tolist())
    if name == "autoregressive":
        _, y = family.validate(None, torch.randn(B + p.order, generator=g, dtype=D64).tolist())
        x, y, _ = family.prepare(None, y, None)
        return x, y
    x = torch.randn(B, p.stream_columns, generator=g, dtype=D64)  # the stream's columns; validate selects
    if name == "logistic_regression" or (name == "bnn" and p.likelihood == "categorical"):
        K = p.classes if name == "logistic_regression" else p.outputs
        y = torch.randint(0, K, (B,), generator=g).tolist()
    elif name == "bnn" and p.outputs > 1:
        y = torch.randn(B, p.outputs, generator=g, dtype=D64).tolist()
    else:
        y = torch.randn(B, generator=g, dtype=D64).tolist()
    return family.validate(x.tolist(), y)


def reference_log_lik(family, v: dict[str, torch.Tensor], x, y) -> torch.Tensor:
    """``[B]`` log-likelihood of ONE particle's constrained values, written with torch.distributions."""
    p = family.params
    name = family.name
    if name == "linear_regression":
        std = p.noise_std if p.noise_std is not None else v["noise_variance"].sqrt()
        return Normal(x @ v["w"] + v["b"], std).log_prob(y)
    if name == "logistic_regression":
        return Categorical(logits=x @ v["W"].T + v["b"]).log_prob(y.long())
    if name == "gmm":
        comps = []
        for k in range(p.components):
            comps.append(
                torch.log(v["weights"][k]) + Normal(v["means"][k], v["variances"][k].sqrt()).log_prob(y).sum(-1)
            )
        return torch.logsumexp(torch.stack(comps, -1), -1)
    if name == "autoregressive":
        std = p.noise_std if p.noise_std is not None else v["variance"].sqrt()
        mean = torch.stack([sum(v["coefficients"][k] * x[b, k] for k in range(p.order)) for b in range(len(y))])
        return Normal(mean + v["intercept"], std).log_prob(y)
    if name == "bnn":
        h = x
        L = len(p.hidden) + 1
        for i in range(L):
            h = h @ v[f"W{i}"].T + v[f"b{i}"]
            if i < L - 1:
                h = torch.tanh(h)
        if p.likelihood == "categorical":
            return Categorical(logits=h).log_prob(y.long())
        return Normal(h, p.noise_std).log_prob(y[:, None] if y.ndim == 1 else y).sum(-1)
    raise AssertionError(name)


def reference_log_prior(family, v: dict[str, torch.Tensor]) -> torch.Tensor:
    """Scalar log prior density of ONE particle's constrained values (torch.distributions)."""
    p = family.params
    name = family.name
    if name == "gmm":
        lp = Dirichlet(torch.full((p.components,), p.dirichlet_alpha, dtype=D64)).log_prob(v["weights"])
        ig = InverseGamma(torch.tensor(p.variance_shape, dtype=D64), torch.tensor(p.variance_scale, dtype=D64))
        lp = lp + ig.log_prob(v["variances"]).sum()
        prior_sd = (p.mean_variance_ratio * v["variances"]).sqrt()
        return lp + Normal(p.mean_location, prior_sd).log_prob(v["means"]).sum()
    location = {
        "w": getattr(p, "weight_location", 0.0),
        "b": getattr(p, "intercept_location", 0.0),
        "coefficients": getattr(p, "coefficient_location", 0.0),
        "intercept": getattr(p, "intercept_location", 0.0),
    }
    if family.name == "logistic_regression" or family.name == "bnn":
        location = {}
    sd = torch.tensor(p.prior_std, dtype=D64)
    if name == "linear_regression" and p.noise_std is None:  # normal–inverse-gamma: (w, b) | σ² ~ N(m0, r σ² I)
        sd = (p.weight_variance_ratio * v["noise_variance"]).sqrt()
    lp = torch.zeros((), dtype=D64)
    for spec in family.space.specs:
        if spec.name in ("variance", "noise_variance"):
            ig = InverseGamma(torch.tensor(p.variance_shape, dtype=D64), torch.tensor(p.variance_scale, dtype=D64))
            lp = lp + ig.log_prob(v[spec.name])
        else:
            lp = lp + Normal(location.get(spec.name, 0.0), sd).log_prob(v[spec.name]).sum()
    return lp


def flat_constrained(family, u: torch.Tensor) -> torch.Tensor:
    """R^D -> R^D: one particle's constrained values, flattened; a simplex drops its last coordinate
    (stick-breaking maps R^{K-1} onto the first K-1 coordinates; NumPyro test_transforms does the same)."""
    values, _ = family.space.constrain(u[None])
    parts = []
    for spec in family.space.specs:
        c = values[spec.name][0]
        parts.append((c[..., :-1] if spec.constraint is constraints.simplex else c).reshape(-1))
    return torch.cat(parts)


def prior_draws(family, M=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return family.sample_prior(g, M)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_batched_log_likelihood_equals_per_particle_reference(name, params):
    family = make_family(name, params)
    theta = prior_draws(family)
    x, y = make_data(family, 7, torch.Generator().manual_seed(1))
    batched = family.log_likelihood(theta, x, y)
    assert batched.shape == (theta.shape[0], y.shape[0])
    values, _ = family.space.constrain(theta)
    for m in range(theta.shape[0]):
        v = {k: t[m] for k, t in values.items()}
        torch.testing.assert_close(batched[m], reference_log_lik(family, v, x, y), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_log_prior_is_constrained_density_plus_autograd_log_jacobian(name, params):
    family = make_family(name, params)
    theta = prior_draws(family, M=6)
    lp = family.log_prior(theta)
    values, _ = family.space.constrain(theta)
    for m in range(theta.shape[0]):
        J = torch.autograd.functional.jacobian(lambda u: flat_constrained(family, u), theta[m])
        assert J.shape == (family.dim, family.dim)
        log_det = torch.linalg.slogdet(J).logabsdet
        ref = reference_log_prior(family, {k: t[m] for k, t in values.items()}) + log_det
        torch.testing.assert_close(lp[m], ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_transforms_round_trip_and_log_jacobian_matches_autograd(name, params):
    family = make_family(name, params)
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(5, family.dim, generator=g, dtype=D64) * 1.5
    values, log_det = family.space.constrain(theta)
    torch.testing.assert_close(family.space.unconstrain(values), theta, rtol=1e-8, atol=1e-8)
    for m in range(theta.shape[0]):
        J = torch.autograd.functional.jacobian(lambda u: flat_constrained(family, u), theta[m])
        torch.testing.assert_close(log_det[m], torch.linalg.slogdet(J).logabsdet, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_written_out_transforms_have_torch_distributions_bits(name, params):
    """``ParameterSpace.constrain`` writes the positive and simplex transforms out (issue 9, lean hot path):
    values and log-|J| must be bit for bit those of ``torch.distributions``' transforms, but for the simplex, whose
    sigmoid is :func:`models.base.sigmoid` (the same bits in any stack; ``torch.sigmoid`` is not): within 1e-14."""
    family = make_family(name, params)
    space = family.space
    g = torch.Generator().manual_seed(4)
    theta = torch.randn(3, 7, family.dim, generator=g, dtype=D64) * 2.0
    values, log_det = space.constrain(theta)
    want_det = theta.new_zeros(theta.shape[:-1])
    for spec in space.specs:
        u = theta[..., space.slices[spec.name]].reshape(*theta.shape[:-1], *space.shapes[spec.name])
        t = space.transforms[spec.name]
        want = u if t is None else t(u)
        if t is not None:
            want_det = want_det + t.log_abs_det_jacobian(u, want).reshape(*theta.shape[:-1], -1).sum(-1)
        if spec.constraint is constraints.simplex:
            torch.testing.assert_close(values[spec.name], want, rtol=1e-14, atol=1e-15)
        else:
            assert torch.equal(values[spec.name], want), spec.name
    if any(spec.constraint is constraints.simplex for spec in space.specs):
        torch.testing.assert_close(log_det, want_det, rtol=1e-14, atol=1e-13)
    else:
        assert torch.equal(log_det, want_det)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_prior_draws_use_only_the_explicit_generator(name, params):
    family = make_family(name, params)
    torch.manual_seed(0)
    a = prior_draws(family, seed=7)
    torch.manual_seed(1)
    b = prior_draws(family, seed=7)
    assert torch.equal(a, b) and torch.isfinite(a).all()
    assert a.shape == (16, family.dim)


def test_gmm_prior_on_r_d_integrates_to_one():
    # dim 1, one component: theta = (mu, u = log sigma^2); the density on R^2 must integrate to 1.
    # Grid quadrature (Simpson), vectorised: u on [-8, 12]; for each u the mean axis is
    # mu = s(u) z with s(u) = sqrt(mean_variance_ratio e^u), z in [-12, 12], d mu = s(u) dz.  Outside
    # that box the density is below ~1e-30 (Gaussian tails at 12 sd; e^{-a u} / e^{-b e^{-u}} in u).
    family = make_family("gmm", {"dim": 1, "components": 1, "variance_shape": 2.0, "variance_scale": 1.5})
    u = torch.linspace(-8, 12, 801, dtype=D64)
    z = torch.linspace(-12, 12, 481, dtype=D64)
    s = (4.0 * u.exp()).sqrt()
    mu = s[:, None] * z[None, :]
    theta = torch.stack([mu.reshape(-1), u[:, None].expand_as(mu).reshape(-1)], -1)
    dens = (family.log_prior(theta).exp().reshape(mu.shape) * s[:, None]).numpy()
    total = integrate.simpson(integrate.simpson(dens, x=z.numpy(), axis=1), x=u.numpy())
    assert abs(total - 1.0) < 1e-6, total


def test_gmm_simplex_block_integrates_to_the_rest_of_the_prior():
    # Three components: integrating exp(log_prior) over the two stick-breaking coordinates leaves
    # the (independent) prior of the means and log-variances, computed here with torch.distributions.
    family = make_family("gmm", {"dim": 1, "components": 3, "dirichlet_alpha": 1.5})
    theta0 = prior_draws(family, M=1, seed=5)[0]
    values, _ = family.space.constrain(theta0[None])
    var, mu = values["variances"][0], values["means"][0]
    one = torch.tensor(1.0, dtype=D64)
    rest = (
        InverseGamma(one, one).log_prob(var).sum()
        + torch.log(var).sum()
        + Normal(0.0, (4.0 * var).sqrt()).log_prob(mu).sum()
    )
    grid = torch.linspace(-30, 30, 801, dtype=D64)
    u1, u2 = torch.meshgrid(grid, grid, indexing="ij")
    theta = theta0.repeat(u1.numel(), 1)
    theta[:, 0], theta[:, 1] = u1.reshape(-1), u2.reshape(-1)
    dens = (family.log_prior(theta) - rest).exp().reshape(u1.shape).numpy()
    total = integrate.simpson(integrate.simpson(dens, x=grid.numpy(), axis=1), x=grid.numpy())
    assert abs(total - 1.0) < 1e-6, total


def test_autoregressive_variance_coordinate_integrates_to_the_normal_part():
    family = make_family("autoregressive", {"order": 2, "variance_shape": 1.5, "variance_scale": 2.0})
    theta0 = torch.tensor([0.3, -0.2, 0.1, 0.0], dtype=D64)
    normal_part = float(Normal(0.0, torch.tensor(1.0, dtype=D64)).log_prob(theta0[:3]).sum())

    def density(u):
        t = theta0.clone()
        t[3] = u
        return math.exp(float(family.log_prior(t[None])) - normal_part)

    total, _ = integrate.quad(density, -30, 30, epsabs=1e-10, limit=200)
    assert abs(total - 1.0) < 1e-6


def test_gmm_prior_draws_follow_dirichlet_and_inverse_gamma():
    # Kolmogorov-Smirnov on 4000 deterministic draws: weights_k ~ Beta(a, (K-1)a), sigma^2 ~ InvGamma,
    # mu / sqrt(mean_variance_ratio sigma^2) ~ N(0,1).  p > 1e-3 fails with probability 1e-3 per check if correct.
    p = {
        "dim": 2,
        "components": 3,
        "dirichlet_alpha": 0.7,
        "variance_shape": 2.0,
        "variance_scale": 3.0,
        "mean_variance_ratio": 2.0,
    }
    family = make_family("gmm", p)
    values = family.sample_prior_constrained(torch.Generator().manual_seed(11), 4000, D64, torch.device("cpu"))
    w, var, mu = values["weights"], values["variances"], values["means"]
    torch.testing.assert_close(w.sum(-1), torch.ones(4000, dtype=D64))
    assert stats.kstest(w[:, 0].numpy(), stats.beta(0.7, 1.4).cdf).pvalue > 1e-3
    assert stats.kstest(var[:, 1, 0].numpy(), stats.invgamma(2.0, scale=3.0).cdf).pvalue > 1e-3
    assert stats.kstest((mu / (2.0 * var).sqrt())[:, 2, 1].numpy(), stats.norm.cdf).pvalue > 1e-3


def test_autoregressive_prepare_carries_context_across_blocks():
    family = make_family("autoregressive", {"order": 3, "noise_std": 1.0})
    series = torch.arange(1.0, 11.0, dtype=D64)  # 1..10
    rows_x, rows_y, ctx = [], [], None
    for block in (series[:2], series[2:3], series[3:7], series[7:]):  # first blocks shorter than p
        x, y, ctx = family.prepare(None, block, ctx)
        rows_x.append(x)
        rows_y.append(y)
    x, y = torch.cat(rows_x), torch.cat(rows_y)
    torch.testing.assert_close(y, series[3:])
    torch.testing.assert_close(x[0], torch.tensor([3.0, 2.0, 1.0], dtype=D64))  # y_{t-1}, y_{t-2}, y_{t-3}
    torch.testing.assert_close(x[-1], torch.tensor([9.0, 8.0, 7.0], dtype=D64))
    torch.testing.assert_close(ctx, series[-3:])
    full_x, full_y, _ = family.prepare(None, series, None)
    torch.testing.assert_close(full_x, x)
    torch.testing.assert_close(full_y, y)


LR = ("logistic_regression", {"features": 2, "classes": 3})
GMM1 = ("gmm", {"dim": 1, "components": 2})
GMM2 = ("gmm", {"dim": 2, "components": 2})
AR = ("autoregressive", {"order": 2})
BNN_G = ("bnn", {"features": 2, "outputs": 2})
BNN_C = ("bnn", {"features": 2, "outputs": 3, "likelihood": "categorical"})
NAN = float("nan")
INF = float("inf")

INVALID = [
    # family, x, y, field, row
    (LR, [[0, 1], [1, 2]], [0, 3], "y", 1),  # label out of range
    (LR, [[0, 1], [1, 2]], [0, -1], "y", 1),
    (LR, [[0, 1], [1, 2]], [0.5, 1], "y", 0),  # not an integer
    (LR, [[0, 1], [1, 2, 3]], [0, 1], "x", 1),  # ragged / wrong width
    (LR, [[0, 1], [NAN, 2]], [0, 1], "x", 1),
    (LR, None, [0, 1], "x", None),  # x missing
    (LR, [[0, 1]], [0, 1], "x", None),  # misaligned
    (LR, [], [], "y", None),  # empty
    (LR, [[0, 1], [1, 1]], [0, "a"], "y", 1),
    (GMM1, None, [0.1, INF], "y", 1),
    (GMM1, [[1.0]], [0.1], "x", None),  # x given to a family that takes none
    (GMM1, None, [0.1, [0.2, 0.3]], "y", 1),
    (GMM2, None, [[0.1, 0.2], [0.3]], "y", 1),
    (GMM2, None, [[0.1, 0.2], 0.3], "y", 1),
    (GMM2, None, [[0.1, 0.2], [0.3, NAN]], "y", 1),
    (GMM2, None, [], "y", None),
    (AR, None, [0.1, 0.2, NAN], "y", 2),
    (AR, [[1.0], [2.0]], [0.1, 0.2], "x", None),
    (AR, None, [0.1, [1, 2]], "y", 1),
    (AR, None, [], "y", None),
    (BNN_G, [[0, 1], [1, 2]], [[0.1, 0.2], [0.3]], "y", 1),
    (BNN_G, [[0, 1], [1, 2]], [[0.1, 0.2], [0.3, INF]], "y", 1),
    (BNN_G, [[0, 1], [1]], [[0.1, 0.2], [0.3, 0.4]], "x", 1),
    (BNN_C, [[0, 1], [1, 2]], [2, 3], "y", 1),
    (BNN_C, [[0, 1], [1, 2]], [1.5, 2], "y", 0),
    (BNN_C, None, [1, 2], "x", None),
]


@pytest.mark.parametrize("case,x,y,field,row", INVALID)
def test_invalid_observations_name_field_and_row(case, x, y, field, row):
    family = make_family(*case)
    with pytest.raises(ObservationError) as info:
        family.validate(x, y)
    assert info.value.field == field
    assert info.value.row == row


def test_valid_observations_have_the_documented_shapes():
    assert make_family(*GMM1).validate(None, [0.1, [0.2], 3])[1].shape == (3, 1)
    assert make_family(*GMM2).validate(None, [[0.1, 0.2]])[1].shape == (1, 2)
    x, y = make_family(*AR).validate(None, [1, 2.5, 3])
    assert x is None and y.shape == (3,)
    x, y = make_family(*LR).validate([[0, 1], [1, 2]], [0, 2.0])
    assert x.shape == (2, 2) and y.tolist() == [0.0, 2.0]
    assert make_family(*BNN_G).validate([[0, 1]], [[0.1, 0.2]])[1].shape == (1, 2)
    assert make_family("bnn", {"features": 1, "outputs": 1}).validate([[0]], [0.3])[1].shape == (1,)


def test_observation_schemas():
    assert make_family(*LR).observation_schema() == {"x": 2, "y": [], "y_type": "label", "classes": 3}
    assert make_family(*GMM2).observation_schema()["y"] == [2]
    assert make_family(*GMM1).observation_schema()["y"] == []
    assert make_family(*AR).observation_schema()["x"] is None
    assert make_family(*BNN_C).observation_schema()["classes"] == 3


def test_hyperparameter_schemas_reject_bad_values():
    from pydantic import ValidationError

    for name, params in [
        ("logistic_regression", {"features": 2, "classes": 1}),
        ("gmm", {"dim": 1, "components": 0}),
        ("autoregressive", {"order": 0}),
        ("autoregressive", {"order": 1, "noise_std": 0}),
        ("bnn", {"features": 2, "outputs": 1, "likelihood": "categorical"}),
        ("bnn", {"features": 2, "outputs": 1, "hidden": [0]}),
        ("gmm", {"dim": 1, "components": 1, "unknown": 3}),
    ]:
        with pytest.raises(ValidationError):
            make_family(name, params)
    assert make_family("autoregressive", {"order": 4}).context_size == 4
    assert np.isclose(make_family("bnn", {"features": 3, "outputs": 1}).dim, 3 * 16 + 16 + 16 + 1)


def test_linear_regression_normal_inverse_gamma_prior_draws():
    # KS on 4000 deterministic draws: sigma^2 ~ InvGamma(a0, b0); (w_j - m)/sqrt(r sigma^2) and
    # (b - m_b)/sqrt(r sigma^2) ~ N(0, 1), and independent of sigma^2 once standardised (Spearman).
    # Each check fails with probability 1e-3 if the sampler is right.
    p = {
        "features": 2,
        "noise_std": None,
        "variance_shape": 2.5,
        "variance_scale": 4.0,
        "weight_variance_ratio": 0.3,
        "weight_location": 1.0,
        "intercept_location": -5.0,
    }
    family = make_family("linear_regression", p)
    values = family.sample_prior_constrained(torch.Generator().manual_seed(2), 4000, D64, torch.device("cpu"))
    var = values["noise_variance"]
    assert stats.kstest(var.numpy(), stats.invgamma(2.5, scale=4.0).cdf).pvalue > 1e-3
    sd = (0.3 * var).sqrt()
    zw = ((values["w"][:, 1] - 1.0) / sd).numpy()
    zb = ((values["b"] + 5.0) / sd).numpy()
    for z in (zw, zb):
        assert stats.kstest(z, stats.norm.cdf).pvalue > 1e-3
    assert stats.spearmanr(np.abs(zw), var.numpy()).pvalue > 1e-3


def test_prior_locations_shift_the_draws_and_the_density():
    # The same seed with and without a location: draws differ by the location exactly, and the log prior
    # of the shifted draws equals the unshifted one (a location family).
    for name, base, loc in [
        ("gmm", {"dim": 1, "components": 1}, {"mean_location": 300.0}),
        ("autoregressive", {"order": 2, "noise_std": 1.0}, {"coefficient_location": 0.5, "intercept_location": 2.0}),
        ("linear_regression", {"features": 2, "noise_std": None}, {"weight_location": -1.0, "intercept_location": 7.0}),
    ]:
        f0, f1 = make_family(name, base), make_family(name, {**base, **loc})
        t0, t1 = (
            f0.sample_prior(torch.Generator().manual_seed(4), 50),
            f1.sample_prior(torch.Generator().manual_seed(4), 50),
        )
        shift = t1 - t0
        assert shift.abs().max() > 0.4
        torch.testing.assert_close(f1.log_prior(t1), f0.log_prior(t0), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(f1.grad_log_prior(t1), f0.grad_log_prior(t0), rtol=1e-9, atol=1e-9)


def test_gmm_accepts_the_old_name_of_mean_variance_ratio():
    from pydantic import ValidationError

    old = make_family("gmm", {"dim": 1, "components": 1, "mean_scale": 9.0})
    assert old.params == make_family("gmm", {"dim": 1, "components": 1, "mean_variance_ratio": 9.0}).params
    assert "mean_scale" not in old.params.model_dump() and old.params.model_dump()["mean_variance_ratio"] == 9.0
    with pytest.raises(ValidationError, match="old name"):
        make_family("gmm", {"dim": 1, "components": 1, "mean_scale": 9.0, "mean_variance_ratio": 9.0})


def test_feature_subsets_select_the_stream_columns():
    X = [[0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0]]
    names = ["age", "sex", "bmi", "bp"]
    for name, extra in [("linear_regression", {}), ("logistic_regression", {"classes": 2}), ("bnn", {"outputs": 1})]:
        by_index = make_family(name, {"features": [3, 1], "columns": 4, **extra})
        by_name = make_family(name, {"features": ["bp", "sex"], "columns": names, **extra})
        for fam in (by_index, by_name):
            x, _ = fam.validate(X, [0, 1])
            assert x.tolist() == [[3.0, 1.0], [13.0, 11.0]]
            assert fam.observation_schema()["x"] == 4
        assert by_name.observation_schema()["x_names"] == names and "x_names" not in by_index.observation_schema()
        # a NaN in a column the model does not use is still an invalid observation of the stream
        with pytest.raises(ObservationError) as info:
            by_index.validate([[0.0, 1.0, NAN, 3.0]], [0])
        assert (info.value.field, info.value.row) == ("x", 0)
        with pytest.raises(ObservationError):  # rows must have the stream's width, not the model's
            by_index.validate([[3.0, 1.0]], [0])
    # every linear-regression model of the same stream has the same schema whatever its subset
    schemas = {
        json.dumps(make_family("linear_regression", {"features": f, "columns": names}).observation_schema())
        for f in (["age"], ["bmi", "bp"], 4)
    }
    assert len(schemas) == 1


@pytest.mark.parametrize(
    "params,match",
    [
        ({"features": [0, 1]}, "needs `columns`"),
        ({"features": [0, 4], "columns": 4}, "out of range"),
        ({"features": ["bmi"], "columns": 3}, "unknown column name"),
        ({"features": ["xx"], "columns": ["a", "b"]}, "unknown column name 'xx'"),
        ({"features": [1, "b"], "columns": ["a", "b"]}, "selected twice"),
        ({"features": 3, "columns": 4}, "list the columns"),
        ({"features": [0], "columns": ["a", "a"]}, "distinct"),
        ({"features": []}, "at least 1"),
    ],
)
def test_feature_subset_errors_name_the_field(params, match):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=match) as info:
        make_family("linear_regression", params)
    locs = {e["loc"][0] for e in info.value.errors()}
    assert locs <= {"features", "columns"} and locs, info.value.errors()


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_a_model_has_the_same_bits_in_a_stack_of_any_size(name, params):
    """A model's log-likelihood, log-prior and their gradients are row-wise: its row of a stack of K models has the same
    bits for K = 1, 2 and 5, at particle and row counts that put it in the vectorised loops or in their scalar tails
    (``torch.sigmoid`` rounded differently in the two, session 30: :func:`models.base.sigmoid`)."""
    from models.stack import StackedFamily

    family = make_family(name, params)
    g = torch.Generator().manual_seed(9)
    # a mismatch shows only in the few tail elements and for ~2.5 % of inputs: many small draws
    for M, B in [(3, 1), (5, 7), (12, 50), (13, 33)] + [(m, 3) for m in (1, 3, 5, 7, 13, 29) for _ in range(6)]:
        x, y = make_data(family, B, g)
        theta = torch.randn(5, M, family.dim, generator=g, dtype=D64) * 1.5
        weights = torch.rand(5, M, B, generator=g, dtype=D64)
        xs = None if x is None else x.expand(5, *x.shape)
        ys = y.expand(5, *y.shape)
        rows = {}
        for K in (1, 2, 5):
            stack = StackedFamily([family] * K, D64, "cpu")
            t, xk, yk = theta[:K], None if xs is None else xs[:K], ys[:K]
            got = {
                "log_likelihood": stack.log_likelihood(t, xk, yk),
                "log_prior": stack.log_prior(t),
                "grad_log_likelihood": stack.grad_log_likelihood(t, xk, yk),
                "grad_log_prior": stack.grad_log_prior(t),
            }
            if stack.weighted_gradients:
                got["grad_weighted"] = stack.grad_weighted_log_likelihood(t, xk, yk, weights[:K])
            for key, value in got.items():
                first = rows.setdefault(key, value[0])
                assert torch.equal(value[0], first), (key, M, B, K)
