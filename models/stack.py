"""Models of one family evaluated together on stacked parameters ``theta: [K, M, D]``.

:class:`StackedFamily` holds the shared family (shapes, control flow) and the per-model
hyperparameters as ``[K, 1]`` tensors, built once per stack: the sampler's loop then calls plain
tensor arithmetic (``Family.stacked_*``), one call for all ``K`` models.  Families whose
:meth:`~models.base.Family.stack_key` are equal stack; the rest of a model's hyperparameters
(:meth:`~models.base.Family.hyper`) become rows of these tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from models.base import Family


def stack_key_of(family: Family) -> tuple[Any, ...]:
    """``family.stack_key()``, computed once per family (its hyperparameters are frozen): every round of the
    worker groups its models by it."""
    try:
        return family.__dict__["_stack_key"]
    except KeyError:
        key = family.__dict__["_stack_key"] = family.stack_key()
        return key


def _hyper_row(family: Family) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """``family.hyper()`` as (names, values), computed once per family (frozen, as :func:`stack_key_of`): a stack is
    built from its models' rows every block."""
    try:
        return family.__dict__["_hyper_row"]
    except KeyError:
        hp = family.hyper()
        row = family.__dict__["_hyper_row"] = (tuple(hp), tuple(hp.values()))
        return row


