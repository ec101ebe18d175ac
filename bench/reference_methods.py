"""Independent reference log-evidences for ``bench/reference.py`` (numpy/scipy only).

Nothing here imports the project's ``models`` or ``workers``: the models of thesis §5.2
(Cameron 2020) are re-written from the text so that a bug in a family cannot be
reproduced by its own reference.

Models (unit-cube prior transforms for dynesty; all log-densities in nats):

* ``LinearModel``   — ``y = w^T x + b + eps``, eps ~ N(0, noise_std^2), w, b ~ N(0, 1).
  Exact log-evidence (Gaussian marginal); used to validate the nested-sampling setup at the
  dimension of the logistic regression (44 parameters).
* ``LogisticModel`` — softmax regression, ``theta = (W [K, d], b [K])`` ~ N(0, 1) (thesis §5.2.2).
* ``MixtureModel``  — K-component diagonal Gaussian mixture in d dims: weights ~ Dirichlet(1)
  (stick-breaking Beta ppfs, K-1 cube coordinates), sigma^2_kj ~ InvGamma(1, 1),
  mu_kj | sigma^2_kj ~ N(0, 4 sigma^2_kj) (thesis §5.2.3).

Reference methods:

* :func:`run_dynesty` — static nested sampling, ``sample="slice"`` (DESIGN.md §8: ``rslice``
  overestimates log Z by 15–17 nats at 44 parameters).
* :func:`laplace_t_importance` — multivariate Student-t importance sampler centred at the
  posterior mode with scale from the analytic Hessian (unimodal posteriors only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats


@dataclass(frozen=True)
class Reference:
    """A reference log-evidence. ``log_z``/``err`` in nats, ``seconds`` wall time."""

    method: str
    log_z: float
    err: float
    seconds: float
    detail: str = ""


# ----------------------------------------------------------------------------- linear regression
class LinearModel:
    """Bayesian linear regression with known noise; ``theta = (w [d], b)``: D = d + 1.

    The likelihood uses sufficient statistics (``Xa^T Xa``, ``Xa^T y``, ``y^T y`` with
    ``Xa = [X, 1]``), so one evaluation costs O(D^2), independent of n.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, noise_std: float = 1.0):
        self.n, d = x.shape
        self.ndim = d + 1
        xa = np.hstack([x, np.ones((self.n, 1))])
        self.s2 = noise_std**2
        self.xtx, self.xty, self.yty = xa.T @ xa, xa.T @ y, float(y @ y)
        self.const = -0.5 * self.n * np.log(2 * np.pi * self.s2)

    def log_likelihood(self, theta: np.ndarray) -> float:
        quad = self.yty - 2 * theta @ self.xty + theta @ self.xtx @ theta
        return float(self.const - 0.5 * quad / self.s2)

    def prior_transform(self, u: np.ndarray) -> np.ndarray:
        return special.ndtri(u)

    def exact_log_evidence(self) -> float:
        """``log N(y; 0, s2 I + Xa Xa^T)`` via the D x D matrix ``A = I + Xa^T Xa / s2``."""
        a = np.eye(self.ndim) + self.xtx / self.s2
        chol = np.linalg.cholesky(a)
        bvec = self.xty / self.s2
        z = np.linalg.solve(chol, bvec)
        logdet = self.n * np.log(self.s2) + 2 * np.log(np.diag(chol)).sum()
        quad = self.yty / self.s2 - z @ z
        return float(-0.5 * self.n * np.log(2 * np.pi) - 0.5 * logdet - 0.5 * quad)


