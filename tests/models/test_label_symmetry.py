"""Label symmetry of mixtures (:meth:`models.base.Family.label_orbit`), which the defensive Laplace start
symmetrises over (``workers/conflict.py``)."""

from __future__ import annotations

import math

import pytest
import torch

from models.gmm import GaussianMixture


@pytest.mark.parametrize(("components", "dim"), [(2, 1), (3, 2), (5, 2)])
def test_a_relabelling_changes_neither_likelihood_nor_prior_nor_volume(components: int, dim: int) -> None:
    """Every point of a prior draw's orbit (``C!`` relabellings, the identity first) has the same
    log-likelihood, the same log prior (log-|J| included) and the same log-|J| of the constrain transform;
    the last is what lets ``q_sym`` average the Gaussian density over the orbit without Jacobian ratios."""
    family = GaussianMixture({"dim": dim, "components": components})
    g = torch.Generator().manual_seed(0)
    theta = family.sample_prior(g, 6)
    y = torch.randn(20, dim, generator=g, dtype=torch.float64)
    orbit = family.label_orbit(theta)
    assert orbit is not None and orbit.shape == (math.factorial(components), *theta.shape)
    torch.testing.assert_close(orbit[0], theta, rtol=0, atol=1e-12)
    assert not torch.allclose(orbit[1], theta)  # a relabelling moves the point
    for point in orbit:
        torch.testing.assert_close(family.log_likelihood(point, None, y), family.log_likelihood(theta, None, y))
        torch.testing.assert_close(family.log_prior(point), family.log_prior(theta))
        torch.testing.assert_close(family.space.constrain(point)[1], family.space.constrain(theta)[1])


def test_no_orbit_without_symmetry_or_beyond_720_relabellings() -> None:
    theta = torch.zeros(3, GaussianMixture({"dim": 1, "components": 1}).dim, dtype=torch.float64)
    assert GaussianMixture({"dim": 1, "components": 1}).label_orbit(theta) is None
    seven = GaussianMixture({"dim": 1, "components": 7})
    assert seven.label_orbit(seven.sample_prior(torch.Generator().manual_seed(0), 2)) is None