class StackedFamily:
    """``K`` models of one family with per-model hyperparameters.

    Parameters
    ----------
    families : sequence of Family
        All with the same :meth:`~models.base.Family.stack_key`.
    dtype, device : the stack's particle dtype and device.

    Raises
    ------
    ValueError
        If the families do not share a stack key.
    """

    def __init__(self, families: Sequence[Family], dtype: torch.dtype, device: torch.device | str):
        self.family = families[0]
        key = stack_key_of(self.family)
        if any(stack_key_of(f) != key for f in families):
            raise ValueError("families of one stack must share a stack key")
        names = _hyper_row(self.family)[0]  # one stack key: the same hyperparameters in the same order
        rows = [_hyper_row(f)[1] for f in families]
        table = torch.tensor(rows, dtype=dtype, device=device).reshape(len(families), len(names))
        self.hp = {k: table[:, i : i + 1] for i, k in enumerate(names)}
        self.K = len(families)
        self.hp_dtype = dtype

    @classmethod
    def of(cls, family: Family, dtype: torch.dtype, device: torch.device | str) -> StackedFamily:
        """The stack of ``family`` alone, built once per family, dtype and device (a family's hyperparameters
        are frozen; a stack is never modified in place, :meth:`select` makes a new one)."""
        cache = family.__dict__.setdefault("_stacked_alone", {})
        key = (dtype, str(device))
        if key not in cache:
            cache[key] = cls([family], dtype, device)
        return cache[key]

    @classmethod
    def _from_hp(cls, family: Family, hp: dict[str, torch.Tensor], K: int, dtype: torch.dtype) -> StackedFamily:
        out = cls.__new__(cls)
        out.family, out.hp, out.K = family, hp, K
        out.hp_dtype = dtype
        return out

    def select(self, idx: torch.Tensor) -> StackedFamily:
        """The sub-stack of models ``idx: [k]`` (int64)."""
        return StackedFamily._from_hp(
            self.family, {k: v[idx] for k, v in self.hp.items()}, int(idx.numel()), self.hp_dtype
        )

    @property
    def analytic_gradients(self) -> bool:
        return self.family.analytic_gradients

    @property
    def quadratic(self) -> bool:
        return self.family.quadratic

    def gradient_statistics(self, x: torch.Tensor | None, y: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        """``(A: [K, D, D], c: [K, D])``: ``Σ_b ∇ log p(y_b|θ) = c − θ A`` (quadratic families; ``y = None``:
        ``A`` alone)."""
        return self.family.stacked_gradient_statistics(x, y, self.hp)

    def prior_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A0: [K, D, D], c0: [K, D])``: ``∇ log p(θ) = c0 − θ A0`` (quadratic families)."""
        return self.family.stacked_prior_statistics(self.hp)

    @property
    def sufficient_statistics(self) -> bool:
        return self.family.sufficient_statistics

    def statistics(self, x: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """``T: [K, P]``, the rows' summed sufficient statistics: ``Σ_b ∇ log p(y_b|θ) = g(θ, T)``."""
        return self.family.stacked_sufficient_statistics(x, y)

    def block_statistics(self, x: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """:meth:`statistics` of a block's rows; the last block's are kept for the same tensors ``x``, ``y``, unmodified
        since (their version counters: every annealing step of a block asks for them)."""
        versions = (None if x is None else x._version, y._version)
        last = self.__dict__.get("_last_block")
        if last is not None and last[0] is x and last[1] is y and last[2] == versions:
            return last[3]
        T = self.statistics(x, y)
        self.__dict__["_last_block"] = (x, y, versions, T)
        return T

    def prior_pseudo_statistics(self) -> torch.Tensor:
        """``T0: [K, P]``: ``∇ log p(θ) = g(θ, T0)`` (log-|J| included); formed once per stack (its hyperparameters
        are frozen)."""
        T0 = self.__dict__.get("_prior_pseudo_statistics")
        if T0 is None:
            T0 = self.__dict__["_prior_pseudo_statistics"] = self.family.stacked_prior_pseudo_statistics(self.hp)
        return T0

    @property
    def gibbs_conditionals(self) -> bool:
        return self.family.gibbs_conditionals

    def noise_conditional_of(self, theta: torch.Tensor, T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(shape: [K, 1], scale: [K, M])`` of the noise variance's conditional ``InvGamma`` at ``theta: [K, M, D]``
        under the target of statistics ``T: [K, P]`` (:meth:`Family.stacked_noise_conditional`)."""
        return self.family.stacked_noise_conditional(theta, T)

    def coefficient_conditional_of(
        self, theta: torch.Tensor, T: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mean, L, ok)`` of the coefficients' Gaussian conditional given ``u`` at ``theta: [K, M, D]`` under the
        target of statistics ``T: [K, P]`` (:meth:`Family.stacked_coefficient_conditional`)."""
        return self.family.stacked_coefficient_conditional(theta, T)

    @property
    def exact_draws(self) -> bool:
        return self.family.exact_draws

    @property
    def exact_draw_normals(self) -> int:
        return self.family.exact_draw_normals

    def exact_draw_shapes(self, T: torch.Tensor) -> torch.Tensor:
        """``[K, G]``, the Gamma shapes of one exact draw under the target of statistics ``T: [K, P]``
        (:meth:`Family.stacked_exact_draw_shapes`)."""
        return self.family.stacked_exact_draw_shapes(T)

    def exact_draw(self, T: torch.Tensor, log_gammas: torch.Tensor, normals: torch.Tensor) -> torch.Tensor:
        """``theta: [K, M, D]`` drawn exactly from the target of statistics ``T: [K, P]``
        (:meth:`Family.stacked_exact_draw`)."""
        return self.family.stacked_exact_draw(T, log_gammas, normals)

    def mode_from_statistics(self, T: torch.Tensor) -> torch.Tensor | None:
        """``θ̂: [K, D]`` with ``g(θ̂, T) = 0`` in closed form, or None (:meth:`Family.stacked_mode_from_statistics`)."""
        return self.family.stacked_mode_from_statistics(T)

    def grad_from_statistics(self, theta: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
        """``g(θ, T)``: ``theta: [K, M, D]``, ``T: [K, P]`` -> ``[K, M, D]``, linear in ``T``."""
        return self.family.stacked_grad_from_statistics(theta, T)

    def statistics_steps(self, T: torch.Tensor) -> list[Any]:
        """The per-step statistics ``T: [K, S, P]`` of an SGHMC chain, prepared once
        (:meth:`Family.stacked_statistics_steps`)."""
        return self.family.stacked_statistics_steps(T)

    def grad_from_step(self, theta: torch.Tensor, step: Any) -> torch.Tensor:
        """``g(θ, T_s)`` for an entry of :meth:`statistics_steps`: ``theta: [K, M, D]`` -> ``[K, M, D]``."""
        return self.family.stacked_grad_from_step(theta, step)

    def log_likelihood(self, theta: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """``theta: [K, M, D]``, ``x: [K, B, d] | None``, ``y: [K, B, ...]`` -> ``[K, M, B]`` (nats)."""
        values, _ = self.family.space.constrain(theta)
        return self.family.stacked_log_likelihood(values, x, y, self.hp)

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """``theta: [K, M, D]`` -> ``[K, M]`` (nats), log-|J| included."""
        values, log_det = self.family.space.constrain(theta)
        return self.family.stacked_log_prior(values, self.hp) + log_det

    def grad_log_likelihood(self, theta: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """``∇_θ Σ_b log p(y_b|θ)``: ``[K, M, D]`` (closed form or one autograd call)."""
        return self.family.stacked_grad_log_likelihood(theta, x, y, self.hp)

    @property
    def weighted_gradients(self) -> bool:
        return self.family.weighted_gradients

    def grad_weighted_log_likelihood(
        self, theta: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """``∇_θ Σ_b w_kpb log p(y_b|θ_kp)``: ``theta: [K, P, D]``, ``weights: [K, P, B]`` -> ``[K, P, D]``
        (``weighted_gradients`` families)."""
        return self.family.stacked_grad_weighted_log_likelihood(theta, x, y, weights, self.hp)

    def grad_log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """``∇_θ log p(θ)``: ``[K, M, D]`` (closed form or one autograd call)."""
        try:
            gradient = self.__dict__["_prior_gradient"]
        except KeyError:  # formed once per stack (the hyperparameters' constants): called every SGHMC step
            gradient = self.__dict__["_prior_gradient"] = self.family.stacked_prior_gradient(self.hp)
        return gradient(theta)

    def grad_log_target(
        self, theta: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor, lam: torch.Tensor
    ) -> torch.Tensor:
        """``∇_θ [log p(θ) + λ_k Σ_b log p(y_b|θ)]`` with ``lam: [K]``: one autograd call, or closed forms."""
        if self.analytic_gradients:
            return self.grad_log_prior(theta) + lam[:, None, None] * self.grad_log_likelihood(theta, x, y)
        with torch.enable_grad():
            t = theta.detach().requires_grad_(True)
            values, log_det = self.family.space.constrain(t)
            ll = self.family.stacked_log_likelihood(values, x, y, self.hp).sum(-1)
            total = self.family.stacked_log_prior(values, self.hp) + log_det + lam[:, None].to(ll.dtype) * ll
            (g,) = torch.autograd.grad(total.sum(), t)
        return g