def linear_data(n: int, d: int, seed: int, noise_std: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``x ~ N(0, I)``, ``(w, b)`` from the prior, ``y = w^T x + b + noise``: ``x [n, d]``, ``y [n]``."""
    rng = np.random.default_rng(seed)
    w, b = rng.standard_normal(d), rng.standard_normal()
    x = rng.standard_normal((n, d))
    return x, x @ w + b + noise_std * rng.standard_normal(n)


# --------------------------------------------------------------------------- logistic regression
class LogisticModel:
    """Softmax regression; ``theta`` flat ``[K * (d + 1)]``, row k = ``(w_k [d], b_k)``."""

    def __init__(self, x: np.ndarray, y: np.ndarray, classes: int):
        self.n, d = x.shape
        self.k, self.p = classes, d + 1
        self.ndim = self.k * self.p
        self.xa = np.hstack([x, np.ones((self.n, 1))])  # [n, d+1]
        self.xa_t = np.ascontiguousarray(self.xa.T)  # [d+1, n]: reductions over K run on rows (fast)
        self.y = y.astype(np.int64)
        self.onehot = np.eye(classes)[self.y]  # [n, K]
        self.xa_t_onehot = self.xa.T @ self.onehot  # [d+1, K], sum of chosen logits = <theta^T, this>

    def log_likelihood_many(self, thetas: np.ndarray) -> np.ndarray:
        """``thetas [S, D]`` -> ``[S]`` log-likelihoods of all n observations."""
        t = thetas.reshape(-1, self.k, self.p)
        chosen = np.einsum("pk,skp->s", self.xa_t_onehot, t)
        logits = (t.reshape(-1, self.p) @ self.xa_t).reshape(t.shape[0], self.k, self.n)  # [S, K, n]
        m = logits.max(1)
        lse = m + np.log(np.exp(logits - m[:, None, :]).sum(1))  # [S, n]
        return chosen - lse.sum(-1)

    def log_likelihood(self, theta: np.ndarray) -> float:
        logits = theta.reshape(self.k, self.p) @ self.xa_t  # [K, n]
        m = logits.max(0)
        lse = (m + np.log(np.exp(logits - m).sum(0))).sum()
        return float((self.xa_t_onehot.T * theta.reshape(self.k, self.p)).sum() - lse)

    def prior_transform(self, u: np.ndarray) -> np.ndarray:
        return special.ndtri(u)

    def log_prior_many(self, thetas: np.ndarray) -> np.ndarray:
        return stats.norm.logpdf(thetas).sum(-1)

    def neg_log_post_grad_hess(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """``-log p(y|theta) - log p(theta)``, its gradient ``[D]`` and Hessian ``[D, D]``."""
        t = theta.reshape(self.k, self.p)
        logits = self.xa @ t.T
        lse = special.logsumexp(logits, axis=1)
        prob = np.exp(logits - lse[:, None])  # [n, K]
        value = -(logits * self.onehot).sum() + lse.sum() + 0.5 * theta @ theta + 0.5 * self.ndim * np.log(2 * np.pi)
        grad = ((prob - self.onehot).T @ self.xa).reshape(-1) + theta
        xx = np.einsum("na,nb->nab", self.xa, self.xa)  # [n, p, p]
        hess = np.einsum("nk,nab->kab", prob, xx)  # diagonal blocks sum_i p_ik x x^T
        full = np.zeros((self.k, self.p, self.k, self.p))
        for k in range(self.k):
            full[k, :, k, :] = hess[k]
        full -= np.einsum("nk,nl,nab->kalb", prob, prob, xx)
        return float(value), grad, full.reshape(self.ndim, self.ndim) + np.eye(self.ndim)


def logistic_data(n: int, d: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``x ~ N(0, I)``, ``theta`` from the N(0, 1) prior, ``y ~ softmax``: ``x [n, d]``, ``y [n]`` ints."""
    rng = np.random.default_rng(seed)
    t = rng.standard_normal((classes, d + 1))
    x = rng.standard_normal((n, d))
    logits = x @ t[:, :d].T + t[:, d]
    prob = np.exp(logits - special.logsumexp(logits, axis=1, keepdims=True))
    y = (prob.cumsum(1) > rng.random((n, 1))).argmax(1)
    return x, y


# ---------------------------------------------------------------------------- Gaussian mixture
class MixtureModel:
    """Diagonal Gaussian mixture; cube coordinates ``[K-1 sticks | K*d variances | K*d means]``."""

    def __init__(
        self,
        y: np.ndarray,
        components: int,
        alpha: float = 1.0,
        shape: float = 1.0,
        scale: float = 1.0,
        mean_scale: float = 4.0,
    ):
        self.n, self.d = y.shape
        self.k = components
        self.alpha, self.shape, self.scale, self.mean_scale = alpha, shape, scale, mean_scale
        self.ndim = (components - 1) + 2 * components * self.d
        # features [y^2 (d), y (d), 1]: each component's log-density is linear in them
        self.features = np.ascontiguousarray(np.hstack([y**2, y, np.ones((self.n, 1))]).T)  # [2d+1, n]
        # stick k ~ Beta(alpha, (K-1-k) alpha) makes the weights Dirichlet(alpha)
        self.beta_b = alpha * (components - 1 - np.arange(components - 1))

    def prior_transform(self, u: np.ndarray) -> np.ndarray:
        """Unit cube ``[ndim]`` -> ``[K-1 sticks, K*d variances, K*d means]``."""
        k, kd = self.k, self.k * self.d
        sticks = special.betaincinv(self.alpha, self.beta_b, u[: k - 1])
        var = self.scale / special.gammainccinv(self.shape, u[k - 1 : k - 1 + kd])  # InvGamma ppf
        mean = np.sqrt(self.mean_scale * var) * special.ndtri(u[k - 1 + kd :])
        return np.concatenate([sticks, var, mean])

    def weights(self, sticks: np.ndarray) -> np.ndarray:
        rest = np.concatenate([[1.0], np.cumprod(1 - sticks)])
        return np.concatenate([sticks, [1.0]]) * rest

    def log_likelihood(self, v: np.ndarray) -> float:
        k, kd = self.k, self.k * self.d
        w = self.weights(v[: k - 1])
        var = v[k - 1 : k - 1 + kd].reshape(k, self.d)
        mean = v[k - 1 + kd :].reshape(k, self.d)
        with np.errstate(divide="ignore"):
            const = np.log(w) - 0.5 * (np.log(2 * np.pi * var) + mean**2 / var).sum(1)
        coef = np.hstack([-0.5 / var, mean / var, const[:, None]])  # [K, 2d+1]
        comp = coef @ self.features  # [K, n]
        m = comp.max(0)
        out = (m + np.log(np.exp(comp - m).sum(0))).sum()
        return float(out) if np.isfinite(out) else -1e300


def mixture_data(n: int, dim: int, components: int, seed: int) -> tuple[np.ndarray, dict]:
    """Parameters from the thesis prior, then ``y [n, dim]`` from the mixture; also returns the truth."""
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(components))
    var = 1.0 / rng.gamma(1.0, 1.0, size=(components, dim))
    mean = rng.normal(0.0, np.sqrt(4.0 * var))
    z = rng.choice(components, size=n, p=w)
    y = mean[z] + np.sqrt(var[z]) * rng.standard_normal((n, dim))
    return y, {"weights": w, "variances": var, "means": mean}


