"""Stochastic gradient estimators of the SGAIS potential (thesis eq. 4.14), on stacks of models.

The potential of the annealed target for a block ``C`` at inverse temperature ``λ`` is

    U(θ) = -λ Σ_{y∈C} log p(y|θ) - Σ_{y∈H} log p(y|θ) - log p(θ),

and SGHMC needs ``∇U`` at every particle.  The prior and block terms are exact
(:func:`potential_gradient`); the history term is estimated from a mini-batch ``B`` drawn with
replacement from ``H``.  Estimators wrap estimators (BlackJAX ``sgmcmc/gradients.py``): a history
estimator is ``(theta: [K, M, D], batch) -> [K, M, D]``, an estimate of ``∇ Σ_{y∈H} log p(y|θ)``.

* :class:`Minibatch` — the thesis's ``(n_prev/|B|) Σ_{y∈B} ∇ log p(y|θ)`` (eq. 4.14).  Its
  variance grows like ``n_prev²/|B|``.
* :class:`ControlVariates` — wraps any estimator around per-particle anchors ``a_i`` with the
  exact history gradient ``G_i = Σ_{y∈H} ∇ log p(y|a_i)``, kept in the estimator's own state:
  ``G_i + est(θ_i, B) − est(a_i, B)`` (Baker, Fearnhead, Fox & Nemeth 2019, "Control variates for
  stochastic gradient MCMC", eq. 8; Dubey et al. 2016).  Its variance scales with ``|θ_i − a_i|²``,
  which shrinks as the posterior concentrates, so it removes the ``η²n²/|B|`` bias that makes
  plain SGAIS drift at large ``n``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch

from models.base import bmm
from models.stack import StackedFamily


class Batch(NamedTuple):
    """Likelihood rows of a stack: ``x: [K, B, d] | None``, ``y: [K, B, ...]``; the rows may be replaced by
    their precomputed statistics: ``stats = (A: [K, D, D], c: [K, D] | None)`` for quadratic families, the
    summed sufficient statistics ``T: [K, P]`` for ``sufficient_statistics`` families."""

    x: torch.Tensor | None
    y: torch.Tensor | None
    stats: Any = None
    #: ``est(a, B): [K, M, D]``, the base estimator at the control variates' anchors on this batch, when the
    #: sampler formed it for all its steps at once (``sufficient_statistics`` families)
    at_anchor: torch.Tensor | None = None


PotentialGradient = Callable[[torch.Tensor, Batch | None], torch.Tensor]


class HistoryEstimator(Protocol):
    """An estimate of ``∇ Σ_{y∈H} log p(y|θ)`` from a mini-batch: ``(theta: [K, M, D], batch) -> [K, M, D]``."""

    def __call__(self, theta: torch.Tensor, batch: Batch) -> torch.Tensor: ...

    def difference(self, theta: torch.Tensor, anchor: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``est(θ, B) − est(a, B)`` on the same batch, ``theta, anchor: [K, M, D]``."""
        ...

    def folded(self, theta: torch.Tensor, T: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``g(θ, T) + est(θ, B)`` for ``sufficient_statistics`` families, ``T: [K, P]`` (the exact part's
        statistics): one gradient evaluation at ``θ``."""
        ...

    def folded_steps(
        self, T: torch.Tensor, stats: torch.Tensor, at_anchor: torch.Tensor | None
    ) -> tuple[torch.Tensor, Callable[[int], torch.Tensor] | None]:
        """:meth:`folded` for every step of an SGHMC chain, as ``(T_s: [K, S, P], c)`` with ``folded(θ, T, B_s) =
        g(θ, T_s) + c(s)`` (``c(s): [K, M, D]``; ``c`` None: no correction): ``stats: [K, S, P]`` the steps'
        mini-batch statistics, ``at_anchor: [K, S, M, D]`` the base estimator at the control variates' anchors on
        each (or None)."""
        ...


class Minibatch:
    """``(n_prev/|B|) Σ_{y∈B} ∇ log p(y|θ)`` (thesis eq. 4.14); ``scale: [K]`` is ``n_prev/|B|`` per model.

    For quadratic families (``model.quadratic``) it works with the batch's statistics ``(A_B, c_B)``:
    ``scale · (c_B − θ A_B)``, and the difference at two points is ``−scale · (θ − a) A_B``.
    """

    def __init__(
        self, model: StackedFamily, scale: torch.Tensor, whole: tuple[torch.Tensor, torch.Tensor] | None = None
    ):
        self.model = model
        self.scale = scale[:, None, None].to(model.hp_dtype)
        self.neg_scale = -self.scale
        #: ``[K]`` bool or None: the models whose batch is their whole history (``weighted_gradients`` families,
        #: :func:`workers.sgais._whole_rows`), weighted by :attr:`row_weights`, without control variates; read by
        #: :func:`_one_evaluation` only
        self.whole = None if whole is None else whole[0]
        #: ``[K, |B|]`` or None: a weight per batch row in place of ``scale``: 1 on each of a whole model's held rows,
        #: 0 on the padding that fills its batch to ``|B|`` rows, ``scale`` for the others
        self.row_weights = None if whole is None else whole[1].to(model.hp_dtype)

    def __call__(self, theta: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.model.quadratic:
            A, c = batch.stats if batch.stats is not None else self.model.gradient_statistics(batch.x, batch.y)
            assert c is not None
            return self.scale * (c[:, None, :] - bmm(theta, A))
        if self.model.sufficient_statistics:
            return self.model.grad_from_statistics(theta, self.scale[:, :, 0] * self._statistics(batch))
        assert batch.y is not None
        if self.row_weights is not None:  # whole histories are weighted_gradients families': _one_evaluation's
            raise ValueError("a batch with whole histories is evaluated by potential_gradient, not called directly")
        return self.scale * self.model.grad_log_likelihood(theta, batch.x, batch.y)

    def _statistics(self, batch: Batch) -> torch.Tensor:
        if batch.stats is not None:
            return batch.stats
        assert batch.y is not None
        return self.model.statistics(batch.x, batch.y)

    def folded(self, theta: torch.Tensor, T: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``g(θ, T + scale·T_B)``: the exact part and the mini-batch in one evaluation (linearity in ``T``)."""
        return self.model.grad_from_statistics(theta, T + self.scale[:, :, 0] * self._statistics(batch))

    def folded_steps(
        self, T: torch.Tensor, stats: torch.Tensor, at_anchor: torch.Tensor | None
    ) -> tuple[torch.Tensor, Callable[[int], torch.Tensor] | None]:
        """``T_s = T + scale·T_{B_s}`` for every step (the arithmetic of :meth:`folded`, element for element)."""
        return T[:, None] + self.scale * stats, None

    def difference(self, theta: torch.Tensor, anchor: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.model.quadratic:
            A = batch.stats[0] if batch.stats is not None else self.model.gradient_statistics(batch.x, None)[0]
            return self.neg_scale * bmm(theta - anchor, A)
        if self.model.sufficient_statistics:
            return self(theta, batch) - self(anchor, batch)
        M = theta.shape[1]
        g = self(torch.cat([theta, anchor], 1), batch)  # one evaluation for particles and anchors
        return g[:, :M] - g[:, M:]


class ControlVariates:
    """``G + base(θ, B) − base(a, B)`` (Baker et al. 2019, eq. 8) around anchors ``anchor: [K, M, D]``
    with exact history gradients ``anchor_grad: [K, M, D]`` (the estimator's own state)."""

    def __init__(self, base: HistoryEstimator, anchor: torch.Tensor, anchor_grad: torch.Tensor):
        self.base, self.anchor, self.anchor_grad = base, anchor, anchor_grad

    def __call__(self, theta: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.anchor_grad + self.base.difference(theta, self.anchor, batch)

    def difference(self, theta: torch.Tensor, anchor: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.base.difference(theta, anchor, batch)

    def folded(self, theta: torch.Tensor, T: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``g(θ, T) + G + base(θ, B) − base(a, B)``: two evaluations, at ``θ`` and at the anchors."""
        at_anchor = batch.at_anchor if batch.at_anchor is not None else self.base(self.anchor, batch)
        return self.base.folded(theta, T, batch) + (self.anchor_grad - at_anchor)

    def folded_steps(
        self, T: torch.Tensor, stats: torch.Tensor, at_anchor: torch.Tensor | None
    ) -> tuple[torch.Tensor, Callable[[int], torch.Tensor] | None]:
        """The base's ``T_s`` and ``c(s) = G − base(a, B_s)`` (``at_anchor`` required: the sampler forms it), formed
        at its step: one ``[K, M, D]`` at a time stays in cache where ``[K, S, M, D]`` at once would not."""
        if at_anchor is None:
            raise ValueError("control variates fold their steps only with the anchors' estimates at hand")
        T_s, _ = self.base.folded_steps(T, stats, None)
        at_step = at_anchor.unbind(1)
        return T_s, lambda step: self.anchor_grad - at_step[step]


def minibatch(
    model: StackedFamily, scale: torch.Tensor, whole: tuple[torch.Tensor, torch.Tensor] | None = None
) -> Minibatch:
    """The plain mini-batch estimator (:class:`Minibatch`); ``whole``: ``(models [K] bool, row weights [K, |B|])`` of a
    ``weighted_gradients`` family whose batches are, for those models, their whole history."""
    return Minibatch(model, scale, whole)


def control_variates(base: HistoryEstimator, anchor: torch.Tensor, anchor_grad: torch.Tensor) -> ControlVariates:
    """Wrap ``base`` with control variates (:class:`ControlVariates`)."""
    return ControlVariates(base, anchor, anchor_grad)


def potential_gradient(
    model: StackedFamily, block: Batch, lam: torch.Tensor, history: HistoryEstimator | None
) -> PotentialGradient:
    """``∇Û(θ) = −∇ log p(θ) − λ_k ∇ Σ_{y∈C} log p(y|θ) − history(θ, B)`` with ``lam: [K]`` (eq. 4.14).

    Quadratic families fold the prior and the block into ``(P, q) = (A0 + λA, c0 + λc)`` once, so a
    step's exact part is ``q − θ P`` whatever the block length.  ``sufficient_statistics`` families fold
    them into ``T = T0 + λ T_C`` once, and a step adds the mini-batch's ``T_B`` to it: one evaluation of
    ``g(θ, ·)`` (plus one at the anchors with control variates).
    """
    if model.sufficient_statistics:
        T = exact_statistics(model, block, lam)

        def grad_u_folded(theta: torch.Tensor, batch: Batch | None) -> torch.Tensor:
            if history is not None and batch is not None:
                return -history.folded(theta, T, batch)
            return -model.grad_from_statistics(theta, T)

        return grad_u_folded
    if model.quadratic:
        A0, c0 = model.prior_statistics()
        A, c = model.gradient_statistics(block.x, block.y)
        lam_t = lam.to(A.dtype)
        P, q = A0 + lam_t[:, None, None] * A, (c0 + lam_t[:, None] * c)[:, None, :]

        def exact(theta: torch.Tensor) -> torch.Tensor:
            return q - bmm(theta, P)

    else:

        def exact(theta: torch.Tensor) -> torch.Tensor:
            assert block.y is not None
            return model.grad_log_target(theta, block.x, block.y, lam)

        base = _minibatch_of(history) if model.weighted_gradients else None
        if base is not None and history is not None:
            return _one_evaluation(model, block, lam, history, base, exact)

    assert block.y is not None

    def grad_u(theta: torch.Tensor, batch: Batch | None) -> torch.Tensor:
        g = exact(theta)
        if history is not None and batch is not None:
            g = g + history(theta, batch)
        return -g

    return grad_u


def _one_evaluation(
    model: StackedFamily,
    block: Batch,
    lam: torch.Tensor,
    history: HistoryEstimator,
    base: Minibatch,
    exact: Callable[[torch.Tensor], torch.Tensor],
) -> PotentialGradient:
    """:func:`potential_gradient` of a ``weighted_gradients`` family (a mixture) with a mini-batch estimator: the
    block's rows and the mini-batch's in one weighted likelihood gradient,

        ∇Û(θ) = −∇ log p(θ) − [g_w(θ) − g_w(a) + G]   (control variates; without them −∇ log p(θ) − g_w(θ)),

    where ``g_w(θ) = λ Σ_{y∈C} ∇ log p(y|θ) + s Σ_{y∈B} ∇ log p(y|θ)`` and ``g_w(a) = s Σ_{y∈B} ∇ log p(y|a)``
    (``s = n_prev/|B|``): the block's exact term and :class:`ControlVariates`' ``G + s[∇(θ, B) − ∇(a, B)]`` (Baker et
    al. 2019, eq. 8), the particles and the anchors stacked as ``[θ; a]`` over the rows ``C ∪ B`` with weight 0 on
    ``(a, C)``.  A mixture's gradient is a few dozen tensor calls on a few thousand numbers whatever the rows: one
    evaluation per SGHMC step instead of two.  The weights are formed once per annealing step (``λ`` and ``s`` are
    fixed there).  ``base``: the :class:`Minibatch` that ``history`` is or wraps.  Models whose batch is their whole
    history (``base.whole``: weight 1 on each held row, 0 on the padding) take their particles' term alone, exact,
    without control variates; a stack of such models evaluates no anchors."""
    y_block = block.y
    assert y_block is not None
    cv = history if isinstance(history, ControlVariates) else None
    whole = base.whole
    if cv is not None and whole is not None and bool(whole.all()):
        cv = None  # every batch is its model's whole history: no anchors to evaluate
    weights: dict[tuple[int, int], torch.Tensor] = {}
    # models with no history yet (n_prev = 0) beside models with one: alone they have no batch and take their block's
    # rows alone; here they would sum their block's rows and |B| rows of weight 0, a reduction of another length,
    # which rounds differently (session 30). They take their block's exact gradient apart, as they get it alone.
    empty = base.scale[:, 0, 0] == 0
    none_held = bool(empty.all())  # e.g. a sub-stack of such models: their block's rows alone
    apart = empty.nonzero()[:, 0] if bool(empty.any()) and not none_held else None
    if apart is not None:
        alone = model.select(apart)
        x_apart = block.x[apart] if block.x is not None else None
        y_apart, lam_apart = y_block[apart], lam[apart]

    def weights_for(M: int, rows: int) -> torch.Tensor:  # [K, M (2M with anchors), |C| + |B|]
        if (M, rows) not in weights:
            K, n_block = lam.shape[0], y_block.shape[1]
            on_block = lam.to(base.scale.dtype)[:, None, None].expand(K, M, n_block)
            row_weights = base.row_weights
            on_batch = (base.scale if row_weights is None else row_weights[:, None, :]).expand(K, M, rows)
            w = torch.cat([on_block, on_batch], -1)
            if cv is not None:
                w = torch.cat([w, torch.cat([torch.zeros_like(on_block), on_batch], -1)], 1)
            weights[M, rows] = w
        return weights[M, rows]

    def grad_u(theta: torch.Tensor, batch: Batch | None) -> torch.Tensor:
        if batch is None or batch.y is None or none_held:
            return -exact(theta)
        M = theta.shape[1]
        y = torch.cat([y_block, batch.y], 1)
        x = torch.cat([block.x, batch.x], 1) if block.x is not None and batch.x is not None else None
        points = torch.cat([theta, cv.anchor], 1) if cv is not None else theta
        g = model.grad_weighted_log_likelihood(points, x, y, weights_for(M, batch.y.shape[1]))
        if cv is not None:
            g_cv = g[:, :M] - g[:, M:] + cv.anchor_grad
            # a whole history's batch is exact: its particles' rows alone, the same bits as in a stack without anchors
            g = g_cv if whole is None else torch.where(whole[:, None, None], g[:, :M], g_cv)
        out = -(model.grad_log_prior(theta) + g)
        if apart is not None:
            out = out.index_copy(0, apart, -alone.grad_log_target(theta[apart], x_apart, y_apart, lam_apart))
        return out

    return grad_u


def _minibatch_of(history: HistoryEstimator | None) -> Minibatch | None:
    """The :class:`Minibatch` estimator ``history`` is, or wraps in :class:`ControlVariates`; else None."""
    base = history.base if isinstance(history, ControlVariates) else history
    return base if isinstance(base, Minibatch) else None


def exact_statistics(model: StackedFamily, block: Batch, lam: torch.Tensor) -> torch.Tensor:
    """``T = T0 + λ T_C: [K, P]``, the prior's pseudo-statistics and the tempered block's (``sufficient_statistics``
    families)."""
    assert block.y is not None
    return model.prior_pseudo_statistics() + lam[:, None].to(model.hp_dtype) * model.block_statistics(block.x, block.y)


StepGradient = Callable[[torch.Tensor, int], torch.Tensor]


def potential_gradient_steps(
    model: StackedFamily,
    block: Batch,
    lam: torch.Tensor,
    history: HistoryEstimator | None,
    stats: torch.Tensor | None,
    at_anchor: torch.Tensor | None,
) -> StepGradient:
    """:func:`potential_gradient` of a ``sufficient_statistics`` family for the S steps of one SGHMC chain, with every
    step's mini-batch statistics ``stats: [K, S, P]`` at hand (None: no history term): ``(θ, s) -> ∇Û_s(θ)``, the
    same values bit for bit as ``potential_gradient(...)(θ, batch_s)``.

    The folded statistics of every step, ``T_s = T0 + λ T_C + scale·T_{B_s}`` (:meth:`HistoryEstimator.folded_steps`),
    are formed once for the chain and split as the family's gradient reads them
    (:meth:`~models.stack.StackedFamily.statistics_steps`); a step is one gradient evaluation and, with control
    variates, the correction ``G − base(a, B_s)`` and one addition (a lone model's SGHMC step is dominated by the
    number of tensor calls, not by their arithmetic: 12 fewer here, session 26)."""
    T = exact_statistics(model, block, lam)
    if history is None or stats is None:
        (only,) = model.statistics_steps(T[:, None])
        return lambda theta, step: -model.grad_from_step(theta, only)
    T_s, correction = history.folded_steps(T, stats, at_anchor)
    steps = model.statistics_steps(T_s)
    if correction is None:
        return lambda theta, step: -model.grad_from_step(theta, steps[step])
    return lambda theta, step: -(model.grad_from_step(theta, steps[step]) + correction(step))


def history_gradient(
    model: StackedFamily, anchor: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor, *, chunk: int = 16384
) -> torch.Tensor:
    """``Σ_{rows} ∇_θ log p(y|θ)`` at ``anchor: [K, M, D]`` over rows ``x: [K, n, d]``, ``y: [K, n, ...]``."""
    total = torch.zeros_like(anchor)
    for start in range(0, y.shape[1], chunk):
        xs = x[:, start : start + chunk] if x is not None else None
        total += model.grad_log_likelihood(anchor, xs, y[:, start : start + chunk])
    return total
