"""Exact log-evidence (nats) of the conjugate families: the reference values SGAIS is tested against.

All computations are float64 numpy/scipy.  Nothing here is used by the sampler.

* Linear regression with known noise (thesis §5.2.1): ``y = A β + ε`` with
  ``A = [X, 1]``, ``β ~ N(0, s² I_D)``, ``ε ~ N(0, σ² I_n)``, so
  ``y ~ N(0, σ² I_n + s² A Aᵀ)`` (Bishop 2006, *PRML* eq. 3.86 / Murphy 2012, *MLPP* §7.6.4).
  The n×n determinant and inverse are reduced to the D×D posterior precision
  ``Λ = AᵀA/σ² + I/s²`` by the matrix determinant lemma and Woodbury's identity:

      log Z = −n/2 log 2π − n log σ − D log s − ½ log det Λ − ½ (yᵀy/σ² − bᵀ Λ⁻¹ b),  b = Aᵀy/σ².

* Linear regression with unknown noise: the conjugate normal–inverse-gamma prior ``σ² ~ IG(a₀, b₀)``,
  ``β | σ² ~ N(m₀, σ² V₀)`` with ``V₀ = r I`` (``r = weight_variance_ratio``) gives the multivariate
  Student-t marginal ``y ~ t_{2a₀}(A m₀, (b₀/a₀)(I_n + A V₀ Aᵀ))`` (Murphy 2012, *MLPP* §7.6.3; Bishop 2006
  eq. 2.159 for the Student-t), computed in the D×D form with ``Λ_n = V₀⁻¹ + AᵀA``:

      log Z = −n/2 log 2π − ½ log det V₀ − ½ log det Λ_n + a₀ log b₀ − a_n log b_n + log Γ(a_n) − log Γ(a₀),
      a_n = a₀ + n/2,  b_n = b₀ + ½ (yᵀy + m₀ᵀV₀⁻¹m₀ − η_nᵀ Λ_n⁻¹ η_n),  η_n = V₀⁻¹m₀ + Aᵀy.

* One-component diagonal Gaussian "mixture" (thesis §5.2.3 with K = 1): per dimension the
  normal–inverse-gamma model ``σ² ~ IG(a₀, b₀)``, ``μ | σ² ~ N(μ₀, σ²/κ₀)`` with
  ``κ₀ = 1/mean_variance_ratio`` and ``μ₀ = mean_location``
  (K. Murphy, *Conjugate Bayesian analysis of the Gaussian distribution*, 2007, §6 eq. 95):

      log Z = log Γ(a_n) − log Γ(a₀) + a₀ log b₀ − a_n log b_n + ½ log(κ₀/κ_n) − n/2 log 2π,
      κ_n = κ₀ + n,  a_n = a₀ + n/2,  b_n = b₀ + ½ Σ (y_i − ȳ)² + κ₀ n (ȳ − μ₀)² / (2 κ_n).

* AR(p) with known noise: linear regression of ``y_t`` on ``(y_{t−1}, …, y_{t−p}, 1)``
  for ``t = p+1..n``, i.e. ``log p(y_{p+1..n} | y_{1..p})``.

* AR(p) with unknown noise (the family's default): the coefficients' prior does not scale with σ², so the
  model is not conjugate; given σ² it is the known-noise case, and the evidence is the one-dimensional integral
  ``Z = ∫ Z(σ²) IG(σ²; a₀, b₀) dσ²``, taken over ``u = log σ²`` by adaptive quadrature
  (:func:`autoregressive_unknown_noise_log_evidence`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.integrate import quad
from scipy.special import gammaln

LOG_2PI = math.log(2.0 * math.pi)


def _as_design(X) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[:, None]
    return np.hstack([X, np.ones((X.shape[0], 1))])


class LinearRegressionEvidence:
    """Incremental exact log-evidence of Bayesian linear regression, known or unknown (NIG) noise.

    Accumulates the sufficient statistics ``AᵀA: [D, D]``, ``Aᵀy: [D]``, ``yᵀy`` and ``n``
    chunk by chunk (``A = [X, 1]``, ``D = d + 1``), so ``log Z`` at any ``n`` costs O(D³).
    A prior mean ``m₀ = (weight_location·1_d, intercept_location)`` is handled by the shift
    ``y → y − A m₀``, ``θ → θ − m₀`` (its statistics follow from the accumulated ones).

    Parameters
    ----------
    features : int
        d, the number of covariates (the columns the model uses).
    noise_std : float | None
        σ (known noise std); None = unknown σ² with the normal–inverse-gamma prior (module docstring).
    prior_std : float
        s, the prior std of every weight and the bias (known noise).
    weight_location, intercept_location : float
        The prior means of the weights and of the bias.
    variance_shape, variance_scale, weight_variance_ratio : float
        a₀, b₀, r of the NIG prior (unknown noise): ``σ² ~ IG(a₀, b₀)``, ``θ | σ² ~ N(m₀, r σ² I)``.
    """

    def __init__(
        self,
        features: int,
        noise_std: float | None = 1.0,
        prior_std: float = 1.0,
        *,
        weight_location: float = 0.0,
        intercept_location: float = 0.0,
        variance_shape: float = 1.0,
        variance_scale: float = 1.0,
        weight_variance_ratio: float = 1.0,
    ):
        self.D = features + 1
        self.noise_std = None if noise_std is None else float(noise_std)
        self.prior_std = float(prior_std)
        self.m0 = np.r_[np.full(features, float(weight_location)), float(intercept_location)]
        self.a0, self.b0, self.ratio = float(variance_shape), float(variance_scale), float(weight_variance_ratio)
        self.AtA = np.zeros((self.D, self.D))
        self.Aty = np.zeros(self.D)
        self.yty = 0.0
        self.n = 0
        self.columns: list[int] | None = None  # the model's columns of the stream's x (for_params)

    @classmethod
    def for_params(cls, params: dict) -> LinearRegressionEvidence:
        """The evidence of a ``linear_regression`` model with these ``params`` (API names, defaults filled in);
        :meth:`update` then takes the stream's full ``x`` rows and selects the model's ``features``."""
        from models.linear_regression import LinearRegressionParams

        p = LinearRegressionParams.model_validate(params)
        out = cls(
            p.n_features,
            p.noise_std,
            p.prior_std,
            weight_location=p.weight_location,
            intercept_location=p.intercept_location,
            variance_shape=p.variance_shape,
            variance_scale=p.variance_scale,
            weight_variance_ratio=p.weight_variance_ratio,
        )
        out.columns = p.selected
        return out

    def update(self, X, y) -> LinearRegressionEvidence:
        """Add observations ``X: [B, d]`` (or the stream's ``[B, columns]`` after :meth:`for_params`), ``y: [B]``;
        returns self."""
        X = np.asarray(X, dtype=np.float64)
        if self.columns is not None:
            X = X[:, self.columns]
        A = _as_design(X)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if A.shape[1] != self.D or A.shape[0] != y.shape[0]:
            raise ValueError(f"expected X [B, {self.D - 1}] and y [B], got {A.shape} and {y.shape}")
        self.AtA += A.T @ A
        self.Aty += A.T @ y
        self.yty += float(y @ y)
        self.n += y.shape[0]
        return self

    @property
    def log_evidence(self) -> float:
        """``log p(y_{1..n} | X)`` (nats) at the current ``n`` (0.0 when n = 0)."""
        m0 = self.m0
        Am = self.AtA @ m0
        Aty = self.Aty - Am  # statistics of y − A m₀
        yty = self.yty - 2.0 * float(m0 @ self.Aty) + float(m0 @ Am)
        if self.noise_std is None:
            return self._nig(Aty, yty)
        s2, v2 = self.prior_std**2, self.noise_std**2
        prec = self.AtA / v2 + np.eye(self.D) / s2  # Λ
        b = Aty / v2
        chol = np.linalg.cholesky(prec)
        logdet = 2.0 * np.log(np.diag(chol)).sum()
        z = np.linalg.solve(chol, b)  # bᵀ Λ⁻¹ b = |L⁻¹ b|²
        quad = yty / v2 - z @ z
        return float(
            -0.5 * self.n * LOG_2PI
            - self.n * math.log(self.noise_std)
            - self.D * math.log(self.prior_std)
            - 0.5 * logdet
            - 0.5 * quad
        )

    def _nig(self, Aty: np.ndarray, yty: float) -> float:
        """Unknown noise, zero prior mean after the shift (Murphy 2012, *MLPP* §7.6.3, the marginal
        likelihood; module docstring): ``Λ_n = AᵀA + I/r``, ``a_n = a₀ + n/2``,
        ``b_n = b₀ + ½ (yᵀy − (Aᵀy)ᵀ Λ_n⁻¹ Aᵀy)``,
        ``log Z = −n/2 log 2π − D/2 log r − ½ log det Λ_n + a₀ log b₀ − a_n log b_n + log Γ(a_n) − log Γ(a₀)``."""
        prec = self.AtA + np.eye(self.D) / self.ratio
        chol = np.linalg.cholesky(prec)
        logdet = 2.0 * np.log(np.diag(chol)).sum()
        z = np.linalg.solve(chol, Aty)
        an = self.a0 + 0.5 * self.n
        bn = self.b0 + 0.5 * (yty - float(z @ z))
        return float(
            -0.5 * self.n * LOG_2PI
            - 0.5 * self.D * math.log(self.ratio)
            - 0.5 * logdet
            + self.a0 * math.log(self.b0)
            - an * math.log(bn)
            + gammaln(an)
            - gammaln(self.a0)
        )


def linear_regression_log_evidence(X, y, noise_std: float | None = 1.0, prior_std: float = 1.0, **prior) -> float:
    """Exact ``log p(y | X)`` (nats) of ``y = Xw + b + ε``.

    Known noise (``noise_std`` = σ): ``w_j ~ N(weight_location, s²)``, ``b ~ N(intercept_location, s²)``,
    ``ε ~ N(0, σ²)``; D×D posterior-precision form (Bishop 2006 eq. 3.86).  ``noise_std=None``: the NIG prior
    of :class:`LinearRegressionEvidence` (keywords ``variance_shape``, ``variance_scale``,
    ``weight_variance_ratio``), a multivariate Student-t marginal.  ``X: [n, d]`` (or ``[n]`` for d = 1),
    ``y: [n]``; O(n d² + d³).
    """
    X = np.asarray(X, dtype=np.float64)
    d = 1 if X.ndim == 1 else X.shape[1]
    return LinearRegressionEvidence(d, noise_std, prior_std, **prior).update(X, y).log_evidence


def gmm_one_component_log_evidence(
    Y,
    variance_shape: float = 1.0,
    variance_scale: float = 1.0,
    mean_variance_ratio: float = 4.0,
    mean_location: float = 0.0,
) -> float:
    """Exact log-evidence (nats) of the ``gmm`` family with ``components = 1``.

    ``Y: [n, dim]`` (or ``[n]``).  Each dimension is an independent normal–inverse-gamma model
    (Murphy 2007, eq. 95; module docstring) with ``μ₀ = mean_location``, ``κ₀ = 1/mean_variance_ratio``;
    the per-dimension log marginals are summed.
    """
    Y = np.asarray(Y, dtype=np.float64) - float(mean_location)  # μ₀ = 0 after the shift
    if Y.ndim == 1:
        Y = Y[:, None]
    n = Y.shape[0]
    a0, b0, k0 = float(variance_shape), float(variance_scale), 1.0 / float(mean_variance_ratio)
    kn, an = k0 + n, a0 + 0.5 * n
    mean = Y.mean(0) if n else np.zeros(Y.shape[1])
    ss = ((Y - mean) ** 2).sum(0)
    bn = b0 + 0.5 * ss + k0 * n * mean**2 / (2.0 * kn)
    per_dim = (
        gammaln(an) - gammaln(a0) + a0 * math.log(b0) - an * np.log(bn) + 0.5 * math.log(k0 / kn) - 0.5 * n * LOG_2PI
    )
    return float(per_dim.sum())


def autoregressive_lags(y, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Lag matrix ``[n − p, p]`` (column k holds ``y_{t−1−k}``) and targets ``y_{p+1..n}``."""
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    n = y.shape[0]
    if n <= order:
        return np.zeros((0, order)), np.zeros(0)
    lags = np.stack([y[order - 1 - k : n - 1 - k] for k in range(order)], axis=1)
    return lags, y[order:]


def autoregressive_log_evidence(
    y,
    order: int,
    noise_std: float,
    prior_std: float = 1.0,
    coefficient_location: float = 0.0,
    intercept_location: float = 0.0,
) -> float:
    """Exact ``log p(y_{p+1..n} | y_{1..p})`` (nats) of AR(p) with known noise std.

    ``y_t = Σ_k a_k y_{t−1−k} + c + ε_t``, ``a_k ~ N(coefficient_location, prior_std²)``,
    ``c ~ N(intercept_location, prior_std²)``, ``ε_t ~ N(0, noise_std²)``: linear regression on the lag
    features plus intercept (module docstring).
    """
    lags, targets = autoregressive_lags(y, order)
    return linear_regression_log_evidence(
        lags,
        targets,
        noise_std,
        prior_std,
        weight_location=coefficient_location,
        intercept_location=intercept_location,
    )


def autoregressive_unknown_noise_log_evidence(
    y,
    order: int,
    prior_std: float = 1.0,
    variance_shape: float = 1.0,
    variance_scale: float = 1.0,
    coefficient_location: float = 0.0,
    intercept_location: float = 0.0,
) -> float:
    """``log p(y_{p+1..n} | y_{1..p})`` (nats) of AR(p) with ``σ² ~ InvGamma(variance_shape, variance_scale)``.

    ``log Z = log ∫ exp(f(u)) du`` with ``f(u) = log Z(σ² = e^u) + log IG(e^u) + u`` (the last term the Jacobian
    of ``σ² = e^u``), ``Z(σ²)`` :func:`autoregressive_log_evidence`; the integrand is shifted by its maximum
    (found on a grid, refined by the quadrature's own subdivision: scipy ``quad``, relative tolerance 1e-10), so
    the result is exact to far below a nat.  O(grid · n p²).
    """
    a, b = float(variance_shape), float(variance_scale)
    lags, targets = autoregressive_lags(y, order)

    def f(u: float) -> float:
        log_z = linear_regression_log_evidence(
            lags, targets, math.exp(0.5 * u), prior_std,
            weight_location=coefficient_location, intercept_location=intercept_location,
        )  # fmt: skip
        return log_z + a * math.log(b) - gammaln(a) - a * u - b * math.exp(-u)  # + log IG + u: −(a + 1)u + u

    grid = np.linspace(-25.0, 25.0, 501)
    values = np.array([f(u) for u in grid])
    top = int(values.argmax())
    peak, centre = float(values[top]), float(grid[top])
    lo, hi = centre - 10.0, centre + 10.0  # the integrand is below e^-100 of its peak a grid step beyond ±10
    while f(lo) - peak > -60.0:
        lo -= 5.0
    while f(hi) - peak > -60.0:
        hi += 5.0
    integral, _ = quad(lambda u: math.exp(f(u) - peak), lo, hi, points=[centre], epsrel=1e-10, limit=200)
    return peak + math.log(integral)