# ------------------------------------------------------------------------------------ methods
def run_dynesty(
    loglike, prior_transform, ndim: int, *, nlive: int, seed: int, label: str, dlogz: float | None = None
) -> Reference:
    """Static nested sampling with ``bound="multi"``, ``sample="slice"``; log Z ± dynesty's logzerr."""
    import dynesty

    start = time.perf_counter()
    sampler = dynesty.NestedSampler(
        loglike,
        prior_transform,
        ndim,
        nlive=nlive,
        bound="multi",
        sample="slice",
        rstate=np.random.default_rng(seed),
    )
    sampler.run_nested(dlogz=dlogz, print_progress=False)
    res = sampler.results
    seconds = time.perf_counter() - start
    ncall = int(np.sum(res.ncall))
    return Reference(
        f"dynesty slice nlive={nlive}",
        float(res.logz[-1]),
        float(res.logzerr[-1]),
        seconds,
        f"{label}: {res.niter} iterations, {ncall} likelihood calls",
    )


def laplace_t_importance(
    model: LogisticModel, *, draws: int = 20_000, df: float = 5.0, seed: int = 0, chunk: int = 250
) -> Reference:
    """Student-t importance sampler centred at the posterior mode, scale = inverse Hessian.

    ``log Z = log mean_s p(y|theta_s) p(theta_s) / q(theta_s)``; ``err`` is the delta-method
    Monte Carlo standard error of that log-mean, ``sd(w) / (sqrt(S) mean(w))``.
    Valid for unimodal posteriors only (not mixtures: K! label-switching modes).
    """
    start = time.perf_counter()
    fun = lambda t: model.neg_log_post_grad_hess(t)[:2]  # noqa: E731
    opt = optimize.minimize(
        fun, np.zeros(model.ndim), jac=True, method="L-BFGS-B", options={"maxiter": 10_000, "gtol": 1e-9}
    )
    mode = opt.x
    _, grad, hess = model.neg_log_post_grad_hess(mode)
    cov = np.linalg.inv(hess)
    cov = 0.5 * (cov + cov.T)
    proposal = stats.multivariate_t(loc=mode, shape=cov, df=df, seed=np.random.default_rng(seed))
    thetas = np.atleast_2d(proposal.rvs(size=draws))
    log_q = proposal.logpdf(thetas)
    log_target = np.concatenate(
        [model.log_likelihood_many(thetas[i : i + chunk]) for i in range(0, draws, chunk)]
    ) + model.log_prior_many(thetas)
    lw = log_target - log_q
    log_z = float(special.logsumexp(lw) - np.log(draws))
    w = np.exp(lw - lw.max())
    err = float(w.std() / (np.sqrt(draws) * w.mean()))
    ess = float(w.sum() ** 2 / (w**2).sum())
    return Reference(
        f"Laplace-t IS df={df:g} S={draws}",
        log_z,
        err,
        time.perf_counter() - start,
        f"|grad| at mode {np.linalg.norm(grad):.1e}, ESS {ess:.0f}/{draws}",
    )


