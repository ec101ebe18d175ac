"""Gaussian mixture with diagonal covariances, latent assignments marginalised (thesis §5.2.3).

``p(y | θ) = Σ_k β_k Π_j N(y_j; μ_kj, σ²_kj)`` with ``β ~ Dirichlet(α 1_K)``,
``σ²_kj ~ InvGamma(variance_shape, variance_scale)`` and
``μ_kj | σ²_kj ~ N(mean_location, mean_variance_ratio·σ²_kj)`` (``mean_variance_ratio`` was called
``mean_scale`` before; the old name is still accepted).
With one component the evidence is closed form
(:func:`models.conjugate.gmm_one_component_log_evidence`).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field, model_validator
from torch.distributions import constraints

from models.base import (
    Family,
    HyperParams,
    ParameterSpec,
    as_matrix,
    check_nonempty_and_aligned,
    require_no_x,
    sigmoid,
    stick_breaking_constants,
)
from models.densities import LOG_2PI


class GaussianMixtureParams(HyperParams):
    dim: int = Field(..., ge=1, le=1_000, description="d, the dimension of one observation")
    components: int = Field(..., ge=1, le=1_000, description="K, the number of mixture components")
    dirichlet_alpha: float = Field(1.0, gt=0, description="α of the symmetric Dirichlet prior on the weights")
    variance_shape: float = Field(1.0, gt=0, description="shape of the inverse-gamma prior on each variance")
    variance_scale: float = Field(1.0, gt=0, description="scale of the inverse-gamma prior on each variance")
    mean_location: float = Field(0.0, allow_inf_nan=False, description="prior mean of each component mean μ_kj")
    mean_variance_ratio: float = Field(
        4.0,
        gt=0,
        description=(
            "prior variance of each component mean, in units of its component variance: "
            "μ_kj | σ²_kj ~ N(mean_location, mean_variance_ratio·σ²_kj) (κ₀ = 1/ratio). "
            "Formerly `mean_scale` (a variance ratio despite its name; still accepted, same meaning)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data: Any) -> Any:
        """Accept the old name ``mean_scale`` for ``mean_variance_ratio`` (same value, same meaning)."""
        if isinstance(data, dict) and "mean_scale" in data:
            data = dict(data)
            if "mean_variance_ratio" in data:
                raise ValueError("mean_scale is the old name of mean_variance_ratio: give one of them")
            data["mean_variance_ratio"] = data.pop("mean_scale")
        return data


class GaussianMixture(Family):
    name = "gmm"
    prior = (
        "β ~ Dirichlet(dirichlet_alpha), σ²_kj ~ InvGamma(variance_shape, variance_scale), "
        "μ_kj | σ²_kj ~ N(mean_location, mean_variance_ratio·σ²_kj)"
    )
    Params = GaussianMixtureParams
    params: GaussianMixtureParams

    def parameter_specs(self) -> list[ParameterSpec]:
        K, d = self.params.components, self.params.dim
        return [
            ParameterSpec("weights", (K,), constraints.simplex),
            ParameterSpec("means", (K, d)),
            ParameterSpec("variances", (K, d), constraints.positive),
        ]

    def exchangeable_parameters(self) -> tuple[str, ...]:
        """Weights, means and variances share one component axis; the symmetric Dirichlet and the common
        per-component priors make the labels exchangeable (``components!`` posterior modes)."""
        return ("weights", "means", "variances") if self.params.components > 1 else ()

    @property
    def unimodal(self) -> bool:
        """One component: each dimension's posterior is normal–inverse-gamma, one mode in ``(μ, log σ²)``.
        Several components: label symmetry and local modes."""
        return self.params.components == 1

    @property
    def identifiable(self) -> bool:
        """One component only: several have ``components!`` label modes (the defensive start symmetrises its
        proposal over them on a conflict, :mod:`workers.conflict`)."""
        return self.params.components == 1

    def observation_schema(self) -> dict[str, Any]:
        d = self.params.dim
        return {"x": None, "y": [] if d == 1 else [d], "y_type": "real", "classes": None}

    def validate(self, x: Any, y: Any) -> tuple[None, torch.Tensor]:
        """``y``: numbers (dim = 1) or rows of ``dim`` numbers; no ``x``. Returns ``(None, y: [B, dim])``."""
        require_no_x(x, self.name)
        yt = as_matrix(y, "y", self.params.dim)
        check_nonempty_and_aligned(None, yt)
        return None, yt

    def hyper(self) -> dict[str, float]:
        p = self.params
        return {
            "dirichlet_alpha": p.dirichlet_alpha,
            "variance_shape": p.variance_shape,
            "variance_scale": p.variance_scale,
            "mean_variance_ratio": p.mean_variance_ratio,
            "mean_location": p.mean_location,
        }

    def stacked_log_prior(self, values, hp):
        """Dirichlet(α) + InvGamma(shape, scale) + N(mean_location, mean_variance_ratio·σ²) log densities,
        ``[K, M]`` (nats).

        Written out (same as ``torch.distributions.Dirichlet`` / ``InverseGamma`` log_prob, checked
        in tests) with per-model hyperparameters ``hp: {name: [K, 1]}``.
        """
        C = self.params.components
        w, mu, var = values["weights"], values["means"], values["variances"]
        alpha, a, b, ms = (
            hp[k] for k in ("dirichlet_alpha", "variance_shape", "variance_scale", "mean_variance_ratio")
        )
        lp = torch.lgamma(C * alpha) - C * torch.lgamma(alpha) + (alpha - 1.0) * torch.log(w).sum(-1)
        a3, b3, ms3 = a[..., None, None], b[..., None, None], ms[..., None, None]
        log_var = torch.log(var)
        lp = lp + (a3 * torch.log(b3) - torch.lgamma(a3) - (a3 + 1.0) * log_var - b3 / var).sum((-2, -1))
        mu = mu - hp["mean_location"][..., None, None]
        z2 = mu * mu / (ms3 * var)
        return lp + (-0.5 * z2 - 0.5 * (torch.log(ms3) + log_var) - 0.5 * LOG_2PI).sum((-2, -1))

    def stacked_log_likelihood(self, values, x, y, hp):
        """``weights: [K, M, C]``, ``means, variances: [K, M, C, d]``, ``y: [K, B, d]`` -> ``[K, M, B]`` (nats).

        Laid out ``[K, M, C, d, B]`` so that the reductions over components and coordinates run along the
        contiguous observation axis (a log-sum-exp over a last axis of 2 components costs ~10× more)."""
        mu, var = values["means"], values["variances"]
        comp = self._component_log_densities(mu, var, torch.log(var), y)
        if comp.shape[-2] == 1:  # one component: its weight is 1, and the log-sum-exp of one term is it (same bits)
            return comp[..., 0, :]
        return torch.logsumexp(torch.log(values["weights"])[..., None] + comp, dim=-2)

    @staticmethod
    def _component_log_densities(
        mu: torch.Tensor, var: torch.Tensor, log_var: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """``Σ_j log N(y_bj; μ_cj, σ²_cj)``: ``[K, M, C, B]`` for ``mu, var, log_var: [K, M, C, d]``,
        ``y: [K, B, d]`` or ``[K, B]``."""
        yT = (y[..., None] if y.ndim == 2 else y).transpose(1, 2)  # [K, d, B]
        z2 = (yT[:, None, None] - mu[..., None]) ** 2 / var[..., None]  # [K, M, C, d, B]
        return -0.5 * (z2.sum(-2) + log_var.sum(-1)[..., None] + yT.shape[1] * LOG_2PI)

    #: Closed-form gradients (no autograd in the SGHMC loop) for any number of components.
    analytic_gradients = True

    def _split(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``theta: [K, M, D]`` -> (stick-breaking coordinates ``x: [K, M, C−1]``, means ``μ: [K, M, C, d]``,
        log-variances ``u: [K, M, C, d]``), the layout of :meth:`parameter_specs` (simplex, real, positive)."""
        C, d = self.params.components, self.params.dim
        lead = theta.shape[:-1]
        x = theta[..., : C - 1]
        mu = theta[..., C - 1 : C - 1 + C * d].reshape(*lead, C, d)
        u = theta[..., C - 1 + C * d :].reshape(*lead, C, d)
        return x, mu, u

    @staticmethod
    def _log_weights(x: torch.Tensor) -> torch.Tensor:
        """``log β: [..., C]`` of the stick-breaking coordinates ``x: [..., C−1]`` (the transform's weights, in
        log space: ``log β_i = log z_i + Σ_{j<i} log(1 − z_j)``)."""
        xp = x - stick_breaking_constants(x)[1]
        log_z, log_rest = torch.nn.functional.logsigmoid(xp), torch.nn.functional.logsigmoid(-xp)
        pad = torch.nn.functional.pad
        return pad(log_z, [0, 1], value=0.0) + pad(log_rest.cumsum(-1), [1, 0], value=0.0)

    @staticmethod
    def _stick_breaking_gradient(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """Chain rule through ``torch.distributions.StickBreakingTransform``: the gradient over its
        coordinates ``x: [..., C−1]`` of a function ``f(β)`` given ``n_c = β_c ∂f/∂β_c: [..., C]``.

        With ``z_i = σ(x_i − log(C−1−i))``, ``β_i = z_i Π_{j<i}(1 − z_j)`` and ``β_{C−1} = Π_j (1 − z_j)``,
        ``∂β_c/∂x_i = β_c (1 − z_i)`` for ``c = i``, ``−β_c z_i`` for ``c > i`` and 0 for ``c < i``, so
        ``∂f/∂x_i = n_i − z_i Σ_{c≥i} n_c``.  Exact where the transform's sigmoid is not clipped.
        """
        C1 = x.shape[-1]
        z = sigmoid(x - stick_breaking_constants(x)[1])
        tail = n.flip(-1).cumsum(-1).flip(-1)[..., :C1]  # Σ_{c≥i} n_c
        return n[..., :C1] - z * tail

    def stacked_grad_log_likelihood(self, theta, x, y, hp):
        """``∇_θ Σ_b log p(y_b | θ)``, ``[K, M, D]``, in closed form from the responsibilities
        ``r_bc = p(c | y_b, θ)`` (the E-step of EM; Bishop 2006, *PRML* eq. 9.13):
        with ``N_c = Σ_b r_bc``, ``S1_cj = Σ_b r_bc y_bj``, ``S2_cj = Σ_b r_bc y_bj²``,
        ``∂_μ = (S1 − μ N)/σ²``, ``∂_u = ((S2 − 2μ S1 + μ² N)/σ² − N)/2`` (``u = log σ²``), and the weights'
        coordinates from ``β_c ∂/∂β_c = N_c`` (:meth:`_stick_breaking_gradient`).  One component:
        ``r = 1`` and the block's sums alone (no per-particle work over ``b``)."""
        return self._grad_log_likelihood(theta, y, None)

    @property
    def weighted_gradients(self) -> bool:  # type: ignore[override]
        """Mixtures (one component has sufficient statistics, which fold the rows before any gradient)."""
        return self.params.components > 1

    def stacked_grad_weighted_log_likelihood(self, theta, x, y, weights, hp):
        """``∇_θ Σ_b w_kpb log p(y_b | θ_kp)``, ``weights: [K, P, B]``: :meth:`stacked_grad_log_likelihood` with each
        row's responsibilities scaled by its weight (``N_c = Σ_b w_b r_bc`` and so on)."""
        return self._grad_log_likelihood(theta, y, weights)

    def _grad_log_likelihood(self, theta: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        if y.ndim == 2:
            y = y[..., None]
        C = self.params.components
        xs, mu, u = self._split(theta)
        iv = torch.exp(-u)  # [K, M, C, d]
        if C == 1 and weights is None:
            N = torch.full_like(mu[..., :1], float(y.shape[1]))
            S1, S2 = y.sum(1)[:, None, None, :], (y * y).sum(1)[:, None, None, :]
            g_mu = (S1 - mu * N) * iv
            g_u = 0.5 * ((S2 - 2.0 * mu * S1 + mu * mu * N) * iv - N)
        else:
            d = y.shape[-1]
            yT = y.transpose(1, 2)[:, None, None]  # [K, 1, 1, d, B]
            diff = yT - mu[..., None]  # [K, M, C, d, B]
            z2 = diff * diff * iv[..., None]
            # log β_c + log N(y_b; μ_c, σ²_c): the components' constants on [K, M, C], then one pass over the rows
            const = self._log_weights(xs) - 0.5 * (u.sum(-1) + d * LOG_2PI)
            log_joint = torch.add(const[..., None], z2[..., 0, :] if d == 1 else z2.sum(-2), alpha=-0.5)
            r = torch.softmax(log_joint, dim=-2)  # responsibilities, [K, M, C, B]
            if weights is not None:
                r = r * weights[:, :, None]
            N = r.sum(-1)[..., None]  # [K, M, C, 1]
            rb = r[..., None, :]
            # Σ_b r (y − μ)/σ², the form of (S1 − μN)/σ² without cancellation
            g_mu = torch.linalg.vecdot(rb, diff) * iv
            g_u = 0.5 * (torch.linalg.vecdot(rb, z2) - N)
        lead = theta.shape[:-1]
        parts = [g_mu.reshape(*lead, -1), g_u.reshape(*lead, -1)]
        if C > 1:
            parts.insert(0, self._stick_breaking_gradient(xs, N[..., 0]))
        return torch.cat(parts, dim=-1)

    def stacked_grad_log_prior(self, theta, hp):
        """``∇_θ log p(θ)`` with the log-Jacobian, ``[K, M, D]``: per component and coordinate
        ``μ | σ² ~ N(m, ms·σ²)``, ``σ² ~ InvGamma(a, b)`` give ``∂_μ = −(μ − m)/(ms σ²)`` and
        ``∂_u = −a + b/σ² + (μ − m)²/(2 ms σ²) − 1/2`` (``m = mean_location``, ``ms = mean_variance_ratio``,
        the ``+1`` of ``log|J| = u`` included); the Dirichlet(α) weights give ``β_c ∂/∂β_c = α − 1`` plus, from the
        stick-breaking log-Jacobian ``Σ_i [−x'_i + log σ(x'_i) + log β_i]`` (``x' = x − log offset``), 1 for
        ``c < C−1`` and ``−z_i`` on coordinate ``i``: summed (:meth:`_stick_breaking_gradient`),
        ``∂/∂x_i = α (1 − (C − i) z_i)`` (``C − i = offset_i + 1``)."""
        return self.stacked_prior_gradient(hp)(theta)

    def stacked_prior_gradient(self, hp):
        """:meth:`stacked_grad_log_prior` with its constants formed once: ``−1/ms``, ``a + 1/2``, ``α (C − i)``.  The
        prior's hyperparameters are one number per model, so the gradient works on ``theta``'s slices as they lie (no
        split into components): 14 tensor calls a step instead of about 50 (a two-component gmm's prior gradient was
        ~10% of its engine time in the demo, session 30)."""
        C, Cd = self.params.components, self.params.components * self.params.dim
        m, b = hp["mean_location"][..., None], hp["variance_scale"][..., None]  # [K, 1, 1]
        neg_inv_ms = -1.0 / hp["mean_variance_ratio"][..., None]
        a_half = hp["variance_shape"][..., None] + 0.5
        alpha = hp["dirichlet_alpha"][..., None]

        def gradient(theta: torch.Tensor) -> torch.Tensor:
            mu, u = theta[..., C - 1 : C - 1 + Cd], theta[..., C - 1 + Cd :]
            iv, dmu = torch.exp(-u), mu - m
            g_mu = dmu * iv * neg_inv_ms
            g_u = torch.addcmul(b * iv - a_half, dmu, g_mu, value=-0.5)
            if C == 1:
                return torch.cat([g_mu, g_u], dim=-1)
            x = theta[..., : C - 1]
            offset, log_offset = stick_breaking_constants(x)
            z = sigmoid(x - log_offset)
            return torch.cat([torch.addcmul(alpha, alpha * (offset + 1.0), z, value=-1.0), g_mu, g_u], dim=-1)

        return gradient

    @property
    def sufficient_statistics(self) -> bool:  # type: ignore[override]
        """One component: a Gaussian with a normal–inverse-gamma prior, whose gradients are linear in
        ``T = (N, S1: [d], S2: [d], H)`` (:meth:`stacked_grad_from_statistics`)."""
        return self.params.components == 1

    def stacked_sufficient_statistics(self, x, y):
        """One component: ``T = (N, Σ_b y_b, Σ_b y_b², N/2)``: ``y: [K, B, d]`` or ``[K, B]`` -> ``[K, 2d + 2]``."""
        if y.ndim == 2:
            y = y[..., None]
        n = torch.full_like(y[:, 0, :1], float(y.shape[1]))
        return torch.cat([n, y.sum(1), (y * y).sum(1), 0.5 * n], dim=-1)

    def stacked_prior_pseudo_statistics(self, hp):
        """One component, per coordinate ``μ | σ² ~ N(m, ms·σ²)``, ``σ² ~ InvGamma(a, b)`` with ``u = log σ²``:
        the prior's gradient (:meth:`stacked_grad_log_prior`) is ``g(θ, T0)`` with the pseudo-observations
        ``N0 = 1/ms``, ``S1_0 = m/ms``, ``S2_0 = m²/ms + 2b`` and ``H0 = a + 1/2`` (the ``+1`` of ``log|J| = u``
        included): ``[K, 2d + 2]``."""
        d = self.params.dim
        a, b, ms, m = (hp[k] for k in ("variance_shape", "variance_scale", "mean_variance_ratio", "mean_location"))
        n0 = 1.0 / ms  # [K, 1]
        ones = torch.ones_like(n0).expand(-1, d)
        return torch.cat([n0, (m * n0) * ones, (m * m * n0 + 2.0 * b) * ones, a + 0.5], dim=-1)

    def stacked_grad_from_statistics(self, theta, T):
        """One component, ``theta = (μ: [d], u = log σ²: [d])`` per particle, ``T = (N, S1, S2, H): [K, 2d + 2]``:
        ``∂_μ = (S1 − μN)/σ²`` and ``∂_u = (S2 − 2μS1 + μ²N)/(2σ²) − H`` (the one-component case of
        :meth:`stacked_grad_log_likelihood`, ``H = N/2`` for data rows; Bishop 2006, *PRML* eq. 9.13) ->
        ``[K, M, 2d]``, linear in ``T``."""
        return self.stacked_grad_from_step(theta, self._step_parts(T[:, None]))

    def stacked_statistics_steps(self, T):
        """One component: ``T: [K, S, P]`` -> per step ``(N: [K, 1, 1], S1: [K, 1, d], S2/2: [K, 1, d], N/2: [K, 1, 1],
        H: [K, 1, d])``, what :meth:`stacked_grad_from_step` reads."""
        return list(zip(*(part.unbind(1) for part in self._step_parts(T[:, :, None])), strict=True))

    def _step_parts(self, T: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(N, S1, S2/2, N/2, H)`` of ``T: [..., 2d + 2]`` (along its last axis)."""
        d = self.params.dim
        n, s2 = T[..., :1], T[..., 1 + d : 1 + 2 * d]
        return n, T[..., 1 : 1 + d], 0.5 * s2, 0.5 * n, T[..., 1 + 2 * d :]

    def stacked_grad_from_step(self, theta, step):
        """:meth:`stacked_grad_from_statistics` of one step's parts (:meth:`stacked_statistics_steps`).

        ``∂_u = (S2/2 − μS1 + μ²·N/2)/σ² − H``: the same bits as ``(S2 − 2μS1 + μ²N)/(2σ²) − H`` term by term, since
        halving is exact in binary floating point (``0.5·round(x) = round(0.5·x)`` away from underflow), in two tensor
        calls fewer per SGHMC step (session 26)."""
        n, s1, half_s2, half_n, h = step
        d = self.params.dim
        mu, u = theta[..., :d], theta[..., d:]
        iv = torch.exp(-u)
        g_mu = (s1 - mu * n) * iv
        g_u = ((half_s2 - mu * s1) + mu * mu * half_n) * iv - h
        return torch.cat([g_mu, g_u], dim=-1)

    def stacked_mode_from_statistics(self, T):
        """One component: the zero of :meth:`stacked_grad_from_statistics`, ``μ̂ = S1/N`` and
        ``σ̂² = (S2 − S1²/N)/(2H)`` per coordinate (``u = log σ̂²``; with the prior's pseudo-observations in ``T``, the
        normal–inverse-gamma posterior's mode in ``(μ, log σ²)``, the log-|J| included) -> ``[K, 2d]``."""
        if self.params.components != 1:
            return None
        d = self.params.dim
        n, s1, s2, h = T[:, :1], T[:, 1 : 1 + d], T[:, 1 + d : 1 + 2 * d], T[:, 1 + 2 * d :]
        mu = s1 / n
        return torch.cat([mu, torch.log((s2 - s1 * mu) / (2.0 * h))], dim=-1)

    @property
    def exact_draws(self) -> bool:  # type: ignore[override]
        """One component: the tempered target is a normal–inverse-gamma posterior per coordinate
        (:meth:`stacked_exact_draw`)."""
        return self.params.components == 1

    def stacked_exact_draw_shapes(self, T):
        """One component: ``H − 1/2`` for each coordinate's ``σ²_j`` (:meth:`stacked_exact_draw`) -> ``[K, d]``."""
        d = self.params.dim
        return (T[:, 1 + 2 * d :] - 0.5).expand(-1, d)

    @property
    def exact_draw_normals(self) -> int:
        return self.params.dim

    def stacked_exact_draw(self, T, log_gammas, normals):
        """One component, ``T = (N, S1, S2, H): [K, 2d + 2]`` (prior pseudo-statistics included), ``log_gammas``,
        ``normals: [K, M, d]`` -> ``theta = (μ, u = log σ²): [K, M, 2d]`` drawn exactly from the target.

        Per coordinate the log target is ``−½e^{−u}(S2 − 2μS1 + μ²N) − H·u`` (:meth:`stacked_grad_from_statistics`'s
        integral, the log-|J| included).  Integrating ``μ`` out leaves ``−(H − ½)u − ½e^{−u}(S2 − S1²/N)``, the density
        in ``u`` of ``σ² ~ InvGamma(H − ½, (S2 − S1²/N)/2)``, and given ``σ²`` the mean is ``N(S1/N, σ²/N)``: the
        normal–inverse-gamma posterior (Murphy 2007, *Conjugate Bayesian analysis of the Gaussian distribution*,
        with ``κ_n = N``, ``μ_n = S1/N``, ``α_n = H − ½``, ``β_n = (S2 − S1²/N)/2``; :mod:`models.conjugate`).
        ``σ² = β_n/γ`` with ``γ ~ Gamma(α_n, 1)``: ``u = log β_n − log γ``."""
        d = self.params.dim
        n, s1, s2 = T[:, None, :1], T[:, None, 1 : 1 + d], T[:, None, 1 + d : 1 + 2 * d]
        mean = s1 / n
        u = torch.log(0.5 * (s2 - s1 * mean)) - log_gammas
        return torch.cat([mean + torch.exp(0.5 * u) * torch.rsqrt(n) * normals, u], dim=-1)

    def sample_prior_constrained(self, generator, M, dtype, device):
        return self._prior_values(self._prior_randoms(generator, M, dtype, device), self.hyper())

    def _prior_randoms(self, generator, M, dtype, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prior draw's random variates from ``generator``: Gamma(α) ``[M, K]``, Gamma(a) ``[M, K, d]``, normals
        ``[M, K, d]`` (:meth:`_prior_values` makes the parameters of them)."""
        p = self.params
        K, d = p.components, p.dim
        g = torch._standard_gamma(
            torch.full((M, K), p.dirichlet_alpha, dtype=dtype, device=device), generator=generator
        )
        gv = torch._standard_gamma(
            torch.full((M, K, d), p.variance_shape, dtype=dtype, device=device), generator=generator
        )
        z = torch.randn(M, K, d, generator=generator, dtype=dtype, device=device)
        return g, gv, z

    @staticmethod
    def _prior_values(randoms: tuple[torch.Tensor, ...], hp: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The constrained prior draws from :meth:`_prior_randoms`' variates, for one model (``hp`` floats,
        variates ``[M, ...]``) or a stack (``hp`` ``[K, 1, 1, 1]`` tensors, variates ``[K, M, ...]``; elementwise
        arithmetic and a sum over the components: the same bits as each model alone)."""
        g, gv, z = randoms
        tiny = torch.finfo(g.dtype).tiny  # a Gamma draw can underflow to 0 for small shapes
        g = g.clamp_min(tiny)
        weights = g / g.sum(-1, keepdim=True)
        # InvGamma(shape, scale) = scale / Gamma(shape, 1), as torch divides a number by a tensor (reciprocal, product)
        var = gv.clamp_min(tiny).reciprocal() * hp["variance_scale"]
        means = hp["mean_location"] + torch.sqrt(hp["mean_variance_ratio"] * var) * z
        return {"weights": weights, "means": means, "variances": var}

    @classmethod
    def sample_priors(cls, families, generators, M, dtype=torch.float64, device="cpu"):
        """:meth:`Family.sample_priors`: each model's variates from its own generator, the arithmetic and the
        transform once for the stack (a new challenger's prior draw was a fifth of its first block's cost)."""
        from models.stack import stack_key_of  # models.stack imports the families' base

        if len({stack_key_of(f) for f in families}) != 1:
            return super().sample_priors(families, generators, M, dtype, device)
        draws = [f._prior_randoms(g, M, dtype, torch.device(device)) for f, g in zip(families, generators, strict=True)]
        randoms = tuple(torch.stack(v) for v in zip(*draws, strict=True))
        rows = [f.hyper() for f in families]
        hp = {
            k: torch.tensor([r[k] for r in rows], dtype=dtype, device=device)[:, None, None, None]
            for k in ("variance_scale", "mean_location", "mean_variance_ratio")
        }
        values = cls._prior_values(randoms, hp)
        K = len(families)
        theta = families[0].space.unconstrain({k: v.reshape(K * M, *v.shape[2:]) for k, v in values.items()})
        return theta.reshape(K, M, -1)
