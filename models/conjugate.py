"""Exact log-evidence (nats) of the conjugate families: the reference values SGAIS is tested against.

All computations are float64 numpy/scipy.  Nothing here is used by the sampler.

* Linear regression with known noise (thesis §5.2.1): ``y = A β + ε`` with
  ``A = [X, 1]``, ``β ~ N(0, s² I_D)``, ``ε ~ N(0, σ² I_n)``, so
  ``y ~ N(0, σ² I_n + s² A Aᵀ)`` (Bishop 2006, *PRML* eq. 3.86 / Murphy 2012, *MLPP* §7.6.4).
  The n×n determinant and inverse are reduced to the D×D posterior precision
  ``Λ = AᵀA/σ² + I/s²`` by the matrix determinant lemma and Woodbury's identity:

      log Z = −n/2 log 2π − n log σ − D log s − ½ log det Λ − ½ (yᵀy/σ² − bᵀ Λ⁻¹ b),  b = Aᵀy/σ².

* One-component diagonal Gaussian "mixture" (thesis §5.2.3 with K = 1): per dimension the
  normal–inverse-gamma model ``σ² ~ IG(a₀, b₀)``, ``μ | σ² ~ N(0, σ²/κ₀)`` with ``κ₀ = 1/mean_scale``
  (K. Murphy, *Conjugate Bayesian analysis of the Gaussian distribution*, 2007, §6 eq. 95):

      log Z = log Γ(a_n) − log Γ(a₀) + a₀ log b₀ − a_n log b_n + ½ log(κ₀/κ_n) − n/2 log 2π,
      κ_n = κ₀ + n,  a_n = a₀ + n/2,  b_n = b₀ + ½ Σ (y_i − ȳ)² + κ₀ n ȳ² / (2 κ_n).

* AR(p) with known noise: linear regression of ``y_t`` on ``(y_{t−1}, …, y_{t−p}, 1)``
  for ``t = p+1..n``, i.e. ``log p(y_{p+1..n} | y_{1..p})``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln

LOG_2PI = math.log(2.0 * math.pi)


def _as_design(X) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[:, None]
    return np.hstack([X, np.ones((X.shape[0], 1))])


class LinearRegressionEvidence:
    """Incremental exact log-evidence of Bayesian linear regression with known noise.

    Accumulates the sufficient statistics ``AᵀA: [D, D]``, ``Aᵀy: [D]``, ``yᵀy`` and ``n``
    chunk by chunk (``A = [X, 1]``, ``D = d + 1``), so ``log Z`` at any ``n`` costs O(D³).

    Parameters
    ----------
    features : int
        d, the number of covariates.
    noise_std, prior_std : float
        σ (known noise std) and s (prior std of every weight and the bias).
    """

    def __init__(self, features: int, noise_std: float = 1.0, prior_std: float = 1.0):
        self.D = features + 1
        self.noise_std = float(noise_std)
        self.prior_std = float(prior_std)
        self.AtA = np.zeros((self.D, self.D))
        self.Aty = np.zeros(self.D)
        self.yty = 0.0
        self.n = 0

    def update(self, X, y) -> LinearRegressionEvidence:
        """Add observations ``X: [B, d]``, ``y: [B]``; returns self."""
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
        s2, v2 = self.prior_std**2, self.noise_std**2
        prec = self.AtA / v2 + np.eye(self.D) / s2  # Λ
        b = self.Aty / v2
        chol = np.linalg.cholesky(prec)
        logdet = 2.0 * np.log(np.diag(chol)).sum()
        z = np.linalg.solve(chol, b)  # bᵀ Λ⁻¹ b = |L⁻¹ b|²
        quad = self.yty / v2 - z @ z
        return float(
            -0.5 * self.n * LOG_2PI
            - self.n * math.log(self.noise_std)
            - self.D * math.log(self.prior_std)
            - 0.5 * logdet
            - 0.5 * quad
        )


def linear_regression_log_evidence(X, y, noise_std: float = 1.0, prior_std: float = 1.0) -> float:
    """Exact ``log p(y | X)`` (nats) of ``y = Xw + b + ε``, ``w, b ~ N(0, prior_std²)``, ``ε ~ N(0, noise_std²)``.

    ``X: [n, d]`` (or ``[n]`` for d = 1), ``y: [n]``.  D×D posterior-precision form
    (module docstring; Bishop 2006 eq. 3.86), O(n d² + d³).
    """
    X = np.asarray(X, dtype=np.float64)
    d = 1 if X.ndim == 1 else X.shape[1]
    return LinearRegressionEvidence(d, noise_std, prior_std).update(X, y).log_evidence


def gmm_one_component_log_evidence(
    Y, variance_shape: float = 1.0, variance_scale: float = 1.0, mean_scale: float = 4.0
) -> float:
    """Exact log-evidence (nats) of the ``gmm`` family with ``components = 1``.

    ``Y: [n, dim]`` (or ``[n]``).  Each dimension is an independent normal–inverse-gamma model
    (Murphy 2007, eq. 95; module docstring); the per-dimension log marginals are summed.
    """
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim == 1:
        Y = Y[:, None]
    n = Y.shape[0]
    a0, b0, k0 = float(variance_shape), float(variance_scale), 1.0 / float(mean_scale)
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


def autoregressive_log_evidence(y, order: int, noise_std: float, prior_std: float = 1.0) -> float:
    """Exact ``log p(y_{p+1..n} | y_{1..p})`` (nats) of AR(p) with known noise std.

    ``y_t = Σ_k a_k y_{t−1−k} + c + ε_t``, ``a_k, c ~ N(0, prior_std²)``, ``ε_t ~ N(0, noise_std²)``:
    linear regression on the lag features plus intercept (module docstring).
    """
    lags, targets = autoregressive_lags(y, order)
    return linear_regression_log_evidence(lags, targets, noise_std, prior_std)