# ------------------------------------------------------ mixture: one-mode IS x K! (label switching)
class MixtureUnconstrained:
    """The mixture posterior in ``phi = [logit(sticks) (K-1), log variances (K d), means (K d)]``.

    Density w.r.t. ``phi`` = likelihood x (Beta stick, InvGamma, Normal prior densities) x |J|,
    the same prior as :class:`MixtureModel`'s cube transform.
    """

    def __init__(self, model: MixtureModel):
        self.m = model
        self.ndim = model.ndim

    def to_physical(self, phi: np.ndarray) -> tuple[np.ndarray, float]:
        k, kd = self.m.k, self.m.k * self.m.d
        a, lv, mu = phi[: k - 1], phi[k - 1 : k - 1 + kd], phi[k - 1 + kd :]
        sticks = special.expit(a)
        log_j = float((np.log(sticks) + np.log1p(-sticks)).sum() + lv.sum())
        return np.concatenate([sticks, np.exp(lv), mu]), log_j

    def log_post(self, phi: np.ndarray) -> float:
        m = self.m
        k, kd = m.k, m.k * m.d
        v, log_j = self.to_physical(phi)
        sticks, var, mu = v[: k - 1], v[k - 1 : k - 1 + kd], v[k - 1 + kd :]
        lp = (
            stats.beta.logpdf(sticks, m.alpha, m.beta_b).sum()
            + stats.invgamma.logpdf(var, m.shape, scale=m.scale).sum()
            + stats.norm.logpdf(mu, 0.0, np.sqrt(m.mean_scale * var)).sum()
        )
        out = m.log_likelihood(v) + lp + log_j
        return float(out) if np.isfinite(out) else -1e300

    def from_truth(self, truth: dict) -> np.ndarray:
        w = truth["weights"]
        rest = 1 - np.concatenate([[0.0], np.cumsum(w)[:-1]])
        sticks = np.clip(w[:-1] / rest[:-1], 1e-9, 1 - 1e-9)
        return np.concatenate([special.logit(sticks), np.log(truth["variances"]).ravel(), truth["means"].ravel()])


def numerical_hessian(f, x: np.ndarray, h: float = 1e-3) -> np.ndarray:
    """Central-difference Hessian of scalar ``f`` at ``x [D]`` (4 D^2 / 2 evaluations)."""
    d = x.size
    hess = np.zeros((d, d))
    e = np.eye(d) * h
    f0 = f(x)
    for i in range(d):
        hess[i, i] = (f(x + e[i]) - 2 * f0 + f(x - e[i])) / h**2
        for j in range(i):
            hess[i, j] = hess[j, i] = (
                f(x + e[i] + e[j]) - f(x + e[i] - e[j]) - f(x - e[i] + e[j]) + f(x - e[i] - e[j])
            ) / (4 * h**2)
    return hess


def mixture_mode_importance(
    model: MixtureModel, truth: dict, *, draws: int = 20_000, df: float = 5.0, seed: int = 0
) -> Reference:
    """Student-t IS around ONE label-switching mode, times K! (the symmetric copies).

    Valid when the K! permuted modes are disjoint (well-separated components at this n) and no
    other local mode carries mass; the optimiser starts from the generating parameters.
    """
    start = time.perf_counter()
    post = MixtureUnconstrained(model)
    neg = lambda p: -post.log_post(p)  # noqa: E731
    opt = optimize.minimize(neg, post.from_truth(truth), method="BFGS", options={"gtol": 1e-4, "maxiter": 5000})
    mode = opt.x
    cov = np.linalg.inv(numerical_hessian(neg, mode))
    cov = 0.5 * (cov + cov.T)
    proposal = stats.multivariate_t(loc=mode, shape=cov, df=df, seed=np.random.default_rng(seed))
    phis = proposal.rvs(size=draws)
    lw = np.array([post.log_post(p) for p in phis]) - proposal.logpdf(phis)
    log_z = float(special.logsumexp(lw) - np.log(draws) + special.gammaln(model.k + 1))
    w = np.exp(lw - lw.max())
    err = float(w.std() / (np.sqrt(draws) * w.mean()))
    ess = float(w.sum() ** 2 / (w**2).sum())
    return Reference(
        f"one-mode t IS x K! df={df:g} S={draws}",
        log_z,
        err,
        time.perf_counter() - start,
        f"optimiser {'ok' if opt.success else opt.message}, ESS {ess:.0f}/{draws}",
    )
